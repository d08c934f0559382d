"""Latency targets: which requests met an SLO, and the fraction that did, with its interval.

Goodput (docs/workloads.md has the sources). A request is *good* when it met every target:
TTFT <= `ttft_s`, TPOT <= `tpot_s` ((E2E - TTFT) / (output tokens - 1)), and the
`percentile`-th percentile of its own inter-chunk gaps <= `itl_s`; the targets left unset are
not checked. This is vLLM's `--goodput ttft:MS tpot:MS e2el:MS` rule and DistServe's "SLO
attainment": a request counts only if all its targets hold. Per level, the figure is the
fraction of the window's completed requests that were good (`good_fraction`) and the good
requests per second (`goodput_s`); over repeats of a configuration the fraction gets a 95%
confidence interval (`stats.fraction_interval`, the package's statistics module: Student's t
over the repeats, never narrower than Wilson's interval on the pooled counts; Wilson's alone for
a single measurement).

Whether a level was saturated is `load/saturation.py` (GuideLLM's test).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..records import RequestRecord
from ..stats import percentile


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

