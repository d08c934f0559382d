"""A trial's measurement: one HTTP session, a warm-up, then each level's plan in order.

`measure` is the synchronous entry the trial calls, with a callback after each level (so the
trial can checkpoint) and one just before it (the trial snapshots the server's counters
there). The warm-up's requests (`warm_up`) count for nothing: they wake the server (caches,
compiled graphs) and tell a server that fails every request from one that is merely cold.
Every level, and the warm-up, draws its prompts from its own stream of the workload, so no
prompt repeats across them and level k of every trial sends the same prompts.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import fields

import aiohttp

from ..records import LevelSummary, RequestRecord
from .client import request_parts, stream_request
from .plan import LevelPlan
from .protocols import Api
from .scheduler import run_level
from .tally import RequestState, tally_level
from .workload import Prompt, WorkloadSpec, iter_prompts

_log = logging.getLogger("specdecode_tune.load")


async def warm_up(
    session: aiohttp.ClientSession,
    base_url: str,
    api: Api | str,
    prompts: Sequence[Prompt],
    n: int,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 600.0,
) -> list[RequestRecord]:
    """Send `n` requests at once (cycling over `prompts`) and wait for them; nothing is counted.

    Returns their records (level 0, never in a window) so the caller can tell a server that
    fails every request from one that is merely cold.
    """
    if n <= 0 or not prompts:
        return []
    api = Api.of(api)
    url, hdrs, timeout, interp = request_parts(base_url, api, headers, timeout_s)
    reqs = [RequestState(i, p) for i, p in zip(range(n), itertools.cycle(prompts))]
    t0 = time.perf_counter()
    never = math.inf
    await asyncio.gather(
        *(
            stream_request(session, url, json.dumps(api.body(st.prompt)).encode(), hdrs,
                           timeout, interp, st, never, never)
            for st in reqs
        )
    )
    records, _ = tally_level(reqs, 0, t0, never, never, api.stream)
    failed = sum(1 for r in records if r.error is not None)
    if failed:
        _log.warning("%d of %d warm-up requests failed", failed, n)
    return records


# Prompt streams: level i uses stream i, the warm-up its own, so no prompt repeats across them.
_WARMUP_STREAM = 1_000_003


def measure(
    base_url: str,
    api: Api | str,
    workload_spec: WorkloadSpec,
    plans: Sequence[LevelPlan],
    warmup_requests: int = 2,
    on_level: Callable[[LevelSummary, list[RequestRecord]], None] | None = None,
    headers: Mapping[str, str] | None = None,
    on_level_start: Callable[[LevelPlan], None] | None = None,
    lengths: Mapping[str, tuple[int, int]] | None = None,
) -> list[tuple[LevelSummary, list[RequestRecord]]]:
    """Warm up, then run each plan in order on one session; call `on_level` after each level
    (and `on_level_start` just before it: the trial snapshots server counters there).
    `lengths`: a sharegpt workload's token counts by prompt id from the server
    (`load.tokencount`).

    `headers` go on every request (e.g. ``{"Authorization": f"Bearer {key}"}`` from an env var
    the caller reads); they are never logged. `workload_spec` may be any object with
    `WorkloadSpec`'s fields; it is validated through `WorkloadSpec`.
    """
    if not isinstance(workload_spec, WorkloadSpec):
        workload_spec = WorkloadSpec(
            **{f.name: getattr(workload_spec, f.name) for f in fields(WorkloadSpec)}
        )
    return asyncio.run(
        _measure(base_url, Api.of(api), workload_spec, plans, warmup_requests, on_level, headers,
                 on_level_start, lengths)
    )


async def _measure(
    base_url: str,
    api: Api,
    spec: WorkloadSpec,
    plans: Sequence[LevelPlan],
    warmup_requests: int,
    on_level: Callable[[LevelSummary, list[RequestRecord]], None] | None,
    headers: Mapping[str, str] | None,
    on_level_start: Callable[[LevelPlan], None] | None = None,
    lengths: Mapping[str, tuple[int, int]] | None = None,
) -> list[tuple[LevelSummary, list[RequestRecord]]]:
    # Closed loops need one connection per worker; an open loop has no bound on requests in
    # flight, and a connector limit would queue them in the client, so it gets none (0).
    if any(p.rate is not None for p in plans):
        limit = 0
    else:
        limit = max([p.concurrency or 1 for p in plans] + [warmup_requests, 1])
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0)
    session_timeout = aiohttp.ClientTimeout(total=None, sock_connect=30.0)
    results: list[tuple[LevelSummary, list[RequestRecord]]] = []
    # The warm-up obeys the levels' request timeout: a server that hangs on its first requests
    # must not hold the trial for warm_up's default.
    warmup_timeout_s = max((p.request_timeout_s for p in plans), default=600.0)
    async with aiohttp.ClientSession(connector=connector, timeout=session_timeout) as session:
        await warm_up(
            session, base_url, api,
            list(itertools.islice(iter_prompts(spec, _WARMUP_STREAM, lengths), warmup_requests)),
            warmup_requests,
            headers, timeout_s=warmup_timeout_s,
        )
        for i, plan in enumerate(plans):
            prompts: Iterator[Prompt] = iter_prompts(spec, stream=i, lengths=lengths)
            if on_level_start is not None:
                on_level_start(plan)
            summary, records = await run_level(session, base_url, api, prompts, plan, headers)
            results.append((summary, records))
            if on_level is not None:
                on_level(summary, records)
    return results
