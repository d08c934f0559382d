"""The no-speculation baseline: measured first, as a Ray task on one trial's resources, or
reused from the run dir when a resumed run already has it.

Every score is relative to it (score 0 in its row of the trials table), and its server facts
(KV pool, running limit) tell the samplers what the server holds. What fails it (a workload
the server refuses, a model it cannot load) would fail every trial, so a failed baseline stops
the search (`SearchStopped`; its row has the status and the reason).

`start_baseline` does not wait for it (`PendingBaseline`): the search's first trial (the
experiment's enqueued point, or the model's anchor; neither needs the baseline to be proposed)
boots on the other GPUs while the baseline measures, and waits for it only to compute its
score. With two trials' GPUs the baseline and the first trial used to run one after the other,
each alone on the cluster: on sim-default about 60 s of baseline, then the Tune start-up, then
the first trial, before the first pair of trials ran together (docs/search-efficiency.md).
Until it is known, the searcher starts no second trial (`RepeatingSearcher`), so the cluster
runs exactly the two it ran before, together.
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
    """The baseline's levels: the run's own when it has them, else measured now (waiting)."""
    found = start_baseline(plan)
    if not isinstance(found, PendingBaseline):
        return found
    levels = found.levels()
    say_baseline(levels)
    return levels


def start_baseline(plan: RunPlan) -> list[LevelSummary] | PendingBaseline:
    """The run's own baseline levels when it has them; else the baseline's Ray task, started
    and not waited for."""
    import ray

    found = existing_baseline(plan.run_dir)
    if found is not None:
        say(f"baseline: reusing the measured no-speculation baseline ({len(found)} levels)")
        return found
    say("baseline: measuring the server without speculation (the first trial boots beside it)")
    s = plan.exp.search
    task = ray.remote(_baseline_task).options(num_gpus=s.gpus_per_trial,
                                               num_cpus=s.cpus_per_trial, max_retries=0)
    return PendingBaseline(task.remote(plan.exp, plan.run_dir, str(plan.local_dir)))


class PendingBaseline:
    """The baseline's Ray task while it runs: what the trainable waits on for its score and
    the searcher polls before it starts a second trial. Pickles (the object ref does, within
    its Ray cluster; a driver that restarts reuses the baseline's row instead)."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref
        self.told: dict[str, Any] = {}    # what the study's baseline attr needs besides levels

    def bind(self, *, weights: dict[int, float], request_tokens: float | None,
             run_dir: str) -> PendingBaseline:
        """What `attr` needs besides the levels: the objective's weights, a request's tokens
        and the run dir (whose baseline row holds the server's facts)."""
        self.told = {"weights": weights, "request_tokens": request_tokens, "run_dir": run_dir}
        return self

    def attr(self) -> dict[str, Any]:
        """The study's baseline attr (`samplers.baseline_attr`), once the baseline is known;
        `SearchStopped` where it failed. Says the levels, as `run_baseline` did."""
        from ..samplers import baseline_attr

        levels = self.levels()
        say_baseline(levels)
        return baseline_attr(levels=levels, weights=self.told["weights"],
                             facts=baseline_facts(self.told["run_dir"]),
                             request_tokens=self.told["request_tokens"])

    def ready(self) -> bool:
        import ray

        done, _ = ray.wait([self.ref], timeout=0)
        return bool(done)

    def result(self) -> TrialResult:
        import ray

        return ray.get(self.ref)

    def levels(self) -> list[LevelSummary]:
        """The baseline's levels (waiting for them); `SearchStopped` where it failed."""
        result = self.result()
        if result.status != "ok":
            raise SearchStopped(f"the no-speculation baseline {result.status}, so the search "
                                f"stopped: {result.reason}")
        return list(result.levels)


def say_baseline(levels: list[LevelSummary]) -> None:
    for lv in levels:
        say(f"  baseline C={lv.concurrency:<3d} {lv.output_tok_s:8.1f} tok/s")


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
