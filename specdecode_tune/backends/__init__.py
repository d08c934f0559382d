"""Backends: how to boot one kind of server with one parameter set, and how to read it.

A backend turns resolved parameters into an argv list (never a shell string), names its health
path, reads the server's facts after boot, says how a person would launch the same server, and
names the lines of its log that say why a start failed (`failure_patterns`, which the server's
classifier applies), and what its streamed requests carry beyond the OpenAI format
(`stream_format`: its own APIs, its per-request counters, which the load generator applies).
`BACKENDS` maps the experiment's `backend.kind` to an implementation; `ANY_ENGINE_FAILURES` is
every engine's failure lines together, for a log of unknown origin, and `ANY_ENGINE_STREAM`
every engine's stream fields, for a load run not told its engine.

Before a search starts anything it runs `preflight` (the backend's `validate` and the local
files it names) and `check_args` on the baseline's command line: a backend that can tell
without a boot whether its server would refuse a command line implements `ChecksArgs` (only
the simulator can: it runs its own CLI with `--check-args`, see `simargs`).

Every read a backend makes of a running server (facts, load, counters) goes through `httpread`
with the headers the trial gives it: the API key reaches every endpoint that wants it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

from ..config import BackendConfig
from ..errors import ConfigError
from ..records import ServerFacts
from ..space import is_baseline, resolve
from . import files
from .failurepatterns import FailurePatterns, union
from .files import LocalFile
from .llamacpp import LlamaCppBackend
from .schedule import ScheduleAsk, ScheduleFile, WritesSchedule
from .sglang import SGLangBackend
from .sim import SimBackend
from .streamformat import StreamFormat
from .streamformat import union as union_streams
from .trtllm import TensorRTLLMSchedule
from .vllm import VLLMBackend


class Backend(Protocol):
    """The contract every server kind implements."""

    name: str
    health_path: str
    # Sent on every load request (llama.cpp: "Connection: close", see its backend).
    request_headers: ClassVar[Mapping[str, str]]
    # This engine's own log lines for a failed start (out of memory, KV pool too small, an
    # argument check); see `failurepatterns`.
    failure_patterns: ClassVar[FailurePatterns]
    # Its own streaming APIs and the fields of its streams the load generator reads (SGLang's
    # /generate; llama.cpp's per-request draft counters); see `streamformat`.
    stream_format: ClassVar[StreamFormat]
    # What the live server says of itself, kept verbatim by scripts/device/engine_readings.py
    # beside what the backend reads: (file name, GET path) before any load, and the path of
    # its own count of requests in flight (what `in_flight` reads), polled through a level.
    raw_paths: ClassVar[tuple[tuple[str, str], ...]]
    load_path: ClassVar[str]

    def argv(self, cfg: BackendConfig, params: Mapping[str, Any], port: int | str) -> list[str]:
        """The server's command line for these resolved parameters on this port."""

    def env(self, cfg: BackendConfig, run_dir: str | None = None) -> dict[str, str]:
        """Extra environment for the server process (added to the trial's own); `run_dir` is
        a folder of this trial for caches the server writes (vLLM's VLLM_CACHE_ROOT)."""

    def validate(self, cfg: BackendConfig) -> None:
        """Raise ConfigError for a backend config this server kind cannot run (called before
        a search starts anything)."""

    def local_files(self, cfg: BackendConfig) -> list[LocalFile]:
        """The files on the server's machine that it would read at start-up (models, drafts,
        tokenizers named as local paths; not hub ids), checked before a local search."""

    def read_facts(self, base_url: str, timeout_s: float = 10.0,
                   headers: Mapping[str, str] | None = None) -> ServerFacts:
        """What the healthy server says about itself (KV budget, running limit, GPUs), read
        with `headers` (the API key; a 401/403 raises errors.KeyRefused). An endpoint that
        gives nothing else is named in `extra[records.FACTS_UNREAD]`, never a silent None."""

    def launch_command(self, cfg: BackendConfig, params: Mapping[str, Any]) -> str:
        """The command a person runs to serve with these settings (for the report)."""

    def program(self, cfg: BackendConfig) -> str:
        """The executable that argv starts (checked before a search starts anything)."""

    def in_flight(self, base_url: str, headers: Mapping[str, str] | None = None,
                  timeout_s: float = 5.0) -> int | None:
        """The requests the server is running or queueing now, or None where it cannot tell.
        A level ends by waiting for 0 (the requests cut at its end go on in the server until it
        sees the closed connection): the signal must be current, not a gauge of the last log
        interval."""

    def running_limit(self, facts: ServerFacts, params: Mapping[str, Any]) -> Any:
        """The requests the booted server runs at once (a closed loop over it queues): what it
        said of itself (`facts`), else the setting this engine's flag was given from
        `params` (None where neither says)."""

    def refusal_advice(self, message: str) -> str:
        """What to set in the experiment for an argument refusal the server gives every point
        ('' where this engine knows no remedy for it)."""

    def schedule_file(self, cfg: BackendConfig | None, ask: ScheduleAsk | None
                      ) -> ScheduleFile | None:
        """This engine's per-batch-size schedule file for `ask` (its name, its JSON, the
        command that boots it or the reason it cannot; `schedule.ScheduleFile`) for an
        experiment of any engine (`cfg`; None where the run has none); None where this engine
        reads no such schedule. The report and the validation trial render what it returns."""

    def schedule_params(self, cfg: BackendConfig, params: Mapping[str, Any],
                        config_path: str) -> tuple[dict[str, Any] | None, str]:
        """(the server's settings that boot a per-batch-size steps schedule read from the file
        at `config_path`, '') where this engine and release boot one from such a file, else
        (None, why not: one line)."""

    def memory_facts(self, log_text: str) -> dict[str, float]:
        """From the boot's log, records.MEMORY_ROOM and GRAPH_MEMORY (shares of the memory the
        static pool is sized against): the free memory after the last CUDA graph capture and
        what the captures kept; where the engine compiles at boot, COMPILED_GRAPHS and
        LOADED_GRAPHS; {} where the engine's log does not say."""

    def metrics_snapshot(self, base_url: str, headers: Mapping[str, str] | None = None
                         ) -> dict[str, float] | None:
        """The server's speculative counters now (taken before and after a measurement
        window), or None where the server has none (SGLang: acceptance comes per request);
        read with `headers` (the API key), as `in_flight` is."""

    def window_acceptance(self, before: Mapping[str, float] | None,
                          after: Mapping[str, float] | None
                          ) -> tuple[float | None, tuple[int, ...]]:
        """(acceptance length, verify steps per number of accepted tokens: SGLang's
        histogram form) between two snapshots; (None, ()) when the counters cannot say."""


