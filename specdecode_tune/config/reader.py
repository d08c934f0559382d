"""The TOML reader: an experiment file's bytes to a dict, and typed reads of its tables.

`read_toml` turns every way a file can fail to be TOML (missing, a directory, unreadable, not
UTF-8, a syntax error, nested too deeply) into one `ConfigError` line naming the file.

`Table` is one table under validation. Its reads check the type (TOML `true` is not a number
nor `1` a bool), reject non-finite floats and integers beyond 64 bits, and remember the keys
read, so that `done()` reports the first unknown key by name with the keys allowed there.
Every error is one line: `<file>: <dotted.key> = <value>: <what is allowed>`.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

from ..errors import ConfigError

MISSING: Any = object()   # default of a required key


def read_toml(path: str | Path) -> dict[str, Any]:
    """The parsed file; a `ConfigError` naming the file on anything that is not TOML text."""
    where = str(path)
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such experiment file") from None
    except IsADirectoryError:
        raise ConfigError(f"{where}: is a directory, expected a TOML experiment file") from None
    except OSError as e:
        raise ConfigError(f"{where}: cannot read: {e.strerror}") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: TOML syntax error: {e}") from None
    except RecursionError:
        raise ConfigError(f"{where}: TOML nested too deeply to read") from None


def type_name(t: Any) -> str:
    if isinstance(t, tuple):
        return " or ".join(type_name(x) for x in t)
    return {int: "an integer", float: "a number", str: "a string", bool: "true/false",
            list: "a list", dict: "a table"}.get(t, getattr(t, "__name__", str(t)))


class Table:
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

    def get(self, name: str, types: Any, default: Any = MISSING) -> Any:
        self.seen.add(name)
        if name not in self.data:
            if default is MISSING:
                raise ConfigError(f"{self.where}: {self.key(name)} is required "
                                  f"({type_name(types)})")
            return default
        value = self.data[name]
        # bool is an int in Python; TOML true must not pass as a number, nor 1 as a bool.
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in
                                                (types if isinstance(types, tuple) else (types,)))
        if not ok:
            raise self.fail(name, value, f"must be {type_name(types)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise self.fail(name, value, "must be a finite number")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 1 << 63:
            raise self.fail(name, value, "is out of range (a 64-bit integer)")
        return value

    def sub(self, name: str, required: bool = False) -> Table:
        self.seen.add(name)
        if name not in self.data and not required:
            return Table({}, self.key(name), self.where)
        if name not in self.data:
            raise ConfigError(f"{self.where}: [{self.key(name)}] is required")
        return Table(self.data[name], self.key(name), self.where)

    def choice(self, name: str, choices: tuple[str, ...], default: Any = MISSING) -> str:
        value = self.get(name, str, default)
        if value not in choices:
            raise self.fail(name, value, f"must be one of {', '.join(choices)}")
        return value

    def positive(self, name: str, types: Any, default: Any = MISSING, *,
                 zero_ok: bool = False) -> Any:
        """A number > 0 (>= 0 with `zero_ok`); a `None` default passes when the key is unset."""
        value = self.get(name, types, default)
        if value is not None and (value < 0 or (value == 0 and not zero_ok)):
            raise self.fail(name, value, "must be >= 0" if zero_ok else "must be > 0")
        return value

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.seen)
        if unknown:
            allowed = ", ".join(sorted(self.seen)) or "none"
            raise ConfigError(f"{self.where}: unknown key {self.key(unknown[0])!r} "
                              f"(allowed here: {allowed})")
