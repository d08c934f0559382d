"""The SGLang backend's readings of a server, in the forms of 0.5.10.post1 and 0.5.17.

Every 0.5.17 line here is rendered from 0.5.17's own source (the f-string at the file and line
named beside it) with values chosen for the test: FROM SOURCE, NOT A LIVE SERVER. Live captures
of a 0.5.17 boot go under tests/data/ once the GPU run has them. The 0.5.10.post1 lines are from
its source likewise (tests/contract renders them from the installed package's own f-strings).
docs/engines-sglang.md section 12 is the table of these readings.
"""

from __future__ import annotations

import json
import sys
import traceback

import pytest

from specdecode_tune.backends import get_backend, sglang_logs, sglang_python, sglang_wire
from specdecode_tune.load import Prompt, tally_level
from specdecode_tune.load import RequestState as _Req
from specdecode_tune.records import GRAPH_MEMORY, MEMORY_ROOM
from specdecode_tune.server.failures import classify_failure

SGLANG = get_backend("sglang")

# --------------------------------------------------------------------------- memory lines

# 0.5.10.post1, from source: model_runner.py L1075 (load), L2460-2461 (target capture),
# eagle_worker.py L257 / L272 (draft, draft extend); every rank writes every line.
LOG_0510 = """\
[2026-12-04 10:00:00 TP0] Load weight begin. avail mem=78.00 GB
[2026-12-04 10:00:09 TP0] Capture cuda graph end. Time elapsed: 8.00 s. mem usage=1.50 GB. avail mem=20.00 GB.
[2026-12-04 10:00:10 TP0] Load weight begin. avail mem=19.00 GB
[2026-12-04 10:00:12 TP0] Capture draft cuda graph end. Time elapsed: 2.00 s. mem usage=0.50 GB. avail mem=18.00 GB.
[2026-12-04 10:00:13 TP0] Capture draft extend cuda graph end. Time elapsed: 1.00 s. mem usage=0.40 GB. avail mem=17.16 GB.
"""  # noqa: E501

# 0.5.17, FROM SOURCE (values chosen), an EAGLE-3 boot on two ranks in 0.5.17's order
# (scheduler.py `init_model_worker` L974-984: both models' weights, both pools, then the
# captures, prefill before decode): model_runner.py L1012 "Load weight begin", L1100-1106 "Load
# weight end" (its "avail mem=..., mem usage=..." is no capture), kv_cache_configurator.py
# L258-259 "Memory pool end" (target, draft), model_runner_components/cuda_graph_setup.py
# L363-365 / L374-376 (prefill begin / end), L430-432 / L453-455 (verify begin / end),
# eagle_worker_v2.py L364-366 / L384-387 (draft decode) and L457-459 / L479-482 (draft extend),
# those two on TP0 only (`log_info_on_rank0`).
LOG_0517_TP2 = """\
[2026-12-04 10:00:00 TP0] Load weight begin. avail mem=78.00 GB
[2026-12-04 10:00:00 TP1] Load weight begin. avail mem=78.00 GB
[2026-12-04 10:00:05 TP0] Load weight end. elapsed=5.00 s, type=LlamaForCausalLM, avail mem=62.00 GB, mem usage=16.00 GB.
[2026-12-04 10:00:05 TP0] Load weight begin. avail mem=62.00 GB
[2026-12-04 10:00:05 TP1] Load weight begin. avail mem=62.00 GB
[2026-12-04 10:00:06 TP0] Memory pool end. avail mem=21.00 GB
[2026-12-04 10:00:06 TP1] Memory pool end. avail mem=20.00 GB
[2026-12-04 10:00:06 TP0] Memory pool end. avail mem=20.50 GB
[2026-12-04 10:00:06 TP1] Memory pool end. avail mem=19.50 GB
[2026-12-04 10:00:06 TP0] Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[4, 8, 16], avail mem=20.40 GB
[2026-12-04 10:00:08 TP0] Capture target prefill CUDA graph end. elapsed=2.10 s, mem usage=0.40 GB, avail mem=20.00 GB.
[2026-12-04 10:00:08 TP1] Capture target prefill CUDA graph end. elapsed=2.10 s, mem usage=0.40 GB, avail mem=19.00 GB.
[2026-12-04 10:00:08 TP0] Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4, bs=[1, 2, 4, 8], avail mem=20.00 GB
[2026-12-04 10:00:09 TP0] Capture target verify CUDA graph end. elapsed=0.93 s, mem usage=1.00 GB, avail mem=19.00 GB.
[2026-12-04 10:00:09 TP1] Capture target verify CUDA graph end. elapsed=0.93 s, mem usage=1.00 GB, avail mem=18.00 GB.
[2026-12-04 10:00:10 TP0] Capture draft prefill CUDA graph end. elapsed=0.50 s, mem usage=0.10 GB, avail mem=18.90 GB.
[2026-12-04 10:00:10 TP1] Capture draft prefill CUDA graph end. elapsed=0.50 s, mem usage=0.10 GB, avail mem=17.90 GB.
[2026-12-04 10:00:10 TP0] Capture draft decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2, 4, 8], avail mem=18.90 GB
[2026-12-04 10:00:11 TP0] Capture draft decode CUDA graph end. elapsed=0.70 s, mem usage=0.30 GB, avail mem=18.60 GB.
[2026-12-04 10:00:11 TP0] Capture draft extend CUDA graph begin. backend=full, num_tokens_per_req=4, bs=[1, 2, 4, 8], avail mem=18.60 GB
[2026-12-04 10:00:12 TP0] Capture draft extend CUDA graph end. elapsed=0.40 s, mem usage=0.20 GB, avail mem=18.40 GB.
[2026-12-04 10:00:20 TP0] max_total_num_tokens=1812363, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=48, context_len=131072, available_gpu_mem=18.40 GB
"""  # noqa: E501


