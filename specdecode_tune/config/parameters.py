"""The experiment's `[space]` table: one sub-table per searched parameter, read into `ParamSpec`s.

A parameter is an int or float range (`low`, `high`, optional `step` or `log`) or a list of
`choices`. Parameters with a known meaning are held to their bounds here (steps in [0, 64],
top-k in [1, 64], draft tokens in [1, 1024], a memory fraction in (0, 1], positive counts);
whether the space holds any valid point at all is checked once the whole experiment is read.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import ConfigError
from ..space import DRAFT, MEM, PARAM_TYPES, STEPS, TOPK, ParamSpec
from .reader import Table

_BOUNDS: dict[str, tuple[float, float, str]] = {
    STEPS: (0, 64, "an integer number of draft steps in [0, 64]"),
    TOPK: (1, 64, "an integer top-k in [1, 64]"),
    DRAFT: (1, 1024, "an integer number of draft tokens in [1, 1024]"),
    MEM: (0.0, 1.0, "a fraction in (0, 1]"),
    "max_running_requests": (1, 1 << 20, "a positive integer"),
    "cuda_graph_max_bs": (1, 1 << 20, "a positive integer"),
}


def known_problem(name: str, value: Any) -> str | None:
    """Why `value` cannot be the parameter `name` where the name has a fixed meaning (steps,
    top-k, draft tokens, the memory fraction, positive counts): 'must be ...'; None otherwise
    (also for any other name)."""
    bounds = _BOUNDS.get(name)
    if bounds is None:
        return None
    lo, hi, allowed = bounds
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    bad = (not number or not math.isfinite(value) or not lo <= value <= hi
           or (name == MEM and value <= 0) or (name != MEM and not isinstance(value, int)))
    return f"must be {allowed}" if bad else None


def space_from_table(t: Table) -> tuple[ParamSpec, ...]:
    """Read and check `[space]`: at least one parameter, each one well-formed."""
    if not t.data:
        raise ConfigError(f"{t.where}: [space] must declare at least one parameter")
    specs = []
    for name in list(t.data):
        sub = t.sub(name, required=True)
        specs.append(_param(name, sub))
    t.done()
    return tuple(specs)


def _param(name: str, t: Table) -> ParamSpec:
    ptype = t.choice("type", PARAM_TYPES)
    if ptype == "categorical":
        choices = t.get("choices", list)
        if not choices:
            raise t.fail("choices", choices, "must list at least one value")
        if len(set(map(repr, choices))) != len(choices):
            raise t.fail("choices", choices, "must not repeat a value")
        spec = ParamSpec(name=name, type=ptype, choices=tuple(choices))
    else:
        num = int if ptype == "int" else (int, float)
        low = t.get("low", num)
        high = t.get("high", num)
        step = t.get("step", num, None)
        log = t.get("log", bool, False)
        if low > high:
            raise ConfigError(f"{t.where}: {t.path}: low = {low!r} > high = {high!r}: "
                              f"low <= high must hold")
        if step is not None and step <= 0:
            raise t.fail("step", step, "must be > 0")
        if log and low <= 0:
            raise t.fail("low", low, "must be > 0 when log = true")
        if log and step is not None:
            raise t.fail("step", step, "cannot be combined with log = true")
        spec = ParamSpec(name=name, type=ptype, low=low, high=high, step=step, log=log)
    _check_known_param(spec, t)
    t.done()
    return spec


def _check_known_param(spec: ParamSpec, t: Table) -> None:
    bounds = _BOUNDS.get(spec.name)
    if bounds is None:
        return
    lo, hi, allowed = bounds
    if spec.name != MEM and spec.type == "float":
        raise t.fail("type", spec.type, f"{spec.name} is {allowed}: use int or categorical")
    values = list(spec.choices) if spec.type == "categorical" else [spec.low, spec.high]
    for v in values:
        bad = (not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi
               or (spec.name == MEM and v <= 0)
               or (spec.name != MEM and v != int(v)))
        if bad:
            key = "choices" if spec.type == "categorical" else ("low" if v == spec.low else "high")
            raise t.fail(key, v, f"{spec.name} must be {allowed}")
