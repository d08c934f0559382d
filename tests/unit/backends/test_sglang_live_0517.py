"""The SGLang backend's readings held to what a live SGLang 0.5.17 said.

Every file read here is verbatim from one SGLang 0.5.17 server with EAGLE-3 on an H100 of the
device machine (2026-12-06; scripts/device/engine_readings.py through the GPU route,
docs/gpu.md), serving the test models of specdecode_tune.testing.eagle3: LIVE, not rendered
from source. tests/data/sglang-0.5.17/README.md says what each file is and what was cut.
docs/engines-sglang.md section 13 is the table of these readings, ours against the server's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specdecode_tune.backends import get_backend, prometheus, sglang, sglang_wire
from specdecode_tune.load import Prompt, tally_level
from specdecode_tune.load import RequestState as _Req
from specdecode_tune.records import GRAPH_MEMORY, MEMORY_ROOM
from specdecode_tune.server.failures import classify_failure
from specdecode_tune.sim import releases

LIVE = Path(__file__).resolve().parents[2] / "data" / "sglang-0.5.17"
SGLANG = get_backend("sglang")


def text(name: str) -> str:
    return (LIVE / name).read_text(encoding="utf-8")


def readings() -> dict[str, Any]:
    return json.loads(text("readings.json"))


def last_sse_chunk() -> dict[str, Any]:
    chunks = [json.loads(line[len("data: "):]) for line in text("generate-sse.txt").splitlines()
              if line.startswith("data: {")]
    return chunks[-1]


def record_of(chunk: dict[str, Any]) -> Any:
    has_text, tokens, kept = sglang_wire.interpret_generate(chunk)
    assert has_text and tokens == chunk["meta_info"]["completion_tokens"]
    st = _Req(0, Prompt("p", None, 1, 100))
    st.start, st.end, st.counted, st.in_win, st.inexact, st.meta = \
        0.0, 1.0, tokens, tokens, False, kept
    [r], _ = tally_level([st], level=1, t0=0.0, w0=0.0, window_end=2.0,
                         stream=sglang_wire.STREAM_FORMAT)
    return r


@pytest.mark.parametrize("source", ["sse", "whole"])
def test_the_final_chunk_of_a_live_server_is_read(source: str) -> None:
    """64 tokens in 20 verify steps (steps 3, topk 1: 3 drafts each), 45 of 60 drafts taken;
    SGLang's own spec_accept_length 3.2 = 64 / 20."""
    chunk = last_sse_chunk() if source == "sse" else json.loads(text("generate-whole.json"))
    meta = chunk["meta_info"]
    r = record_of(chunk)
    assert (r.verify_ct, r.accepted_tokens, r.draft_tokens) == (20, 45, 60)
    assert r.accept_histogram == (1, 2, 8, 9)
    assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / r.verify_ct)
    # 0.5.17 writes its new names and keeps the old ones as aliases (the source said so;
    # a colleague's by-hand listing missed spec_accept_histogram)
    for new, old in (("spec_num_correct_drafts", "spec_accepted_drafts"),
                     ("spec_num_proposed_drafts", "spec_proposed_drafts"),
                     ("spec_correct_drafts_histogram", "spec_accept_histogram")):
        assert meta[new] == meta[old]
    assert [n[0] for n in sglang_wire.spec_field_names("0.5.17")] == [
        "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_correct_drafts_histogram"]


def test_every_line_of_the_live_metrics_parses_and_the_spec_types_are_sglangs() -> None:
    for name in ("metrics-before.txt", "metrics-after.txt", "metrics-adaptive-C1.txt",
                 "metrics-adaptive-C16.txt"):
        assert prometheus.parse(text(name))
    types = prometheus.types(text("metrics-after.txt"))
    assert types["sglang:spec_verify_calls_total"] == "counter"
    assert types["sglang:generation_tokens_total"] == "counter"
    for gauge in ("spec_accept_length", "spec_accept_rate", "spec_num_steps",
                  "spec_num_draft_tokens"):
        assert types[f"sglang:{gauge}"] == "gauge"


def test_the_window_acceptance_from_the_live_counters_matches_the_final_chunks() -> None:
    """The level of 8 s at C=16 (readings.json): acceptance 3.125 from its requests' final
    chunks; the counters' deltas around it give the same within 1%."""
    before = sglang_wire.spec_counters(prometheus.parse(text("metrics-before.txt")))
    after = sglang_wire.spec_counters(prometheus.parse(text("metrics-after.txt")))
    acc, hist = SGLANG.window_acceptance(before, after)
    chunks = readings()["healthy"]["level"]["accept_length"]
    assert acc is not None and acc == pytest.approx(chunks, rel=0.01)
    assert hist == ()
    # both counters are summed over their labels (generation_tokens_total has is_streaming)
    assert after is not None and after[sglang_wire.GENERATED] == 95203.0


def test_server_info_gives_the_pool_the_limit_and_the_release(monkeypatch) -> None:
    info = json.loads(text("server_info.json"))
    monkeypatch.setattr(sglang, "get_json", lambda url, *a, **k: info)
    facts = SGLANG.read_facts("http://127.0.0.1:1")
    assert facts.max_total_num_tokens == 24459       # the log's "#tokens: 24459" too
    assert facts.max_running_requests == 64
    assert facts.extra["version"] == "0.5.17"
    assert "max_total_num_tokens=24459" in text("healthy-startup.log")


