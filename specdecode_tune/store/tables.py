"""The run's tables on disk: a Parquet file per trial (and level), written atomically, read whole.

Where each file goes is `rundir`'s; how it is written, `files.write_atomic`. A level's requests
are written before its summary, so a summary row always has its requests, and a reader never
sees half a trial's level. The reader reads with the full schemas (`schemas`), ignores hidden
and temporary files (what a killed writer leaves) and names starting with "_" (`_SUCCESS`), and
sorts each table's rows (`schemas.SORT_KEYS`), so that the order does not depend on the
filesystem's listing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..records import LevelSummary, RequestRecord, TrialResult
from . import rundir
from .files import filesystem, write_atomic
from .rows import levels_table, requests_table, telemetry_table, trials_table
from .schemas import SCHEMAS, SORT_KEYS, RunTables


def _write_table(fs: pafs.FileSystem, path: str, table: pa.Table) -> str:
    # Serialize first: an error while encoding must not reach the filesystem at all (closing an
    # object-store stream after a failed write would publish the partial object).
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return write_atomic(fs, path, sink.getvalue())


def write_level(run_dir: str | os.PathLike[str], trial_id: str, level_summary: LevelSummary,
                records: Sequence[RequestRecord], *, params: Mapping[str, Any],
                repeat: int) -> tuple[str, str]:
    """Write one level of one trial: its requests, then its summary. Returns the two paths.

    Writing the same trial's same level again replaces both files.
    """
    rundir.check_trial_id(trial_id)
    fs, root = filesystem(run_dir)
    tag = rundir.level_tag(level_summary)
    req = requests_table(trial_id, records, params=params, repeat=repeat)
    lvl = levels_table(trial_id, [level_summary], params=params, repeat=repeat)
    return (_write_table(fs, rundir.level_file(root, "requests", trial_id, tag), req),
            _write_table(fs, rundir.level_file(root, "levels", trial_id, tag), lvl))


def write_trial(run_dir: str | os.PathLike[str], trial_result: TrialResult, *,
                extra: Mapping[str, Any] | None = None) -> str:
    """Write the trial's row (replacing an earlier one of the same trial id). Returns its path.

    `extra` may hold score, jump_reason, sampler, node (default: this host), started_at and
    finished_at (aware datetimes or epoch seconds).
    """
    rundir.check_trial_id(trial_result.trial_id)
    fs, root = filesystem(run_dir)
    table = trials_table(trial_result, extra=extra)
    return _write_table(fs, rundir.trial_file(root, trial_result.trial_id), table)


def write_telemetry(run_dir: str | os.PathLike[str], trial_id: str, level_tag: str,
                    samples: Sequence[Any]) -> str | None:
    """Write one level's GPU samples (replacing an earlier file of the same trial and level).
    Returns the path, or None when there are no samples (nothing is written)."""
    rundir.check_trial_id(trial_id)
    rundir.check_level_tag(level_tag)
    if not samples:
        return None
    fs, root = filesystem(run_dir)
    table = telemetry_table(trial_id, level_tag, samples)
    return _write_table(fs, rundir.level_file(root, "telemetry", trial_id, level_tag), table)


def read_table(run_dir: str | os.PathLike[str], name: str) -> pa.Table:
    """One table of the run ("requests", "levels", "trials" or "telemetry") with its full
    schema, sorted by trial id (then level, then request index or sample time). Hidden and
    temporary files are ignored."""
    if name not in SCHEMAS:
        raise ValueError(f"table must be one of {list(SCHEMAS)}, got {name!r}")
    schema = SCHEMAS[name]
    fs, root = filesystem(run_dir)
    infos = fs.get_file_info(pafs.FileSelector(rundir.table_dir(root, name),
                                               allow_not_found=True))
    paths = sorted(i.path for i in infos
                   if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
                   and not i.base_name.startswith((".", "_")))
    if not paths:
        return schema.empty_table()
    table = ds.dataset(paths, schema=schema, format="parquet", filesystem=fs).to_table()
    return table.sort_by(SORT_KEYS[name])


def read_tables(run_dir: str | os.PathLike[str]) -> RunTables:
    """All three tables of the run; empty tables with the full schema where nothing is yet."""
    return RunTables(*(read_table(run_dir, name) for name in RunTables._fields))
