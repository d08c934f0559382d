"""TensorRT-LLM: its per-batch-size draft-length schedule, the one thing of it the project uses.

No TensorRT-LLM server is booted by this project (it is no `backend.kind`); the report still
writes the per-level schedule in its format, so what TensorRT-LLM reads lives here, as each
served engine's format lives in its backend.

`draft_len_schedule` (`tensorrt_llm/llmapi/llm_args.py` `validate_draft_len_schedule_and_sort`,
`tensorrt_llm/_torch/speculative/utils.py` `get_draft_len_for_batch_size`): `{end: draft_len}`;
a batch takes the value of the first key >= it, and past the last key the draft length is 0
(speculation off; `min_draft_len` where an algorithm sets one). Keys >= 1, values >= 0; key 1
must be present and equal to `max_draft_len`, every value at most it: batch 1 must draft the
most.
"""

from __future__ import annotations

from typing import ClassVar

from ..config import BackendConfig
from .schedule import NOTHING, ScheduleAsk, ScheduleFile, Slots, check_slots

SCHEDULE_FILE = "trtllm-draft-len-schedule.json"
SCHEDULE_TITLE = "TensorRT-LLM: draft_len_schedule"
SCHEDULE_ABOUT = (
    f"A field of the speculative config (written as `{SCHEDULE_FILE}`): batch "
    f"size -> draft length, a batch taking the first key >= it and 0 (no speculation) "
    f"past the last key, which is the schedule server's running limit here; key 1 "
    f"equals max_draft_len. As read in NVIDIA/TensorRT-LLM `llmapi/llm_args.py` and "
    f"`_torch/speculative/utils.py` `get_draft_len_for_batch_size`.")
CANNOT = "Nothing to emit (TensorRT-LLM needs batch 1 to draft the most; see the notes above)."


def draft_len_schedule(slots: Slots, top_batch: int) -> tuple[dict[int, int] | None, str]:
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


def draft_len_for_batch(schedule: dict[int, int], batch_size: int,
                        min_draft_len: int = 0) -> int:
    """TensorRT-LLM's lookup (`get_draft_len_for_batch_size`): the first key >= the batch,
    `min_draft_len` past the last key. For tests of the format."""
    for key in sorted(schedule):
        if key >= batch_size:
            return max(schedule[key], min_draft_len)
    return min_draft_len


class TensorRTLLMSchedule:
    """TensorRT-LLM's schedule format (`schedule.WritesSchedule`); it has no command here."""

    name: ClassVar[str] = "trtllm"

    def schedule_file(self, cfg: BackendConfig | None, ask: ScheduleAsk | None
                      ) -> ScheduleFile:
        """The `draft_len_schedule` of `ask`, its last range ending at the schedule server's
        running limit (else at the last slot's start), or why TensorRT-LLM cannot say it."""
        if ask is None:
            return ScheduleFile(self.name, SCHEDULE_TITLE, SCHEDULE_FILE, None, NOTHING)
        top_batch = ask.running_limit if ask.running_limit is not None else ask.slots[-1][0]
        schedule, why = draft_len_schedule(ask.slots, top_batch)
        if schedule is None:
            return ScheduleFile(self.name, SCHEDULE_TITLE, SCHEDULE_FILE, None, CANNOT, why=why)
        return ScheduleFile(self.name, SCHEDULE_TITLE, SCHEDULE_FILE,
                            {"draft_len_schedule": schedule}, SCHEDULE_ABOUT)


__all__ = ["SCHEDULE_FILE", "TensorRTLLMSchedule", "draft_len_for_batch", "draft_len_schedule"]
