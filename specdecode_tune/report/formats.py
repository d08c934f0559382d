"""A per-batch-size steps schedule in each engine's own format (docs/schedule.md).

A schedule here is `slots`: (running batch size where it starts, steps) ascending, the first
starting at 1; a slot holds from its start to the next slot's start - 1, the last one beyond.
Steps 0 means no drafting at those batch sizes. Each engine reads it differently:

- SGLang `--speculative-adaptive-config` (`adaptive_spec_params.py` `_load_adaptive_config`,
  `adaptive_step_router.py`): `{"<start>": {"candidate_steps": [steps]}}`; the largest key <=
  the batch (after CUDA-graph padding) picks the slot. Chains only (topk = 1).
- vLLM `num_speculative_tokens_per_batch_size` in `--speculative-config`
  (`vllm/config/speculative.py`, `vllm/v1/spec_decode/dynamic/utils.py`): `[[start, end, K],
  ...]`, inclusive ranges, sorted, not overlapping, the first starting at 1, K >= 0 and at most
  `num_speculative_tokens`; batches past the last range keep its K.
- TensorRT-LLM `draft_len_schedule` (`tensorrt_llm/llmapi/llm_args.py`
  `validate_draft_len_schedule_and_sort`, `tensorrt_llm/_torch/speculative/utils.py`
  `get_draft_len_for_batch_size`): `{end: draft_len}`; a batch takes the value of the first key
  >= it, and past the last key the draft length is 0 (speculation off; `min_draft_len` where an
  algorithm sets one). Keys >= 1, values >= 0; key 1 must be present and equal to
  `max_draft_len`, every value at most it: batch 1 must draft the most.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Slots = Sequence[tuple[int, int]]


def check_slots(slots: Slots) -> None:
    if not slots or slots[0][0] != 1:
        raise ValueError(f"a schedule starts at batch size 1, got {list(slots)}")
    starts = [s for s, _ in slots]
    if starts != sorted(set(starts)) or any(k < 0 for _, k in slots):
        raise ValueError(f"slot starts must increase and steps be >= 0, got {list(slots)}")


def sglang_config(slots: Slots) -> dict[str, Any]:
    """SGLang's adaptive-config JSON: one candidate per slot (a fixed schedule)."""
    check_slots(slots)
    return {str(start): {"candidate_steps": [steps]} for start, steps in slots}


def vllm_ranges(slots: Slots) -> list[list[int]]:
    """vLLM's `num_speculative_tokens_per_batch_size`: [start, end, K] inclusive ranges; the
    last range ends at its own start (vLLM keeps the last K past it)."""
    check_slots(slots)
    out = []
    for i, (start, steps) in enumerate(slots):
        end = slots[i + 1][0] - 1 if i + 1 < len(slots) else start
        out.append([start, end, steps])
    return out


def trtllm_schedule(slots: Slots, top_batch: int) -> tuple[dict[int, int] | None, str]:
    """(TensorRT-LLM's `draft_len_schedule`, '') or (None, why it cannot express `slots`).

    Keys are range ends; the last slot runs up to `top_batch` (the server's running limit),
    above which TensorRT-LLM drafts 0."""
    check_slots(slots)
    top = max(k for _, k in slots)
    if slots[0][1] != top:
        return None, (f"TensorRT-LLM cannot express this schedule: draft_len_schedule[1] must "
                      f"equal max_draft_len (its validator), so batch 1 must draft the most, "
                      f"but this schedule drafts {slots[0][1]} at batch 1 and {top} above it.")
    out: dict[int, int] = {1: slots[0][1]}
    for i, (start, steps) in enumerate(slots):
        end = slots[i + 1][0] - 1 if i + 1 < len(slots) else max(top_batch, start)
        out[end] = steps
    return dict(sorted(out.items())), ""


def trtllm_draft_len(schedule: dict[int, int], batch_size: int, min_draft_len: int = 0) -> int:
    """TensorRT-LLM's lookup (`get_draft_len_for_batch_size`): the first key >= the batch,
    `min_draft_len` past the last key. For tests of the format."""
    for key in sorted(schedule):
        if key >= batch_size:
            return max(schedule[key], min_draft_len)
    return min_draft_len


def vllm_k(ranges: Sequence[Sequence[int]], batch_size: int) -> int:
    """The K vLLM uses for a batch (`dynamic/utils.py`: the range holding it, else the last
    range's K past the end). For tests of the format."""
    for start, end, k in ranges:
        if start <= batch_size <= end:
            return int(k)
    return int(ranges[-1][2])


__all__ = ["check_slots", "sglang_config", "trtllm_draft_len", "trtllm_schedule",
           "vllm_k", "vllm_ranges"]
