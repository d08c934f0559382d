"""What SGLang's HTTP API sends and how the backend reads it: the native `/generate` request
and its streamed chunks (with each request's speculative counters, under every release's
names: `STREAM_FORMAT`, which the load generator applies), the `/metrics` counters whose deltas
give a window's acceptance (`spec_counters`), and the scheduler's count of requests in flight
(`/v1/loads`, `/get_load`: `load_count`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import prometheus
from .common import at_least
from .streamformat import NativeApi, PromptFields, StreamFormat, check_error_event


def generate_body(prompt: PromptFields) -> dict[str, Any]:
    """SGLang's native `/generate` request, streamed."""
    return {
        "text": prompt.text,
        "sampling_params": {
            "max_new_tokens": prompt.output_len,
            "temperature": prompt.temperature,
            "ignore_eos": prompt.ignore_eos,
        },
        "stream": True,
    }


def interpret_generate(obj: Any) -> tuple[bool, int | None, dict[str, Any] | None]:
    """SGLang `/generate`: ``meta_info.completion_tokens`` is cumulative in every chunk."""
    if type(obj) is not dict:
        raise TypeError("chunk is not an object")
    meta = obj.get("meta_info")
    if meta is None:
        check_error_event(obj)
        return bool(obj.get("text")), None, None
    if type(meta) is not dict:
        raise TypeError("meta_info is not an object")
    ct = meta.get("completion_tokens")
    return True, (ct if type(ct) is int else None), meta


# The speculative fields of a finished request's last /generate chunk (tokenizer_manager.py
# `_calculate_spec_decoding_metrics`: 0.5.10.post1 L1902-1943, 0.5.17 L2739-2818), by the
# release that first writes them, newest first: (since, accepted draft tokens, proposed draft
# tokens, histogram), each the names it writes, its own first, the old ones it keeps as
# aliases after. Every release also writes `spec_verify_ct` and `spec_accept_length`
# (= completion_tokens / spec_verify_ct). The meanings are the same in all: accepted = draft
# tokens the target took (the bonus token not counted), proposed = spec_verify_ct times
# (--speculative-num-draft-tokens - 1) as the server was started (under the adaptive schedule
# that is the starting steps', not what each step drafted), histogram index j = this request's
# verify steps that took exactly j draft tokens (0.5.10.post1 eagle_info.py L430-433, 0.5.17
# batch_result_processor.py L636, L685-689).
SPEC_FIELD_NAMES: tuple[tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]], ...] = (
    ("0.5.12", ("spec_num_correct_drafts", "spec_accepted_drafts"),
     ("spec_num_proposed_drafts", "spec_proposed_drafts"),
     ("spec_correct_drafts_histogram", "spec_accept_histogram")),
    ("0.5.11", ("spec_accepted_drafts",), ("spec_proposed_drafts",), ("spec_accept_histogram",)),
    ("0", ("spec_accept_token_num",), ("spec_draft_token_num",), ("spec_accept_histogram",)),
)


def spec_field_names(version: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(accepted, proposed, histogram) names that release `version` writes."""
    return next(row[1:] for row in SPEC_FIELD_NAMES if at_least(version, row[0]))


def _every(i: int) -> tuple[str, ...]:
    return tuple(dict.fromkeys(name for row in SPEC_FIELD_NAMES for name in row[i]))


# What SGLang streams: its own /generate API beside the OpenAI ones, and per request (in
# /generate's meta_info) its speculative counters, under the names of every release above,
# the newest first (the load generator takes the first present, so one format reads them all).
STREAM_FORMAT = StreamFormat(
    native_apis=(NativeApi("generate", "/generate", generate_body, interpret_generate),),
    verify_ct=("spec_verify_ct",),
    accepted=_every(1),
    drafted=_every(2),
    histogram=_every(3),
)


V1_LOADS = "/v1/loads?include=core"
GENERATED = "sglang:generation_tokens_total"
VERIFY_CALLS = "sglang:spec_verify_calls_total"


def spec_counters(samples: Sequence[prometheus.Sample]) -> dict[str, float] | None:
    """The two counters of a /metrics page whose deltas give a window's acceptance (each
    summed over its labels), or None where the release writes no verify-call counter."""
    found = {name: prometheus.total(samples, name) for name in (GENERATED, VERIFY_CALLS)}
    gen, calls = found[GENERATED], found[VERIFY_CALLS]
    return None if gen is None or calls is None else {GENERATED: gen, VERIFY_CALLS: calls}


def load_count(body: Any, keys: tuple[str, ...]) -> int | None:
    """Requests running or waiting, summed over the DP ranks of a /v1/loads (its `loads`) or
    /get_load answer; None where a rank lacks a count."""
    ranks = body["loads"] if isinstance(body, dict) and "loads" in body else body
    if isinstance(ranks, dict):
        ranks = [ranks]
    if not isinstance(ranks, list) or not ranks:
        return None
    total = 0
    for rank in ranks:
        for key in keys:
            n = rank.get(key) if isinstance(rank, dict) else None
            if not isinstance(n, int) or isinstance(n, bool):
                return None
            total += n
    return total
