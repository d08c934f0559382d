"""The Tune Tuner of a search, and the run dir it lives in.

A new run gets its Optuna study in `optuna.journal` (readable by `optuna-dashboard`), the
baseline told to the study (`samplers.baseline_attr`: levels, weights, server facts, the KV
tokens of one request), the searcher (`RepeatingSearcher` over `SpecOptunaSearch` for a scalar
score, with the stop rule and the KV gate of `stopping`; `SpecOptunaSearch` alone for Pareto
objectives) and the trainable on its resources; a
resumed run restores all of it from Tune's experiment state, the searcher and the sampler
pickled with it. `keep_experiment` copies the experiment file into the run dir (the report and
a later resume read the settings the run started with), `move_aside` makes room for `--fresh`.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any

from ..backends import known_refusal
from ..config import Experiment
from ..errors import ConfigError
from ..objective import metric_modes
from ..records import LevelSummary
from ..samplers import BASELINE_ATTR, baseline_attr
from ..store import rundir
from ..store.files import filesystem, write_atomic
from .baseline import baseline_facts
from .preflight import RunPlan
from .progress import Progress, describe
from .sampler_factory import make_sampler
from .searcher import (
    REPEAT_KEY,
    FailureStreak,
    ProposalSpace,
    RepeatingSearcher,
    SpecOptunaSearch,
)
from .stopping import KVGate, StopRule
from .trainable import trainable

# The study's record of the settings the run was started with (sampler, seed, trial cap,
# trials at a time): a resume keeps them, whatever the command line or the experiment says now.
RUN_ATTR = "run_settings"


def run_settings(plan: RunPlan) -> dict[str, Any]:
    """The settings the run was started with (RUN_ATTR), or {} where its study has none."""
    from .summary import study_attrs

    found = study_attrs(plan).get(RUN_ATTR)
    return dict(found) if isinstance(found, dict) else {}


def storage_path(plan: RunPlan) -> str:
    """The storage Tune is given: a URI as it is, a local path made absolute."""
    return plan.storage if plan.is_uri else str(Path(plan.storage).absolute())


def experiment_path(plan: RunPlan) -> str:
    """Where Tune keeps the run: the storage and the run's name."""
    return f"{storage_path(plan).rstrip('/')}/{plan.name}"


def moved_from(plan: RunPlan, settings: dict[str, Any]) -> str | None:
    """Where a run that was moved or copied began, from the settings it was started with
    (`run_settings`; None: it is where it began, or it was started before runs recorded their
    place). A restored run goes on writing where it began: Tune puts its trials' checkpoints
    there and the searcher's Optuna journal is the one at that path (both pickled with it),
    while the tables would go here: two halves of one run. The same folder by another spelling
    (.., a symlink) is no move."""
    began = settings.get("path")
    if not began:
        return None
    norm = os.path.realpath if not plan.is_uri else str
    return None if norm(str(began)) == norm(experiment_path(plan)) else str(began)


def can_resume(plan: RunPlan) -> bool:
    """Whether the run dir holds a Tune experiment to resume."""
    from ray import tune

    return bool(tune.Tuner.can_restore(plan.run_dir))