def test_the_load_endpoints_count_requests_in_flight(monkeypatch) -> None:
    """Idle: /v1/loads and /get_load say 0. Through the level: every /get_load answer of the
    drain poll gives a count, and the last ones 0 (the level drained)."""
    bodies = {"/v1/loads?include=core": json.loads(text("v1_loads-idle.json")),
              "/get_load": json.loads(text("get_load-idle.json"))}
    backend = sglang.SGLangBackend()
    monkeypatch.setattr(sglang, "get_json", lambda url, *a, **k: bodies[url[len("u"):]])
    assert backend.in_flight("u") == 0
    polls = [json.loads(line) for line in text("get_load-drain.jsonl").splitlines()]
    counts = [sglang_wire.load_count(json.loads(p["body"]), ("num_reqs",)) for p in polls]
    assert all(isinstance(c, int) for c in counts) and max(counts) == 16 and counts[-1] == 0


def test_the_deprecation_line_the_simulator_writes_is_the_live_servers() -> None:
    lines = [ln for ln in text("healthy-startup.log").splitlines() if "/get_load" in ln
             and "deprecated" in ln]
    assert lines and all(ln.endswith(releases.GET_LOAD_DEPRECATED) for ln in lines)


def test_the_capture_lines_of_a_live_boot_give_its_memory() -> None:
    """0.85 GB kept by five captures (target prefill 0.38, verify 0.07, draft prefill 0.28,
    draft decode 0.06, draft extend 0.06) and 77.15 GB left, of 78.47 GB before the weights."""
    got = SGLANG.memory_facts(text("healthy-startup.log"))
    assert got[GRAPH_MEMORY] == pytest.approx(0.85 / 78.47, abs=1e-6)
    assert got[MEMORY_ROOM] == pytest.approx(77.15 / 78.47, abs=1e-6)
    assert got == {k: readings()["healthy"]["memory"][k] for k in (MEMORY_ROOM, GRAPH_MEMORY)}


@pytest.mark.parametrize(("name", "kind", "words"), [
    ("refused-kv-0.0005.log", "kv_memory",
     "Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.0005"),
    ("refused-oom-0.995.log", "oom", "CUDA out of memory"),
])
def test_the_live_refusals_are_classified(name: str, kind: str, words: str) -> None:
    got, reason = classify_failure(1, text(name), SGLANG)
    assert got == kind and words in reason, (got, reason)


def test_the_kv_line_of_the_live_pools_meets_the_live_refusal() -> None:
    """The pools the search's boots reported (max_total_num_tokens at two fractions) put zero
    tokens at 0.00273, where SGLang's refusal says the minimum viable fraction is 0.0027."""
    import csv
    pools = {float(r["mem_fraction_static"]): int(r["max_total_num_tokens"])
             for r in csv.DictReader(text("search-levels.csv").splitlines())
             if r["mem_fraction_static"]}      # the boots of the search on the same server
    assert pools[0.006] == 24459 and pools[0.012] == 69398
    slope = (pools[0.012] - pools[0.006]) / 0.006
    zero = 0.006 - pools[0.006] / slope
    assert zero == pytest.approx(0.0027, abs=0.00005)
    assert "minimum viable = 1 - available/pre = 0.0027" in text("refused-kv-0.0005.log")


@pytest.mark.parametrize(("name", "steps", "drafts"), [
    ("metrics-adaptive-C1.txt", 5.0, 6.0), ("metrics-adaptive-C16.txt", 1.0, 2.0)])
def test_the_adaptive_schedule_switched_steps_by_batch_size(name: str, steps: float,
                                                             drafts: float) -> None:
    """adaptive-config.json {"1": [5], "4": [1]}: 5 steps at C=1, 1 step from batch size 4 on."""
    samples = prometheus.parse(text(name))
    assert prometheus.total(samples, "sglang:spec_num_steps") == steps
    assert prometheus.total(samples, "sglang:spec_num_draft_tokens") == drafts
    config = json.loads(text("adaptive-config.json"))
    assert config == {"1": {"candidate_steps": [5]}, "4": {"candidate_steps": [1]}}


def test_a_trials_stop_no_longer_waits_for_crash_diagnostics() -> None:
    """The group's SIGTERM reached the scheduler first and the launcher slept 5 s "before crash
    diagnostics" at the end of every boot; the backend turns both switches off (0.5.13+), and
    an experiment that sets them keeps its own."""
    assert "Sleeping 5 seconds before crash diagnostics" in text("stop-by-group-sigterm.log")
    from specdecode_tune.config import BackendConfig
    env = SGLANG.env(BackendConfig(kind="sglang", model_path="m"))
    assert env["SGLANG_PYSPY_DUMP_BEFORE_CRASH"] == env["SGLANG_CUDA_COREDUMP_BEFORE_CRASH"] == "0"
    mine = BackendConfig(kind="sglang", model_path="m",
                         env={"SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "1"})
    assert SGLANG.env(mine)["SGLANG_CUDA_COREDUMP_BEFORE_CRASH"] == "1"
