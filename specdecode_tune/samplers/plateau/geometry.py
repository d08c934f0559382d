"""Plateau geometry: where an axis has flattened around the incumbent, and where to jump.

Terms, on one axis, using completed feasible trials only (levels: see `axes`):
- the *plateau* is the run of adjacent explored levels around the incumbent's level whose best
  scores are within the noise band of the incumbent's score; its *top* is its highest level;
- the *last step up* goes from the level below the top to the top; a plateau needs at least two
  levels (so that step exists) and `min_values` explored levels on the axis, and that step must
  gain less than the noise band.

The jump goes far, not to the next value: from top t (one level below it: s) to
max(t + 2, 2 t) on int axes (seed: 5 -> 10), max(t + 2 (t - s), 2 t) on float axes, fitted into
the incumbent's range for that axis (define-by-run ranges can depend on the other values, which
the jump inherits), then into the jump trial's own range at suggest time. It must land at least
two values and further than t - s beyond t, on a level nobody measured yet. Downward probes
mirror this: min(b - 2, b // 2).

A plateau is identified by its height (`blocked`): after a jump on an axis direction, the next
one there needs an incumbent better than that jump's incumbent by more than the noise band.

Scores are oriented (sign * value: higher is better) and compared as differences. What a score
is comes from the caller: the trial's value by default, or any other value per trial (`value`;
the sampler's per-level mode passes one concurrency level's log-speedup, `scales.Scale`), so one
geometry serves both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from optuna.distributions import BaseDistribution, IntDistribution
from optuna.trial import FrozenTrial

from ..history import value_of
from ..planned import fit_into
from .axes import Axis


@dataclass(frozen=True)
class Plateau:
    """A plateau found on one axis in one direction, and where to jump from it."""

    axis: str
    direction: str
    plateau_from: Any                  # the value next to the edge, inside the plateau
    plateau_to: Any                    # the edge (top when going up, bottom when going down)
    gain: float                        # score change of the last step onto the edge
    values: tuple[Any, ...]            # each level's best trial's value (what a reader sees)
    jump_to: Any
    incumbent_value: float             # the incumbent's value (not oriented) on the scale judged
    level: int | None = None           # the concurrency level judged; None: the trials' score


def find_plateau(
    axis: Axis,
    feasible: Sequence[FrozenTrial],
    complete: Sequence[FrozenTrial],
    incumbent: FrozenTrial,
    sign: float,
    band: float,
    direction: str,
    min_values: int,
    value: Callable[[FrozenTrial], float] = value_of,
) -> Plateau | None:
    """The plateau around `incumbent` on `axis` going `direction`, and its jump; None when there
    is none to probe. `feasible` are the trials that have a `value` (the incumbent among them);
    `complete` every completed trial, refused ones included (a point measured in any way is not
    jumped to)."""
    # Best oriented score and its value at each level of the axis.
    best: dict[float, tuple[float, float, int]] = {}
    for t in feasible:
        if axis.name not in t.params:
            continue
        at = t.params[axis.name]
        lvl = axis.level(at)
        cand = (sign * value(t), at, t.number)
        cur = best.get(lvl)
        if cur is None or cand[0] > cur[0] or (cand[0] == cur[0] and cand[2] < cur[2]):
            best[lvl] = cand
    levels = sorted(best)
    if len(levels) < min_values:
        return None
    inc_score = sign * value(incumbent)
    i_inc = levels.index(axis.level(incumbent.params[axis.name]))

    def flat(i: int) -> bool:
        return inc_score - best[levels[i]][0] <= band

    lo = hi = i_inc
    while hi + 1 < len(levels) and flat(hi + 1):
        hi += 1
    while lo - 1 >= 0 and flat(lo - 1):
        lo -= 1
    if hi == lo:
        return None  # the incumbent stands alone: no step of the plateau to judge
    edge, inner = (hi, hi - 1) if direction == "up" else (lo, lo + 1)
    gain = best[levels[edge]][0] - best[levels[inner]][0]
    if gain >= band:
        return None
    edge_value, inner_value = best[levels[edge]][1], best[levels[inner]][1]
    # The jump trial inherits the incumbent's other values, so its range for this axis is
    # (in a define-by-run space) the incumbent's: e.g. draft tokens <= 1 + topk + (steps - 1)
    # * topk^2.
    target = jump_target(
        axis, edge_value, inner_value, direction, incumbent.distributions[axis.name]
    )
    measured = {axis.level(t.params[axis.name]) for t in complete if axis.name in t.params}
    if target is None or axis.level(target) in measured:
        # Nothing beyond, or the base sampler already tried the jump's point (an infeasible
        # try included): that data point answers the question a probe would ask.
        return None
    return Plateau(
        axis=axis.name,
        direction=direction,
        plateau_from=inner_value,
        plateau_to=edge_value,
        gain=gain,
        values=tuple(best[lvl][1] for lvl in levels[lo : hi + 1]),
        jump_to=target,
        incumbent_value=value(incumbent),
    )


def jump_target(
    axis: Axis, edge: float, inner: float, direction: str, dist: BaseDistribution
) -> Any:
    """Far, not next: double the edge (halve it going down), at least two steps away; then fit
    into `dist`, the range the jump trial will see. None when that leaves no room beyond."""
    up = direction == "up"
    if axis.kind == "int":
        step = dist.step if isinstance(dist, IntDistribution) else 1
        raw = max(edge + 2 * step, 2 * edge) if up else min(edge - 2 * step, edge // 2)
    else:
        stride = 2 * abs(edge - inner)
        if up:
            raw = max(edge + stride, 2 * edge) if edge > 0 else edge + stride
        else:
            raw = min(edge - stride, edge / 2) if edge > 0 else edge - stride
    target = fit_into(raw, dist)
    if target is None or not beyond(target, edge, direction):
        return None
    # A jump must reach further past the edge than the plateau's own last step spans, and
    # (on int axes) skip at least one value: otherwise it is the next value, which the base
    # sampler explores anyway, or a "plateau" between two far-apart early samples.
    reach = abs(target - edge)
    if reach <= abs(edge - inner) or (axis.kind == "int" and reach < 2 * step):
        return None
    return target


def blocked(
    axis: str, direction: str, inc_score: float, sign: float, band: float,
    events: Sequence[dict[str, Any]], level: int | None = None,
) -> bool:
    """Whether an earlier jump on this axis direction, judged on the same scale (`level`: one
    concurrency level's score, None: the trials' score, as in events without a level), already
    answered for this plateau.

    A plateau is identified by its height, not by which of its values happen to be explored
    (a level sampled only with poor other parameters can split one plateau in two): a later
    jump needs an incumbent better than the earlier jump's incumbent by more than the noise
    band. An escape provides exactly that, so the logic restarts from the new region; a peak,
    an infeasible or a within-noise probe leaves the height unchanged and blocks."""
    return any(
        e["axis"] == axis
        and e["direction"] == direction
        and e.get("level") == level
        and inc_score - sign * e["incumbent_value"] <= band
        for e in events
    )


def beyond(value: float, edge: float, direction: str) -> bool:
    return value > edge if direction == "up" else value < edge
