"""What the search tells the samplers, typed, and its one codec to and from the Optuna study.

The search measures far more than a trial's score, and the model-guided sampler learns from all
of it. It reaches the sampler as attrs of the Optuna study (JSON-compatible, so any storage and
a resumed study keep them; the keys of per-level maps are str(concurrency)):

    study.user_attrs["baseline"] = {                                 # `Baseline`
        "levels": {"1": {"output_tok_s": 89.9}, "16": {...}, ...},   # the no-spec baseline
        "weights": {"1": 1.0, "16": 1.0, ...},                       # the objective's weights
        "facts": {"max_total_num_tokens": 455357, "max_running_requests": 26},
        "request_tokens": 512,          # or null: input + output tokens of one request
    }
    trial.user_attrs["measured"] = {                                 # `Measured`
        "status": "ok" | "infeasible" | "failed" | "pruned",
        "reason": "...",                # the server's refusal, for infeasible boots
        "params": {...},                # the resolved server settings (space.resolve)
        "facts": {"max_total_num_tokens": int | None, "max_running_requests": int | None,
                  "memory_room": float | None, "graph_memory": float | None},
                                        # the last two: ServerFacts.extra's, where the engine
                                        # logs its memory (records.MEMORY_ROOM, GRAPH_MEMORY)
        "levels": {"16": {"output_tok_s": 1903.0, "accept_length": 4.86,   # `LevelObs`
                          "accept_histogram": [3, 1, 0, 2, 120]}, ...},
    }
    study.user_attrs["noise_band"] = 0.025    # the score difference the search measured as noise

`Measured.of` and `Baseline.of` build them from the search's records (LevelSummary and
ServerFacts objects, or mappings with the same field names; open-loop and suspect levels are
left out); `to_attr` writes the attr, `from_attr` reads one back (a mapping, or the same as a
JSON string; None where it is not one). `measured_attr` and `baseline_attr` are the two in one
call. Reading is faithful: what a sampler makes of a value (a baseline it can score against, a
speculative trial) is the sampler's business.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..records import GRAPH_MEMORY, MEMORY_ROOM

MEASURED_ATTR = "measured"          # trial user attr: what the trial measured (`Measured`)
BASELINE_ATTR = "baseline"          # study user attr: the no-speculation baseline (`Baseline`)
NOISE_BAND_ATTR = "noise_band"      # study user attr: the noise band the search measured
# Trial user attr the search sets before a boot: what the sampler's model predicted for the
# point (`HybridSampler.predict`: tok_s per level, score, p_feasible, ...). The samplers read
# it back to know the model's errors on this run.
PREDICTED_ATTR = "predicted"

_KV = "max_total_num_tokens"        # the facts' names on the wire (and on ServerFacts)
_LIMIT = "max_running_requests"


@dataclass(frozen=True)
class LevelObs:
    """One closed-loop level of a trial: its throughput and the server's acceptance counters."""

    concurrency: int
    tok_s: float
    accept_length: float | None
    histogram: tuple[int, ...]      # verify steps that accepted exactly j drafts, j = 0, 1, ...

    @classmethod
    def of(cls, level: Any) -> LevelObs | None:
        """From a LevelSummary (or a mapping of its fields); None for open-loop, suspect."""
        get = _getter(level)
        if get("mode", "closed") != "closed" or get("suspect", False):
            return None
        accept = get("accept_length", None)
        return cls(concurrency=int(get("concurrency")), tok_s=float(get("output_tok_s")),
                   accept_length=None if accept is None else float(accept),
                   histogram=tuple(int(x) for x in get("accept_histogram", ()) or ()))

    def to_attr(self) -> dict[str, Any]:
        return {"output_tok_s": self.tok_s, "accept_length": self.accept_length,
                "accept_histogram": list(self.histogram)}

    @classmethod
    def from_attr(cls, concurrency: Any, value: Any) -> LevelObs | None:
        """One entry of a "levels" map; None without a throughput."""
        e = _as_mapping(value)
        if e is None or e.get("output_tok_s") is None:
            return None
        accept = e.get("accept_length")
        return cls(concurrency=int(concurrency), tok_s=float(e["output_tok_s"]),
                   accept_length=None if accept is None else float(accept),
                   histogram=tuple(int(x) for x in (e.get("accept_histogram") or ())))


