"""`PlateauEscapeSampler`: decides when to probe beyond a plateau, and runs the probe.

Before each fresh trial it looks, axis by axis and direction by direction, for a plateau around
the incumbent (`geometry`); the first one found becomes a jump: a plan on the trial (the axis's
far value, every other parameter at the incumbent's values) and an event in the study
(`events`). Rules that keep the probes few: one unresolved jump at a time (in the whole study:
a second jump decided while the first runs would be decided without the first one's answer);
enqueued trials are never jumps; an answered plateau is not probed again from the same height.

Per-level mode (`per_level=True`, set by the search for `[objective] kind = "schedule"`): a
schedule runs each concurrency level's best config, so the plateaus looked for are each level's
own (`scales`: that level's log-speedup over the baseline, around that level's incumbent), the
levels in ascending concurrency, then the score's as in scalar mode. Low levels first: that is
where a schedule's gain lies (a long draft pays at batch 1 and costs at large batches, where
the verify step is shared), and where the score, a mean over the levels, can hide a curve that
still climbs behind one that falls. The score last, so that per-level mode asks every question
scalar mode asks (the static config the report sets the schedule against is the score's best).
The jump itself is the same (`geometry`); its event names the level, and `blocked` holds per
axis, direction and level. A level probe aimed at a value some trial measured already is not
made (that trial answers it), so levels whose plateaus end at the same place share one probe.
One probe at a time, whatever its level.

The noise band measured by the search (`study.user_attrs["noise_band"]`) takes precedence over
the constructor's. It is the score's; per-level mode uses it at every level (the search
measures no band per level). A jump whose trial finished without this instance's `after_trial`
(told through another sampler instance before a resume) is resolved before the next decision.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from ..history import distributions, union_spec
from ..observations import NOISE_BAND_ATTR
from ..planned import PlannedSampler, fit_into, set_trial_user_attr
from . import events as ev
from .axes import Axis
from .geometry import Plateau, beyond, blocked, find_plateau
from .scales import Scale, baseline_tok_s, level_scales, score_scale

DIRECTIONS = ("up", "down")


class PlateauEscapeSampler(PlannedSampler):
    """A wrapper over `base_sampler` that proposes one far jump beyond each plateau.

    Args:
        base_sampler: the sampler for every trial that is not a jump (default:
            `TPESampler(seed=seed)`).
        ordinal_params: the axes to watch; default: every int / float parameter seen
            (categoricals are excluded unless named here and all their choices are numbers).
        noise_band: score difference below which a step counts as flat; the study user attr
            "noise_band", when present, takes precedence.
        min_values_before_jump: explored values an axis needs before a plateau can be declared.
        probe_downward: also jump below a plateau at the bottom of an axis (mirror rule).
        seed: seeds the default base sampler. Unused when `base_sampler` is given (seed that
            one yourself): the plateau logic has no randomness of its own.
        per_level: also look for plateaus on each concurrency level's own score, lowest level
            first, then the score's (`[objective] kind = "schedule"`; see the module docstring).
    """

    plan_key = "plateau_escape:plan"   # trial system attr: the jump (see `_start_jump`)

    def __init__(
        self,
        base_sampler: BaseSampler | None = None,
        *,
        ordinal_params: Sequence[str] | None = None,
        noise_band: float = 0.025,
        min_values_before_jump: int = 3,
        probe_downward: bool = False,
        seed: int | None = None,
        per_level: bool = False,
    ) -> None:
        super().__init__(base_sampler, seed)
        check_band(noise_band, "noise_band")
        if isinstance(min_values_before_jump, bool) or not isinstance(
            min_values_before_jump, int
        ) or min_values_before_jump < 2:
            raise ValueError(
                f"min_values_before_jump must be an int >= 2 (a step needs two values), "
                f"got {min_values_before_jump!r}"
            )
        if isinstance(ordinal_params, str):
            raise TypeError(
                f"ordinal_params must be a sequence of names, got the string {ordinal_params!r}"
            )
        self._ordinal = tuple(ordinal_params) if ordinal_params is not None else None
        self._noise_band = float(noise_band)
        self._min_values = min_values_before_jump
        self._directions = DIRECTIONS if probe_downward else ("up",)
        self._per_level = bool(per_level)

    @property
    def per_level(self) -> bool:
        # A sampler pickled before per-level mode existed has no such attribute: scalar.
        return bool(self.__dict__.get("_per_level", False))

    # ------------------------------------------------------------------ deciding a jump

    def plan_trial(self, study: Study, trial: FrozenTrial) -> None:
        trials = study.get_trials(deepcopy=False)
        events = ev.load_events(study)
        if self._resolve_stale(events, trials):
            ev.save_events(study, events)
        if any(e["outcome"] is None for e in events):
            return      # one probe at a time
        band = self._band(study)
        plateau, inc = self._find_jump(study, trials, events, band)
        if plateau is None or inc is None:
            return
        self._start_jump(study, trial, plateau, inc, band, events)

    def _band(self, study: Study) -> float:
        band = study.user_attrs.get(NOISE_BAND_ATTR)
        if band is None:
            return self._noise_band
        check_band(band, f"study.user_attrs[{NOISE_BAND_ATTR!r}]")
        return float(band)

    def _axes(self, trials: Sequence[FrozenTrial]) -> list[Axis]:
        """The watched axes, in the order the define-by-run function first suggested them."""
        dists = distributions(trials)
        names = self._ordinal if self._ordinal is not None else tuple(dists)
        axes = []
        for name in names:
            if name not in dists:
                continue
            axis = Axis.of(union_spec(name, dists[name]), explicit=self._ordinal is not None)
            if axis is not None:
                axes.append(axis)
        return axes

    def _find_jump(
        self,
        study: Study,
        trials: Sequence[FrozenTrial],
        events: list[dict[str, Any]],
        band: float,
    ) -> tuple[Plateau | None, FrozenTrial | None]:
        """The first plateau to probe and the incumbent it was found around (that level's, for
        a plateau on a level: `Plateau.level`); (None, None) when there is none."""
        complete = [t for t in trials if t.state == TrialState.COMPLETE]
        axes: list[Axis] | None = None
        for scale in self._scales(study, trials):
            inc = scale.incumbent(trials)
            if inc is None:
                continue
            if axes is None:
                axes = self._axes(trials)
            plateau = self._find_on(scale, axes, inc, trials, complete, events, band)
            if plateau is not None:
                return plateau, inc
        return None, None

    def _scales(self, study: Study, trials: Sequence[FrozenTrial]) -> list[Scale]:
        """What plateaus are looked for on, in order: each level's score, lowest first, in
        per-level mode; then the trials' score."""
        score = score_scale(study, trials)
        return [*level_scales(study, trials), score] if self.per_level else [score]

    def _find_on(
        self,
        scale: Scale,
        axes: Sequence[Axis],
        inc: FrozenTrial,
        trials: Sequence[FrozenTrial],
        complete: Sequence[FrozenTrial],
        events: list[dict[str, Any]],
        band: float,
    ) -> Plateau | None:
        feasible = scale.feasible(trials)
        inc_score = scale.sign * scale.value(inc)
        for axis in axes:
            if axis.name not in inc.params:
                continue
            for direction in self._directions:
                if blocked(axis.name, direction, inc_score, scale.sign, band, events,
                           level=scale.level):
                    continue
                plateau = find_plateau(
                    axis, feasible, complete, inc, scale.sign, band, direction,
                    self._min_values, value=scale.value,
                )
                if plateau is not None:
                    return dataclasses.replace(plateau, level=scale.level)
        return None

    def _start_jump(
        self,
        study: Study,
        trial: FrozenTrial,
        plateau: Plateau,
        inc: FrozenTrial,
        band: float,
        events: list[dict[str, Any]],
    ) -> None:
        baseline = None if plateau.level is None else baseline_tok_s(study, plateau.level)
        event = ev.new_event(study, trial, plateau, inc, band, baseline)
        self.store_plan(study, trial, {
            "axis": plateau.axis,
            "direction": plateau.direction,
            "plateau_to": plateau.plateau_to,
            "jump_to": plateau.jump_to,
            "incumbent_at": inc.params[plateau.axis],
            "params": {k: v for k, v in inc.params.items() if k != plateau.axis},
        })
        set_trial_user_attr(study, trial, ev.JUMP_REASON_ATTR, event["reason"], visible_now=True)
        events.append(event)
        ev.save_events(study, events)

    def _resolve_stale(self, events: list[dict[str, Any]], trials: Sequence[FrozenTrial]) -> bool:
        """Resolve jumps whose trial finished without our after_trial. Whether any changed."""
        by_number = {t.number: t for t in trials}
        changed = False
        for event in events:
            t = by_number.get(event["trial_number"])
            if event["outcome"] is None and t is not None and t.state.is_finished():
                ev.resolve(event, t.state, t.value if t.state == TrialState.COMPLETE else None, t)
                changed = True
        return changed

    # ------------------------------------------------------------------ at suggest time

    def planned_value(
        self, study: Study, trial: FrozenTrial, plan: dict[str, Any], name: str,
        dist: BaseDistribution,
    ) -> Any:
        if name == plan["axis"]:
            value = fit_into(plan["jump_to"], dist)
            if value is not None and beyond(value, plan["plateau_to"], plan["direction"]):
                if value != plan["jump_to"]:
                    self._retarget(study, trial, value)
                return value
            # This trial's own range (define-by-run) has no room beyond the plateau: the
            # trial becomes a re-measure of the incumbent instead of a half-done probe.
            self._mark_unreachable(study, trial, dist)
            return fit_into(plan["incumbent_at"], dist)
        if name in plan["params"]:
            return fit_into(plan["params"][name], dist)
        return None  # a parameter the incumbent did not have

    def _retarget(self, study: Study, trial: FrozenTrial, value: Any) -> None:
        """The trial's own range moved the jump (clamped, snapped): record where it landed."""
        events = ev.load_events(study)
        event = ev.event_of(events, trial.number)
        if event is None:
            return
        ev.retarget(event, value)
        set_trial_user_attr(study, trial, ev.JUMP_REASON_ATTR, event["reason"])
        ev.save_events(study, events)

    def _mark_unreachable(self, study: Study, trial: FrozenTrial, dist: BaseDistribution) -> None:
        events = ev.load_events(study)
        event = ev.event_of(events, trial.number)
        if event is None or event["outcome"] is not None:
            return
        ev.mark_unreachable(event, dist)
        set_trial_user_attr(study, trial, ev.JUMP_REASON_ATTR, event["reason"])
        set_trial_user_attr(study, trial, ev.JUMP_OUTCOME_ATTR, "unreachable")
        ev.save_events(study, events)

    # ------------------------------------------------------------------ when it ends

    def trial_finished(
        self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        events = ev.load_events(study)
        for event in events:
            if event["trial_number"] == trial.number and event["outcome"] is None:
                ev.resolve(event, state, values[0] if values else None, trial)
                set_trial_user_attr(study, trial, ev.JUMP_OUTCOME_ATTR, event["outcome"])
                ev.save_events(study, events)
                break


def check_band(band: Any, name: str) -> None:
    """A noise band is a score difference: a finite number >= 0."""
    if isinstance(band, bool) or not isinstance(band, (int, float)) or not (
        math.isfinite(band) and band >= 0
    ):
        raise ValueError(f"{name} must be a finite number >= 0 (a score difference), got {band!r}")
