"""classify_failure on real-looking log tails of SGLang and vLLM, and ServerProcess's argument
checks (pure: nothing is started)."""

# ruff: noqa: E501  (the log samples are real-length log lines)

from __future__ import annotations

import os
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdecode_tune.backends import BACKENDS
from specdecode_tune.backends.failurepatterns import FailurePatterns
from specdecode_tune.errors import START_FAILURE_KINDS
from specdecode_tune.server import ServerProcess, classify_failure, kill_process_group

SGLANG_OOM = """\
[2026-11-29 10:01:12 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=2.31 GB, mem usage=75.20 GB.
[2026-11-29 10:01:13 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2412, in run_scheduler_process
    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)
  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", line 215, in __init__
    self.initialize(min_per_gpu_memory)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.02 GiB is free.

[2026-11-29 10:01:13] Received sigquit from a child process. It usually means the child failed.
"""

SGLANG_GRAPH_OOM = """\
[2026-11-29 10:03:40 TP1] Capture cuda graph begin. This can take up to several minutes. avail mem=0.88 GB
[2026-11-29 10:03:41 TP1] Scheduler hit an exception: Traceback (most recent call last):
  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/cuda_graph_runner.py", line 380, in __init__
    raise Exception(
Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 1 has a total capacity of 79.19 GiB of which 301.00 MiB is free.
Possible solutions:
1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)
2. set --cuda-graph-max-bs to a smaller value (e.g., 16)
"""

SGLANG_GRAPH_NOT_OOM = """\
[2026-11-29 10:03:41 TP0] Scheduler hit an exception: Traceback (most recent call last):
Exception: Capture cuda graph failed: CUDA error: an illegal memory access was encountered
This is not an out-of-memory error, so lowering --mem-fraction-static or --cuda-graph-max-bs-decode will not help.
Please report this issue at https://github.com/sgl-project/sglang/issues/new/choose
"""

