"""A run dir read back for the report: trials, configurations, the baseline and the noise band.

`read_run` makes the values of `rundata.py` (`Trial`, `Config`, `RunData`: what a trial, a
configuration and the baseline are is said there). Everything here is computed from the run's
tables (`store.read_tables`), not from the sampler's memory, so a report of a killed or resumed
search says what was measured:

- scores are recomputed from the levels against the baseline with `objective.scalar_score`
  (the experiment's weights), so a report never depends on how the search scored; a run
  without a baseline falls back to the scores in the trials table;
- the noise band is `objective.noise_band` over the configurations measured more than once,
  with the experiment's `search.noise_band` as the default; each concurrency level gets its
  own band from the repeats' log tok/s at that level (the score's band when too few).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import tomllib
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import pyarrow.fs as pafs

from .. import store
from ..config import Experiment, experiment_from_dict
from ..errors import ConfigError, RunDirError
from ..objective import Robust, band_dof, closed_levels, noise_band, objective_score
from ..records import LevelSummary, ServerFacts
from ..space import DRAFT, MEM, STEPS, TOPK, is_baseline
from ..store.files import filesystem as _filesystem
from ..store.rundir import EXPERIMENT_FILE, experiment_file
from .rundata import BASELINE_ID, SCHEDULE_IDS, Config, RunData, Trial
from .words import AXIS_ORDER

DEFAULT_BAND = 0.025                 # objective's default relative band, without an experiment


# ---------------------------------------------------------------------------------------------
# Reading


def check_run_dir(run_dir: str) -> None:
    """Raise RunDirError unless `run_dir` exists and is a directory."""
    try:
        fs, path = _filesystem(run_dir)
        info = fs.get_file_info(path)
    except (OSError, ValueError) as e:
        raise RunDirError(f"{run_dir}: cannot open the run dir ({str(e).splitlines()[0]})") \
            from None
    if info.type == pafs.FileType.NotFound:
        raise RunDirError(f"{run_dir}: no such run dir")
    if info.type != pafs.FileType.Directory:
        raise RunDirError(f"{run_dir}: not a directory")


def load_experiment_from_run(run_dir: str) -> tuple[Experiment | None, str]:
    """The experiment the search copied into the run dir, or (None, why not)."""
    fs, root = _filesystem(run_dir)
    path = experiment_file(root)
    try:
        with fs.open_input_stream(path) as f:
            raw = f.read()
    except (FileNotFoundError, OSError):
        return None, f"no {EXPERIMENT_FILE} in the run dir"
    try:
        data = tomllib.loads(raw.decode("utf-8"))
        # The report never reads the workload, and a relative JSONL path in the copy would not
        # resolve from the run dir: leave it out rather than lose the launch command over it.
        data.pop("workload", None)
        return experiment_from_dict(data, where=path), ""
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, ConfigError) as e:
        return None, f"{EXPERIMENT_FILE} in the run dir could not be loaded ({e})"


def _median_levels(trials: Sequence[Trial]) -> list[LevelSummary]:
    """Per-level summaries with the median tok/s over `trials` (the baseline's repeats)."""
    out = []
    by_c: dict[int, list[LevelSummary]] = {}
    for t in trials:
        for c, s in t.levels.items():
            by_c.setdefault(c, []).append(s)
    for _, ss in sorted(by_c.items()):
        good = [s.slo_good for s in ss if s.slo_good is not None]
        out.append(dataclasses.replace(ss[0], output_tok_s=statistics.median(
            s.output_tok_s for s in ss), slo_good=round(statistics.median(good)) if good
            else None))
    return out


def _suspect_why(trial_suspect: bool, levels: Mapping[int, LevelSummary]) -> str:
    parts = [f"C={c}: {s.note or 'flagged'}" for c, s in sorted(levels.items()) if s.suspect]
    if trial_suspect and not parts:
        parts.append("flagged by the trial (telemetry or errors)")
    return "; ".join(parts)


def read_run(run_dir: str, experiment: Experiment | None = None) -> RunData:
    """Read and summarise a run dir; RunDirError when there is nothing to report on."""
    check_run_dir(run_dir)
    note = ""
    if experiment is None:
        experiment, note = load_experiment_from_run(run_dir)
    raw = _raw_trials(run_dir)
    base_rows = [r for r in raw if _is_base(r) and r["status"] == "ok" and not r["suspect"]
                 and r["levels"]]
    measured_levels = sorted({c for r in raw if r["status"] == "ok" for c in r["levels"]})
    weights = _weights(experiment, base_rows, measured_levels)
    base_trials = [_trial(r, 0.0) for r in base_rows]
    trials = _scored(raw, base_trials, experiment, weights)
    configs, band, dof = _configs(trials, experiment)
    return RunData(run_dir=run_dir, experiment=experiment, experiment_note=note,
                   trials=tuple(trials), baseline=_baseline(base_trials),
                   configs=tuple(configs), levels=tuple(measured_levels),
                   weights=dict(weights), band=band, band_dof=dof,
                   level_bands=_level_bands(configs, measured_levels, band),
                   axes=_axes(configs, experiment), shown=_shown(configs, experiment),
                   name=experiment.name if experiment is not None
                   else os.path.basename(run_dir.rstrip("/")),
                   schedule_trials=tuple(t for t in trials if t.trial_id in SCHEDULE_IDS))


def _raw_trials(run_dir: str) -> list[dict[str, Any]]:
    """Each row of the trials table with its closed-loop levels, as `Trial`'s fields (and the
    table's score), in completion order; RunDirError where the table is empty."""
    tables = store.read_tables(run_dir)
    if tables.trials.num_rows == 0:
        raise RunDirError(f"{run_dir}: no trials recorded (tables/trials is empty)")
    levels_by = store.levels_by_trial(tables.levels)
    rows = tables.trials.to_pylist()
    # Completion order: finished_at where the search recorded it, else the table's order.
    rows = sorted(enumerate(rows), key=lambda ir: (
        ir[1]["finished_at"] is None, ir[1]["finished_at"] or datetime.min, ir[0]))
    raw: list[dict[str, Any]] = []
    for order, (_, row) in enumerate(rows):
        lv = closed_levels(levels_by.get(row["trial_id"], ()))
        facts = ServerFacts(max_total_num_tokens=row["max_total_num_tokens"],
                            max_running_requests=row["max_running_requests"],
                            gpu_ids=tuple(row["gpu_ids"]), boot_s=row["boot_s"],
                            extra=json.loads(row["facts_json"]) if row["facts_json"] else {})
        suspect = bool(row["suspect"]) or any(s.suspect for s in lv.values())
        raw.append({"trial_id": row["trial_id"], "config_key": row["config_key"],
                    "repeat": row["repeat"], "status": row["status"], "reason": row["reason"],
                    "params": json.loads(row["params_json"]), "levels": lv, "facts": facts,
                    "suspect": suspect,
                    "suspect_why": _suspect_why(bool(row["suspect"]), lv) if suspect else "",
                    "table_score": row["score"], "jump_reason": row["jump_reason"] or None,
                    "bracket_reason": row.get("bracket_reason") or None,
                    "plateau_answered": _answered(row.get("plateau_answered")),
                    "order": order, "finished_at": row["finished_at"]})
    return raw


def _is_base(r: dict[str, Any]) -> bool:
    """A raw trial of the no-speculation baseline (`Trial.baseline`)."""
    return r["trial_id"] == BASELINE_ID or is_baseline(r["params"])


def _trial(r: dict[str, Any], score: float | None) -> Trial:
    fields = {k: v for k, v in r.items() if k != "table_score"}
    return Trial(score=score, **fields)


def _weights(experiment: Experiment | None, base_rows: Sequence[dict[str, Any]],
             measured_levels: Sequence[int]) -> dict[int, float]:
    """The experiment's level weights; without one, every level the baseline measured (else
    every level measured) weighs 1."""
    if experiment is not None:
        return experiment.level_weights()
    return {c: 1.0 for c in (sorted({c for r in base_rows for c in r["levels"]})
                             or measured_levels)}


def _scored(raw: Sequence[dict[str, Any]], base_trials: Sequence[Trial],
            experiment: Experiment | None, weights: Mapping[int, float]) -> list[Trial]:
    """Every trial with its score against the baseline's median levels (the baseline's own is
    0); without a baseline, the score the trials table recorded."""
    base_levels = _median_levels(base_trials) if base_trials else None
    trials: list[Trial] = []
    for r in raw:
        if _is_base(r):
            score: float | None = 0.0 if r["status"] == "ok" else None
        elif base_levels is not None:
            kind = experiment.objective.kind if experiment is not None else "scalar"
            score = objective_score(kind, r["levels"].values(), base_levels, weights) \
                if r["status"] == "ok" else None
        else:
            score = r["table_score"]
        trials.append(_trial(r, score))
    return trials


def _baseline(base_trials: Sequence[Trial]) -> Config | None:
    if not base_trials:
        return None
    return Config(key=base_trials[0].config_key, params=dict(base_trials[0].params),
                  trials=tuple(base_trials), robust=Robust.of([0.0] * len(base_trials)))


def _configs(trials: Sequence[Trial], experiment: Experiment | None
             ) -> tuple[list[Config], float, int]:
    """(the speculative configurations, best first; the noise band of scores; its residual
    degrees of freedom) from the usable trials, the schedule's validation trials left out."""
    groups: dict[str, list[Trial]] = {}
    for t in trials:
        if t.usable and not t.baseline and t.trial_id not in SCHEDULE_IDS:
            groups.setdefault(t.config_key, []).append(t)
    default = experiment.search.noise_band if experiment is not None else DEFAULT_BAND
    score_groups = {k: [t.score for t in ts if t.score is not None] for k, ts in groups.items()}
    band = noise_band(score_groups.values(), default)
    dof = band_dof(score_groups.values())
    # Spreads shrink towards the band, as the searcher ranks (objective.Robust).
    configs = [Config(key=k, params=dict(ts[0].params), trials=tuple(ts),
                      robust=Robust.of(score_groups[k], band))
               for k, ts in groups.items()]
    # Best first; ties go to fewer steps (cheaper drafting), then the earlier measurement.
    configs.sort(key=lambda cf: (-cf.robust.score, -cf.robust.median,
                                 _num(cf.param(STEPS)), cf.trials[0].order))
    return configs, band, dof


def _level_bands(configs: Sequence[Config], levels: Sequence[int], band: float
                 ) -> dict[int, float]:
    """Each level's noise band from the repeats' log tok/s there (`band` when too few)."""
    level_bands = {}
    for c in levels:
        groups_c = [[math.log(v) for v in cf.values(c) if v > 0] for cf in configs]
        level_bands[c] = noise_band(groups_c, band)
    return level_bands


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else math.inf


def _axes(configs: Sequence[Config], experiment: Experiment | None) -> tuple[str, ...]:
    """Ordinal parameters that take more than one value among the configurations."""
    names: list[str] = []
    if experiment is not None:
        names = [p.name for p in experiment.space if p.ordinal]
        # Fixed flags never vary; derived draft tokens are added below when they do.
    for cf in configs:
        for k, v in cf.params.items():
            if k not in names and isinstance(v, (int, float)) and not isinstance(v, bool):
                names.append(k)
    varying = [n for n in names
               if len({_num(cf.param(n)) for cf in configs if cf.param(n) is not None}) > 1]
    # With topk = 1 the server sets draft tokens = steps + 1: for chains that axis is the steps
    # axis again, so it is an axis of its own only where trees (topk > 1) took two values.
    trees = {_num(cf.param(DRAFT)) for cf in configs if (cf.param(TOPK) or 1) > 1}
    if DRAFT in varying and len(trees) < 2:
        varying.remove(DRAFT)
    order = {n: i for i, n in enumerate(AXIS_ORDER)}
    return tuple(sorted(varying, key=lambda n: (order.get(n, len(order)), names.index(n))))


def _shown(configs: Sequence[Config], experiment: Experiment | None) -> tuple[str, ...]:
    names = [STEPS, TOPK, DRAFT]
    if experiment is not None:
        names += [p.name for p in experiment.space if p.name not in names]
    else:
        names.append(MEM)
    for cf in configs:
        for k in cf.params:
            if k not in names and len({json.dumps(c.params.get(k)) for c in configs}) > 1:
                names.append(k)
    return tuple(names)


def _answered(raw: Any) -> tuple[str, ...]:
    """The `plateau_answered` column's JSON list of sentences; () where null or unreadable."""
    if not raw:
        return ()
    try:
        got = json.loads(raw)
    except (TypeError, ValueError):
        return ()
    return tuple(str(s) for s in got) if isinstance(got, list) else ()
