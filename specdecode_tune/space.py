"""The search space and the rules of speculative-decoding parameters.

SGLang's rules for its speculative flags decide which points are real configurations:
- the three numbers (steps, topk, draft tokens) are set together or not at all;
- with topk = 1 the server forces draft tokens = steps + 1, so draft tokens are derived, not
  searched (searching them would boot the same server twice under two names);
- draft tokens above `max_draft_tokens(steps, topk)` = 1 + topk + (steps - 1) * topk^2 are
  refused: such a point is never booted. That is the size of SGLang's candidate pool
  (`EAGLEWorker.draft_forward`: topk candidates at the first step, topk^2 at each later one),
  from which `eagle_utils.organize_draft_results` keeps draft tokens - 1 with `torch.topk`; a
  larger count fails at boot ("selected index k out of range", docs/engines-sglang.md
  section 4). (`steps * topk + 1` is only the grid filter of SGLang's
  `scripts/playground/bench_speculative.py`, not a server rule.)
- steps = 0 means no speculation: the baseline.

The triple is the project's one vocabulary for every engine (vLLM and llama.cpp take steps as
their K and draft chains: `resolve` gives them topk 1 and draft tokens K + 1), so these rules
stay here rather than in each backend: with topk = 1 the draft-tree limit is steps + 1, which
the derived draft count always meets, so it refuses nothing a chain engine would boot; and the
places that apply it run before or without a backend (the experiment's check of its space,
`--set` on the trial's command line, the define-by-run space below and the model sampler's
candidates), where taking the backend would thread it through the samplers. A tree engine
with another limit would move `invalid_reason` behind the backend protocol then.

Values come from, in order: the searched parameters, the backend's fixed flags, defaults
(topk 1; draft tokens = steps * topk + 1, one node per step and branch, when topk > 1 and
nothing says: SGLang has no default then, and the backend always passes all three).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

STEPS = "speculative_num_steps"
TOPK = "speculative_eagle_topk"
DRAFT = "speculative_num_draft_tokens"
MEM = "mem_fraction_static"
# Search parameters with a fixed meaning; any other name is a server flag (--name-with-dashes).
SPEC_PARAMS = (STEPS, TOPK, DRAFT)
# How tables, logs and reports write a parameter in short, in this order (the speculative triple
# first); a name not here is written in full.
SHORT_NAMES: dict[str, str] = {STEPS: "steps", TOPK: "topk", DRAFT: "draft", MEM: "mem"}
PARAM_TYPES = ("int", "float", "categorical")

# The point every search measures first: the same server without speculation.
BASELINE: dict[str, Any] = {STEPS: 0}


@dataclass(frozen=True)
class ParamSpec:
    """One searched parameter: an int or float range (optionally log / stepped) or choices."""

    name: str
    type: str
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if self.type not in PARAM_TYPES:
            raise ValueError(f"type must be one of {PARAM_TYPES}, got {self.type!r}")

    @property
    def ordinal(self) -> bool:
        """Ordered values (ranges, and categoricals of numbers)."""
        if self.type != "categorical":
            return True
        return all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in self.choices)

    @property
    def lo(self) -> float:
        """`low` of a range (int or float); config validation guarantees it is set."""
        if self.low is None:
            raise ValueError(f"{self.name}: a {self.type} range without low")
        return self.low

    @property
    def hi(self) -> float:
        """`high` of a range (int or float); config validation guarantees it is set."""
        if self.high is None:
            raise ValueError(f"{self.name}: a {self.type} range without high")
        return self.high

    def values(self) -> list[Any]:
        """Every value of a discrete parameter (int, stepped float or categorical)."""
        if self.type == "categorical":
            return list(self.choices)
        if self.type == "int":
            return list(range(int(self.lo), int(self.hi) + 1, int(self.step or 1)))
        if self.step:
            n = int(round((self.hi - self.lo) / self.step))
            return [round(self.lo + i * self.step, 10) for i in range(n + 1)]
        raise ValueError(f"{self.name}: a continuous float range has no finite set of values")

    def grid(self, n: int = 5) -> list[Any]:
        """Values for a grid: all discrete values, or n evenly spaced points of a float range."""
        if self.type != "float" or self.step:
            return self.values()
        return [self.lo + (self.hi - self.lo) * i / (n - 1) for i in range(n)]

    def allowed(self) -> str:
        """What a value of this parameter is, in words: 'an integer in [1, 12]'."""
        if self.type == "categorical":
            return "one of " + ", ".join(repr(c) for c in self.choices)
        kind = "an integer" if self.type == "int" else "a number"
        return f"{kind} in [{self.lo:g}, {self.hi:g}]"

    def problem(self, value: Any) -> str | None:
        """Why `value` is not a value of this parameter (its type, its range or its choices:
        1.5 is no int, True no number, 2.0 not the choice 2), or None."""
        if self.type == "categorical":
            ok = any(_same_value(c, value) for c in self.choices)
        elif isinstance(value, bool):
            ok = False
        elif self.type == "int":
            ok = isinstance(value, int) and self.lo <= value <= self.hi
        else:
            ok = (isinstance(value, (int, float)) and math.isfinite(value)
                  and self.lo - 1e-9 <= value <= self.hi + 1e-9)
        return None if ok else f"must be {self.allowed()}"

    def contains(self, value: Any) -> bool:
        return self.problem(value) is None


def _same_value(choice: Any, value: Any) -> bool:
    """`value` is `choice`, by type as well (an int may stand for a float choice)."""
    if isinstance(choice, bool) or isinstance(value, bool):
        return type(choice) is type(value) and choice == value
    if isinstance(choice, float) and isinstance(value, int):
        return choice == value
    return type(choice) is type(value) and choice == value


def max_draft_tokens(steps: int, topk: int) -> int:
    """The most draft tokens SGLang's EAGLE draft tree takes for (steps, topk): the root plus
    every candidate of its pool, topk + (steps - 1) * topk^2 (topk = 1: steps + 1)."""
    return 1 + topk + (steps - 1) * topk * topk


def is_baseline(params: Mapping[str, Any]) -> bool:
    """No speculation: steps = 0 (or unset with no algorithm)."""
    return int(params.get(STEPS) or 0) == 0


def resolve(sampled: Mapping[str, Any], fixed: Mapping[str, Any]) -> dict[str, Any]:
    """The full server settings of one point: fixed flags overlaid by the sampled values, with
    the speculative triple completed by SGLang's rules. The baseline carries no triple."""
    params = {**fixed, **sampled}
    if is_baseline(params):
        for k in (STEPS, TOPK, DRAFT):
            params.pop(k, None)
        params[STEPS] = 0
        return params
    steps = int(params[STEPS]) if STEPS in params else 3
    topk = int(params.get(TOPK, 1))
    params[STEPS], params[TOPK] = steps, topk
    if topk == 1:
        params[DRAFT] = steps + 1
    elif DRAFT not in params:
        params[DRAFT] = steps * topk + 1
    else:
        params[DRAFT] = int(params[DRAFT])
    return params