@dataclass(frozen=True)
class Measured:
    """What one trial measured: how its boot went, its settings, server facts and levels."""

    status: str                     # "ok" | "infeasible" | "failed" | "pruned"
    reason: str                     # the server's refusal, for infeasible boots
    params: dict[str, Any]          # the resolved server settings (scalars only)
    kv: int | None                  # max_total_num_tokens: the KV budget in tokens
    limit: int | None               # max_running_requests
    levels: tuple[LevelObs, ...]
    room: float | None = None       # records.MEMORY_ROOM: how far the memory fraction could
                                    # rise before the boot ran out of memory, at most
    graph: float | None = None      # records.GRAPH_MEMORY: what its CUDA graphs kept

    @property
    def feasible(self) -> bool:
        return self.status == "ok"

    @classmethod
    def of(cls, *, status: str, params: Mapping[str, Any], facts: Any = None,
           levels: Iterable[Any] = (), reason: str = "") -> Measured:
        """From a TrialResult's parts (see the module docstring)."""
        kv, limit = _facts_of(facts)
        return cls(status=status, reason=reason,
                   params={k: v for k, v in params.items()
                           if isinstance(v, (int, float, str, bool)) or v is None},
                   kv=kv, limit=limit, levels=_closed_levels(levels),
                   room=_extra_of(facts, MEMORY_ROOM), graph=_extra_of(facts, GRAPH_MEMORY))

    def to_attr(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "params": dict(self.params),
            "facts": {**_facts_attr(self.kv, self.limit), MEMORY_ROOM: self.room,
                      GRAPH_MEMORY: self.graph},
            "levels": {str(lv.concurrency): lv.to_attr() for lv in self.levels},
        }

    @classmethod
    def from_attr(cls, value: Any) -> Measured | None:
        m = _as_mapping(value)
        if m is None:
            return None
        facts = _as_mapping(m.get("facts"))
        kv, limit = _facts_of(facts)
        levels = (LevelObs.from_attr(c, e) for c, e in (_as_mapping(m.get("levels")) or {}).items())
        return cls(status=str(m.get("status", "ok")), reason=str(m.get("reason", "")),
                   params=dict(_as_mapping(m.get("params")) or {}), kv=kv, limit=limit,
                   levels=tuple(lv for lv in levels if lv is not None),
                   room=_extra_of(facts, MEMORY_ROOM), graph=_extra_of(facts, GRAPH_MEMORY))


@dataclass(frozen=True)
class Baseline:
    """The no-speculation baseline the search measured first, and the objective's weights."""

    tok_s: dict[int, float]         # per concurrency
    weights: dict[int, float]       # per concurrency
    kv: int | None
    limit: int | None
    request_tokens: float | None    # KV tokens one request holds (input + output), if known

    @classmethod
    def of(cls, *, levels: Iterable[Any], weights: Mapping[int, float], facts: Any = None,
           request_tokens: float | None = None) -> Baseline:
        """From the baseline trial's levels and facts and the objective's weights per level."""
        kv, limit = _facts_of(facts)
        return cls(tok_s={lv.concurrency: lv.tok_s for lv in _closed_levels(levels)},
                   weights={int(c): float(w) for c, w in weights.items()}, kv=kv, limit=limit,
                   request_tokens=None if request_tokens is None else float(request_tokens))

    def to_attr(self) -> dict[str, Any]:
        return {
            "levels": {str(c): {"output_tok_s": v} for c, v in self.tok_s.items()},
            "weights": {str(c): w for c, w in self.weights.items()},
            "facts": _facts_attr(self.kv, self.limit),
            "request_tokens": self.request_tokens,
        }

    @classmethod
    def from_attr(cls, value: Any) -> Baseline | None:
        m = _as_mapping(value)
        if m is None:
            return None
        tok_s = {}
        for c, e in (_as_mapping(m.get("levels")) or {}).items():
            e = _as_mapping(e)
            if e is not None and e.get("output_tok_s") is not None:
                tok_s[int(c)] = float(e["output_tok_s"])
        kv, limit = _facts_of(_as_mapping(m.get("facts")))
        req = m.get("request_tokens")
        return cls(tok_s=tok_s,
                   weights={int(c): float(w)
                            for c, w in (_as_mapping(m.get("weights")) or {}).items()},
                   kv=kv, limit=limit, request_tokens=None if req is None else float(req))


def measured_attr(*, status: str, params: Mapping[str, Any], facts: Any = None,
                  levels: Iterable[Any] = (), reason: str = "") -> dict[str, Any]:
    """The trial user attr "measured", from a TrialResult's parts (`Measured.of`)."""
    return Measured.of(status=status, params=params, facts=facts, levels=levels,
                       reason=reason).to_attr()


def baseline_attr(*, levels: Iterable[Any], weights: Mapping[int, float], facts: Any = None,
                  request_tokens: float | None = None) -> dict[str, Any]:
    """The study user attr "baseline" (`Baseline.of`)."""
    return Baseline.of(levels=levels, weights=weights, facts=facts,
                       request_tokens=request_tokens).to_attr()


def _closed_levels(levels: Iterable[Any]) -> tuple[LevelObs, ...]:
    return tuple(lv for lv in (LevelObs.of(s) for s in levels) if lv is not None)


def _facts_of(facts: Any) -> tuple[int | None, int | None]:
    """(KV budget, running limit) from ServerFacts, a facts mapping, or None."""
    if facts is None:
        return None, None
    get = _getter(facts)
    kv, limit = get(_KV, None), get(_LIMIT, None)
    return None if kv is None else int(kv), None if limit is None else int(limit)


def _extra_of(facts: Any, name: str) -> float | None:
    """A number `name` (records.MEMORY_ROOM, GRAPH_MEMORY) from ServerFacts (its extra), a
    facts mapping (the attr's, or one with an "extra" map), or None."""
    if facts is None:
        return None
    get = _getter(facts)
    value = get(name, None)
    if value is None:
        value = (_as_mapping(get("extra", None)) or {}).get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return float(value)


def _facts_attr(kv: int | None, limit: int | None) -> dict[str, int | None]:
    return {_KV: kv, _LIMIT: limit}


def _getter(obj: Any) -> Any:
    """`get(name, default)` over a mapping's keys or an object's attributes."""
    if isinstance(obj, Mapping):
        return obj.get
    return lambda name, default=None: getattr(obj, name, default)


def _as_mapping(value: Any) -> Mapping[str, Any] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, Mapping) else None
