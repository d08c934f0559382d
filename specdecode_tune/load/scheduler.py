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
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import aiohttp

from ..errors import ConfigError
from ..records import LevelSummary, RequestRecord
from .client import request_parts, stream_request
from .plan import LevelPlan
from .protocols import Api
from .stats import summarize
from .tally import RequestState, tally_level
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
        workers = [
            asyncio.create_task(_worker(next_request, send, w1))
            for _ in range(plan.concurrency)
        ]
        t_cut = await _finish(workers, None, w1)
    else:
        tasks: list[asyncio.Task[None]] = []
        arrivals = asyncio.create_task(
            _arrivals(float(plan.rate or 1.0), plan.seed, next_request, send, tasks, t0, w1)
        )
        t_cut = await _finish(tasks, arrivals, w1)

    window_end = min(w1, t_cut)
    window_s = max(0.0, window_end - w0)
    records, window_tokens = tally_level(reqs, plan.level, t0, w0, window_end, api.stream)
    summary = summarize(records, plan, window_tokens=window_tokens, window_s=window_s)
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
) -> None:
    """One closed-loop worker: the next request goes as soon as the last one ends."""
    failures = 0
    while time.perf_counter() < w1:
        nxt = next_request()
        if nxt is None:
            return
        await send(*nxt)
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


async def _finish(
    tasks: list[asyncio.Task[None]], arrivals: asyncio.Task[bool] | None, w1: float
) -> float:
    """Wait for the window end, or for all work when the level ran out of requests; then
    cancel the requests still in flight. Returns the time the level was cut."""
    clock = time.perf_counter
    try:
        if arrivals is None:
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
        everything = [*tasks, arrivals] if arrivals is not None else tasks
        for t in everything:
            if not t.done():
                t.cancel()
        results = await asyncio.gather(*everything, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
                raise r   # expected failures are data in the records; anything else is a bug
