"""Request parsing and response bodies of the simulator's generation endpoints."""

from __future__ import annotations

import asyncio

import pytest

from specdecode_tune.sim.api import (
    BadRequest,
    OpenAIFormat,
    SglangFormat,
    parse_generate,
    parse_openai,
    words,
)
from specdecode_tune.sim.scheduler import SimRequest


def make_request(**kw: object) -> SimRequest:
    async def build() -> SimRequest:   # SimRequest holds an asyncio.Queue
        fields = {"rid": "a", "input_len": 3, "max_new_tokens": 4, "temperature": 0.0, "stop_at": 4,
                  "probs": (0.9,), "created": 0.0, "histogram": [0, 0]}
        fields.update(kw)
        return SimRequest(**fields)
    return asyncio.run(build())


def test_generate_defaults_follow_sglang() -> None:
    p = parse_generate({"text": "one two  three\nfour"}, default_max_new_tokens=128)
    assert (p.input_len, p.max_new_tokens, p.temperature, p.ignore_eos, p.stream) == \
        (4, 128, 1.0, False, False)
    q = parse_generate({"input_ids": [1, 2, 3], "stream": True,
                        "sampling_params": {"max_new_tokens": 9, "temperature": 0,
                                            "ignore_eos": True}}, 128)
    assert (q.input_len, q.max_new_tokens, q.temperature, q.ignore_eos, q.stream) == \
        (3, 9, 0.0, True, True)


@pytest.mark.parametrize(
    "body",
    [None, [], {}, {"text": 5}, {"text": "   "}, {"input_ids": [1, "x"]}, {"text": ["a", "b"]},
     {"text": "a", "sampling_params": {"max_new_tokens": 2.5}}, {"text": "a", "stream": "yes"},
     {"text": "a", "sampling_params": []}, {"text": "a", "sampling_params": {"temperature": -1}}],
)
def test_generate_rejects_bad_bodies(body: object) -> None:
    with pytest.raises(BadRequest):
        parse_generate(body, 128)


def test_openai_parsing() -> None:
    p = parse_openai({"prompt": "a b", "stream": True, "stream_options": {"include_usage": True}},
                     chat=False)
    assert (p.input_len, p.max_new_tokens, p.include_usage) == (2, 16, True)
    c = parse_openai({"messages": [{"role": "system", "content": "be brief"},
                                   {"role": "user", "content": "hi"}],
                      "max_completion_tokens": 7}, chat=True)
    assert (c.input_len, c.max_new_tokens) == (3, 7)
    with pytest.raises(BadRequest):
        parse_openai({"messages": []}, chat=True)


def test_words_are_one_per_token() -> None:
    assert len(words([1, 2, 3, 10**6]).split()) == 4


def test_sglang_final_chunk_is_consistent() -> None:
    req = make_request(generated=4, verify_ct=2, correct_drafts=1, histogram=[1, 1])
    fmt = SglangFormat(req, spec_draft_nodes=1)
    first = fmt.chunks([5, 6], done=False)[0]
    last = fmt.chunks([7, 8], done=True)[0]
    # SGLang 0.5.10: the speculative fields only once the request has finished.
    assert first["meta_info"]["finish_reason"] is None
    assert not any(k.startswith("spec_") for k in first["meta_info"])
    meta = last["meta_info"]
    # text and output_ids are cumulative (SGLang's default streaming output)
    assert first["output_ids"] == [5, 6] and len(first["text"].split()) == 2
    assert len(last["text"].split()) == 4 and last["output_ids"] == [5, 6, 7, 8]
    assert meta["spec_verify_ct"] == 2 and meta["spec_accept_length"] == 2.0
    assert meta["spec_accept_token_num"] == 1 and meta["spec_draft_token_num"] == 2
    assert meta["spec_accept_rate"] == 0.5 and meta["spec_accept_histogram"] == [1, 1]
    assert meta["finish_reason"] == {"type": "length", "length": 4}
    plain = SglangFormat(req, spec_draft_nodes=None).full([1, 2, 3, 4])["meta_info"]
    assert not any(k.startswith("spec_") for k in plain)


def test_sglang_incremental_streaming_output_sends_only_the_new_part() -> None:
    req = make_request(generated=4, verify_ct=2, correct_drafts=1, histogram=[1, 1])
    fmt = SglangFormat(req, spec_draft_nodes=1, incremental=True)
    first = fmt.chunks([5, 6], done=False)[0]
    last = fmt.chunks([7, 8], done=True)[0]
    assert first["output_ids"] == [5, 6] and last["output_ids"] == [7, 8]
    assert len(last["text"].split()) == 2
    assert last["meta_info"]["completion_tokens"] == 4    # the counter stays cumulative


def test_sglang_sends_no_spec_fields_without_a_verify_step() -> None:
    # max_new_tokens = 1: the prefill's token only, spec_verify_ct 0: SGLang adds none.
    req = make_request(generated=1, verify_ct=0, correct_drafts=0, histogram=[0, 0])
    meta = SglangFormat(req, spec_draft_nodes=3).full([9])["meta_info"]
    assert not any(k.startswith("spec_") for k in meta)


def test_openai_usage_goes_where_the_client_asked() -> None:
    req = make_request(generated=4)
    with_usage = parse_openai({"prompt": "a b c", "stream": True,
                               "stream_options": {"include_usage": True}}, chat=False)
    chunks = OpenAIFormat(req, with_usage, "m", chat=False).chunks([1], done=True)
    assert chunks[0]["choices"][0]["finish_reason"] == "length" and chunks[0]["usage"] is None
    assert chunks[1]["choices"] == [] and chunks[1]["usage"]["total_tokens"] == 7
    without = parse_openai({"prompt": "a b c", "stream": True}, chat=False)
    only = OpenAIFormat(req, without, "m", chat=False).chunks([1], done=True)
    assert len(only) == 1 and only[0]["usage"]["completion_tokens"] == 4
