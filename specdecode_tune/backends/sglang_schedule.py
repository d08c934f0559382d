"""SGLang's per-batch-size steps schedule: the adaptive-config file the report writes and the
validation trial boots (`SGLangBackend.schedule_file`, `schedule_params`), in the format SGLang
reads.
"""

from __future__ import annotations

from typing import Any

from .schedule import Slots, check_slots

# The per-batch-size schedule file (`schedule_file`): SGLang `--speculative-adaptive-config`
# (with `--speculative-adaptive`), as read in the stored sgl-project/sglang sources. Released
# wheels: the flags exist from 0.5.11 and read this format from 0.5.13 (docs/engines-sglang.md
# section 3), so the command is given only where `schedule_params` says the servers' release
# takes it. The flag takes the PATH of a JSON file ("Path to a JSON config file for adaptive
# speculative decoding tuning knobs", `python/sglang/srt/arg_groups/fields/spec.py`, commit
# 015c8726). `python/sglang/srt/speculative/adaptive_spec_params.py` (commit 015c8726),
# `_load_adaptive_config`: the keys that are integer strings are batch sizes, each
# `{"candidate_steps": [non-negative ints], ...}` (optional `ema_alpha`, `update_interval`,
# `warmup_batches`, `up_hysteresis`, `down_hysteresis`, `ceiling_coeff`); a top-level
# `"strategy"` is "ema" (default) or "throughput_aware" (in the stored source, in no wheel up to
# 0.5.23; none is written here); `adaptive_unsupported_reason` refuses adaptive mode unless
# topk = 1 and the algorithm is EAGLE/EAGLE3. `adaptive_step_router.py` (commit a12239f6) routes
# a batch to the largest key <= its size after CUDA-graph padding (the first key below that).
# `_init_adaptive_speculative_params` in `arg_groups/speculative_hook.py` (commit 004c82e0):
# `--speculative-num-steps` must be in the union of the candidate steps, and draft tokens become
# steps + 1. A slot with one candidate never moves: a fixed per-level schedule.
SCHEDULE_FILE = "sglang-adaptive-config.json"
SCHEDULE_TITLE = "SGLang: --speculative-adaptive-config"
SCHEDULE_ABOUT = (
    f"A JSON file (written next to this report as `{SCHEDULE_FILE}`), passed "
    f"with `--speculative-adaptive --speculative-adaptive-config PATH` (SGLang >= 0.5.13 "
    f"reads this format); topk = 1 only. "
    f"Keys are batch sizes: SGLang uses the largest key <= the batch size (after "
    f"CUDA-graph padding); one candidate per key pins that level's steps. Format as "
    f"read in sgl-project/sglang `speculative/adaptive_spec_params.py`.")


def adaptive_config(slots: Slots) -> dict[str, Any]:
    """SGLang's adaptive-config JSON: one candidate per slot (a fixed schedule)."""
    check_slots(slots)
    return {str(start): {"candidate_steps": [steps]} for start, steps in slots}

