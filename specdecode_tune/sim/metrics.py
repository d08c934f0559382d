"""Prometheus text for the simulator's `/metrics`, with SGLang's metric names.

Only what the tuner and a curious user read: token counters, running/queued gauges, KV usage,
the last-interval acceptance length and throughput, and TTFT / inter-token latency /
end-to-end histograms; from SGLang 0.5.13 (`--sglang-version`) the speculative steps and draft
tokens gauges and the verify-calls counter too. As in SGLang 0.5.10 to 0.5.22
(`observability/metrics_collector.py`) there is an inter-token latency histogram
(`sglang:inter_token_latency_seconds`, SGLang's buckets) and no time-per-output-token one (that
comes in 0.5.23). Every sample carries SGLang's `model_name` label.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specdecode_tune.sim import releases
from specdecode_tune.sim.arguments import EMULATED_VERSION

if TYPE_CHECKING:   # scheduler imports Histogram from here; avoid the import cycle at run time
    from specdecode_tune.sim.scheduler import Scheduler

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
# SGLang 0.5.10's default bucket_inter_token_latency.
_ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
                0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000,
                8.000)


@dataclass(slots=True)
class Histogram:
    """A cumulative-bucket histogram (Prometheus semantics)."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    @classmethod
    def latency(cls) -> Histogram:
        return cls(_LATENCY_BUCKETS)

    @classmethod
    def inter_token(cls) -> Histogram:
        return cls(_ITL_BUCKETS)

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.total += value
        self.count += 1

    def observe_chunk(self, interval: float, tokens: int) -> None:
        """SGLang's `observe_inter_token_latency`: a chunk of `tokens` new tokens `interval`
        seconds after the last one counts `tokens` observations of interval / tokens, and adds
        the interval to the sum."""
        i = bisect.bisect_left(self.buckets, interval / tokens)
        if i < len(self.counts):
            self.counts[i] += tokens
        self.total += interval
        self.count += tokens

    def lines(self, name: str, labels: str) -> list[str]:
        out, running = [], 0
        for bound, n in zip(self.buckets, self.counts):
            running += n
            out.append(f'{name}_bucket{{{labels},le="{bound}"}} {running}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {self.total}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


def render(scheduler: Scheduler, model_name: str, version: str = EMULATED_VERSION) -> str:
    """The Prometheus exposition text for the current state, with the metrics of SGLang
    release `version`."""
    c = scheduler.counters
    labels = f'model_name="{model_name}"'
    out: list[str] = []

    def sample(name: str, kind: str, help_: str, value: float) -> None:
        out.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}",
                    f"{name}{{{labels}}} {float(value)}"])

    sample("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
           c.prompt_tokens)
    sample("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
           c.finished_generation_tokens)
    sample("sglang:num_requests_total", "counter", "Number of requests finished.",
           c.requests_finished)
    sample("sglang:num_aborted_requests_total", "counter", "Number of requests aborted.",
           c.requests_aborted)
    # As in SGLang, these two are the last stats written, not the state now (see Scheduler).
    sample("sglang:num_running_reqs", "gauge", "The number of running requests.",
           scheduler.stats_running)
    sample("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.",
           scheduler.stats_queued)
    sample("sglang:token_usage", "gauge", "The token usage of the KV cache.", scheduler.token_usage)
    sample("sglang:gen_throughput", "gauge", "The generation throughput (token/s), last interval.",
           c.interval_gen_throughput)
    sample("sglang:spec_accept_length", "gauge", "The average acceptance length, last interval.",
           c.interval_accept_length)
    if releases.at_least(version, releases.SPEC_METRICS_SINCE):
        # 0.5.13+ (0.5.17 observability/metrics_collector.py L440-451, L1491-1495): the steps
        # and draft tokens of the decode batch at the last interval (the adaptive schedule's
        # for its size), and verify steps of finished requests (counted at their finish,
        # L1726-1727).
        sample("sglang:spec_num_steps", "gauge", "Currently active speculative_num_steps.",
               c.interval_num_steps)
        sample("sglang:spec_num_draft_tokens", "gauge",
               "Currently active speculative_num_draft_tokens.", c.interval_num_draft_tokens)
        sample("sglang:spec_verify_calls_total", "counter",
               "Number of speculative decoding verification calls.", c.finished_verify_ct)
    for name, hist, help_ in (
        ("sglang:time_to_first_token_seconds", c.ttft,
         "Histogram of time to first token in seconds."),
        ("sglang:inter_token_latency_seconds", c.itl,
         "Histogram of inter-token latency in seconds."),
        ("sglang:e2e_request_latency_seconds", c.e2e,
         "Histogram of end-to-end request latency in seconds."),
    ):
        # prometheus_client shows a labelled histogram's samples once it has observed one.
        out.extend([f"# HELP {name} {help_}", f"# TYPE {name} histogram",
                    *(hist.lines(name, labels) if hist.count else [])])
    return "\n".join(out) + "\n"
