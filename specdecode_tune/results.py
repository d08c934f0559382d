"""The run's Arrow tables: explicit schemas, atomic Parquet writes, a reader with the full schema.

Layout under the run dir, which is a local path or any URI `pyarrow.fs` understands (file://,
s3://, gs://, ...) so that every node of a cluster writes to the same place:

    <run_dir>/tables/requests/<trial_id>-<level>.parquet   one row per request of the level
    <run_dir>/tables/levels/<trial_id>-<level>.parquet     one row: the level's summary
    <run_dir>/tables/trials/<trial_id>.parquet             one row: the trial's result

`<level>` is "c<concurrency>" for a closed-loop level and "r<rate>" for an open-loop one. One
file per trial per level means a re-run of a level (a resumed trial) replaces its rows instead of
adding a duplicate, and a reader never sees half a trial's level. A level's requests are written
before its summary, so a summary row always has its requests.

Writes are atomic: the table is serialized in memory, then written to a hidden temporary file in
the same directory and renamed over the final name (local disk, file:// URIs, other filesystems
with a rename); on object stores (S3, GCS, Azure) a single put is already all-or-nothing, and a
rename there would be a copy, so the object is put directly. Either way a killed writer leaves at
most a hidden temporary file, which the reader ignores.

Every table has a schema constant here; rows are built column by column against it and nothing
is ever inferred from Python values. The reader reads with the same schemas, because a Parquet
dataset read without one takes the first file's schema and drops columns only later files have.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
import os
import socket
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .records import TRIAL_STATUSES, LevelSummary, RequestRecord, ServerFacts, TrialResult
from .space import SHORT_NAMES

SCHEMA_VERSION = "1"
TABLES_DIR = "tables"

# The search parameters that also get a typed column (all of them stay in params_json).
PARAM_COLUMNS: dict[str, pa.DataType] = {
    "speculative_num_steps": pa.int64(),
    "speculative_eagle_topk": pa.int64(),
    "speculative_num_draft_tokens": pa.int64(),
    "mem_fraction_static": pa.float64(),
}

_TS = pa.timestamp("us", tz="UTC")


def _f(name: str, type_: pa.DataType, nullable: bool = True) -> pa.Field:
    return pa.field(name, type_, nullable=nullable)


def _schema(fields: Sequence[pa.Field], table: str) -> pa.Schema:
    return pa.schema(fields, metadata={"specdecode_tune.table": table,
                                       "specdecode_tune.schema_version": SCHEMA_VERSION})


_KEYS = [_f("trial_id", pa.string(), False), _f("config_key", pa.string(), False),
         _f("repeat", pa.int64(), False)]
_PARAMS = [_f("params_json", pa.string(), False)] + [_f(n, t) for n, t in PARAM_COLUMNS.items()]

REQUESTS_SCHEMA = _schema(_KEYS + [
    _f("level", pa.int64(), False),
    _f("index", pa.int64(), False),
    _f("start", pa.float64(), False),
    _f("end", pa.float64(), False),
    _f("ttft", pa.float64()),
    _f("input_tokens", pa.int64(), False),
    _f("output_tokens", pa.int64(), False),
    _f("chunk_gaps", pa.list_(pa.float32()), False),
    _f("verify_ct", pa.int64()),
    _f("accepted_tokens", pa.int64()),
    _f("draft_tokens", pa.int64()),
    _f("accept_histogram", pa.list_(pa.int64()), False),
    _f("in_window", pa.bool_(), False),
    _f("error", pa.string()),
    # Added after schema version 1 was first written: nullable, so that files written before it
    # read back with nulls (read_table reads every file with this schema).
    _f("error_detail", pa.string()),
], "requests")

_PERCENTILES = [f"{m}_{p}" for m in ("ttft", "tpot", "itl", "e2e") for p in ("p50", "p90", "p99")]

LEVELS_SCHEMA = _schema(_KEYS + _PARAMS + [
    _f("concurrency", pa.int64(), False),
    _f("mode", pa.string(), False),
    _f("rate", pa.float64()),
    _f("duration_s", pa.float64(), False),
    _f("requests", pa.int64(), False),
    _f("errors", pa.int64(), False),
    _f("output_tokens", pa.int64(), False),
    _f("output_tok_s", pa.float64(), False),
    _f("requests_s", pa.float64(), False),
    *[_f(name, pa.float64()) for name in _PERCENTILES],
    _f("accept_length", pa.float64()),
    _f("accept_histogram", pa.list_(pa.int64()), False),
    _f("over_running_limit", pa.bool_(), False),
    _f("suspect", pa.bool_(), False),
    _f("note", pa.string(), False),
], "levels")

TRIALS_SCHEMA = _schema(_KEYS + [
    _f("status", pa.string(), False),
    _f("reason", pa.string(), False),
] + _PARAMS + [
    _f("max_total_num_tokens", pa.int64()),
    _f("max_running_requests", pa.int64()),
    _f("gpu_ids", pa.list_(pa.string()), False),
    _f("boot_s", pa.float64()),
    _f("wall_s", pa.float64(), False),
    _f("suspect", pa.bool_(), False),
    _f("n_levels", pa.int64(), False),
    _f("facts_json", pa.string()),        # ServerFacts.extra: what else the server said
    _f("score", pa.float64()),
    _f("jump_reason", pa.string()),       # set by the search's plateau-escape sampler
    _f("sampler", pa.string()),
    _f("node", pa.string()),              # host name where the trial ran
    _f("node_id", pa.string()),           # Ray node id (tells raylets on one host apart)
    _f("started_at", _TS),
    _f("finished_at", _TS),
], "trials")

SCHEMAS: dict[str, pa.Schema] = {
    "requests": REQUESTS_SCHEMA, "levels": LEVELS_SCHEMA, "trials": TRIALS_SCHEMA}

# Keys `write_trial(extra=...)` accepts: what the search knows and the trial result does not.
TRIAL_EXTRA_KEYS = ("score", "jump_reason", "sampler", "node", "node_id", "started_at",
                    "finished_at")

# Object stores: a put is atomic and a rename is a copy, so write the final name directly.
_PUT_IS_ATOMIC = frozenset({"s3", "gcs", "abfs"})


class RunTables(NamedTuple):
    """The three tables of a run, each with its full schema (empty when nothing was written)."""

    requests: pa.Table
    levels: pa.Table
    trials: pa.Table


# ---------------------------------------------------------------------------------------------
# Parameters


def _plain(value: Any) -> Any:
    """numpy scalars and arrays (Ray Tune and Optuna hand them out) -> plain Python values."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return value.tolist()
    raise TypeError(f"not JSON-serializable: {value!r} ({type(value).__name__})")


