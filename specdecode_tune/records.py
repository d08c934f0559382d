"""Typed records of one measurement: request -> level summary -> trial result.

The load generator makes the request records and level summaries, the backends the server's
facts, the trial the result; `store` turns them into Arrow tables with explicit schemas, and
the objective, the samplers and the report read them. This module imports nothing of the
package, so every layer can use these types without importing the store (or pyarrow). All
times are seconds, measured with `time.perf_counter()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request of one measured level, as the client saw it."""

    level: int                    # concurrency of the level (or the rate, for open loop)
    index: int                    # order in which the request was sent within the level
    start: float                  # send time, seconds since the level started
    end: float                    # completion (or failure / cancel) time, same clock
    ttft: float | None            # time to first token; None if no token arrived
    input_tokens: int             # prompt length as sent (tokens, or the server's count)
    output_tokens: int            # completion tokens received
    chunk_gaps: tuple[float, ...] = ()   # gaps between streamed chunks (ITL per chunk)
    verify_ct: int | None = None         # speculative verify steps (SGLang `spec_verify_ct`)
    accepted_tokens: int | None = None   # accepted draft tokens, where the server says
    draft_tokens: int | None = None      # proposed draft tokens, where the server says
    # index j: verify steps that accepted exactly j drafted tokens (SGLang's
    # spec_accept_histogram), where the server gives it
    accept_histogram: tuple[int, ...] = ()
    in_window: bool = True        # completed inside the measurement window (counts in stats)
    error: str | None = None      # None = ok; else a short reason ("timeout", "http 500", ...)
    # The server's own words for a failure, where it gave any: "http 400: <its message>", or
    # the message of an error event in a 200 stream; None for failures without words (timeout).
    error_detail: str | None = None
    prompt_id: str | None = None  # the prompt's id in its source (a ShareGPT conversation id)

    @property
    def latency(self) -> float:
        return self.end - self.start

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class LevelSummary:
    """Aggregate figures of one concurrency level (or request rate) of one trial."""

    concurrency: int
    mode: str                     # "closed" (fixed concurrency) or "rate" (Poisson arrivals)
    rate: float | None            # requests/s for mode "rate"
    duration_s: float             # length of the measurement window
    requests: int                 # requests completed in the window (ok or not)
    errors: int                   # failed requests in the window
    output_tokens: int            # output tokens that arrived inside the window
    output_tok_s: float
    requests_s: float
    ttft_p50: float | None
    ttft_p90: float | None
    ttft_p99: float | None
    tpot_p50: float | None
    tpot_p90: float | None
    tpot_p99: float | None
    itl_p50: float | None
    itl_p90: float | None
    itl_p99: float | None
    e2e_p50: float | None
    e2e_p90: float | None
    e2e_p99: float | None
    accept_length: float | None   # sum(completion tokens) / sum(verify steps) over this window
    # index j: the window's verify steps that accepted exactly j drafted tokens, one form for
    # every engine (per request from SGLang, from the counters of vLLM and llama.cpp:
    # backends/speccounters.py)
    accept_histogram: tuple[int, ...] = ()
    over_running_limit: bool = False         # concurrency > the server's running limit (queueing)
    suspect: bool = False                    # errors or telemetry flags: keep out of verdicts
    note: str = ""
    # GuideLLM's over-saturation test on the window's requests (load/saturation.py): TTFT and the
    # requests waiting for their first token both climbing; throughput there is not capacity.
    saturated: bool = False
    # goodput objectives (load/slo.py): requests of the window that met every latency target,
    # of those that completed; None where the objective sets no targets.
    slo_good: int | None = None
    slo_total: int | None = None
    # A closed loop measured in whole rounds until known (measure.precision, load/rounds.py):
    # the rounds counted, and the 95% interval's half-width of output_tok_s and of
    # accept_length relative to them (None: one round, no interval; or no verify steps). For
    # a fixed window all three are None. `duration_s` is then the counted requests'
    # worker-seconds over C.
    rounds: int | None = None
    precision: float | None = None
    accept_precision: float | None = None
    # Wall seconds the level took, its warm-up included (the time a boot spends measuring).
    level_s: float | None = None


# ServerFacts.extra, from the boot's log where the engine logs its memory (`Backend.memory_facts`),
# as shares of the GPU memory its static pool is sized against:
# MEMORY_ROOM: free after the last CUDA graph capture, how far the memory fraction could have
# risen, at most, before the capture ran out of memory;
# GRAPH_MEMORY: what the captures kept (their graphs' memory).
MEMORY_ROOM = "memory_room"
GRAPH_MEMORY = "graph_memory"
# ServerFacts.extra, from the boot's log where the engine compiles its model at boot
# (`Backend.memory_facts`): graphs compiled at this boot and graphs loaded from the engine's own
# compile cache. vLLM compiles inside the run it profiles its memory with, so the two can size
# one configuration's KV pool differently (`report.trials.kv_moves` names them).
COMPILED_GRAPHS = "compiled_graphs"
LOADED_GRAPHS = "loaded_graphs"
# ServerFacts.extra, from `Backend.read_facts`: why an endpoint the server's facts come from gave
# nothing ("GET /server_info: http 404 Not Found"; one line, several joined with "; "). A fact
# that is None beside it was not read, not absent; the trials table keeps it in facts_json.
FACTS_UNREAD = "facts_unread"


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What the server says about itself after boot. `extra` holds the rest by name, among
    them MEMORY_ROOM and GRAPH_MEMORY (`Backend.memory_facts`, from the boot's log)."""

    max_total_num_tokens: int | None = None
    max_running_requests: int | None = None
    gpu_ids: tuple[str, ...] = ()            # the CUDA_VISIBLE_DEVICES it was given
    boot_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


TRIAL_STATUSES = ("ok", "infeasible", "failed", "pruned")
# How the reason of a trial refused by the server's own check, without a boot, ends.
BEFORE_A_BOOT = "(checked before a boot)"


@dataclass(frozen=True, slots=True)
class TrialResult:
    """One trial: one server boot with one parameter set, measured at each level."""

    trial_id: str
    params: dict[str, Any]
    status: str                   # one of TRIAL_STATUSES
    reason: str = ""              # why, for anything but "ok"
    facts: ServerFacts = field(default_factory=ServerFacts)
    levels: tuple[LevelSummary, ...] = ()
    wall_s: float = 0.0
    repeat: int = 0               # 0 = first measurement of these params, 1.. = re-measurements
    suspect: bool = False

    @property
    def booted(self) -> bool:
        """Whether a server was started for it: not for a point the rules refuse ("pruned")
        nor one the server's check refused before a boot."""
        return not (self.status == "pruned" or self.reason.endswith(BEFORE_A_BOOT))