def as_served(point: Mapping[str, Any]) -> dict[str, Any] | None:
    """A grid point (a recorded landscape's, or a sampled one) as the server runs it: where it
    names topk, its draft tokens (steps + 1 at topk 1, forced), and None where the draft tree
    cannot hold them (`invalid_reason`); other points unchanged. Two grid points that a server
    runs alike are then one point, booted once."""
    out = dict(point)
    if TOPK not in point or is_baseline(point):
        return out
    full = resolve(point, {})
    if invalid_reason(full) is not None:
        return None
    out[DRAFT] = full[DRAFT]
    return out


def invalid_reason(params: Mapping[str, Any]) -> str | None:
    """Why the server would refuse these resolved settings, or None if it would boot them."""
    if is_baseline(params):
        return None
    steps, topk, draft = params.get(STEPS), params.get(TOPK), params.get(DRAFT)
    if steps is None or topk is None or draft is None:
        return "speculative_num_steps, speculative_eagle_topk and " \
               "speculative_num_draft_tokens must be set together"
    if steps < 1 or topk < 1:
        return f"steps = {steps} and topk = {topk} must be >= 1"
    if draft < 2:
        return f"speculative_num_draft_tokens = {draft} must be >= 2"
    top = max_draft_tokens(steps, topk)
    if draft > top:
        return (f"speculative_num_draft_tokens = {draft} > {top}: SGLang's draft tree for "
                f"steps = {steps}, topk = {topk} has topk + (steps - 1) * topk^2 = {top - 1} "
                f"candidates and keeps draft tokens - 1 of them")
    mem = params.get(MEM)
    if mem is not None and not 0 < float(mem) <= 1:
        return f"mem_fraction_static = {mem} must be in (0, 1]"
    return None


