"""One streamed request: POST, read the SSE body chunk by chunk, count tokens, record failures.

`stream_request` writes everything it learns into a `RequestState` (from `tally`), once, when
the request ends: the per-chunk loop (`_read_events`, a coroutine of its own so that the
request around it reads as POST, body, record) keeps its counts in local variables until it
ends, does no logging, and does per chunk only the SSE split, `json.loads` and the API's
interpreter (and the append of the chunk's time and size). Every expected failure becomes the
state's `error` (and `error_detail`: the server's own words, where it gave any); cancellation
(the level's end) marks the state `cancelled` and propagates. A request whose stream ended
without ``[DONE]`` failed (truncated); after ``[DONE]`` the end of the body is read for up to
`DRAIN_S` so that the connection goes back to the pool.

All timestamps come from `time.perf_counter()`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import aiohttp

from ..backends.streamformat import MALFORMED, Interpreter, StreamError
from .protocols import ERROR_BODY_BYTES, Api, error_message
from .sse import SSEError, SSEParser
from .tally import RequestState

_log = logging.getLogger("specdecode_tune.load")

DONE = b"[DONE]"
DRAIN_S = 1.0   # after [DONE], how long to wait for the end of the body to keep the connection


def request_parts(
    base_url: str, api: Api, headers: Mapping[str, str] | None, timeout_s: float
) -> tuple[str, dict[str, str], aiohttp.ClientTimeout, Interpreter]:
    """The URL, headers, timeout and interpreter that every request of a level shares."""
    url = base_url.rstrip("/") + api.path
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(timeout_s, 30.0))
    return url, hdrs, timeout, api.interpreter


async def _error_body(resp: aiohttp.ClientResponse) -> str:
    """The message of a non-200 response (see `error_message`), read within the request's
    timeout; a body that cannot be read is said so, never an exception."""
    try:
        return error_message(await resp.content.read(ERROR_BODY_BYTES))
    except (aiohttp.ClientError, TimeoutError):
        return "(body not readable)"


async def stream_request(
    session: aiohttp.ClientSession,
    url: str,
    payload: bytes,
    headers: Mapping[str, str],
    timeout: aiohttp.ClientTimeout,
    interp: Interpreter,
    st: RequestState,
    w0: float,
    w1: float,
) -> None:
    """Stream one request into `st`, counting as in-window the tokens whose chunk arrived in
    ``[w0, w1]``; every failure becomes `st.error`, cancellation propagates."""
    clock = time.perf_counter
    done = clean = False
    resp: aiohttp.ClientResponse | None = None
    st.start = clock()
    try:
        resp = await session.post(url, data=payload, headers=headers, timeout=timeout)
        if resp.status != 200:
            raise StreamError(f"http {resp.status}",
                              detail=f"http {resp.status}: {await _error_body(resp)}")
        st.end = await _read_events(resp.content, interp, st, w0, w1)
        done = True
        # Read the body's end so the connection goes back to the pool instead of being closed.
        if not resp.content.at_eof():
            async with asyncio.timeout(DRAIN_S):
                while await resp.content.readany():
                    pass
        clean = True
    except asyncio.CancelledError:
        st.cancelled = True
        raise
    except StreamError as exc:
        st.error = str(exc)
        st.error_detail = exc.detail
    except SSEError as exc:
        st.error = f"malformed stream ({exc})"
    except TimeoutError:
        st.error = None if done else "timeout"   # after [DONE] only the drain timed out
    except aiohttp.ClientConnectorError:
        st.error = "connect failed"
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
        st.error = None if done else "disconnect"
    except aiohttp.ClientError as exc:
        st.error = f"client error ({type(exc).__name__})"
    finally:
        if st.end is None:
            st.end = clock()
        if resp is not None:
            if clean:
                resp.release()
            else:
                resp.close()   # drops the connection: the server sees the client go away
    if st.error is not None:
        _log.debug("request %d failed: %s", st.index, st.error)


async def _read_events(content: aiohttp.StreamReader, interp: Interpreter, st: RequestState,
                       w0: float, w1: float) -> float:
    """The per-chunk loop: read the SSE body up to ``[DONE]`` and return the time of its last
    chunk; a body that ends before it is a truncated stream (`StreamError`). Each chunk that
    carried tokens goes to `st.times` / `st.sizes` as it comes; the counts (`counted`, `in_win`
    for ``[w0, w1]``, `inexact`) and the last meta are kept in local variables and written to
    `st` once, when the loop ends for any reason (so a request cut mid-stream keeps them)."""
    clock = time.perf_counter
    loads = json.loads
    feed = SSEParser().feed
    mark = st.times.append
    size = st.sizes.append
    prev_cum = counted = in_win = 0
    inexact = False
    meta: dict[str, Any] | None = None
    try:
        while True:
            data = await content.readany()
            if not data:
                raise StreamError("truncated stream (no [DONE])")
            t = clock()
            for ev in feed(data):
                if ev == DONE:
                    return t
                if not ev:
                    continue
                try:
                    has_text, cum, m = interp(loads(ev))
                except MALFORMED as exc:
                    raise StreamError(f"malformed chunk ({type(exc).__name__})") from None
                if m is not None:
                    meta = m
                if cum is None:
                    if not has_text:
                        continue
                    new = 1
                    inexact = True
                else:
                    new = cum - prev_cum
                    if new <= 0:
                        continue
                    prev_cum = cum
                counted += new
                if w0 <= t <= w1:
                    in_win += new
                mark(t)
                size(new)
    finally:
        st.counted = counted
        st.in_win = in_win
        st.inexact = inexact
        st.meta = meta
