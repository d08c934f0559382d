"""Plateau escape: an Optuna sampler that asks "is this plateau a peak?" with one far probe.

People tuning speculative decoding see steps 1..5 climb, then 4 -> 5 gain +1.8% (inside the
noise), and ask: is steps=4 the peak, or would steps=10 climb again? Neither TPE nor a sweep
answers that on purpose. `PlateauEscapeSampler` wraps a base sampler (TPE by default) and, when
an ordinal axis has flattened around the incumbent, spends ONE trial on a far, non-monotonic
jump beyond the plateau with every other parameter at the incumbent's values:

- worse than the incumbent by more than the noise band, or infeasible (the server refused it)
  -> the plateau is a peak; that direction is not probed again from it;
- better by more than the noise band -> a new region ("escaped"); the base sampler takes over;
- within the noise band -> said so ("within_noise"); not escaped, not probed again.

Terms, on one axis (a parameter), using completed feasible trials only:
- the axis's *levels* are its explored values (continuous floats and very fine discrete axes
  are grouped into `MAX_LEVELS` equal-width bins, log-width on log axes, so that two nearly
  equal floats do not make a "plateau");
- the *plateau* is the run of adjacent explored levels around the incumbent's level whose best
  scores are within the noise band of the incumbent's score; its *top* is its highest level;
- the *last step up* goes from the level below the top to the top; a plateau needs at least two
  levels (so that step exists) and `min_values_before_jump` explored levels on the axis.

The jump goes far, not to the next value: from top t (one level below it: s) to
max(t + 2, 2 t) on int axes (seed: 5 -> 10), max(t + 2 (t - s), 2 t) on float axes, fitted into
the incumbent's range for that axis (define-by-run ranges can depend on the other values, which
the jump inherits), then into the jump trial's own range at suggest time. It must
land at least two values and further than t - s beyond t, on a level nobody measured yet.
Downward probes (optional) mirror this: min(b - 2, b // 2).

Rules that keep the probes few: one unresolved jump at a time (in the whole study); enqueued
trials are never jumps; and a plateau is identified by its height: after a jump on an axis
direction, the next one there needs an incumbent better than that jump's incumbent by more
than the noise band (an escape, or a better region found otherwise).

Scores are compared as differences: the search's score is a weighted mean of log-speedups, so a
difference of 0.018 is about +1.8%, and the noise band (e.g. 0.025) is in the same units. The
band measured by the search (`study.user_attrs["noise_band"]`) takes precedence over the
constructor's.

Everything the sampler knows lives in the study, not in the sampler: the list of jumps
(`study.user_attrs["plateau_events"]`), and on each jump trial its plan (a system attr) and
its `jump_reason` / `jump_outcome` (user attrs). So it pickles trivially (Ray Tune pickles the
searcher with the sampler), a fresh instance over a resumed study carries on where the old one
stopped, and it is deterministic for a seed (its only randomness is the base sampler's).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.samplers import BaseSampler, TPESampler
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

from ..objective import pct

NOISE_BAND_ATTR = "noise_band"        # study user attr written by the search (measured band)
EVENTS_ATTR = "plateau_events"        # study user attr: list of jump events (JSON)
JUMP_REASON_ATTR = "jump_reason"      # trial user attr: why this trial is a jump (a sentence)
JUMP_OUTCOME_ATTR = "jump_outcome"    # trial user attr: one of OUTCOMES once resolved
OUTCOMES = ("peak", "escaped", "within_noise", "infeasible", "failed", "unreachable")
DIRECTIONS = ("up", "down")
MAX_DISCRETE_LEVELS = 64              # discrete axes up to this many values: each value a level
MAX_LEVELS = 16                       # other axes (continuous floats) are binned into this many

_PLAN_KEY = "plateau_escape:plan"     # trial system attr: what sample_independent returns


@dataclass(frozen=True)
class _Axis:
    """The union of one parameter's distributions over the study (define-by-run ranges vary)."""

    name: str
    kind: str                          # "int" | "float" | "categorical" (numeric choices)
    low: float
    high: float
    log: bool
    step: float | None
    choices: tuple[float, ...] = ()

    @property
    def n_levels(self) -> float:
        if self.kind == "categorical":
            return len(self.choices)
        if self.step is None:
            return math.inf
        return math.floor((self.high - self.low) / self.step + 1e-9) + 1

    def level(self, value: float) -> float:
        """The level a value belongs to: the value itself, or its bin's index on fine axes."""
        if self.n_levels <= MAX_DISCRETE_LEVELS:
            return round(float(value), 9)
        lo, hi, x = self.low, self.high, float(value)
        if self.log and lo > 0 and x > 0:
            lo, hi, x = math.log(lo), math.log(hi), math.log(x)
        if hi <= lo:
            return 0
        return min(MAX_LEVELS - 1, max(0, math.floor((x - lo) / (hi - lo) * MAX_LEVELS)))


