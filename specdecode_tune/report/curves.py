"""Curves along an axis, and their shape: what the verdicts put in words and the figures draw.

A curve "against steps" is built from the best configuration at each value of steps (best
robust score among usable trials), so that it compares like with like when mem_fraction_static
or topk also vary; `where` holds other settings fixed (one topk). Its shape, in log units with
the noise band: the best value, the plateau around it (adjacent values within the band of the
best), and the nearest flat run below the plateau that the best left behind (escaped).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..space import DRAFT, TOPK
from .rundata import Config, RunData


@dataclass(frozen=True)
class Shape:
    """The shape of one curve: best, plateau around it, an escaped flat run below it."""

    best: int
    lo: int                          # plateau around the best: indices lo..hi
    hi: int
    escaped: tuple[int, int] | None  # a flat run i..j below lo that the best left behind

    def above(self, n: int) -> int | None:
        return self.hi + 1 if self.hi + 1 < n else None


def shape(ys: Sequence[float], band: float) -> Shape:
    """Best, plateau and escaped run of a curve `ys` (log units, ordered by the axis)."""
    if not ys:
        raise ValueError("shape needs at least one point, got none")
    k = max(range(len(ys)), key=lambda i: (ys[i], -i))
    lo = hi = k
    while hi + 1 < len(ys) and ys[k] - ys[hi + 1] <= band:
        hi += 1
    while lo - 1 >= 0 and ys[k] - ys[lo - 1] <= band:
        lo -= 1
    escaped = None
    # The nearest flat run below the plateau: adjacent steps within the band, all of it worse
    # than the best by more than the band (else it would be part of the plateau).
    j = lo - 1
    while j >= 1:
        if abs(ys[j] - ys[j - 1]) <= band:
            i = j - 1
            while i - 1 >= 0 and abs(ys[i] - ys[i - 1]) <= band \
                    and max(ys[i - 1:j + 1]) - min(ys[i - 1:j + 1]) <= band:
                i -= 1
            if ys[k] - max(ys[i:j + 1]) > band:
                escaped = (i, j)
            break
        j -= 1
    return Shape(best=k, lo=lo, hi=hi, escaped=escaped)


def on_curve(params: dict[str, Any], axis: str) -> bool:
    """Whether a config belongs on this axis's curve: draft tokens are a free choice only for
    trees (topk > 1); for chains they are steps + 1, i.e. the steps curve again."""
    return axis != DRAFT or (params.get(TOPK) or 1) > 1


def curve(data: RunData, axis: str, *, where: dict[str, Any] | None = None
          ) -> list[tuple[Any, Config]]:
    """(value, best config at that value) along `axis`, ascending; `where` filters configs
    (e.g. one topk). data.configs is ranked best first, so the first seen at a value wins."""
    best: dict[Any, Config] = {}
    for cf in data.configs:
        v = cf.param(axis)
        if v is None or not on_curve(cf.params, axis) \
                or (where and any(cf.param(k) != w for k, w in where.items())):
            continue
        best.setdefault(v, cf)
    return sorted(best.items(), key=lambda kv: kv[0])
