"""Level maths on known records: percentiles, throughput, acceptance, token attribution."""

from __future__ import annotations

import math

import pytest

from specdecode_tune.errors import ConfigError
from specdecode_tune.load import LevelPlan, Prompt, level_failure, summarize
from specdecode_tune.load import RequestState as _Req
from specdecode_tune.load import tally_level as _records
from specdecode_tune.load.stats import ACCEPT_UNREAD
from specdecode_tune.records import RequestRecord
from specdecode_tune.stats import percentile

PLAN = LevelPlan(concurrency=4, warmup_s=1.0, duration_s=10.0)


def rec(index: int, start: float, end: float, ttft: float | None, out: int, **kw) -> RequestRecord:
    return RequestRecord(level=4, index=index, start=start, end=end, ttft=ttft, input_tokens=10,
                         output_tokens=out, **kw)


def test_percentile_interpolates_linearly_between_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]          # unsorted on purpose
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_summary_of_known_records() -> None:
    records = [
        # two in-window successes with spec counters
        rec(0, 1.0, 3.0, 0.5, 11, chunk_gaps=(0.1, 0.2), verify_ct=5, accept_histogram=(1, 2)),
        rec(1, 2.0, 6.0, 1.0, 31, chunk_gaps=(0.3,), verify_ct=10, accept_histogram=(0, 1, 4)),
        # an in-window success that reports no verify count: latency yes, acceptance no
        rec(2, 3.0, 4.0, 0.25, 1),
        # an in-window failure, a warm-up request, and a request cut at the window end
        rec(3, 4.0, 4.5, None, 0, error="http 500"),
        rec(4, 0.0, 0.9, 0.1, 5, in_window=False),
        rec(5, 8.0, 11.0, 0.2, 3, in_window=False),
    ]
    s = summarize(records, PLAN, window_tokens=500, window_s=10.0)
    assert (s.concurrency, s.mode, s.rate, s.duration_s) == (4, "closed", None, 10.0)
    assert (s.requests, s.errors) == (4, 1)
    assert s.output_tokens == 500 and s.output_tok_s == pytest.approx(50.0)
    assert s.requests_s == pytest.approx(0.3)                         # 3 ok / 10 s
    assert s.ttft_p50 == pytest.approx(0.5)                           # of 0.25, 0.5, 1.0
    assert s.e2e_p50 == pytest.approx(2.0)                            # of 1, 2, 4
    # TPOT: (2 - 0.5) / 10 = 0.15 and (4 - 1) / 30 = 0.1; the 1-token request has none
    assert s.tpot_p50 == pytest.approx(0.125)
    assert s.itl_p50 == pytest.approx(0.2) and s.itl_p99 == pytest.approx(0.298)
    # acceptance = (11 + 31) / (5 + 10), over requests that report verify counts only
    assert s.accept_length == pytest.approx(42 / 15)
    assert s.accept_histogram == (1, 3, 4)
    assert s.suspect and "http 500 x1" in s.note


def test_summary_without_spec_counters_has_no_acceptance() -> None:
    s = summarize([rec(0, 1.0, 2.0, 0.1, 10)], PLAN, window_tokens=10)
    assert s.accept_length is None and s.accept_histogram == ()
    assert s.duration_s == 10.0 and not s.suspect and s.note == ""


def test_acceptance_where_no_request_completed_in_the_window() -> None:
    # A saturated level whose requests take longer than the window (issue 35: every C=64
    # row of a run had an empty accept_length). The ones that completed before the window
    # give it, said so; with none completed at all, the note says why it is missing.
    before = rec(0, 0.0, 0.9, 0.1, 40, verify_ct=10, in_window=False)
    cut = [rec(i, 0.5, 11.0, 0.2, 30, in_window=False) for i in (1, 2, 3)]
    s = summarize([before, *cut], PLAN, window_tokens=300, window_s=10.0)
    assert s.accept_length == pytest.approx(4.0)
    assert "acceptance from the 1 that completed before it" in s.note
    none = summarize(cut, PLAN, window_tokens=300, window_s=10.0)
    assert none.accept_length is None and ACCEPT_UNREAD in none.note
    # A window with a completed request reads it from there, with no note.
    inside = summarize([rec(4, 2.0, 5.0, 0.2, 30, verify_ct=10), *cut], PLAN,
                       window_tokens=300, window_s=10.0)
    assert inside.accept_length == pytest.approx(3.0) and "acceptance" not in inside.note


def test_empty_window_is_flagged_not_divided_by_zero() -> None:
    s = summarize([], PLAN, window_tokens=0, window_s=0.0)
    assert s.output_tok_s == 0.0 and s.requests_s == 0.0 and s.suspect
    assert s.ttft_p50 is None and s.e2e_p99 is None


def test_rate_plan_summary_carries_the_exact_rate() -> None:
    plan = LevelPlan(rate=2.5, warmup_s=0, duration_s=4)
    s = summarize([], plan, window_tokens=0)
    assert (s.mode, s.rate, s.concurrency) == ("rate", 2.5, 2)


# --- token attribution -------------------------------------------------------------------------


def state(index: int, *, counted: int, in_win: int, inexact: bool, meta: dict | None,
          start: float = 100.0, end: float = 105.0, cancelled: bool = False,
          times: tuple[float, ...] = ()) -> _Req:
    st = _Req(index, Prompt("p", None, 1, 100))
    st.start, st.end, st.counted, st.in_win, st.inexact, st.meta = (
        start, end, counted, in_win, inexact, meta)
    st.cancelled = cancelled
    st.times = list(times)
    return st