@dataclass(frozen=True)
class _Plateau:
    """A plateau found on one axis in one direction, and where to jump from it."""

    axis: str
    direction: str
    plateau_from: Any                  # the value next to the edge, inside the plateau
    plateau_to: Any                    # the edge (top when going up, bottom when going down)
    gain: float                        # score change of the last step onto the edge
    values: tuple[Any, ...]            # each level's best trial's value (what a reader sees)
    jump_to: Any


class PlateauEscapeSampler(BaseSampler):
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
    """

    def __init__(
        self,
        base_sampler: BaseSampler | None = None,
        *,
        ordinal_params: Sequence[str] | None = None,
        noise_band: float = 0.025,
        min_values_before_jump: int = 3,
        probe_downward: bool = False,
        seed: int | None = None,
    ) -> None:
        if base_sampler is not None and not isinstance(base_sampler, BaseSampler):
            raise TypeError(
                f"base_sampler must be an optuna BaseSampler, got {type(base_sampler).__name__}"
            )
        _check_band(noise_band, "noise_band")
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
        self._base = base_sampler if base_sampler is not None else TPESampler(seed=seed)
        self._ordinal = tuple(ordinal_params) if ordinal_params is not None else None
        self._noise_band = float(noise_band)
        self._min_values = min_values_before_jump
        self._directions = DIRECTIONS if probe_downward else ("up",)

    def __str__(self) -> str:
        return f"PlateauEscapeSampler({self._base})"

    @property
    def base_sampler(self) -> BaseSampler:
        return self._base

    # ------------------------------------------------------------------ Optuna hooks

    def reseed_rng(self) -> None:
        self._base.reseed_rng()

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        _check_single_objective(study)
        self._base.before_trial(study, trial)
        # An enqueued trial is a configuration someone asked for: never turn it into a jump
        # (its fixed params would win over the jump's anyway, leaving a half-jump).
        if "fixed_params" in trial.system_attrs or _PLAN_KEY in trial.system_attrs:
            return
        trials = study.get_trials(deepcopy=False)
        events = _load_events(study)
        if self._resolve_stale(study, events, trials):
            _save_events(study, events)
        # One probe at a time: a second jump decided while the first runs would be decided
        # without the first one's answer.
        if any(e["outcome"] is None for e in events):
            return
        band = self._band(study)
        plateau, incumbent = self._find_jump(study, trials, events, band)
        if plateau is None or incumbent is None:
            return
        self._start_jump(study, trial, plateau, incumbent, band, events)

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        # `trial` here is the cached copy taken before before_trial wrote the plan: read storage.
        if _stored_plan(study, trial) is not None:
            return {}
        return self._base.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if _stored_plan(study, trial) is not None:
            return {}
        return self._base.sample_relative(study, trial, search_space)

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        plan = _stored_plan(study, trial)
        if plan is None:
            return self._base.sample_independent(study, trial, param_name, param_distribution)
        if param_name == plan["axis"]:
            value = _fit(plan["jump_to"], param_distribution)
            if value is not None and _beyond(value, plan["plateau_to"], plan["direction"]):
                if value != plan["jump_to"]:
                    self._retarget(study, trial, plan, value)
                return value
            # This trial's own range (define-by-run) has no room beyond the plateau: the
            # trial becomes a re-measure of the incumbent instead of a half-done probe.
            self._mark_unreachable(study, trial, plan, param_distribution)
            fallback = _fit(plan["incumbent_at"], param_distribution)
        elif param_name in plan["params"]:
            fallback = _fit(plan["params"][param_name], param_distribution)
        else:
            fallback = None  # a parameter the incumbent did not have
        if fallback is None:
            return self._base.sample_independent(study, trial, param_name, param_distribution)
        return fallback

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        events = _load_events(study)
        for event in events:
            if event["trial_number"] == trial.number and event["outcome"] is None:
                value = values[0] if values else None
                _resolve(event, state, value, trial)
                study._storage.set_trial_user_attr(
                    trial._trial_id, JUMP_OUTCOME_ATTR, event["outcome"]
                )
                _save_events(study, events)
                break
        self._base.after_trial(study, trial, state, values)

    # ------------------------------------------------------------------ deciding a jump

    def _band(self, study: Study) -> float:
        band = study.user_attrs.get(NOISE_BAND_ATTR)
        if band is None:
            return self._noise_band
        _check_band(band, f"study.user_attrs[{NOISE_BAND_ATTR!r}]")
        return float(band)

    def _axes(self, trials: Sequence[FrozenTrial]) -> list[_Axis]:
        """The watched axes, in the order the define-by-run function first suggested them."""
        dists: dict[str, list[BaseDistribution]] = {}
        for t in trials:
            for name, dist in t.distributions.items():
                dists.setdefault(name, []).append(dist)
        names = self._ordinal if self._ordinal is not None else tuple(dists)
        axes = []
        for name in names:
            if name not in dists:
                continue
            axis = _union_axis(name, dists[name], explicit=self._ordinal is not None)
            if axis is not None:
                axes.append(axis)
        return axes

    def _find_jump(
        self,
        study: Study,
        trials: Sequence[FrozenTrial],
        events: list[dict[str, Any]],
        band: float,
    ) -> tuple[_Plateau | None, FrozenTrial | None]:
        sign = 1.0 if study.direction == StudyDirection.MAXIMIZE else -1.0
        feasible = [t for t in trials if _is_feasible_complete(t)]
        if not feasible:
            return None, None
        complete = [t for t in trials if t.state == TrialState.COMPLETE]
        # Scores are oriented so that higher is better; ties go to the earlier trial.
        incumbent = min(feasible, key=lambda t: (-sign * t.value, t.number))
        for axis in self._axes(trials):
            if axis.name not in incumbent.params:
                continue
            for direction in self._directions:
                if _blocked(axis.name, direction, sign * incumbent.value, sign, band, events):
                    continue
                plateau = _find_plateau(
                    axis, feasible, complete, incumbent, sign, band, direction, self._min_values
                )
                if plateau is not None:
                    return plateau, incumbent
        return None, None

    def _start_jump(
        self,
        study: Study,
        trial: FrozenTrial,
        plateau: _Plateau,
        incumbent: FrozenTrial,
        band: float,
        events: list[dict[str, Any]],
    ) -> None:
        reason = _reason(plateau, band)
        event: dict[str, Any] = {
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
            "incumbent_value": float(incumbent.value),
            "study_direction": study.direction.name.lower(),
            "incumbent_at": incumbent.params[plateau.axis],
            "reason": reason,
            "outcome": None,
            "delta": None,
            "value": None,
            "verdict": None,
        }
        plan = {
            "axis": plateau.axis,
            "direction": plateau.direction,
            "plateau_to": plateau.plateau_to,
            "jump_to": plateau.jump_to,
            "incumbent_at": incumbent.params[plateau.axis],
            "params": {k: v for k, v in incumbent.params.items() if k != plateau.axis},
        }
        storage = study._storage
        storage.set_trial_system_attr(trial._trial_id, _PLAN_KEY, plan)
        storage.set_trial_user_attr(trial._trial_id, JUMP_REASON_ATTR, reason)
        # Optuna's Trial keeps the FrozenTrial it passed us as its cache and answers
        # `trial.user_attrs` from it; without this the define-by-run function would not see
        # the reason until the trial is reloaded.
        trial.user_attrs[JUMP_REASON_ATTR] = reason
        events.append(event)
        _save_events(study, events)

    def _resolve_stale(
        self, study: Study, events: list[dict[str, Any]], trials: Sequence[FrozenTrial]
    ) -> bool:
        """Resolve jumps whose trial finished without our after_trial (e.g. told through
        another sampler instance before a resume). Returns whether anything changed."""
        by_number = {t.number: t for t in trials}
        changed = False
        for event in events:
            t = by_number.get(event["trial_number"])
            if event["outcome"] is None and t is not None and t.state.is_finished():
                _resolve(event, t.state, t.value if t.state == TrialState.COMPLETE else None, t)
                changed = True
        return changed

    # ------------------------------------------------------------------ at suggest time

    def _retarget(
        self, study: Study, trial: FrozenTrial, plan: dict[str, Any], value: Any
    ) -> None:
        """The trial's own range moved the jump (clamped, snapped): record where it landed."""
        events = _load_events(study)
        event = _event_of(events, trial.number)
        if event is None:
            return
        old = _fmt(plan["jump_to"])
        event["jump_to"] = value
        event["reason"] = event["reason"].replace(
            f"jumping to {old}", f"jumping to {_fmt(value)} (clamped from {old})"
        ).replace(
            f"jumping down to {old}", f"jumping down to {_fmt(value)} (clamped from {old})"
        )
        study._storage.set_trial_user_attr(trial._trial_id, JUMP_REASON_ATTR, event["reason"])
        _save_events(study, events)

    def _mark_unreachable(
        self,
        study: Study,
        trial: FrozenTrial,
        plan: dict[str, Any],
        distribution: BaseDistribution,
    ) -> None:
        events = _load_events(study)
        event = _event_of(events, trial.number)
        if event is None or event["outcome"] is not None:
            return
        event["outcome"] = "unreachable"
        event["verdict"] = (
            f"jump on {plan['axis']} to {_fmt(plan['jump_to'])} unreachable: this trial's "
            f"range is {_describe(distribution)}; the trial re-measures the incumbent"
        )
        event["reason"] = f"{event['reason']}; {event['verdict']}"
        storage = study._storage
        storage.set_trial_user_attr(trial._trial_id, JUMP_REASON_ATTR, event["reason"])
        storage.set_trial_user_attr(trial._trial_id, JUMP_OUTCOME_ATTR, "unreachable")
        _save_events(study, events)