@runtime_checkable
class ChecksArgs(Protocol):
    """A backend that can tell, without booting, that its server would refuse a command line."""

    def check_args(self, cfg: BackendConfig, argv: Sequence[str]) -> None:
        """Raise ConfigError (one line) where every boot with `argv` would fail."""

    def refusals(self, cfg: BackendConfig, argvs: Sequence[Sequence[str]]
                 ) -> list[str | None]:
        """`check_args` for several command lines at once (SGLang: one run of its parser;
        the simulator: `common.each_refusal`): per argv, the one-line refusal or None."""


@runtime_checkable
class KnowsCrashes(Protocol):
    """A backend that knows command lines its engine's checks pass and its boot crashes on."""

    def known_crash(self, cfg: BackendConfig, params: Mapping[str, Any],
                    version: str | None = None) -> str | None:
        """For resolved speculative `params`: the one-line reason, or None."""


BACKENDS: dict[str, Backend] = {
    "sglang": SGLangBackend(),
    "sim": SimBackend(),
    "vllm": VLLMBackend(),
    "llamacpp": LlamaCppBackend(),
}

# Every engine whose per-batch-size schedule the report writes, in the report's order:
# TensorRT-LLM's is a format only (no server of it is booted here, backends/trtllm.py).
SCHEDULE_WRITERS: tuple[WritesSchedule, ...] = (BACKENDS["sglang"], BACKENDS["vllm"],
                                                TensorRTLLMSchedule())

