"""One level's plan: a closed loop at a concurrency, or an open loop at a request rate.

A level runs ``warmup_s + duration_s``; the measurement window is the last ``duration_s`` (see
`scheduler`, which runs a plan, and `tally`, which counts it). A closed-loop plan with a
`precision` is measured in whole rounds until its figures are known to that relative precision
at 95% (`rounds`); its ``duration_s`` is then the cap on the measured part. A plan validates
itself when built; a bad value is a `ConfigError` naming ``level.<key>``, the value and what is
allowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NoReturn, TypeGuard

from ..config.measure import MIN_ROUNDS
from ..errors import ConfigError


@dataclass(frozen=True, slots=True)
class LevelPlan:
    """One measured level: closed loop at `concurrency`, or open loop at `rate` requests/s."""

    concurrency: int | None = None
    rate: float | None = None
    warmup_s: float = 5.0
    duration_s: float = 30.0
    max_requests: int | None = None     # cap on requests sent in the level (warm-up included)
    request_timeout_s: float = 600.0
    seed: int = 0                       # Poisson arrival times (open loop)
    # Closed loop only: measure whole rounds until the 95% interval of the level's tok/s (and
    # acceptance) is within this relative half-width (load/rounds.py), with at least
    # `min_rounds`; None: a fixed window of `duration_s`.
    precision: float | None = None
    min_rounds: int = MIN_ROUNDS
    # Requests a round holds: the server runs min(C, its running limit) at once, so a loop
    # over the limit is served in waves of the limit (the trial sets it from the server's
    # facts); None: the concurrency.
    round_size: int | None = None

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ConfigError(
                f"level: got concurrency={self.concurrency!r}, rate={self.rate!r}; "
                "allowed: exactly one of them"
            )
        if self.concurrency is not None and (
            not is_int(self.concurrency) or self.concurrency < 1
        ):
            _bad("concurrency", self.concurrency, "an integer >= 1")
        if self.rate is not None and not (_is_num(self.rate) and 0 < self.rate < math.inf):
            _bad("rate", self.rate, "a number of requests/s > 0")
        if not (_is_num(self.warmup_s) and 0 <= self.warmup_s < math.inf):
            _bad("warmup_s", self.warmup_s, "a number of seconds >= 0")
        if not (_is_num(self.duration_s) and 0 < self.duration_s < math.inf):
            _bad("duration_s", self.duration_s, "a number of seconds > 0")
        if self.max_requests is not None and (
            not is_int(self.max_requests) or self.max_requests < 1
        ):
            _bad("max_requests", self.max_requests, "an integer >= 1, or unset")
        if not (_is_num(self.request_timeout_s) and self.request_timeout_s > 0):
            _bad("request_timeout_s", self.request_timeout_s, "a number of seconds > 0")
        if not is_int(self.seed):
            _bad("seed", self.seed, "an integer")
        if self.precision is not None and not (_is_num(self.precision)
                                               and 0 < self.precision < 1):
            _bad("precision", self.precision, "a relative half-width in (0, 1), or unset")
        if not is_int(self.min_rounds) or self.min_rounds < 2:
            _bad("min_rounds", self.min_rounds, "an integer >= 2")
        if self.round_size is not None and (not is_int(self.round_size) or self.round_size < 1):
            _bad("round_size", self.round_size, "an integer >= 1, or unset")

    @property
    def per_round(self) -> int:
        """Requests that finish in one round: the round size, at most the concurrency."""
        c = self.concurrency or 1
        return min(c, self.round_size) if self.round_size else c

    @property
    def by_rounds(self) -> bool:
        """Measured in whole rounds until known (`precision`), not in a fixed window."""
        return self.precision is not None and self.concurrency is not None

    @property
    def mode(self) -> str:
        return "closed" if self.concurrency is not None else "rate"

    @property
    def level(self) -> int:
        """The level's integer label in records: the concurrency, or the rate rounded."""
        if self.concurrency is not None:
            return self.concurrency
        return max(1, round(self.rate or 0))


def is_int(v: object) -> TypeGuard[int]:
    """An integer that is not a bool (as JSON and TOML integers decode)."""
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and not math.isnan(v)


def _bad(key: str, value: Any, allowed: str) -> NoReturn:
    raise ConfigError(f"level.{key}: got {value!r}; allowed: {allowed}")