def test_the_0510_capture_lines_are_read() -> None:
    assert sglang_logs.memory_facts(LOG_0510) == {MEMORY_ROOM: round(17.16 / 78, 6),
                                             GRAPH_MEMORY: round(2.4 / 78, 6)}


def test_the_0517_capture_lines_with_a_comma_are_read() -> None:
    """0.5.17 writes "mem usage=K GB, avail mem=X GB" (0.5.10 a period): the backend read
    nothing of a 0.5.17 boot before. One line per graph kind (target prefill and verify, draft
    prefill, decode and extend), their usage summed; the "Load weight end" and "Memory pool end"
    lines, which also carry "avail mem", are not captures."""
    one_rank = "\n".join(ln for ln in LOG_0517_TP2.splitlines() if " TP1]" not in ln)
    assert sglang_logs.memory_facts(one_rank) == {MEMORY_ROOM: round(18.4 / 78, 6),
                                             GRAPH_MEMORY: round(2.0 / 78, 6)}


def test_a_rank_without_the_drafts_capture_lines_is_given_tp0s() -> None:
    """From 0.5.12 the draft worker logs its decode and extend captures on TP0 only: TP1's log
    stops at 17.90 GB after its draft prefill. Its missing captures are taken as TP0's (0.5 GB),
    so TP1, with less room, is the rank read: (17.90 - 0.5) / 78, graphs 2.0 / 78."""
    assert sglang_logs.memory_facts(LOG_0517_TP2) == {MEMORY_ROOM: round(17.4 / 78, 6),
                                                 GRAPH_MEMORY: round(2.0 / 78, 6)}