# ---------------------------------------------------------------------- plateau geometry


def _find_plateau(
    axis: _Axis,
    feasible: Sequence[FrozenTrial],
    complete: Sequence[FrozenTrial],
    incumbent: FrozenTrial,
    sign: float,
    band: float,
    direction: str,
    min_values: int,
) -> _Plateau | None:
    # Best oriented score and its value at each level of the axis.
    best: dict[float, tuple[float, float, int]] = {}
    for t in feasible:
        if axis.name not in t.params:
            continue
        value = t.params[axis.name]
        lvl = axis.level(value)
        cand = (sign * float(t.value), value, t.number)
        cur = best.get(lvl)
        if cur is None or cand[0] > cur[0] or (cand[0] == cur[0] and cand[2] < cur[2]):
            best[lvl] = cand
    levels = sorted(best)
    if len(levels) < min_values:
        return None
    inc_score = sign * float(incumbent.value)
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
    # (in a define-by-run space) the incumbent's: e.g. draft tokens <= steps * topk + 1.
    target = _jump_target(
        axis, edge_value, inner_value, direction, incumbent.distributions[axis.name]
    )
    measured = {axis.level(t.params[axis.name]) for t in complete if axis.name in t.params}
    if target is None or axis.level(target) in measured:
        # Nothing beyond, or the base sampler already tried the jump's point (an infeasible
        # try included): that data point answers the question a probe would ask.
        return None
    return _Plateau(
        axis=axis.name,
        direction=direction,
        plateau_from=inner_value,
        plateau_to=edge_value,
        gain=gain,
        values=tuple(best[lvl][1] for lvl in levels[lo : hi + 1]),
        jump_to=target,
    )


