"""Request parsing and response bodies of the simulator's generation endpoints.

Three formats share one streaming loop (`server.py`): SGLang's native `/generate`, OpenAI
`/v1/completions` and `/v1/chat/completions`. Prompt "tokens" are whitespace-separated words of
the prompt (or `len(input_ids)`); generated text is synthetic words, one per token id.

`/generate` SSE chunks, as SGLang's tokenizer manager sends them (0.5.10.post1 and 0.5.17
alike, but for the names of three speculative fields, below): `{"text", "output_ids",
"meta_info": {"id", "finish_reason": null, "prompt_tokens", "completion_tokens" (cumulative),
"cached_tokens"}}`, where `text` and `output_ids` are everything generated so far (cumulative;
only this chunk's with `--incremental-streaming-output`). The final chunk's meta_info adds
`finish_reason` (`{"type": "length", "length": N}` or `{"type": "stop", "matched": EOS}`),
`e2e_latency` and, with speculation and at least one verify step
(`_calculate_spec_decoding_metrics`, run only once the request has finished),
`spec_verify_ct`, `spec_accept_length` (= completion_tokens / spec_verify_ct),
`spec_accept_rate`, `spec_accept_token_num` (accepted draft tokens), `spec_draft_token_num`
(verify steps x (draft tokens - 1), the draft tokens the server was started with) and
`spec_accept_histogram` (index i = verify steps that accepted exactly i draft tokens). SGLang
renamed the accepted, proposed and histogram fields (0.5.11: `spec_accepted_drafts`,
`spec_proposed_drafts`; 0.5.12 on: `spec_num_correct_drafts`, `spec_num_proposed_drafts`,
`spec_correct_drafts_histogram`, the older names kept as aliases); the simulator writes the
names of the release it imitates (`--sglang-version`, `releases.spec_field_names`). No chunk
before the last carries a `spec_*` key, nor does any without speculation.

OpenAI streams send `choices[0].text` (or `delta.content`) deltas, a chunk with
`finish_reason`, and `usage`: in a final chunk with empty `choices` when
`stream_options.include_usage` is true, otherwise on the finish chunk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from specdecode_tune.sim.promptkind import classify
from specdecode_tune.sim.scheduler import SimRequest

_WORDS = (
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "out", "up", "into", "do",
    "any", "your", "what", "some", "time", "may", "only", "new", "about", "its", "then",
)


class BadRequest(ValueError):
    """A request body the server answers with 400."""


@dataclass(frozen=True, slots=True)
class GenParams:
    input_len: int
    max_new_tokens: int
    temperature: float
    ignore_eos: bool
    stream: bool
    include_usage: bool = False
    model: str = ""
    kind: str | None = None        # the prompt's kind (sim/promptkind.py); None: token ids


def words(ids: list[int]) -> str:
    """Synthetic text for token ids: one short word per token."""
    return "".join(" " + _WORDS[i % len(_WORDS)] for i in ids)


def _count(prompt: Any, what: str) -> int:
    if isinstance(prompt, str):
        n = len(prompt.split())
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                          for t in prompt):
        n = len(prompt)
    elif isinstance(prompt, list):
        raise BadRequest(f"{what}: batch requests (a list of prompts) are not supported by the "
                         f"simulator")
    else:
        raise BadRequest(f"{what} must be a string or a list of token ids, got "
                         f"{type(prompt).__name__}")
    if n == 0:
        raise BadRequest(f"{what} is empty")
    return n


def _number(body: dict[str, Any], key: str, default: Any, kind: type, low: float) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (kind is int and value != int(value)):
        raise BadRequest(f"{key} must be {'an integer' if kind is int else 'a number'}, "
                         f"got {value!r}")
    if value < low:
        raise BadRequest(f"{key} must be >= {low}, got {value!r}")
    return kind(value)


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise BadRequest(f"{key} must be true or false, got {value!r}")
    return value


def _object(body: Any, what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest(f"{what} must be a JSON object")
    return body


def _optional_object(body: dict[str, Any], key: str) -> dict[str, Any]:
    value = body.get(key)
    return {} if value is None else _object(value, key)


def parse_generate(body: Any, default_max_new_tokens: int) -> GenParams:
    """SGLang native: {"text" | "input_ids", "sampling_params": {...}, "stream"}."""
    body = _object(body, "request body")
    kind = None
    if "text" in body and body["text"] is not None:
        input_len = _count(body["text"], "text")
        kind = classify(body["text"]) if isinstance(body["text"], str) else None
    elif "input_ids" in body and body["input_ids"] is not None:
        input_len = _count(body["input_ids"], "input_ids")
    else:
        raise BadRequest("either text or input_ids must be given")
    sp = _optional_object(body, "sampling_params")
    return GenParams(
        input_len=input_len,
        max_new_tokens=_number(sp, "max_new_tokens", default_max_new_tokens, int, 1),
        temperature=_number(sp, "temperature", 1.0, float, 0.0),
        ignore_eos=_flag(sp, "ignore_eos", False),
        stream=_flag(body, "stream", False),
        kind=kind,
    )


def parse_openai(body: Any, chat: bool) -> GenParams:
    """OpenAI completions / chat completions (plus SGLang's `ignore_eos` extension)."""
    body = _object(body, "request body")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        text = " ".join(str(_object(m, "each message").get("content") or "") for m in messages)
        input_len = _count(text, "messages")
    else:
        if "prompt" not in body:
            raise BadRequest("prompt is required")
        text = body["prompt"]
        input_len = _count(text, "prompt")
    opts = _optional_object(body, "stream_options")
    limit_key = "max_completion_tokens" if chat and body.get("max_tokens") is None else "max_tokens"
    return GenParams(
        input_len=input_len,
        max_new_tokens=_number(body, limit_key, 16, int, 1),
        temperature=_number(body, "temperature", 1.0, float, 0.0),
        ignore_eos=_flag(body, "ignore_eos", False),
        stream=_flag(body, "stream", False),
        include_usage=_flag(opts, "include_usage", False),
        model=str(body.get("model") or ""),
        kind=classify(text) if isinstance(text, str) else None,
    )


# The names 0.5.10.post1 writes (releases.SPEC_FIELD_NAMES has every release's).
OLD_SPEC_NAMES = (("spec_accept_token_num",), ("spec_draft_token_num",),
                  ("spec_accept_histogram",))


class SglangFormat:
    """`/generate` bodies: text and output ids (cumulative unless `incremental`), meta_info."""

    def __init__(self, req: SimRequest, spec_draft_nodes: int | None,
                 incremental: bool = False,
                 spec_names: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]
                 = OLD_SPEC_NAMES) -> None:
        self.req = req
        self.spec_nodes = spec_draft_nodes   # draft tokens proposed per verify; None = no spec
        self.incremental = incremental       # --incremental-streaming-output
        # (accepted, proposed, histogram) names of the imitated release, each its own name
        # then its aliases (releases.spec_field_names)
        self.spec_names = spec_names
        self.text = ""
        self.ids: list[int] = []

    def _meta(self, final: bool) -> dict[str, Any]:
        r = self.req
        meta: dict[str, Any] = {
            "id": r.rid,
            "finish_reason": r.finish_reason if final else None,
            "prompt_tokens": r.input_len,
            "completion_tokens": r.generated,
            "cached_tokens": 0,
        }
        if final:
            meta["e2e_latency"] = time.perf_counter() - r.created
            proposed = r.verify_ct * (self.spec_nodes or 0)
            if self.spec_nodes is not None and r.verify_ct > 0 and proposed > 0:
                accepted, drafted, histogram = self.spec_names
                meta.update(
                    spec_accept_rate=r.correct_drafts / proposed,
                    spec_accept_length=r.generated / r.verify_ct,
                    **{accepted[0]: r.correct_drafts, drafted[0]: proposed},
                    spec_verify_ct=r.verify_ct,
                    **{k: r.correct_drafts for k in accepted[1:]},
                    **{k: proposed for k in drafted[1:]},
                )
                if r.histogram:
                    meta.update({k: list(r.histogram) for k in histogram})
        return meta

    def chunks(self, ids: list[int], done: bool) -> list[dict[str, Any]]:
        new = words(ids)
        self.text += new
        self.ids += ids
        if self.incremental:
            return [{"text": new, "output_ids": ids, "meta_info": self._meta(done)}]
        return [{"text": self.text, "output_ids": list(self.ids), "meta_info": self._meta(done)}]

    def full(self, ids: list[int]) -> dict[str, Any]:
        return {"text": words(ids), "output_ids": ids, "meta_info": self._meta(True)}