def params_json(params: Mapping[str, Any]) -> str:
    """Canonical JSON of the parameters: sorted keys, no spaces, finite numbers only."""
    try:
        return json.dumps(dict(params), sort_keys=True, separators=(",", ":"),
                          allow_nan=False, default=_plain)
    except (TypeError, ValueError) as e:
        raise ValueError(f"params must be JSON values with finite numbers, got {params!r}: "
                         f"{e}") from None


def _normalized(value: Any) -> Any:
    # 4 and 4.0 are the same server setting; a config's identity must not depend on which one
    # the sampler produced.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {k: _normalized(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalized(v) for v in value]
    return value


def config_key(params: Mapping[str, Any], *, readable: bool = False) -> str:
    """A stable id of a parameter set: the first 12 hex digits of the SHA-256 of its canonical
    JSON. Keys whose value is None are left out (unset == not given) and integral floats count
    as ints. With `readable=True` the values come first: "steps=4,topk=1,draft=5,mem=0.8#<hash>".
    """
    plain = json.loads(params_json(params))
    canon = {k: _normalized(v) for k, v in plain.items() if v is not None}
    digest = hashlib.sha256(params_json(canon).encode()).hexdigest()[:12]
    if not readable:
        return digest
    parts = [f"{SHORT_NAMES.get(k, k)}={json.dumps(v, separators=(',', ':'))}"
             for k, v in sorted(canon.items())]
    return f"{','.join(parts)}#{digest}"


