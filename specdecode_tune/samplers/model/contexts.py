"""Contexts: the discrete parameters the model has no term for, one fit per combination.

llama.cpp's n-gram size, say: acceptance and step time depend on it in ways the model cannot
express, so each combination of such parameters' values is a context with a fit of its own
(`fitted_in`), and expected improvement runs over every (context, point). A context with no
feasible speculative boot yet takes the fit pooled over every trial: what the other contexts
measured is the best guess there. Beyond `MAX_CONTEXT_VALUES` values of one parameter or
`MAX_CONTEXTS` combinations there is one context (`{}`), and those parameters follow the
incumbent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import product
from typing import Any

from optuna.study import Study
from optuna.trial import FrozenTrial

from ...space import DRAFT, MEM, STEPS, TOPK, ParamSpec
from ..observations import BASELINE_ATTR, MEASURED_ATTR
from .candidates import Candidates
from .fit import Fit, fit_model
from .trials import TrialObs, parse_baseline, parse_measured

# Discrete parameters the model has no term for are contexts, one fit per combination of their
# values, up to these sizes (beyond them they follow the incumbent).
MAX_CONTEXT_VALUES = 8
MAX_CONTEXTS = 12


def contexts(specs: Sequence[ParamSpec]) -> list[dict[str, Any]]:
    """The contexts the model is fitted in, one per combination of the values of the
    discrete parameters it does not know (llama.cpp's n-gram size, say: acceptance and
    step time depend on it in ways the model has no term for); [{}] where there are none,
    or too many combinations (then those parameters follow the incumbent)."""
    unknown = [sp for sp in specs
               if sp.name not in (STEPS, TOPK, DRAFT, MEM)
               and (sp.type == "categorical" or (sp.type == "int" and not sp.log))]
    axes = []
    for sp in unknown:
        values = list(sp.values())
        if len(values) > MAX_CONTEXT_VALUES:
            return [{}]
        axes.append((sp.name, values))
    combos = [dict(zip([n for n, _ in axes], vals, strict=True))
              for vals in product(*(v for _, v in axes))]
    return combos if axes and len(combos) <= MAX_CONTEXTS else [{}]


def fitted_in(study: Study, trials: Sequence[FrozenTrial], ctx: Mapping[str, Any],
              pooled: tuple[Fit, Candidates, list[TrialObs]]
              ) -> tuple[Fit, Candidates, list[TrialObs]]:
    """The model fitted to the finished trials of one context (their observations); the
    pooled fit, with no observation of its own, where the context has no feasible
    speculative boot yet: what the other contexts measured is the best guess there."""
    fit, cands, _ = pooled
    obs = []
    for t in trials:
        if not t.state.is_finished() or not in_context(t.params, ctx):
            continue
        o = parse_measured(t.user_attrs.get(MEASURED_ATTR), t.params)
        if o is not None:
            obs.append(o)
    base = parse_baseline(study.user_attrs.get(BASELINE_ATTR))
    own = fit_model(obs, base, cands, int(cands.steps.max())) if base is not None else None
    return (own, cands, obs) if own is not None else (fit, cands, obs)


def context_of(params: Mapping[str, Any], ctxs: Sequence[Mapping[str, Any]]
               ) -> Mapping[str, Any] | None:
    """The first non-empty context of `ctxs` that `params` lies in, or None."""
    return next((c for c in ctxs if c and in_context(params, c)), None)


def in_context(params: Mapping[str, Any], ctx: Mapping[str, Any]) -> bool:
    return all(params.get(k) == v for k, v in ctx.items())


def ctx_text(ctx: Mapping[str, Any]) -> str:
    return ("at " + ", ".join(f"{k}={v}" for k, v in ctx.items()) + ": ") if ctx else ""