class OpenAIFormat:
    """`/v1/completions` and `/v1/chat/completions` bodies."""

    def __init__(self, req: SimRequest, params: GenParams, model: str, chat: bool) -> None:
        self.req = req
        self.params = params
        self.chat = chat
        self.model = params.model or model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{req.rid}"
        self.created = int(time.time())
        self.first = True

    def _finish(self) -> str:
        return "length" if self.req.generated >= self.req.max_new_tokens else "stop"

    def _usage(self) -> dict[str, int]:
        r = self.req
        total = r.input_len + r.generated
        return {"prompt_tokens": r.input_len, "completion_tokens": r.generated,
                "total_tokens": total}

    def _base(self) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def chunks(self, ids: list[int], done: bool) -> list[dict[str, Any]]:
        text = words(ids)
        if self.chat:
            delta: dict[str, Any] = {"content": text}
            if self.first:
                delta["role"] = "assistant"
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
        self.first = False
        out = [{**self._base(), "choices": [choice], "usage": None}]
        if done:
            choice["finish_reason"] = self._finish()
            if self.params.include_usage:
                out.append({**self._base(), "choices": [], "usage": self._usage()})
            else:
                out[0]["usage"] = self._usage()
        return out

    def full(self, ids: list[int]) -> dict[str, Any]:
        text = words(ids)
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
        choice["finish_reason"] = self._finish()
        obj = "chat.completion" if self.chat else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": [choice], "usage": self._usage()}
