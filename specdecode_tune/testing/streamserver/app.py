"""A tiny SSE stream server for the load generator's tests and benchmark.

It speaks just enough of three APIs to exercise the client's one streaming loop:

- SGLang ``POST /generate``: cumulative ``text`` and ``meta_info.completion_tokens`` per chunk,
  speculative fields (``spec_verify_ct``, ``spec_accept_length``, ``spec_num_correct_drafts``,
  ``spec_num_proposed_drafts``, ``spec_correct_drafts_histogram``) on the final chunk only, as
  SGLang sends them, as if each chunk were one verify step that accepted ``tokens_per_chunk``
  tokens;
- OpenAI ``POST /v1/completions`` and ``POST /v1/chat/completions``: per-chunk ``usage`` only
  when the request asks for ``continuous_usage_stats`` and the server is configured to honour
  it, a final usage chunk when ``include_usage`` is set, then ``data: [DONE]``.

Each request streams ``ceil(max_tokens / tokens_per_chunk)`` chunks, paced on absolute deadlines
(``first_delay`` then ``chunk_delay`` apart, so sleep overshoot does not drift); a zero delay
streams as fast as the loop goes, ``burst`` chunks per write. Knobs change at run time through
``POST /reset`` (a JSON object of `StreamConfig` fields; the others go back to their defaults,
and the statistics are cleared), so one server process serves a whole test module.

Every ``fail_every``-th request misbehaves per ``fail_mode``: ``500`` (HTTP error), ``drop``
(closes the connection after ``fail_after_chunks`` chunks), ``malformed`` (a chunk that is not
JSON), ``stall`` (stops sending), ``error_event`` (an in-stream error object).

``GET /stats?t0=..&t1=..`` reports what the server did: requests received, the most in flight
at once (a request is in flight from arrival until its ``[DONE]`` is written), completed,
disconnected, arrival times, and the tokens written in ``[t0, t1]`` by `time.perf_counter()`,
which is the same monotonic clock as the client's on one machine.

Run: ``python -m specdecode_tune.testing.streamserver --port P [--tokens-per-chunk N ...]``;
`start_subprocess` (in `control`) does, for tests and benchmarks.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import json
import time
from dataclasses import dataclass, field

from aiohttp import web

FAIL_MODES = ("none", "500", "drop", "malformed", "stall", "error_event")


@dataclass
class StreamConfig:
    tokens_per_chunk: int = 1
    chunk_delay: float = 0.0
    first_delay: float | None = None     # None: same as chunk_delay
    burst: int = 1                       # chunks per write when chunk_delay == 0
    continuous_usage: bool = True        # honour stream_options.continuous_usage_stats
    spec: bool = True                    # speculative fields in /generate meta_info
    draft_steps: int = 4                 # for spec_num_proposed_drafts
    fail_every: int = 0
    fail_mode: str = "none"
    fail_after_chunks: int = 2
    require_auth: str | None = None      # expected "Authorization" header value, if any


@dataclass
class Stats:
    requests: int = 0
    inflight: int = 0
    max_inflight: int = 0
    completed: int = 0
    disconnects: int = 0
    failed: int = 0
    arrivals: list[float] = field(default_factory=list)
    sent_t: list[float] = field(default_factory=list)     # write times (perf_counter)
    sent_cum: list[int] = field(default_factory=list)     # cumulative tokens written then

    def tokens_between(self, t0: float, t1: float) -> int:
        i = bisect.bisect_left(self.sent_t, t0)
        j = bisect.bisect_right(self.sent_t, t1)
        before = self.sent_cum[i - 1] if i > 0 else 0
        upto = self.sent_cum[j - 1] if j > 0 else 0
        return upto - before


@dataclass
class State:
    """Mutable holder: aiohttp forbids replacing app keys once the app runs; /reset swaps these."""

    cfg: StreamConfig
    stats: Stats


STATE = web.AppKey("state", State)


def make_app(config: StreamConfig | None = None) -> web.Application:
    app = web.Application()
    app[STATE] = State(config or StreamConfig(), Stats())
    app.router.add_get("/health", _health)
    app.router.add_get("/stats", _stats)
    app.router.add_post("/reset", _reset)
    app.router.add_post("/generate", _generate)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat)
    return app


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _stats(request: web.Request) -> web.Response:
    s = request.app[STATE].stats
    out = {
        "requests": s.requests,
        "inflight": s.inflight,
        "max_inflight": s.max_inflight,
        "completed": s.completed,
        "disconnects": s.disconnects,
        "failed": s.failed,
        "sent_tokens": s.sent_cum[-1] if s.sent_cum else 0,
        "arrivals": s.arrivals,
        "now": time.perf_counter(),
    }
    if "t0" in request.query and "t1" in request.query:
        out["window_tokens"] = s.tokens_between(
            float(request.query["t0"]), float(request.query["t1"])
        )
    return web.json_response(out)


async def _reset(request: web.Request) -> web.Response:
    changes = await request.json() if request.can_read_body else {}
    names = {f.name for f in dataclasses.fields(StreamConfig)}
    unknown = set(changes) - names
    if unknown:
        return web.json_response({"error": f"unknown fields {sorted(unknown)}"}, status=400)
    state = request.app[STATE]
    state.cfg = dataclasses.replace(StreamConfig(), **changes)
    state.stats = Stats()
    return web.json_response(dataclasses.asdict(state.cfg))


async def _generate(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    max_tokens = int(body.get("sampling_params", {}).get("max_new_tokens", 16))
    prompt_tokens = len(str(body.get("text", "")).split())
    return await _stream(request, "generate", max_tokens, prompt_tokens, body)


async def _completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    prompt_tokens = len(str(body.get("prompt", "")).split())
    max_tokens = int(body.get("max_tokens", 16))
    return await _stream(request, "completions", max_tokens, prompt_tokens, body)


async def _chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    text = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
    return await _stream(request, "chat", int(body.get("max_tokens", 16)), len(text.split()), body)


def _chunk_bytes(
    kind: str, cfg: StreamConfig, cum: int, n: int, prompt_tokens: int, continuous: bool
) -> bytes:
    """One SSE event holding `n` new tokens, `cum` tokens so far. Byte templates, not
    json.dumps, keep the server cheap so that the client is what a benchmark measures."""
    words = " tok" * n
    if kind == "generate":
        # SGLang adds the speculative fields only once the request has finished (0.5.10.post1
        # tokenizer_manager.py `_calculate_spec_decoding_metrics`): none on these chunks.
        return (
            b'data: {"text":"%s","meta_info":{"id":"r","prompt_tokens":%d,"completion_tokens":%d'
            b',"finish_reason":null}}\n\n'
            % ((" tok" * cum).encode(), prompt_tokens, cum)
        )
    usage = b"null"
    if continuous:
        usage = b'{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}' % (
            prompt_tokens, cum, prompt_tokens + cum,
        )
    if kind == "completions":
        choice = b'{"index":0,"text":"%s","finish_reason":null}' % words.encode()
        obj = b"text_completion"
    else:
        choice = b'{"index":0,"delta":{"content":"%s"},"finish_reason":null}' % words.encode()
        obj = b"chat.completion.chunk"
    return b'data: {"id":"r","object":"%s","choices":[%s],"usage":%s}\n\n' % (obj, choice, usage)


def _final_bytes(
    kind: str, cfg: StreamConfig, total: int, chunks: int, prompt_tokens: int, include_usage: bool
) -> bytes:
    if kind == "generate":
        meta: dict[str, object] = {
            "id": "r",
            "prompt_tokens": prompt_tokens,
            "completion_tokens": total,
            "finish_reason": {"type": "length", "length": total},
        }
        if cfg.spec and chunks:
            hist = [0] * (cfg.draft_steps + 1)
            hist[min(cfg.tokens_per_chunk - 1, cfg.draft_steps)] = chunks
            meta.update(
                spec_verify_ct=chunks,
                spec_accept_length=total / chunks,
                spec_num_correct_drafts=total - chunks,
                spec_num_proposed_drafts=chunks * cfg.draft_steps,
                spec_correct_drafts_histogram=hist,
            )
        out = b"data: " + json.dumps({"text": " tok" * total, "meta_info": meta}).encode() + b"\n\n"
    else:
        out = b""
        if include_usage:
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": total,
                     "total_tokens": prompt_tokens + total}
            final = {"id": "r", "choices": [], "usage": usage}
            out = b"data: " + json.dumps(final).encode() + b"\n\n"
    return out + b"data: [DONE]\n\n"


async def _stream(
    request: web.Request, kind: str, max_tokens: int, prompt_tokens: int, body: dict
) -> web.StreamResponse:
    cfg = request.app[STATE].cfg
    stats = request.app[STATE].stats
    stats.requests += 1
    stats.arrivals.append(time.perf_counter())
    nth = stats.requests
    fail = cfg.fail_mode if cfg.fail_every and nth % cfg.fail_every == 0 else "none"
    if cfg.require_auth is not None and request.headers.get("Authorization") != cfg.require_auth:
        stats.failed += 1
        return web.json_response({"error": {"message": "unauthorized"}}, status=401)
    if fail == "500":
        stats.failed += 1
        return web.json_response({"error": {"message": "injected failure"}}, status=500)

    opts = body.get("stream_options") or {}
    continuous = bool(opts.get("continuous_usage_stats")) and cfg.continuous_usage
    include_usage = bool(opts.get("include_usage"))
    tpc = max(1, cfg.tokens_per_chunk)
    first = cfg.chunk_delay if cfg.first_delay is None else cfg.first_delay

    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    stats.inflight += 1
    stats.max_inflight = max(stats.max_inflight, stats.inflight)
    in_flight = True
    try:
        await resp.prepare(request)
        t_next = time.perf_counter() + first
        cum = chunks = 0
        pending: list[bytes] = []
        pending_tokens = 0
        while cum < max_tokens:
            if fail != "none" and chunks == cfg.fail_after_chunks:
                await _misbehave(request, resp, fail, stats)
                return resp
            n = min(tpc, max_tokens - cum)
            cum += n
            chunks += 1
            pending.append(_chunk_bytes(kind, cfg, cum, n, prompt_tokens, continuous))
            pending_tokens += n
            if cfg.chunk_delay > 0 or first > 0:
                delay = t_next - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                t_next += cfg.chunk_delay
            elif len(pending) < cfg.burst and cum < max_tokens:
                continue
            await resp.write(b"".join(pending))
            stats.sent_t.append(time.perf_counter())
            stats.sent_cum.append((stats.sent_cum[-1] if stats.sent_cum else 0) + pending_tokens)
            pending.clear()
            pending_tokens = 0
            if cfg.chunk_delay == 0 and first == 0:
                await asyncio.sleep(0)   # let the other streams write too
        # Out of flight before [DONE] goes out: a closed-loop client can only send its next
        # request after reading it, so "max in flight" never counts one request twice.
        stats.inflight -= 1
        in_flight = False
        await resp.write(_final_bytes(kind, cfg, cum, chunks, prompt_tokens, include_usage))
        await resp.write_eof()
        stats.completed += 1
    except (ConnectionError, asyncio.CancelledError):
        stats.disconnects += 1
    finally:
        if in_flight:
            stats.inflight -= 1
    return resp


async def _misbehave(
    request: web.Request, resp: web.StreamResponse, mode: str, stats: Stats
) -> None:
    stats.failed += 1
    if mode == "drop":
        if request.transport is not None:
            request.transport.abort()
    elif mode == "malformed":
        await resp.write(b'data: {"choices": [ {not json\n\ndata: [DONE]\n\n')
        await resp.write_eof()
    elif mode == "error_event":
        await resp.write(
            b'data: {"error": {"message": "injected stream error"}}\n\ndata: [DONE]\n\n'
        )
        await resp.write_eof()
    elif mode == "stall":
        # Wait for the client to give up, checking so the handler ends when it does.
        while request.transport is not None and not request.transport.is_closing():
            await asyncio.sleep(0.05)
        raise ConnectionResetError("client went away while stalled")
