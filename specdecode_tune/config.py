"""Experiment files: TOML under `experiments/`, loaded into frozen dataclasses and validated.

An experiment says which server to boot and how (backend), what to search (space), what load to
measure it under (workload, measure), what "better" means (objective), how many trials to spend
(search) and, for a local cluster, how many logical GPUs to declare (cluster).

Every validation error is a `ConfigError` whose message is one line naming the file, the key,
the bad value and what is allowed. Nothing is started and nothing is written before an
experiment has loaded cleanly.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields
import os
from pathlib import Path
from typing import Any, Mapping, NoReturn

from .errors import ConfigError
from .promptfile import load_rows
from .space import PARAM_TYPES, ParamSpec, first_valid_point

BACKEND_KINDS = ("sim", "sglang", "vllm", "llamacpp")
APIS = ("generate", "completions", "chat")
SAMPLERS = ("plateau", "tpe", "nsga2", "random", "model")
OBJECTIVE_KINDS = ("scalar", "pareto")
PARETO_METRICS = ("output_tok_s", "requests_s", "ttft_p50", "tpot_p50", "itl_p50", "e2e_p50")
# Search parameters with a fixed meaning; any other name is a server flag (--name-with-dashes).
SPEC_PARAMS = (
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
)

_MISSING = object()


def _type_name(t: Any) -> str:
    if isinstance(t, tuple):
        return " or ".join(_type_name(x) for x in t)
    return {int: "an integer", float: "a number", str: "a string", bool: "true/false",
            list: "a list", dict: "a table"}.get(t, getattr(t, "__name__", str(t)))


class _Table:
    """One TOML table under validation: typed reads, and unknown keys reported by name."""

    def __init__(self, data: Any, path: str, where: str) -> None:
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: {path or 'the file'} must be a table, got {data!r}")
        self.data = data
        self.path = path
        self.where = where
        self.seen: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def fail(self, name: str, value: Any, allowed: str) -> ConfigError:
        return ConfigError(f"{self.where}: {self.key(name)} = {value!r}: {allowed}")

    def get(self, name: str, types: Any, default: Any = _MISSING) -> Any:
        self.seen.add(name)
        if name not in self.data:
            if default is _MISSING:
                raise ConfigError(f"{self.where}: {self.key(name)} is required "
                                  f"({_type_name(types)})")
            return default
        value = self.data[name]
        # bool is an int in Python; TOML true must not pass as a number, nor 1 as a bool.
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in
                                                (types if isinstance(types, tuple) else (types,)))
        if not ok:
            raise self.fail(name, value, f"must be {_type_name(types)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise self.fail(name, value, "must be a finite number")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 1 << 63:
            raise self.fail(name, value, "is out of range (a 64-bit integer)")
        return value

    def sub(self, name: str, required: bool = False) -> _Table:
        self.seen.add(name)
        if name not in self.data and not required:
            return _Table({}, self.key(name), self.where)
        if name not in self.data:
            raise ConfigError(f"{self.where}: [{self.key(name)}] is required")
        return _Table(self.data[name], self.key(name), self.where)

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.seen)
        if unknown:
            allowed = ", ".join(sorted(self.seen)) or "none"
            raise ConfigError(f"{self.where}: unknown key {self.key(unknown[0])!r} "
                              f"(allowed here: {allowed})")


def _choice(t: _Table, name: str, choices: tuple[str, ...], default: Any = _MISSING) -> str:
    value = t.get(name, str, default)
    if value not in choices:
        raise t.fail(name, value, f"must be one of {', '.join(choices)}")
    return value


def _positive(t: _Table, name: str, types: Any, default: Any = _MISSING, *,
              zero_ok: bool = False) -> Any:
    value = t.get(name, types, default)
    if value is not None and (value < 0 or (value == 0 and not zero_ok)):
        raise t.fail(name, value, "must be >= 0" if zero_ok else "must be > 0")
    return value


@dataclass(frozen=True)
class BackendConfig:
    """Which server to boot and its fixed settings. `flags` use the server's own names."""

    kind: str
    model_path: str
    speculative_algorithm: str | None = "EAGLE3"
    draft_model_path: str | None = None
    tp_size: int = 1
    host: str = "127.0.0.1"
    api: str = "generate"
    boot_timeout_s: float = 900.0
    flags: dict[str, Any] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    api_key_env: str | None = None
    binary: str | None = None          # server program (llama-server path); None = default
    profile: str | None = None         # sim only: performance profile name or path
    boot_time_s: float | None = None   # sim only: override the profile's boot time


