"""A level's statistics: records -> `LevelSummary` (percentiles, acceptance, errors); pure.

Latency figures (TTFT, TPOT, ITL, E2E) and the acceptance length use only requests that
COMPLETED inside the window without error. Acceptance length = sum(completion_tokens) /
sum(spec_verify_ct) over those requests, never the server's lifetime average.

A level with errors, or whose median inter-chunk gap moved by more than `DRIFT_LIMIT` between
the halves of its window (the server's speed changed mid-level), is `suspect`. A level in
which no request succeeded (`level_failure`: e.g. 0 completed and N errors, a server refusing
the workload) is not a measurement: its 0 tok/s is not the server's speed; its note says so
with the first failed request's words (HTTP status and the server's message).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ..records import LevelSummary, RequestRecord
from ..stats import percentile
from .plan import LevelPlan
from .saturation import saturation

Quantiles = tuple[float | None, float | None, float | None]   # p50, p90, p99


def _p50_90_99(values: Sequence[float]) -> Quantiles:
    if not values:
        return None, None, None
    v = sorted(values)
    return percentile(v, 50), percentile(v, 90), percentile(v, 99)


def summarize(
    records: Sequence[RequestRecord],
    plan: LevelPlan,
    *,
    window_tokens: int,
    window_s: float | None = None,
    span: tuple[float, float] | None = None,
) -> LevelSummary:
    """Aggregate one level's records.

    `window_tokens` (output tokens whose chunks arrived inside the window) comes from the
    stream, not the records; `window_s` defaults to the plan's duration. Latency and acceptance
    use the requests that completed in the window without error; `requests` and `errors` count
    every request that ended in the window; requests/s counts the successful ones. `span`: the
    window on the level's clock where it is not ``warmup_s`` to ``warmup_s + window_s`` (a
    level measured in rounds: its rates use the rounds' time, its checks the wall clock).

    Where no request completed in the window (a request takes longer than the window), the
    acceptance comes from the level's requests that completed before it, said in the note; with
    none, the note says why it is missing.
    """
    window_s = plan.duration_s if window_s is None else window_s
    span = span if span is not None else (plan.warmup_s, plan.warmup_s + window_s)
    in_win = [r for r in records if r.in_window]
    ok = [r for r in in_win if r.error is None]
    errors = len(in_win) - len(ok)

    accept, notes = _level_acceptance(records, ok, span[0], plan)
    failure = level_failure(records)
    drift = gap_drift(records, span[0], span[1])
    drifted = drift is not None and not 1 / DRIFT_LIMIT <= drift <= DRIFT_LIMIT
    notes += _check_notes(records, in_win, failure, window_s, drift if drifted else None)
    sat = saturation(records, span[1]) \
        if plan.mode == "closed" else None
    if sat is not None and sat.saturated:
        notes.append(f"saturated (GuideLLM's test): {sat.why}")

    tt, tp, it, ee = _latencies(ok)
    return LevelSummary(
        concurrency=plan.level,
        mode=plan.mode,
        rate=float(plan.rate) if plan.rate is not None else None,
        duration_s=window_s,
        requests=len(in_win),
        errors=errors,
        output_tokens=window_tokens,
        output_tok_s=window_tokens / window_s if window_s > 0 else 0.0,
        requests_s=len(ok) / window_s if window_s > 0 else 0.0,
        ttft_p50=tt[0], ttft_p90=tt[1], ttft_p99=tt[2],
        tpot_p50=tp[0], tpot_p90=tp[1], tpot_p99=tp[2],
        itl_p50=it[0], itl_p90=it[1], itl_p99=it[2],
        e2e_p50=ee[0], e2e_p90=ee[1], e2e_p99=ee[2],
        accept_length=accept,
        accept_histogram=_histogram(ok),
        suspect=errors > 0 or window_s <= 0 or failure is not None or drifted,
        note="; ".join(notes),
        saturated=bool(sat and sat.saturated),
    )


def _latencies(ok: Sequence[RequestRecord]) -> tuple[Quantiles, Quantiles, Quantiles, Quantiles]:
    """p50, p90, p99 of TTFT, TPOT, ITL and E2E over the requests that completed in the window
    without error."""
    ttft = [r.ttft for r in ok if r.ttft is not None]
    tpot = [
        (r.latency - r.ttft) / (r.output_tokens - 1)
        for r in ok
        if r.ttft is not None and r.output_tokens > 1
    ]
    itl = [g for r in ok for g in r.chunk_gaps]
    e2e = [r.latency for r in ok]
    return _p50_90_99(ttft), _p50_90_99(tpot), _p50_90_99(itl), _p50_90_99(e2e)


def _level_acceptance(records: Sequence[RequestRecord], ok: Sequence[RequestRecord], w0: float,
                      plan: LevelPlan) -> tuple[float | None, list[str]]:
    """The level's acceptance from `ok` (its requests that completed in the window without
    error); where none did, from the ones that completed before the window (`w0`), with a note
    saying so, or a note on why it is missing."""
    notes = []
    accept = acceptance(ok)
    if accept is None and not ok:
        before = [r for r in records if r.error is None and not r.in_window and r.verify_ct
                  and r.end <= w0]
        accept = acceptance(before)
        if accept is not None:
            notes.append(f"no request completed in the window: acceptance from the "
                         f"{len(before)} that completed before it")
        elif any(r.error is None for r in records) and plan.mode == "closed":
            notes.append(ACCEPT_UNREAD)
    return accept, notes


def _histogram(ok: Sequence[RequestRecord]) -> tuple[int, ...]:
    """The requests' acceptance histograms summed position by position."""
    hist: list[int] = []
    for r in ok:
        h = r.accept_histogram
        if len(h) > len(hist):
            hist.extend([0] * (len(h) - len(hist)))
        for i, c in enumerate(h):
            hist[i] += c
    return tuple(hist)


