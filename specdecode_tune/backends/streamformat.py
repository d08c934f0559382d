"""What an engine sends, and streams back, beyond the OpenAI format: one engine's words, as data.

Each backend declares a `StreamFormat` (its `stream_format`); the load generator
(`specdecode_tune.load`) applies it, on top of the OpenAI completions and chat protocol that
every server speaks (`load.protocols`).

- `native_apis`: the engine's own streaming APIs, each a `NativeApi` (its `api` name in the
  experiment, URL path, request body, and the `Interpreter` of one decoded event): SGLang's
  ``/generate``. An API belongs to the engine that declares it, whichever server it is sent to.
- `side_objects`: top-level objects of an OpenAI chunk whose fields are kept beside ``usage``
  (llama.cpp puts its draft counters in ``timings``).
- `verify_ct`, `accepted`, `drafted`, `histogram`: the keys, in a request's kept metadata
  (SGLang's ``meta_info``; ``usage`` and the side objects), of its speculative verify steps,
  accepted and proposed draft tokens, and accepted drafts per verify step (a list); the first
  key present counts (engines rename them across versions).

`union(...)` merges several: the load generator's default when it is not told the engine.

An interpreter maps one decoded event (the JSON of one SSE ``data`` payload) to ``(has_text,
cumulative completion tokens or None, metadata to keep or None)``. It may raise `StreamError`
(the event says the request failed: `check_error_event`) or one of `MALFORMED` (a wrong shape:
``type(obj) is not dict`` and the like), which the stream loop records as a malformed chunk;
anything else escapes the request as a programming error. It runs once per streamed chunk:
plain dict look-ups, no logging, no allocation beyond its result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

Interpreter = Callable[[Any], tuple[bool, int | None, dict[str, Any] | None]]

# What an interpreter may raise for an event of the wrong shape (besides `StreamError`).
MALFORMED = (ValueError, TypeError, AttributeError, KeyError, IndexError, RecursionError)

# How much of a server's error message a failed request keeps (its record's error_detail).
DETAIL_CHARS = 400


class StreamError(Exception):
    """A request's stream said something unusable; the message becomes the record's error, and
    `detail` (the server's own words, where it gave any) the record's error_detail."""

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail


class PromptFields(Protocol):
    """What a request body is built from (the workload's `Prompt`)."""

    @property
    def text(self) -> str: ...
    @property
    def output_len(self) -> int: ...
    @property
    def temperature(self) -> float: ...
    @property
    def ignore_eos(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class NativeApi:
    """One engine's own streaming API."""

    api: str                                     # its name in `backend.api`
    path: str                                    # URL path on the server
    body: Callable[[PromptFields], dict[str, Any]]
    interpret: Interpreter


@dataclass(frozen=True, slots=True)
class StreamFormat:
    """One engine's request and stream fields; see the module docstring for each field."""

    native_apis: tuple[NativeApi, ...] = ()
    side_objects: tuple[str, ...] = ()
    verify_ct: tuple[str, ...] = ()
    accepted: tuple[str, ...] = ()
    drafted: tuple[str, ...] = ()
    histogram: tuple[str, ...] = ()

    def native(self, api: str) -> NativeApi | None:
        return next((n for n in self.native_apis if n.api == api), None)


def union(formats: Iterable[StreamFormat]) -> StreamFormat:
    """Every API and key of each field, in order, without repeats (the first engine's API of
    a name wins)."""
    items = list(formats)

    def merged(field: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys(k for f in items for k in getattr(f, field)))

    apis: dict[str, NativeApi] = {}
    for f in items:
        for n in f.native_apis:
            apis.setdefault(n.api, n)
    return StreamFormat(native_apis=tuple(apis.values()), side_objects=merged("side_objects"),
                        verify_ct=merged("verify_ct"), accepted=merged("accepted"),
                        drafted=merged("drafted"), histogram=merged("histogram"))


def clip(text: str, limit: int = DETAIL_CHARS) -> str:
    """`text` on one line (whitespace runs collapsed), cut to `limit` characters with "..."."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3].rstrip() + "..."


def check_error_event(obj: dict[str, Any]) -> None:
    """Raise `StreamError` for an error event inside an HTTP 200 stream: ``{"error": ...}``
    (SGLang), or an object ``{"object": "error", "message": ...}`` (vLLM's and SGLang's OpenAI
    endpoints)."""
    err = obj.get("error")
    if err is None and obj.get("object") == "error":
        err = obj
    if err is not None:
        msg = err.get("message", err) if isinstance(err, dict) else err
        raise StreamError(f"server error: {str(msg)[:120]}",
                          detail=f"error event in an http 200 stream: {clip(str(msg))}")
