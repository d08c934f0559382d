"""Each engine's stream fields, declared in its backend and applied by the load generator."""

from __future__ import annotations

import subprocess
import sys

import specdecode_tune.load as load
from specdecode_tune.backends import ANY_ENGINE_STREAM, get_backend
from specdecode_tune.backends.streamformat import NativeApi, StreamFormat, union
from specdecode_tune.load import Api, Prompt, RequestState, openai_interpreter, tally_level

TIMINGS = {"draft_n": 6, "draft_n_accepted": 4}
LLAMA_FINAL = {"choices": [], "usage": {"completion_tokens": 8}, "timings": TIMINGS}


def test_every_engines_fields_together_are_the_ones_read_before_the_split() -> None:
    s = ANY_ENGINE_STREAM
    assert [n.api for n in s.native_apis] == ["generate"]
    assert s.side_objects == ("timings",)
    assert s.verify_ct == ("spec_verify_ct",)
    assert s.accepted == ("spec_num_correct_drafts", "spec_accepted_drafts",
                          "spec_accept_token_num", "draft_n_accepted")
    assert s.drafted == ("spec_num_proposed_drafts", "spec_proposed_drafts",
                         "spec_draft_token_num", "draft_n")
    assert s.histogram == ("spec_correct_drafts_histogram", "spec_accept_histogram")


def test_union_keeps_order_without_repeats_and_the_first_api_of_a_name() -> None:
    a = NativeApi("x", "/a", lambda p: {}, lambda o: (False, None, None))
    b = NativeApi("x", "/b", lambda p: {}, lambda o: (False, None, None))
    u = union([StreamFormat(native_apis=(a,), accepted=("k1", "k2")),
               StreamFormat(native_apis=(b,), accepted=("k2", "k3"))])
    assert u.native_apis == (a,) and u.accepted == ("k1", "k2", "k3")


def test_an_engines_api_reads_only_its_own_side_objects() -> None:
    llama = Api("completions", stream=get_backend("llamacpp").stream_format)
    vllm = Api("completions", stream=get_backend("vllm").stream_format)
    assert llama.interpreter(LLAMA_FINAL)[2] == {"completion_tokens": 8, "draft_n": 6,
                                                  "draft_n_accepted": 4}
    assert vllm.interpreter(LLAMA_FINAL)[2] == {"completion_tokens": 8}
    assert llama.body(Prompt("p", None, 1, 8)) == vllm.body(Prompt("p", None, 1, 8))


def test_generate_is_sglangs_api_whichever_engine_it_is_sent_to() -> None:
    vllm = Api("generate", stream=get_backend("vllm").stream_format)
    assert vllm.path == "/generate" and "sampling_params" in vllm.body(Prompt("p", None, 1, 8))


def test_several_side_objects_are_merged_into_the_kept_usage() -> None:
    interp = openai_interpreter(False, ("timings", "spec"))
    chunk = {"choices": [{"text": "a"}], "usage": {"completion_tokens": 3},
             "timings": {"draft_n": 2}, "spec": {"verify": 1}}
    assert interp(chunk) == (True, 3, {"completion_tokens": 3, "draft_n": 2, "verify": 1})
    assert interp({"choices": [], "spec": {"verify": 1}}) == (False, None, {"verify": 1})


def test_records_take_the_counters_under_the_engines_own_names() -> None:
    st = RequestState(0, Prompt("p", None, 1, 8))
    st.start, st.end, st.counted, st.meta = 100.0, 101.0, 8, dict(TIMINGS)
    [mixed], _ = tally_level([st], 1, 100.0, 100.0, 110.0)
    [sglang], _ = tally_level([st], 1, 100.0, 100.0, 110.0,
                              get_backend("sglang").stream_format)
    assert (mixed.accepted_tokens, mixed.draft_tokens) == (4, 6)
    assert (sglang.accepted_tokens, sglang.draft_tokens) == (None, None)


def test_the_facade_hands_on_every_name_and_the_workload_needs_no_aiohttp() -> None:
    for name in load.__all__:
        assert getattr(load, name) is not None
    code = ("import sys, specdecode_tune.load.workload; "
            "print(sorted(m for m in ('aiohttp', 'ray', 'pyarrow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
