"""Whether a level was saturated, as GuideLLM's over-saturation detector (`OverSaturationDetector`
in its `scheduler/constraints/over_saturation.py`) decides it: a linear fit of TTFT against time
and one of the requests in flight against time must both have a positive slope whose 95% margin
of error, relative to the slope, is under 2 (`SlopeChecker.check_slope`: t-critical x standard
error / slope), with at least 5 points each, and at least half the requests' TTFTs above
`minimum_ttft` = 2.5 s (GuideLLM returns no alert while `n > violations * 2`). As in GuideLLM
the series run from the level's start (its warm-up included) to the window's end: each finished
request's TTFT at its finish time, and at each request's send time the requests still waiting
for their first token (GuideLLM counts the client's requests in flight, which a closed loop
holds constant by construction; the ones still waiting are the server's queue as the client sees
it). Two differences, both for closed loops: a request still without a first token at the
window's end counts as a TTFT violation when it had waited over `minimum_ttft` (GuideLLM counts
finished requests only), and there is no 30 s minimum duration before the check (a level here is
shorter).
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from ..records import RequestRecord
from ..stats import t_ppf

# GuideLLM's OverSaturationDetector defaults.
MIN_TTFT_S = 2.5
MOE_THRESHOLD = 2.0
CONFIDENCE = 0.95
MIN_WINDOW = 5


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
