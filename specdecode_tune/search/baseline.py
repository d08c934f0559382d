"""The no-speculation baseline: measured first, as a Ray task on one trial's resources, or
reused from the run dir when a resumed run already has it.

A run resumed on another machine (none of the GPUs its baseline was sampled on is there, by
NVML UUID) measures the baseline once more, in `machine-check/` beside the run's tables, and
goes on only if that machine serves it at the run's speed: the score's scale (the weighted mean
log ratio over levels) within the noise band. Otherwise it stops in one line, since trials
measured here would be ranked against trials measured there: a 40M-parameter EAGLE-3 target
on two H100 machines served every point 30-44% apart and in another order (docs/gpu-runs.md,
2026-12-07). Without GPU telemetry in the run (the simulator, no NVML) there is nothing to
compare and nothing is booted.

Every score is relative to it (score 0 in its row of the trials table), and its server facts
(KV pool, running limit) tell the samplers what the server holds. What fails it (a workload
the server refuses, a model it cannot load) would fail every trial, so a failed baseline stops
the search before any trial (`SearchStopped`; its row has the status and the reason).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..config import Experiment
from ..errors import SearchStopped
from ..objective import closed_levels, scalar_score
from ..records import LevelSummary, TrialResult
from ..space import BASELINE
from ..store import level_summaries, read_table, rundir
from ..telemetry import machine_gpu_uuids
from ..trial import TrialContext, record_trial, run_trial
from .preflight import RunPlan
from .progress import say
from .ray_cluster import node_id

BASELINE_ID = "baseline"
CHECK_DIR = "machine-check"


def run_baseline(plan: RunPlan) -> list[LevelSummary]:
    """The baseline's levels: the run's own when it has them, else measured now."""
    import ray

    found = existing_baseline(plan.run_dir)
    if found is not None:
        say(f"baseline: reusing the measured no-speculation baseline ({len(found)} levels)")
        check_machine(plan, found)
        return found
    say("baseline: measuring the server without speculation first")
    task = ray.remote(_baseline_task).options(**trial_resources(plan.exp))
    result: TrialResult = ray.get(task.remote(plan.exp, plan.run_dir, str(plan.local_dir)))
    if result.status != "ok":
        raise SearchStopped(f"the no-speculation baseline {result.status}, so the search "
                            f"stopped before any trial: {result.reason}")
    for lv in result.levels:
        say(f"  baseline C={lv.concurrency:<3d} {lv.output_tok_s:8.1f} tok/s")
    return list(result.levels)


def check_machine(plan: RunPlan, found: Sequence[LevelSummary], *,
                  gpus_here: Callable[[], list[str]] | None = None,
                  measure: Callable[[str, str], TrialResult] | None = None) -> None:
    """On a machine other than the baseline's: measure the baseline here once and stop the
    search (`SearchStopped`, one line) unless it reads as the run's within the noise band.
    `gpus_here()` (the UUIDs where a trial runs) and `measure(run_dir, local_dir)` (a baseline
    boot) are Ray tasks on one trial's resources unless given."""
    old = baseline_gpus(plan.run_dir)
    if not old:
        return                  # no GPU telemetry in the run: nothing says which machine
    import ray

    options = trial_resources(plan.exp)

    def gpus_on_trial() -> list[str]:
        return ray.get(ray.remote(machine_gpu_uuids).options(**options).remote())

    def boot_on_trial(run_dir: str, local_dir: str) -> TrialResult:
        return ray.get(ray.remote(_baseline_task).options(**options).remote(
            plan.exp, run_dir, local_dir))

    here = (gpus_here or gpus_on_trial)()
    if set(old) & set(here):
        return
    if not here:
        say(f"baseline: measured on {short_gpus(old)}; where the trials run now NVML sees "
            "no GPU, so whether this is that machine is not known: going on")
        return
    stamp = time.strftime("%Y%m%d-%H%M%S")
    say(f"baseline: this run's was measured on {short_gpus(old)}, which this machine does not "
        f"have ({short_gpus(here)}): measuring it here once, in {CHECK_DIR}/{stamp}, to see "
        "whether trials measured here compare with those measured there")
    result = (measure or boot_on_trial)(f"{str(plan.run_dir).rstrip('/')}/{CHECK_DIR}/{stamp}",
                                         str(plan.local_dir / CHECK_DIR / stamp))
    if result.status != "ok":
        raise SearchStopped(f"the no-speculation baseline on this machine {result.status}, so "
                            f"the resumed search stopped before any trial: {result.reason}")
    band = plan.exp.search.noise_band
    why = machine_verdict(found, result.levels, plan.exp.level_weights(), band,
                          short_gpus(old))
    if why is not None:
        raise SearchStopped(why)
    say(f"baseline: this machine serves it as the run's did ({ratios(found, result.levels)}, "
        f"within the noise band +-{band:.1%}): going on")


def machine_verdict(old: Sequence[LevelSummary], new: Sequence[LevelSummary],
                    weights: dict[int, float], band: float, where: str) -> str | None:
    """None where the baseline measured here (`new`) reads as the run's (`old`): the weighted
    mean log ratio over the levels, the shift it would give every score measured here, within
    the noise band; else the line that stops the search."""
    shift = scalar_score(new, old, weights)
    moved = None if shift is None else math.expm1(shift)
    if moved is not None and abs(moved) <= band:
        return None
    scale = "no level to compare" if moved is None else f"{moved:+.1%} on the score's scale"
    return (f"this machine serves the no-speculation baseline {ratios(old, new)} ({scale}) "
            f"against the machine this run began on ({where}), beyond the noise band "
            f"+-{band:.1%}: trials measured here would be ranked against trials measured "
            "there. Resume on that machine, or start over here with --fresh (the run dir is "
            "kept, moved aside)")


def ratios(old: Sequence[LevelSummary], new: Sequence[LevelSummary]) -> str:
    """'C=1 -39.0%, C=16 -39.1%': each closed level measured here against the run's."""
    before, after = closed_levels(old), closed_levels(new)
    return ", ".join(f"C={c} {after[c].output_tok_s / before[c].output_tok_s - 1:+.1%}"
                     for c in sorted(before) if c in after and before[c].output_tok_s > 0)


def short_gpus(uuids: Sequence[str]) -> str:
    return ", ".join(u[:12] for u in uuids) or "no GPU"


def baseline_gpus(run_dir: str) -> list[str]:
    """The GPUs (NVML UUIDs) the run's baseline was sampled on; [] without its telemetry."""
    table = read_table(run_dir, "telemetry").select(["trial_id", "uuid"]).to_pylist()
    return sorted({r["uuid"] for r in table if r["trial_id"] == BASELINE_ID and r["uuid"]})


def trial_resources(exp: Experiment) -> dict[str, Any]:
    """Ray task options for a boot outside Tune (the baseline, its check on another machine,
    the schedule's validation): one trial's GPUs and CPUs, no retry."""
    s = exp.search
    return {"num_gpus": s.gpus_per_trial, "num_cpus": s.cpus_per_trial, "max_retries": 0}


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