WORKLOAD_KINDS = ("random", "jsonl")
Length = int | tuple[int, int]


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """What a trial sends. Validated on construction; bad values raise `ConfigError`."""

    kind: str = "random"
    input_len: Length = 256
    output_len: Length = 256
    seed: int = 0
    temperature: float = 0.0
    ignore_eos: bool = True
    path: str | None = None
    max_prompts: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in WORKLOAD_KINDS:
            _bad("kind", self.kind, f"one of {', '.join(WORKLOAD_KINDS)}")
        # TOML gives arrays as lists; store ranges as tuples so the spec stays hashable.
        object.__setattr__(self, "input_len", _length("input_len", self.input_len))
        object.__setattr__(self, "output_len", _length("output_len", self.output_len))
        if not _is_int(self.seed):
            _bad("seed", self.seed, "an integer")
        if (
            isinstance(self.temperature, bool)
            or not isinstance(self.temperature, int | float)
            or not 0.0 <= self.temperature <= 100.0
        ):
            _bad("temperature", self.temperature, "a number >= 0")
        if not isinstance(self.ignore_eos, bool):
            _bad("ignore_eos", self.ignore_eos, "true or false")
        if self.max_prompts is not None and (not _is_int(self.max_prompts) or self.max_prompts < 1):
            _bad("max_prompts", self.max_prompts, "an integer >= 1, or unset")
        if self.kind == "jsonl":
            if not isinstance(self.path, str | os.PathLike) or not str(self.path):
                _bad("path", self.path, "a JSONL prompt file (required for kind jsonl)")
            if not os.path.exists(self.path):
                _bad("path", str(self.path), "an existing JSONL file")
            # Every line is checked now, before anything starts (and the rows are cached for
            # this process's workload): a bad line is one ConfigError naming file and line.
            load_rows(self.path, self.max_prompts)
        elif self.path is not None:
            _bad("path", self.path, "unset for kind random (it only applies to kind jsonl)")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> WorkloadSpec:
        """Build from the experiment's `[workload]` table; an unknown key is a `ConfigError`."""
        allowed = [f.name for f in fields(cls)]
        for key in data:
            if key not in allowed:
                _bad(key, data[key], ", ".join(allowed), what="unknown key, value")
        return cls(**data)


@dataclass(frozen=True)
class MeasureConfig:
    """How each concurrency level is measured (closed loop) or each request rate (open loop)."""

    concurrency: tuple[int, ...] = (1, 16, 32, 64)
    rates: tuple[float, ...] = ()                 # open-loop request rates, measured after
    warmup_s: float = 2.0                         # ramp-up per level, not counted
    duration_s: float = 10.0                      # measurement window per level
    warmup_requests: int = 2                      # sequential requests after boot, not counted
    request_timeout_s: float = 300.0
    max_requests: int | None = None               # optional cap per level


@dataclass(frozen=True)
class ObjectiveConfig:
    """Scalar: weighted mean of log-speedup over the no-spec baseline across levels.
    Pareto: several per-level metrics, each maximised (latencies minimised)."""

    kind: str = "scalar"
    weights: dict[int, float] = field(default_factory=dict)   # concurrency -> weight
    metrics: tuple[str, ...] = ()                               # pareto: "output_tok_s@1", ...


@dataclass(frozen=True)
class SearchConfig:
    sampler: str = "plateau"
    max_trials: int = 20
    max_concurrent: int = 2
    gpus_per_trial: int = 2
    cpus_per_trial: float = 1.0
    repeats: int = 3                  # measurements of the final incumbent
    remeasure_top: int = 2            # top configs re-measured to estimate the noise band
    noise_band: float = 0.025         # relative; used until repeats measure one
    seed: int = 0
    baseline: bool = True             # measure no-speculation first
    enqueue: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class ClusterConfig:
    num_gpus: int | None = None       # logical GPUs declared when starting a local cluster
    num_cpus: int | None = None


