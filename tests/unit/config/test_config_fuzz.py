"""Property tests of the experiment loader: any input gives an Experiment or a ConfigError.

Three sources of input, each run through `load_experiment` (a file) or `experiment_from_dict`:
arbitrary text and bytes; TOML-ish text (a valid experiment's lines deleted, duplicated,
garbled, given values of every TOML type, or joined by keys and tables it knows and does not);
and valid experiments' parsed tables with a few keys deleted, replaced or added. Each call runs
under a hard per-call time limit, so a hang fails with the input that caused it instead of
holding the test run.

Inputs the loader once mishandled (a wide range enumerated value by value, an integer beyond
what a float holds, nesting deeper than tomllib's recursion) have regression tests at the end.
"""

from __future__ import annotations

import copy
import json
import math
import signal
import tomllib
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdecode_tune.config import Experiment, experiment_from_dict, load_experiment
from specdecode_tune.errors import ConfigError
from tests.conftest import DATA, REPO

CALL_LIMIT_S = 5.0
VALID = [REPO / "experiments" / "sim-default.toml", DATA / "sim-small.toml"]
VALID_DICTS = [tomllib.loads(p.read_text()) for p in VALID]

# The loader's vocabulary, per table (and some words it does not know).
VOCAB: dict[str, list[str]] = {
    "": ["name", "description", "backend", "space", "workload", "measure", "objective",
         "search", "cluster"],
    "backend": ["kind", "model_path", "speculative_algorithm", "draft_model_path", "tp_size",
                "host", "api", "boot_timeout_s", "flags", "extra_args", "env", "api_key_env",
                "binary", "profile", "boot_time_s"],
    "space": ["speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
              "mem_fraction_static", "max_running_requests", "chunked_prefill_size"],
    "param": ["type", "low", "high", "step", "log", "choices"],
    "workload": ["kind", "input_len", "output_len", "seed", "temperature", "ignore_eos", "path",
                 "max_prompts"],
    "measure": ["concurrency", "rates", "warmup_s", "duration_s", "warmup_requests",
                "request_timeout_s", "max_requests"],
    "objective": ["kind", "weights", "metrics"],
    "search": ["sampler", "max_trials", "max_concurrent", "gpus_per_trial", "cpus_per_trial",
               "repeats", "remeasure_top", "noise_band", "seed", "baseline", "enqueue"],
    "cluster": ["num_gpus", "num_cpus"],
}
WORDS = sorted({w for words in VOCAB.values() for w in words} | {
    "sim", "sglang", "vllm", "int", "float", "categorical", "generate", "tpe", "plateau",
    "random", "jsonl", "scalar", "pareto", "EAGLE3", "output_tok_s@16", "16", "1", "x-y", ""})


class Hang(Exception):
    pass


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    def fire(signum: int, frame: Any) -> None:
        raise Hang(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def check(load: Callable[[], Experiment]) -> None:
    """The property: an Experiment or a one-line ConfigError, within the time limit."""
    try:
        with time_limit(CALL_LIMIT_S):
            exp = load()
    except ConfigError as e:
        assert str(e) and "\n" not in str(e), repr(str(e))
        return
    assert isinstance(exp, Experiment)


# --------------------------------------------------------------------------------------------
# --------------------------------------------------------------------------------------------
# TOML values and text

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
SMALL_INT = st.integers(min_value=-3, max_value=70)
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
SCALARS = st.one_of(SMALL_INT, INT64, FLOATS, st.sampled_from(WORDS), st.text(max_size=12),
                    st.booleans())
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.sampled_from(WORDS), inner, max_size=3)),
    max_leaves=8)


def toml_key(k: str) -> str:
    return k if k and all(c.isalnum() or c in "_-" for c in k) else json.dumps(k)


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)      # JSON's escapes are TOML's (a lone surrogate is a TOML error)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def toml_text(data: dict[str, Any]) -> str:
    """A TOML document for `data`: plain keys first, then each table as [a.b]."""
    lines: list[str] = []

    def emit(table: dict[str, Any], prefix: str) -> None:
        subs = {k: v for k, v in table.items() if isinstance(v, dict) and v and
                all(isinstance(x, dict) for x in [v])}
        for k, v in table.items():
            if k not in subs:
                lines.append(f"{toml_key(k)} = {toml_value(v)}")
        for k, v in subs.items():
            name = f"{prefix}.{toml_key(k)}" if prefix else toml_key(k)
            lines.append(f"[{name}]")
            emit(v, name)

    emit(data, "")
    return "\n".join(lines) + "\n"


VALID_LINES = [p.read_text().splitlines() for p in VALID]


