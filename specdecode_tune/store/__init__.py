"""The run's store: where a run's files go, and its tables written and read with fixed schemas.

The trial writes each measured level and its result here; the search reads the baseline and
the trial counts back; the report reads everything. The value types it stores are
`specdecode_tune.records` (which imports nothing of the package, so the load generator, the
backends and telemetry make records without importing the store or pyarrow).

Modules, each building on the ones before it:

- `files`: filesystems from local paths or URIs (`pyarrow.fs`) and the one atomic write;
- `rundir`: the run dir's layout, every path a run writes (tables, the experiment's copy,
  logs, pidfiles, the driver's record, Optuna's journal, the report);
- `schemas`: the Arrow schemas of the requests, levels, trials and telemetry tables;
- `keys`: a parameter set's canonical JSON, `config_key` and typed columns;
- `codec`: records as JSON values and back, and a Tune trial's checkpoint folder;
- `rows`: records to Arrow tables and table rows back to records;
- `tables`: write a level / a trial / a level's telemetry, read a table with its full schema.
"""

from __future__ import annotations

from . import codec, files, rundir
from .codec import (
    facts_from_dict,
    facts_to_dict,
    level_from_dict,
    level_to_dict,
    levels_from_json,
    levels_to_json,
    read_checkpoint,
    write_checkpoint,
)
from .files import filesystem, is_uri, write_atomic, write_file, write_json
from .keys import config_key, params_json
from .rows import (
    level_summaries,
    levels_by_trial,
    levels_table,
    records_from_level_table,
    records_from_request_table,
    requests_table,
    telemetry_table,
    trial_results_from_tables,
    trials_table,
)
from .rundir import TABLES_DIR, level_tag
from .schemas import (
    LEVELS_SCHEMA,
    PARAM_COLUMNS,
    REQUESTS_SCHEMA,
    SCHEMA_VERSION,
    SCHEMAS,
    TELEMETRY_SCHEMA,
    TRIAL_EXTRA_KEYS,
    TRIALS_SCHEMA,
    RunTables,
)
from .tables import read_table, read_tables, write_level, write_telemetry, write_trial

__all__ = [
    "LEVELS_SCHEMA", "PARAM_COLUMNS", "REQUESTS_SCHEMA", "SCHEMAS", "SCHEMA_VERSION",
    "TABLES_DIR", "TELEMETRY_SCHEMA", "TRIALS_SCHEMA", "TRIAL_EXTRA_KEYS", "RunTables",
    "codec", "config_key", "facts_from_dict", "facts_to_dict", "files", "filesystem", "is_uri",
    "level_from_dict", "level_summaries", "level_tag", "level_to_dict", "levels_by_trial",
    "levels_from_json", "levels_table", "levels_to_json", "params_json", "read_checkpoint",
    "read_table", "read_tables", "records_from_level_table", "records_from_request_table",
    "requests_table", "rundir", "telemetry_table", "trial_results_from_tables",
    "trials_table", "write_atomic", "write_checkpoint", "write_file", "write_json",
    "write_level", "write_telemetry", "write_trial",
]