def _check_notes(records: Sequence[RequestRecord], in_win: Sequence[RequestRecord],
                 failure: str | None, window_s: float, drift: float | None) -> list[str]:
    """The level's checks in words, in this order: no request succeeded (`failure`), errors in
    the window by kind, failures outside it, an empty window, and the chunk gaps' drift (`drift`:
    the factor where it is beyond DRIFT_LIMIT, else None)."""
    notes = []
    if failure is not None:
        notes.append(f"no request succeeded, not a measurement: {failure}")
    kinds = Counter(r.error for r in in_win if r.error is not None)
    if kinds:
        notes.append("errors: " + ", ".join(f"{k} x{n}" for k, n in kinds.most_common()))
    outside = sum(1 for r in records if not r.in_window and r.error is not None)
    if outside:
        notes.append(f"{outside} failed outside the window")
    if window_s <= 0:
        notes.append("empty measurement window")
    if drift is not None:
        notes.append(f"median inter-chunk gap {'rose' if drift > 1 else 'fell'} {drift:.2f}x "
                     f"from the first to the second half of the window: the server's speed "
                     f"changed mid-level (clock throttling?)")
    return notes


# The note of a level whose acceptance no request could give (the trial drops it where the
# server's counters give it instead).
ACCEPT_UNREAD = ("no request completed in the level: acceptance not read from the requests "
                 "(a server gives it with a request's last chunk)")


def acceptance(records: Sequence[RequestRecord]) -> float | None:
    """sum(output tokens) / sum(verify steps) over the records that have verify steps."""
    verified = [r for r in records if r.verify_ct]
    verify_sum = sum(r.verify_ct or 0 for r in verified)
    return sum(r.output_tokens for r in verified) / verify_sum if verify_sum else None


def level_failure(records: Sequence[RequestRecord]) -> str | None:
    """Why a level measured nothing, or None when it measured the server.

    A level measures the server when at least one of its requests succeeded: it got a token
    and no error (it completed, or was still streaming when the level was cut). When none did,
    its figures (0 tok/s) say nothing about the server's speed, inside the window or out:
    - requests failed: the first failed request's words (by send time): its HTTP status and the
      server's own message where it gave one (`RequestRecord.error_detail`), else its error;
    - none failed, none got a token (all cut at the level's end while waiting): said so.
    A level that sent no request at all (no prompts) is not judged here: None."""
    if not records or any(r.error is None and (r.ttft is not None or r.output_tokens > 0)
                          for r in records):
        return None
    failed = [r for r in records if r.error is not None]
    if not failed:
        return (f"none of its {len(records)} request(s) got a token before the level ended "
                f"(a measurement window shorter than one request's time to first token?)")
    first = min(failed, key=lambda r: (r.start, r.index))
    return first.error_detail or first.error


# A level whose median inter-chunk gap changes by more than this factor between the halves of
# its window measured two speeds, not one. In a steady closed loop the median gap is the step
# time at a constant batch and stays within a few percent (checked on the simulator over
# levels in lockstep, where chunk COUNTS per half swing 2x and could not be used).
DRIFT_LIMIT = 1.5
_DRIFT_MIN_GAPS = 20
_DRIFT_MIN_GAP_S = 1e-3


def gap_drift(records: Sequence[RequestRecord], w0: float, w1: float) -> float | None:
    """Median chunk gap in the second half of [w0, w1] over the median in the first half
    (times relative to the level start); None with fewer than 20 gaps in either half.

    Every request that streamed contributes, whether it completed, failed or was cut: each gap
    is a sample of the server's speed at the moment its chunk arrived."""
    if w1 <= w0:
        return None
    mid = (w0 + w1) / 2
    first: list[float] = []
    second: list[float] = []
    for r in records:
        if r.ttft is None or not r.chunk_gaps:
            continue
        t = r.start + r.ttft
        for g in r.chunk_gaps:
            t += g
            if w0 <= t < mid:
                first.append(g)
            elif mid <= t <= w1:
                second.append(g)
    if len(first) < _DRIFT_MIN_GAPS or len(second) < _DRIFT_MIN_GAPS:
        return None
    a, b = percentile(first, 50), percentile(second, 50)
    # Servers that stream one token per chunk (llama.cpp) send a verify step's tokens in a
    # burst: most gaps are ~0 and the median says nothing about speed; no verdict then.
    if a is None or b is None or min(a, b) < _DRIFT_MIN_GAP_S:
        return None
    return b / a
