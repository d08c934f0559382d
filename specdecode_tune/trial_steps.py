"""The steps of one trial that `trial.run_trial` runs in order: which levels are left, what the
booted server says of itself, and what follows each level (`LevelRecorder`).

Kept apart from `trial.py` so that `run_trial` reads as the trial's sequence (prune, boot,
facts, levels, verdict) and each step can be read on its own. Nothing here boots a server or
decides a trial's status: `run_trial` does both, from what these steps return or raise
(`ServerGone`, `NothingMeasured`). This module imports nothing of `trial.py`.

What the trial checks after each level, and why, is `trial.py`'s docstring.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import store, telemetry
from .backends import Backend
from .config import Experiment, MeasureConfig
from .load import Api, LevelPlan, level_failure, measure
from .load.slo import Slo, good_requests
from .load.stats import ACCEPT_UNREAD
from .load.tokencount import server_lengths
from .records import LevelSummary, RequestRecord, ServerFacts
from .server import ServerProcess

LevelCallback = Callable[[LevelSummary, Sequence[RequestRecord]], None]
Lengths = dict[str, tuple[int, int]]

# How long a server may take to answer its health path after a level before it counts as hung.
HEALTH_PROBE_S = 5.0
# The boot's log the backend reads its memory lines from (SGLang logs them early in a boot
# of a few thousand lines).
BOOT_LOG_BYTES = 4 << 20
# How long a level's end waits for the server to finish or abort the requests it still has.
DRAIN_S = 30.0
DRAIN_POLL_S = 0.02


class ServerGone(Exception):
    """The server died or stopped answering during a level: stop measuring, keep what is done."""


class NothingMeasured(Exception):
    """No request of a level succeeded: stop measuring, keep what is done; the trial failed."""


def drain(busy: Callable[[], int | None], limit_s: float) -> tuple[int, float]:
    """Wait until `busy()` (the server's running + queued requests, None where it cannot
    tell) is 0 or None, for at most `limit_s`. Returns (requests left, seconds waited)."""
    t0 = time.monotonic()
    while True:
        left = busy() or 0
        waited = time.monotonic() - t0
        if left == 0 or waited >= limit_s:
            return left, waited
        time.sleep(min(DRAIN_POLL_S, limit_s - waited))


def level_name(summary: LevelSummary) -> str:
    return f"C={summary.concurrency}" if summary.mode == "closed" else f"{summary.rate:g} req/s"


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(empty log)"


def with_note(note: str, more: str) -> str:
    """`note` with `more` added after a "; "."""
    return (note + "; " if note else "") + more


# ---------------------------------------------------------------------------------------------
# The levels: which, in what order, which are left


def level_plans(m: MeasureConfig) -> list[LevelPlan]:
    """Closed-loop levels in the experiment's order, then open-loop rates."""
    def plan(concurrency: int | None = None, rate: float | None = None) -> LevelPlan:
        closed = concurrency is not None
        return LevelPlan(concurrency=concurrency, rate=rate, warmup_s=m.warmup_s,
                         duration_s=m.window_s if closed else m.duration_s,
                         max_requests=m.max_requests, request_timeout_s=m.request_timeout_s,
                         precision=m.precision if closed else None, min_rounds=m.min_rounds)

    return [plan(concurrency=c) for c in m.concurrency] + [plan(rate=r) for r in m.rates]


def plan_key(plan: LevelPlan) -> tuple[str, float]:
    return ("rate", float(plan.rate)) if plan.rate else ("closed", float(plan.concurrency or 0))


def summary_key(s: LevelSummary) -> tuple[str, float]:
    return ("rate", float(s.rate or 0)) if s.mode == "rate" else ("closed", float(s.concurrency))


def plans_left(m: MeasureConfig, done_levels: Sequence[LevelSummary]) -> list[LevelPlan]:
    """The experiment's levels that `done_levels` (a resumed trial's checkpoint) lacks."""
    done = {summary_key(s) for s in done_levels}
    return [p for p in level_plans(m) if plan_key(p) not in done]


def in_rounds_of(plans: list[LevelPlan], limit: Any) -> list[LevelPlan]:
    """The plans with the server's running limit (an int > 0, else left as they are) as the
    size of a round: a loop over the limit is served in waves of it."""
    if isinstance(limit, int) and limit > 0:
        return [dataclasses.replace(p, round_size=limit) if p.by_rounds else p for p in plans]
    return plans


