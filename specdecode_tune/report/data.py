"""A run dir read back for the report: trials, configurations, the baseline and the noise band.

Everything here is computed from the run's tables (`store.read_tables`), not from the
sampler's memory, so a report of a killed or resumed search says what was measured:

- a *trial* is one server boot (a row of the trials table with its levels);
- a *configuration* groups the trials that share a `config_key` (the first measurement and its
  re-measurements); only trials with status "ok" that are not suspect count towards it;
- the *baseline* is the no-speculation server (trial id "baseline", or steps = 0);
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
import re
import statistics
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pyarrow.fs as pafs

from .. import store
from ..config import Experiment, experiment_from_dict
from ..errors import ConfigError, RunDirError
from ..objective import MIN_BAND_DOF, Robust, band_dof, noise_band, objective_score
from ..records import LevelSummary, ServerFacts
from ..space import DRAFT, MEM, STEPS, TOPK, is_baseline
from ..store.files import filesystem as _filesystem
from ..store.rundir import EXPERIMENT_FILE, experiment_file
from .words import AXIS_ORDER, describe

BASELINE_ID = "baseline"             # the search's trial id for the no-speculation run
# The search's validation trials of an emitted schedule (search/validate.py): the schedule
# server, and the same mode with one steps everywhere (the cost of the mode itself). They are
# not static configurations: kept out of `configs`, in `schedule_trials`.
SCHEDULE_ID, SAME_ID = "schedule", "schedule-same"
SCHEDULE_IDS = (SCHEDULE_ID, SAME_ID)
DEFAULT_BAND = 0.025                 # objective's default relative band, without an experiment
# The plateau sampler's reason for a jump found on one concurrency level's own score starts
# "plateau at C=<level> on <axis>: " (samplers/plateau/events.py `reason`, per-level mode under
# a schedule objective); a jump found on the score's plateau, "plateau on <axis>: ".
_LEVEL_JUMP = re.compile(r"plateau at C=(\d+) on ")


def jump_level(reason: str | None) -> int | None:
    """The concurrency level whose own plateau a jump probed (from its reason); None for a jump
    on the score's plateau, or no jump."""
    m = _LEVEL_JUMP.match(reason or "")
    return None if m is None else int(m.group(1))


@dataclass(frozen=True)
class Trial:
    """One server boot as the report sees it."""

    trial_id: str
    config_key: str
    repeat: int
    status: str
    reason: str
    params: dict[str, Any]
    levels: dict[int, LevelSummary]   # closed-loop levels by concurrency
    facts: ServerFacts
    suspect: bool                     # the trial or one of its levels is suspect
    suspect_why: str
    score: float | None               # vs the baseline; None when a weighted level is missing
    jump_reason: str | None           # set when the plateau sampler proposed it as a jump
    bracket_reason: str | None        # set when the hybrid booted it as a jump's bracket
    order: int                        # completion order among all trials, 0-based
    finished_at: datetime | None
    # Plateau questions the sampler's model answered without a boot while this trial was
    # proposed (the trials table's `plateau_answered`); () where none.
    plateau_answered: tuple[str, ...] = ()

    @property
    def baseline(self) -> bool:
        return self.trial_id == BASELINE_ID or is_baseline(self.params)

    @property
    def usable(self) -> bool:
        """Counts towards its configuration's figures (and the verdicts)."""
        return self.status == "ok" and not self.suspect and self.score is not None


@dataclass(frozen=True)
class Config:
    """One configuration: its usable trials (first measurement and re-measurements)."""

    key: str
    params: dict[str, Any]
    trials: tuple[Trial, ...]
    robust: Robust

    @property
    def n(self) -> int:
        return len(self.trials)

    @property
    def jump(self) -> bool:
        return any(t.jump_reason for t in self.trials)

    @property
    def jump_reason(self) -> str | None:
        return next((t.jump_reason for t in self.trials if t.jump_reason), None)

    @property
    def bracket_reason(self) -> str | None:
        return next((t.bracket_reason for t in self.trials if t.bracket_reason), None)

    @property
    def jump_level(self) -> int | None:
        """The level whose own plateau this config probed; None for the score's, or no jump."""
        return jump_level(self.jump_reason)

    def values(self, c: int) -> list[float]:
        return [t.levels[c].output_tok_s for t in self.trials if c in t.levels]

    def tok_s(self, c: int) -> float | None:
        """Median output tok/s at level c over the repeats."""
        v = self.values(c)
        return statistics.median(v) if v else None

    def tok_s_range(self, c: int) -> tuple[float, float] | None:
        v = self.values(c)
        return (min(v), max(v)) if v else None

    def accept(self, c: int) -> float | None:
        v = [a for t in self.trials if c in t.levels
             for a in [t.levels[c].accept_length] if a is not None]
        return statistics.median(v) if v else None

    def precision(self, c: int) -> float | None:
        """The widest relative 95% half-width of tok/s at level c over the repeats measured
        in rounds (measure.precision); None where none was."""
        v = [p for t in self.trials if c in t.levels
             for p in [t.levels[c].precision] if p is not None]
        return max(v) if v else None

    def level_s(self, c: int) -> float | None:
        """Median seconds level c took (warm-up included) over the repeats that say."""
        v = [s for t in self.trials if c in t.levels
             for s in [t.levels[c].level_s] if s is not None]
        return statistics.median(v) if v else None

    def accept_why(self, c: int) -> str | None:
        """Where no repeat has an acceptance at level c: the level's own words on it."""
        if self.accept(c) is not None:
            return None
        notes = [part.strip() for t in self.trials if c in t.levels
                 for part in t.levels[c].note.split(";") if "acceptance" in part]
        return notes[0] if notes else None

    def fact(self, name: str) -> float | None:
        v = [getattr(t.facts, name) for t in self.trials if getattr(t.facts, name) is not None]
        return statistics.median(v) if v else None

    def param(self, name: str) -> Any:
        return self.params.get(name)


