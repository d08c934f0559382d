"""Running one level: a closed loop or an open loop of streamed requests, cut at the window end.

- closed loop (`plan.concurrency` C): C workers, each sends its next request when its last one
  ends; a worker backs off after consecutive failures, so that a dead server does not turn
  the level into a busy loop of instant errors.
- open loop (`plan.rate`): requests start at seeded Poisson arrival times, however many are
  in flight.

A level runs ``warmup_s + duration_s``; at the window end, requests still streaming are
cancelled (the connection is closed, so the server aborts them) and recorded with
``in_window=False`` and no error. The level ends early when its prompts run out or
`plan.max_requests` were sent and all have finished; the window then ends there.

A closed loop with `plan.precision` (`plan.by_rounds`) counts whole rounds instead of a window
(`rounds`): each worker's requests sent after the warm-up, in order, the level ending at the
first complete round where the figures are known to that precision, or at the cap
``warmup_s + duration_s`` with the precision reached. Requests of later rounds, still running
then, are cancelled and do not count; the summary's `duration_s` is the counted requests'
worker-seconds over C, so that `output_tokens / duration_s` is the figure in both modes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import aiohttp

from ..backends.streamformat import StreamFormat
from ..errors import ConfigError
from ..records import LevelSummary, RequestRecord
from .client import request_parts, stream_request
from .plan import LevelPlan
from .protocols import Api
from .rounds import Batch, Stream, batches, known
from .stats import summarize
from .tally import RequestState, finished_round_figures, tally_level
from .workload import Prompt

_log = logging.getLogger("specdecode_tune.load")


async def run_level(
    session: aiohttp.ClientSession,
    base_url: str,
    api: Api | str,
    prompts_iter: Iterable[Prompt],
    plan: LevelPlan,
    headers: Mapping[str, str] | None = None,
) -> tuple[LevelSummary, list[RequestRecord]]:
    """Run one level against `base_url` and return its summary and every request's record.

    Request i of the level uses the i-th prompt of `prompts_iter`; the level ends early if the
    prompts run out or `plan.max_requests` were sent and all have finished.
    """
    api = Api.of(api)
    limit = session.connector.limit if session.connector is not None else 0
    if plan.concurrency is not None and limit and plan.concurrency > limit:
        raise ConfigError(
            f"level.concurrency: got {plan.concurrency}; allowed: at most the session's "
            f"connector limit {limit} (a lower limit would queue requests in the client)"
        )
    if plan.rate is not None and limit:
        _log.warning(
            "open loop at %s req/s on a session limited to %d connections: requests beyond "
            "that wait in the client and their latency includes the wait", plan.rate, limit,
        )
    url, hdrs, timeout, interp = request_parts(base_url, api, headers, plan.request_timeout_s)
    prompts = iter(prompts_iter)
    reqs: list[RequestState] = []
    cap = plan.max_requests if plan.max_requests is not None else math.inf

    t0 = time.perf_counter()
    w0 = t0 + plan.warmup_s
    w1 = w0 + plan.duration_s

    def next_request() -> tuple[RequestState, bytes] | None:
        if len(reqs) >= cap:
            return None
        prompt = next(prompts, None)
        if prompt is None:
            return None
        st = RequestState(len(reqs), prompt)
        reqs.append(st)
        return st, json.dumps(api.body(prompt)).encode()

    def send(st: RequestState, payload: bytes) -> Any:
        return stream_request(session, url, payload, hdrs, timeout, interp, st, w0, w1)

    if plan.concurrency is not None:
        progress = asyncio.Event()
        workers = [
            asyncio.create_task(_worker(next_request, send, w1, progress))
            for _ in range(plan.concurrency)
        ]
        judge = asyncio.create_task(_until_known(reqs, t0, w1, plan, api.stream, progress)) \
            if plan.by_rounds else None
        t_cut = await _finish(workers, None, w1, judge)
    else:
        tasks: list[asyncio.Task[None]] = []
        arrivals = asyncio.create_task(
            _arrivals(float(plan.rate or 1.0), plan.seed, next_request, send, tasks, t0, w1)
        )
        t_cut = await _finish(tasks, arrivals, w1)

    window_end = min(w1, t_cut)
    window_s = max(0.0, window_end - w0)
    records, window_tokens = tally_level(reqs, plan.level, t0, w0, window_end, api.stream)
    if plan.by_rounds:
        summary = _round_summary(records, reqs, plan, api.stream, t0, w0, window_end,
                                 window_tokens)
    else:
        summary = summarize(records, plan, window_tokens=window_tokens, window_s=window_s)
    summary = dataclasses.replace(summary, level_s=round(t_cut - t0, 3))
    _log.info(
        "level %s=%s: %.1f output tok/s, %.2f req/s, %d requests in window, %d errors",
        "concurrency" if plan.mode == "closed" else "rate",
        plan.concurrency if plan.mode == "closed" else plan.rate,
        summary.output_tok_s, summary.requests_s, summary.requests, summary.errors,
    )
    return summary, records


async def _worker(
    next_request: Callable[[], tuple[RequestState, bytes] | None],
    send: Callable[[RequestState, bytes], Any],
    w1: float,
    progress: asyncio.Event | None = None,
) -> None:
    """One closed-loop worker: the next request goes as soon as the last one ends;
    `progress` is set as each one ends."""
    failures = 0
    while time.perf_counter() < w1:
        nxt = next_request()
        if nxt is None:
            return
        await send(*nxt)
        if progress is not None:
            progress.set()
        if nxt[0].error is None:
            failures = 0
        else:
            # Back off on consecutive failures so that a dead server does not turn the level
            # into a busy loop of instant errors.
            failures += 1
            await asyncio.sleep(min(0.01 * 2 ** min(failures, 7), 1.0))


async def _arrivals(
    rate: float,
    seed: int,
    next_request: Callable[[], tuple[RequestState, bytes] | None],
    send: Callable[[RequestState, bytes], Any],
    tasks: list[asyncio.Task[None]],
    t0: float,
    w1: float,
) -> bool:
    """Open loop: start requests at seeded Poisson times until w1; True if out of requests."""
    rng = random.Random(seed)
    t_next = t0
    while t_next < w1:
        delay = t_next - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        nxt = next_request()
        if nxt is None:
            return True
        tasks.append(asyncio.create_task(send(*nxt)))
        t_next += rng.expovariate(rate)
    return False


def round_ends(reqs: Sequence[RequestState], per_round: int) -> list[float]:
    """tau_1, tau_2, ...: the times of the level's n-th, 2n-th, ... request to finish, n the
    requests a round holds (in lockstep, each round's last; a request cut at the level's end
    has not finished)."""
    ends = sorted(st.end for st in reqs if st.end is not None and not st.cancelled)
    return ends[per_round - 1::per_round]


def level_batches(reqs: Sequence[RequestState], per_round: int, t0: float,
                  stream: StreamFormat) -> list[Batch]:
    """The level's batches from its start `t0` to its last complete round."""
    bounds = [t0, *round_ends(reqs, per_round)]
    if len(bounds) < 2:
        return []
    return batches(bounds, [_stream(st, stream) for st in reqs])