@dataclass(frozen=True)
class Experiment:
    name: str
    backend: BackendConfig
    space: tuple[ParamSpec, ...]
    workload: WorkloadSpec
    measure: MeasureConfig
    objective: ObjectiveConfig
    search: SearchConfig
    cluster: ClusterConfig
    description: str = ""
    source: str = ""                  # the file it was loaded from

    def param(self, name: str) -> ParamSpec | None:
        return next((p for p in self.space if p.name == name), None)

    def level_weights(self) -> dict[int, float]:
        """Objective weight per concurrency level; levels not named get weight 0 if any is
        named, else all levels weigh the same."""
        if not self.objective.weights:
            return {c: 1.0 for c in self.measure.concurrency}
        return {c: self.objective.weights.get(c, 0.0) for c in self.measure.concurrency}


# ---------------------------------------------------------------------------------------------
# Loading


def load_experiment(path: str | Path) -> Experiment:
    """Read and validate an experiment file; raises ConfigError with one line on bad input."""
    p = Path(path)
    where = str(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such experiment file") from None
    except IsADirectoryError:
        raise ConfigError(f"{where}: is a directory, expected a TOML experiment file") from None
    except OSError as e:
        raise ConfigError(f"{where}: cannot read: {e.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: TOML syntax error: {e}") from None
    except RecursionError:
        raise ConfigError(f"{where}: TOML nested too deeply to read") from None
    return experiment_from_dict(data, where=where, base_dir=p.parent)


def experiment_from_dict(data: Mapping[str, Any], *, where: str = "<experiment>",
                         base_dir: Path | None = None) -> Experiment:
    top = _Table(dict(data), "", where)
    name = top.get("name", str)
    if not name or any(c in name for c in "/\\\0") or name.startswith("."):
        raise top.fail("name", name, "must be a non-empty name without slashes")
    description = top.get("description", str, "")
    backend = _backend(top.sub("backend", required=True), base_dir)
    space = _space(top.sub("space", required=True))
    workload = _workload(top.sub("workload"), base_dir)
    measure = _measure(top.sub("measure"))
    objective = _objective(top.sub("objective"), measure)
    search = _search(top.sub("search"), space)
    cluster = _cluster(top.sub("cluster"))
    top.done()
    exp = Experiment(name=name, backend=backend, space=space, workload=workload,
                     measure=measure, objective=objective, search=search, cluster=cluster,
                     description=description, source=where)
    _check_space_has_valid_config(exp, where)
    return exp


def _relative_to(value: str, base_dir: Path | None, *, bare: bool = True) -> str:
    """A relative path that exists from here or from the experiment's folder, made absolute:
    trials run in their own working directories. Anything else is kept as written (a Hugging
    Face hub id, `${SPECDECODE_CACHE}/...` expanded per machine, or a missing path that the
    pre-flight reports). With `bare=False` a value without a slash is kept too (a program on
    PATH: a file of that name here is not what runs)."""
    if (not value or (not bare and "/" not in value) or value.startswith(("~", "$"))
            or os.path.isabs(value)):
        return value
    for p in (Path(value), *([base_dir / value] if base_dir is not None else [])):
        if p.exists():
            return os.path.abspath(p)   # not resolve(): a venv's python is a symlink
    return value


def _optional_path(t: _Table, name: str, base_dir: Path | None, *, bare: bool = True
                   ) -> str | None:
    value = t.get(name, str, None)
    return None if value is None else _relative_to(value, base_dir, bare=bare)


def _profile(t: _Table, kind: str, base_dir: Path | None) -> str | None:
    """backend.profile: a bundled profile's name (checked by the simulator's loader before a
    search), or the path of a profile TOML (a slash or a .toml suffix), which must exist."""
    value = t.get("profile", str, None)
    if kind != "sim" or not value or ("/" not in value and not value.endswith(".toml")):
        return value
    p = Path(value).expanduser()
    if not p.is_absolute() and not p.exists() and base_dir is not None:
        p = base_dir / p
    if p.is_dir():
        raise t.fail("profile", value, f"{p} is a directory; allowed: a profile TOML file or "
                                       f"a bundled profile's name")
    if not p.exists():
        raise t.fail("profile", value, "no such profile file; allowed: an existing profile "
                                       "TOML file or a bundled profile's name")
    return os.path.abspath(p)


def _backend(t: _Table, base_dir: Path | None = None) -> BackendConfig:
    kind = _choice(t, "kind", BACKEND_KINDS)
    model_path = t.get("model_path", str, "seed-qwen35-122b" if kind == "sim" else _MISSING)
    algo = t.get("speculative_algorithm", str, "EAGLE3")
    cfg = BackendConfig(
        kind=kind,
        model_path=_relative_to(model_path, base_dir),
        speculative_algorithm=algo or None,
        draft_model_path=_optional_path(t, "draft_model_path", base_dir),
        tp_size=_positive(t, "tp_size", int, 1),
        host=t.get("host", str, "127.0.0.1"),
        api=_choice(t, "api", APIS, "completions" if kind in ("vllm", "llamacpp") else "generate"),
        boot_timeout_s=float(_positive(t, "boot_timeout_s", (int, float), 900.0)),
        flags=_flags(t.sub("flags")),
        extra_args=tuple(_str_list(t, "extra_args")),
        env=_str_map(t.sub("env")),
        api_key_env=t.get("api_key_env", str, None) or None,
        binary=_optional_path(t, "binary", base_dir, bare=False),
        profile=_profile(t, kind, base_dir),
        boot_time_s=_positive(t, "boot_time_s", (int, float), None, zero_ok=True),
    )
    if kind != "sim":
        for key in ("profile", "boot_time_s"):
            if getattr(cfg, key) is not None:
                raise t.fail(key, getattr(cfg, key), "is only allowed with backend.kind = 'sim'")
    t.done()
    return cfg


def _flags(t: _Table) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in list(t.data):
        v = t.get(k, (int, float, str, bool))
        if not k.replace("_", "").replace("-", "").isalnum():
            raise t.fail(k, v, "flag names are letters, digits, '_' and '-'")
        out[k.replace("-", "_")] = v
    t.done()
    return out


def _str_list(t: _Table, name: str) -> list[str]:
    value = t.get(name, list, [])
    if not all(isinstance(x, str) for x in value):
        raise t.fail(name, value, "must be a list of strings")
    return value


def _str_map(t: _Table) -> dict[str, str]:
    out = {k: t.get(k, str) for k in list(t.data)}
    t.done()
    return out


def _space(t: _Table) -> tuple[ParamSpec, ...]:
    if not t.data:
        raise ConfigError(f"{t.where}: [space] must declare at least one parameter")
    specs = []
    for name in list(t.data):
        sub = t.sub(name, required=True)
        specs.append(_param(name, sub))
    t.done()
    return tuple(specs)


def _param(name: str, t: _Table) -> ParamSpec:
    ptype = _choice(t, "type", PARAM_TYPES)
    if ptype == "categorical":
        choices = t.get("choices", list)
        if not choices:
            raise t.fail("choices", choices, "must list at least one value")
        if len(set(map(repr, choices))) != len(choices):
            raise t.fail("choices", choices, "must not repeat a value")
        spec = ParamSpec(name=name, type=ptype, choices=tuple(choices))
    else:
        num = int if ptype == "int" else (int, float)
        low = t.get("low", num)
        high = t.get("high", num)
        step = t.get("step", num, None)
        log = t.get("log", bool, False)
        if low > high:
            raise ConfigError(f"{t.where}: {t.path}: low = {low!r} > high = {high!r}: "
                              f"low <= high must hold")
        if step is not None and step <= 0:
            raise t.fail("step", step, "must be > 0")
        if log and low <= 0:
            raise t.fail("low", low, "must be > 0 when log = true")
        if log and step is not None:
            raise t.fail("step", step, "cannot be combined with log = true")
        spec = ParamSpec(name=name, type=ptype, low=low, high=high, step=step, log=log)
    _check_known_param(spec, t)
    t.done()
    return spec


_PARAM_BOUNDS: dict[str, tuple[float, float, str]] = {
    "speculative_num_steps": (0, 64, "an integer number of draft steps in [0, 64]"),
    "speculative_eagle_topk": (1, 64, "an integer top-k in [1, 64]"),
    "speculative_num_draft_tokens": (1, 1024, "an integer number of draft tokens in [1, 1024]"),
    "mem_fraction_static": (0.0, 1.0, "a fraction in (0, 1]"),
    "max_running_requests": (1, 1 << 20, "a positive integer"),
    "cuda_graph_max_bs": (1, 1 << 20, "a positive integer"),
}


def _check_known_param(spec: ParamSpec, t: _Table) -> None:
    bounds = _PARAM_BOUNDS.get(spec.name)
    if bounds is None:
        return
    lo, hi, allowed = bounds
    if spec.name != "mem_fraction_static" and spec.type == "float":
        raise t.fail("type", spec.type, f"{spec.name} is {allowed}: use int or categorical")
    values = list(spec.choices) if spec.type == "categorical" else [spec.low, spec.high]
    for v in values:
        bad = (not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi
               or (spec.name == "mem_fraction_static" and v <= 0)
               or (spec.name != "mem_fraction_static" and v != int(v)))
        if bad:
            key = "choices" if spec.type == "categorical" else ("low" if v == spec.low else "high")
            raise t.fail(key, v, f"{spec.name} must be {allowed}")


def _len_value(t: _Table, name: str, default: int) -> int | tuple[int, int]:
    value = t.get(name, (int, list), default)
    if isinstance(value, list):
        if (len(value) != 2 or not all(isinstance(x, int) and not isinstance(x, bool)
                                       for x in value)):
            raise t.fail(name, value, "must be an integer or a [low, high] pair of integers")
        lo, hi = value
        if lo < 1 or lo > hi:
            raise t.fail(name, value, "a range must satisfy 1 <= low <= high")
        return (lo, hi)
    if value < 1:
        raise t.fail(name, value, "must be >= 1")
    return value


def _workload(t: _Table, base_dir: Path | None) -> WorkloadSpec:
    kind = _choice(t, "kind", ("random", "jsonl"), "random")
    path = t.get("path", str, None)
    if kind == "jsonl":
        if path is None:
            raise ConfigError(f"{t.where}: workload.path is required when workload.kind = 'jsonl'")
        p = Path(path)
        if not p.is_absolute() and base_dir is not None and not p.exists():
            p = base_dir / p
        if not p.exists():
            raise t.fail("path", path, "must name an existing JSONL file")
        path = str(p.resolve())   # trials run in their own folders: keep it absolute
    temperature = t.get("temperature", (int, float), 0.0)
    if temperature < 0:
        raise t.fail("temperature", temperature, "must be >= 0")
    values: dict[str, Any] = {
        "kind": kind,
        "input_len": _len_value(t, "input_len", 256),
        "output_len": _len_value(t, "output_len", 256),
        "seed": t.get("seed", int, 0),
        "temperature": float(temperature),
        "ignore_eos": t.get("ignore_eos", bool, True),
        "path": path,
        "max_prompts": _positive(t, "max_prompts", int, None),
    }
    t.done()
    try:
        spec = WorkloadSpec(**values)   # reads and checks a JSONL file line by line
    except ConfigError as e:
        raise ConfigError(f"{t.where}: {e}") from None
    return spec


def _measure(t: _Table) -> MeasureConfig:
    conc = t.get("concurrency", list, [1, 16, 32, 64])
    if not conc or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1
                           for c in conc):
        raise t.fail("concurrency", conc, "must be a non-empty list of integers >= 1")
    if len(set(conc)) != len(conc):
        raise t.fail("concurrency", conc, "must not repeat a level")
    rates = t.get("rates", list, [])
    if not all(isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0 for r in rates):
        raise t.fail("rates", rates, "must be a list of request rates > 0")
    max_requests = t.get("max_requests", int, 0)
    if max_requests < 0:
        raise t.fail("max_requests", max_requests, "must be >= 0 (0 = no cap)")
    cfg = MeasureConfig(
        concurrency=tuple(conc),
        rates=tuple(float(r) for r in rates),
        warmup_s=float(_positive(t, "warmup_s", (int, float), 2.0, zero_ok=True)),
        duration_s=float(_positive(t, "duration_s", (int, float), 10.0)),
        warmup_requests=_positive(t, "warmup_requests", int, 2, zero_ok=True),
        request_timeout_s=float(_positive(t, "request_timeout_s", (int, float), 300.0)),
        max_requests=max_requests or None,
    )
    t.done()
    return cfg


