"""The project's exception tree: what is raised on purpose, where it lives, who answers it.

Defined here (the errors a user of the CLIs or of the package meets):

    SpecTuneError             base of everything raised on purpose
    ├── ConfigError           bad experiment file or CLI input (also ValueError). The message is
    │                         one line naming the key, the value and what is allowed. The
    │                         search, trial, report and simulator CLIs print `error: <message>`
    │                         and exit 2; an experiment is checked whole before anything is
    │                         started or written.
    ├── ServerStartError      a server did not become healthy; `.kind` (START_FAILURE_KINDS)
    │                         classifies why. Raised by `server.ServerProcess`; the trial turns
    │                         it into data: status "infeasible" (oom, kv_memory) or "failed",
    │                         reason "<kind>: <reason>". It never reaches a CLI.
    ├── SearchStopped         the search cannot go on for a cause no config changes (the
    │                         no-speculation baseline failed, or consecutive trials at distinct
    │                         configs failed the same way). Raised by `search`; the CLI prints
    │                         `error: <message>` (one line, the server's own words) and exits 1;
    │                         the trials table says why.
    ├── RunDirError           a run dir is missing, unreadable or holds no trials (also
    │                         ValueError). Raised by `report.data.read_run`; the report CLI
    │                         prints `error: ...` and exits 2; the search, whose tables are
    │                         written by then, prints "report: not written (...)" and exits 0.
    ├── RunInUse              another live search drives this run dir; `.pid` is its PID.
    │                         Raised by `leftovers.reap_driver`; the search CLI prints which
    │                         PID holds the run and exits 2.
    └── KeyRefused            a running server answered 401/403 to one of the trial's own reads
                              (facts, load, counters): the API key did not reach it. Raised by
                              `backends.httpread`; the trial turns it into status "failed" with
                              its message (every fact after it would be missing). It never
                              reaches a CLI.

Defined in the simulator (`specdecode_tune.sim`, a separate server program):

    SpecTuneError
    └── sim.model.StartupError   the simulated server cannot start (defined in sim.arguments);
                                 `.kind` is invalid_args, kv_memory, oom or crashed,
                                 `.exit_code` 2 or 1. The simulator's CLI logs it as SGLang
                                 would and exits with that code; the search's pre-flight turns
                                 one from `normalize_params` into a ConfigError.
    ValueError
    ├── sim.api.BadRequest       a request body the simulator answers with HTTP 400
    └── sim.scheduler.RequestRejected  a request that can never be served (too long): HTTP 400
    Exception
    └── sim.server.InjectedCrash an injected crash at start (fault crash-at-start): the
                                 simulator logs it as SGLang logs a crash and exits 1

Internal to one part, never past it:

    load.sse.SSEError     a stream broke SSE framing (an oversized event); the request's record
                          gets error "malformed stream (...)"
    backends.streamformat.StreamError  a stream said something unusable (an engine's
                          interpreter or the load generator's stream loop raises it); its
                          message is the record's error, its detail the record's error_detail
    trial_steps.ServerGone  the server died or stopped answering mid-level: the trial stops
                          measuring, keeps the finished levels, status "failed"
    trial_steps.NothingMeasured  no request of a level succeeded: the same, with the first
                          failed request's words as the reason

Expected failures of a measured system (boot failure, OOM, a crash mid-level, a timed-out
request) are not exceptions past the trial boundary: they become data (a trial with a status and
a reason, a request with an error). Only programming errors propagate.
"""

from __future__ import annotations


class SpecTuneError(Exception):
    """Base class for errors this package raises on purpose."""


class ConfigError(SpecTuneError, ValueError):
    """An experiment file or a command-line value is invalid.

    The message is one line that names the key, the bad value and what is allowed.
    """


# Kinds of start-up failure, in the order they are checked against a server's log.
START_FAILURE_KINDS = ("oom", "kv_memory", "invalid_args", "crashed", "timeout", "missing_binary")


class ServerStartError(SpecTuneError):
    """A server process failed to start; `kind` is one of START_FAILURE_KINDS."""

    def __init__(self, kind: str, reason: str, log_tail: str = "") -> None:
        if kind not in START_FAILURE_KINDS:
            raise ValueError(f"kind must be one of {START_FAILURE_KINDS}, got {kind!r}")
        super().__init__(f"{kind}: {reason}")
        self.kind = kind
        self.reason = reason
        self.log_tail = log_tail


class RunDirError(SpecTuneError, ValueError):
    """The run dir is missing, unreadable or holds no trials (the CLI exits 2 with it)."""


class RunInUse(SpecTuneError):
    """Another live driver runs this run dir."""

    def __init__(self, pid: int) -> None:
        super().__init__(pid)
        self.pid = pid


class SearchStopped(SpecTuneError):
    """The search stops before its budget for a cause no config changes (the no-speculation
    baseline failed). The message is one line with the server's own words; exit status 1."""


class KeyRefused(SpecTuneError):
    """A server answered 401/403 to a read the trial makes of it (`backends.httpread`): the
    API key did not reach it or was refused. `path`, `code`, and whether a key was sent."""

    def __init__(self, path: str, code: int, key_sent: bool) -> None:
        super().__init__(path, code, key_sent)     # args as given: it pickles (Ray)
        self.path = path
        self.code = code
        self.key_sent = key_sent

    def __str__(self) -> str:
        sent = ("the key of backend.api_key_env was sent" if self.key_sent else
                "no API key was sent: name its variable in backend.api_key_env")
        return (f"the server refused the API key: GET {self.path} answered http {self.code} "
                f"({sent})")
