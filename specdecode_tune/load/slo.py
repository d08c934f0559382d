"""Latency targets and saturation: which requests met an SLO, and whether a level was saturated.

Goodput (docs/workloads.md has the sources). A request is *good* when it met every target:
TTFT <= `ttft_s`, TPOT <= `tpot_s` ((E2E - TTFT) / (output tokens - 1)), and the
`percentile`-th percentile of its own inter-chunk gaps <= `itl_s`; the targets left unset are
not checked. This is vLLM's `--goodput ttft:MS tpot:MS e2el:MS` rule and DistServe's "SLO
attainment": a request counts only if all its targets hold. Per level, the figure is the
fraction of the window's completed requests that were good (`good_fraction`) and the good
requests per second (`goodput_s`); over repeats of a configuration the fraction gets a 95%
confidence interval (`fraction_interval`: Student's t over the repeats, never narrower than
Wilson's interval on the pooled counts; Wilson's alone for a single measurement).

Saturation, as GuideLLM's over-saturation detector (`OverSaturationDetector` in its
`scheduler/constraints/over_saturation.py`) decides it: a linear fit of TTFT against time and
one of the requests in flight against time must both have a positive slope whose 95% margin of
error, relative to the slope, is under 2 (`SlopeChecker.check_slope`: t-critical x standard
error / slope), with at least 5 points each, and at least half the requests' TTFTs above
`minimum_ttft` = 2.5 s (GuideLLM returns no alert while `n > violations * 2`). As in GuideLLM
the series run from the level's start (its warm-up included) to the window's end: each
finished request's TTFT at its finish time, and at each request's send time the requests
still waiting for their first token (GuideLLM counts the client's requests in flight, which a
closed loop holds constant by construction; the ones still waiting are the server's queue as
the client sees it). Two differences, both for closed loops: a request still without a first
token at the window's end counts as a TTFT violation when it had waited over `minimum_ttft`
(GuideLLM counts finished requests only), and there is no 30 s minimum duration before the
check (a level here is shorter).
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from ..records import RequestRecord
from .stats import percentile

# GuideLLM's OverSaturationDetector defaults.
MIN_TTFT_S = 2.5
MOE_THRESHOLD = 2.0
CONFIDENCE = 0.95
MIN_WINDOW = 5


@dataclass(frozen=True, slots=True)
class Slo:
    """Latency targets in seconds (None: not checked) and the ITL percentile per request."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    itl_s: float | None = None
    percentile: float = 90.0

    def met(self, r: RequestRecord) -> bool:
        """Did this (completed, ok) request meet every target?"""
        if self.ttft_s is not None and (r.ttft is None or r.ttft > self.ttft_s):
            return False
        if self.tpot_s is not None and r.ttft is not None and r.output_tokens > 1 \
                and (r.latency - r.ttft) / (r.output_tokens - 1) > self.tpot_s:
            return False
        if self.itl_s is not None and r.chunk_gaps:
            gap = percentile(r.chunk_gaps, self.percentile)
            if gap is not None and gap > self.itl_s:
                return False
        return True


def good_requests(records: Sequence[RequestRecord], slo: Slo) -> tuple[int, int]:
    """(good, completed) over the window's requests that completed; a failed request counts
    as completed and not good (it met no target)."""
    done = [r for r in records if r.in_window]
    good = sum(1 for r in done if r.error is None and slo.met(r))
    return good, len(done)


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


def slope_alert(xs: Sequence[float], ys: Sequence[float]) -> tuple[bool, float | None]:
    """GuideLLM's `SlopeChecker.check_slope`: (positive slope with a relative 95% margin of
    error under `MOE_THRESHOLD`, the slope); no alert with fewer than 3 points."""
    n = len(xs)
    if n < 3:
        return False, None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = max(sum((x - mx) ** 2 for x in xs), 1e-12)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    syy = sum((y - my) ** 2 for y in ys)
    slope = sxy / sxx
    rss = max(syy - sxy * sxy / sxx, 0.0)
    se = math.sqrt(rss / (n - 2) / sxx)
    moe = t_ppf(1 - (1 - CONFIDENCE) / 2, n - 2) * se / max(slope, 1e-12)
    return slope > 0 and moe < MOE_THRESHOLD, slope


@dataclass(frozen=True, slots=True)
class Saturation:
    saturated: bool
    ttft_slope: float | None      # seconds of TTFT per second of the window
    waiting_slope: float | None   # requests waiting for a first token, per second
    why: str


def saturation(records: Sequence[RequestRecord], w1: float,
               min_ttft_s: float = MIN_TTFT_S) -> Saturation:
    """GuideLLM's over-saturation test over a level from its start to `w1` (level clock)."""
    sent = sorted((r for r in records if r.start <= w1), key=lambda r: r.start)
    finished = sorted((r for r in sent if r.ttft is not None and r.error is None
                       and r.end <= w1), key=lambda r: r.end)
    # A request still without a first token at w1 waited at least w1 - start: a violation
    # when that is over the limit (GuideLLM counts finished requests only; here a closed
    # loop's queue would otherwise hide exactly the requests that waited longest).
    censored = sum(1 for r in sent if r.ttft is None and r.error is None
                   and w1 - r.start > min_ttft_s)
    slow = sum(1 for r in finished if (r.ttft or 0.0) > min_ttft_s) + censored
    judged = len(finished) + censored
    if len(sent) < MIN_WINDOW:
        return Saturation(False, None, None, f"{len(sent)} requests sent: too few to judge")
    if judged > 2 * slow:
        return Saturation(False, None, None,
                          f"{slow} of {judged} TTFTs over {min_ttft_s:g} s: under half")
    # Waiting at t: sent by t, first token after t. A first token never precedes its send,
    # so that is (sent by t) - (first tokens by t): two sorted lists, not a pass per request.
    starts = [r.start for r in sent]
    firsts = sorted(r.start + r.ttft for r in sent if r.ttft is not None)
    waiting = [bisect.bisect_right(starts, s) - bisect.bisect_right(firsts, s) for s in starts]
    wait_ok, wait_slope = slope_alert(starts, [float(w) for w in waiting])
    if len(finished) < MIN_WINDOW:
        return Saturation(wait_ok, None, wait_slope,
                          "requests waiting for a first token climb" if wait_ok else
                          "no sustained climb")
    ttft_ok, ttft_slope = slope_alert([r.end for r in finished],
                                      [r.ttft or 0.0 for r in finished])
    sat = wait_ok and ttft_ok
    why = (f"TTFT climbs {ttft_slope:.3g} s/s and requests waiting for a first token "
           f"{wait_slope:.3g}/s over the level" if sat else "no sustained climb")
    return Saturation(sat, ttft_slope, wait_slope, why)
