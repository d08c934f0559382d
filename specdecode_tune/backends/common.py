"""What every engine's backend uses alike: settings as `--flags`, a number as a flag value, a
JSON read of the server (through `httpread`, with the trial's headers), and running a
backend's own argument check over several command lines.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import ConfigError
from . import httpread


def fmt(value: Any) -> str:
    """A setting's value on a command line: floats rounded to 6 places, as `repr` writes them."""
    if isinstance(value, float):
        return repr(round(value, 6))
    return str(value)


def flag_args(params: Mapping[str, Any], skip: tuple[str, ...] = ()) -> list[str]:
    """`--name-with-dashes value` for each setting; True -> bare flag, False/None -> nothing."""
    out: list[str] = []
    for name, value in params.items():
        if name in skip or name.startswith("_") or value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        out.append(flag) if value is True else out.extend([flag, fmt(value)])
    return out


def get_json(url: str, timeout_s: float, headers: Mapping[str, str] | None = None) -> Any:
    return httpread.get_json(url, timeout_s, headers)     # KeyRefused on 401/403


def each_refusal(check: Callable[[Sequence[str]], None], argvs: Sequence[Sequence[str]]
                 ) -> list[str | None]:
    """`check` (raises ConfigError, one line, for a command line every boot would refuse) on
    each argv: per argv, the refusal or None."""
    out: list[str | None] = []
    for argv in argvs:
        try:
            check(argv)
            out.append(None)
        except ConfigError as e:
            out.append(str(e))
    return out


__all__ = ["at_least", "each_refusal", "flag_args", "fmt", "get_json", "version_key"]


_RELEASE = re.compile(r"(\d+(?:\.\d+)*)(.*)")


def version_key(version: str) -> tuple[int, ...]:
    """A release's order: its numbers, then 1 for a final or post release, 0 for a pre-release
    (0.5.13rc0 < 0.5.13 <= 0.5.13.post1)."""
    m = _RELEASE.fullmatch(version.strip())
    if m is None:
        raise ValueError(f"not a release number: {version!r}")
    nums = tuple(int(x) for x in m.group(1).split("."))
    pre = re.match(r"\.?(rc|a|b|dev)", m.group(2)) is not None
    return (*nums, *(0,) * (4 - len(nums)), 0 if pre else 1)


def at_least(version: str, since: str) -> bool:
    """Whether release `version` is `since` or later (`version_key`)."""
    return version_key(version) >= version_key(since)
