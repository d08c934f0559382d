"""A small parser of the Prometheus text exposition format (what `/metrics` serves).

Enough for the servers this project scrapes (vLLM, llama.cpp, SGLang): `# TYPE` lines, samples
`name{label="value",...} value [timestamp]`, label values with `\\\\`, `\\"` and `\\n` escapes,
and the special values `+Inf`, `-Inf`, `NaN`. `# HELP` and other comments are skipped; OpenMetrics'
`# EOF` ends the text. A malformed sample line raises `ValueError` naming the line.

    samples = parse(text)
    drafts = total(samples, "vllm:spec_decode_num_drafts_total")     # over all label sets
    per_pos = by_label(samples, "vllm:..._per_pos_total", "position")  # {"0": 12.0, ...}

Why not `prometheus_client.parser` (installed with ray[default]): on every capture under
tests/data (SGLang 0.5.17's /metrics among them) it gives the same samples and values, checked
2026-12-06; but it reads on past OpenMetrics' `# EOF` (its text parser; the OpenMetrics one
refuses Prometheus text), its error for a bad sample does not name the line ("could not convert
string to float"), which the facts' `unread` note repeats, and it is no declared dependency of
the project, only Ray's (deptry flags a transitive import).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]   # sorted by label name
    value: float

    def label(self, key: str) -> str | None:
        return next((v for k, v in self.labels if k == key), None)


def parse(text: str) -> list[Sample]:
    """Every sample of an exposition, in order."""
    out: list[Sample] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if line == "# EOF":
                break
            continue
        try:
            out.append(_sample(line))
        except ValueError as e:
            raise ValueError(f"line {lineno}: {e}: {raw[:200]!r}") from None
    return out


def types(text: str) -> dict[str, str]:
    """Metric family name -> its `# TYPE` (counter, gauge, histogram, ...)."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0] == "#" and parts[1] == "TYPE":
            out[parts[2]] = parts[3]
    return out


def _sample(line: str) -> Sample:
    m = _NAME.match(line)
    if m is None:
        raise ValueError("no metric name")
    name, pos = m.group(), m.end()
    labels: list[tuple[str, str]] = []
    if pos < len(line) and line[pos] == "{":
        pos = _labels(line, pos + 1, labels)
    rest = line[pos:].split()
    if not rest or len(rest) > 2 or (pos < len(line) and not line[pos].isspace()):
        raise ValueError("expected 'value [timestamp]' after the name")
    return Sample(name, tuple(sorted(labels)), _value(rest[0]))


def _labels(line: str, pos: int, out: list[tuple[str, str]]) -> int:
    """Parse `k="v",...}` from `pos`; returns the index after `}`."""
    n = len(line)
    while True:
        while pos < n and line[pos] in " \t":
            pos += 1
        if pos < n and line[pos] == "}":
            return pos + 1
        m = _LABEL_NAME.match(line, pos)
        if m is None:
            raise ValueError(f"bad label name at column {pos + 1}")
        key, pos = m.group(), m.end()
        while pos < n and line[pos] in " \t":
            pos += 1
        if line[pos:pos + 1] != "=":
            raise ValueError(f"expected '=' after label {key!r}")
        pos += 1
        while pos < n and line[pos] in " \t":
            pos += 1
        if line[pos:pos + 1] != '"':
            raise ValueError(f"expected a quoted value of label {key!r}")
        pos += 1
        chars: list[str] = []
        while True:
            if pos >= n:
                raise ValueError(f"unterminated value of label {key!r}")
            ch = line[pos]
            if ch == "\\":
                if pos + 1 >= n:
                    raise ValueError(f"dangling escape in label {key!r}")
                chars.append(_ESCAPES.get(line[pos + 1], "\\" + line[pos + 1]))
                pos += 2
            elif ch == '"':
                pos += 1
                break
            else:
                chars.append(ch)
                pos += 1
        out.append((key, "".join(chars)))
        while pos < n and line[pos] in " \t":
            pos += 1
        if pos < n and line[pos] == ",":
            pos += 1
        elif pos < n and line[pos] == "}":
            return pos + 1
        else:
            raise ValueError(f"expected ',' or '}}' after label {key!r}")


def _value(text: str) -> float:
    special = {"+Inf": math.inf, "Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}
    if text in special:
        return special[text]
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"bad sample value {text!r}") from None


def total(samples: Iterable[Sample], name: str) -> float | None:
    """The sum of `name` over all its label sets, or None if no sample has that name."""
    values = [s.value for s in samples if s.name == name]
    return sum(values) if values else None


def by_label(samples: Iterable[Sample], name: str, label: str) -> dict[str, float]:
    """`label`'s value -> the sum of `name` over its other labels (samples without `label`
    are left out)."""
    grouped: dict[str, float] = {}
    for s in samples:
        if s.name == name:
            key = s.label(label)
            if key is not None:
                grouped[key] = grouped.get(key, 0.0) + s.value
    return grouped
