"""The no-speculation baseline: measured first, as a Ray task on one trial's resources, or
reused from the run dir when a resumed run already has it.

Every score is relative to it (score 0 in its row of the trials table), and its server facts
(KV pool, running limit) tell the samplers what the server holds. What fails it (a workload
the server refuses, a model it cannot load) would fail every trial, so a failed baseline stops
the search before any trial (`SearchStopped`; its row has the status and the reason).
"""

from __future__ import annotations

import time
from typing import Any

from ..config import Experiment
from ..errors import SearchStopped
from ..records import LevelSummary, TrialResult
from ..space import BASELINE
from ..store import level_summaries, read_table, rundir
from ..trial import TrialContext, record_trial, run_trial
from .preflight import RunPlan
from .progress import say
from .ray_cluster import node_id

BASELINE_ID = "baseline"


def run_baseline(plan: RunPlan) -> list[LevelSummary]:
    """The baseline's levels: the run's own when it has them, else measured now."""
    import ray

    found = existing_baseline(plan.run_dir)
    if found is not None:
        say(f"baseline: reusing the measured no-speculation baseline ({len(found)} levels)")
        return found
    say("baseline: measuring the server without speculation first")
    s = plan.exp.search
    task = ray.remote(_baseline_task).options(num_gpus=s.gpus_per_trial,
                                               num_cpus=s.cpus_per_trial, max_retries=0)
    result: TrialResult = ray.get(task.remote(plan.exp, plan.run_dir, str(plan.local_dir)))
    if result.status != "ok":
        raise SearchStopped(f"the no-speculation baseline {result.status}, so the search "
                            f"stopped before any trial: {result.reason}")
    for lv in result.levels:
        say(f"  baseline C={lv.concurrency:<3d} {lv.output_tok_s:8.1f} tok/s")
    return list(result.levels)


def _baseline_task(exp: Experiment, run_dir: str, local_dir: str) -> TrialResult:
    ctx = TrialContext(run_dir=run_dir, local_dir=rundir.logs_dir(local_dir),
                       trial_id=BASELINE_ID)
    started_at = time.time()
    result = run_trial(exp, dict(BASELINE), ctx, write_row=False)
    record_trial(ctx, result, started_at=started_at, extra={
        "score": 0.0 if result.status == "ok" else None, "sampler": "baseline",
        "node_id": node_id()})
    return result


def baseline_facts(run_dir: str) -> dict[str, Any] | None:
    """The baseline trial's row (it holds max_total_num_tokens and max_running_requests)."""
    rows = [r for r in read_table(run_dir, "trials").to_pylist()
            if r["trial_id"] == BASELINE_ID and r["status"] == "ok"]
    return rows[-1] if rows else None


def existing_baseline(run_dir: str) -> list[LevelSummary] | None:
    if baseline_facts(run_dir) is None:
        return None
    levels = read_table(run_dir, "levels")
    mine = [s for tid, s in level_summaries(levels) if tid == BASELINE_ID]
    return mine or None
