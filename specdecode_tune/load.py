"""The load generator: streamed requests at a fixed concurrency or request rate, measured per level.

Layers, bottom up (one file, since each is small and only this module uses them):

- `SSEParser`: one incremental Server-Sent-Events parser for every server. It takes bytes split
  anywhere and returns each event's data payload as bytes (UTF-8 as sent; JSON decodes it).
- `Api` and the per-API interpreters: `/generate` (SGLang native), `/v1/completions` and
  `/v1/chat/completions` (OpenAI format; SGLang and vLLM). A request body builder and a function
  that turns one decoded event into ``(has_text, cumulative_tokens | None, meta | None)``. The
  streaming loop (`_send`) is shared; nothing else differs between servers.
- `LevelPlan` and `run_level`: closed loop (C workers, each sends its next request when its last
  one ends) or open loop (seeded Poisson arrivals). A level runs ``warmup_s + duration_s``; at
  the window end, requests still streaming are cancelled (the connection is closed, so the
  server aborts them) and recorded with ``in_window=False`` and no error.
- `summarize`: records -> `LevelSummary` (percentiles, acceptance, errors); pure, so testable.
  A level with errors, or whose median inter-chunk gap moved by more than `DRIFT_LIMIT`
  between the halves of its window (the server's speed changed mid-level), is `suspect`.
  A level in which no request succeeded (`level_failure`: e.g. 0 completed and N errors, a
  server refusing the workload) is not a measurement: its 0 tok/s is not the server's speed;
  its note says so with the first failed request's words (HTTP status and the server's message).
- `measure`: the synchronous facade the trial calls: one `aiohttp.ClientSession`, a warm-up,
  then each plan in order, with a callback after each level so the trial can checkpoint.

How output tokens are counted. Throughput is the number of tokens whose chunk ARRIVED inside
the measurement window ``[warmup end, window end]``, divided by the window's length: requests
that started in the warm-up or are cut at the end contribute exactly their in-window tokens,
so ramp-up and ramp-down do not bias the figure. Per chunk, the token count comes from a
cumulative counter where the API has one (`/generate`'s ``meta_info.completion_tokens``; the
OpenAI APIs' per-chunk ``usage`` when the server honours ``continuous_usage_stats``, which
SGLang and vLLM do). Otherwise each chunk with non-empty text counts 1, and the final ``usage``
corrects it: the request's in-window count is scaled by ``usage.completion_tokens / chunks``
(speculative decoding puts several tokens in one chunk, so 1 per chunk would undercount by the
acceptance length). A request cut at the window end has no final usage; it is scaled by the
level's ratio of reported to counted tokens over the requests that had one.

Latency figures (TTFT, TPOT, ITL, E2E) and the acceptance length use only requests that
COMPLETED inside the window without error. Acceptance length = sum(completion_tokens) /
sum(spec_verify_ct) over those requests, never the server's lifetime average.

All timestamps come from `time.perf_counter()`. The per-chunk loop does no logging and keeps
its state in local variables; a request's state object is written once, when it ends.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, NoReturn

import aiohttp

from specdecode_tune.errors import ConfigError
from specdecode_tune.records import LevelSummary, RequestRecord
from specdecode_tune.workload import Prompt, WorkloadSpec, iter_prompts, make_prompts

__all__ = [
    "API_KINDS",
    "Api",
    "LevelPlan",
    "SSEParser",
    "level_failure",
    "measure",
    "percentile",
    "run_level",
    "summarize",
    "warm_up",
]

_log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# SSE parsing
# --------------------------------------------------------------------------------------------

_LINE_END = re.compile(rb"\r\n|\r|\n")


class SSEError(Exception):
    """A stream broke the SSE framing badly enough to stop reading it (an oversized event)."""


class SSEParser:
    """Incremental parser of a `text/event-stream` body (WHATWG HTML, "server-sent events").

    `feed(data)` accepts any slice of the byte stream and returns the data payloads of the events
    completed by it. Lines end in CRLF, LF or CR (a CR at the end of one slice and an LF at the
    start of the next are one line end). Comment lines (``:...``) are skipped; ``data`` lines of
    one event are joined with ``\\n``; an event is dispatched on a blank line when it had at least
    one ``data`` line; other fields (``event``, ``id``, ``retry``) are ignored since no LLM server
    uses them for content. An unterminated event at end of stream is dropped, as the spec says.

    The returned list is reused: it is valid until the next `feed` call. That saves a list per
    chunk on the hot path; callers iterate it at once.
    """

    __slots__ = ("_buf", "_data", "_data_size", "_skip_lf", "_events", "_max_event")

    def __init__(self, max_event_bytes: int = 64 * 1024 * 1024) -> None:
        self._buf = b""                     # the incomplete last line
        self._data: list[bytes] | None = None   # data lines of the event being read
        self._data_size = 0
        self._skip_lf = False               # the previous slice ended in CR
        self._events: list[bytes] = []
        self._max_event = max_event_bytes   # bounds memory against a stream with no line ends

    def feed(self, data: bytes) -> list[bytes]:
        events = self._events
        events.clear()
        if self._skip_lf:
            self._skip_lf = False
            if data[:1] == b"\n":
                data = data[1:]
        if self._buf:
            data = self._buf + data
            self._buf = b""
        # Fast path: the usual slice is exactly one single-line event, "data: {...}\n\n".
        if (
            self._data is None
            and data.startswith(b"data: ")
            and data.endswith(b"\n\n")
            and data.count(b"\n") == 2
            and b"\r" not in data
        ):
            events.append(data[6:-2])
            return events
        if b"\r" in data:
            lines = _LINE_END.split(data)
            # A trailing CR ends its line now; an LF starting the next slice belongs to it.
            self._skip_lf = data.endswith(b"\r")
        else:
            lines = data.split(b"\n")
        self._buf = lines.pop()
        for line in lines:
            if not line:
                if self._data is not None:
                    d = self._data
                    events.append(d[0] if len(d) == 1 else b"\n".join(d))
                    self._data = None
                    self._data_size = 0
                continue
            if line[0] == 0x3A:  # ":" starts a comment (keep-alives)
                continue
            colon = line.find(b":")
            if colon < 0:
                name, value = line, b""
            else:
                name, value = line[:colon], line[colon + 1 :]
                if value[:1] == b" ":
                    value = value[1:]
            if name == b"data":
                if self._data is None:
                    self._data = [value]
                else:
                    self._data.append(value)
                self._data_size += len(value)
        if len(self._buf) + self._data_size > self._max_event:
            raise SSEError(f"event larger than {self._max_event} bytes")
        return events


# --------------------------------------------------------------------------------------------
# APIs: request bodies and per-event interpreters
# --------------------------------------------------------------------------------------------

API_KINDS = ("generate", "completions", "chat")
_API_PATHS = {
    "generate": "/generate",
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
}


@dataclass(frozen=True, slots=True)
class Api:
    """Which HTTP API to stream from, and the model name the OpenAI APIs may need."""

    kind: str = "generate"
    model: str | None = None   # OpenAI "model"; SGLang and vLLM default to the served model

    def __post_init__(self) -> None:
        if self.kind not in API_KINDS:
            raise ConfigError(f"api: got {self.kind!r}; allowed: one of {', '.join(API_KINDS)}")

    @classmethod
    def of(cls, api: Api | str) -> Api:
        return api if isinstance(api, Api) else cls(api)

    @property
    def path(self) -> str:
        return _API_PATHS[self.kind]

    def body(self, prompt: Prompt) -> dict[str, Any]:
        """The JSON request body for `prompt`."""
        if self.kind == "generate":
            return {
                "text": prompt.text,
                "sampling_params": {
                    "max_new_tokens": prompt.output_len,
                    "temperature": prompt.temperature,
                    "ignore_eos": prompt.ignore_eos,
                },
                "stream": True,
            }
        body: dict[str, Any] = {
            "max_tokens": prompt.output_len,
            "temperature": prompt.temperature,
            "stream": True,
            # continuous_usage_stats (SGLang, vLLM) puts the cumulative token count in every
            # chunk, which makes per-chunk counts exact; servers without it still send the final
            # usage, which corrects the 1-per-chunk count.
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if self.model:
            body["model"] = self.model
        if prompt.ignore_eos:
            # vLLM's ignore_eos does not cover extra stop ids from generation_config; min_tokens
            # does. SGLang accepts both as well.
            body["ignore_eos"] = True
            body["min_tokens"] = prompt.output_len
        if self.kind == "chat":
            body["messages"] = (
                list(prompt.messages)
                if prompt.messages
                else [{"role": "user", "content": prompt.text}]
            )
        else:
            body["prompt"] = prompt.text
        return body


class _StreamError(Exception):
    """A request's stream said something unusable; the message becomes the record's error, and
    `detail` (the server's own words, where it gave any) the record's error_detail."""

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail


# How much of a server's error message a failed request keeps (error_detail), and how much of
# an error response's body is read to find it.
DETAIL_CHARS = 400
_ERROR_BODY_BYTES = 16 * 1024


def clip(text: str, limit: int = DETAIL_CHARS) -> str:
    """`text` on one line (whitespace runs collapsed), cut to `limit` characters with "..."."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3].rstrip() + "..."


def error_message(body: bytes | str) -> str:
    """The message of an error response's body: SGLang's and vLLM's `message` (top level or
    under `error`), FastAPI's `detail`, or else the body's text; one line, clipped."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        err = obj.get("error")
        for msg in (obj.get("message"), err.get("message") if isinstance(err, dict) else err,
                    obj.get("detail")):
            if isinstance(msg, str) and msg.strip():
                return clip(msg)
    return clip(text) if text.strip() else "(empty body)"


# An interpreter maps one decoded event to (has_text, cumulative completion tokens or None,
# metadata dict to keep or None). Type checks raise TypeError, which the loop turns into a
# "malformed chunk" error.
Interpreter = Callable[[Any], tuple[bool, int | None, dict[str, Any] | None]]


def _check_error(obj: dict[str, Any]) -> None:
    err = obj.get("error")
    if err is None and obj.get("object") == "error":   # vLLM's error object
        err = obj
    if err is not None:
        msg = err.get("message", err) if isinstance(err, dict) else err
        raise _StreamError(f"server error: {str(msg)[:120]}",
                           detail=f"error event in an http 200 stream: {clip(str(msg))}")


def interpret_generate(obj: Any) -> tuple[bool, int | None, dict[str, Any] | None]:
    """SGLang `/generate`: ``meta_info.completion_tokens`` is cumulative in every chunk."""
    if type(obj) is not dict:
        raise TypeError("chunk is not an object")
    meta = obj.get("meta_info")
    if meta is None:
        _check_error(obj)
        return bool(obj.get("text")), None, None
    if type(meta) is not dict:
        raise TypeError("meta_info is not an object")
    ct = meta.get("completion_tokens")
    return True, (ct if type(ct) is int else None), meta


def _interpret_openai(
    obj: Any, chat: bool
) -> tuple[bool, int | None, dict[str, Any] | None]:
    if type(obj) is not dict:
        raise TypeError("chunk is not an object")
    choices = obj.get("choices")
    has_text = False
    if choices:
        if chat:
            delta = choices[0].get("delta")
            has_text = bool(delta) and bool(
                delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
            )
        else:
            has_text = bool(choices[0].get("text"))
    elif choices is None:
        _check_error(obj)
    usage = obj.get("usage")
    # llama-server puts its speculation counters (draft_n, draft_n_accepted) in a top-level
    # `timings` object of the final chunk, beside `usage`.
    timings = obj.get("timings")
    if not usage:
        return has_text, None, (dict(timings) if type(timings) is dict else None)
    if type(usage) is not dict:
        raise TypeError("usage is not an object")
    ct = usage.get("completion_tokens")
    if type(timings) is dict:
        usage = {**usage, **timings}
    # Only a chunk that carries text has a per-chunk cumulative count; a usage-only chunk is the
    # final total, kept as metadata to correct a 1-per-chunk count.
    return has_text, (ct if has_text and type(ct) is int else None), usage


def interpret_completions(obj: Any) -> tuple[bool, int | None, dict[str, Any] | None]:
    """OpenAI `/v1/completions`: text in ``choices[0].text``; ``usage`` per chunk or at the end."""
    return _interpret_openai(obj, chat=False)


def interpret_chat(obj: Any) -> tuple[bool, int | None, dict[str, Any] | None]:
    """OpenAI `/v1/chat/completions`: ``choices[0].delta`` content (or reasoning), as above."""
    return _interpret_openai(obj, chat=True)


_INTERPRETERS: dict[str, Interpreter] = {
    "generate": interpret_generate,
    "completions": interpret_completions,
    "chat": interpret_chat,
}

# --------------------------------------------------------------------------------------------
# One request
# --------------------------------------------------------------------------------------------

_DONE = b"[DONE]"
_DRAIN_S = 1.0   # after [DONE], how long to wait for the end of the body to keep the connection
_MALFORMED = (ValueError, TypeError, AttributeError, KeyError, IndexError, RecursionError)


class _Req:
    """Mutable state of one request, written once when the request ends (or is cancelled)."""

    __slots__ = (
        "index", "prompt", "start", "end", "times", "counted", "in_win", "inexact",
        "meta", "error", "error_detail", "cancelled",
    )

    def __init__(self, index: int, prompt: Prompt) -> None:
        self.index = index
        self.prompt = prompt
        self.start = 0.0
        self.end: float | None = None
        self.times: list[float] = []      # arrival time of each chunk that carried tokens
        self.counted = 0                  # tokens counted chunk by chunk
        self.in_win = 0                   # ... of which arrived inside the window
        self.inexact = False              # some chunk was counted as 1 token, not by a counter
        self.meta: dict[str, Any] | None = None   # last meta_info / usage seen
        self.error: str | None = None
        self.error_detail: str | None = None    # the server's own words for it
        self.cancelled = False


async def _error_body(resp: aiohttp.ClientResponse) -> str:
    """The message of a non-200 response (see `error_message`), read within the request's
    timeout; a body that cannot be read is said so, never an exception."""
    try:
        return error_message(await resp.content.read(_ERROR_BODY_BYTES))
    except (aiohttp.ClientError, TimeoutError):
        return "(body not readable)"


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    payload: bytes,
    headers: Mapping[str, str],
    timeout: aiohttp.ClientTimeout,
    interp: Interpreter,
    st: _Req,
    w0: float,
    w1: float,
) -> None:
    """Stream one request into `st`; every failure becomes `st.error`, cancellation propagates."""
    clock = time.perf_counter
    loads = json.loads
    feed = SSEParser().feed
    mark = st.times.append
    prev_cum = counted = in_win = 0
    inexact = done = clean = False
    meta: dict[str, Any] | None = None
    resp: aiohttp.ClientResponse | None = None
    t = st.start = clock()
    try:
        resp = await session.post(url, data=payload, headers=headers, timeout=timeout)
        if resp.status != 200:
            raise _StreamError(f"http {resp.status}",
                               detail=f"http {resp.status}: {await _error_body(resp)}")
        content = resp.content
        while not done:
            data = await content.readany()
            if not data:
                break
            t = clock()
            for ev in feed(data):
                if ev == _DONE:
                    done = True
                    break
                if not ev:
                    continue
                try:
                    has_text, cum, m = interp(loads(ev))
                except _MALFORMED as exc:
                    raise _StreamError(f"malformed chunk ({type(exc).__name__})") from None
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
        if not done:
            raise _StreamError("truncated stream (no [DONE])")
        st.end = t
        # Read the body's end so the connection goes back to the pool instead of being closed.
        if not resp.content.at_eof():
            async with asyncio.timeout(_DRAIN_S):
                while await resp.content.readany():
                    pass
        clean = True
    except asyncio.CancelledError:
        st.cancelled = True
        raise
    except _StreamError as exc:
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
        st.counted = counted
        st.in_win = in_win
        st.inexact = inexact
        st.meta = meta
        if st.end is None:
            st.end = clock()
        if resp is not None:
            if clean:
                resp.release()
            else:
                resp.close()   # drops the connection: the server sees the client go away
    if st.error is not None:
        _log.debug("request %d failed: %s", st.index, st.error)


# --------------------------------------------------------------------------------------------
# Levels
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LevelPlan:
    """One measured level: closed loop at `concurrency`, or open loop at `rate` requests/s."""

    concurrency: int | None = None
    rate: float | None = None
    warmup_s: float = 5.0
    duration_s: float = 30.0
    max_requests: int | None = None     # cap on requests sent in the level (warm-up included)
    request_timeout_s: float = 600.0
    seed: int = 0                       # Poisson arrival times (open loop)

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ConfigError(
                f"level: got concurrency={self.concurrency!r}, rate={self.rate!r}; "
                "allowed: exactly one of them"
            )
        if self.concurrency is not None and (
            not _is_int(self.concurrency) or self.concurrency < 1
        ):
            _bad("concurrency", self.concurrency, "an integer >= 1")
        if self.rate is not None and not (_is_num(self.rate) and 0 < self.rate < math.inf):
            _bad("rate", self.rate, "a number of requests/s > 0")
        if not (_is_num(self.warmup_s) and 0 <= self.warmup_s < math.inf):
            _bad("warmup_s", self.warmup_s, "a number of seconds >= 0")
        if not (_is_num(self.duration_s) and 0 < self.duration_s < math.inf):
            _bad("duration_s", self.duration_s, "a number of seconds > 0")
        if self.max_requests is not None and (
            not _is_int(self.max_requests) or self.max_requests < 1
        ):
            _bad("max_requests", self.max_requests, "an integer >= 1, or unset")
        if not (_is_num(self.request_timeout_s) and self.request_timeout_s > 0):
            _bad("request_timeout_s", self.request_timeout_s, "a number of seconds > 0")
        if not _is_int(self.seed):
            _bad("seed", self.seed, "an integer")

    @property
    def mode(self) -> str:
        return "closed" if self.concurrency is not None else "rate"

    @property
    def level(self) -> int:
        """The level's integer label in records: the concurrency, or the rate rounded."""
        if self.concurrency is not None:
            return self.concurrency
        return max(1, round(self.rate or 0))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and not math.isnan(v)


def _bad(key: str, value: Any, allowed: str) -> NoReturn:
    raise ConfigError(f"level.{key}: got {value!r}; allowed: {allowed}")


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
    url = base_url.rstrip("/") + api.path
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    timeout = aiohttp.ClientTimeout(
        total=plan.request_timeout_s, sock_connect=min(plan.request_timeout_s, 30.0)
    )
    interp = _INTERPRETERS[api.kind]
    prompts = iter(prompts_iter)
    reqs: list[_Req] = []
    cap = plan.max_requests if plan.max_requests is not None else math.inf

    t0 = time.perf_counter()
    w0 = t0 + plan.warmup_s
    w1 = w0 + plan.duration_s

    def next_request() -> tuple[_Req, bytes] | None:
        if len(reqs) >= cap:
            return None
        prompt = next(prompts, None)
        if prompt is None:
            return None
        st = _Req(len(reqs), prompt)
        reqs.append(st)
        return st, json.dumps(api.body(prompt)).encode()

    def send(st: _Req, payload: bytes) -> Any:
        return _send(session, url, payload, hdrs, timeout, interp, st, w0, w1)

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
    records, window_tokens = _records(reqs, plan.level, t0, w0, window_end)
    summary = summarize(records, plan, window_tokens=window_tokens, window_s=window_s)
    _log.info(
        "level %s=%s: %.1f output tok/s, %.2f req/s, %d requests in window, %d errors",
        "concurrency" if plan.mode == "closed" else "rate",
        plan.concurrency if plan.mode == "closed" else plan.rate,
        summary.output_tok_s, summary.requests_s, summary.requests, summary.errors,
    )
    return summary, records


async def _worker(
    next_request: Callable[[], tuple[_Req, bytes] | None],
    send: Callable[[_Req, bytes], Any],
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
    next_request: Callable[[], tuple[_Req, bytes] | None],
    send: Callable[[_Req, bytes], Any],
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


def _records(
    reqs: Sequence[_Req], level: int, t0: float, w0: float, window_end: float
) -> tuple[list[RequestRecord], int]:
    """Turn request states into records, and count the tokens that arrived in the window."""
    # Requests counted 1 per chunk with a final usage total give the ratio of reported to
    # counted tokens; it corrects those that never got their total (cut at the window end).
    reported = counted = 0
    for st in reqs:
        total = _final_total(st.meta)
        if st.inexact and total is not None and st.counted:
            reported += total
            counted += st.counted
    level_ratio = reported / counted if counted else 1.0

    records = []
    window_tokens = 0.0
    for st in reqs:
        meta = st.meta or {}
        total = _final_total(meta)
        if st.inexact:
            ratio = total / st.counted if total is not None and st.counted else level_ratio
            window_tokens += st.in_win * ratio
        else:
            ratio = 1.0
            window_tokens += st.in_win
        out = total if total is not None else round(st.counted * ratio)
        end = st.end if st.end is not None else window_end
        times = st.times
        prompt_tokens = meta.get("prompt_tokens")
        hist = meta.get("spec_correct_drafts_histogram", meta.get("spec_accept_histogram"))
        records.append(
            RequestRecord(
                level=level,
                index=st.index,
                start=st.start - t0,
                end=end - t0,
                ttft=(times[0] - st.start) if times else None,
                input_tokens=prompt_tokens if _is_int(prompt_tokens) else st.prompt.input_len,
                output_tokens=out,
                chunk_gaps=tuple(b - a for a, b in zip(times, times[1:])),
                verify_ct=_first_int(meta, "spec_verify_ct"),
                accepted_tokens=_first_int(
                    meta, "spec_num_correct_drafts", "spec_accepted_drafts",
                    "spec_accept_token_num", "draft_n_accepted",
                ),
                draft_tokens=_first_int(
                    meta, "spec_num_proposed_drafts", "spec_proposed_drafts",
                    "spec_draft_token_num", "draft_n",
                ),
                accept_histogram=(
                    tuple(hist) if isinstance(hist, list) and all(_is_int(h) for h in hist) else ()
                ),
                in_window=not st.cancelled and w0 <= end <= window_end,
                error=None if st.cancelled else st.error,
                error_detail=None if st.cancelled else st.error_detail,
            )
        )
    return records, round(window_tokens)


def _final_total(meta: Mapping[str, Any] | None) -> int | None:
    if not meta:
        return None
    ct = meta.get("completion_tokens")
    return ct if _is_int(ct) and ct >= 0 else None


def _first_int(meta: Mapping[str, Any], *keys: str) -> int | None:
    # SGLang renamed its draft counters across versions; take whichever name is present.
    for k in keys:
        v = meta.get(k)
        if _is_int(v):
            return v
    return None


# --------------------------------------------------------------------------------------------
# Summary maths
# --------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks (numpy's
    default); None for no values. `values` need not be sorted."""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _p50_90_99(values: Sequence[float]) -> tuple[float | None, float | None, float | None]:
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
) -> LevelSummary:
    """Aggregate one level's records.

    `window_tokens` (output tokens whose chunks arrived inside the window) comes from the
    stream, not the records; `window_s` defaults to the plan's duration. Latency and acceptance
    use the requests that completed in the window without error; `requests` and `errors` count
    every request that ended in the window; requests/s counts the successful ones.
    """
    window_s = plan.duration_s if window_s is None else window_s
    in_win = [r for r in records if r.in_window]
    ok = [r for r in in_win if r.error is None]
    errors = len(in_win) - len(ok)

    ttft = [r.ttft for r in ok if r.ttft is not None]
    tpot = [
        (r.latency - r.ttft) / (r.output_tokens - 1)
        for r in ok
        if r.ttft is not None and r.output_tokens > 1
    ]
    itl = [g for r in ok for g in r.chunk_gaps]
    e2e = [r.latency for r in ok]

    verified = [r for r in ok if r.verify_ct]
    verify_sum = sum(r.verify_ct or 0 for r in verified)
    accept = sum(r.output_tokens for r in verified) / verify_sum if verify_sum else None

    hist: list[int] = []
    for r in ok:
        h = r.accept_histogram
        if len(h) > len(hist):
            hist.extend([0] * (len(h) - len(hist)))
        for i, c in enumerate(h):
            hist[i] += c

    notes = []
    failure = level_failure(records)
    if failure is not None:
        notes.append(f"no request succeeded, not a measurement: {failure}")
    if errors:
        kinds = Counter(r.error for r in in_win if r.error is not None)
        notes.append("errors: " + ", ".join(f"{k} x{n}" for k, n in kinds.most_common()))
    outside = sum(1 for r in records if not r.in_window and r.error is not None)
    if outside:
        notes.append(f"{outside} failed outside the window")
    if window_s <= 0:
        notes.append("empty measurement window")
    drift = gap_drift(records, plan.warmup_s, plan.warmup_s + window_s)
    if drift is not None and not 1 / DRIFT_LIMIT <= drift <= DRIFT_LIMIT:
        notes.append(f"median inter-chunk gap {'rose' if drift > 1 else 'fell'} {drift:.2f}x "
                     f"from the first to the second half of the window: the server's speed "
                     f"changed mid-level (clock throttling?)")

    tt, tp, it, ee = _p50_90_99(ttft), _p50_90_99(tpot), _p50_90_99(itl), _p50_90_99(e2e)
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
        accept_histogram=tuple(hist),
        suspect=errors > 0 or window_s <= 0 or failure is not None or (
            drift is not None and not 1 / DRIFT_LIMIT <= drift <= DRIFT_LIMIT),
        note="; ".join(notes),
    )


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


# --------------------------------------------------------------------------------------------
# Warm-up and the synchronous facade
# --------------------------------------------------------------------------------------------


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
    url = base_url.rstrip("/") + api.path
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(timeout_s, 30.0))
    interp = _INTERPRETERS[api.kind]
    reqs = [_Req(i, p) for i, p in zip(range(n), itertools.cycle(prompts))]
    t0 = time.perf_counter()
    never = math.inf
    await asyncio.gather(
        *(
            _send(session, url, json.dumps(api.body(st.prompt)).encode(), hdrs, timeout,
                  interp, st, never, never)
            for st in reqs
        )
    )
    records, _ = _records(reqs, 0, t0, never, never)
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
) -> list[tuple[LevelSummary, list[RequestRecord]]]:
    """Warm up, then run each plan in order on one session; call `on_level` after each level
    (and `on_level_start` just before it: the trial snapshots server counters there).

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
                 on_level_start)
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
            make_prompts(spec, warmup_requests, stream=_WARMUP_STREAM), warmup_requests,
            headers, timeout_s=warmup_timeout_s,
        )
        for i, plan in enumerate(plans):
            prompts: Iterator[Prompt] = iter_prompts(spec, stream=i)
            if on_level_start is not None:
                on_level_start(plan)
            summary, records = await run_level(session, base_url, api, prompts, plan, headers)
            results.append((summary, records))
            if on_level is not None:
                on_level(summary, records)
    return results
