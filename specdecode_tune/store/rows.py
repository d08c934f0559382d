"""Records to Arrow tables and back: one row per record, built column by column on its schema.

`requests_table`, `levels_table`, `trials_table` and `telemetry_table` build a table from
records (never inferring a type from Python values; a null in a non-nullable column is a
ValueError naming the column and row); the `records_from_*`, `level_summaries`,
`levels_by_trial` and `trial_results_from_tables` functions turn table rows back into records,
for the report and for resuming a trial.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import socket
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from ..records import TRIAL_STATUSES, LevelSummary, RequestRecord, ServerFacts, TrialResult
from .codec import LEVEL_FIELDS, level_from_dict
from .keys import config_key, param_columns, params_json, plain
from .schemas import (
    KEY_FIELDS,
    LEVELS_SCHEMA,
    PARAM_FIELDS,
    REQUESTS_SCHEMA,
    TELEMETRY_SCHEMA,
    TRIAL_EXTRA_KEYS,
    TRIALS_SCHEMA,
    RunTables,
    table_name,
)

_REQUEST_FIELDS = [f.name for f in dataclasses.fields(RequestRecord)]
_SAMPLE_COLUMNS = ("gpu", "uuid", "t_s", "dt_s", "mem_used_mib", "mem_total_mib", "util_gpu",
                   "util_mem", "sm_clock_mhz", "mem_clock_mhz", "clock_events_mask",
                   "temperature_c", "power_w")


# ---------------------------------------------------------------------------------------------
# Records -> tables


def _table(schema: pa.Schema, columns: Mapping[str, list[Any]]) -> pa.Table:
    """A table from columns, each converted to its schema type; never inferred."""
    if set(columns) != set(schema.names):
        # A programming error: a schema and the code that fills it drifted apart.
        raise RuntimeError(f"{table_name(schema)} columns "
                           f"differ from the schema: missing {set(schema.names) - set(columns)},"
                           f" extra {set(columns) - set(schema.names)}")
    arrays = []
    for field in schema:
        array = pa.array(columns[field.name], type=field.type)
        if not field.nullable and array.null_count:
            row = array.is_null().to_pylist().index(True)
            raise ValueError(f"column {field.name!r} must not be null, got None in row {row}")
        arrays.append(array)
    return pa.Table.from_arrays(arrays, schema=schema)


def _key_columns(trial_id: str, key: str, repeat: int, n: int) -> dict[str, list[Any]]:
    return {"trial_id": [trial_id] * n, "config_key": [key] * n, "repeat": [repeat] * n}


def requests_table(trial_id: str, records: Sequence[RequestRecord], *,
                   params: Mapping[str, Any], repeat: int) -> pa.Table:
    """One row per request record (REQUESTS_SCHEMA)."""
    n = len(records)
    cols = _key_columns(trial_id, config_key(params), repeat, n)
    for name in REQUESTS_SCHEMA.names[len(KEY_FIELDS):]:
        values = [getattr(r, name) for r in records]
        cols[name] = [list(v) for v in values] if name in ("chunk_gaps", "accept_histogram") \
            else values
    return _table(REQUESTS_SCHEMA, cols)


def levels_table(trial_id: str, summaries: Sequence[LevelSummary], *,
                 params: Mapping[str, Any], repeat: int) -> pa.Table:
    """One row per level summary (LEVELS_SCHEMA)."""
    n = len(summaries)
    cols = _key_columns(trial_id, config_key(params), repeat, n)
    cols["params_json"] = [params_json(params)] * n
    for name, value in param_columns(params).items():
        cols[name] = [value] * n
    for name in LEVELS_SCHEMA.names[len(KEY_FIELDS) + len(PARAM_FIELDS):]:
        values = [getattr(s, name) for s in summaries]
        cols[name] = [list(v) for v in values] if name == "accept_histogram" else values
    return _table(LEVELS_SCHEMA, cols)


def _timestamp(name: str, value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"extra[{name!r}] must be timezone-aware, got naive {value!r}")
        return value.astimezone(UTC)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return datetime.fromtimestamp(float(value), tz=UTC)
    raise ValueError(f"extra[{name!r}] must be an aware datetime or epoch seconds, got {value!r}")


def trials_table(result: TrialResult, *, extra: Mapping[str, Any] | None = None) -> pa.Table:
    """One row for a trial result (TRIALS_SCHEMA); `extra` holds TRIAL_EXTRA_KEYS."""
    extra = dict(extra or {})
    unknown = sorted(set(extra) - set(TRIAL_EXTRA_KEYS))
    if unknown:
        raise ValueError(f"extra has unknown keys {unknown}; allowed: {list(TRIAL_EXTRA_KEYS)}")
    if result.status not in TRIAL_STATUSES:
        raise ValueError(f"status must be one of {TRIAL_STATUSES}, got {result.status!r}")
    score = extra.get("score")
    if score is not None and (isinstance(score, bool) or not isinstance(score, numbers.Real)):
        raise ValueError(f"extra['score'] must be a number or None, got {score!r}")
    facts: ServerFacts = result.facts
    row: dict[str, Any] = {
        "trial_id": result.trial_id,
        "config_key": config_key(result.params),
        "repeat": result.repeat,
        "status": result.status,
        "reason": result.reason,
        "params_json": params_json(result.params),
        **param_columns(result.params),
        "max_total_num_tokens": facts.max_total_num_tokens,
        "max_running_requests": facts.max_running_requests,
        "gpu_ids": [str(g) for g in facts.gpu_ids],
        "boot_s": facts.boot_s,
        "wall_s": result.wall_s,
        "suspect": result.suspect,
        "n_levels": len(result.levels),
        "facts_json": json.dumps(facts.extra, sort_keys=True, default=plain)
        if facts.extra else None,
        "score": None if score is None else float(score),
        "jump_reason": extra.get("jump_reason"),
        "bracket_reason": extra.get("bracket_reason"),
        "plateau_answered": extra.get("plateau_answered"),
        "sampler": extra.get("sampler"),
        # The trial writes its own row, so by default the host writing is the host that ran it.
        "node": extra["node"] if "node" in extra else socket.gethostname(),
        "node_id": extra.get("node_id"),
        "started_at": _timestamp("started_at", extra.get("started_at")),
        "finished_at": _timestamp("finished_at", extra.get("finished_at")),
        "predicted": extra.get("predicted"),
    }
    return _table(TRIALS_SCHEMA, {k: [v] for k, v in row.items()})


def telemetry_table(trial_id: str, level_tag: str, samples: Sequence[Any]) -> pa.Table:
    """One row per GPU sample (TELEMETRY_SCHEMA). `samples` are telemetry.GpuSample values (or
    any objects with their attributes)."""
    n = len(samples)
    cols: dict[str, list[Any]] = {"trial_id": [trial_id] * n, "level": [level_tag] * n}
    for name in _SAMPLE_COLUMNS:
        cols[name] = [getattr(s, name) for s in samples]
    cols["timestamp"] = [datetime.fromtimestamp(s.wall, tz=UTC) for s in samples]
    cols["clock_events"] = [list(s.clock_events) for s in samples]
    cols["foreign"] = [[{"pid": p.pid, "name": p.name, "used_mib": p.used_mib}
                        for p in s.foreign] for s in samples]
    return _table(TELEMETRY_SCHEMA, cols)


# ---------------------------------------------------------------------------------------------
# Tables -> records (for the report and for resuming a trial)


def _rows(table: pa.Table, trial_id: str | None) -> Iterable[dict[str, Any]]:
    for row in table.to_pylist():
        if trial_id is None or row["trial_id"] == trial_id:
            yield row


def _level_from_row(row: Mapping[str, Any]) -> LevelSummary:
    return level_from_dict({name: row[name] for name in LEVEL_FIELDS})


def records_from_level_table(table: pa.Table, *, trial_id: str | None = None
                             ) -> list[LevelSummary]:
    """LevelSummary objects from levels-table rows (of one trial, if given), in table order."""
    return [_level_from_row(row) for row in _rows(table, trial_id)]


def level_summaries(table: pa.Table) -> list[tuple[str, LevelSummary]]:
    """(trial_id, LevelSummary) for each row of a levels table, in table order."""
    return [(row["trial_id"], _level_from_row(row)) for row in _rows(table, None)]


def levels_by_trial(table: pa.Table) -> dict[str, tuple[LevelSummary, ...]]:
    """Each trial id's level summaries, closed-loop levels by concurrency, then rates."""
    out: dict[str, list[LevelSummary]] = {}
    for tid, summary in level_summaries(table):
        out.setdefault(tid, []).append(summary)
    return {tid: tuple(sorted(levels, key=lambda s: (s.mode != "closed", s.concurrency,
                                                     s.rate or 0.0)))
            for tid, levels in out.items()}


