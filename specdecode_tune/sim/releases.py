"""What the simulator writes differently for the SGLang release it imitates (`--sglang-version`).

Copies of the SGLang backend's knowledge (`backends/sglang_wire.py`, `sglang_logs.py`,
`sglang_releases.py`; docs/engines-sglang.md section
12 names each line's source), so that the tests run the backend's readers on both forms:
`tests/unit/sim/test_sim_releases.py` holds the copies equal to the backend's.

- The CUDA graph capture's end line: "Capture cuda graph end. Time elapsed: T s. mem usage=K
  GB. avail mem=X GB." up to 0.5.13; from 0.5.14 one line per graph kind with a comma after the
  usage, "Capture target verify CUDA graph end. elapsed=T s, mem usage=K GB, avail mem=X GB."
  The simulator writes one line for all its graphs (the reader sums the usage of every line).
- A capture's failure hint (CUDA_GRAPH_CAPTURE_FAILED_MSG): the flags it names changed in 0.5.14.
- Weights that leave no KV budget: "Not enough memory. ..." up to 0.5.13; from 0.5.14 "Loaded
  weights leave no GPU memory for the KV cache under --mem-fraction-static=F. ...".
- The speculative fields of /generate's final chunk: renamed in 0.5.11 and 0.5.12 (the old
  names kept as aliases).
- /metrics: `sglang:spec_num_steps`, `sglang:spec_num_draft_tokens` (gauges) and
  `sglang:spec_verify_calls_total` (a counter) from 0.5.13.
- /v1/loads from 0.5.11, where /get_load logs a deprecation line on every call.
- /server_info's `internal_states[0].memory_usage`: from 0.5.17 `graph` is a dict by capture
  phase (the draft's included) and `startup_available` is added (nothing of the project reads
  either).
"""

from __future__ import annotations

import math

from specdecode_tune.sim.adaptive import release_key

CAPTURE_COMMA_SINCE = "0.5.14"
KV_NO_BUDGET_SINCE = "0.5.14"
CAPTURE_HINT_SINCE = "0.5.14"
SPEC_METRICS_SINCE = "0.5.13"
MEMORY_USAGE_BY_PHASE_SINCE = "0.5.17"
# A tree narrower than its depth (topk > 1, draft tokens < steps + 1) crashes in the draft-extend
# CUDA graph capture, whose width is the draft tokens from 0.5.16 (the backend's
# sglang_releases.SHORT_TREE_CRASH_SINCE, with where it was seen).
SHORT_TREE_CRASH_SINCE = "0.5.16"
# /v1/loads, and /get_load as its deprecated shim (the backend's in_flight reads the former).
V1_LOADS_SINCE = "0.5.11"
GET_LOAD_DEPRECATED = ("Endpoint '/get_load' is deprecated and will be removed in a future "
                       "version. Please use '/v1/loads' instead.")

# (since, accepted, proposed, histogram names), newest first: the backend's SPEC_FIELD_NAMES.
SPEC_FIELD_NAMES: tuple[tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]], ...] = (
    ("0.5.12", ("spec_num_correct_drafts", "spec_accepted_drafts"),
     ("spec_num_proposed_drafts", "spec_proposed_drafts"),
     ("spec_correct_drafts_histogram", "spec_accept_histogram")),
    ("0.5.11", ("spec_accepted_drafts",), ("spec_proposed_drafts",), ("spec_accept_histogram",)),
    ("0", ("spec_accept_token_num",), ("spec_draft_token_num",), ("spec_accept_histogram",)),
)

# SGLang's hint after "Capture cuda graph failed: <error>" (0.5.10.post1
# model_executor/cuda_graph_runner.py L1230; 0.5.14 to 0.5.17
# model_executor/runner_backend_utils/__init__.py L14).
CUDA_GRAPH_CAPTURE_FAILED_MSG = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
    "3. disable torch compile by not using --enable-torch-compile\n"
    "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)
CUDA_GRAPH_CAPTURE_FAILED_MSG_0514 = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
    "(Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)


