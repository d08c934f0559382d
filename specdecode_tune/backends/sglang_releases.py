"""Which SGLang release the servers run, and what differs between releases in the command line
(docs/engines-sglang.md, each fact with its source): flags that exist from a release, flags
renamed, and a refusal that a later release lifts. The backend (`backends/sglang.py`) emits
only what the servers' release accepts; it learns that release from the experiment's
`backend.engine_version`, else the sglang of the servers' Python (`sglang_python.py`), else
`DEFAULT_VERSION`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from .common import at_least

# The release the contract tests parse with (tests/contract, scripts/install_sglang_cpu.sh) and
# the simulator imitates; the default when nothing says which release the servers run.
DEFAULT_VERSION = "0.5.10.post1"
# --speculative-adaptive / --speculative-adaptive-config exist from 0.5.11 (argparse refuses
# them before: exit 2); the per-batch-size file the report writes (keys = batch sizes, each
# {"candidate_steps": [...]}) is read from 0.5.13 (0.5.11-0.5.12 take one flat object).
ADAPTIVE_FLAGS_SINCE = "0.5.11"
ADAPTIVE_PER_BATCH_SIZE_SINCE = "0.5.13"

# Hybrid (linear-attention / mamba) architectures whose speculation SGLang refuses with radix
# cache on under the default --mamba-scheduler-strategy no_buffer, at argument checking
# (server_args.py `_handle_mamba_radix_cache`, 0.5.10.post1 to 0.5.13; from 0.5.14 its
# --mamba-radix-cache-strategy auto picks a buffer itself). Qwen3.5-MoE, the seed's, is one.
RADIX_SPEC_REFUSED = ("Qwen3NextForCausalLM", "Qwen3_5MoeForConditionalGeneration",
                      "Qwen3_5ForConditionalGeneration", "NemotronHForCausalLM",
                      "FalconH1ForCausalLM", "JetNemotronForCausalLM",
                      "JetVLMForConditionalGeneration", "Lfm2ForCausalLM")
RADIX_SPEC_ALLOWED_SINCE = "0.5.14"

# Flags SGLang renamed (docs/engines-sglang.md section 1): from 0.5.14 `--cuda-graph-max-bs` is
# `--cuda-graph-max-bs-decode` (the old name a deprecated alias through 0.5.18; from 0.5.20
# argparse's prefix matching refuses it as ambiguous with `--cuda-graph-max-bs-prefill`) and
# `--mamba-scheduler-strategy` is `--mamba-radix-cache-strategy` (same values plus `auto`;
# the old name gone from 0.5.20). The experiment keeps one name, the one 0.5.10 has; the
# backend writes the one the servers' release takes.
RENAMED_FLAGS = {"cuda_graph_max_bs": ("0.5.14", "cuda_graph_max_bs_decode"),
                 "mamba_scheduler_strategy": ("0.5.14", "mamba_radix_cache_strategy")}

# From 0.5.16 the EAGLE draft-extend CUDA graphs are captured at the draft tree's width,
# num_draft_tokens per request (eagle_draft_extend_cuda_graph_runner.py `captured_req_width`
# via spec_utils.py `resolve_num_tokens_per_req`; 0.5.10.post1 to 0.5.12: num_steps + 1). A
# tree narrower than its depth, topk > 1 with num_draft_tokens < steps + 1, passes the argument
# checks and crashes in that capture. Seen on an H100 with 0.5.17 (2026-12-06, docs/gpu-runs.md):
# steps 8 at topk 2 and 4 with 8 draft tokens crashed, "RuntimeError: The expanded size of the
# tensor (8) must match the existing size (9) at non-singleton dimension 1"; steps 4 and 6 with 8
# booted. 0.5.13-0.5.15 were not read: the boot decides there.
SHORT_TREE_CRASH_SINCE = "0.5.16"


def short_tree_crash(steps: int, topk: int, draft: int, version: str) -> str | None:
    """Why SGLang `version` crashes at boot on this draft tree, or None."""
    if topk > 1 and draft < steps + 1 and at_least(version, SHORT_TREE_CRASH_SINCE):
        return (f"speculative_num_draft_tokens = {draft} < speculative_num_steps + 1 = "
                f"{steps + 1} at speculative_eagle_topk = {topk}: SGLang {version} crashes at "
                f"boot (its draft-extend CUDA graphs are {draft} tokens wide, the draft "
                f"{steps + 1} deep; releases >= {SHORT_TREE_CRASH_SINCE}); use at least "
                f"{steps + 1} draft tokens or fewer steps")
    return None


def radix_spec_refusal(arch: str) -> str:
    """SGLang's words for that refusal (sic: no space after the first period)."""
    return (f"Speculative decoding for {arch} is not compatible with radix cache when using "
            "--mamba-scheduler-strategy no_buffer.To use radix cache with speculative decoding, "
            "please use --mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1.")


def local_architecture(model_path: str) -> str | None:
    """`architectures[0]` of a local model folder's config.json, or None (a hub id, a path not
    on this machine, no readable config)."""
    path = os.path.join(os.path.expandvars(os.path.expanduser(model_path)), "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            archs = json.load(f).get("architectures")
    except (OSError, ValueError, AttributeError):
        return None
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None


def renamed(params: Mapping[str, Any], version: str) -> dict[str, Any]:
    """`params` with the flags `version` renamed under their new names (RENAMED_FLAGS)."""
    out: dict[str, Any] = {}
    for name, value in params.items():
        since, new = RENAMED_FLAGS.get(name, ("", ""))
        out[new if since and at_least(version, since) else name] = value
    return out