@dataclass(frozen=True)
class RunData:
    """Everything the report says, read from one run dir."""

    run_dir: str
    experiment: Experiment | None
    experiment_note: str              # why there is no experiment, when there is none
    trials: tuple[Trial, ...]         # every trial, baseline included, in completion order
    baseline: Config | None
    configs: tuple[Config, ...]       # speculative configs, best robust score first
    levels: tuple[int, ...]           # measured closed-loop concurrencies, ascending
    weights: dict[int, float]
    band: float                       # noise band of scores (log units)
    band_dof: int                     # residual degrees of freedom behind it (0: the default)
    level_bands: dict[int, float]
    axes: tuple[str, ...]             # ordinal parameters that vary across configs
    shown: tuple[str, ...] = ()       # parameters a label shows (searched or varying)
    name: str = ""
    extra_notes: tuple[str, ...] = field(default=())
    schedule_trials: tuple[Trial, ...] = ()   # the validation trials, by SCHEDULE_IDS

    @property
    def model_answers(self) -> list[str]:
        """The plateau questions the model answered without a boot, in the order asked."""
        return [s for t in sorted(self.trials, key=lambda t: t.order)
                for s in t.plateau_answered]

    @property
    def booted_questions(self) -> list[tuple[str, str]]:
        """(trial id, why) of each boot a plateau question made: a jump (its reason, which
        says why the model could not answer it, or that it checks a model answer) or a
        jump's bracket; in completion order, first measurements only."""
        out = []
        for t in sorted(self.trials, key=lambda t: t.order):
            if t.repeat == 0 and (t.jump_reason or t.bracket_reason):
                out.append((t.trial_id, t.jump_reason or t.bracket_reason or ""))
        return out

    def schedule_trial(self, trial_id: str) -> Trial | None:
        """The last validation trial of that id that measured every level."""
        found = [t for t in self.schedule_trials if t.trial_id == trial_id]
        return found[-1] if found else None

    @property
    def band_measured(self) -> bool:
        return self.band_dof >= MIN_BAND_DOF

    @property
    def best(self) -> Config | None:
        return self.configs[0] if self.configs else None

    def base_tok_s(self, c: int) -> float | None:
        return self.baseline.tok_s(c) if self.baseline is not None else None

    def label(self, params: Mapping[str, Any]) -> str:
        """The settings a reader compares (searched or varying), not every fixed flag; the
        launch command has them all."""
        return describe(params, only=self.shown or None)


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


def _closed(levels: Iterable[LevelSummary]) -> dict[int, LevelSummary]:
    return {s.concurrency: s for s in levels if s.mode == "closed"}


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
        lv = _closed(levels_by.get(row["trial_id"], ()))
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

    base_rows = [r for r in raw if (r["trial_id"] == BASELINE_ID or is_baseline(r["params"]))
                 and r["status"] == "ok" and not r["suspect"] and r["levels"]]
    measured_levels = sorted({c for r in raw if r["status"] == "ok" for c in r["levels"]})
    if experiment is not None:
        weights = experiment.level_weights()
    else:
        weights = {c: 1.0 for c in (sorted({c for r in base_rows for c in r["levels"]})
                                    or measured_levels)}

    def make(r: dict[str, Any], score: float | None) -> Trial:
        fields = {k: v for k, v in r.items() if k != "table_score"}
        return Trial(score=score, **fields)

    base_trials = [make(r, 0.0) for r in base_rows]
    base_levels = _median_levels(base_trials) if base_trials else None
    trials: list[Trial] = []
    for r in raw:
        if r["trial_id"] == BASELINE_ID or is_baseline(r["params"]):
            score: float | None = 0.0 if r["status"] == "ok" else None
        elif base_levels is not None:
            kind = experiment.objective.kind if experiment is not None else "scalar"
            score = objective_score(kind, r["levels"].values(), base_levels, weights) \
                if r["status"] == "ok" else None
        else:
            score = r["table_score"]
        trials.append(make(r, score))

    baseline = None
    if base_trials:
        baseline = Config(key=base_trials[0].config_key, params=dict(base_trials[0].params),
                          trials=tuple(base_trials), robust=Robust.of([0.0] * len(base_trials)))
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
    level_bands = {}
    for c in measured_levels:
        groups_c = [[math.log(v) for v in cf.values(c) if v > 0] for cf in configs]
        level_bands[c] = noise_band(groups_c, band)

    return RunData(run_dir=run_dir, experiment=experiment, experiment_note=note,
                   trials=tuple(trials), baseline=baseline, configs=tuple(configs),
                   levels=tuple(measured_levels), weights=dict(weights), band=band,
                   band_dof=dof, level_bands=level_bands, axes=_axes(configs, experiment),
                   shown=_shown(configs, experiment),
                   name=experiment.name if experiment is not None
                   else os.path.basename(run_dir.rstrip("/")),
                   schedule_trials=tuple(t for t in trials if t.trial_id in SCHEDULE_IDS))


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
