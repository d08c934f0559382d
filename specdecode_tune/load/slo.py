"""Latency targets: which requests met an SLO, and the fraction that did, with its interval.

Goodput (docs/workloads.md has the sources). A request is *good* when it met every target:
TTFT <= `ttft_s`, TPOT <= `tpot_s` ((E2E - TTFT) / (output tokens - 1)), and the
`percentile`-th percentile of its own inter-chunk gaps <= `itl_s`; the targets left unset are
not checked. This is vLLM's `--goodput ttft:MS tpot:MS e2el:MS` rule and DistServe's "SLO
attainment": a request counts only if all its targets hold. Per level, the figure is the
fraction of the window's completed requests that were good (`good_fraction`) and the good
requests per second (`goodput_s`); over repeats of a configuration the fraction gets a 95%
confidence interval (`fraction_interval`: Student's t over the repeats, never narrower than
Wilson's interval on the pooled counts; Wilson's alone for a single measurement).

Whether a level was saturated is `load/saturation.py` (GuideLLM's test).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from ..records import RequestRecord
from .saturation import t_ppf
from .stats import percentile


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