ANY_ENGINE_FAILURES: FailurePatterns = union(b.failure_patterns for b in BACKENDS.values())
ANY_ENGINE_STREAM: StreamFormat = union_streams(b.stream_format for b in BACKENDS.values())


def preflight(cfg: BackendConfig, *, local: bool = True) -> None:
    """ConfigError, one line, for a backend config its server would refuse at every boot:
    the backend's own rules (a simulator profile included) and, with `local` (the servers run
    on this machine), the local files it names; and an API-key variable that is not set (the
    servers would get an empty key, the requests none)."""
    backend = get_backend(cfg.kind)
    backend.validate(cfg)
    if local:
        files.check(backend.local_files(cfg))
    if cfg.api_key_env and not os.environ.get(cfg.api_key_env):
        raise ConfigError(f"backend.api_key_env = {cfg.api_key_env!r}: that environment "
                          f"variable is not set or empty (export the API key in it)")


def check_args(cfg: BackendConfig, params: Mapping[str, Any]) -> None:
    """ConfigError, one line, where the server would refuse its command line for the resolved
    `params` at every boot, for a backend that can tell without a boot (`ChecksArgs`)."""
    backend = get_backend(cfg.kind)
    if isinstance(backend, ChecksArgs):
        backend.check_args(cfg, backend.argv(cfg, params, 0))


def refusals(cfg: BackendConfig, points: Sequence[Mapping[str, Any]]) -> list[str | None]:
    """What the server would refuse, or is known to crash on, for several resolved points
    (SGLang: one run of its parser): per point, the one-line reason or None. A crash the
    servers' release is known to have (`KnowsCrashes`) comes first, then the engine's own
    argument check (`ChecksArgs`)."""
    backend = get_backend(cfg.kind)
    known = [_known_crash(backend, cfg, p) for p in points]
    if not isinstance(backend, ChecksArgs):
        return known
    checked = backend.refusals(cfg, [backend.argv(cfg, p, 0) for p in points])
    return [k or c for k, c in zip(known, checked, strict=True)]


def known_refusal(cfg: BackendConfig, sampled: Mapping[str, Any]) -> str | None:
    """Why a boot of this sampled point is known to crash on the servers' release (SGLang >=
    0.5.16: a draft tree narrower than deep), without a boot or a run of the engine's parser,
    or None. Cheap enough for every proposal of a search (`search.stopping.KVGate`)."""
    return _known_crash(get_backend(cfg.kind), cfg, resolve(sampled, cfg.flags))


def _known_crash(backend: Backend, cfg: BackendConfig, params: Mapping[str, Any]) -> str | None:
    if not isinstance(backend, KnowsCrashes) or is_baseline(params):
        return None
    return backend.known_crash(cfg, params)


def schedule_files(cfg: BackendConfig | None, ask: ScheduleAsk | None) -> list[ScheduleFile]:
    """Every engine's file for the schedule `ask` (None: there is none), in SCHEDULE_WRITERS'
    order, each format written by the experiment's own backend where it speaks it (the
    simulator SGLang's), so that its command boots the experiment's server."""
    own = BACKENDS.get(cfg.kind) if cfg is not None else None
    out = []
    for writer in SCHEDULE_WRITERS:
        if own is not None and isinstance(own, type(writer)):
            writer = own
        written = writer.schedule_file(cfg, ask)
        if written is not None:
            out.append(written)
    return out


def get_backend(kind: str) -> Backend:
    try:
        return BACKENDS[kind]
    except KeyError:
        raise ValueError(f"backend kind must be one of {sorted(BACKENDS)}, got {kind!r}") \
            from None


def schedule_refusal(cfg: BackendConfig) -> str:
    """'' where the experiment's engine and release boot a per-batch-size schedule from a
    file, else one line on why not. Asked with no settings and no file (before one is
    written): a backend that reads the file to boot it says only whether it can."""
    _, why = get_backend(cfg.kind).schedule_params(cfg, {}, "")
    return why