@st.composite
def tomlish(draw: st.DrawFn) -> str:
    """A valid experiment's text edited as a user might: lines deleted, duplicated or
    garbled, values replaced by values of any type, known or unknown keys and tables added."""
    lines = list(draw(st.sampled_from(VALID_LINES)))
    for _ in range(draw(st.integers(1, 5))):
        i = draw(st.integers(0, len(lines)))
        edit = draw(st.sampled_from(["delete", "value", "value", "key", "table", "duplicate",
                                     "garble"]))
        if edit == "delete" and i < len(lines):
            del lines[i]
        elif edit == "value" and i < len(lines) and " = " in lines[i]:
            key = lines[i].split(" = ", 1)[0]
            lines[i] = f"{key} = {toml_value(draw(VALUES))}"
        elif edit == "key":
            words = draw(st.sampled_from(sorted(VOCAB)))
            key = draw(st.sampled_from(VOCAB[words] + ["nmae", "x"]))
            lines.insert(i, f"{toml_key(key)} = {toml_value(draw(VALUES))}")
        elif edit == "table":
            table = draw(st.one_of(st.sampled_from(VOCAB[""]).map(lambda t: f"[{t}]"),
                                   st.sampled_from(VOCAB["space"]).map(
                                       lambda t: f"[space.{t}]")))
            lines.insert(i, table)
        elif edit == "duplicate" and i < len(lines):
            lines.insert(i, lines[i])
        elif edit == "garble":
            lines.insert(i, draw(st.text(max_size=20)).replace("\n", " ").replace("\r", " "))
    return "\n".join(lines) + "\n"


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    """A valid experiment with 1-4 keys deleted, replaced or added, anywhere in it."""
    data = copy.deepcopy(draw(st.sampled_from(VALID_DICTS)))
    for _ in range(draw(st.integers(1, 4))):
        tables = [(path, t) for path, t in _tables(data)]
        path, table = draw(st.sampled_from(tables))
        action = draw(st.sampled_from(["delete", "replace", "add", "add-known"]))
        if action in ("delete", "replace") and table:
            key = draw(st.sampled_from(sorted(table)))
            if action == "delete":
                del table[key]
            else:
                table[key] = draw(VALUES)
        else:
            where = "param" if path.startswith("space.") else path
            known = VOCAB.get(where, WORDS)
            key = draw(st.sampled_from(known)) if action == "add-known" else \
                draw(st.sampled_from(WORDS))
            table[key] = draw(VALUES)
    return data


def _tables(d: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, d
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _tables(v, f"{path}.{k}" if path else k)


# --------------------------------------------------------------------------------------------
# The properties

FUZZ = settings(max_examples=300, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                       HealthCheck.function_scoped_fixture])


def load_text(tmp_path: Path, raw: bytes) -> Experiment:
    path = tmp_path / "fuzz.toml"
    path.write_bytes(raw)
    return load_experiment(path)


def parsed_or_none(raw: bytes) -> Any:
    try:
        return tomllib.loads(raw.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        return None


@FUZZ
@given(raw=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
def test_arbitrary_bytes(tmp_path: Path, raw: bytes) -> None:
    check(lambda: load_text(tmp_path, raw))


@FUZZ
@given(text=tomlish())
def test_tomlish_text(tmp_path: Path, text: str) -> None:
    raw = text.encode("utf-8", "surrogatepass")
    check(lambda: load_text(tmp_path, raw))


@FUZZ
@given(data=mutated())
def test_mutated_experiments(tmp_path: Path, data: dict[str, Any]) -> None:
    check(lambda: experiment_from_dict(data, where="fuzz", base_dir=tmp_path))
    # The same document as a file: the TOML layer must not change the answer's kind.
    raw = toml_text(data).encode("utf-8", "surrogatepass")
    check(lambda: load_text(tmp_path, raw))


def test_the_valid_experiments_load() -> None:
    for path in VALID:
        assert isinstance(load_experiment(path), Experiment)


# --------------------------------------------------------------------------------------------
# Regressions: inputs the loader once mishandled

SMALL = tomllib.loads((DATA / "sim-small.toml").read_text())


def with_space(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(SMALL)
    data["space"][name] = spec
    return data


def peak_bytes(fn: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        try:
            fn()
        except ConfigError:
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_wide_int_range_is_not_enumerated() -> None:
    data = with_space("chunked_prefill_size", {"type": "int", "low": 1, "high": 500_000})
    assert peak_bytes(lambda: experiment_from_dict(data)) < 4 << 20


def test_a_fine_float_step_is_not_enumerated() -> None:
    data = with_space("mem_fraction_static",
                      {"type": "float", "low": 0.1, "high": 0.9, "step": 1.6e-6})
    assert peak_bytes(lambda: experiment_from_dict(data)) < 4 << 20


def test_a_huge_integer_is_a_config_error() -> None:
    data = copy.deepcopy(SMALL)
    data["measure"]["duration_s"] = 10**400
    with pytest.raises(ConfigError):
        experiment_from_dict(data)


def test_deep_nesting_is_a_config_error(tmp_path: Path) -> None:
    raw = ("name = " + "[" * 3000 + "]" * 3000 + "\n").encode()
    with pytest.raises(ConfigError):
        load_text(tmp_path, raw)
