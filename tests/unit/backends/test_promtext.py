"""The Prometheus text parser, on the shapes vLLM and llama.cpp serve."""

from __future__ import annotations

import math

import pytest

from specdecode_tune.backends import prometheus as promtext

VLLM = '''\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 120.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 100.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 80.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 20.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="2048"} 1.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 7
'''


def test_parses_names_labels_and_values() -> None:
    samples = promtext.parse(VLLM)
    assert len(samples) == 7
    first = samples[0]
    assert first.name == "vllm:spec_decode_num_drafts_total"
    assert first.labels == (("engine", "0"), ("model_name", "m"))
    assert first.value == 120.0
    assert samples[5].label("num_gpu_blocks") == "2048"
    assert samples[6].label("le") == "+Inf" and samples[6].value == 7


def test_total_and_by_label_sum_over_other_labels() -> None:
    samples = promtext.parse(VLLM)
    assert promtext.total(samples, "vllm:spec_decode_num_drafts_total") == 150.0
    assert promtext.total(samples, "vllm:absent") is None
    per_pos = promtext.by_label(samples, "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                                "position")
    assert per_pos == {"0": 120.0, "1": 80.0}


def test_llamacpp_lines_without_labels_and_type_lines() -> None:
    text = ("# HELP llamacpp:spec_decode_num_drafts_total Speculative: steps\n"
            "# TYPE llamacpp:spec_decode_num_drafts_total counter\n"
            "llamacpp:spec_decode_num_drafts_total 42\n"
            "llamacpp:predicted_tokens_seconds 1.5e+02\n")
    samples = promtext.parse(text)
    assert [(s.name, s.labels, s.value) for s in samples] == [
        ("llamacpp:spec_decode_num_drafts_total", (), 42.0),
        ("llamacpp:predicted_tokens_seconds", (), 150.0)]
    assert promtext.types(text) == {"llamacpp:spec_decode_num_drafts_total": "counter"}


def test_escapes_special_values_timestamps_and_eof() -> None:
    text = ('m{path="a\\"b\\\\c\\nd", x = "1" ,} NaN 1700000000000\n'
            "n +Inf\n"
            "o -Inf\n"
            "# EOF\n"
            "ignored after eof\n")
    m, n, o = promtext.parse(text)
    assert m.label("path") == 'a"b\\c\nd' and m.label("x") == "1"
    assert math.isnan(m.value)
    assert n.value == math.inf and o.value == -math.inf


@pytest.mark.parametrize("line,words", [
    ('m{a="1" 2', "expected ',' or '}'"),
    ('m{a="1} 2', "unterminated"),
    ("m{1a=\"x\"} 2", "bad label name"),
    ("m notanumber", "bad sample value"),
    ("m", "expected 'value"),
    ("{a=\"1\"} 2", "no metric name"),
])
def test_malformed_lines_name_the_line(line: str, words: str) -> None:
    with pytest.raises(ValueError, match="line 2") as e:
        promtext.parse("ok 1\n" + line + "\n")
    assert words in str(e.value)