def _objective(t: _Table, measure: MeasureConfig) -> ObjectiveConfig:
    kind = _choice(t, "kind", OBJECTIVE_KINDS, "scalar")
    wt = t.sub("weights")
    weights: dict[int, float] = {}
    for k in list(wt.data):
        w = wt.get(k, (int, float))
        try:
            c = int(k)
        except ValueError:
            raise wt.fail(k, w, "weights are keyed by a concurrency level, e.g. \"16\" = 1.0") \
                from None
        if c not in measure.concurrency:
            raise wt.fail(k, w, f"{c} is not a measured level (measure.concurrency = "
                                f"{list(measure.concurrency)})")
        if w < 0:
            raise wt.fail(k, w, "must be >= 0")
        weights[c] = float(w)
    wt.done()
    if weights and sum(weights.values()) <= 0:
        raise ConfigError(f"{t.where}: objective.weights sum to 0: at least one must be > 0")
    metrics = t.get("metrics", list, [])
    for m in metrics:
        name, _, level = str(m).partition("@")
        if name not in PARETO_METRICS or not level.isdigit() or \
                int(level) not in measure.concurrency:
            raise t.fail("metrics", m, f"each metric is NAME@LEVEL with NAME in "
                                       f"{', '.join(PARETO_METRICS)} and LEVEL a measured "
                                       f"concurrency")
    if kind == "pareto" and len(metrics) < 2:
        raise t.fail("metrics", metrics, "a pareto objective needs at least two metrics")
    if kind == "scalar" and metrics:
        raise t.fail("metrics", metrics, "only used with objective.kind = 'pareto'")
    t.done()
    return ObjectiveConfig(kind=kind, weights=weights, metrics=tuple(metrics))


