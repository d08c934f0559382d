"""The schedule's validation trial: after the search, boot the emitted schedule once.

With `[objective] kind = "schedule"` the search ends by reading its own run as the report does
(`report.recommend.schedule`), writing the schedule file its backend boots from into the run dir
(`Backend.schedule_file`; SGLang's: `schedule/sglang-adaptive-config.json`) and booting that
server through the project's own trial, every level measured: trial id "schedule", sampler
"schedule", a row of the trials table with its levels. Where the static best is a chain it also
boots the mode with the static config's steps in one slot ("schedule-same"): the cost of the
mode itself against the plain static server. Both run as Ray tasks on a trial's resources, as
the baseline does. The report (`report/validation.py`) sets them against the static and
per-level configs.

What cannot boot a schedule is said in one line and costs no boot: a backend whose engine does
not boot one from a file (SGLang's adaptive mode and the simulator's copy of it do, and vLLM's
`num_speculative_tokens_per_batch_size`, with piecewise CUDA graphs; llama.cpp has none), an
SGLang release without the per-batch-size format (the backend's `schedule_params` says which,
and which release has it), no level best with speculation.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from ..backends import Backend, ScheduleAsk, get_backend, schedule_refusal
from ..config import BackendConfig, Experiment
from ..objective import scalar_score
from ..records import TrialResult
from ..space import DRAFT, STEPS, TOPK
from ..store import rundir
from ..trial import TrialContext, record_trial, run_trial
from .preflight import RunPlan
from .progress import say
from .ray_cluster import node_id

SCHEDULE_ID = "schedule"
SAME_ID = "schedule-same"
SCHEDULE_DIR = "schedule"


def schedule_trial_params(backend: Backend, cfg: BackendConfig, base: dict[str, Any],
                          first: int, config_path: str) -> dict[str, Any]:
    """The server's settings for a schedule file: a chain whose steps are a candidate, with
    the backend's settings for its per-batch-size mode (`Backend.schedule_params`)."""
    chain = {k: v for k, v in base.items() if k not in (STEPS, TOPK, DRAFT)}
    settings, why = backend.schedule_params(
        cfg, {**chain, STEPS: first, TOPK: 1, DRAFT: first + 1}, config_path)
    if settings is None:
        raise ValueError(why)       # plan_validation asked the backend first
    return settings


def plan_validation(plan: RunPlan) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    """([(trial id, params)], '') for the validation trials, or ([], why there are none).
    Writes the adaptive-config files they read."""
    from ..report import recommend
    from ..report.data import read_run

    exp = plan.exp
    backend = get_backend(exp.backend.kind)
    # Whether this engine and release boot a schedule file at all: asked before the run is read.
    why = schedule_refusal(exp.backend)
    if why:
        return [], f"schedule validation: not booted. {why}"
    data = read_run(plan.run_dir, exp)
    sched = recommend.schedule(data)
    if sched.withheld:
        return [], f"schedule validation: not booted. {sched.withheld}"
    uniform = recommend.uniform_steps(data.best, sched.chain)
    if uniform:
        # Its boot and the same-steps one would be one server twice, measuring only the
        # per-batch-size mode's own cost of a schedule nobody would run (the report writes
        # no file for it).
        return [], (f"schedule validation: not booted. The schedule runs the static config's "
                    f"steps ({uniform}) at every level: nothing to switch")
    mine = backend.schedule_file(exp.backend, sched.ask) if sched.ask is not None else None
    if mine is None or mine.content is None or sched.params is None:
        return [], "schedule validation: no schedule to boot (no level is best with speculation)"
    folder = os.path.join(str(plan.local_dir), SCHEDULE_DIR)
    os.makedirs(folder, exist_ok=True)
    path = _write(folder, mine.file_name, mine.content)
    first = int(sched.params[STEPS])
    trials = [(SCHEDULE_ID, schedule_trial_params(backend, exp.backend, sched.params, first, path))]
    best = data.best
    steps = int(best.param(STEPS) or 0) if best is not None else 0
    if best is not None and best.param(TOPK) in (None, 1) and steps > 0:
        same_steps = backend.schedule_file(exp.backend, ScheduleAsk(slots=((1, steps),)))
        if same_steps is None or same_steps.content is None:
            return trials, ""
        stem, ext = os.path.splitext(same_steps.file_name)
        same = _write(folder, f"{stem}-same-steps{ext}", same_steps.content)
        trials.append((SAME_ID, schedule_trial_params(backend, exp.backend, best.params, steps,
                                                      same)))
    return trials, ""


def _write(folder: str, name: str, content: dict[str, Any]) -> str:
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(content, f)
    return path


def run_validation(plan: RunPlan) -> list[TrialResult]:
    """Boot the validation trials (in parallel where the cluster has room); [] with one line
    said where there is nothing to boot."""
    import ray

    from ..store import read_table
    from .baseline import existing_baseline, trial_resources

    done = {r["trial_id"] for r in read_table(plan.run_dir, "trials").to_pylist()
            if r["trial_id"] in (SCHEDULE_ID, SAME_ID)}
    if SCHEDULE_ID in done:
        say("schedule validation: the run already holds its validation trial")
        return []
    trials, why = plan_validation(plan)
    if not trials:
        say(why)
        return []
    task = ray.remote(_validation_task).options(**trial_resources(plan.exp))
    say("schedule validation: booting the emitted schedule once"
        + (" and the mode with the static steps everywhere (its own cost)"
           if len(trials) > 1 else ""))
    base = existing_baseline(plan.run_dir) or []
    results: list[TrialResult] = ray.get([
        task.remote(plan.exp, plan.run_dir, str(plan.local_dir), tid, params, base)
        for tid, params in trials])
    for r in results:
        levels = ", ".join(f"C={lv.concurrency} {lv.output_tok_s:.1f}" for lv in r.levels)
        say(f"  {r.trial_id}: {r.status}{(': ' + r.reason) if r.reason else ''}"
            + (f" ({levels} tok/s)" if levels else ""))
    return results


def _validation_task(exp: Experiment, run_dir: str, local_dir: str, trial_id: str,
                     params: dict[str, Any], baseline: list[Any]) -> TrialResult:
    ctx = TrialContext(run_dir=run_dir, local_dir=rundir.logs_dir(local_dir), trial_id=trial_id)
    started_at = time.time()
    result = run_trial(exp, params, ctx, write_row=False)
    score = scalar_score(result.levels, baseline, exp.level_weights()) \
        if result.status == "ok" and baseline else None
    record_trial(ctx, result, started_at=started_at, extra={
        "score": score if score is not None and math.isfinite(score) else None,
        "sampler": "schedule", "node_id": node_id()})
    return result


__all__ = ["SAME_ID", "SCHEDULE_ID", "plan_validation", "run_validation", "schedule_trial_params"]
