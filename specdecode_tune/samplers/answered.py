"""Plateau questions the model answers without a boot, and when such an answer is checked.

The plateau probe (`plateau/`) asks "does the curve climb again beyond this plateau?" with one
far boot. Where the fitted model (`model/`) can already rule that climb out, the boot buys
nothing: the hybrid sampler asks the model first, and the probe costs a boot only where the
model cannot answer. The model answers a question (`answer`) only where all of these hold,
each a thing this run has measured, not assumed:

- the plateau's axis is one the model has a term for (steps, topk, draft tokens, memory);
- its predictions were checked against at least `MIN_CHECKED` boots of this run (the search
  records each boot's prediction before it runs: `PREDICTED_ATTR`), and their median error on
  the plateau's scale (the score, or that level's log tok/s) is inside the noise band: where
  the model's errors on this run are larger than the band, the jump is booted;
- something has shown the model right *there*: at least one boot at the jump's value of the
  axis or beyond it was predicted before it ran, and every such prediction was inside the band
  of what the boot measured. Nothing else stands in for it: a model fitted to the near side of
  a plateau extrapolates beyond it (the acceptance of draft positions never measured is a
  prior), and that is the question the probe exists to ask (the seed profile's 4 -> 10);
- the model's in-sample fit is good (`ModelGuidedSampler.fit_limit`), and over its joint
  posterior draws (`ModelGuidedSampler.pair_draws`) the jump beats the incumbent by more than
  the noise band in at most `P_CLIMB` of them.

Then the question is answered as *predicted*: an event with outcome "predicted", the
probability of a climb and the predicted change, and the reason, recorded as a jump's is
(`plateau/events.py`), but with no trial of its own; the trial planned next carries its verdict
(`PLATEAU_ANSWER_ATTR`) so that the search's tables and the report say which questions a boot
answered and which the model did.

Such an answer is checked by one boot (the jump it stood for, `check_due`) only if a later
measurement contradicts the model: a boot finished after the answer, beyond the plateau's edge
on that axis, that measured outside the band of its prediction; or the model, refitted to
everything measured since, no longer answers the question by the rules above.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from ..objective import pct
from ..space import DRAFT, MEM, STEPS, TOPK
from .history import is_feasible
from .model import ModelGuidedSampler
from .observations import BASELINE_ATTR, PREDICTED_ATTR, Baseline
from .plateau.events import fmt
from .plateau.geometry import Plateau, beyond
from .plateau.scales import level_tok_s

# The largest share of the model's posterior draws in which the jump may beat the incumbent by
# more than the noise band for the model to rule the climb out.
P_CLIMB = 0.05
# Boots of this run whose prediction was checked before the model's errors count as known.
MIN_CHECKED = 3
# The model's errors on this run are its latest predictions' (a fit to two points predicted
# the first ones; the model a question is put to is the one fitted to everything since).
RECENT = 5
# Trial user attr: the plateau questions the model answered while this trial was planned (a
# list of sentences; the search records them with the trial).
PLATEAU_ANSWER_ATTR = "plateau_answered"
# The event outcome of a question the model answered (`plateau.events.OUTCOMES` are a boot's).
PREDICTED = "predicted"

_MODEL_AXES = (STEPS, TOPK, DRAFT, MEM)


@dataclass(frozen=True)
class Answer:
    """The model's answer to one plateau question, or why the question needs a boot."""

    by_model: bool
    why: str                         # the model's evidence, or why it cannot answer
    p_climb: float | None = None     # share of draws where the jump climbs beyond the band
    delta: float | None = None       # the model's mean change, jump vs incumbent (scale units)


def errors(trials: Sequence[FrozenTrial], level: int | None,
           weights: Mapping[int, float] | None = None) -> list[tuple[FrozenTrial, float]]:
    """Each finished, measured trial with a prediction recorded before its boot, and the
    prediction's error on the scale, in trial order: at `level`, |log(predicted / measured
    tok/s)|; for the score (level None), the same log errors' weighted mean over the levels
    (`weights`, the objective's), signed before the absolute value, as the score weighs them.
    The mean model's tok/s is what is compared (the prediction's own "score" is a mean over
    posterior draws, which sits below the mean model's)."""
    out = []
    for t in sorted(trials, key=lambda t: t.number):
        pred = t.user_attrs.get(PREDICTED_ATTR)
        if t.state != TrialState.COMPLETE or not isinstance(pred, Mapping) or not is_feasible(t):
            continue
        tok = pred.get("tok_s") or {}
        measured = level_tok_s(t)
        logs = {}
        for c, m in measured.items():
            p = tok.get(str(c))
            if isinstance(p, (int, float)) and p > 0 and m > 0:
                logs[c] = math.log(float(p) / m)
        if level is not None:
            if level in logs:
                out.append((t, abs(logs[level])))
            continue
        w = dict(weights or {})
        if w and all(c in logs for c in w) and sum(w.values()) > 0:
            out.append((t, abs(sum(w[c] * logs[c] for c in w) / sum(w.values()))))
    return out