@pytest.mark.parametrize("line", [
    # 0.5.17 multi_layer_eagle_draft_extend_cuda_graph_runner.py L602-605 (per step; FROM SOURCE)
    "Capture draft extend CUDA graph end. step=2, elapsed=0.31 s, mem usage=0.12 GB, "
    "avail mem=10.00 GB.",
    # 0.5.17 same file L905-907 (single-CG draft extend; FROM SOURCE)
    "Capture single-CG draft extend end. elapsed=0.31 s, mem usage=0.12 GB, avail mem=10.00 GB.",
    # 0.5.10.post1 model_runner.py L2574-2575 (piecewise prefill graphs)
    "Capture piecewise CUDA graph end. Time elapsed: 0.31 s. mem usage=0.12 GB. "
    "avail mem=10.00 GB.",
])
def test_every_capture_kind_is_read(line: str) -> None:
    log = f"[t TP0] Load weight begin. avail mem=50.00 GB\n[t TP0] {line}"
    assert sglang_logs.memory_facts(log) == {MEMORY_ROOM: 0.2, GRAPH_MEMORY: round(0.12 / 50, 6)}


def test_lines_that_are_no_capture_end_say_nothing() -> None:
    """0.5.17's begin lines, "Load weight end", "Init torch distributed ends" (mem usage, no
    avail mem), the post-capture KV resize (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING, off by
    default; kv_pool_runtime.py L121-127) and the capture progress (not read: docs section 6b)."""
    log = "\n".join([
        "[t TP0] Load weight begin. avail mem=50.00 GB",
        "[t TP0] Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4, "
        "bs=[1, 2], avail mem=40.00 GB",
        "[t TP0] Load weight end. elapsed=1.00 s, type=X, avail mem=30.00 GB, mem usage=20.00 GB.",
        "[t TP0] Init torch distributed ends. elapsed=0.50 s, mem usage=0.20 GB",
        "[t TP0] Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: 100, "
        "KV size: 1.00 GB, avail mem=3.00 GB",
        "[t TP0] Capturing batches (bs=8 avail_mem=12.00 GB)",
    ])
    assert sglang_logs.memory_facts(log) == {}


# --------------------------------------------------------------------------- start-up refusals

def traceback_log(frames: list[tuple[str, int, str]], last: str) -> str:
    head = ["Traceback (most recent call last):"]
    head += [f'  File "/venv/lib/python3.12/site-packages/{path}", line {line}, in {func}'
             for path, line, func in frames]
    return "\n".join([*head, last])


# 0.5.17 FROM SOURCE: ServerArgs.__post_init__ (server_args.py L3435) calls
# handle_speculative_decoding (L3592), which raises in arg_groups/speculative_hook.py (L786).
ADAPTIVE_STEPS_0517 = traceback_log(
    [("sglang/launch_server.py", 68, "<module>"),
     ("sglang/srt/server_args.py", 9380, "prepare_server_args"),
     ("sglang/srt/server_args.py", 8470, "from_cli_args"),
     ("sglang/srt/server_args.py", 3592, "__post_init__"),
     ("sglang/srt/arg_groups/speculative_hook.py", 141, "handle_speculative_decoding"),
     ("sglang/srt/arg_groups/speculative_hook.py", 786, "_init_adaptive_speculative_params")],
    "ValueError: --speculative-num-steps=4 is not in the adaptive config candidate_steps "
    "[1, 5]. Pass one of those values.")

# 0.5.17 FROM SOURCE: mem_cache/kv_cache_configurator.py L1647-1655 (values chosen).
NO_KV_BUDGET_0517 = traceback_log(
    [("sglang/srt/managers/scheduler.py", 979, "init_model_worker"),
     ("sglang/srt/mem_cache/kv_cache_configurator.py", 1782, "_resolve_memory_pool_config"),
     ("sglang/srt/mem_cache/kv_cache_configurator.py", 1647, "_profile_available_bytes")],
    "ValueError: Loaded weights leave no GPU memory for the KV cache under "
    "--mem-fraction-static=0.5. Raise --mem-fraction-static above 0.612 (minimum viable = "
    "1 - available/pre = 0.6111). If using speculative decoding, draft weights are now counted.")