def _stream(st: RequestState, stream: StreamFormat) -> Stream:
    completed = st.end is not None and not st.cancelled
    tokens, verify = finished_round_figures(st, stream) if completed else (0.0, None)
    # Requests counted a token per chunk are scaled by their final count where they got one.
    scale = tokens / st.counted if st.inexact and completed and st.counted and tokens else 1.0
    sizes = st.sizes if scale == 1.0 else [x * scale for x in st.sizes]
    return Stream(times=st.times, sizes=sizes, end=st.end, completed=completed,
                  tokens=tokens, verify_ct=verify)


def warmup_rounds(ends: Sequence[float], t0: float, warmup_s: float) -> int:
    """The rounds that ended within the level's first `warmup_s` seconds."""
    return sum(1 for e in ends if e <= t0 + warmup_s)


async def _until_known(reqs: list[RequestState], t0: float, w1: float, plan: LevelPlan,
                       stream: StreamFormat, progress: asyncio.Event) -> bool:
    """Wait until a complete round makes the level known (True), or until w1 (False)."""
    clock = time.perf_counter
    seen = 0
    c = plan.per_round
    precision = float(plan.precision or 0.0)
    while True:
        left = w1 - clock()
        if left <= 0:
            return False
        try:
            await asyncio.wait_for(progress.wait(), timeout=left)
        except TimeoutError:
            return False
        progress.clear()
        ends = round_ends(reqs, c)
        if len(ends) > seen:
            seen = len(ends)
            k = known(level_batches(reqs, c, t0, stream),
                      warmup_rounds(ends, t0, plan.warmup_s))
            if k is not None and k.met(precision, plan.min_rounds):
                return True