# ---------------------------------------------------------------------------------------------
# What the experiment asks of the server's reads


def api_key(exp: Experiment) -> str:
    """The API key from the environment variable the experiment names ('' without one)."""
    name = exp.backend.api_key_env
    return os.environ.get(name, "") if name else ""


def api_headers(exp: Experiment) -> dict[str, str]:
    """Authorization with the experiment's API key; never stored."""
    key = api_key(exp)
    return {"Authorization": f"Bearer {key}"} if key else {}


def slo_of(exp: Experiment) -> Slo | None:
    """The goodput objective's latency targets (seconds), or None for other objectives."""
    o = exp.objective
    if o.kind != "goodput":
        return None

    def s(ms: float | None) -> float | None:
        return None if ms is None else ms / 1000.0

    return Slo(ttft_s=s(o.ttft_ms), tpot_s=s(o.tpot_ms), itl_s=s(o.itl_ms),
               percentile=o.percentile)


# ---------------------------------------------------------------------------------------------
# What the booted server says of itself


def read_server(exp: Experiment, backend: Backend, srv: ServerProcess, env: Mapping[str, str],
                params: Mapping[str, Any]) -> tuple[ServerFacts, Any, Lengths | None]:
    """What the booted server says of itself: its facts (with the GPUs it runs on, its own word
    else the CUDA_VISIBLE_DEVICES it was given, its boot time and its memory lines), what it
    runs at once (the backend knows where its engine says it), and a sharegpt sample counted
    again by its tokenizer where it has an endpoint for it (llama-server, vLLM)."""
    facts = backend.read_facts(srv.base_url, headers=api_headers(exp))
    gpu_ids = facts.gpu_ids or tuple(
        g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g)
    facts = dataclasses.replace(facts, gpu_ids=gpu_ids, boot_s=srv.boot_s)
    # The memory the boot left free and its graphs kept (the engine's own memory
    # lines): the model's out-of-memory boundary learns from boots that ran, not only
    # from boots refused.
    memory = backend.memory_facts(srv.log_tail(BOOT_LOG_BYTES))
    if memory:
        facts = dataclasses.replace(facts, extra={**facts.extra, **memory})
    limit = backend.running_limit(facts, params)
    lengths = server_lengths_of(exp, backend, srv.base_url)
    if lengths is not None:
        facts = dataclasses.replace(facts, extra={
            **facts.extra, "sharegpt_counted_by": "server tokenize endpoint",
            "sharegpt_prompts": len(lengths)})
    return facts, limit, lengths


def server_lengths_of(exp: Experiment, backend: Any, base_url: str) -> Lengths | None:
    """A sharegpt workload's token counts from the server's tokenize endpoint, where the
    backend has one (`load.tokencount`); None otherwise, or when it does not answer."""
    endpoint = getattr(backend, "tokenize", None)
    if exp.workload.kind != "sharegpt" or endpoint is None:
        return None
    return server_lengths(base_url, endpoint, exp.workload.sharegpt_sample(),
                          headers={**api_headers(exp), **backend.request_headers})


# ---------------------------------------------------------------------------------------------
# Each level: its start, its end


@dataclasses.dataclass(frozen=True)
class LevelTarget:
    """Where a level's tables go and what they are of."""

    run_dir: str
    trial_id: str
    params: Mapping[str, Any]
    repeat: int = 0


