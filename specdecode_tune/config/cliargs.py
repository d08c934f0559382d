"""Command-line values, checked as the experiment's own values are.

Both commands (`python -m specdecode_tune.search`, `python -m specdecode_tune.trial`) parse
with `Parser`: argparse's own errors (an unknown flag, a missing value, `--resume` with
`--fresh`) become one `error:` line and exit 2, without the usage block. Each flag's `type`
refuses a bad value while parsing, in the same words: an empty value, a count that is no
positive integer, a seed outside numpy's range (`search.seed`'s rule), a run name with a slash,
an address that is no HOST:PORT, a `--set` that is no NAME=VALUE.

What needs the experiment is checked once it has loaded, before anything boots or is written:
`point_from_sets` holds each `--set NAME=VALUE` to the parameter's declaration (a searched
parameter's type and range or choices, a fixed flag's type, the bounds of the parameters with a
fixed meaning) and the point to SGLang's rules for the speculative triple, so that nothing
typed is dropped or rounded on the way to a boot (1.5 steps, an empty top-k, a top-k without
steps). Where a run dir is written is tried by `store.files.check_writable`.
"""

from __future__ import annotations

import argparse
import difflib
import re
import tomllib
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ..errors import ConfigError
from ..space import DRAFT, SPEC_PARAMS, STEPS, TOPK, invalid_reason, is_baseline, resolve
from .experiment import Experiment
from .parameters import known_problem
from .trials import SAMPLERS, SEED_ALLOWED, SEED_MAX

_INT = re.compile(r"[+-]?[0-9]+")


class Parser(argparse.ArgumentParser):
    """argparse with the project's errors: one `error:` line on stderr, exit 2; an unknown
    flag close to a known one is named with it (`--max-trails`: did you mean --max-trials?)."""

    def error(self, message: str) -> NoReturn:
        hint = self._did_you_mean(message)
        self.exit(2, f"error: {message}{hint} ({self.prog} --help lists the flags)\n")

    def _did_you_mean(self, message: str) -> str:
        prefix = "unrecognized arguments: "
        if not message.startswith(prefix):
            return ""
        known = [o for o in self._option_string_actions if o.startswith("--")]
        guesses: list[tuple[str, str]] = []
        for word in message[len(prefix):].split():
            flag = word.split("=", 1)[0]
            if flag.startswith("--") and (close := difflib.get_close_matches(flag, known, 1)):
                guesses.append((flag, close[0]))
        if len(guesses) == 1:
            return f"; did you mean {guesses[0][1]}?"
        return ("; did you mean " + ", ".join(f"{k} (for {f})" for f, k in guesses) + "?"
                if guesses else "")


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None
          ) -> argparse.Namespace | int:
    """The parsed arguments, or the exit status argparse chose (0 after --help, 2 after its
    one error line), so that a caller in-process gets a status instead of SystemExit."""
    try:
        return parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)


def _refuse(value: str, allowed: str) -> NoReturn:
    raise argparse.ArgumentTypeError(f"{value!r}: {allowed}")


def text(what: str) -> Callable[[str], str]:
    """A flag's type: any value but an empty one; `what` says what it names."""
    def check(value: str) -> str:
        if not value.strip() or "\0" in value:
            _refuse(value, f"must be {what}")
        return value
    return check


def positive_int(value: str) -> int:
    if not _INT.fullmatch(value.strip()) or int(value) < 1:
        _refuse(value, "must be an integer >= 1")
    return int(value)


def seed(value: str) -> int:
    if not _INT.fullmatch(value.strip()) or not 0 <= int(value) <= SEED_MAX:
        _refuse(value, f"must be {SEED_ALLOWED}, as search.seed")
    return int(value)


def run_name(value: str) -> str:
    if not value.strip() or any(c in value for c in "/\\\0") or value.startswith("."):
        _refuse(value, "must be a plain name: not empty, no slashes, not starting with '.'")
    return value


def sampler(value: str) -> str:
    if value not in SAMPLERS:
        _refuse(value, f"must be one of {', '.join(SAMPLERS)}")
    return value


def address(value: str) -> str:
    """'auto', 'local', HOST:PORT or ray://HOST:PORT (whether a head answers there is the
    search's pre-flight)."""
    if value in ("auto", "local"):
        return value
    host, _, port = value.removeprefix("ray://").rpartition(":")
    if not host.strip() or not port.isdigit() or not 1 <= int(port) <= 65535:
        _refuse(value, "must be HOST:PORT of a Ray head (e.g. 127.0.0.1:6379, a port in "
                       "[1, 65535]), 'auto', or ray://HOST:PORT")
    return value