def _search(t: _Table, space: tuple[ParamSpec, ...]) -> SearchConfig:
    enqueue = t.get("enqueue", list, [])
    names = {p.name for p in space}
    for point in enqueue:
        if not isinstance(point, dict) or not point:
            raise t.fail("enqueue", point, "each enqueued point is a table of parameter values")
        for k, v in point.items():
            spec = next((p for p in space if p.name == k), None)
            if spec is None:
                raise t.fail("enqueue", point, f"{k!r} is not a searched parameter "
                                               f"({', '.join(sorted(names))})")
            if not spec.contains(v):
                raise t.fail("enqueue", point, f"{k} = {v!r} is outside its search range")
    noise = t.get("noise_band", (int, float), 0.025)
    if not 0 <= noise <= 1:
        raise t.fail("noise_band", noise, "must be a probability-like fraction in [0, 1]")
    cfg = SearchConfig(
        sampler=_choice(t, "sampler", SAMPLERS, "plateau"),
        max_trials=_positive(t, "max_trials", int, 20),
        max_concurrent=_positive(t, "max_concurrent", int, 2),
        gpus_per_trial=_positive(t, "gpus_per_trial", int, 2, zero_ok=True),
        cpus_per_trial=float(_positive(t, "cpus_per_trial", (int, float), 1.0)),
        repeats=_positive(t, "repeats", int, 3),
        remeasure_top=_positive(t, "remeasure_top", int, 2, zero_ok=True),
        noise_band=float(noise),
        seed=t.get("seed", int, 0),
        baseline=t.get("baseline", bool, True),
        enqueue=tuple(dict(p) for p in enqueue),
    )
    t.done()
    return cfg


