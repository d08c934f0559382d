"""The load generator against a real stream server subprocess on loopback.

One server (`specdecode_tune.testing.streamserver`) serves the module; each test reconfigures
it through `/reset`. What the server says it sent and saw is the reference for the client's
figures.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterator

import aiohttp
import pytest
from conftest import pick_free_port, pid_alive

from specdecode_tune.config import WorkloadSpec
from specdecode_tune.load import LevelPlan, iter_prompts, level_failure, measure, run_level
from specdecode_tune.records import LevelSummary, RequestRecord
from specdecode_tune.testing import streamserver


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    port = pick_free_port()
    proc = streamserver.start_subprocess(port)
    try:
        yield port
    finally:
        streamserver.stop_subprocess(proc)
        assert not pid_alive(proc.pid)


def base(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def run(
    port: int, api: str, plan: LevelPlan, spec: WorkloadSpec, headers: dict | None = None
) -> tuple[float, LevelSummary, list[RequestRecord]]:
    """Run one level; also return the perf_counter time just before it started."""

    async def go() -> tuple[float, LevelSummary, list[RequestRecord]]:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            t = time.perf_counter()
            summary, records = await run_level(
                session, base(port), api, iter_prompts(spec), plan, headers
            )
            return t, summary, records

    return asyncio.run(go())


def settle(port: int, timeout_s: float = 3.0) -> dict:
    """Server stats once no request is in flight any more (cancellations take a moment)."""
    deadline = time.monotonic() + timeout_s
    while True:
        s = streamserver.stats(port)
        if s["inflight"] == 0 or time.monotonic() > deadline:
            return s
        time.sleep(0.05)


def max_overlap(records: list[RequestRecord]) -> int:
    edges = sorted([(r.start, 1) for r in records] + [(r.end, -1) for r in records],
                   key=lambda e: (e[0], e[1]))
    best = cur = 0
    for _, d in edges:
        cur += d
        best = max(best, cur)
    return best


@pytest.mark.parametrize(
    "api, continuous",
    [("generate", True), ("completions", True), ("chat", True),
     # no per-chunk usage: 1 per chunk, corrected by the final usage / the level's ratio
     ("completions", False), ("chat", False)],
)
def test_tokens_per_second_match_what_the_server_sent(
    server: int, api: str, continuous: bool
) -> None:
    streamserver.reset(server, tokens_per_chunk=3, chunk_delay=0.01, continuous_usage=continuous)
    plan = LevelPlan(concurrency=16, warmup_s=0.5, duration_s=2.0)
    spec = WorkloadSpec(input_len=32, output_len=(60, 90))
    t, summary, records = run(server, api, plan, spec)
    w0 = t + plan.warmup_s
    sent = streamserver.stats(server, w0, w0 + plan.duration_s)["window_tokens"]
    server_tok_s = sent / plan.duration_s
    assert summary.output_tok_s == pytest.approx(server_tok_s, rel=0.02)
    # and the server paced about 16 streams x 3 tokens / 10 ms, less request turnaround
    assert 0.85 * 4800 < server_tok_s <= 4800 * 1.01
    assert summary.errors == 0 and summary.requests > 50
    assert any(not r.in_window and r.end >= plan.warmup_s + plan.duration_s - 1e-3 for r in records)
    assert summary.itl_p50 == pytest.approx(0.01, abs=0.003)
    assert summary.tpot_p50 == pytest.approx(0.01 / 3, rel=0.2)
    if api == "generate":
        # the server reports one verify step per 3-token chunk
        assert summary.accept_length == pytest.approx(3.0, rel=0.02)
        assert len(summary.accept_histogram) == 5 and summary.accept_histogram[2] > 0
    else:
        assert summary.accept_length is None
    ok = [r for r in records if r.in_window]
    assert all(60 <= r.output_tokens <= 90 for r in ok)


def test_closed_loop_keeps_exactly_c_requests_in_flight(server: int) -> None:
    streamserver.reset(server, tokens_per_chunk=1, chunk_delay=0.004)
    plan = LevelPlan(concurrency=12, warmup_s=0.2, duration_s=1.2)
    spec = WorkloadSpec(input_len=8, output_len=(5, 40))
    _, summary, records = run(server, "generate", plan, spec)
    s = settle(server)
    assert s["max_inflight"] == 12
    assert max_overlap(records) == 12
    assert s["requests"] == len(records) > 100
    assert summary.errors == 0


def test_open_loop_follows_the_seeded_poisson_schedule(server: int) -> None:
    # Slow requests (0.5 s each) at 40/s: an open loop does not wait for them.
    streamserver.reset(server, tokens_per_chunk=1, chunk_delay=0.05)
    plan = LevelPlan(rate=40.0, warmup_s=0.0, duration_s=2.5, seed=7)
    _, summary, records = run(server, "completions", plan, WorkloadSpec(input_len=8, output_len=10))
    rng = random.Random(7)
    schedule, t = [], 0.0
    while t < plan.duration_s:
        schedule.append(t)
        t += rng.expovariate(40.0)
    assert len(records) == len(schedule)
    lateness = [r.start - s for r, s in zip(records, schedule)]
    # Starts follow the schedule with no drift; one stall of this 2-core machine's event loop
    # may make a few late (seen: 0.17 s once), never all of them
    late = sorted(abs(x) for x in lateness)
    assert late[int(0.9 * len(late))] < 0.05 and late[-1] < 0.5, late[-5:]
    s = settle(server)
    assert s["requests"] == len(schedule)
    assert s["max_inflight"] > 12   # ~40/s x 0.5 s in flight, never capped by the client
    assert summary.mode == "rate" and summary.rate == 40.0 and summary.errors == 0


def test_window_end_cancels_in_flight_requests(server: int) -> None:
    streamserver.reset(server, tokens_per_chunk=1, chunk_delay=0.01)
    plan = LevelPlan(concurrency=4, warmup_s=0.2, duration_s=1.0)
    spec = WorkloadSpec(input_len=8, output_len=5000)   # 50 s per request
    t, summary, records = run(server, "chat", plan, spec)
    assert time.perf_counter() - t < plan.warmup_s + plan.duration_s + 1.0
    assert len(records) == 4
    assert all(not r.in_window and r.error is None for r in records)
    assert all(r.end == pytest.approx(1.2, abs=0.1) for r in records)
    assert summary.requests == 0 and summary.errors == 0 and summary.e2e_p50 is None
    # tokens that arrived in the window still count: 4 streams x 100 tok/s
    assert summary.output_tok_s == pytest.approx(400, rel=0.05)
    s = settle(server)
    assert s["inflight"] == 0 and s["disconnects"] == 4 and s["completed"] == 0


@pytest.mark.parametrize(
    "mode, error",
    [("500", "http 500"),
     ("drop", "disconnect"),
     ("malformed", "malformed chunk (JSONDecodeError)"),
     ("error_event", "server error: injected stream error")],
)
def test_failed_requests_are_recorded_and_counted(server: int, mode: str, error: str) -> None:
    streamserver.reset(server, tokens_per_chunk=2, chunk_delay=0.003, fail_every=3, fail_mode=mode)
    plan = LevelPlan(concurrency=4, warmup_s=0.1, duration_s=1.0)
    _, summary, records = run(server, "completions", plan, WorkloadSpec(input_len=8, output_len=16))
    in_window = [r for r in records if r.in_window]
    failed = [r for r in in_window if r.error is not None]
    assert {r.error for r in records if r.error} == {error}
    assert summary.errors == len(failed) > 0
    assert summary.requests == len(in_window)
    # every third request the server saw failed; the others completed normally
    assert len(failed) == pytest.approx(len(in_window) / 3, abs=3)
    assert summary.suspect and error in summary.note
    assert summary.requests_s == pytest.approx((len(in_window) - len(failed)) / plan.duration_s)


@pytest.mark.parametrize("mode, words", [
    ("500", "http 500: injected failure"),
    ("error_event", "error event in an http 200 stream: injected stream error")])
def test_a_server_failing_every_request_gives_no_measurement_but_its_words(
        server: int, mode: str, words: str) -> None:
    """Every request fails: the records keep their short kind as before and the server's own
    words beside it; the level says it measured nothing, with the first failure's words."""
    streamserver.reset(server, tokens_per_chunk=2, chunk_delay=0.003, fail_every=1, fail_mode=mode)
    plan = LevelPlan(concurrency=2, warmup_s=0.1, duration_s=0.5)
    _, summary, records = run(server, "completions", plan, WorkloadSpec(input_len=8, output_len=8))
    assert records and all(r.error is not None for r in records)
    assert {r.error_detail for r in records} == {words}
    assert level_failure(records) == words
    # (the error event comes after a few tokens: even those stream no measurement)
    assert summary.suspect
    assert summary.note.startswith(f"no request succeeded, not a measurement: {words}")


