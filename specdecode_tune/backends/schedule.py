"""A per-batch-size steps schedule as an engine reads it: what the report asks an engine's
backend for, and what the backend gives back (docs/schedule.md).

A schedule here is `slots`: (running batch size where it starts, steps) ascending, the first
starting at 1; a slot holds from its start to the next slot's start - 1, the last one beyond.
Steps 0 means no drafting at those batch sizes. Each engine reads it in its own format, which
its backend knows (`schedule_file`): SGLang's adaptive config (backends/sglang.py), vLLM's
`num_speculative_tokens_per_batch_size` (backends/vllm.py), TensorRT-LLM's
`draft_len_schedule` (backends/trtllm.py). The report and the search's validation trial
render and boot what the backends return, and name no engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..config import BackendConfig

Slots = Sequence[tuple[int, int]]

# What the report says for an engine's format where there is no schedule to write.
NOTHING = "Nothing to emit (see the notes above)."


def check_slots(slots: Slots) -> None:
    if not slots or slots[0][0] != 1:
        raise ValueError(f"a schedule starts at batch size 1, got {list(slots)}")
    starts = [s for s, _ in slots]
    if starts != sorted(set(starts)) or any(k < 0 for _, k in slots):
        raise ValueError(f"slot starts must increase and steps be >= 0, got {list(slots)}")


@dataclass(frozen=True)
class ScheduleAsk:
    """The schedule the report asks each engine to write, engine-neutral."""

    slots: tuple[tuple[int, int], ...]
    # The schedule server's settings: the recommended config's, a chain (topk 1) at the first
    # drafting level's steps (an engine that boots the schedule starts there).
    params: Mapping[str, Any] = field(default_factory=dict)
    # The largest steps of any level (an engine that sizes its buffers for it wants it).
    top_steps: int = 0
    # The schedule server's running limit where it was measured (at the largest steps).
    running_limit: int | None = None


@dataclass(frozen=True)
class ScheduleFile:
    """One engine's schedule file: what the report writes beside itself and renders."""

    engine: str                       # the engine that reads it ("sglang", "vllm", ...)
    title: str                        # the report's heading for it
    file_name: str                    # written beside the report under this name
    content: dict[str, Any] | None    # the JSON; None where there is nothing to write
    about: str                        # the report's paragraph: what it is, or why nothing
    command: str | None = None        # the command that boots it, where there is one
    why: str = ""                     # why this engine cannot express the schedule (a note)


@runtime_checkable
class WritesSchedule(Protocol):
    """An engine whose per-batch-size schedule format the report writes."""

    def schedule_file(self, cfg: BackendConfig | None, ask: ScheduleAsk | None
                      ) -> ScheduleFile | None:
        """This engine's file for `ask` (None: no schedule, which the file says), for an
        experiment of any engine (`cfg`, None where the run has none); its command where this
        engine can serve it for `cfg`. None where the engine reads no such schedule."""


__all__ = ["NOTHING", "ScheduleAsk", "ScheduleFile", "Slots", "WritesSchedule", "check_slots"]
