"""The per-API request bodies and event interpreters, on chunks shaped like the real servers'."""

from __future__ import annotations

import pytest

from specdecode_tune.backends.sglang_wire import interpret_generate
from specdecode_tune.backends.streamformat import DETAIL_CHARS, Interpreter
from specdecode_tune.backends.streamformat import MALFORMED as _MALFORMED
from specdecode_tune.backends.streamformat import StreamError as _StreamError
from specdecode_tune.errors import ConfigError
from specdecode_tune.load import Api, Prompt, error_message, interpret_chat, interpret_completions

PROMPT = Prompt("hello there", None, 2, 64, temperature=0.0, ignore_eos=True)


def test_generate_body_is_sglang_native() -> None:
    assert Api("generate").body(PROMPT) == {
        "text": "hello there",
        "sampling_params": {"max_new_tokens": 64, "temperature": 0.0, "ignore_eos": True},
        "stream": True,
    }
    assert Api("generate").path == "/generate"


def test_completions_body_asks_for_usage_and_vllm_length_controls() -> None:
    body = Api("completions", model="m").body(PROMPT)
    assert body["prompt"] == "hello there"
    assert body["model"] == "m"
    assert body["max_tokens"] == 64
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["ignore_eos"] is True and body["min_tokens"] == 64
    assert Api("completions").path == "/v1/completions"


def test_no_eos_controls_when_the_workload_keeps_eos() -> None:
    body = Api("completions").body(Prompt("p", None, 1, 8, ignore_eos=False))
    assert "ignore_eos" not in body and "min_tokens" not in body and "model" not in body


def test_chat_body_uses_messages_or_wraps_the_text() -> None:
    msgs = ({"role": "system", "content": "s"}, {"role": "user", "content": "u"})
    body = Api("chat").body(Prompt("s\n\nu", msgs, 2, 8))
    assert body["messages"] == list(msgs)
    assert Api("chat").body(PROMPT)["messages"] == [{"role": "user", "content": "hello there"}]
    assert Api("chat").path == "/v1/chat/completions"


def test_unknown_api_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="api: got 'grpc'; allowed: one of generate"):
        Api.of("grpc")


# --- interpreters ----------------------------------------------------------------------------


def test_generate_reads_the_cumulative_counter_and_keeps_meta() -> None:
    chunk = {"text": "a b c", "meta_info": {"completion_tokens": 3, "finish_reason": None}}
    assert interpret_generate(chunk) == (True, 3, chunk["meta_info"])
    final = {
        "text": "a b c d",
        "meta_info": {
            "completion_tokens": 4, "spec_verify_ct": 2, "spec_accept_length": 2.0,
            "spec_num_correct_drafts": 2, "spec_num_proposed_drafts": 6,
            "spec_correct_drafts_histogram": [0, 2, 0, 0],
        },
    }
    has_text, cum, meta = interpret_generate(final)
    assert (has_text, cum) == (True, 4)
    assert meta is not None and meta["spec_verify_ct"] == 2


def test_generate_error_object_becomes_a_stream_error() -> None:
    with pytest.raises(_StreamError, match="server error: out of memory"):
        interpret_generate({"error": {"message": "out of memory"}})


def test_completions_without_continuous_usage_counts_text_chunks() -> None:
    chunk = {"choices": [{"index": 0, "text": " tok tok", "finish_reason": None}], "usage": None}
    assert interpret_completions(chunk) == (True, None, None)
    empty = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}
    assert interpret_completions(empty) == (False, None, None)


def test_completions_final_usage_is_metadata_not_a_per_chunk_count() -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 40, "total_tokens": 45}
    assert interpret_completions({"choices": [], "usage": usage}) == (False, None, usage)


def test_completions_continuous_usage_is_cumulative() -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    chunk = {"choices": [{"index": 0, "text": " x y"}], "usage": usage}
    assert interpret_completions(chunk) == (True, 7, usage)


def test_chat_counts_content_and_reasoning_but_not_the_role_chunk() -> None:
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    assert interpret_chat(role) == (False, None, None)
    assert interpret_chat({"choices": [{"delta": {"content": "hi"}}]})[0] is True
    assert interpret_chat({"choices": [{"delta": {"reasoning_content": "hm"}}]})[0] is True


def test_openai_error_objects_become_stream_errors() -> None:
    with pytest.raises(_StreamError, match="server error: boom"):
        interpret_completions({"error": {"message": "boom"}})
    with pytest.raises(_StreamError, match="server error: bad"):
        interpret_chat({"object": "error", "message": "bad", "code": 400})


@pytest.mark.parametrize("interp", [interpret_generate, interpret_completions, interpret_chat])
@pytest.mark.parametrize("junk", [[1, 2], "text", 3, None, {"choices": {"0": 1}},
                                  {"meta_info": "x"}, {"choices": ["x"]}])
def test_wrong_shapes_only_raise_what_the_loop_records_as_malformed(
    interp: Interpreter, junk: object
) -> None:
    # Anything else would escape the request and be treated as a programming error.
    try:
        interp(junk)
    except _MALFORMED:
        pass


def test_an_error_event_keeps_the_servers_whole_message_as_its_detail() -> None:
    long = "Requested token count exceeds the model's maximum context length of 262144 " \
           "tokens. You requested a total of 300256 tokens: 256 tokens from the input " \
           "messages and 300000 tokens for the completion."
    with pytest.raises(_StreamError) as e:
        interpret_generate({"error": {"message": long}})
    assert str(e.value) == f"server error: {long[:120]}"          # the short kind, as before
    assert e.value.detail == f"error event in an http 200 stream: {long}"


@pytest.mark.parametrize("body, words", [
    # SGLang's OpenAI endpoints (and vLLM's): the message at the top level
    ((b'{"object":"error","message":"Requested token count exceeds","type":"BadRequestError",'
      b'"param":null,"code":400}'), "Requested token count exceeds"),
    # SGLang's native endpoints: under "error"
    (b'{"error":{"message":"The input (300000 tokens) is longer"}}',
     "The input (300000 tokens) is longer"),
    (b'{"error":"unknown fields [\'x\']"}', "unknown fields ['x']"),
    (b'{"detail":"Not Found"}', "Not Found"),                          # FastAPI
    (b"<html>\n  <h1>502 Bad   Gateway</h1>\n</html>", "<html> <h1>502 Bad Gateway</h1> </html>"),
    (b"", "(empty body)"),
])
def test_error_message_finds_the_servers_words(body: bytes, words: str) -> None:
    assert error_message(body) == words


def test_error_message_is_clipped_to_one_line() -> None:
    words = error_message(b'{"message": "' + b"x " * 1000 + b'"}')
    assert len(words) == DETAIL_CHARS and words.endswith("...") and "\n" not in words