def records_from_request_table(table: pa.Table, *, trial_id: str | None = None,
                               level: int | None = None) -> list[RequestRecord]:
    """RequestRecord objects from requests-table rows (of one trial / level, if given)."""
    out = []
    for row in _rows(table, trial_id):
        if level is not None and row["level"] != level:
            continue
        values = {name: row[name] for name in _REQUEST_FIELDS}
        values["chunk_gaps"] = tuple(values["chunk_gaps"])
        values["accept_histogram"] = tuple(values["accept_histogram"])
        out.append(RequestRecord(**values))
    return out


def trial_results_from_tables(tables: RunTables) -> list[TrialResult]:
    """TrialResult objects from the trials table, with their levels from the levels table."""
    levels = levels_by_trial(tables.levels)
    out = []
    for row in _rows(tables.trials, None):
        facts = ServerFacts(
            max_total_num_tokens=row["max_total_num_tokens"],
            max_running_requests=row["max_running_requests"],
            gpu_ids=tuple(row["gpu_ids"]), boot_s=row["boot_s"],
            extra=json.loads(row["facts_json"]) if row["facts_json"] else {})
        out.append(TrialResult(
            trial_id=row["trial_id"], params=json.loads(row["params_json"]),
            status=row["status"], reason=row["reason"], facts=facts,
            levels=levels.get(row["trial_id"], ()), wall_s=row["wall_s"],
            repeat=row["repeat"], suspect=row["suspect"]))
    return out
