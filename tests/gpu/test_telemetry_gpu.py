"""Telemetry on real NVIDIA GPUs: skipped where NVML sees none (CI).

On a GPU machine, from the repository root:  python3 -m pytest tests/gpu -m gpu
(the package need not be installed; scripts/gpu_check.py is the same check, verbosely).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdecode_tune import store
from specdecode_tune.telemetry import TelemetrySampler, gpu_handles

REPO = Path(__file__).resolve().parent.parent.parent


def _gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no bindings, no driver, no GPU: all mean "skip"
        return 0


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(600),
    pytest.mark.skipif(_gpu_count() == 0, reason="needs an NVIDIA GPU (NVML sees none)"),
]


def test_sampler_reads_the_trials_gpus(tmp_path: Path) -> None:
    import pynvml

    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    with TelemetrySampler(env, interval_s=0.1, nvml=pynvml) as s:
        assert s.available, s.why
        time.sleep(1.0)
        level = s.cut()
        # gpu_handles needs NVML initialised: the sampler holds it open here.
        expected = [r.uuid for r in gpu_handles(env, pynvml)]
    assert list(level.gpus) == expected and expected
    assert {x.uuid for x in level.samples} == set(expected)
    assert len(level.samples) >= 5 * len(expected)
    first = level.samples[0]
    assert first.mem_total_mib and first.mem_total_mib > 1000
    assert first.sm_clock_mhz and first.mem_clock_mhz and first.power_w is not None
    assert first.clock_events_mask is not None
    path = store.write_telemetry(tmp_path, "gpu", "c1", level.samples)
    assert path is not None
    assert store.read_table(tmp_path, "telemetry").num_rows == len(level.samples)


def test_gpu_check_script(tmp_path: Path) -> None:
    """Mapping agrees with CUDA, a foreign process is flagged, an own one is not."""
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"),
                           "--seconds", "3", "--json", str(out)],
                          capture_output=True, text=True, timeout=540, cwd=REPO, check=False)
    print(proc.stdout[-6000:], proc.stderr[-3000:])
    if proc.returncode == 77:
        pytest.skip("gpu_check found no GPU")
    checks = {c["name"]: c for c in json.loads(out.read_text())["checks"]}
    assert proc.returncode == 0, {n: c["detail"] for n, c in checks.items() if c["ok"] is False}
    assert checks["mapping"]["ok"] and checks["sampling"]["ok"]
    if checks["foreign"]["ok"] is None:
        pytest.skip(f"no CUDA process could be started: {checks['foreign']['detail']}")
    assert checks["foreign"]["ok"] and checks["own"]["ok"]
