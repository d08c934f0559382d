"""The run's tables, under their older name: a facade of `specdecode_tune.store`.

`from specdecode_tune import results` keeps working for the tests, benchmarks and scripts
that use it (`results.read_tables`, `results.write_level`, `results.write_trial`,
`results.level_summaries`, ...). New code imports `specdecode_tune.store`, where the layout
(`store.rundir`), the schemas (`store.schemas`) and the writers and readers (`store.tables`,
`store.rows`, `store.codec`) live.
"""

from __future__ import annotations

from .store import (LEVELS_SCHEMA, PARAM_COLUMNS, REQUESTS_SCHEMA, SCHEMA_VERSION, SCHEMAS,
                    TABLES_DIR, TELEMETRY_SCHEMA, TRIAL_EXTRA_KEYS, TRIALS_SCHEMA, RunTables,
                    config_key, facts_from_dict, facts_to_dict, level_from_dict,
                    level_summaries, level_tag, level_to_dict, levels_by_trial, levels_table,
                    params_json, read_table, read_tables, records_from_level_table,
                    records_from_request_table, requests_table, telemetry_table,
                    trial_results_from_tables, trials_table, write_level, write_telemetry,
                    write_trial)

__all__ = [
    "LEVELS_SCHEMA", "PARAM_COLUMNS", "REQUESTS_SCHEMA", "SCHEMAS", "SCHEMA_VERSION",
    "TABLES_DIR", "TELEMETRY_SCHEMA", "TRIALS_SCHEMA", "TRIAL_EXTRA_KEYS", "RunTables",
    "config_key", "facts_from_dict", "facts_to_dict", "level_from_dict", "level_summaries",
    "level_tag", "level_to_dict", "levels_by_trial", "levels_table", "params_json",
    "read_table", "read_tables", "records_from_level_table", "records_from_request_table",
    "requests_table", "telemetry_table", "trial_results_from_tables", "trials_table",
    "write_level", "write_telemetry", "write_trial",
]
