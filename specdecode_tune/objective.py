"""Scores and noise: what "better" means, and when a difference is only noise.

The scalar score of a trial is the weighted mean over concurrency levels of
log(output tok/s / the no-speculation baseline's tok/s at the same level). A score of 0 is the
baseline; +0.10 is about 10% faster on (weighted geometric) average; differences of scores are
relative differences, so one noise band in relative terms serves every level.

Repeats of one configuration are summarised robustly, as vLLM's tuner does: the median, less
a spread (vLLM: 1.4826 * MAD). Here the spread of a configuration is its own 1.4826 * MAD shrunk
towards the pooled noise (half the band) when the band is known: two or three repeats say little
about their own spread, and a configuration measured once has no MAD at all, so without the
shrinkage it would rank with no penalty above every re-measured one (a re-measurement could only
lower a configuration's rank, and the ranking chased single boots). The pooled noise counts as
PRIOR_DOF residual degrees of freedom, the configuration's own MAD as n - 1 (the moderated
variance of empirical Bayes, as limma's). The noise band is two pooled standard deviations of the
repeats' residuals around their medians; a difference inside it is reported "within noise",
never as a win. The arithmetic (the MAD, the moderated and the pooled standard deviation) is the
package's statistics module's (`stats.py`); what it means for scores is here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from .records import LevelSummary
from .stats import mad_sigma, moderated_sd, pooled_sd

PRIOR_DOF = 3           # residual degrees of freedom the pooled noise counts as in a spread
RATIO_FLOOR = 0.01      # a level that produced (almost) nothing scores log(0.01), not -inf
LATENCY_METRICS = ("ttft_p50", "tpot_p50", "itl_p50", "e2e_p50")


def closed_levels(levels: Iterable[LevelSummary]) -> dict[int, LevelSummary]:
    return {s.concurrency: s for s in levels if s.mode == "closed"}


def scalar_score(levels: Iterable[LevelSummary], baseline: Iterable[LevelSummary],
                 weights: Mapping[int, float]) -> float | None:
    """Weighted mean log-speedup over the baseline; None if a weighted level is missing."""
    def log_speedup(s: LevelSummary, b: LevelSummary) -> float | None:
        if b.output_tok_s <= 0:
            return None
        return math.log(max(s.output_tok_s / b.output_tok_s, RATIO_FLOOR))
    return _weighted_mean(levels, baseline, weights, log_speedup)


def _weighted_mean(levels: Iterable[LevelSummary], baseline: Iterable[LevelSummary],
                   weights: Mapping[int, float],
                   term: Callable[[LevelSummary, LevelSummary], float | None]) -> float | None:
    """The weights' mean of `term(level, its baseline)` over the closed levels; None if a
    weighted level is missing on either side or its term is None."""
    mine, base = closed_levels(levels), closed_levels(baseline)
    num = den = 0.0
    for c, w in weights.items():
        if w <= 0:
            continue
        s, b = mine.get(c), base.get(c)
        x = None if s is None or b is None else term(s, b)
        if x is None:
            return None
        num += w * x
        den += w
    return num / den if den > 0 else None


def speedups(levels: Iterable[LevelSummary], baseline: Iterable[LevelSummary]
             ) -> dict[int, float]:
    """tok/s ratio over the baseline at each level both measured."""
    base = closed_levels(baseline)
    return {c: s.output_tok_s / base[c].output_tok_s
            for c, s in closed_levels(levels).items()
            if c in base and base[c].output_tok_s > 0}


def metric_modes(metrics: Sequence[str]) -> list[str]:
    """Pareto directions: latencies are minimised, rates maximised."""
    return ["min" if m.partition("@")[0] in LATENCY_METRICS else "max" for m in metrics]


def pareto_values(levels: Iterable[LevelSummary], metrics: Sequence[str]) -> list[float] | None:
    """Per-level metric values named "NAME@LEVEL"; None if one is missing."""
    by_level = closed_levels(levels)
    out = []
    for m in metrics:
        name, _, level = m.partition("@")
        s = by_level.get(int(level))
        value = getattr(s, name, None) if s is not None else None
        if value is None:
            return None
        out.append(float(value))
    return out


@dataclass(frozen=True)
class Robust:
    """A configuration's repeated scores, summarised."""

    n: int
    median: float
    sigma: float        # 1.4826 * MAD, shrunk towards the pooled noise when that is given
    score: float        # median - sigma: what ranks configurations

    @classmethod
    def of(cls, values: Sequence[float], band: float | None = None) -> Robust:
        """`band`: the noise band (two pooled standard deviations); None: the own MAD alone."""
        if not values:
            raise ValueError("Robust.of needs at least one value")
        med = statistics.median(values)
        own = mad_sigma(values)
        sigma = own if band is None else moderated_sigma(own, len(values) - 1, band / 2.0)
        return cls(n=len(values), median=med, sigma=sigma, score=med - sigma)


