"""The configurations the model can name: every valid speculative point of the space, as arrays.

The model knows four axes: steps, topk, draft tokens and the memory fraction. A point is named
by its resolved (steps, topk, draft tokens, memory fraction) (`point_key`), so two sampled
points the server runs as one configuration (e.g. topk = 1 with any draft count) are one
candidate. Points SGLang refuses (`space.invalid_reason`), or whose boot the servers' release
is known to crash (`refuses`), are not candidates. A continuous float
axis is enumerated on `FLOAT_GRID` points (log-spaced on log axes); other parameters are not
enumerated (the plan gives them the incumbent's values).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any, cast

import numpy as np

from ...space import (
    DRAFT,
    MEM,
    STEPS,
    TOPK,
    ParamSpec,
    invalid_reason,
    is_baseline,
    max_draft_tokens,
    resolve,
)

FLOAT_GRID = 17                                # points of a continuous float axis


def point_key(steps: int, topk: int, draft: int, mem: float | None) -> tuple:
    """A speculative configuration as the model names it."""
    return (int(steps), int(topk), int(draft), None if mem is None else round(float(mem), 6))


@dataclass(frozen=True)
class Candidates:
    """Every valid point of the space, as arrays; `triple` indexes `triples` (steps, topk, n)."""

    sampled: tuple[dict[str, Any], ...]
    keys: tuple[tuple, ...]
    steps: np.ndarray
    topk: np.ndarray
    draft: np.ndarray
    mem: np.ndarray
    triple: np.ndarray
    triples: tuple[tuple[int, int, int], ...]


def enumerate_space(specs: Sequence[ParamSpec], fixed: Mapping[str, Any],
                    refuses: Callable[[Mapping[str, Any]], str | None] | None = None
                    ) -> Candidates | None:
    """Every valid speculative point of the four known axes (others are not enumerated).
    `refuses`: why the servers' release crashes on a sampled point (the search passes
    `backends.known_refusal` for its backend), asked once per (steps, topk, draft)."""
    crashes: dict[tuple[int, int, int], bool] = {}
    by_name = {s.name: s for s in specs}
    names = [n for n in (STEPS, TOPK, MEM) if n in by_name]
    draft_spec = by_name.get(DRAFT)
    seen: dict[tuple, dict[str, Any]] = {}
    for combo in product(*(_axis_values(by_name[n]) for n in names)):
        sampled = dict(zip(names, combo))
        merged = {**fixed, **sampled}
        if is_baseline(merged):
            continue
        steps, topk = int(merged.get(STEPS, 3)), int(merged.get(TOPK, 1))
        drafts: list[Any] = [None]
        if topk > 1 and draft_spec is not None:
            drafts = [d for d in _axis_values(draft_spec) if d <= max_draft_tokens(steps, topk)]
        for d in drafts:
            point = dict(sampled)
            if d is not None:
                point[DRAFT] = int(d)
            params = resolve(point, fixed)
            if invalid_reason(params) is not None:
                continue
            if refuses is not None:
                triple = (int(params[STEPS]), int(params[TOPK]), int(params[DRAFT]))
                if triple not in crashes:
                    crashes[triple] = refuses(point) is not None
                if crashes[triple]:
                    continue
            key = point_key(params[STEPS], params[TOPK], params[DRAFT], params.get(MEM))
            seen.setdefault(key, point)
    if not seen:
        return None
    keys = tuple(seen)
    triples = tuple(sorted({k[:3] for k in keys}))
    index = {t: i for i, t in enumerate(triples)}
    return Candidates(
        sampled=tuple(seen[k] for k in keys),
        keys=keys,
        steps=np.array([k[0] for k in keys]),
        topk=np.array([k[1] for k in keys]),
        draft=np.array([k[2] for k in keys]),
        mem=np.array([1.0 if k[3] is None else k[3] for k in keys]),
        triple=np.array([index[k[:3]] for k in keys]),
        triples=triples,
    )


def _axis_values(spec: ParamSpec) -> list[Any]:
    if spec.type == "float" and not spec.step:
        if spec.log:
            lo, hi = math.log(cast(float, spec.low)), math.log(cast(float, spec.high))
            return [math.exp(lo + (hi - lo) * i / (FLOAT_GRID - 1)) for i in range(FLOAT_GRID)]
        return spec.grid(FLOAT_GRID)
    return spec.values()


def one(cands: Candidates, i: int) -> Candidates:
    """The candidates reduced to the one at index `i` (its own triple table)."""
    return Candidates(sampled=(cands.sampled[i],), keys=(cands.keys[i],),
                      steps=cands.steps[i:i + 1], topk=cands.topk[i:i + 1],
                      draft=cands.draft[i:i + 1], mem=cands.mem[i:i + 1],
                      triple=np.array([0]), triples=(cands.triples[int(cands.triple[i])],))


def subset(cands: Candidates, idx: Sequence[int]) -> Candidates:
    """The candidates reduced to those at `idx`, in that order (their own triple table)."""
    triples = sorted({int(cands.triple[i]) for i in idx})
    where = {t: n for n, t in enumerate(triples)}
    return Candidates(sampled=tuple(cands.sampled[i] for i in idx),
                      keys=tuple(cands.keys[i] for i in idx),
                      steps=cands.steps[list(idx)], topk=cands.topk[list(idx)],
                      draft=cands.draft[list(idx)], mem=cands.mem[list(idx)],
                      triple=np.array([where[int(cands.triple[i])] for i in idx]),
                      triples=tuple(cands.triples[t] for t in triples))