# The capture's failure, 0.5.17: decode_cuda_graph_runner.py L417-419 wraps PyTorch's error
# and adds runner_backend_utils/__init__.py L14-21's hint (FROM SOURCE); PyTorch's words are
# those a colleague saw on an H100 (by hand, not a stored capture).
CAPTURE_OOM_0517 = (
    "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 48.00 MiB. "
    "GPU 0 has a total capacity of 79.18 GiB of which 7.38 MiB is free.\n"
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. (Not recommended. "
    "Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n")

# 0.5.17 FROM SOURCE: a prefill capture that fails without running out of memory logs
# breakable_cuda_graph/context.py L45-50 (its hint says "an OOM problem", which is no OOM line).
PREFILL_CRASH_0517 = (
    "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    "Fail when using backend: breakable for prefill runner.\nPossible suggestions:\n"
    "1. change to tc_piecewise by --cuda-graph-backend-prefill=tc_piecewise\n"
    "2. disable the prefill CUDA graph by --cuda-graph-backend-prefill=disabled\n"
    "3. if it is an OOM problem, set --mem-fraction-static to a smaller value (e.g., 0.8 or "
    "0.7) or set --cuda-graph-max-bs-prefill to a smaller value (e.g., 2048)\n")


@pytest.mark.parametrize(("log", "kind", "words"), [
    # 0.5.10.post1: model_runner_kv_cache_mixin.py L57; server_args.py's checks
    ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current "
     "value: mem_fraction_static=0.55", "kv_memory", "Not enough memory"),
    (traceback_log([("sglang/srt/server_args.py", 3081, "_handle_speculative_decoding")],
                   "ValueError: Ngram speculative decoding only supports CUDA device."),
     "invalid_args", "Ngram speculative"),
    # 0.5.17
    (NO_KV_BUDGET_0517, "kv_memory", "Loaded weights leave no GPU memory for the KV cache"),
    ("RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. "
     "Computed max_mamba_cache_size=0 (total_rest_memory=0.10 GB, mamba_cache_per_req=12.00 MB)."
     " Try: (1) reduce --max-running-requests, (2) increase --mem-fraction-static, (3) reduce "
     "--speculative-num-draft-tokens, or (4) use GPUs with more memory.", "kv_memory",
     "Not enough GPU memory for hybrid"),
    ("RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any "
     "requests. max_mamba_cache_size=2, mamba_ratio=3, resulting max_num_reqs=0. Try: ...",
     "kv_memory", "state cache is too small"),
    (ADAPTIVE_STEPS_0517, "invalid_args", "is not in the adaptive config candidate_steps"),
    (CAPTURE_OOM_0517, "oom", "Capture cuda graph failed: CUDA out of memory"),
    (PREFILL_CRASH_0517, "crashed", "an illegal memory access"),
])
def test_sglangs_start_up_refusals_of_both_releases(log: str, kind: str, words: str) -> None:
    got, reason = classify_failure(1, log, SGLANG)
    assert got == kind and words in reason, (got, reason)


def test_an_argument_check_shows_by_its_arg_groups_frame_alone() -> None:
    """A log tail that cut the traceback's server_args.py frames still names the check's file
    (0.5.13+: arg_groups/speculative_hook.py)."""
    tail = "\n".join(ADAPTIVE_STEPS_0517.splitlines()[-3:])
    assert "server_args.py" not in tail
    assert classify_failure(1, tail, SGLANG)[0] == "invalid_args"


def _raise_in(path: str) -> BaseException:
    code = compile("raise ValueError('refused')", path, "exec")
    try:
        exec(code, {})   # a frame with SGLang's file name, for the traceback
    except ValueError as e:
        return e
    raise AssertionError("not raised")


