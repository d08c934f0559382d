"""The project's exception tree.

    SpecTuneError             base of everything raised on purpose
    ├── ConfigError           bad experiment file or CLI input: the CLI prints one line, exit 2
    ├── ServerStartError      a server did not become healthy; `.kind` classifies why
    └── SearchStopped         the search cannot go on (the baseline failed): one line, exit 1

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


class SearchStopped(SpecTuneError):
    """The search stops before its budget for a cause no config changes (the no-speculation
    baseline failed). The message is one line with the server's own words; exit status 1."""