def _axis(space: Sequence[ParamSpec], fixed: Mapping[str, Any], name: str,
          default: int) -> list[int]:
    """Values steps or topk can take: its searched values (bounded by config's limits: at
    most 65 steps, 64 topk), or its fixed value, or the default. (Draft tokens are checked as a
    range instead of enumerated.)"""
    spec = next((s for s in space if s.name == name), None)
    if spec is None:
        return [int(fixed.get(name, default))]
    if spec.type == "categorical":
        return [int(v) for v in spec.choices]
    return list(range(int(spec.lo), int(spec.hi) + 1))


def first_valid_point(space: Sequence[ParamSpec], fixed: Mapping[str, Any]) -> dict | None:
    """Some sampled point of the space that resolves to valid settings, or None if none does.

    Only the speculative triple can make a point invalid. Steps and topk are enumerated (their
    ranges are small); draft tokens are checked as an interval against each pair, so a wide
    range is never listed value by value; other parameters take their lowest value."""
    others = {s.name: (s.choices[0] if s.type == "categorical" else s.lo) for s in space
              if s.name not in (STEPS, TOPK, DRAFT)}
    draft = next((s for s in space if s.name == DRAFT), None)
    for steps in _axis(space, fixed, STEPS, 3):
        for topk in _axis(space, fixed, TOPK, 1):
            point = {**others}
            if any(s.name == STEPS for s in space):
                point[STEPS] = steps
            if any(s.name == TOPK for s in space):
                point[TOPK] = topk
            if draft is not None and topk > 1 and steps > 0:
                top = max_draft_tokens(steps, topk)
                if draft.type == "categorical":
                    fits = [int(d) for d in draft.choices if 2 <= int(d) <= top]
                    if not fits:
                        continue
                    point[DRAFT] = fits[0]
                else:
                    lo = max(int(draft.lo), 2)
                    if lo > min(int(draft.hi), top):
                        continue
                    point[DRAFT] = lo
            elif draft is not None:
                point[DRAFT] = draft.choices[0] if draft.type == "categorical" else int(draft.lo)
            if invalid_reason(resolve(point, fixed)) is None:
                return point
    return None


class DefineByRun:
    """Optuna define-by-run space for OptunaSearch: suggests each parameter, and draft tokens
    only where they are free (topk > 1), within the range the tree allows.

    Returns the derived constants (draft tokens when topk = 1) so that Tune's config holds the
    full triple. Where no draft count fits the tree for the chosen steps/topk, it suggests from
    the declared range; the trial then finds the point invalid and reports it without a boot.
    Picklable: Ray pickles the searcher with this function."""

    def __init__(self, space: Sequence[ParamSpec], fixed: Mapping[str, Any]) -> None:
        self.space = tuple(space)
        self.fixed = dict(fixed)

    def __call__(self, trial: Any) -> dict[str, Any] | None:
        values: dict[str, Any] = {}
        draft_spec = None
        for spec in self.space:
            if spec.name == DRAFT:
                draft_spec = spec
            else:
                values[spec.name] = _suggest(trial, spec)
        merged = {**self.fixed, **values}
        if is_baseline(merged):
            return None
        steps, topk = int(merged.get(STEPS, 3)), int(merged.get(TOPK, 1))
        if topk == 1:
            return {DRAFT: steps + 1}
        if draft_spec is not None:
            top = max_draft_tokens(steps, topk)
            if draft_spec.type == "int" and draft_spec.lo <= top:
                trial.suggest_int(DRAFT, int(draft_spec.lo), min(int(draft_spec.hi), top))
            else:
                _suggest(trial, draft_spec)
        return None


def _suggest(trial: Any, spec: ParamSpec) -> Any:
    if spec.type == "categorical":
        return trial.suggest_categorical(spec.name, list(spec.choices))
    if spec.type == "int":
        return trial.suggest_int(spec.name, int(spec.lo), int(spec.hi),
                                 step=int(spec.step or 1), log=spec.log)
    return trial.suggest_float(spec.name, float(spec.lo), float(spec.hi),
                               step=spec.step, log=spec.log)