def _jump_target(
    axis: _Axis, edge: float, inner: float, direction: str, dist: BaseDistribution
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
    target = _fit(raw, dist)
    if target is None or not _beyond(target, edge, direction):
        return None
    # A jump must reach further past the edge than the plateau's own last step spans, and
    # (on int axes) skip at least one value: otherwise it is the next value, which the base
    # sampler explores anyway, or a "plateau" between two far-apart early samples.
    reach = abs(target - edge)
    if reach <= abs(edge - inner) or (axis.kind == "int" and reach < 2 * step):
        return None
    return target


def _blocked(
    axis: str, direction: str, inc_score: float, sign: float, band: float,
    events: Sequence[dict[str, Any]],
) -> bool:
    """Whether an earlier jump on this axis direction already answered for this plateau.

    A plateau is identified by its height, not by which of its values happen to be explored
    (a level sampled only with poor other parameters can split one plateau in two): a later
    jump needs an incumbent better than the earlier jump's incumbent by more than the noise
    band. An escape provides exactly that, so the logic restarts from the new region; a peak,
    an infeasible or a within-noise probe leaves the height unchanged and blocks."""
    return any(
        e["axis"] == axis
        and e["direction"] == direction
        and inc_score - sign * e["incumbent_value"] <= band
        for e in events
    )


# ---------------------------------------------------------------------- outcomes


def _resolve(
    event: dict[str, Any], state: TrialState, value: float | None, trial: FrozenTrial
) -> None:
    """Fill in the outcome of a finished jump trial."""
    axis, band = event["axis"], event["noise_band"]
    at, to = _fmt(event["incumbent_at"]), _fmt(event["jump_to"])
    span = event["plateau_values"]
    where = f"{axis}={_fmt(span[0])}..{_fmt(span[-1])} (best at {at})"
    landed = trial.params.get(axis)
    reached = landed is not None and _beyond(landed, event["plateau_to"], event["direction"])
    # A refused config may come back with or without a score: the constraint decides.
    if reached and any(c > 0 for c in trial.constraints.values()):
        event["outcome"] = "infeasible"
        event["verdict"] = (
            f"{where} is a peak: probe at {axis}={to} is infeasible (the server refused it)"
        )
        return
    if state != TrialState.COMPLETE or value is None:
        event["outcome"] = "failed"
        event["verdict"] = (
            f"probe at {axis}={to} ended {state.name} without a score; "
            f"not probed again from {axis}={_fmt(event['plateau_to'])}"
        )
        return
    if not reached:
        event["outcome"] = "unreachable"
        event["verdict"] = f"the trial did not reach {axis}={to}"
        return
    event["value"] = float(value)
    sign = -1.0 if event["study_direction"] == "minimize" else 1.0
    delta = sign * (float(value) - event["incumbent_value"])
    event["delta"] = delta
    tail = f"probe at {axis}={to}: {pct(delta)} (noise band +-{band:.1%})"
    if delta < -band:
        event["outcome"] = "peak"
        event["verdict"] = f"{where} is a peak; {tail}"
    elif delta > band:
        event["outcome"] = "escaped"
        event["verdict"] = f"escaped the plateau at {axis}={_fmt(event['plateau_to'])}; {tail}"
    else:
        event["outcome"] = "within_noise"
        event["verdict"] = f"{where} vs {axis}={to} is within noise; {tail}"


# ---------------------------------------------------------------------- helpers


def _check_single_objective(study: Study) -> None:
    if len(study.directions) != 1:
        raise ValueError(
            "PlateauEscapeSampler needs a single-objective study, got "
            f"{len(study.directions)} directions "
            f"({', '.join(d.name.lower() for d in study.directions)}); "
            "use a Pareto sampler (NSGA-II, TPE) for multi-objective searches"
        )


def _check_band(band: Any, name: str) -> None:
    if isinstance(band, bool) or not isinstance(band, (int, float)) or not (
        math.isfinite(band) and band >= 0
    ):
        raise ValueError(f"{name} must be a finite number >= 0 (a score difference), got {band!r}")


def _is_feasible_complete(t: FrozenTrial) -> bool:
    return (
        t.state == TrialState.COMPLETE
        and t.value is not None
        and math.isfinite(t.value)
        and all(c <= 0 for c in t.constraints.values())
    )


def _union_axis(name: str, dists: Sequence[BaseDistribution], explicit: bool) -> _Axis | None:
    first = dists[0]
    if isinstance(first, CategoricalDistribution):
        numeric = all(
            isinstance(c, (int, float)) and not isinstance(c, bool)
            for d in dists
            if isinstance(d, CategoricalDistribution)
            for c in d.choices
        )
        if not explicit:
            return None
        if not numeric or not all(isinstance(d, CategoricalDistribution) for d in dists):
            raise ValueError(
                f"ordinal_params names {name!r}, but its choices are not all numbers: "
                f"{first.choices!r}"
            )
        choices = sorted({float(c) for d in dists for c in d.choices})  # type: ignore[union-attr]
        return _Axis(name, "categorical", choices[0], choices[-1], False, None, tuple(choices))
    if not all(isinstance(d, (IntDistribution, FloatDistribution)) for d in dists):
        raise ValueError(f"parameter {name!r} mixes categorical and numeric distributions")
    kind = "int" if isinstance(first, IntDistribution) else "float"
    low = min(float(d.low) for d in dists)  # type: ignore[attr-defined]
    high = max(float(d.high) for d in dists)  # type: ignore[attr-defined]
    if high <= low:
        return None  # a single value: no axis to move along
    steps = {d.step for d in dists}  # type: ignore[attr-defined]
    step = steps.pop() if len(steps) == 1 else (1 if kind == "int" else None)
    log = any(d.log for d in dists)  # type: ignore[attr-defined]
    return _Axis(name, kind, low, high, log, step)


def _fit(value: Any, dist: BaseDistribution) -> Any:
    """`value` moved into `dist` (clamped, snapped to its step or nearest numeric choice);
    None when it cannot be (an unknown categorical value)."""
    if isinstance(dist, CategoricalDistribution):
        if value in dist.choices:
            return value
        numeric = [
            c for c in dist.choices if isinstance(c, (int, float)) and not isinstance(c, bool)
        ]
        if not numeric or isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return min(numeric, key=lambda c: (abs(c - value), c))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(dist, IntDistribution):
        v = min(max(int(round(value)), dist.low), dist.high)
        k = round((v - dist.low) / dist.step)
        v = dist.low + k * dist.step
        return int(v - dist.step if v > dist.high else v)
    if isinstance(dist, FloatDistribution):
        v = min(max(float(value), dist.low), dist.high)
        if dist.step is not None:
            k = round((v - dist.low) / dist.step)
            v = min(dist.low + k * dist.step, dist.high)
            v = round(v, 12)
        return float(v)
    return None


def _beyond(value: float, edge: float, direction: str) -> bool:
    return value > edge if direction == "up" else value < edge


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def _describe(dist: BaseDistribution) -> str:
    if isinstance(dist, CategoricalDistribution):
        return f"{list(dist.choices)}"
    return f"[{_fmt(dist.low)}, {_fmt(dist.high)}]"  # type: ignore[attr-defined]


def _reason(p: _Plateau, band: float) -> str:
    where = "jumping to" if p.direction == "up" else "jumping down to"
    return (
        f"plateau on {p.axis}: {_fmt(p.plateau_from)} -> {_fmt(p.plateau_to)} gained "
        f"{pct(p.gain)} (noise band +-{band:.1%}); {where} {_fmt(p.jump_to)}"
    )


def _stored_plan(study: Study, trial: FrozenTrial) -> dict[str, Any] | None:
    return study._storage.get_trial_system_attrs(trial._trial_id).get(_PLAN_KEY)


def _load_events(study: Study) -> list[dict[str, Any]]:
    return [dict(e) for e in study.user_attrs.get(EVENTS_ATTR, [])]


def _save_events(study: Study, events: list[dict[str, Any]]) -> None:
    study._storage.set_study_user_attr(study._study_id, EVENTS_ATTR, events)


def _event_of(events: list[dict[str, Any]], trial_number: int) -> dict[str, Any] | None:
    for e in events:
        if e["trial_number"] == trial_number:
            return e
    return None