def _param_columns(params: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, type_ in PARAM_COLUMNS.items():
        value = _plain(params[name]) if hasattr(params.get(name), "tolist") else params.get(name)
        if value is None:
            out[name] = None
        elif pa.types.is_integer(type_):
            if isinstance(value, bool) or not (
                    isinstance(value, numbers.Integral)
                    or (isinstance(value, float) and value.is_integer())):
                raise ValueError(f"params[{name!r}] must be an integer, got {value!r}")
            out[name] = int(value)
        else:
            if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                    or not math.isfinite(value):
                raise ValueError(f"params[{name!r}] must be a finite number, got {value!r}")
            out[name] = float(value)
    return out


# ---------------------------------------------------------------------------------------------
# Building tables


def _table(schema: pa.Schema, columns: Mapping[str, list[Any]]) -> pa.Table:
    """A table from columns, each converted to its schema type; never inferred."""
    if set(columns) != set(schema.names):
        # A programming error: a schema and the code that fills it drifted apart.
        raise RuntimeError(f"{schema.metadata[b'specdecode_tune.table'].decode()} columns "
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
    for name in REQUESTS_SCHEMA.names[len(_KEYS):]:
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
    for name, value in _param_columns(params).items():
        cols[name] = [value] * n
    for name in LEVELS_SCHEMA.names[len(_KEYS) + len(_PARAMS):]:
        values = [getattr(s, name) for s in summaries]
        cols[name] = [list(v) for v in values] if name == "accept_histogram" else values
    return _table(LEVELS_SCHEMA, cols)


def _timestamp(name: str, value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"extra[{name!r}] must be timezone-aware, got naive {value!r}")
        return value.astimezone(timezone.utc)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return datetime.fromtimestamp(float(value), tz=timezone.utc)
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
        **_param_columns(result.params),
        "max_total_num_tokens": facts.max_total_num_tokens,
        "max_running_requests": facts.max_running_requests,
        "gpu_ids": [str(g) for g in facts.gpu_ids],
        "boot_s": facts.boot_s,
        "wall_s": result.wall_s,
        "suspect": result.suspect,
        "n_levels": len(result.levels),
        "facts_json": json.dumps(facts.extra, sort_keys=True, default=_plain)
        if facts.extra else None,
        "score": None if score is None else float(score),
        "jump_reason": extra.get("jump_reason"),
        "sampler": extra.get("sampler"),
        # The trial writes its own row, so by default the host writing is the host that ran it.
        "node": extra["node"] if "node" in extra else socket.gethostname(),
        "node_id": extra.get("node_id"),
        "started_at": _timestamp("started_at", extra.get("started_at")),
        "finished_at": _timestamp("finished_at", extra.get("finished_at")),
    }
    return _table(TRIALS_SCHEMA, {k: [v] for k, v in row.items()})


# ---------------------------------------------------------------------------------------------
# Files


def _filesystem(run_dir: str | os.PathLike[str]) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a local path or a URI."""
    text = os.fspath(run_dir)
    if "://" in text:
        fs, path = pafs.FileSystem.from_uri(text)
    else:
        fs, path = pafs.LocalFileSystem(), os.path.abspath(text)
    return fs, path.rstrip("/") or "/"


def _check_trial_id(trial_id: str) -> None:
    if not trial_id or not isinstance(trial_id, str) or trial_id.startswith(".") \
            or any(c in trial_id for c in "/\\\0"):
        raise ValueError(f"trial_id must be a non-empty file name (no '/', '\\', leading '.'), "
                         f"got {trial_id!r}")


def level_tag(summary: LevelSummary) -> str:
    """"c<concurrency>" for a closed-loop level, "r<rate>" for an open-loop one."""
    if summary.mode == "closed":
        return f"c{summary.concurrency}"
    if summary.mode == "rate":
        if summary.rate is None:
            raise ValueError("a level with mode 'rate' must have a rate, got rate=None")
        return f"r{summary.rate:g}"
    raise ValueError(f"level mode must be 'closed' or 'rate', got {summary.mode!r}")


def _fsync(path: str, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(fs: pafs.FileSystem, path: str, table: pa.Table) -> str:
    # Serialize first: an error while encoding must not reach the filesystem at all (closing an
    # object-store stream after a failed write would publish the partial object).
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    data = sink.getvalue()
    parent, name = path.rsplit("/", 1)
    fs.create_dir(parent, recursive=True)
    if fs.type_name in _PUT_IS_ATOMIC:
        with fs.open_output_stream(path) as out:
            out.write(data)
        return path
    tmp = f"{parent}/.{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    local = isinstance(fs, pafs.LocalFileSystem)
    try:
        with fs.open_output_stream(tmp) as out:
            out.write(data)
        if local:
            _fsync(tmp)            # a measured level costs minutes of GPU: make it survive a crash
        fs.move(tmp, path)         # rename(2) locally: replaces the old file atomically
        if local:
            _fsync(parent, directory=True)
    except BaseException:
        try:
            fs.delete_file(tmp)
        except OSError:
            pass
        raise
    return path


def _table_dir(root: str, name: str) -> str:
    return f"{root}/{TABLES_DIR}/{name}"


def write_level(run_dir: str | os.PathLike[str], trial_id: str, level_summary: LevelSummary,
                records: Sequence[RequestRecord], *, params: Mapping[str, Any],
                repeat: int) -> tuple[str, str]:
    """Write one level of one trial: its requests, then its summary. Returns the two paths.

    Writing the same trial's same level again replaces both files.
    """
    _check_trial_id(trial_id)
    fs, root = _filesystem(run_dir)
    stem = f"{trial_id}-{level_tag(level_summary)}.parquet"
    req = requests_table(trial_id, records, params=params, repeat=repeat)
    lvl = levels_table(trial_id, [level_summary], params=params, repeat=repeat)
    return (_write_atomic(fs, f"{_table_dir(root, 'requests')}/{stem}", req),
            _write_atomic(fs, f"{_table_dir(root, 'levels')}/{stem}", lvl))


def write_trial(run_dir: str | os.PathLike[str], trial_result: TrialResult, *,
                extra: Mapping[str, Any] | None = None) -> str:
    """Write the trial's row (replacing an earlier one of the same trial id). Returns its path.

    `extra` may hold score, jump_reason, sampler, node (default: this host), started_at and
    finished_at (aware datetimes or epoch seconds).
    """
    _check_trial_id(trial_result.trial_id)
    fs, root = _filesystem(run_dir)
    table = trials_table(trial_result, extra=extra)
    return _write_atomic(fs, f"{_table_dir(root, 'trials')}/{trial_result.trial_id}.parquet",
                         table)


# ---------------------------------------------------------------------------------------------
# Reading

_SORT_KEYS = {
    "requests": [("trial_id", "ascending"), ("level", "ascending"), ("index", "ascending")],
    "levels": [("trial_id", "ascending"), ("mode", "ascending"), ("concurrency", "ascending"),
               ("rate", "ascending")],
    "trials": [("trial_id", "ascending")],
}


def read_table(run_dir: str | os.PathLike[str], name: str) -> pa.Table:
    """One table of the run ("requests", "levels", "trials" or "telemetry") with its full
    schema, sorted by trial id (then level, then request index or sample time). Hidden and
    temporary files are ignored."""
    if name not in SCHEMAS:
        raise ValueError(f"table must be one of {list(SCHEMAS)}, got {name!r}")
    schema = SCHEMAS[name]
    fs, root = _filesystem(run_dir)
    infos = fs.get_file_info(pafs.FileSelector(_table_dir(root, name), allow_not_found=True))
    paths = sorted(i.path for i in infos
                   if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
                   and not i.base_name.startswith((".", "_")))
    if not paths:
        return schema.empty_table()
    table = ds.dataset(paths, schema=schema, format="parquet", filesystem=fs).to_table()
    return table.sort_by(_SORT_KEYS[name])


def read_tables(run_dir: str | os.PathLike[str]) -> RunTables:
    """All three tables of the run; empty tables with the full schema where nothing is yet."""
    return RunTables(*(read_table(run_dir, name) for name in RunTables._fields))


# ---------------------------------------------------------------------------------------------
# Back to records (for the report and for resuming a trial)

_LEVEL_FIELDS = [f.name for f in dataclasses.fields(LevelSummary)]
_REQUEST_FIELDS = [f.name for f in dataclasses.fields(RequestRecord)]


def _rows(table: pa.Table, trial_id: str | None) -> Iterable[dict[str, Any]]:
    for row in table.to_pylist():
        if trial_id is None or row["trial_id"] == trial_id:
            yield row


def level_to_dict(summary: LevelSummary) -> dict[str, Any]:
    """A LevelSummary as a JSON-ready dict (for a Tune checkpoint of finished levels)."""
    out = dataclasses.asdict(summary)
    out["accept_histogram"] = list(summary.accept_histogram)
    return out


def level_from_dict(values: Mapping[str, Any]) -> LevelSummary:
    """The inverse of `level_to_dict`; also takes a levels-table row's level columns."""
    unknown = sorted(set(values) - set(_LEVEL_FIELDS))
    if unknown:
        raise ValueError(f"not LevelSummary fields: {unknown}")
    fields = dict(values)
    fields["accept_histogram"] = tuple(fields.get("accept_histogram") or ())
    return LevelSummary(**fields)


def facts_to_dict(facts: ServerFacts) -> dict[str, Any]:
    """ServerFacts as a JSON-ready dict."""
    return {"max_total_num_tokens": facts.max_total_num_tokens,
            "max_running_requests": facts.max_running_requests,
            "gpu_ids": list(facts.gpu_ids), "boot_s": facts.boot_s, "extra": dict(facts.extra)}


def facts_from_dict(values: Mapping[str, Any]) -> ServerFacts:
    """The inverse of `facts_to_dict`."""
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(ServerFacts)})
    if unknown:
        raise ValueError(f"not ServerFacts fields: {unknown}")
    fields = dict(values)
    fields["gpu_ids"] = tuple(fields.get("gpu_ids") or ())
    fields["extra"] = dict(fields.get("extra") or {})
    return ServerFacts(**fields)