def build_tuner(plan: RunPlan, baseline: list[LevelSummary], sampler_name: str, seed: int,
                max_trials: int, resume: bool) -> Any:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    from ray import tune

    exp = plan.exp
    s = exp.search
    # Per-level progress reports carry no score (the score needs every level); Tune would
    # otherwise reject them.
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    # Our own progress lines replace Tune's tables; Optuna's per-trial INFO lines too.
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    fn = tune.with_resources(
        tune.with_parameters(trainable, exp=exp, baseline=baseline, run_dir=plan.run_dir,
                             local_dir=str(plan.local_dir)),
        {"cpu": s.cpus_per_trial, "gpu": s.gpus_per_trial})
    exp_path = experiment_path(plan)
    if resume:
        try:
            return tune.Tuner.restore(exp_path, trainable=fn, resume_unfinished=True,
                                      resume_errored=False, restart_errored=False)
        except (ModuleNotFoundError, AttributeError) as e:
            # A searcher pickled by an older layout names modules and classes that are gone
            # (specdecode_tune.searcher, search._DefineByRunWithJump: removed 2026-12-06).
            if "specdecode_tune" not in str(e):
                raise
            raise ConfigError(
                f"--resume: {exp_path} was saved by an older specdecode_tune ({e}); it cannot "
                f"be resumed by this one: start it again with --fresh (the old run dir is "
                f"kept, renamed)") from None
    plan.local_dir.mkdir(parents=True, exist_ok=True)
    journal = JournalStorage(JournalFileBackend(str(rundir.journal_file(plan.local_dir))))
    pareto = exp.objective.kind == "pareto"
    metric: Any = list(exp.objective.metrics) if pareto else "score"
    mode: Any = metric_modes(exp.objective.metrics) if pareto else "max"
    enqueue = [dict(p) for p in s.enqueue]
    optuna_search = SpecOptunaSearch(
        space=ProposalSpace(exp.space, exp.backend.flags, sampler_name), metric=metric,
        mode=mode, sampler=make_sampler(sampler_name, exp, seed), storage=journal,
        study_name=plan.name, points_to_evaluate=enqueue or None, seed=seed)
    # What a resume keeps (the searcher holds it): said when a resume is given other values.
    optuna_search.study().set_user_attr(RUN_ATTR, {
        "sampler": sampler_name, "seed": seed, "max_trials": max_trials,
        "max_concurrent": s.max_concurrent, "path": exp_path})
    optuna_search.study().set_user_attr(BASELINE_ATTR, baseline_attr(
        levels=baseline, weights=exp.level_weights(), facts=baseline_facts(plan.run_dir),
        request_tokens=request_tokens(exp)))
    if pareto:
        optuna_search.streak = FailureStreak()    # RepeatingSearcher keeps it otherwise
        search_alg: Any = optuna_search
        num_samples = max_trials
    else:
        search_alg = RepeatingSearcher(optuna_search, max_trials=max_trials,
                                       repeats=s.repeats, remeasure_top=s.remeasure_top,
                                       default_band=s.noise_band, stop_rule=StopRule(),
                                       gate=KVGate(known=functools.partial(
                                           known_refusal, exp.backend)))
        num_samples = -1
    # reuse_actors: a finished trial's actor (its Ray worker process, on its GPUs) runs the
    # next trial of the same resources. A new actor is a new worker process that imports Tune
    # and this package before its trial starts: 3-5 s of every gap between trials on the
    # README's search (docs/search-efficiency.md). Each trial boots and stops its own server
    # either way; the actor holds only the trainable's thread.
    return tune.Tuner(
        fn,
        tune_config=tune.TuneConfig(search_alg=search_alg, num_samples=num_samples,
                                    max_concurrent_trials=s.max_concurrent, reuse_actors=True,
                                    trial_dirname_creator=trial_dirname),
        run_config=tune.RunConfig(
            name=plan.name, storage_path=storage_path(plan), verbose=0,
            callbacks=[Progress(exp, max_trials)],
            # A trial whose node is lost is retried elsewhere from its last level checkpoint;
            # expected failures never raise (they are results), so this retries only losses.
            failure_config=tune.FailureConfig(max_failures=2),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2)),
    )


def trial_dirname(trial: Any) -> str:
    """A trial's folder: its id and its point (`4a1b2c3d_steps=4_topk=1_draft=5_mem=0.92`).
    Tune's default names the folder after every config key, and the config also carries the
    sampler's bookkeeping (the model's prediction, hundreds of characters of JSON)."""
    point = describe({k: v for k, v in trial.config.items() if not k.startswith("_")})
    rep = trial.config.get(REPEAT_KEY, 0)
    name = f"{trial.trial_id}_{point.replace(' ', '_')}" + (f"_repeat{rep}" if rep else "")
    return "".join(ch if ch.isalnum() or ch in "._=-" else "-" for ch in name)[:120]


def request_tokens(exp: Experiment) -> float | None:
    """Mean KV tokens one request holds (input + output), for random and ShareGPT workloads."""
    w = exp.workload
    if w.kind == "sharegpt":
        ps = w.sharegpt_sample().prompts
        return sum(p.input_len + p.output_len for p in ps) / len(ps)
    if w.kind != "random":
        return None

    def mean(x: int | tuple[int, int]) -> float:
        return sum(x) / 2 if isinstance(x, tuple) else float(x)

    return mean(w.input_len) + mean(w.output_len)


def keep_experiment(plan: RunPlan) -> None:
    """A copy of the experiment file in the run dir: the report and a later resume read the
    settings the run was started with, even if the original file changes."""
    import pyarrow.fs as pafs

    fs, root = filesystem(plan.run_dir)
    target = rundir.experiment_file(root)
    if fs.get_file_info(target).type == pafs.FileType.NotFound:
        write_atomic(fs, target, Path(plan.exp.source).read_bytes())


def move_aside(plan: RunPlan) -> str | None:
    """`--fresh` of a local run dir: the old one renamed `<name>.old-<time>`; returns where, or
    None. (A URI's run is never moved: the pre-flight refuses `--fresh` there.)"""
    old = Path(plan.run_dir)
    if not old.exists():
        return None
    aside = old.with_name(f"{old.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
    old.rename(aside)
    return str(aside)
