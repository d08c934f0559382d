"""SGLang's adaptive speculative mode (`--speculative-adaptive`), as the simulator runs it.

What SGLang does (docs/schedule.md has the sources, file by file):

- `--speculative-adaptive-config PATH` is a JSON object; its integer-string keys are batch
  sizes, each `{"candidate_steps": [non-negative ints], ...}` (`adaptive_spec_params.py`
  `_load_adaptive_config`: anything else in a slot is a ValueError; no integer key at all is a
  ValueError; other top-level keys are defaults merged into every slot).
- Each decode batch is routed to one slot: its size is first padded up to the next CUDA-graph
  batch size (when one is captured that large), then the slot is the largest key <= that size,
  or the smallest key when every key is larger (`adaptive_step_router.py`
  `AdaptiveStepRouter.batch_size_key_for_batch`). A slot with one candidate always runs it: a
  fixed per-batch-size schedule, which is what the project emits. A slot with several
  candidates moves between them by an EMA of the accepted length (`AdaptiveStepSlot`); the
  simulator runs only one-candidate slots and refuses others (it would have to copy the EMA).
- Start-up (`_init_adaptive_speculative_params`): `--speculative-num-steps` must be one of the
  union of the candidates, topk defaults to 1, draft tokens = steps + 1. Adaptive mode needs
  EAGLE/EAGLE3 and topk = 1; anything else only logs "speculative_adaptive disabled: ...
  Falling back to static speculative params." and runs the static server
  (`_maybe_disable_adaptive`, `adaptive_unsupported_reason`).
- Costs: the shared buffers are sized for `max(candidate_steps) + 1` draft tokens
  (`max_speculative_num_draft_tokens`), and one runtime state per candidate is captured, its
  CUDA graphs for the graph batch sizes that route to a slot holding it
  (`AdaptiveController.init_states`, `cuda_graph_bs_for_step`). A switch swaps references to
  the prebuilt state (`apply_runtime_state`): no recapture, no per-step cost in the source.

The flags exist from SGLang 0.5.11; the per-batch-size format is read from 0.5.13 (0.5.11 and
0.5.12 read one flat object). The simulator takes them for an emulated release >= 0.5.13.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from typing import Any

ADAPTIVE_FLAGS_SINCE = (0, 5, 11)
ADAPTIVE_PER_BATCH_SIZE_SINCE = (0, 5, 13)
ADAPTIVE_ALGORITHMS = ("EAGLE", "EAGLE3")


class AdaptiveConfigError(ValueError):
    """SGLang's ValueError for an adaptive config it cannot load (its words)."""


@dataclass(frozen=True, slots=True)
class Schedule:
    """A loaded per-batch-size schedule: (batch-size key, steps) ascending, one candidate per
    slot, and the CUDA-graph batch sizes the router pads to."""

    slots: tuple[tuple[int, int], ...]
    cuda_graph_bs: tuple[int, ...]

    @property
    def candidate_steps(self) -> tuple[int, ...]:
        return tuple(sorted({s for _, s in self.slots}))

    @property
    def max_steps(self) -> int:
        return max(s for _, s in self.slots)

    def key_for_batch(self, batch_size: int) -> int:
        """SGLang's `batch_size_key_for_batch`: pad to the CUDA-graph size, then the largest
        key <= it (the smallest key below every key)."""
        size = batch_size
        if self.cuda_graph_bs:
            i = bisect.bisect_left(self.cuda_graph_bs, size)
            if i < len(self.cuda_graph_bs):
                size = self.cuda_graph_bs[i]
        keys = [k for k, _ in self.slots]
        return keys[max(0, bisect.bisect_right(keys, size) - 1)]

    def steps_for_batch(self, batch_size: int) -> int:
        key = self.key_for_batch(batch_size)
        return next(s for k, s in self.slots if k == key)

    def graph_bs_for_step(self, steps: int) -> tuple[int, ...]:
        """The CUDA-graph batch sizes whose slot holds `steps` (SGLang captures those only)."""
        return tuple(b for b in self.cuda_graph_bs if self.steps_for_batch(b) == steps)


def spec_capture_bs(cuda_graph_max_bs: int) -> tuple[int, ...]:
    """SGLang's CUDA-graph batch sizes with speculation (`ServerArgs.
    _generate_cuda_graph_batch_sizes`, the speculative branch), up to cuda_graph_max_bs."""
    sizes = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4))
             + list(range(72, 257, 8)) + list(range(272, max(cuda_graph_max_bs, 272) + 1, 16)))
    out = sorted({b for b in sizes if b <= cuda_graph_max_bs})
    if not out or out[-1] != cuda_graph_max_bs:
        out.append(cuda_graph_max_bs)
    return tuple(out)


def parse_config(content: Any) -> list[tuple[int, list[int]]]:
    """The slots of an adaptive config as SGLang's `_load_adaptive_config` keeps them, or
    AdaptiveConfigError in its words."""
    if not isinstance(content, dict):
        raise AdaptiveConfigError("speculative adaptive config must be a JSON object, got "
                                  f"{type(content).__name__}")
    slots: list[tuple[int, list[int]]] = []
    for key, entry in content.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if (not isinstance(steps, list) or not steps
                or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                           for s in steps)):
            raise AdaptiveConfigError(f"BS {key}: candidate_steps must be a list of "
                                      f"non-negative ints, got {steps!r}")
        slots.append((int(key), sorted(set(steps))))
    if not slots:
        raise AdaptiveConfigError(
            "speculative_adaptive_config must contain at least one integer-string BS key, "
            'e.g. {"1": {"candidate_steps": [1,3,7]}}. '
            f"Got keys: {list(content.keys())}")
    return sorted(slots)


def load_schedule(path: str, cuda_graph_max_bs: int) -> Schedule:
    """Read the file as SGLang does; AdaptiveConfigError (SGLang's words, or the file's
    problem) where it cannot. Slots with several candidates are refused: the simulator does
    not run the EMA policy."""
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except OSError as e:
        raise AdaptiveConfigError(f"[Errno {e.errno}] {e.strerror}: {path!r}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AdaptiveConfigError(f"{path}: not JSON ({e})") from None
    slots = parse_config(content)
    multi = [k for k, s in slots if len(s) > 1]
    if multi:
        raise AdaptiveConfigError(
            f"BS {multi[0]}: the simulator runs one candidate per slot (a fixed per-batch-size "
            f"schedule); SGLang would move between {dict(slots)[multi[0]]} by an EMA of the "
            f"accepted length, which the simulator does not imitate")
    return Schedule(slots=tuple((k, s[0]) for k, s in slots),
                    cuda_graph_bs=spec_capture_bs(cuda_graph_max_bs))


def unsupported_reason(algorithm: str | None, topk: int | None) -> str | None:
    """SGLang's `adaptive_unsupported_reason` for what the simulator models."""
    if algorithm not in ADAPTIVE_ALGORITHMS:
        return f"speculative_algorithm={algorithm} (only EAGLE/EAGLE3 are supported)"
    if topk is not None and topk != 1:
        return f"speculative_eagle_topk={topk} (only topk=1 is supported)"
    return None


def release_key(version: str) -> tuple[int, ...]:
    """'0.5.13' / '0.5.10.post1' -> (0, 5, 13) / (0, 5, 10)."""
    parts = []
    for p in version.split("."):
        if not p.isdigit():
            break
        parts.append(int(p))
    return tuple(parts)
