"""Jump events: the plateau sampler's record of each probe, kept in the study, and verdicts.

`study.user_attrs["plateau_events"]` is the list of jumps (JSON), one dict each:

    axis, direction ("up" | "down"), plateau_from, plateau_to, plateau_values (each plateau
    level's best value), gain (of the last step onto the edge), noise_band, jump_to (where the
    trial landed, once it is clamped into its range), trial_number, incumbent_trial,
    incumbent_value, study_direction ("maximize" | "minimize"), incumbent_at (the incumbent's
    value on the axis), reason (a sentence), outcome (None while the probe runs, then one of
    OUTCOMES), delta (oriented score change vs the incumbent), value, verdict (a sentence),
    level (the concurrency level whose own score the plateau was found on, `scales`; None for
    the trials' score, and absent in events written before levels existed, which are the
    score's), baseline_tok_s (that level's baseline tok/s, the reference of its values).

On a level, incumbent_value, value and delta are that level's log-speedup over the baseline
(higher is better whatever the study's direction), the incumbent is the level's own, the
reason and the verdict name the level, and the outcome is judged on the probe's value there.

Each jump trial also carries its reason and its outcome as user attrs (`jump_reason`,
`jump_outcome`). Outcomes:
- peak: worse than the incumbent by more than the noise band; infeasible: the server refused
  it (both: the plateau is a peak; that direction is not probed again from it);
- escaped: better by more than the noise band (a new region; the base sampler takes over);
- within_noise: neither; not escaped, not probed again;
- failed: ended without a score; unreachable: the trial's own range had no room beyond.
"""

from __future__ import annotations

from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from ...objective import pct
from .geometry import Plateau, beyond
from .scales import level_value

EVENTS_ATTR = "plateau_events"        # study user attr: list of jump events (JSON)
JUMP_REASON_ATTR = "jump_reason"      # trial user attr: why this trial is a jump (a sentence)
JUMP_OUTCOME_ATTR = "jump_outcome"    # trial user attr: one of OUTCOMES once resolved
OUTCOMES = ("peak", "escaped", "within_noise", "infeasible", "failed", "unreachable")


def new_event(
    study: Study, trial: FrozenTrial, plateau: Plateau, incumbent: FrozenTrial, band: float,
    baseline_tok_s: float | None = None,
) -> dict[str, Any]:
    """The event of a jump decided for `trial`, unresolved. `baseline_tok_s`: the level's
    baseline, for a plateau found on a level's own score (`plateau.level`)."""
    return {
        "axis": plateau.axis,
        "direction": plateau.direction,
        "plateau_from": plateau.plateau_from,
        "plateau_to": plateau.plateau_to,
        "plateau_values": list(plateau.values),
        "gain": plateau.gain,
        "noise_band": band,
        "jump_to": plateau.jump_to,
        "trial_number": trial.number,
        "incumbent_trial": incumbent.number,
        "incumbent_value": plateau.incumbent_value,
        "study_direction": study.direction.name.lower(),
        "incumbent_at": incumbent.params[plateau.axis],
        "reason": reason(plateau, band),
        "outcome": None,
        "delta": None,
        "value": None,
        "verdict": None,
        "level": plateau.level,
        "baseline_tok_s": baseline_tok_s,
    }


def reason(p: Plateau, band: float) -> str:
    where = "jumping to" if p.direction == "up" else "jumping down to"
    at = "" if p.level is None else f" at C={p.level}"
    return (
        f"plateau{at} on {p.axis}: {fmt(p.plateau_from)} -> {fmt(p.plateau_to)} gained "
        f"{pct(p.gain)} (noise band +-{band:.1%}); {where} {fmt(p.jump_to)}"
    )


def retarget(event: dict[str, Any], value: Any) -> None:
    """The trial's own range moved the jump (clamped, snapped) to `value`: say where it landed."""
    old = fmt(event["jump_to"])
    event["jump_to"] = value
    event["reason"] = event["reason"].replace(
        f"jumping to {old}", f"jumping to {fmt(value)} (clamped from {old})"
    ).replace(
        f"jumping down to {old}", f"jumping down to {fmt(value)} (clamped from {old})"
    )


