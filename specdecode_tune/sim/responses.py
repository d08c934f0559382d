"""How the simulated server answers: JSON errors in both APIs' shapes (`json_error`), and the one
generation loop behind `/generate` and the OpenAI endpoints (`serve`): parse, submit to the
scheduler, then one body or a server-sent-events chunk per scheduler iteration. Injected faults
(`faults.py`) hook into the request's arrival and its stream; without faults they do nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from specdecode_tune.sim.api import BadRequest, GenParams, OpenAIFormat, SglangFormat
from specdecode_tune.sim.faults import FaultInjector
from specdecode_tune.sim.scheduler import RequestRejected, Scheduler, SimRequest

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def json_error(status: int, message: str) -> web.Response:
    kind = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed",
            503: "ServiceUnavailable"}
    body = {"object": "error", "message": message,
            "type": kind.get(status, "InternalServerError"), "code": status}
    # OpenAI clients read the top-level fields, SGLang-native ones read {"error": {...}}.
    return web.json_response({"error": body, **body}, status=status)


async def serve(
    request: web.Request,
    sched: Scheduler,
    faults: FaultInjector,
    parse: Callable[[Any], GenParams],
    make_format: Callable[[Any, GenParams], SglangFormat | OpenAIFormat],
    refusal_in_stream: bool = False,
) -> web.StreamResponse:
    """The one generation loop: submit, then a chunk per scheduler iteration (or one body).

    A request the engine refuses (too long for the context or the KV pool) is a 400, except
    on a streamed `/generate` (`refusal_in_stream`): SGLang validates there inside the
    stream it has already answered with 200, so the refusal is one `{"error": {"message"}}`
    event and `[DONE]`. Its OpenAI endpoints validate before answering: a 400."""
    faults.on_request()
    await faults.wait_if_hung()
    try:
        params = parse(await request.json())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return json_error(400, f"malformed JSON body: {e}")
    except BadRequest as e:
        return json_error(400, str(e))
    try:
        req = sched.submit(params.input_len, params.max_new_tokens, params.temperature,
                           params.ignore_eos, params.kind)
    except RequestRejected as e:
        if refusal_in_stream and params.stream:
            return await _refused_in_stream(request, str(e))
        return json_error(400, str(e))
    fmt = make_format(req, params)
    resp: web.StreamResponse | None = None
    drop_at = faults.drop_point(params.max_new_tokens) if params.stream else None
    try:
        if not params.stream:
            return await _whole_body(req, fmt, faults)
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        await _stream(request, resp, req, fmt, faults, drop_at)
        faults.on_request_done()
        return resp
    except ConnectionError:
        # The client went away mid-stream (the load generator cancels at window end).
        return resp if resp is not None else web.Response(status=499)
    finally:
        sched.abort(req)    # no-op once finished; frees the slot and KV otherwise


async def _refused_in_stream(request: web.Request, message: str) -> web.StreamResponse:
    """SGLang's refusal inside an answered stream: one error event, then `[DONE]`."""
    refused = web.StreamResponse(headers=SSE_HEADERS)
    await refused.prepare(request)
    event = json.dumps({"error": {"message": message}}, separators=(",", ":"))
    await refused.write(b"data: " + event.encode() + b"\n\ndata: [DONE]\n\n")
    return refused


async def _whole_body(req: SimRequest, fmt: SglangFormat | OpenAIFormat,
                      faults: FaultInjector) -> web.Response:
    """A request not streamed: one JSON body once it finished, a 503 if it was aborted."""
    ids: list[int] = []
    done = False
    while not done:
        new, done = await req.queue.get()
        ids += new
    if req.aborted:
        return json_error(503, "The server is shutting down")
    faults.on_request_done()
    return web.json_response(fmt.full(ids))


async def _stream(request: web.Request, resp: web.StreamResponse, req: SimRequest,
                  fmt: SglangFormat | OpenAIFormat, faults: FaultInjector,
                  drop_at: int | None) -> None:
    """A streamed request's chunks, one write per scheduler iteration, until it finishes or
    is aborted; an injected drop closes the connection midway (ConnectionResetError)."""
    done = False
    while not done:
        new, done = await req.queue.get()
        await faults.wait_if_hung()
        if req.aborted:
            break
        payload = b"".join(
            b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
            for chunk in fmt.chunks(new, done)
        )
        payload, malformed = faults.maybe_malformed(payload)
        await resp.write(payload + (b"data: [DONE]\n\n" if done else b""))
        if malformed:
            faults.note("malformed-sse", f"request {req.rid}: a malformed event")
        if drop_at is not None and not done and req.generated >= drop_at:
            faults.note("drop-midway", f"request {req.rid}: connection dropped "
                                        f"after {req.generated} tokens")
            if request.transport is not None:
                request.transport.close()
            raise ConnectionResetError("fault drop-midway")
