"""Fault injection: the failures real servers have, on demand, so that tests can show what the
tuner does with them.

A fault is given by flag (`--fault SPEC`, repeatable) or by profile (a top-level
`faults = ["SPEC", ...]` list in the profile TOML); both lists apply. SPEC is one of

    crash-at-start       dies during start-up, after the weights "load" (the profile's
                         fail_at_fraction of the boot): a RuntimeError in the log, exit code 1
    oom-at-start         exits 1 during start-up with PyTorch's "CUDA out of memory" message
    crash-after:N        once N generation requests have completed, the next one that arrives
                         kills the process on the spot (os._exit(1)): open streams break
    hang-after:N         once N generation requests have completed, the next one that arrives
                         makes the server stop answering: every endpoint (/health included)
                         and every open stream waits forever, the scheduler stops, the socket
                         stays open. SIGTERM still ends it (a hang, not a zombie)
    slow-start:S         start-up takes S seconds (/health answers 503 until then)
    malformed-sse:P      each streamed write is, with probability P, replaced by a malformed
                         event (cut JSON, bytes that are not UTF-8, a JSON array, fields of the
                         wrong type); every variant is one a client must count as an error
    drop-midway:P        each streamed request is, with probability P, cut at a random token
                         count: the connection is closed without [DONE]
    slowdown-after:S:F   S seconds after the first generation request, every scheduler
                         iteration takes F times longer (as clock throttling would cause);
                         timed from the load, not from boot, so that what a client does in
                         between (reading facts, probes) does not move it

optionally followed by `@CONDITION`, `NAME OP VALUE` with OP one of = != >= <= > <, which limits
the fault to servers launched with such a setting: `oom-at-start@steps>=10` fails only the
boots with ten or more draft steps, as a real 122B model does. NAME is a server argument
(`speculative_num_steps`, ...) or a short name: steps, topk, draft, mem, tp. The baseline (no
speculation) has steps = 0.

Random choices (which chunk is malformed, which request is dropped and where) come from one
generator seeded by `--fault-seed` (default 0), so a run is repeatable. Every injected fault is
logged (one WARNING line) and counted in `/metrics` as
`specdecode_sim:faults_injected_total{fault="..."}`, so a test can compare what the client
counted with what the server did.
"""

from __future__ import annotations

import asyncio
import logging
import math
import operator
import os
import random
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdecode_tune.errors import ConfigError
from specdecode_tune.space import SHORT_NAMES

log = logging.getLogger("specdecode_tune.sim")

FAULT_KINDS = ("crash-at-start", "oom-at-start", "crash-after", "hang-after", "slow-start",
               "malformed-sse", "drop-midway", "slowdown-after")

# kind -> (argument parsers, what the arguments are)
_INT = ("an integer >= 0", lambda v: int(v) if v.isdigit() else None)
_SECONDS = ("seconds >= 0", lambda v: _float(v, 0.0, math.inf))
_PROB = ("a probability in [0, 1]", lambda v: _float(v, 0.0, 1.0))
_FACTOR = ("a factor >= 1", lambda v: _float(v, 1.0, math.inf))
_ARGS: dict[str, tuple[tuple[str, Callable[[str], Any]], ...]] = {
    "crash-at-start": (),
    "oom-at-start": (),
    "crash-after": (_INT,),
    "hang-after": (_INT,),
    "slow-start": (_SECONDS,),
    "malformed-sse": (_PROB,),
    "drop-midway": (_PROB,),
    "slowdown-after": (_SECONDS, _FACTOR),
}

# A condition names a parameter in full or by its short name (tp: tp_size).
_FULL_NAMES = {short: name for name, short in SHORT_NAMES.items()} | {"tp": "tp_size"}
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge, "<=": operator.le, "!=": operator.ne, "=": operator.eq,
    ">": operator.gt, "<": operator.lt}
_CONDITION = re.compile(r"^([A-Za-z_][\w-]*)\s*(>=|<=|!=|=|>|<)\s*(-?[\d.]+)$")