def mark_unreachable(event: dict[str, Any], distribution: BaseDistribution) -> None:
    """The trial's own range has no room beyond the plateau: it re-measures the incumbent."""
    event["outcome"] = "unreachable"
    event["verdict"] = (
        f"{at_level(event)}jump on {event['axis']} to {fmt(event['jump_to'])} unreachable: "
        f"this trial's range is {describe(distribution)}; the trial re-measures the incumbent"
    )
    event["reason"] = f"{event['reason']}; {event['verdict']}"


def resolve(
    event: dict[str, Any], state: TrialState, value: float | None, trial: FrozenTrial
) -> None:
    """Fill in the outcome of a finished jump trial. `value` is the trial's score; an event
    found on a level is judged on the trial's own value at that level instead."""
    axis, band = event["axis"], event["noise_band"]
    at, to = fmt(event["incumbent_at"]), fmt(event["jump_to"])
    span = event["plateau_values"]
    head = at_level(event)
    where = f"{head}{axis}={fmt(span[0])}..{fmt(span[-1])} (best at {at})"
    landed = trial.params.get(axis)
    reached = landed is not None and beyond(landed, event["plateau_to"], event["direction"])
    # A refused config may come back with or without a score: the constraint decides.
    if reached and any(c > 0 for c in trial.constraints.values()):
        event["outcome"] = "infeasible"
        event["verdict"] = (
            f"{where} is a peak: probe at {axis}={to} is infeasible (the server refused it)"
        )
        return
    level = event.get("level")
    missing = "a score"
    sign = -1.0 if event["study_direction"] == "minimize" else 1.0
    if level is not None:
        missing, sign = f"a measurement at C={level}", 1.0
        value = None if state != TrialState.COMPLETE or value is None else level_value(
            trial, level, event["baseline_tok_s"])
    if state != TrialState.COMPLETE or value is None:
        event["outcome"] = "failed"
        event["verdict"] = (
            f"{head}probe at {axis}={to} ended {state.name} without {missing}; "
            f"not probed again from {axis}={fmt(event['plateau_to'])}"
        )
        return
    if not reached:
        event["outcome"] = "unreachable"
        event["verdict"] = f"{head}the trial did not reach {axis}={to}"
        return
    event["value"] = float(value)
    delta = sign * (float(value) - event["incumbent_value"])
    event["delta"] = delta
    tail = f"probe at {axis}={to}: {pct(delta)} (noise band +-{band:.1%})"
    if delta < -band:
        event["outcome"] = "peak"
        event["verdict"] = f"{where} is a peak; {tail}"
    elif delta > band:
        event["outcome"] = "escaped"
        event["verdict"] = (
            f"{head}escaped the plateau at {axis}={fmt(event['plateau_to'])}; {tail}"
        )
    else:
        event["outcome"] = "within_noise"
        event["verdict"] = f"{where} vs {axis}={to} is within noise; {tail}"


def at_level(event: dict[str, Any]) -> str:
    """'C=1: ' for an event found on a level's own score; '' for the trials' score."""
    level = event.get("level")
    return "" if level is None else f"C={level}: "


def load_events(study: Study) -> list[dict[str, Any]]:
    return [dict(e) for e in study.user_attrs.get(EVENTS_ATTR, [])]


def save_events(study: Study, events: list[dict[str, Any]]) -> None:
    study.set_user_attr(EVENTS_ATTR, events)


def event_of(events: list[dict[str, Any]], trial_number: int) -> dict[str, Any] | None:
    for e in events:
        if e["trial_number"] == trial_number:
            return e
    return None


def fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def describe(dist: BaseDistribution) -> str:
    if isinstance(dist, CategoricalDistribution):
        return f"{list(dist.choices)}"
    return f"[{fmt(dist.low)}, {fmt(dist.high)}]"  # type: ignore[attr-defined]