def _level_from_row(row: Mapping[str, Any]) -> LevelSummary:
    return level_from_dict({name: row[name] for name in _LEVEL_FIELDS})


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
    for row in _rows(table, None):
        out.setdefault(row["trial_id"], []).append(_level_from_row(row))
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


# ---------------------------------------------------------------------------------------------
# GPU telemetry (specdecode_tune.telemetry): one row per GPU per sample of a measured level
#
#     <run_dir>/tables/telemetry/<trial_id>-<level>.parquet
#
# Written after the level's summary by the trial; a level without telemetry (no GPU, no NVML)
# writes no file. `read_table(run_dir, "telemetry")` reads it with this schema.

_FOREIGN_PROCESS = pa.struct([_f("pid", pa.int64(), False), _f("name", pa.string(), False),
                              _f("used_mib", pa.float64())])

TELEMETRY_SCHEMA = _schema([
    _f("trial_id", pa.string(), False),
    _f("level", pa.string(), False),          # level_tag(): "c<concurrency>" or "r<rate>"
    _f("gpu", pa.int64(), False),             # the GPU's index as the trial's CUDA sees it
    _f("uuid", pa.string(), False),
    _f("t_s", pa.float64(), False),           # seconds since the level's window started
    _f("dt_s", pa.float64(), False),          # seconds the sample stands for
    _f("timestamp", _TS, False),
    _f("mem_used_mib", pa.float64()),
    _f("mem_total_mib", pa.float64()),
    _f("util_gpu", pa.int64()),
    _f("util_mem", pa.int64()),
    _f("sm_clock_mhz", pa.int64()),
    _f("mem_clock_mhz", pa.int64()),
    _f("clock_events_mask", pa.int64()),
    _f("clock_events", pa.list_(pa.string()), False),
    _f("temperature_c", pa.int64()),
    _f("power_w", pa.float64()),
    _f("foreign", pa.list_(_FOREIGN_PROCESS), False),
], "telemetry")

