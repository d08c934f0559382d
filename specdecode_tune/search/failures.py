"""Trials that keep failing for a reason no config changes: the search should stop.

`FailureStreak` is the rule (its docstring says it whole), `failure_signature` what two
failures' reasons are compared by. The searcher (`searcher.RepeatingSearcher`, or
`SpecOptunaSearch` alone for Pareto objectives) observes every finished trial with it and
returns `Searcher.FINISHED` once it trips; `summary` replays it over the trials table to say
why a search stopped early. A FailureStreak pickles with the searcher's state, so a resumed
search keeps its streak; runs pickled before this module existed name it
`specdecode_tune.search.searcher.FailureStreak`, so `searcher` still exports it.
"""

from __future__ import annotations

import re

__all__ = ["FAILURE_STREAK", "REFUSAL_STREAK", "FailureStreak", "failure_signature"]

# The stop rule: this many trials in a row, at distinct configs, failed with the same reason.
FAILURE_STREAK = 3
# Distinct configs the server refuses with the same argument error before the refusal counts
# as the experiment's, not the points' (SGLang refusing every speculative argv of a hybrid
# model with radix cache on, say).
REFUSAL_STREAK = 2

_NOISE = [  # what differs between two boots failing the same way: masked in a signature
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?Z?"), "<time>"),
    (re.compile(r"\b\d\d:\d\d:\d\d(?:[.,]\d+)?\b"), "<time>"),
    (re.compile(r"\b((?:\d{1,3}\.){3}\d{1,3}|localhost|\[[0-9a-fA-F:]+\]):\d+"), r"\1:<port>"),
    (re.compile(r"\b(pid|port)([ =:#]*)\d+", re.IGNORECASE), r"\1\2<n>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "0x<addr>"),
]


def failure_signature(reason: str) -> str:
    """A failure reason with what changes from one boot to the next masked: whitespace runs,
    timestamps, host:port, pids and ports, hex addresses. Every other number is kept: token
    counts and the server's limits (a KV pool that grows with mem_fraction_static) tell
    config-dependent failures apart."""
    text = " ".join(reason.split())
    for pattern, repl in _NOISE:
        text = pattern.sub(repl, text)
    return text


class FailureStreak:
    """Trials that keep failing for a reason no config changes: the search should stop.

    The rule, over finished trials in the order they finish: when `limit` (FAILURE_STREAK)
    trials in a row at distinct configs have status "failed" with the same `failure_signature`
    of their reason, the cause is not the point (every request refused by the server, its
    binary crashing at every boot) and booting more points would only spend GPU hours on it.
    In the row:
    - a trial that is "ok" ends the streak (some config serves), and so does a "failed" one
      with another reason (it starts a new streak);
    - a trial that never served, "infeasible" (the server refused that config at start-up:
      OOM, KV memory; a property of the point) or "pruned" (never booted), is skipped: it says
      nothing about the cause, and neither counts nor breaks the streak;
    - a re-measurement of a config already in the streak keeps it but does not count twice.
    Once tripped it stays tripped (`tripped` holds the one line that says why).

    A second rule watches the server's refusals of its arguments ("infeasible" with reason
    "invalid_args: ..."): the same refusal at REFUSAL_STREAK distinct configs (not in a row)
    is the experiment's problem, not the points' (a flag every boot needs is missing), and it
    trips too. Refusals for memory (oom, kv_memory) stay properties of the point."""

    def __init__(self, limit: int = FAILURE_STREAK) -> None:
        self.limit = limit
        self.signature: str | None = None
        self.reason = ""                      # the streak's first reason, as the trial gave it
        self.configs: set[str] = set()
        self.tripped: str | None = None
        self.refusals: dict[str, tuple[str, set[str]]] = {}   # signature -> (reason, configs)

    def observe(self, config_key: str, status: str | None, reason: str | None) -> None:
        if self.tripped is not None:
            return
        if status == "infeasible" and (reason or "").startswith("invalid_args"):
            # (setdefault on __dict__: a searcher pickled before this rule has no refusals)
            refusals = self.__dict__.setdefault("refusals", {})
            first, configs = refusals.setdefault(failure_signature(reason or ""),
                                                 (reason or "", set()))
            configs.add(config_key)
            if len(configs) >= REFUSAL_STREAK:
                self.tripped = (f"the search stopped early: the server refused its arguments "
                                f"the same way at {len(configs)} distinct configs (a cause "
                                f"that does not depend on the point): {first}")
            return
        if status in (None, "infeasible", "pruned"):
            return
        if status != "failed":
            self.signature, self.reason, self.configs = None, "", set()
            return
        signature = failure_signature(reason or "")
        if signature != self.signature:
            self.signature, self.reason, self.configs = signature, reason or "", set()
        self.configs.add(config_key)
        if len(self.configs) >= self.limit:
            n = len(self.configs)
            self.tripped = (f"the search stopped early: {n} trials in a row, at {n} distinct "
                            f"configs, failed with the same reason (a cause that does not "
                            f"depend on the config): {self.reason}")
