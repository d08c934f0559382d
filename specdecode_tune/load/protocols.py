"""The APIs a level streams from: the request body and the interpreter of each streamed event.

- ``completions`` (`/v1/completions`) and ``chat`` (`/v1/chat/completions`): the OpenAI format,
  which every engine serves; defined here. Text is in ``choices[0].text`` or
  ``choices[0].delta`` (its content or reasoning); ``usage`` comes per chunk (SGLang and vLLM
  honour ``continuous_usage_stats``) or in a final chunk.
- an engine's own API (SGLang's ``/generate``): declared by its backend
  (`backends.streamformat.NativeApi`: path, body, interpreter); `API_KINDS` lists them first.

`Api` is one of them as one engine speaks it: `stream` is that engine's `StreamFormat` (its
side objects, e.g. llama.cpp's ``timings``), every engine's together when not told. An
interpreter turns one decoded event into ``(has_text, cumulative_tokens | None, meta | None)``
(the contract is in `backends.streamformat`); the stream loop (`client`) is the same for all.
`error_message` finds the server's words in an error response's body.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from ..backends import ANY_ENGINE_STREAM
from ..backends.streamformat import (
    Interpreter,
    NativeApi,
    StreamFormat,
    check_error_event,
    clip,
)
from ..errors import ConfigError
from .workload import Prompt

_OPENAI_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
API_KINDS = tuple(n.api for n in ANY_ENGINE_STREAM.native_apis) + tuple(_OPENAI_PATHS)


@dataclass(frozen=True, slots=True)
class Api:
    """Which HTTP API to stream from, the model name the OpenAI APIs may need, and the fields
    of the engine's streams (`backend.stream_format`; every engine's by default)."""

    kind: str = "generate"
    model: str | None = None   # OpenAI "model"; SGLang and vLLM default to the served model
    stream: StreamFormat = ANY_ENGINE_STREAM

    def __post_init__(self) -> None:
        if self.kind not in API_KINDS:
            raise ConfigError(f"api: got {self.kind!r}; allowed: one of {', '.join(API_KINDS)}")

    @classmethod
    def of(cls, api: Api | str) -> Api:
        return api if isinstance(api, Api) else cls(api)

    def _native(self) -> NativeApi | None:
        # The engine's own API of that name, else the one an engine declares (sent to another
        # server, it answers 404, which each request records).
        return self.stream.native(self.kind) or ANY_ENGINE_STREAM.native(self.kind)

    @property
    def path(self) -> str:
        native = self._native()
        return native.path if native is not None else _OPENAI_PATHS[self.kind]

    @property
    def interpreter(self) -> Interpreter:
        """The function applied to each decoded event of this API's streams."""
        native = self._native()
        if native is not None:
            return native.interpret
        return openai_interpreter(self.kind == "chat", self.stream.side_objects)

    def body(self, prompt: Prompt) -> dict[str, Any]:
        """The JSON request body for `prompt`."""
        native = self._native()
        if native is not None:
            return native.body(prompt)
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


# How much of an error response's body is read to find the server's message.
ERROR_BODY_BYTES = 16 * 1024


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


@functools.cache
def openai_interpreter(chat: bool, side_objects: tuple[str, ...] = ()) -> Interpreter:
    """The interpreter of `/v1/chat/completions` (`chat`) or `/v1/completions` events, keeping
    the fields of `side_objects` (top-level objects an engine sends beside ``usage``)."""
    if len(side_objects) > 1:
        return _merging_sides(openai_interpreter(chat, (_MERGED,)), side_objects)
    side = side_objects[0] if side_objects else None

    def interpret(obj: Any) -> tuple[bool, int | None, dict[str, Any] | None]:
        if type(obj) is not dict:
            raise TypeError("chunk is not an object")
        choices = obj.get("choices")
        has_text = False
        if choices:
            if chat:
                delta = choices[0].get("delta")
                has_text = bool(delta) and bool(
                    delta.get("content") or delta.get("reasoning_content")
                    or delta.get("reasoning")
                )
            else:
                has_text = bool(choices[0].get("text"))
        elif choices is None:
            check_error_event(obj)
        usage = obj.get("usage")
        extra = obj.get(side)
        if not usage:
            return has_text, None, (dict(extra) if type(extra) is dict else None)
        if type(usage) is not dict:
            raise TypeError("usage is not an object")
        ct = usage.get("completion_tokens")
        if type(extra) is dict:
            usage = {**usage, **extra}
        # Only a chunk that carries text has a per-chunk cumulative count; a usage-only chunk
        # is the final total, kept as metadata to correct a 1-per-chunk count.
        return has_text, (ct if has_text and type(ct) is int else None), usage

    return interpret


_MERGED = "\0sides"   # a key no server sends: the side objects of a chunk, merged


def _merging_sides(interpret: Interpreter, sides: tuple[str, ...]) -> Interpreter:
    """For several engines' side objects (no one engine has more than one): merge a chunk's
    into one object, then interpret as for one. Only a load run not told its engine uses it."""

    def merging(obj: Any) -> tuple[bool, int | None, dict[str, Any] | None]:
        if type(obj) is dict:
            found = [obj[k] for k in sides if type(obj.get(k)) is dict]
            if found:
                obj = {**obj, _MERGED: {k: v for s in found for k, v in s.items()}}
        return interpret(obj)

    return merging


# The OpenAI interpreters for a stream of unknown origin (every engine's side objects).
interpret_completions = openai_interpreter(False, ANY_ENGINE_STREAM.side_objects)
interpret_chat = openai_interpreter(True, ANY_ENGINE_STREAM.side_objects)
