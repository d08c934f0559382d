"""The run dir's layout: every path a run writes, named in one place.

A run has two folders. The *run dir* (`<storage>/<name>`, a local path or any `pyarrow.fs` URI)
is shared by every node of the cluster; the *local dir* is this node's, for what only this
node's processes use (logs, pidfiles, Optuna's journal). For a local run dir the two are the
same folder; for a URI run dir the local dir is `<temp dir>/specdecode_tune/<name>`.

    <run dir>/
      tables/requests/<trial_id>-<level>.parquet    one row per request of the level
      tables/levels/<trial_id>-<level>.parquet      one row: the level's summary
      tables/trials/<trial_id>.parquet              one row: the trial's result
      tables/telemetry/<trial_id>-<level>.parquet   one row per GPU per sample of the level
      experiment.toml                               the experiment the search was started with
      (Ray Tune's experiment state and trial folders: Tune names them; each trial's
       checkpoints hold levels.json and facts.json, see `codec`)
    <local dir>/
      optuna.journal                                the Optuna study (optuna-dashboard reads it)
      report/                                       the report (`report_dir`)
      logs/<trial_id>.log                           a trial's server log
      logs/pids/<trial_id>.json                     a running server's process group
      logs/pids/driver.json                         the running search driver and its token

`<level>` is `level_tag(summary)`: "c<concurrency>" for a closed-loop level, "r<rate>" for an
open-loop one. One file per trial per level means a re-run of a level (a resumed trial)
replaces its rows instead of adding a duplicate. A backend may keep an engine cache under the
logs folder it is given (vLLM: `logs/vllm-cache`); that name is the backend's.

A trial is handed its logs folder (`TrialContext.local_dir`), so the functions for what lies
in it take that folder; the others take the run dir's root inside its filesystem
(`files.filesystem(run_dir)[1]`) or the local dir.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..records import LevelSummary
from .files import is_uri

TABLES_DIR = "tables"
EXPERIMENT_FILE = "experiment.toml"
CHECKPOINT_LEVELS_FILE = "levels.json"
CHECKPOINT_FACTS_FILE = "facts.json"
JOURNAL_FILE = "optuna.journal"
REPORT_DIR = "report"
LOGS_DIR = "logs"
PIDS_DIR = "pids"
DRIVER_FILE = "driver.json"
LOCAL_ROOT = "specdecode_tune"       # under the temp dir: URI runs' local dirs


# ---------------------------------------------------------------------------------------------
# Names of trials and levels in file names


def check_trial_id(trial_id: str) -> None:
    """Raise ValueError unless `trial_id` can be (the start of) a file name."""
    if not trial_id or not isinstance(trial_id, str) or trial_id.startswith(".") \
            or any(c in trial_id for c in "/\\\0"):
        raise ValueError(f"trial_id must be a non-empty file name (no '/', '\\', leading '.'), "
                         f"got {trial_id!r}")


def check_level_tag(tag: str) -> None:
    """Raise ValueError unless `tag` can be part of a file name."""
    if not isinstance(tag, str) or not tag or tag.startswith(".") \
            or any(c in tag for c in "/\\\0"):
        raise ValueError(f"level_tag must be a non-empty file name part such as 'c8' "
                         f"(see level_tag()), got {tag!r}")


def level_tag(summary: LevelSummary) -> str:
    """"c<concurrency>" for a closed-loop level, "r<rate>" for an open-loop one."""
    if summary.mode == "closed":
        return f"c{summary.concurrency}"
    if summary.mode == "rate":
        if summary.rate is None:
            raise ValueError("a level with mode 'rate' must have a rate, got rate=None")
        return f"r{summary.rate:g}"
    raise ValueError(f"level mode must be 'closed' or 'rate', got {summary.mode!r}")


# ---------------------------------------------------------------------------------------------
# The run dir (shared): paths inside its filesystem


def table_dir(root: str, table: str) -> str:
    """The folder of one table ("requests", "levels", "trials", "telemetry")."""
    return f"{root}/{TABLES_DIR}/{table}"


def level_file(root: str, table: str, trial_id: str, tag: str) -> str:
    """One trial's one level in a per-level table (requests, levels, telemetry)."""
    return f"{table_dir(root, table)}/{trial_id}-{tag}.parquet"


def trial_file(root: str, trial_id: str) -> str:
    """One trial's row of the trials table."""
    return f"{table_dir(root, 'trials')}/{trial_id}.parquet"


def experiment_file(root: str) -> str:
    """The experiment's copy, which the report and a resumed search read."""
    return f"{root}/{EXPERIMENT_FILE}"


# ---------------------------------------------------------------------------------------------
# This node's folders


def local_dir(run_dir: str | os.PathLike[str]) -> Path:
    """This node's folder of the run: the run dir itself when it is local; for a URI,
    `<temp dir>/specdecode_tune/<the URI's last part>`."""
    text = os.fspath(run_dir)
    if not is_uri(text):
        return Path(os.path.abspath(text))
    name = text.rstrip("/").rsplit("/", 1)[-1] or "run"
    return Path(tempfile.gettempdir()) / LOCAL_ROOT / name


def report_dir(run_dir: str | os.PathLike[str]) -> str:
    """Where the report of a run goes by default: a person reads it on this machine."""
    return os.path.join(local_dir(run_dir), REPORT_DIR)


def journal_file(local: str | os.PathLike[str]) -> Path:
    """The Optuna study's journal in the local dir."""
    return Path(local) / JOURNAL_FILE


def logs_dir(local: str | os.PathLike[str]) -> Path:
    """The logs folder in the local dir: what a trial is handed as its `local_dir`."""
    return Path(local) / LOGS_DIR


def server_log(logs: str | os.PathLike[str], trial_id: str) -> Path:
    """A trial's server log in the logs folder."""
    return Path(logs) / f"{trial_id}.log"


def pids_dir(logs: str | os.PathLike[str]) -> Path:
    """The pidfiles' folder in the logs folder (servers' groups and the driver's record)."""
    return Path(logs) / PIDS_DIR


def pidfile(logs: str | os.PathLike[str], trial_id: str) -> Path:
    """A trial's server's pidfile."""
    return pids_dir(logs) / f"{trial_id}.json"


def driver_file(pids: str | os.PathLike[str]) -> Path:
    """The search driver's record in the pidfiles' folder."""
    return Path(pids) / DRIVER_FILE