def _round_summary(records: list[RequestRecord], reqs: list[RequestState],
                   plan: LevelPlan, stream: StreamFormat, t0: float, w0: float,
                   window_end: float, window_tokens: int) -> LevelSummary:
    """The level's summary over the rounds it keeps (the requests that completed in them are
    its window's), with the rounds and the precision reached; without a kept round, the fixed
    window's figures (tokens that arrived in it) and a note why."""
    c = plan.per_round
    ends = round_ends(reqs, c)
    k = known(level_batches(reqs, c, t0, stream), warmup_rounds(ends, t0, plan.warmup_s))
    cap = plan.warmup_s + plan.duration_s
    if k is None or k.tok_s is None:
        summary = summarize(records, plan, window_tokens=window_tokens,
                            window_s=max(0.0, window_end - w0))
        why = (f"no whole round within the cap of {cap:g} s: tok/s counted over the window "
               f"(its cut may bias it)")
        return dataclasses.replace(summary, rounds=0, note=_join(summary.note, why))
    lo, hi = k.start - t0, k.end - t0
    ended = {st.index for st in reqs if st.end is not None and not st.cancelled}
    records[:] = [dataclasses.replace(r, in_window=r.index in ended and lo < r.end <= hi)
                  for r in records]
    tokens = k.tok_s.value * (k.end - k.start)
    summary = summarize(records, plan, window_tokens=round(tokens), window_s=k.end - k.start,
                        span=(lo, hi))
    note = summary.note
    if k.warmup:
        note = _join(note, f"first {k.warmup} of {k.rounds} rounds left out as warm-up "
                           f"(warmup_s, then MSER)" if plan.warmup_s else
                     f"first {k.warmup} of {k.rounds} rounds left out as warm-up (MSER)")
    if not k.met(float(plan.precision or 0.0), plan.min_rounds):
        reached = ("no interval from one round" if k.tok_s.rel_half is None else
                   f"tok/s known to +-{k.tok_s.rel_half:.1%}"
                   + (f", acceptance to +-{k.accept.rel_half:.1%}"
                      if k.accept is not None and k.accept.rel_half is not None else ""))
        note = _join(note, f"the level ended after {k.kept} kept round(s), at the cap of "
                           f"{cap:g} s or out of requests: {reached} (target "
                           f"+-{plan.precision:.1%})")
    return dataclasses.replace(
        summary, note=note, rounds=k.kept, precision=k.tok_s.rel_half,
        accept_precision=None if k.accept is None else k.accept.rel_half)


def _join(note: str, more: str) -> str:
    return f"{note}; {more}" if note else more


async def _finish(
    tasks: list[asyncio.Task[None]], arrivals: asyncio.Task[bool] | None, w1: float,
    judge: asyncio.Task[bool] | None = None,
) -> float:
    """Wait for the window end, or for all work when the level ran out of requests, or (a
    closed loop in rounds) until `judge`, the round rule, says the level is known; then
    cancel the requests still in flight. Returns the time the level was cut."""
    clock = time.perf_counter
    try:
        if judge is not None:
            # The first of the rule's answer, every worker's return (out of requests) and
            # the cap.
            waiting: set[asyncio.Task[Any]] = {*tasks, judge}
            while judge in waiting and any(t in waiting for t in tasks):
                done, waiting = await asyncio.wait(
                    waiting, timeout=max(0.0, w1 - clock()),
                    return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    break
        elif arrivals is None:
            # Closed-loop workers only return before w1 when out of requests.
            await asyncio.wait(tasks, timeout=max(0.0, w1 - clock()))
        else:
            await asyncio.wait([arrivals], timeout=max(0.0, w1 - clock()))
            exhausted = arrivals.done() and arrivals.result()
            pending = [t for t in tasks if not t.done()]
            if pending and clock() < w1:
                await asyncio.wait(pending, timeout=max(0.0, w1 - clock()))
            if not exhausted and clock() < w1:
                await asyncio.sleep(w1 - clock())
        return clock()
    finally:
        # Also runs when run_level itself is cancelled: no request outlives its level.
        everything = [*tasks, *(t for t in (arrivals, judge) if t is not None)]
        for t in everything:
            if not t.done():
                t.cancel()
        results = await asyncio.gather(*everything, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
                raise r   # expected failures are data in the records; anything else is a bug