USAGE = ("crash-at-start | oom-at-start | crash-after:N | hang-after:N | slow-start:S | "
         "malformed-sse:P | drop-midway:P | slowdown-after:S:F, optionally @NAME>=VALUE")


def _float(text: str, low: float, high: float) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and low <= value <= high else None


@dataclass(frozen=True, slots=True)
class Fault:
    """One parsed fault: its kind, its arguments, and an optional launch-setting condition."""

    kind: str
    args: tuple[float, ...] = ()
    condition: tuple[str, str, float] | None = None
    text: str = ""

    def applies(self, server_args: Mapping[str, Any]) -> bool:
        """Whether this fault is on for a server launched with `server_args` (SGLang names)."""
        if self.condition is None:
            return True
        name, op, value = self.condition
        have = server_args.get(name)
        if have is None or isinstance(have, bool):
            have = 0          # unset: the baseline has no draft steps
        if not isinstance(have, (int, float)):
            return False
        return _OPS[op](have, value)


def parse_fault(text: str) -> Fault:
    """`SPEC[@CONDITION]` -> Fault; a bad spec raises ConfigError naming it and the forms."""
    raw = text.strip()
    spec, _, cond = raw.partition("@")
    kind, *parts = spec.strip().split(":")
    if kind not in _ARGS:
        raise ConfigError(f"--fault {text!r}: unknown fault {kind!r}; allowed: {USAGE}")
    wanted = _ARGS[kind]
    if len(parts) != len(wanted):
        form = kind + "".join(f":<{what}>" for what, _ in wanted)
        raise ConfigError(f"--fault {text!r}: expected {form}")
    args = []
    for part, (what, conv) in zip(parts, wanted):
        value = conv(part.strip())
        if value is None:
            raise ConfigError(f"--fault {text!r}: {part!r} must be {what}")
        args.append(value)
    condition = None
    if cond:
        m = _CONDITION.match(cond.strip())
        if m is None:
            raise ConfigError(f"--fault {text!r}: condition {cond!r} must be NAME OP NUMBER, "
                              f"e.g. steps>=10 (OP: =, !=, >=, <=, >, <)")
        name = _FULL_NAMES.get(m.group(1), m.group(1).replace("-", "_"))
        number = _float(m.group(3), -math.inf, math.inf)
        if number is None:
            raise ConfigError(f"--fault {text!r}: {m.group(3)!r} is not a number")
        condition = (name, m.group(2), number)
    return Fault(kind=kind, args=tuple(args), condition=condition, text=raw)


def parse_faults(texts: Sequence[str]) -> tuple[Fault, ...]:
    return tuple(parse_fault(t) for t in texts)


# Malformed events: each one breaks a client's parsing of the chunk, whatever the API
# (/generate reads meta_info, the OpenAI APIs read choices and usage).
_MALFORMED = (
    b'data: {"text": " the of", "meta_info": {"completion_tok\n\n',     # cut JSON
    b"data: \xff\xfe\xfa not utf-8 \xc3\x28\n\n",                       # not text
    b"data: [1, 2, 3]\n\n",                                             # not an object
    b'data: {"meta_info": "oops", "choices": "oops", "usage": "oops"}\n\n',   # wrong types
)


