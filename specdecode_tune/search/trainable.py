"""One Tune trial on its GPUs: `run_trial` with the point Tune gave it, a checkpoint after each
level, live gauges, and the final result the searcher tells Optuna.

What it reports to Tune:
- after each level (with a checkpoint of the levels done and the server's facts, so that a
  trial whose node is lost resumes at its next level elsewhere): `level`, `level_tok_s`,
  `level_accept`, `level_errors`, `levels_done`, `level_precision`, `level_s`, for the live
  lines; no score (the score needs every level, so the search turns Tune's strict metric
  check off);
- at the end: `feasible`, `status`, `reason`, `levels_done`, `repeat`, the objective (`score`,
  or one value per Pareto metric; a refused point gets `INFEASIBLE_SCORE` or each metric's
  worst value) and `MEASURED_KEY` (`samplers.measured_attr` as JSON text).

The score is the search's: computed here from the trial's result (`score_of`), and written
with the trial's row of the trials table (`trial.record_trial`), where the report reads it.
Gauges `specdecode_output_tok_s` and `specdecode_accept_length` (per trial and level) reach
Ray's metrics (Prometheus: `ray_specdecode_*`, the Grafana dashboard's panels).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from ..config import Experiment
from ..objective import metric_modes, objective_score, pareto_values
from ..records import LevelSummary, ServerFacts, TrialResult
from ..samplers import measured_attr
from ..store import rundir
from ..store.codec import read_checkpoint, write_checkpoint
from ..trial import TrialContext, record_trial, run_trial
from .ray_cluster import node_id
from .searcher import (
    BRACKET_KEY,
    INFEASIBLE_SCORE,
    JUMP_KEY,
    MEASURED_KEY,
    PLATEAU_ANSWER_KEY,
    REPEAT_KEY,
    SAMPLER_KEY,
)
from .stopping import PREDICTED_KEY


def score_of(exp: Experiment, result: TrialResult, baseline: Sequence[LevelSummary]
             ) -> tuple[bool, Any]:
    """(feasible, score or list of values) of a finished trial."""
    if result.status != "ok":
        return False, None
    if exp.objective.kind == "pareto":
        values = pareto_values(result.levels, exp.objective.metrics)
        return values is not None, values
    score = objective_score(exp.objective.kind, result.levels, baseline, exp.level_weights())
    return score is not None, score


def trainable(config: dict[str, Any], *, exp: Experiment, baseline: list[LevelSummary],
              run_dir: str, local_dir: str) -> None:
    from ray import tune
    from ray.util.metrics import Gauge

    ctx = tune.get_context()
    trial_id = ctx.get_trial_id()
    repeat = int(config.get(REPEAT_KEY, 0))
    sampled = {k: v for k, v in config.items() if not k.startswith("_")}
    done: list[LevelSummary] = []
    facts: list[ServerFacts] = []
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            done, done_facts = read_checkpoint(d)
            if done_facts is not None:
                facts.append(done_facts)
    tok_s = Gauge("specdecode_output_tok_s", "output tokens/s of a trial at a level",
                  tag_keys=("trial_id", "level"))
    accept = Gauge("specdecode_accept_length", "acceptance length of a trial at a level",
                   tag_keys=("trial_id", "level"))
    finished = list(done)

    def on_level(summary: LevelSummary, _records: Any) -> None:
        finished.append(summary)
        tags = {"trial_id": trial_id, "level": str(summary.concurrency)}
        tok_s.set(summary.output_tok_s, tags=tags)
        if summary.accept_length is not None:
            accept.set(summary.accept_length, tags=tags)
        with tempfile.TemporaryDirectory() as d:
            write_checkpoint(d, finished, facts[-1] if facts else None)
            tune.report({"level": summary.concurrency, "level_tok_s": summary.output_tok_s,
                         "level_accept": summary.accept_length,
                         "level_errors": summary.errors, "levels_done": len(finished),
                         "level_precision": summary.precision, "level_s": summary.level_s},
                        checkpoint=tune.Checkpoint.from_directory(d))

    trial_ctx = TrialContext(run_dir=run_dir, local_dir=rundir.logs_dir(local_dir),
                             trial_id=trial_id, repeat=repeat)
    started_at = time.time()
    result = run_trial(exp, sampled, trial_ctx, done_levels=done,
                       done_facts=facts[-1] if facts else None, on_facts=facts.append,
                       on_level=on_level, write_row=False)
    feasible, value = score_of(exp, result, baseline)
    # The trials table's score: the scalar score (None for Pareto objectives and failures).
    record_trial(trial_ctx, result, started_at=started_at, extra={
        "score": value if isinstance(value, float) else None,
        "jump_reason": config.get(JUMP_KEY), "bracket_reason": config.get(BRACKET_KEY),
        "sampler": config.get(SAMPLER_KEY, exp.search.sampler), "node_id": node_id(),
        "predicted": config.get(PREDICTED_KEY),
        "plateau_answered": config.get(PLATEAU_ANSWER_KEY)})
    tune.report(final_result(exp, result, feasible, value))


def final_result(exp: Experiment, result: TrialResult, feasible: bool, value: Any
                 ) -> dict[str, Any]:
    """What a finished trial reports to Tune (and the searcher tells Optuna)."""
    final: dict[str, Any] = {"feasible": feasible, "status": result.status,
                             "reason": result.reason, "levels_done": len(result.levels),
                             "repeat": result.repeat}
    if exp.objective.kind == "pareto":
        # An infeasible point gets the worst value of each metric, and a violated constraint.
        for i, (m, mode) in enumerate(zip(exp.objective.metrics,
                                          metric_modes(exp.objective.metrics))):
            final[m] = value[i] if feasible else (0.0 if mode == "max" else 1e9)
    else:
        final["score"] = value if feasible else INFEASIBLE_SCORE
    # A JSON string, so Tune does not flatten it; the searcher hands it to Optuna.
    final[MEASURED_KEY] = json.dumps(measured_attr(
        status=result.status, reason=result.reason, params=result.params, facts=result.facts,
        levels=result.levels))
    return final
