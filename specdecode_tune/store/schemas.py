"""The Arrow schemas of the run's four tables: requests, levels, trials, telemetry.

Every table has a schema constant here; rows are built column by column against it (`rows`)
and nothing is ever inferred from Python values. The reader reads with the same schemas
(`tables`), because a Parquet dataset read without one takes the first file's schema and drops
columns only later files have. Each schema's metadata names its table and `SCHEMA_VERSION`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import pyarrow as pa

SCHEMA_VERSION = "1"

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


def table_name(schema: pa.Schema) -> str:
    """The table a schema is for (its metadata)."""
    return str(schema.metadata[b"specdecode_tune.table"].decode())


KEY_FIELDS = [_f("trial_id", pa.string(), False), _f("config_key", pa.string(), False),
              _f("repeat", pa.int64(), False)]
PARAM_FIELDS = [_f("params_json", pa.string(), False)] + [_f(n, t)
                                                         for n, t in PARAM_COLUMNS.items()]

REQUESTS_SCHEMA = _schema(KEY_FIELDS + [
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
    _f("prompt_id", pa.string()),
], "requests")

_PERCENTILES = [f"{m}_{p}" for m in ("ttft", "tpot", "itl", "e2e") for p in ("p50", "p90", "p99")]

LEVELS_SCHEMA = _schema(KEY_FIELDS + PARAM_FIELDS + [
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
    # Added later, nullable like error_detail: files written before read back with nulls.
    _f("saturated", pa.bool_()),
    _f("slo_good", pa.int64()),
    _f("slo_total", pa.int64()),
    _f("rounds", pa.int64()),
    _f("precision", pa.float64()),
    _f("accept_precision", pa.float64()),
    _f("level_s", pa.float64()),
], "levels")

TRIALS_SCHEMA = _schema(KEY_FIELDS + [
    _f("status", pa.string(), False),
    _f("reason", pa.string(), False),
] + PARAM_FIELDS + [
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
    _f("bracket_reason", pa.string()),    # set when the hybrid booted a jump's bracket
    _f("sampler", pa.string()),
    _f("node", pa.string()),              # host name where the trial ran
    _f("node_id", pa.string()),           # Ray node id (tells raylets on one host apart)
    _f("started_at", _TS),
    _f("finished_at", _TS),
    # The sampler's model's prediction before the boot (JSON: tok_s per level, accept_length,
    # score, p_feasible, fit_error); null where the sampler has no model or no fit yet.
    _f("predicted", pa.string()),
    # Plateau questions the sampler's model answered without a boot while this trial was
    # proposed (JSON list of verdict sentences); null where none.
    _f("plateau_answered", pa.string()),
], "trials")

# GPU telemetry (specdecode_tune.telemetry): one row per GPU per sample of a measured level,
# written after the level's summary by the trial; a level without telemetry (no GPU, no NVML)
# writes no file.
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

SCHEMAS: dict[str, pa.Schema] = {
    "requests": REQUESTS_SCHEMA, "levels": LEVELS_SCHEMA, "trials": TRIALS_SCHEMA,
    "telemetry": TELEMETRY_SCHEMA}



class RunTables(NamedTuple):
    """The three tables of a run, each with its full schema (empty when nothing was written)."""

    requests: pa.Table
    levels: pa.Table
    trials: pa.Table


# The order `read_table` gives each table's rows in.
SORT_KEYS: dict[str, list[tuple[str, str]]] = {
    "requests": [("trial_id", "ascending"), ("level", "ascending"), ("index", "ascending")],
    "levels": [("trial_id", "ascending"), ("mode", "ascending"), ("concurrency", "ascending"),
               ("rate", "ascending")],
    "trials": [("trial_id", "ascending")],
    "telemetry": [("trial_id", "ascending"), ("level", "ascending"), ("t_s", "ascending"),
                  ("gpu", "ascending")],
}

# Keys `write_trial(extra=...)` accepts: what the search knows and the trial result does not.
TRIAL_EXTRA_KEYS = ("score", "jump_reason", "bracket_reason", "sampler", "node", "node_id",
                    "started_at", "finished_at", "predicted", "plateau_answered")