@pytest.mark.parametrize(("path", "verdict"), [
    ("/venv/lib/python3.12/site-packages/sglang/srt/server_args.py", True),          # 0.5.10
    ("/venv/lib/python3.12/site-packages/sglang/srt/arg_groups/speculative_hook.py", True),
    ("/venv/lib/python3.12/site-packages/sglang/srt/configs/model_config.py", False),
    ("/venv/lib/python3.12/site-packages/transformers/configuration_utils.py", False),
])
def test_the_argcheck_counts_arg_groups_as_sglangs_checks(path: str, verdict: bool) -> None:
    """0.5.13 moved the speculative checks to arg_groups/speculative_hook.py: a refusal raised
    there is SGLang's verdict on the command line, as one raised in server_args.py."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_argcheck_under_test", sglang_python.ARGCHECK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = list(sys.path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    exc = _raise_in(path)
    assert traceback.extract_tb(exc.__traceback__)[-1].filename == path
    assert module._raised_in_server_args(exc) is verdict


# --------------------------------------------------------------------------- /generate's fields

# FROM SOURCE: the final chunk's meta_info as `_calculate_spec_decoding_metrics` writes it
# (0.5.10.post1 tokenizer_manager.py L1927-1943; 0.5.17 L2765-2812), 3 verify steps of 3 draft
# tokens each (steps 3, topk 1), 5 of 9 drafts taken, 1 + 3 + 5 = 9 tokens.
META_0510 = {"completion_tokens": 9, "spec_accept_rate": 5 / 9, "spec_accept_length": 3.0,
             "spec_accept_token_num": 5, "spec_draft_token_num": 9, "spec_verify_ct": 3,
             "spec_accept_histogram": [0, 1, 2]}
META_0517 = {"completion_tokens": 9, "spec_accept_rate": 5 / 9, "spec_accept_length": 3.0,
             "spec_num_correct_drafts": 5, "spec_num_proposed_drafts": 9, "spec_verify_ct": 3,
             "spec_accepted_drafts": 5, "spec_proposed_drafts": 9,
             "spec_correct_drafts_histogram": [0, 1, 2], "spec_accept_histogram": [0, 1, 2]}
# 0.5.17 as a colleague listed it from a live server by hand: no `spec_accept_histogram` alias
# (the source writes one; the GPU run is to settle which).
META_0517_AS_SEEN = {k: v for k, v in META_0517.items() if k != "spec_accept_histogram"}


def read_final_chunk(meta: dict) -> None:
    """The backend reads 3 verify steps, 5 of 9 drafts and histogram [0, 1, 2] from a final
    /generate chunk with this meta_info, through the load generator's records."""
    chunk = {"text": "w " * 9, "output_ids": list(range(9)), "meta_info": meta}
    has_text, tokens, kept = sglang_wire.interpret_generate(json.loads(json.dumps(chunk)))
    assert has_text and tokens == 9
    st = _Req(0, Prompt("p", None, 1, 100))
    st.start, st.end, st.counted, st.in_win, st.inexact, st.meta = 0.0, 1.0, 9, 9, False, kept
    [r], _ = tally_level([st], level=1, t0=0.0, w0=0.0, window_end=2.0,
                         stream=sglang_wire.STREAM_FORMAT)
    assert (r.verify_ct, r.accepted_tokens, r.draft_tokens) == (3, 5, 9)
    assert r.accept_histogram == (0, 1, 2)


@pytest.mark.parametrize("meta", [META_0510, META_0517, META_0517_AS_SEEN])
def test_the_final_chunks_spec_fields_of_each_release_are_read(meta: dict) -> None:
    read_final_chunk(meta)


@pytest.mark.parametrize(("version", "accepted", "proposed", "histogram"), [
    ("0.5.10.post1", "spec_accept_token_num", "spec_draft_token_num", "spec_accept_histogram"),
    ("0.5.11", "spec_accepted_drafts", "spec_proposed_drafts", "spec_accept_histogram"),
    ("0.5.12", "spec_num_correct_drafts", "spec_num_proposed_drafts",
     "spec_correct_drafts_histogram"),
    ("0.5.17", "spec_num_correct_drafts", "spec_num_proposed_drafts",
     "spec_correct_drafts_histogram"),
])
def test_each_release_writes_its_names(version: str, accepted: str, proposed: str,
                                       histogram: str) -> None:
    names = sglang_wire.spec_field_names(version)
    assert (names[0][0], names[1][0], names[2][0]) == (accepted, proposed, histogram)
    # the load generator's format takes every release's, the newest first
    stream = sglang_wire.STREAM_FORMAT
    for mine, every in zip(names, (stream.accepted, stream.drafted, stream.histogram)):
        assert set(mine) <= set(every)