class LevelRecorder:
    """The levels of one booted server: `measure_all` measures them under GPU telemetry of
    exactly this trial's GPUs (one window per level; records nothing, and says so once, where
    there is no NVML or no GPU), and after each level (`end`) the level is checked, written and
    appended to `finished`, and the trial stopped where it must (`ServerGone`,
    `NothingMeasured`)."""

    def __init__(self, exp: Experiment, backend: Backend, srv: ServerProcess, *,
                 env: Mapping[str, str], limit: Any, target: LevelTarget,
                 finished: list[LevelSummary], on_level: LevelCallback | None) -> None:
        self.exp, self.backend, self.srv = exp, backend, srv
        self.limit, self.target, self.finished, self.on_level = limit, target, finished, on_level
        self.sampler = telemetry.TelemetrySampler(
            env.get("CUDA_VISIBLE_DEVICES"), own_pids=lambda: telemetry.server_pids(srv.pid),
            rules=telemetry.SuspectRules(warmup_s=exp.measure.warmup_s))
        self.counters: list[Any] = []      # the server's counters when the level started
        self.slo = slo_of(exp)

    def measure_all(self, plans: Sequence[LevelPlan], lengths: Lengths | None) -> None:
        """The warm-up, then each level of `plans` (`load.measure`)."""
        exp, backend = self.exp, self.backend
        with self.sampler:
            measure(self.srv.base_url, Api(exp.backend.api, stream=backend.stream_format),
                    exp.workload, plans,
                    warmup_requests=exp.measure.warmup_requests, on_level=self.end,
                    headers={**api_headers(exp), **backend.request_headers},
                    on_level_start=self.start, lengths=lengths)

    def start(self, _plan: LevelPlan) -> None:
        """A level's start (`measure`'s `on_level_start`): a new telemetry window, and the
        server's counters to take the level's acceptance from."""
        self.sampler.cut()             # the warm-up and the pause between levels: dropped
        self.counters[:] = [self._snapshot()]

    def end(self, summary: LevelSummary, records: Sequence[RequestRecord]) -> None:
        """A level's end (`measure`'s `on_level`): its telemetry, drained, its acceptance, its
        checks and its SLO count; its tables written, then the trial stopped where it must."""
        tele = self.sampler.cut()
        summary = telemetry.merge_level(summary, tele)
        summary = self._drained(summary)
        summary = self._acceptance(summary)
        summary, alive, answering, probe_s = self._checked(summary)
        if self.slo is not None:
            good, total = good_requests(records, self.slo)
            summary = dataclasses.replace(summary, slo_good=good, slo_total=total)
        t = self.target
        store.write_level(t.run_dir, t.trial_id, summary, records,
                          params=t.params, repeat=t.repeat)
        store.write_telemetry(t.run_dir, t.trial_id, store.level_tag(summary), tele.samples)
        self.finished.append(summary)
        if self.on_level is not None:
            self.on_level(summary, records)
        if not alive:
            raise ServerGone(f"server exited during the run: "
                             f"{last_line(self.srv.log_tail(4000))}")
        if not answering:
            raise ServerGone(f"server hung: no answer from {self.backend.health_path} "
                             f"within {probe_s:g} s after the level {level_name(summary)}")
        why = level_failure(records)
        if why is not None:
            raise NothingMeasured(f"no request succeeded at {level_name(summary)}: {why}")

    def _snapshot(self) -> Any:
        return self.backend.metrics_snapshot(self.srv.base_url, api_headers(self.exp))

    def _drained(self, summary: LevelSummary) -> LevelSummary:
        """The level after the server finished or aborted the requests cut at its end; its
        note says how many it still had after `DRAIN_S`."""
        left, waited = drain(
            lambda: self.backend.in_flight(self.srv.base_url, api_headers(self.exp)),
            min(DRAIN_S, self.exp.measure.request_timeout_s))
        if not left:
            return summary
        return dataclasses.replace(summary, note=with_note(
            summary.note, f"server still had {left} request(s) {waited:.0f} s after the level"))

    def _acceptance(self, summary: LevelSummary) -> LevelSummary:
        """Servers that give no per-request verify counts (vLLM, llama.cpp): the acceptance of
        the level from their counters' deltas."""
        if summary.accept_length is not None or not self.counters:
            return summary
        acc, hist = self.backend.window_acceptance(self.counters[0], self._snapshot())
        if acc is None:
            return summary
        return dataclasses.replace(
            summary, accept_length=acc, accept_histogram=hist or summary.accept_histogram,
            note="; ".join(p for p in summary.note.split("; ") if p and p != ACCEPT_UNREAD))

    def _checked(self, summary: LevelSummary) -> tuple[LevelSummary, bool, bool, float]:
        """The level marked where it queued past the running limit, and suspect where it had
        errors or the server died or hung in it; with (alive, answering, probe seconds)."""
        limit = self.limit
        over = limit is not None and summary.mode == "closed" and summary.concurrency > limit
        note = summary.note
        if over:
            note = with_note(note, f"concurrency {summary.concurrency} > running limit "
                                   f"{limit}: queueing")
        alive = self.srv.alive()
        probe_s = min(HEALTH_PROBE_S, self.exp.measure.request_timeout_s)
        answering = alive and self.srv.answers(probe_s)
        if not alive:
            note = with_note(note, "server died during the level")
        elif not answering:
            note = with_note(note, "server stopped answering")
        summary = dataclasses.replace(
            summary, over_running_limit=over, note=note,
            suspect=summary.suspect or summary.errors > 0 or not answering)
        return summary, alive, answering, probe_s