def test_stalled_request_times_out(server: int) -> None:
    streamserver.reset(server, tokens_per_chunk=1, chunk_delay=0.002, fail_every=2,
                       fail_mode="stall", fail_after_chunks=1)
    plan = LevelPlan(concurrency=2, warmup_s=0.0, duration_s=1.5, request_timeout_s=0.3)
    _, summary, records = run(server, "generate", plan, WorkloadSpec(input_len=8, output_len=8))
    assert {r.error for r in records if r.error} == {"timeout"}
    timed_out = [r for r in records if r.error == "timeout"]
    assert all(r.latency == pytest.approx(0.3, abs=0.1) for r in timed_out)
    assert summary.errors >= 2


def test_max_requests_ends_the_level_when_they_are_done(server: int) -> None:
    streamserver.reset(server, tokens_per_chunk=1, chunk_delay=0.002)
    plan = LevelPlan(concurrency=4, warmup_s=0.1, duration_s=30.0, max_requests=20)
    t, summary, records = run(server, "generate", plan, WorkloadSpec(input_len=8, output_len=20))
    assert time.perf_counter() - t < 5
    assert len(records) == 20 and all(r.error is None for r in records)
    assert 0 < summary.duration_s < 5
    assert summary.output_tok_s == pytest.approx(summary.output_tokens / summary.duration_s)


