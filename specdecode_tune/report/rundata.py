"""What the report knows of a run: its trials, its configurations and the run as a whole.

- a *trial* is one server boot (a row of the trials table with its levels);
- a *configuration* groups the trials that share a `config_key` (the first measurement and its
  re-measurements); only trials with status "ok" that are not suspect count towards it;
- the *baseline* is the no-speculation server (trial id "baseline", or steps = 0);
- `RunData` is everything the report says, read from one run dir.

Values only: `data.read_run` makes them from the run's tables; every other module of the report
reads them.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..config import Experiment
from ..objective import MIN_BAND_DOF, Robust
from ..records import LevelSummary, ServerFacts
from ..space import is_baseline
from .words import describe

BASELINE_ID = "baseline"             # the search's trial id for the no-speculation run
# The search's validation trials of an emitted schedule (search/validate.py): the schedule
# server, and the same mode with one steps everywhere (the cost of the mode itself). They are
# not static configurations: kept out of `configs`, in `schedule_trials`.
SCHEDULE_ID, SAME_ID = "schedule", "schedule-same"
SCHEDULE_IDS = (SCHEDULE_ID, SAME_ID)
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
    def suspect_brief(self) -> str:
        """Each suspect level's first clause only ("C=16: ...; C=64: ..."), the suspect check's
        words (a level's note goes on with its rounds and warm-up, which the trials table
        keeps), for one-line mentions; `suspect_why` where no level is suspect."""
        return "; ".join(f"C={c}: {s.note.split('; ', 1)[0] or 'flagged'}"
                         for c, s in sorted(self.levels.items()) if s.suspect) or self.suspect_why

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
