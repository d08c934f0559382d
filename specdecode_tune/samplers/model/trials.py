"""The measured trials and the baseline as the model reads them from the study's attrs.

A trial is one speculative configuration (`TrialObs`): its steps, topk, draft tokens and memory
fraction (from the resolved params it measured, else the trial's own), whether it booted, what
kind of refusal stopped it (out of memory, or not enough KV memory: the model draws different
conclusions from each), the KV facts, the memory a boot left free and its CUDA graphs kept where
the engine logs them (`oom.py` reads the boundary from them), and the closed-loop levels sorted
by concurrency. The baseline trial, and a "measured" attr the model cannot read, give no
TrialObs.

The baseline scores the model's predictions: it needs a throughput at every weighted level
(`scoring_baseline`; levels of weight 0 do not count, and no weights means each level weighs 1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...space import DRAFT, MEM, STEPS, TOPK, is_baseline
from ..observations import Baseline, LevelObs, Measured
from .candidates import point_key


@dataclass(frozen=True)
class TrialObs:
    """One measured trial, as the model sees it."""

    steps: int
    topk: int
    draft: int
    mem: float | None
    feasible: bool
    failure: str | None            # "oom" | "kv" | "other" for refused boots
    kv: int | None
    limit: int | None
    levels: tuple[LevelObs, ...]
    room: float | None = None      # how far mem could rise before this boot ran out of memory,
                                   # at most (the engine's memory lines; booted trials only)
    graph: float | None = None     # what its CUDA graphs kept, likewise (the same units)

    @property
    def key(self) -> tuple:
        return point_key(self.steps, self.topk, self.draft, self.mem)

    @classmethod
    def of(cls, measured: Measured, fallback_params: Mapping[str, Any]) -> TrialObs | None:
        """None for the baseline, or a trial whose params name no speculative triple."""
        params = measured.params or fallback_params
        if is_baseline(params):
            return None
        try:
            steps, topk = int(params[STEPS]), int(params.get(TOPK, 1))
            draft = int(params.get(DRAFT, steps + 1))
        except (KeyError, TypeError, ValueError):
            return None
        mem = params.get(MEM)
        refused = not measured.feasible and measured.status == "infeasible"
        return cls(
            steps=steps, topk=topk, draft=draft, mem=None if mem is None else float(mem),
            feasible=measured.feasible,
            failure=failure_kind(measured.reason) if refused else None,
            kv=measured.kv, limit=measured.limit,
            levels=tuple(sorted(measured.levels, key=lambda lv: lv.concurrency)),
            room=measured.room if measured.feasible else None,
            graph=measured.graph if measured.feasible else None,
        )


def failure_kind(reason: str) -> str:
    """"oom" (out of memory), "kv" (not enough KV memory) or "other", from a refusal."""
    text = reason.lower()
    if "out of memory" in text or "outofmemory" in text or text.startswith("oom"):
        return "oom"
    if "not enough memory" in text or text.startswith("kv_memory"):
        return "kv"
    return "other"


def parse_measured(value: Any, fallback_params: Mapping[str, Any]) -> TrialObs | None:
    """A TrialObs from the "measured" attr; None for the baseline or an unusable attr."""
    measured = Measured.from_attr(value)
    return None if measured is None else TrialObs.of(measured, fallback_params)


def scoring_baseline(base: Baseline | None) -> Baseline | None:
    """The baseline the model scores against; None where it cannot score (see above)."""
    if base is None:
        return None
    tok_s = {c: v for c, v in base.tok_s.items() if v}
    if not tok_s:
        return None
    weights = {c: w for c, w in base.weights.items() if w > 0} or {c: 1.0 for c in tok_s}
    if any(c not in tok_s for c in weights):
        return None       # a weighted level the baseline did not measure: no score to predict
    return dataclasses.replace(base, tok_s=tok_s, weights=weights)


def parse_baseline(value: Any) -> Baseline | None:
    """The scoring baseline from the study's "baseline" attr."""
    return scoring_baseline(Baseline.from_attr(value))