def test_a_level_in_rounds_ends_when_known_over_whole_requests(server: int) -> None:
    # 8 streams of 60 tokens, 3 a chunk every 10 ms: 0.2 s a request, steady. The level ends
    # as soon as two rounds agree, long before its 20 s cap, and counts whole requests only.
    streamserver.reset(server, tokens_per_chunk=3, chunk_delay=0.01)
    plan = LevelPlan(concurrency=8, warmup_s=0.0, duration_s=20.0, precision=0.02,
                     min_rounds=2)
    t, summary, records = run(server, "generate", plan, WorkloadSpec(input_len=8,
                                                                     output_len=60))
    took = time.perf_counter() - t
    assert took < 5 and summary.level_s is not None and summary.level_s < 5
    assert summary.rounds is not None and summary.rounds >= 2
    assert summary.precision is not None and summary.precision <= 0.02 / 1.02
    assert summary.accept_precision is not None and summary.accept_length == pytest.approx(3.0)
    counted = [r for r in records if r.in_window]
    assert len(counted) >= 8 * summary.rounds and all(r.output_tokens == 60 for r in counted)
    # The kept span ends at the last round's completion; the server's own tokens over it.
    end = max(r.end for r in counted)
    sent = streamserver.stats(server, t + end - summary.duration_s, t + end)["window_tokens"]
    assert summary.output_tok_s == pytest.approx(sent / summary.duration_s, rel=0.03)
    assert summary.output_tok_s == pytest.approx(summary.output_tokens / summary.duration_s,
                                                 rel=0.01)


def test_a_level_in_rounds_stops_at_its_cap_and_says_what_it_reached(server: int) -> None:
    # Requests of 5 s against a 1 s cap: no round completes; the level keeps the fixed
    # window's figure and says why, without acceptance (no request finished).
    streamserver.reset(server, tokens_per_chunk=1, chunk_delay=0.01)
    plan = LevelPlan(concurrency=4, warmup_s=0.0, duration_s=1.0, precision=0.02)
    t, summary, _ = run(server, "generate", plan, WorkloadSpec(input_len=8, output_len=500))
    assert time.perf_counter() - t < 3
    assert summary.rounds == 0 and summary.precision is None
    assert "no whole round within the cap of 1 s" in summary.note
    assert summary.accept_length is None and "acceptance not read" in summary.note
    assert summary.output_tok_s == pytest.approx(400, rel=0.1)


def test_measure_warms_up_runs_levels_in_order_and_never_logs_the_key(
    server: int, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "Bearer sk-test-do-not-log"
    streamserver.reset(server, tokens_per_chunk=2, chunk_delay=0.005, require_auth=secret)
    seen: list[int] = []
    plans = [LevelPlan(concurrency=c, warmup_s=0.1, duration_s=0.5) for c in (1, 3)]
    with caplog.at_level(logging.DEBUG):
        results = measure(
            base(server), "completions", WorkloadSpec(input_len=8, output_len=12), plans,
            warmup_requests=2, on_level=lambda s, r: seen.append(s.concurrency),
            headers={"Authorization": secret},
        )
    assert seen == [1, 3]
    assert [s.concurrency for s, _ in results] == [1, 3]
    assert all(s.errors == 0 and s.output_tok_s > 0 for s, _ in results)
    assert settle(server)["requests"] == 2 + sum(len(r) for _, r in results)
    assert "sk-test" not in caplog.text
    # without the key every request is a recorded 401, not an exception
    [(summary, _)] = measure(
        base(server), "completions", WorkloadSpec(input_len=8, output_len=4),
        [LevelPlan(concurrency=2, warmup_s=0, duration_s=0.3)], warmup_requests=1,
    )
    assert summary.errors > 0 and "http 401" in summary.note


def test_no_server_gives_connect_errors_without_a_busy_loop() -> None:
    port = pick_free_port()   # nothing listens there
    plan = LevelPlan(concurrency=2, warmup_s=0, duration_s=1.0)
    _, summary, records = run(port, "generate", plan, WorkloadSpec(input_len=8, output_len=8))
    assert {r.error for r in records} == {"connect failed"}
    assert summary.errors == len(records) < 50   # backoff, not thousands of instant failures
