"""What a study's trials say, as both samplers read it: which count, the incumbent, the space.

A trial counts as a measurement of its point when it completed with a finite score and no
violated constraint (the search tells a configuration the server refused as a violated
constraint, whatever its score). The incumbent is the best such trial, the earlier one on a tie.

The space the trials were drawn from is the union of each parameter's distributions over the
trials: a define-by-run space can give one parameter a different range in each trial (e.g.
draft tokens <= 1 + topk + (steps - 1) * topk^2). Optuna keeps a parameter's kind and its
categorical choices the same across a study; ranges and steps may vary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

from ..space import ParamSpec


def orientation(study: Study) -> float:
    """+1 when the study maximizes, -1 when it minimizes: sign * value is higher-is-better."""
    return 1.0 if study.direction == StudyDirection.MAXIMIZE else -1.0


def is_feasible(t: FrozenTrial) -> bool:
    """Completed with a finite score and no violated constraint."""
    return (
        t.state == TrialState.COMPLETE
        and t.value is not None
        and math.isfinite(t.value)
        and all(c <= 0 for c in t.constraints.values())
    )


def incumbent(study: Study, trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    """The best feasible trial (the earlier one on a tie), or None before there is one."""
    sign = orientation(study)
    feasible = [t for t in trials if is_feasible(t)]
    if not feasible:
        return None
    return min(feasible, key=lambda t: (-sign * value_of(t), t.number))


def value_of(t: FrozenTrial) -> float:
    """The score of a feasible trial (never None there)."""
    return float(cast(float, t.value))


def distributions(trials: Sequence[FrozenTrial]) -> dict[str, list[BaseDistribution]]:
    """Every parameter's distributions over the trials, in the order they were first suggested."""
    dists: dict[str, list[BaseDistribution]] = {}
    for t in trials:
        for name, dist in t.distributions.items():
            dists.setdefault(name, []).append(dist)
    return dists


def union_spec(name: str, dists: Sequence[BaseDistribution]) -> ParamSpec:
    """One parameter's distributions as one ParamSpec: the widest range (the common step, else
    1 on int axes and none on float ones; log if any is), or every categorical choice."""
    if all(isinstance(d, CategoricalDistribution) for d in dists):
        choices = tuple(dict.fromkeys(c for d in dists for c in d.choices))  # type: ignore[attr-defined]
        return ParamSpec(name, "categorical", choices=choices)
    numeric = [d for d in dists if isinstance(d, (IntDistribution, FloatDistribution))]
    if len(numeric) != len(dists):
        raise ValueError(f"parameter {name!r} mixes categorical and numeric distributions")
    kind = "int" if isinstance(numeric[0], IntDistribution) else "float"
    steps = {d.step for d in numeric}
    step = steps.pop() if len(steps) == 1 else (1 if kind == "int" else None)
    return ParamSpec(name, kind, low=min(d.low for d in numeric),
                     high=max(d.high for d in numeric), step=step,
                     log=any(d.log for d in numeric))