SCHEMAS["telemetry"] = TELEMETRY_SCHEMA
_SORT_KEYS["telemetry"] = [("trial_id", "ascending"), ("level", "ascending"),
                           ("t_s", "ascending"), ("gpu", "ascending")]

_SAMPLE_COLUMNS = ("gpu", "uuid", "t_s", "dt_s", "mem_used_mib", "mem_total_mib", "util_gpu",
                   "util_mem", "sm_clock_mhz", "mem_clock_mhz", "clock_events_mask",
                   "temperature_c", "power_w")


def _check_level_tag(tag: str) -> None:
    if not isinstance(tag, str) or not tag or tag.startswith(".") \
            or any(c in tag for c in "/\\\0"):
        raise ValueError(f"level_tag must be a non-empty file name part such as 'c8' "
                         f"(see level_tag()), got {tag!r}")


def telemetry_table(trial_id: str, level_tag: str, samples: Sequence[Any]) -> pa.Table:
    """One row per GPU sample (TELEMETRY_SCHEMA). `samples` are telemetry.GpuSample values (or
    any objects with their attributes)."""
    n = len(samples)
    cols: dict[str, list[Any]] = {"trial_id": [trial_id] * n, "level": [level_tag] * n}
    for name in _SAMPLE_COLUMNS:
        cols[name] = [getattr(s, name) for s in samples]
    cols["timestamp"] = [datetime.fromtimestamp(s.wall, tz=timezone.utc) for s in samples]
    cols["clock_events"] = [list(s.clock_events) for s in samples]
    cols["foreign"] = [[{"pid": p.pid, "name": p.name, "used_mib": p.used_mib}
                        for p in s.foreign] for s in samples]
    return _table(TELEMETRY_SCHEMA, cols)


def write_telemetry(run_dir: str | os.PathLike[str], trial_id: str, level_tag: str,
                    samples: Sequence[Any]) -> str | None:
    """Write one level's GPU samples (replacing an earlier file of the same trial and level).
    Returns the path, or None when there are no samples (nothing is written)."""
    _check_trial_id(trial_id)
    _check_level_tag(level_tag)
    if not samples:
        return None
    fs, root = _filesystem(run_dir)
    table = telemetry_table(trial_id, level_tag, samples)
    return _write_atomic(fs, f"{_table_dir(root, 'telemetry')}/{trial_id}-{level_tag}.parquet",
                         table)
