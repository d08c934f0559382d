"""The axes the plateau sampler watches, and an axis's levels.

An axis is one ordinal parameter over the whole study (the union of its distributions: a
define-by-run range varies from trial to trial). Its *levels* are its explored values, except
that continuous floats and very fine discrete axes are grouped into `MAX_LEVELS` equal-width
bins (log-width on log axes), so that two nearly equal floats do not make a "plateau".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...space import ParamSpec

MAX_DISCRETE_LEVELS = 64              # discrete axes up to this many values: each value a level
MAX_LEVELS = 16                       # other axes (continuous floats) are binned into this many


@dataclass(frozen=True)
class Axis:
    """One watched parameter: its widest range over the study, or its numeric choices."""

    name: str
    kind: str                          # "int" | "float" | "categorical" (numeric choices)
    low: float
    high: float
    log: bool
    step: float | None
    choices: tuple[float, ...] = ()

    @classmethod
    def of(cls, spec: ParamSpec, explicit: bool) -> Axis | None:
        """The axis of a parameter, or None where it has none to move along: a single value,
        or a categorical not named explicitly (`ordinal_params`)."""
        if spec.type == "categorical":
            if not explicit:
                return None
            if not spec.ordinal:
                raise ValueError(
                    f"ordinal_params names {spec.name!r}, but its choices are not all numbers: "
                    f"{spec.choices!r}"
                )
            choices = sorted({float(c) for c in spec.choices})
            return cls(spec.name, "categorical", choices[0], choices[-1], False, None,
                       tuple(choices))
        low, high = float(spec.low), float(spec.high)  # type: ignore[arg-type]
        if high <= low:
            return None
        return cls(spec.name, spec.type, low, high, spec.log, spec.step)

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
