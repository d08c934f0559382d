"""The simulator's imitation of each SGLang release's words (`--sglang-version`, sim/releases.py):
copies of the SGLang backend's knowledge, and the backend reads what the simulator writes in the
forms of 0.5.10.post1 and 0.5.17 alike (tests/unit/backends/test_sglang_readings.py has SGLang's
own)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from specdecode_tune.backends import (
    get_backend,
    prometheus,
    sglang_logs,
    sglang_releases,
    sglang_wire,
)
from specdecode_tune.records import GRAPH_MEMORY, MEMORY_ROOM
from specdecode_tune.server.failures import classify_failure
from specdecode_tune.sim import metrics as sim_metrics
from specdecode_tune.sim import releases
from specdecode_tune.sim.api import SglangFormat
from specdecode_tune.sim.arguments import EMULATED_VERSION
from specdecode_tune.sim.model import startup
from specdecode_tune.sim.profile import load_profile
from specdecode_tune.sim.scheduler import Scheduler, SimRequest
from tests.unit.backends.test_sglang_readings import META_0510, META_0517, read_final_chunk

SGLANG = get_backend("sglang")


def test_the_simulator_copies_the_backends_release_formats() -> None:
    assert releases.SPEC_FIELD_NAMES == sglang_wire.SPEC_FIELD_NAMES
    assert releases.CAPTURE_COMMA_SINCE == sglang_logs.CAPTURE_COMMA_SINCE
    assert EMULATED_VERSION == sglang_releases.DEFAULT_VERSION
    for version in ("0.5.10.post1", "0.5.11", "0.5.12", "0.5.13", "0.5.14", "0.5.17"):
        assert releases.spec_field_names(version) == sglang_wire.spec_field_names(version)


@pytest.mark.parametrize("version", ["0.5.10.post1", "0.5.13", "0.5.14", "0.5.17"])
def test_the_simulators_capture_line_is_read_for_each_release(version: str) -> None:
    line = releases.capture_end_line(version, True, 1.5, 2.0, 16.0)
    assert (", avail mem=" in line) == (version in ("0.5.14", "0.5.17"))
    log = f"[t] INFO Load weight begin. avail mem=80.00 GB\n[t] INFO {line}"
    assert sglang_logs.memory_facts(log) == {MEMORY_ROOM: 0.2, GRAPH_MEMORY: 0.025}


def test_the_simulators_no_budget_refusal_from_0514_is_sglangs_kv_shortage() -> None:
    line = releases.no_kv_budget(0.5, 20.0, 80.0)
    assert line == ("ValueError: Loaded weights leave no GPU memory for the KV cache under "
                    "--mem-fraction-static=0.5. Raise --mem-fraction-static above 0.750 "
                    "(minimum viable = 1 - available/pre = 0.7500). If using speculative "
                    "decoding, draft weights are now counted.")
    assert classify_failure(1, line, SGLANG)[0] == "kv_memory"


@pytest.mark.parametrize("version", ["0.5.10.post1", "0.5.11", "0.5.17"])
def test_the_simulators_final_chunk_has_the_releases_names(version: str) -> None:
    req = SimpleNamespace(rid="r", finish_reason={"type": "length", "length": 9},
                          input_len=1, generated=9, created=0.0, verify_ct=3, correct_drafts=5,
                          histogram=[0, 1, 2])
    fmt = SglangFormat(req, 3, spec_names=releases.spec_field_names(version))  # type: ignore[arg-type]
    meta = fmt.full(list(range(9)))["meta_info"]
    expected = {"0.5.10.post1": META_0510, "0.5.11": None, "0.5.17": META_0517}[version]
    if expected is not None:
        assert {k: v for k, v in meta.items() if k.startswith("spec_")} == \
            {k: v for k, v in expected.items() if k.startswith("spec_")}
    read_final_chunk(meta)


@pytest.mark.parametrize(("version", "shown"), [("0.5.10.post1", False), ("0.5.17", True)])
def test_the_simulators_metrics_of_each_release(version: str, shown: bool) -> None:
    counters = SimpleNamespace(
        prompt_tokens=1, generation_tokens=2, finished_generation_tokens=2, requests_finished=1,
        requests_aborted=0,
        interval_gen_throughput=3.0, interval_accept_length=2.5, interval_num_steps=5,
        interval_num_draft_tokens=6, finished_verify_ct=7,
        ttft=SimpleNamespace(count=0), itl=SimpleNamespace(count=0), e2e=SimpleNamespace(count=0))
    sched = SimpleNamespace(counters=counters, stats_running=0, stats_queued=0, token_usage=0.0)
    text = sim_metrics.render(sched, "m", version)  # type: ignore[arg-type]
    samples = {s.name: s.value for s in prometheus.parse(text)}
    kinds = prometheus.types(text)
    assert samples["sglang:spec_accept_length"] == 2.5
    if shown:
        assert (samples["sglang:spec_num_steps"], samples["sglang:spec_num_draft_tokens"],
                samples["sglang:spec_verify_calls_total"]) == (5, 6, 7)
        assert kinds["sglang:spec_verify_calls_total"] == "counter"
        assert kinds["sglang:spec_num_steps"] == kinds["sglang:spec_num_draft_tokens"] == "gauge"
    else:
        assert not {"sglang:spec_num_steps", "sglang:spec_verify_calls_total"} & set(samples)



def test_the_simulators_steps_gauge_follows_the_adaptive_slot(tmp_path: Path) -> None:
    """A colleague's 0.5.17 server (by hand, H100, EAGLE-3) with {"1": {"candidate_steps":
    [5]}, "4": {"candidate_steps": [1]}} moved `sglang:spec_num_steps` from 5 to 1 with the
    batch size; the simulator imitating 0.5.17 does the same (the gauge is the decode batch's
    steps at the last log interval: 0.5.17 metrics_reporter.py L810-813, L886-887)."""
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps({"1": {"candidate_steps": [5]}, "4": {"candidate_steps": [1]}}))
    profile = load_profile("bench-schedule")
    facts = startup(profile, {
        "speculative_algorithm": "EAGLE3", "speculative_num_steps": 5,
        "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 6,
        "mem_fraction_static": 0.85, "speculative_adaptive": True,
        "speculative_adaptive_config": str(path), "sglang_version": "0.5.17"})

    async def done(req: SimRequest) -> None:
        while not (await req.queue.get())[1]:
            pass

    async def run() -> tuple[tuple[int, int], set[int]]:
        sched = Scheduler(profile, facts, seed=1, speed_factor=1e-3, noise_seed=1)
        task = asyncio.create_task(sched.run())
        c = sched.counters
        try:
            await asyncio.wait_for(done(sched.submit(16, 400, 0.0, True)), 30)
            alone = (c.interval_num_steps, c.interval_num_draft_tokens)
            many = [sched.submit(16, 2000, 0.0, True) for _ in range(8)]
            seen: set[int] = set()
            for _ in range(3000):
                await asyncio.sleep(0.001)
                if len(sched.running) == 8:
                    seen.add(c.interval_num_steps)
                if 1 in seen:
                    break
            for req in many:
                sched.abort(req)
            return alone, seen
        finally:
            sched.close()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    alone, seen = asyncio.run(run())
    assert alone == (5, 6) and 1 in seen


@pytest.mark.parametrize("version", ["0.5.10.post1", "0.5.17"])
def test_the_simulators_memory_usage_of_each_release(version: str) -> None:
    usage = releases.memory_usage(version, True, weight_gb=40.0, kv_gb=20.0, graph_gb=2.0,
                                  tokens=1000, available_gb=9.0)
    if version == "0.5.10.post1":
        assert usage == {"weight": 40.0, "kvcache": 20.0, "token_capacity": 1000, "graph": 2.0}
    else:
        assert usage["graph"] == {"target_verify": 2.0} and usage["startup_available"] == 9.0
