"""The bracket: after a far jump that came back no better, one boot in the middle of the stretch
the jump skipped.

A jump from the plateau's edge to the far end of an axis (steps 15 -> 24, say) that measured
within noise of the incumbent, or worse, answers "does the curve climb again out there?" with
no. It does not answer whether the curve rises and falls again between the two: every value in
between is unmeasured, and a model fitted to the two ends sees a line through them. On a real
server that is where a peak can hide (llama.cpp on an H200, `benchmarks/data/llamacpp-gpu-h200
.parquet`: steps 16 stands 7% above its neighbours and 6% above the far end, a shape of the
CUDA kernels no smooth model predicts). The bracket boots the middle of that stretch once
(every other parameter at the jump's incumbent's values, as the jump itself): the plateau
question is answered when the edge, the middle and the far end are measured.

One bracket per jump, only on integer axes, only where at least two values lie strictly between
the edge and the jump, none of them measured or running on the incumbent's line (same values of
every other parameter), and only for jumps found on the trials' score (a per-level jump's
stretch is the model's to search). The event records it (`bracket_trial`, `bracket_at`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from optuna.trial import FrozenTrial

from ...objective import pct
from .events import fmt

# Outcomes of a jump that leave the stretch behind it a question (`events.OUTCOMES`).
ASKS = ("within_noise", "peak")


def next_bracket(events: Sequence[dict[str, Any]], trials: Sequence[FrozenTrial], number: int
                 ) -> tuple[dict[str, Any], dict[str, Any], str] | None:
    """(the event, the point to boot, why) for the first jump whose stretch asks for a bracket,
    or None. `number`: the trial being planned (not counted as measuring anything)."""
    others = [t for t in trials if t.number != number and t.params]
    by_number = {t.number: t for t in others}
    for event in events:
        if event.get("outcome") not in ASKS or event.get("level") is not None \
                or "bracket_trial" in event:
            continue
        axis, edge, far = event["axis"], event["plateau_to"], event["jump_to"]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (edge, far)):
            continue
        lo, hi = min(edge, far), max(edge, far)
        if hi - lo < 3:
            continue
        incumbent = by_number.get(event["incumbent_trial"])
        if incumbent is None:
            continue
        line = {k: v for k, v in incumbent.params.items() if k != axis}
        if any(_on_line(t, axis, line) and lo < t.params[axis] < hi for t in others):
            continue
        middle = (lo + hi) // 2
        point = dict(incumbent.params)
        point[axis] = middle
        why = (f"bracket: the jump on {axis} to {fmt(far)} came back {_said(event)}; "
               f"{axis} {fmt(lo + 1)}..{fmt(hi - 1)} is unmeasured between the plateau's edge "
               f"and the jump: one boot in its middle, {axis}={fmt(middle)}, asks whether the "
               f"curve rises between them")
        return event, point, why
    return None


def _on_line(trial: FrozenTrial, axis: str, line: dict[str, Any]) -> bool:
    params = trial.params
    value = params.get(axis)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    return all(params.get(k) == v for k, v in line.items())


def _said(event: dict[str, Any]) -> str:
    delta = event.get("delta")
    said = "worse than" if event.get("outcome") == "peak" else "within noise of"
    return f"{said} the incumbent" + ("" if delta is None else f" ({pct(delta)})")