def at_least(version: str, since: str) -> bool:
    return release_key(version) >= release_key(since)


def spec_field_names(version: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(accepted, proposed, histogram) names that `version` writes in /generate's meta_info."""
    return next(row[1:] for row in SPEC_FIELD_NAMES if at_least(version, row[0]))


def capture_end_line(version: str, speculative: bool, elapsed_s: float, kept_gb: float,
                     avail_gb: float) -> str:
    """The capture's end line as `version` writes it (0.5.10.post1 model_runner.py L2460-2461;
    0.5.17 model_runner_components/cuda_graph_setup.py L453-455)."""
    if at_least(version, CAPTURE_COMMA_SINCE):
        kind = "target verify" if speculative else "target decode"
        return (f"Capture {kind} CUDA graph end. elapsed={elapsed_s:.2f} s, "
                f"mem usage={kept_gb:.2f} GB, avail mem={avail_gb:.2f} GB.")
    return (f"Capture cuda graph end. Time elapsed: {elapsed_s:.2f} s. "
            f"mem usage={kept_gb:.2f} GB. avail mem={avail_gb:.2f} GB.")


def capture_failed_hint(version: str) -> str:
    return (CUDA_GRAPH_CAPTURE_FAILED_MSG_0514 if at_least(version, CAPTURE_HINT_SINCE)
            else CUDA_GRAPH_CAPTURE_FAILED_MSG)


def no_kv_budget(frac: float, available_gb: float, pre_gb: float) -> str:
    """From 0.5.14, the refusal of a pool whose budget is not positive (the weights, the
    draft's included, fill the static part; 0.5.17 mem_cache/kv_cache_configurator.py
    `_profile_available_bytes` L1640-1655), with `available_gb` free after the weights and
    `pre_gb` before them. Up to 0.5.13 the same boot said "Not enough memory. ..."."""
    minimum = 1 - available_gb / pre_gb
    suggested = math.ceil(minimum * 1000) / 1000
    return (f"ValueError: Loaded weights leave no GPU memory for the KV cache under "
            f"--mem-fraction-static={frac}. Raise --mem-fraction-static above "
            f"{suggested:.3f} (minimum viable = 1 - available/pre = {minimum:.4f}). If using "
            f"speculative decoding, draft weights are now counted.")


def memory_usage(version: str, speculative: bool, *, weight_gb: float, kv_gb: float,
                 graph_gb: float, tokens: int, available_gb: float) -> dict[str, object]:
    """`internal_states[0].memory_usage` of /server_info: 0.5.10.post1 scheduler.py L3071-3078
    (`graph` the target's capture, GB); 0.5.17 scheduler_components/memory_usage.py L15-41
    (`graph` by phase, e.g. {"target_verify": ...}; the free memory after start-up)."""
    if not at_least(version, MEMORY_USAGE_BY_PHASE_SINCE):
        return {"weight": round(weight_gb, 2), "kvcache": round(kv_gb, 2),
                "token_capacity": tokens, "graph": round(graph_gb, 2)}
    phase = "target_verify" if speculative else "decode"
    return {"weight": round(weight_gb, 3), "kvcache": round(kv_gb, 3),
            "startup_available": round(available_gb, 3), "token_capacity": tokens,
            "token_capacity_swa": None, "graph": {phase: round(graph_gb, 3)}}


def short_tree_crash(steps: int, topk: int, n: int, version: str) -> str | None:
    """SGLang `version`'s last words where a draft tree narrower than its depth crashes its
    boot (0.5.17 on an H100, steps 8 / topk 2 / 8 draft tokens), or None."""
    if topk > 1 and n < steps + 1 and at_least(version, SHORT_TREE_CRASH_SINCE):
        return (f"RuntimeError: The expanded size of the tensor ({n}) must match the existing "
                f"size ({steps + 1}) at non-singleton dimension 1.  Target sizes: [1, {n}].  "
                f"Tensor sizes: [{steps + 1}]")
    return None