class FaultInjector:
    """The faults of one server boot and their state. Without faults every hook is a no-op."""

    def __init__(self, faults: Sequence[Fault], server_args: Mapping[str, Any],
                 seed: int = 0) -> None:
        self.faults = tuple(f for f in faults if f.applies(server_args))
        self._by_kind = {f.kind: f for f in self.faults}
        self._rng = random.Random(seed)
        self.completed = 0                  # generation requests that completed
        self.injected: Counter[str] = Counter()
        self.hung = False
        self._hang = asyncio.Event() if "hang-after" in self._by_kind else None
        self.on_hang: Callable[[], None] | None = None     # set by the server: freeze the engine
        # set by the server: multiply every engine iteration's time by the factor
        self.on_slowdown: Callable[[float], None] | None = None
        self._slowdown_timed = False        # its clock started (at the first request)

    def __bool__(self) -> bool:
        return bool(self.faults)

    def describe(self) -> list[str]:
        return [f.text for f in self.faults]

    def _arg(self, kind: str, i: int = 0) -> float | None:
        f = self._by_kind.get(kind)
        return f.args[i] if f is not None else None

    def note(self, kind: str, what: str) -> None:
        self.injected[kind] += 1
        log.warning("fault %s injected: %s", kind, what)

    # -- start-up ---------------------------------------------------------------------------

    def boot_seconds(self, default: float) -> float:
        slow = self._arg("slow-start")
        if slow is None:
            return default
        self.note("slow-start", f"start-up takes {slow:g} s")
        return float(slow)

    def startup_failure(self) -> tuple[str, str] | None:
        """(kind, message) of an injected start-up failure, where the memory checks run."""
        if "oom-at-start" in self._by_kind:
            self.note("oom-at-start", "exiting with CUDA out of memory")
            return "oom", ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                           "2.00 GiB. GPU 0 has a total capacity of 95.59 GiB of which "
                           "312.00 MiB is free. (simulated: fault oom-at-start)")
        if "crash-at-start" in self._by_kind:
            self.note("crash-at-start", "the process dies during start-up")
            return "crashed", ("RuntimeError: NCCL error in: init.cpp:94, unhandled system "
                               "error (simulated: fault crash-at-start)")
        return None

    def _start_slowdown_clock(self) -> None:
        """At the first generation request: slow the engine down S seconds later."""
        f = self._by_kind.get("slowdown-after")
        if f is None or self._slowdown_timed or self.on_slowdown is None:
            return
        self._slowdown_timed = True
        after, factor = float(f.args[0]), float(f.args[1])
        asyncio.get_running_loop().call_later(after, self._slow_down, factor)

    def _slow_down(self, factor: float) -> None:
        self.note("slowdown-after", f"every iteration now takes {factor:g}x longer")
        if self.on_slowdown is not None:
            self.on_slowdown(factor)

    # -- requests ---------------------------------------------------------------------------

    def on_request(self) -> None:
        """A generation request arrived: crash or hang here once enough have completed; the
        first one starts a slowdown's clock."""
        self._start_slowdown_clock()
        n = self._arg("crash-after")
        if n is not None and self.completed >= n:
            self.note("crash-after", f"{self.completed} requests completed; the process "
                                      f"dies now")
            logging.shutdown()
            os._exit(1)
        n = self._arg("hang-after")
        if n is not None and self.completed >= n and not self.hung:
            self.note("hang-after", f"{self.completed} requests completed; the server "
                                     f"stops answering now")
            self.hung = True
            if self.on_hang is not None:
                self.on_hang()

    def on_request_done(self) -> None:
        self.completed += 1

    async def wait_if_hung(self) -> None:
        """Never returns while the server is hung (until the task is cancelled)."""
        if self.hung and self._hang is not None:
            await self._hang.wait()          # never set: a hang lasts until the process ends

    def drop_point(self, max_new_tokens: int) -> int | None:
        """The token count after which this request's connection is dropped, or None."""
        p = self._arg("drop-midway")
        if not p or self._rng.random() >= p:
            return None
        return self._rng.randint(1, max(1, max_new_tokens - 1))

    def maybe_malformed(self, payload: bytes) -> tuple[bytes, bool]:
        """The payload to write instead of `payload`, and whether it is a malformed one."""
        p = self._arg("malformed-sse")
        if not p or self._rng.random() >= p:
            return payload, False
        return self._rng.choice(_MALFORMED), True

    def metrics_lines(self, labels: str) -> list[str]:
        name = "specdecode_sim:faults_injected_total"
        out = [f"# HELP {name} Faults injected by the simulator, by kind.",
               f"# TYPE {name} counter"]
        for kind in FAULT_KINDS:
            if kind in self._by_kind:
                out.append(f'{name}{{{labels},fault="{kind}"}} {float(self.injected[kind])}')
        return out