def _cluster(t: _Table) -> ClusterConfig:
    cfg = ClusterConfig(num_gpus=_positive(t, "num_gpus", int, None, zero_ok=True),
                        num_cpus=_positive(t, "num_cpus", int, None))
    t.done()
    return cfg


def _check_space_has_valid_config(exp: Experiment, where: str) -> None:
    if first_valid_point(exp.space, exp.backend.flags) is None:
        raise ConfigError(f"{where}: the search space allows no valid configuration "
                          f"(speculative_num_draft_tokens must be <= steps * topk + 1 and "
                          f">= 2 for some steps/topk in the space)")


# Workload value checks, shared by WorkloadSpec's own validation.


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _length(key: str, v: Any) -> Length:
    allowed = "an integer >= 1 or [low, high] with 1 <= low <= high"
    if _is_int(v):
        if v < 1:
            _bad(key, v, allowed)
        return v
    if isinstance(v, list | tuple) and len(v) == 2 and all(_is_int(x) for x in v):
        low, high = v
        if not 1 <= low <= high:
            _bad(key, list(v), allowed)
        return (low, high)
    _bad(key, v, allowed)


def _bad(key: str, value: Any, allowed: str, what: str = "got") -> NoReturn:
    # One line: the key, the value, what is allowed.
    raise ConfigError(f"workload.{key}: {what} {value!r}; allowed: {allowed}")
