"""How the report writes settings and numbers: one form for each, wherever it appears.

A setting is written with its short name (`space.SHORT_NAMES`) in the order a reader asks about
the axes (`AXIS_ORDER`); a parameter value with `fmt_value`; a tok/s ratio and a noise band as
the signed or ± percentage a reader expects. A log-score difference is `objective.pct`, which
the search's lines use too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..space import DRAFT, MEM, SHORT_NAMES, STEPS, TOPK, is_baseline

# Axes in the order a reader asks about them: steps first (the seed's question).
AXIS_ORDER = (STEPS, TOPK, DRAFT, MEM)


def describe(params: Mapping[str, Any], *, only: Sequence[str] | None = None) -> str:
    """Short human form of the searched settings: 'steps=4 topk=1 draft=5 mem=0.85'."""
    if is_baseline(params):
        return "no speculation (baseline)"
    keys = [k for k in AXIS_ORDER if k in params] + sorted(
        k for k in params if k not in AXIS_ORDER)
    if only is not None:
        keys = [k for k in keys if k in only]
    parts = []
    for k in keys:
        v = params[k]
        if v is None or k.startswith("_"):
            continue
        parts.append(f"{SHORT_NAMES.get(k, k)}={fmt_value(v)}")
    return " ".join(parts)


def fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def fmt_tok(v: float | None) -> str:
    """A tok/s figure to one decimal; '-' where there is none."""
    return f"{v:.1f}" if v is not None else "-"


def pct_gain(ratio: float) -> str:
    """A tok/s ratio as a signed percentage: 1.018 -> '+1.8%'."""
    return f"{(ratio - 1) * 100:+.1f}%"


def band_pct(band: float) -> str:
    """A log-units band as the relative ± a reader expects: 0.025 -> '±2.5%'."""
    return f"±{math.expm1(band) * 100:.1f}%"


def shorten(text: str, limit: int) -> str:
    """`text` on one line, cut to `limit` characters with '...' where longer."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
