"""The package's statistics: pure maths on numbers, shared by the load generator, the objective
and the report.

A leaf: it imports nothing of the package, so any part may use it (the load generator's
percentiles and saturation test, the objective's robust spreads and noise band, the report's
intervals) without one part reaching into another's maths. What a figure *means* (a level's
summary, a score, the noise band's default) stays with its part; only the arithmetic is here.

- `percentile`: linear interpolation between closest ranks (numpy's default);
- `t_ppf`: Student's t quantile, by GuideLLM's approximation (its saturation test uses it, so the
  decisions match GuideLLM's; `load/rounds.py` keeps a table of exact 97.5% quantiles for its
  stop rule, where the approximation is loose at few degrees of freedom);
- `wilson`, `fraction_interval`: a binomial fraction's 95% interval, for one measurement or over
  repeats;
- `MAD_K`, `mad_sigma`, `moderated_sd`, `pooled_sd`: the spreads behind the objective's robust
  score and noise band (robust, shrunk towards a prior, pooled over groups).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

MAD_K = 1.4826          # MAD -> standard deviation for normal noise


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks (numpy's
    default); None for no values. `values` need not be sorted."""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def t_ppf(p: float, dof: float) -> float:
    """Student's t quantile, by the approximation GuideLLM uses (`approx_t_ppf`: Abramowitz &
    Stegun 26.2.23 for the normal quantile, then the Cornish-Fisher expansion)."""
    if dof <= 0:
        return float("nan")
    c0, c1, c2 = 2.515517, 0.802853, 0.010328
    d0, d1, d2 = 1.432788, 0.189269, 0.001308
    q = p if p < 0.5 else 1.0 - p
    t = math.sqrt(-2.0 * math.log(q))
    z = t - ((c2 * t + c1) * t + c0) / (((d2 * t + d1) * t + d0) * t + 1.0)
    if p < 0.5:
        z = -z
    g1 = (z ** 3 + z) / 4.0
    g2 = (5 * z ** 4 + 16 * z ** 3 + 3 * z ** 2) / 96.0
    return z + g1 / dof + g2 / (dof * dof)


def wilson(good: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's score interval of a binomial fraction."""
    if total <= 0:
        return 0.0, 1.0
    p = good / total
    den = 1 + z * z / total
    mid = (p + z * z / (2 * total)) / den
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def fraction_interval(counts: Sequence[tuple[int, int]]) -> tuple[float, float, float] | None:
    """(mean fraction, low, high) over repeats, each given as (good, completed): a 95%
    Student's t interval over the repeats' fractions when there are two or more, Wilson's on
    the counts of a single one."""
    counts = [(g, n) for g, n in counts if n > 0]
    if not counts:
        return None
    if len(counts) == 1:
        g, n = counts[0]
        lo, hi = wilson(g, n)
        return g / n, lo, hi
    fr = [g / n for g, n in counts]
    mean = statistics.fmean(fr)
    half = t_ppf(0.975, len(fr) - 1) * statistics.stdev(fr) / math.sqrt(len(fr))
    # Repeats that agree by chance (all 100%) give a zero-width t interval: never narrower
    # than Wilson's on the pooled counts.
    wlo, whi = wilson(sum(g for g, _ in counts), sum(n for _, n in counts))
    return mean, max(0.0, min(mean - half, wlo)), min(1.0, max(mean + half, whi))


def mad_sigma(values: Sequence[float]) -> float:
    """MAD_K * the median absolute deviation from the median: a standard deviation for normal
    noise that one outlier barely moves (0 for a single value)."""
    med = statistics.median(values)
    return MAD_K * statistics.median(abs(v - med) for v in values)


def moderated_sd(own: float, dof: int, prior: float, prior_dof: int) -> float:
    """A standard deviation from `dof` residual degrees of freedom of its own, shrunk towards
    `prior`, which counts as `prior_dof` of them (the moderated variance of empirical Bayes,
    as limma's)."""
    return math.sqrt((prior_dof * prior ** 2 + dof * own ** 2) / (prior_dof + dof))


def pooled_sd(groups: Iterable[Sequence[float]]) -> float:
    """The pooled standard deviation of groups around their own medians: each group gives its
    values' residuals about its median and len - 1 degrees of freedom. ValueError where the
    groups have none (no group of two or more values)."""
    residuals: list[float] = []
    dof = 0
    for values in groups:
        med = statistics.median(values)
        residuals += [v - med for v in values]
        dof += len(values) - 1
    if dof <= 0:
        raise ValueError("pooled_sd needs a group of at least two values")
    # Mean squared residual about the median, corrected for the centre taken from the data.
    return math.sqrt(sum(r * r for r in residuals) / dof)
