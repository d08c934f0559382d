"""What a plateau is judged on: the trials' score, or one concurrency level's own score.

Under `[objective] kind = "schedule"` a per-batch-size schedule runs, at each concurrency level,
the best configuration for that level, so the question "is this plateau a peak?" is asked of
each level's own curve, not only of the weighted score (where a level that still climbs can be
hidden by one that falls). A `Scale` is one such curve:

- the *score*: each feasible trial's value (`history.is_feasible`), oriented by the study's
  direction, the incumbent as `history.incumbent` picks it: what scalar mode has always used;
- a *level* C: the trial's log-speedup over the baseline at C, log(tok_s_C / baseline_C), from
  the trial's "measured" attr and the study's "baseline" attr (`observations`); higher is
  better whatever the study's direction. A trial counts at C when it counts for the score, its
  boot was "ok" and it measured C (closed loop, not suspect); the search's re-measurements
  answered from another trial's boot carry no "measured" attr, so a boot never counts twice.
  The level's incumbent is its best such trial (the earlier one on a tie).

The levels are the baseline's, ascending. Without a baseline (none measured yet) there are no
level scales, only the score's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from optuna.study import Study
from optuna.trial import FrozenTrial

from ..history import is_feasible, orientation, value_of
from ..observations import BASELINE_ATTR, MEASURED_ATTR, Baseline, Measured


@dataclass(frozen=True)
class Scale:
    """One curve the plateau logic judges: its values per trial and how to orient them."""

    level: int | None                  # the concurrency level; None: the trials' score
    sign: float                        # sign * value is higher-is-better
    values: Mapping[int, float]        # trial number -> value, for the trials that count
    baseline_tok_s: float | None = None    # the level's baseline tok/s (None for the score)

    def value(self, t: FrozenTrial) -> float:
        return self.values[t.number]

    def feasible(self, trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
        return [t for t in trials if t.number in self.values]

    def incumbent(self, trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
        """The best trial on this scale, the earlier one on a tie; None before there is one."""
        feasible = self.feasible(trials)
        if not feasible:
            return None
        return min(feasible, key=lambda t: (-self.sign * self.values[t.number], t.number))


def score_scale(study: Study, trials: Sequence[FrozenTrial]) -> Scale:
    return Scale(None, orientation(study),
                 {t.number: value_of(t) for t in trials if is_feasible(t)})


def level_scales(study: Study, trials: Sequence[FrozenTrial]) -> list[Scale]:
    """One scale per level of the study's baseline, ascending concurrency."""
    base = _baseline(study)
    if base is None:
        return []
    levels = sorted(c for c, v in base.tok_s.items() if v > 0)
    values: dict[int, dict[int, float]] = {c: {} for c in levels}
    for t in trials:
        if not is_feasible(t):
            continue
        for c, tok_s in level_tok_s(t).items():
            if c in values:
                values[c][t.number] = math.log(tok_s / base.tok_s[c])
    return [Scale(c, 1.0, values[c], base.tok_s[c]) for c in levels]


def baseline_tok_s(study: Study, level: int) -> float | None:
    """The baseline's tok/s at `level`, or None where it has none."""
    base = _baseline(study)
    return None if base is None else base.tok_s.get(level)


def _baseline(study: Study) -> Baseline | None:
    return Baseline.from_attr(study.user_attrs.get(BASELINE_ATTR))


def level_tok_s(trial: FrozenTrial) -> dict[int, float]:
    """The closed-loop tok/s the trial measured at each level; empty for a boot that was not
    "ok" or a trial without the "measured" attr."""
    m = Measured.from_attr(trial.user_attrs.get(MEASURED_ATTR))
    if m is None or not m.feasible:
        return {}
    return {lv.concurrency: lv.tok_s for lv in m.levels if lv.tok_s > 0}


def level_value(trial: FrozenTrial, level: int, baseline_tok_s: float) -> float | None:
    """The trial's log-speedup at `level`, or None where it did not measure that level."""
    tok_s = level_tok_s(trial).get(level)
    return None if tok_s is None or baseline_tok_s <= 0 else math.log(tok_s / baseline_tok_s)