def setting(value: str) -> tuple[str, str]:
    """`--set NAME=VALUE` as (name with '_' for '-', the value's text), both non-empty."""
    name, sep, raw = value.partition("=")
    if not sep or not name.strip() or any(c.isspace() for c in name):
        _refuse(value, "expected NAME=VALUE, e.g. speculative_num_steps=4")
    if not raw.strip():
        _refuse(value, f"empty value for {name}: give one, e.g. {name}=4")
    return name.replace("-", "_"), raw


def _toml_value(raw: str) -> Any:
    """The value as TOML reads it (4 an int, 0.85 a float, true a bool, "x" a string), else
    the text itself (a bare word such as fa3 is a string)."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _like_fixed(fixed: Any, value: Any, raw: str) -> tuple[Any, str | None]:
    """A value for a fixed flag of the experiment: (the value, None) when it has the fixed
    value's type, else (value, 'must be ...')."""
    if isinstance(fixed, bool):
        return value, None if isinstance(value, bool) else "must be true or false"
    if isinstance(fixed, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
        return value, None if ok else "must be an integer"
    if isinstance(fixed, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return value, None if ok else "must be a number"
    if isinstance(fixed, str):
        return (value if isinstance(value, str) else raw.strip()), None
    ok = type(value) is type(fixed)
    return value, None if ok else f"must be {type(fixed).__name__} like its fixed value"


def _one_value(name: str, raw: str, exp: Experiment) -> Any:
    value = _toml_value(raw)
    where = f"--set {name}={raw}"
    spec = exp.param(name)
    if spec is not None:
        if name == STEPS and value == 0 and type(value) is int:
            return 0                  # the no-speculation baseline, a point of every search
        problem = spec.problem(value)
        if problem is not None:
            also = " (or 0: no speculation)" if name == STEPS else ""
            raise ConfigError(f"{where}: {name} {problem}{also}, as its [space.{name}] "
                              f"declares in {exp.source}")
    elif name in exp.backend.flags:
        value, problem = _like_fixed(exp.backend.flags[name], value, raw)
        if problem is not None:
            fixed = exp.backend.flags[name]
            shown = str(fixed).lower() if isinstance(fixed, bool) else repr(fixed)
            raise ConfigError(f"{where}: {name} {problem}, as its fixed value {shown} in "
                              f"[backend.flags] of {exp.source}")
    elif name not in SPEC_PARAMS:
        known = sorted({p.name for p in exp.space} | set(exp.backend.flags) | set(SPEC_PARAMS))
        raise ConfigError(f"{where}: {name} is not a parameter of {exp.source} (its "
                          f"parameters: {', '.join(known)})")
    problem = known_problem(name, value)
    if problem is not None:
        raise ConfigError(f"{where}: {name} {problem}")
    return value


def point_from_sets(items: Sequence[tuple[str, str]], exp: Experiment) -> dict[str, Any]:
    """The point `--set` gives (each item from `setting`), each value checked against its
    parameter in `exp`, and the whole against SGLang's rules; ConfigError, one line, else."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for name, raw in items:
        if name in given:
            raise ConfigError(f"--set {name} is given twice ({given[name]} and {raw}): give it "
                              f"once")
        given[name] = raw
        out[name] = _one_value(name, raw, exp)
    params = resolve(out, exp.backend.flags)
    if is_baseline(params):
        dropped = [n for n in (TOPK, DRAFT) if n in out]
        if dropped:
            raise ConfigError(f"--set {dropped[0]}={given[dropped[0]]}: without speculation "
                              f"(speculative_num_steps is 0 or not set) the server takes no "
                              f"{dropped[0]}; give speculative_num_steps too (--set "
                              f"speculative_num_steps=N, N >= 1)")
    elif DRAFT in out and params[DRAFT] != out[DRAFT]:
        raise ConfigError(f"--set {DRAFT}={given[DRAFT]}: with speculative_eagle_topk = 1 the "
                          f"server uses steps + 1 = {params[DRAFT]} draft tokens (SGLang's "
                          f"rule); leave it out, or set a top-k above 1")
    why = invalid_reason(params)
    if why is not None:
        raise ConfigError(f"--set: the point is not one the server boots: {why}")
    return out