def moderated_sigma(own: float, dof: int, pooled: float) -> float:
    """A configuration's spread from `dof` residual degrees of freedom of its own, shrunk
    towards the pooled standard deviation, which counts as PRIOR_DOF of them."""
    return moderated_sd(own, dof, pooled, PRIOR_DOF)


MIN_BAND_DOF = 3   # residual degrees of freedom below which the measured band says too little


def band_dof(groups: Iterable[Sequence[float]]) -> int:
    """The residual degrees of freedom behind `noise_band`: each configuration measured at
    least twice counts its repeats less one; 0 where they are fewer than MIN_BAND_DOF (the
    band is then the default)."""
    dof = sum(len(values) - 1 for values in groups if len(values) >= 2)
    return dof if dof >= MIN_BAND_DOF else 0


def noise_band(groups: Iterable[Sequence[float]], default: float) -> float:
    """Two pooled standard deviations of repeated scores around their medians.

    Uses every configuration measured at least twice; with fewer than MIN_BAND_DOF residual
    degrees of freedom (`band_dof`) the measurement says too little and `default` is
    returned."""
    repeated = [values for values in groups if len(values) >= 2]
    if not band_dof(repeated):
        return default
    return min(max(2.0 * pooled_sd(repeated), 0.002), 0.5)


def cautious_band(groups: Iterable[Sequence[float]], default: float) -> float:
    """The noise band a decision may rest on while the repeats are too few to measure one:
    `noise_band` where they measure it (`band_dof`); else `default` widened by what the repeats
    so far say (their pooled spread, moderated towards half of `default` counted as PRIOR_DOF
    degrees of freedom), never narrowed below it. A noisy server's first repeats widen it at
    once; `default` alone would call its differences beyond noise."""
    repeated = [values for values in groups if len(values) >= 2]
    if band_dof(repeated) or not repeated:
        return noise_band(repeated, default)
    dof = sum(len(values) - 1 for values in repeated)
    so_far = 2.0 * moderated_sd(pooled_sd(repeated), dof, default / 2.0, PRIOR_DOF)
    return min(max(default, so_far), 0.5)


def compare(a: float, b: float, band: float) -> str:
    """'better' / 'worse' / 'within noise': a against b, scores in log units."""
    if a - b > band:
        return "better"
    if b - a > band:
        return "worse"
    return "within noise"


def pct(log_diff: float) -> str:
    """A log-score difference as a signed percentage: 0.018 -> '+1.8%'."""
    return f"{(math.exp(log_diff) - 1) * 100:+.1f}%"


def goodput_s(s: LevelSummary) -> float | None:
    """Good requests per second of a level's window (those that met every latency target);
    None where the level was not judged against targets."""
    if s.slo_good is None or s.duration_s <= 0:
        return None
    return s.slo_good / s.duration_s


def goodput_score(levels: Iterable[LevelSummary], baseline: Iterable[LevelSummary],
                  weights: Mapping[int, float]) -> float | None:
    """Weighted mean log-ratio of good requests/s over the baseline's (the goodput objective).

    Both sides are floored at half a good request per window, so a level where neither met the
    targets scores 0 (a tie), and one where only the baseline did scores low but finite."""
    def log_ratio(s: LevelSummary, b: LevelSummary) -> float | None:
        g, gb = goodput_s(s), goodput_s(b)
        if g is None or gb is None:
            return None
        floor = 0.5 / max(s.duration_s, b.duration_s)
        return math.log(max(g, floor) / max(gb, floor))
    return _weighted_mean(levels, baseline, weights, log_ratio)


def objective_score(kind: str, levels: Iterable[LevelSummary], baseline: Iterable[LevelSummary],
                    weights: Mapping[int, float]) -> float | None:
    """The scalar score of an objective kind: goodput's, else the tok/s log-speedup."""
    if kind == "goodput":
        return goodput_score(levels, baseline, weights)
    return scalar_score(levels, baseline, weights)