VLLM_OOM = """\
(EngineCore_DP0 pid=48217) INFO 11-29 10:00:01 [gpu_model_runner.py:2007] Loading model from scratch...
(EngineCore_DP0 pid=48217) ERROR 11-29 10:00:09 [core.py:700] EngineCore failed to start.
(EngineCore_DP0 pid=48217) ERROR 11-29 10:00:09 [core.py:700] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. GPU 0 has a total capacity of 79.19 GiB of which 412.00 MiB is free.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""

VLLM_BUSY_GPU = """\
ValueError: Free memory on device (6.92/79.19 GiB) on startup is less than desired GPU memory utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.
"""

SGLANG_KV = """\
[2026-11-29 10:05:02 TP0] Load weight end. type=DeepseekV3ForCausalLM, avail mem=4.12 GB, mem usage=70.02 GB.
[2026-11-29 10:05:02 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/model_runner.py", line 715, in init_memory_pool
    raise RuntimeError(
RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=0.55
[2026-11-29 10:05:03] Received sigquit from a child process. It usually means the child failed.
"""

VLLM_KV_V0 = """\
INFO 03-02 12:00:00 worker.py:266] model weights take 74.31GiB; non_torch_memory takes 0.41GiB
ERROR 03-02 12:00:00 engine.py:389] No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.
ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.
"""

VLLM_KV_V1 = """\
(EngineCore_DP0 pid=48217) INFO kv_cache_utils.py:756] GPU KV cache size: 36,864 tokens
(EngineCore_DP0 pid=48217) ERROR core.py:412] ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (5.09 GiB). Based on the available memory, the estimated maximum model length is 41600. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.
"""

VLLM_KV_MAXLEN = """\
ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be stored in KV cache (18336). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.
"""

# vLLM 0.26.0's two memory refusals at start-up, as its source words them: too little free
# memory for the requested share (v1/worker/utils.py:434-443; a busy GPU) and no KV memory left
# (v1/core/kv_cache_utils.py:757-764; the bottom of vllm-gpu.toml's range), behind the engine
# core's wrapper (the numbers are made up).
VLLM_026_BUSY_GPU = """\
(EngineCore pid=811) ERROR 12-06 10:00:01 [core.py:1101] ValueError: Free memory on device cuda:0 (0.70/79.19 GiB) on startup is less than desired GPU memory utilization (0.02, 1.58 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""

VLLM_026_NO_KV = """\
(EngineCore pid=811) INFO 12-06 10:00:09 [gpu_worker.py:561] Available KV cache memory: -0.62 GiB
(EngineCore pid=811) ERROR 12-06 10:00:09 [core.py:1101] ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine (this flag also controls CPU memory reservation on the CPU backend, despite its name). See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""

ARGPARSE_BAD_VALUE = """\
usage: launch_server.py [-h] --model-path MODEL_PATH [--speculative-eagle-topk SPECULATIVE_EAGLE_TOPK]
launch_server.py: error: argument --speculative-eagle-topk: invalid int value: 'four'
"""

ARGPARSE_UNKNOWN = """\
usage: vllm serve [model_tag] [options]
vllm serve: error: unrecognized arguments: --speculative-num-step 4
"""

SGLANG_ASSERT = """\
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/usr/local/lib/python3.11/dist-packages/sglang/launch_server.py", line 11, in <module>
    server_args = prepare_server_args(sys.argv[1:])
  File "/usr/local/lib/python3.11/dist-packages/sglang/srt/server_args.py", line 1203, in _handle_speculative_decoding
    assert self.speculative_num_draft_tokens <= self.speculative_num_steps * self.speculative_eagle_topk + 1
AssertionError
"""

SGLANG_VALUE_ERROR = """\
Traceback (most recent call last):
  File "/usr/local/lib/python3.11/dist-packages/sglang/srt/server_args.py", line 880, in __post_init__
    self._handle_speculative_decoding()
  File "/usr/local/lib/python3.11/dist-packages/sglang/srt/server_args.py", line 1188, in _handle_speculative_decoding
    raise ValueError(
ValueError: speculative_eagle_topk > 1 is not supported with page_size > 1 for this attention backend
"""

VLLM_PYDANTIC = """\
Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/vllm/engine/arg_utils.py", line 1123, in create_speculative_config
    return SpeculativeConfig(**self.speculative_config)
pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig
  Value error, num_speculative_tokens must be > 0, got 0 [type=value_error, input_value=ArgsKwargs(()), input_type=ArgsKwargs]
"""

MODEL_VALUE_ERROR = """\
Traceback (most recent call last):
  File "/usr/local/lib/python3.11/dist-packages/sglang/srt/model_loader/weight_utils.py", line 402, in safetensors_weights_iterator
    raise ValueError(f"bad tensor {name}")
ValueError: bad tensor model.layers.3.mlp.gate_proj.weight
"""

NCCL_CRASH = """\
[2026-11-29 10:07:00 TP1] Init torch distributed begin.
RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:268, unhandled system error
[2026-11-29 10:07:01] Received sigquit from a child process. It usually means the child failed.
"""

# SGLang 0.5.17 on an H100 (2026-12-06), steps 8 / topk 2 / 8 draft tokens: the line the
# recorder kept as the reason (the whole log did not come back), then SGLang's clean-up, which
# ends the launcher with SIGKILL (engine.py `launch_phase_sigquit_handler`).
SGLANG_0517_SHORT_TREE = """\
RuntimeError: The expanded size of the tensor (8) must match the existing size (9) at \
non-singleton dimension 1.  Target sizes: [1, 8].  Tensor sizes: [9]
[2026-12-06 16:47:10] Received sigquit from a child process. It usually means the child failed.
"""

CASES = [
    # (name, returncode, log tail, kind, text the reason must hold)
    ("sglang-oom", -9, SGLANG_OOM, "oom", "torch.OutOfMemoryError: CUDA out of memory"),
    ("sglang-graph-oom", 1, SGLANG_GRAPH_OOM, "oom", "Capture cuda graph failed: CUDA out of"),
    ("vllm-oom", 1, VLLM_OOM, "oom", "CUDA out of memory. Tried to allocate 896.00 MiB"),
    ("vllm-busy-gpu", 1, VLLM_BUSY_GPU, "oom", "less than desired GPU memory utilization"),
    ("sglang-kv", -9, SGLANG_KV, "kv_memory", "mem_fraction_static=0.55"),
    ("vllm-kv-v0", 1, VLLM_KV_V0, "kv_memory", "No available memory for the cache blocks"),
    ("vllm-kv-v1", 1, VLLM_KV_V1, "kv_memory", "16.00 GiB KV cache is needed"),
    ("vllm-kv-maxlen", 1, VLLM_KV_MAXLEN, "kv_memory", "stored in KV cache (18336)"),
    ("vllm-0.26-busy-gpu", 1, VLLM_026_BUSY_GPU, "oom", "less than desired GPU memory"),
    ("vllm-0.26-no-kv", 1, VLLM_026_NO_KV, "kv_memory", "No available memory for the cache"),
    ("argparse-value", 2, ARGPARSE_BAD_VALUE, "invalid_args", "invalid int value: 'four'"),
    ("argparse-unknown", 2, ARGPARSE_UNKNOWN, "invalid_args", "--speculative-num-step 4"),
    ("argparse-bare-exit-2", 2, "something went wrong\n", "invalid_args", "exit code 2"),
    ("sglang-assert", 1, SGLANG_ASSERT, "invalid_args", "AssertionError"),
    ("sglang-value-error", 1, SGLANG_VALUE_ERROR, "invalid_args", "page_size > 1"),
    ("vllm-pydantic", 1, VLLM_PYDANTIC, "invalid_args", "validation error for Speculative"),
    ("graph-not-oom", 1, SGLANG_GRAPH_NOT_OOM, "crashed", "illegal memory access"),
    ("model-value-error", 1, MODEL_VALUE_ERROR, "crashed", "ValueError: bad tensor"),
    ("nccl", -9, NCCL_CRASH, "crashed", "RuntimeError: NCCL error"),
    ("sglang-0.5.17-short-tree", -9, SGLANG_0517_SHORT_TREE, "crashed",
     "killed by SIGKILL: RuntimeError: The expanded size of the tensor (8)"),
    ("segfault", -11, "Fatal Python error: Segmentation fault\n", "crashed", "SIGSEGV"),
    ("silent-sigkill", -9, "Loading safetensors checkpoint shards:  40%\n", "crashed",
     "OOM killer"),
    ("empty", 1, "", "crashed", "exit code 1: (empty log)"),
    ("exit-0", 0, "daemonizing\n", "crashed", "exited with code 0 before it was healthy"),
    ("command-not-found", 127, "bash: sglang: command not found\n", "missing_binary",
     "command not found"),
    ("python-m-missing", 1,
     "/usr/bin/python3: Error while finding module specification for 'sglang.launch_server' "
     "(ModuleNotFoundError: No module named 'sglang')\n", "missing_binary", "No module named"),
    ("python-m-missing-mod", 1, "/opt/venv/bin/python: No module named sglang.launch_server\n",
     "missing_binary", "No module named sglang.launch_server"),
    ("hung", None, "Loading safetensors checkpoint shards:  40% Completed | 4/10\n", "timeout",
     "last log line: Loading safetensors"),
    ("hung-after-oom", None, SGLANG_OOM, "oom", "CUDA out of memory"),
    ("hung-after-kv", None, SGLANG_KV, "kv_memory", "Not enough memory"),
    ("hung-after-assert", None, SGLANG_ASSERT, "timeout", "AssertionError"),
]


@pytest.mark.parametrize(("returncode", "tail", "kind", "in_reason"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_classify_failure(returncode: int | None, tail: str, kind: str, in_reason: str) -> None:
    got_kind, reason = classify_failure(returncode, tail)
    assert (got_kind, in_reason in reason) == (kind, True), reason
    assert "\n" not in reason and len(reason) <= 300


def test_a_sigkill_after_an_error_is_not_blamed_on_host_memory() -> None:
    """SGLang's launcher SIGKILLs its own process tree when a child fails: with the child's
    exception in the log, the reason quotes it and guesses no OOM killer; with nothing in the
    log, the OOM killer stays the likely sender."""
    for tail in (SGLANG_0517_SHORT_TREE, NCCL_CRASH):
        assert "OOM killer" not in classify_failure(-9, tail)[1]
    assert "OOM killer" in classify_failure(-9, "Loading safetensors shards:  40%\n")[1]


def test_reason_has_no_terminal_colours() -> None:
    tail = "\x1b[1;31mERROR\x1b[0m torch.OutOfMemoryError: CUDA out of memory.\n"
    assert classify_failure(1, tail) == ("oom", "ERROR torch.OutOfMemoryError: CUDA out of memory.")


def test_first_cause_wins_over_later_ranks() -> None:
    tail = ("[TP0] RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n"
            "[TP1] RuntimeError: NCCL error: remote process exited\n")
    assert classify_failure(1, tail)[0] == "kv_memory"


def test_long_line_is_trimmed() -> None:
    kind, reason = classify_failure(1, "RuntimeError: " + "x" * 5000)
    assert kind == "crashed" and len(reason) == 300 and reason.endswith("...")


ENGINE_CASES = [c for c in CASES if c[0].startswith(("sglang-", "vllm-"))]


@pytest.mark.parametrize(("name", "returncode", "tail", "kind"), [c[:4] for c in ENGINE_CASES],
                         ids=[c[0] for c in ENGINE_CASES])
def test_each_engine_knows_its_own_lines(name: str, returncode: int | None, tail: str,
                                         kind: str) -> None:
    engines = ("sglang", "sim") if name.startswith("sglang-") else ("vllm",)
    for engine in engines:
        assert classify_failure(returncode, tail, BACKENDS[engine])[0] == kind, engine


def test_another_engines_lines_do_not_count() -> None:
    sglang, vllm, llamacpp = BACKENDS["sglang"], BACKENDS["vllm"], BACKENDS["llamacpp"]
    assert classify_failure(1, VLLM_KV_V0, sglang)[0] == "crashed"
    assert classify_failure(1, VLLM_PYDANTIC, sglang)[0] == "crashed"
    assert classify_failure(1, SGLANG_KV, vllm)[0] == "crashed"
    assert classify_failure(1, SGLANG_ASSERT, vllm)[0] == "crashed"
    # What every server prints counts whatever the engine.
    assert classify_failure(1, SGLANG_OOM, llamacpp)[0] == "oom"
    assert classify_failure(2, ARGPARSE_UNKNOWN, llamacpp)[0] == "invalid_args"
    assert classify_failure(127, "", llamacpp)[0] == "missing_binary"


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.none(), st.integers(-64, 255)), st.text(max_size=2000))
def test_classify_any_input_gives_a_kind_and_one_line(returncode: int | None, tail: str) -> None:
    kind, reason = classify_failure(returncode, tail)
    assert kind in START_FAILURE_KINDS
    assert reason and len(reason) <= 300 and "\n" not in reason and "\r" not in reason


# ---------------------------------------------------------------------------------------------
# Argument checks: each names the bad value, nothing is started


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"argv": "python -m sglang.launch_server --port {port}"}, "not a shell string"),
    ({"argv": []}, "non-empty list"),
    ({"argv": ["python", "--port", "30000"]}, "no '{port}' placeholder"),
    ({"argv": ["python", "--port", "{port}"], "port": 70000}, "port=70000"),
    ({"argv": ["python", "--port", "{port}"], "boot_timeout_s": 0}, "boot_timeout_s=0"),
    ({"argv": ["python", "--port", "{port}"], "health_path": "health"}, "health_path='health'"),
])
def test_server_process_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("{", r"\{")):
        ServerProcess(**kwargs)


def test_kill_process_group_refuses_our_own_group_and_init() -> None:
    with pytest.raises(ValueError, match="own group"):
        kill_process_group(os.getpgrp())
    with pytest.raises(ValueError, match="pgid=1"):
        kill_process_group(1)


@pytest.mark.parametrize("kind", sorted(BACKENDS))
def test_every_backend_declares_failure_patterns_that_compile(kind: str) -> None:
    fp = BACKENDS[kind].failure_patterns
    assert isinstance(fp, FailurePatterns)
    for pattern in fp.oom + fp.kv_memory + fp.arg_check_files:
        re.compile(pattern)
    assert all(name.isidentifier() for name in fp.arg_exceptions)