def answer(model: ModelGuidedSampler, study: Study, trials: Sequence[FrozenTrial],
           axis: str, direction: str, jump_to: Any, incumbent: Mapping[str, Any],
           level: int | None, band: float) -> Answer:
    """Whether the model answers "does the curve climb beyond the band at `axis`=`jump_to`
    (every other parameter at the `incumbent`'s values)?" without a boot (module docstring)."""
    to = f"{axis}={fmt(jump_to)}"
    if axis not in _MODEL_AXES:
        return Answer(False, f"the model has no term for {axis}")
    if study.direction.name.lower() != "maximize" and level is None:
        return Answer(False, "the model's score is maximized; this study minimizes")
    base = Baseline.from_attr(study.user_attrs.get(BASELINE_ATTR))
    errs = errors(trials, level, None if base is None else base.weights)
    scale = "score" if level is None else f"C={level} tok/s"
    if len(errs) < MIN_CHECKED:
        return Answer(False, f"the model's predictions were checked against {len(errs)} boot(s) "
                             f"of this run, fewer than {MIN_CHECKED}")
    recent = errs[-RECENT:]
    med = statistics.median(e for _, e in recent)
    if med > band:
        return Answer(False, f"the model's errors on this run ({scale}: median {med:.1%} over "
                             f"its last {len(recent)} predicted boots) are larger than the "
                             f"noise band (+-{band:.1%})")
    there = [(t, e) for t, e in errs if axis in t.params and (
        t.params[axis] == jump_to or beyond(t.params[axis], jump_to, direction))]
    if not there:
        return Answer(False, f"nothing has shown the model right at {to} or beyond: no boot "
                             f"there was predicted before it ran")
    worst_t, worst = max(there, key=lambda te: te[1])
    if worst > band:
        return Answer(False, f"the model missed trial {worst_t.number} at {axis}="
                             f"{fmt(worst_t.params[axis])} by {worst:.1%} ({scale}), more "
                             f"than the noise band")
    jump = dict(incumbent)
    jump[axis] = jump_to
    drawn = model.pair_draws(study, jump, incumbent, trials=trials)
    if isinstance(drawn, str):
        return Answer(False, drawn)
    fit, levels, scores, ok = drawn
    limit = model.fit_limit(study)
    if fit.rms > limit:
        return Answer(False, f"the model's fit error {fit.rms:.1%} is over its limit "
                             f"{limit:.1%}")
    if level is None:
        diff = scores[:, 0] - scores[:, 1]
    elif level in levels:
        diff = levels[level][:, 0] - levels[level][:, 1]
    else:
        return Answer(False, f"the model predicts no C={level}")
    boots = ok[:, 1]
    if boots.mean() < 0.5:
        return Answer(False, "the model does not expect the incumbent to boot")
    both = boots & ok[:, 0]
    climb = both & (diff > band)
    p = float(climb.sum() / boots.sum())
    delta = float(np.mean(diff[both])) if both.any() else None
    shown = (f"the model's errors on this run ({scale}): median {med:.1%} over its last "
             f"{len(recent)} predicted boots, at most {worst:.1%} over the {len(there)} at {to} "
             f"or beyond")
    said = "" if delta is None else f", predicted {pct(delta)}"
    if p > P_CLIMB:
        return Answer(False, f"the model cannot rule out a climb beyond the noise band at {to} "
                             f"(probability {p:.0%}{said})", p, delta)
    return Answer(True, f"a climb beyond the noise band at {to} has probability {p:.0%} under "
                        f"the model{said}; {shown}", p, delta)


def record(event: dict[str, Any], ans: Answer, number: int) -> None:
    """Turn a jump's event (`plateau.events.new_event`) into the model's answer: no trial of
    its own (`trial_number` None), asked while trial `number` was planned."""
    head = "" if event.get("level") is None else f"C={event['level']}: "
    span = event["plateau_values"]
    where = (f"{head}{event['axis']}={fmt(span[0])}..{fmt(span[-1])} (best at "
             f"{fmt(event['incumbent_at'])})")
    said = "a peak" if (ans.delta is not None and ans.delta < -event["noise_band"]) \
        else "no climb beyond the noise band"
    event.update({
        "trial_number": None, "answered_at": number, "answered_by": "model",
        "outcome": PREDICTED, "p_climb": ans.p_climb, "delta": ans.delta,
        "verdict": (f"{where}: predicted {said} at {event['axis']}={fmt(event['jump_to'])}, "
                    f"answered by the model without a boot: {ans.why}"),
    })
    event["reason"] = event["verdict"]


def contradiction(event: dict[str, Any], trials: Sequence[FrozenTrial],
                  weights: Mapping[int, float] | None) -> str | None:
    """A boot finished after the model answered `event` that contradicts the model beyond the
    plateau's edge (its measurement outside the band of its prediction); None if none."""
    axis, level, band = event["axis"], event.get("level"), event["noise_band"]
    for t, e in errors(trials, level, weights):
        if t.number <= event["answered_at"] or axis not in t.params:
            continue
        if beyond(t.params[axis], event["plateau_to"], event["direction"]) and e > band:
            return (f"trial {t.number} at {axis}={fmt(t.params[axis])} measured {e:.1%} off the "
                    f"model's prediction, more than the noise band")
    return None


def answered(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events the model answered and no boot has checked yet."""
    return [e for e in events if e.get("outcome") == PREDICTED and not e.get("check")]


def plateau_of(event: dict[str, Any]) -> Plateau:
    """The plateau an event was found on (what `plateau.events.new_event` recorded)."""
    return Plateau(axis=event["axis"], direction=event["direction"],
                   plateau_from=event["plateau_from"], plateau_to=event["plateau_to"],
                   gain=event["gain"], values=tuple(event["plateau_values"]),
                   jump_to=event["jump_to"], incumbent_value=event["incumbent_value"],
                   level=event.get("level"))
