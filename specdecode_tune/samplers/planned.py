"""Planned proposals: the base of the project's samplers, and the one place that reaches into
Optuna's storage.

Both samplers work the same way. Before a trial starts, `plan_trial` may decide its point (a
jump beyond a plateau; the model's best expected improvement) and store that plan on the trial
(`store_plan`, a trial system attr); at suggest time each parameter the plan names comes from
the plan, fitted into the trial's own range (`planned_value`, `fit_into`). A trial without a
plan, and a parameter the plan leaves open, go to the base sampler (TPE by default). An
enqueued trial (`study.enqueue_trial`: Optuna's "fixed_params" system attr) is a point someone
asked for and is never planned. The plan lives in the study, not in the sampler, so a sampler
pickles with Ray's searcher and a fresh instance over a resumed study carries on.

Optuna hands samplers `FrozenTrial` copies, which have no setters, so a sampler writes a
trial's attrs through the study's storage by the trial's storage id: two private names of
Optuna (`Study._storage`, `FrozenTrial._trial_id`; the project pins Optuna 5), used in this
module's three storage functions and nowhere else in the package.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.samplers import BaseSampler, TPESampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState


class PlannedSampler(BaseSampler):
    """A sampler that plans some trials itself and hands everything else to `base_sampler`.

    Subclasses set `plan_key` (the trial system attr of their plans) and implement
    `plan_trial` and `planned_value`; `trial_finished` is optional.
    """

    plan_key: ClassVar[str]

    def __init__(self, base_sampler: BaseSampler | None, seed: int | None) -> None:
        if base_sampler is not None and not isinstance(base_sampler, BaseSampler):
            raise TypeError(
                f"base_sampler must be an optuna BaseSampler, got {type(base_sampler).__name__}"
            )
        self._base = base_sampler if base_sampler is not None else TPESampler(seed=seed)

    def __str__(self) -> str:
        return f"{type(self).__name__}({self._base})"

    @property
    def base_sampler(self) -> BaseSampler:
        return self._base

    # ------------------------------------------------------------------ what subclasses add

    def plan_trial(self, study: Study, trial: FrozenTrial) -> None:
        """Decide whether to plan this (fresh, not enqueued) trial; `store_plan` if so."""
        raise NotImplementedError

    def planned_value(
        self, study: Study, trial: FrozenTrial, plan: Any, name: str, dist: BaseDistribution
    ) -> Any:
        """Parameter `name` of a planned trial, in `dist`; None: the base sampler's."""
        raise NotImplementedError

    def trial_finished(
        self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        """Called when any trial finishes, before the base sampler hears of it."""

    def plan_of(self, study: Study, trial: FrozenTrial) -> Any:
        return stored_plan(study, trial, self.plan_key)

    def store_plan(self, study: Study, trial: FrozenTrial, plan: Any) -> None:
        set_trial_system_attr(study, trial, self.plan_key, plan)

    # ------------------------------------------------------------------ Optuna hooks

    def reseed_rng(self) -> None:
        self._base.reseed_rng()

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        check_single_objective(study, type(self).__name__)
        self._base.before_trial(study, trial)
        # An enqueued trial is a configuration someone asked for: never plan it (its fixed
        # params would win over the plan's anyway, leaving half a plan).
        if "fixed_params" in trial.system_attrs or self.plan_key in trial.system_attrs:
            return
        self.plan_trial(study, trial)

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        # `trial` here is the copy Optuna took before before_trial stored the plan: the plan is
        # read from the storage.
        if self.plan_of(study, trial) is not None:
            return {}
        return self._base.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if self.plan_of(study, trial) is not None:
            return {}
        return self._base.sample_relative(study, trial, search_space)

    def sample_independent(
        self, study: Study, trial: FrozenTrial, param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        plan = self.plan_of(study, trial)
        value = None if plan is None else self.planned_value(
            study, trial, plan, param_name, param_distribution)
        if value is None:
            return self._base.sample_independent(study, trial, param_name, param_distribution)
        return value

    def after_trial(
        self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self.trial_finished(study, trial, state, values)
        self._base.after_trial(study, trial, state, values)


def check_single_objective(study: Study, sampler: str) -> None:
    if len(study.directions) != 1:
        raise ValueError(
            f"{sampler} needs a single-objective study, got {len(study.directions)} directions "
            f"({', '.join(d.name.lower() for d in study.directions)}); "
            "use a Pareto sampler (NSGA-II, TPE) for multi-objective searches"
        )


def fit_into(value: Any, dist: BaseDistribution) -> Any:
    """`value` moved into `dist` (clamped, snapped to its step or to the nearest numeric
    choice); None when it cannot be (a value that is no number and no choice)."""
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
        i = min(max(round(value), dist.low), dist.high)
        i = dist.low + round((i - dist.low) / dist.step) * dist.step
        return int(i - dist.step if i > dist.high else i)
    if isinstance(dist, FloatDistribution):
        x = min(max(float(value), dist.low), dist.high)
        if dist.step is not None:
            x = round(min(dist.low + round((x - dist.low) / dist.step) * dist.step, dist.high), 12)
        return float(x)
    return None


# -------------------------------------------------------------------- Optuna's storage


def stored_plan(study: Study, trial: FrozenTrial, key: str) -> Any:
    """The plan stored on `trial`, or None. From the storage: the FrozenTrial Optuna passes to
    `infer_relative_search_space` and `sample_relative` predates `before_trial`'s writes."""
    # Private: no public API reads a running trial's system attrs by its FrozenTrial.
    return study._storage.get_trial_system_attrs(trial._trial_id).get(key)


def set_trial_system_attr(study: Study, trial: FrozenTrial, key: str, value: Any) -> None:
    # Private: a FrozenTrial has no setter, and samplers are handed no optuna.Trial.
    study._storage.set_trial_system_attr(trial._trial_id, key, value)


def set_trial_user_attr(
    study: Study, trial: FrozenTrial, key: str, value: Any, *, visible_now: bool = False
) -> None:
    """Writes a user attr of the running `trial`. `visible_now`: also into the copy passed to
    `before_trial`, which Optuna's Trial keeps as its cache and answers `trial.user_attrs`
    from, so the define-by-run function sees it before the trial is reloaded."""
    # Private: a FrozenTrial has no setter, and samplers are handed no optuna.Trial.
    study._storage.set_trial_user_attr(trial._trial_id, key, value)
    if visible_now:
        # Relies on Optuna's Trial caching the very FrozenTrial it passed to before_trial.
        trial.user_attrs[key] = value