def test_window_tokens_scale_one_per_chunk_counts_by_the_final_usage() -> None:
    reqs = [
        # exact (cumulative counters): counted as is
        state(0, counted=40, in_win=30, inexact=False, meta={"completion_tokens": 40}),
        # 1 per chunk, usage says 4 tokens per chunk: 10 chunks in window -> 40 tokens
        state(1, counted=25, in_win=10, inexact=True, meta={"completion_tokens": 100}),
        # cut at the window end without usage: scaled by the level's ratio (100 / 25)
        state(2, counted=6, in_win=5, inexact=True, meta=None, cancelled=True, end=111.0),
    ]
    records, tokens = _records(reqs, level=4, t0=100.0, w0=101.0, window_end=111.0)
    assert tokens == 30 + 40 + 20
    assert [r.output_tokens for r in records] == [40, 100, 24]
    cut = records[2]
    assert cut.in_window is False and cut.error is None


def test_records_are_relative_to_the_level_start_and_carry_spec_fields() -> None:
    meta = {"completion_tokens": 9, "prompt_tokens": 42, "spec_verify_ct": 3,
            "spec_accept_token_num": 6, "spec_draft_token_num": 9,   # older SGLang names
            "spec_accept_histogram": [0, 0, 3]}
    st = state(0, counted=9, in_win=9, inexact=False, meta=meta, start=101.5, end=102.5,
               times=(101.6, 101.8, 102.1))
    [r], tokens = _records([st], level=8, t0=100.0, w0=101.0, window_end=111.0)
    assert (r.level, r.start, r.end) == (8, pytest.approx(1.5), pytest.approx(2.5))
    assert r.ttft == pytest.approx(0.1)
    assert r.chunk_gaps == pytest.approx((0.2, 0.3))
    assert (r.input_tokens, r.output_tokens, r.verify_ct) == (42, 9, 3)
    assert (r.accepted_tokens, r.draft_tokens, r.accept_histogram) == (6, 9, (0, 0, 3))
    assert r.in_window and tokens == 9


def test_a_request_ending_before_the_window_is_not_in_it() -> None:
    st = state(0, counted=5, in_win=0, inexact=False, meta=None, start=100.0, end=100.5)
    [r], tokens = _records([st], level=1, t0=100.0, w0=101.0, window_end=111.0)
    assert not r.in_window and tokens == 0 and r.input_tokens == 1


# --- plan validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({}, "concurrency=None, rate=None"),
        ({"concurrency": 4, "rate": 1.0}, "exactly one"),
        ({"concurrency": 0}, "level.concurrency: got 0"),
        ({"concurrency": True}, "level.concurrency: got True"),
        ({"rate": -1.0}, "level.rate: got -1.0"),
        ({"rate": math.inf}, "level.rate: got inf"),
        ({"concurrency": 1, "duration_s": 0}, "level.duration_s: got 0"),
        ({"concurrency": 1, "warmup_s": -1}, "level.warmup_s: got -1"),
        ({"concurrency": 1, "max_requests": 0}, "level.max_requests: got 0"),
        ({"concurrency": 1, "request_timeout_s": 0}, "level.request_timeout_s: got 0"),
    ],
)
def test_bad_plans_name_the_key_and_value(kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError, match="allowed") as exc:
        LevelPlan(**kwargs)
    assert key in str(exc.value)
    assert "\n" not in str(exc.value)


# --- a level in which no request succeeded is not a measurement -----------------------------

REFUSED = ("http 400: Requested token count exceeds the model's maximum context length of "
           "262144 tokens.")


def test_a_level_whose_every_request_failed_is_not_a_measurement() -> None:
    """0 completed and N errors (a server refusing the workload): 0 tok/s is not the server's
    speed. The level says so with the first failed request's words, and is suspect."""
    records = [rec(i, 0.2 * i, 0.2 * i + 0.01, None, 0, error="http 400",
                   error_detail=f"{REFUSED} (#{i})", in_window=i > 0) for i in range(6)]
    s = summarize(records, PLAN, window_tokens=0, window_s=10.0)
    assert level_failure(records) == f"{REFUSED} (#0)"       # the first sent, even if outside
    assert s.output_tok_s == 0.0 and s.errors == 5 and s.suspect
    assert s.note.startswith(f"no request succeeded, not a measurement: {REFUSED} (#0)")
    assert "http 400 x5" in s.note
    # no words from the server (a timeout): its error stands for them
    assert level_failure([rec(0, 0.0, 5.0, None, 0, error="timeout")]) == "timeout"


def test_a_level_whose_failures_all_fell_outside_the_window_is_not_a_measurement_either() -> None:
    records = [rec(i, 0.1 * i, 0.1 * i + 0.01, None, 0, error="connect failed", in_window=False)
               for i in range(3)]
    s = summarize(records, PLAN, window_tokens=0, window_s=10.0)
    assert s.errors == 0 and s.suspect
    assert s.note.startswith("no request succeeded, not a measurement: connect failed")


def test_one_success_or_one_stream_still_running_makes_it_a_measurement() -> None:
    failed = [rec(i, 1.0 + i, 1.5 + i, None, 0, error="http 500") for i in range(3)]
    ok = rec(9, 2.0, 4.0, 0.3, 20)
    cut = rec(8, 2.0, 11.0, 0.3, 50, in_window=False)     # streaming when the window closed
    for records in (failed + [ok], failed + [cut]):
        assert level_failure(records) is None
        assert "not a measurement" not in summarize(records, PLAN, window_tokens=70).note
    assert level_failure([]) is None                       # no request sent: nothing to judge


def test_a_level_where_no_request_got_a_token_is_not_a_measurement() -> None:
    waiting = [rec(i, 1.0, 11.0, None, 0, in_window=False) for i in range(4)]
    why = level_failure(waiting)
    assert why is not None and "none of its 4 request(s) got a token" in why
