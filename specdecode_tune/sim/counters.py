"""What the simulated scheduler counts for `/server_info` and `/metrics` (`Counters`): lifetime
token and request totals, the last log interval's figures, and the latency histograms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdecode_tune.sim.metrics import Histogram


@dataclass(slots=True)
class Counters:
    """Lifetime and last-interval figures for /server_info and /metrics."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    verify_ct: int = 0
    verify_tokens: int = 0              # tokens produced by verify steps (not prefill)
    interval_accept_length: float = 0.0
    interval_gen_throughput: float = 0.0
    # the decode batch's speculative steps and draft tokens at the last interval (0 without
    # speculation), and the verify steps of finished requests (SGLang 0.5.13+'s /metrics)
    interval_num_steps: int = 0
    interval_num_draft_tokens: int = 0
    finished_verify_ct: int = 0
    # the tokens of finished requests: what SGLang's sglang:generation_tokens_total counts (it
    # adds a request's completion_tokens when it finishes, every release: 0.5.10.post1
    # metrics_collector.py L1330, 0.5.17 L1724), so that its delta over the verify calls' is
    # the window's acceptance length; generation_tokens counts them as they are made
    finished_generation_tokens: int = 0
    ttft: Histogram = field(default_factory=Histogram.latency)
    itl: Histogram = field(default_factory=Histogram.inter_token)
    e2e: Histogram = field(default_factory=Histogram.latency)

    @property
    def avg_accept_length(self) -> float:
        return self.verify_tokens / self.verify_ct if self.verify_ct else 0.0
