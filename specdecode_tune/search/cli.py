"""`python -m specdecode_tune.search`: find the best speculative-decoding settings.

With no arguments it runs `experiments/sim-default.toml` on the embedded simulator: a local Ray
cluster with logical GPUs, trials on GPU pairs, Optuna (the hybrid sampler) proposing
points, the no-speculation baseline first, re-measurement of the best points, live progress,
and at the end the best config against the baseline with the plateau verdicts.

A run dir (`<storage>/<name>`) holds Tune's experiment state and searcher (Optuna study and
sampler pickled with it), `optuna.journal` (readable by `optuna-dashboard`), `tables/`
(Arrow/Parquet: requests, levels, trials), `logs/` (a server log per trial) and `logs/pids/`
(the servers' process groups, so that a resumed run ends orphans of a killed one); the whole
layout is `store.rundir`'s.

Running the same command again resumes an interrupted search, with the experiment it was
started with: an edited one is refused where the run's results would not hold for it, else
what the run keeps is said (`changes`); `--fresh` moves the old run dir aside and starts over.

Exit status: 0 done; 1 the search stopped (a failed baseline, a config-independent failure
streak); 2 bad input (one `error:` line on stderr, nothing started or written) or Ray could not
start; 130 interrupted (the run is kept; the same command resumes it).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from ..config import cliargs, load_experiment
from ..errors import ConfigError, RunInUse, SearchStopped
from ..server import reap_orphans
from ..store import rundir
from . import changes
from .baseline import run_baseline
from .leftovers import (
    RUN_TOKEN_ENV,
    end_driver_processes,
    forget_driver,
    reap_driver,
    record_driver,
)
from .preflight import RunPlan, plan_run
from .progress import say
from .ray_cluster import check_gpus, dashboard_lines, start_ray
from .summary import print_summary, stopped_early
from .tuner import (
    build_tuner,
    can_resume,
    keep_experiment,
    move_aside,
    moved_from,
    run_settings,
)
from .validate import run_validation

DEFAULT_EXPERIMENT = "experiments/sim-default.toml"
# Where the default experiment lives when the command runs outside the project's root.
_PROJECT_EXPERIMENT = Path(__file__).resolve().parents[2] / DEFAULT_EXPERIMENT


def build_parser() -> argparse.ArgumentParser:
    """The command's flags; each value is checked as the experiment's are (`config.cliargs`):
    a bad one is one `error:` line and exit 2, before anything starts."""
    ap = cliargs.Parser(
        prog="python -m specdecode_tune.search",
        description="Search speculative-decoding settings with Ray Tune + Optuna.")
    ap.add_argument("--experiment", default=DEFAULT_EXPERIMENT,
                    type=cliargs.text("a TOML experiment file"),
                    help="experiment TOML (default: %(default)s, the simulator)")
    ap.add_argument("--max-trials", type=cliargs.positive_int, default=None,
                    help="points Optuna explores (re-measurements come on top)")
    ap.add_argument("--address", default=None, type=cliargs.address,
                    help="join this Ray cluster (HOST:PORT, 'auto'); default: a local one")
    ap.add_argument("--storage", default=None, type=cliargs.text("a folder or a storage URI"),
                    help="where run dirs live: a path or a pyarrow.fs URI (default: runs)")
    ap.add_argument("--name", default=None, type=cliargs.run_name,
                    help="run name (default: the experiment's)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--resume", action="store_true",
                   help="resume the run (the default when it exists)")
    g.add_argument("--fresh", action="store_true",
                   help="move an existing run dir aside and start over")
    ap.add_argument("--sampler", default=None, type=cliargs.sampler,
                    help="hybrid | plateau | tpe | nsga2 | random | model (default: the "
                         "experiment's)")
    ap.add_argument("--seed", type=cliargs.seed, default=None, help="sampler seed")
    return ap


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The parsed command line (argparse exits 2 with one `error:` line on a bad one)."""
    return build_parser().parse_args(argv)


def run_search(experiment: str | Path, *args: str) -> int:
    """Search `experiment` as the command line does, with its further arguments (e.g.
    `"--max-trials", "4"`); returns the command's exit status."""
    return main(["--experiment", str(experiment), *args])


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # Before anything was started (the run's own Ctrl-C is handled inside).
        print("interrupted", file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None) -> int:
    args = cliargs.parse(build_parser(), argv)
    if isinstance(args, int):
        return args
    t0 = time.monotonic()
    try:
        plan, own, differs = _plan(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    exp = plan.exp
    exists = own is not None
    run, ignored = _settings(args, plan, own)
    pids_dir = rundir.pids_dir(rundir.logs_dir(plan.local_dir))
    try:
        _end_leftovers(plan, pids_dir)
    except RunInUse as e:
        print(f"error: the run {plan.run_dir} is in use by the search with PID {e.pid}; stop "
              f"it first, or give this one another --name", file=sys.stderr)
        return 2
    if args.fresh:
        aside = move_aside(plan)
        if aside:
            say(f"fresh start: the previous run was moved to {aside}")
    say(f"experiment: {exp.name} ({exp.source}) on backend {exp.backend.kind}"
        + (" (the embedded simulator, not a real server)" if exp.backend.kind == "sim" else ""))
    if differs:
        say(differs)
    if ignored:
        say(ignored)
    say(f"run dir: {plan.run_dir}  ({'resuming' if exists else 'new'}; "
        + ("" if exists and not own else f"sampler {run.sampler}, {run.max_trials} trials, ")
        + f"{run.max_concurrent} at a time, {exp.search.gpus_per_trial} GPU(s) each)")
    keep_experiment(plan)
    # On a local cluster every process this driver starts (Ray's, the trials', the servers')
    # inherits this token, so none can outlive the search unseen.
    token = uuid.uuid4().hex
    if not args.address:
        os.environ[RUN_TOKEN_ENV] = token
        record_driver(pids_dir, token)
    try:
        return _search(plan, args.address, sampler=run.sampler, seed=run.seed,
                       max_trials=run.max_trials, resume=exists, t0=t0)
    except KeyboardInterrupt:
        print(f"interrupted: the run is kept in {plan.run_dir}; the same command resumes it",
              file=sys.stderr)
        return 130
    finally:
        _clean_up(args.address, token, pids_dir)


def _plan(args: argparse.Namespace) -> tuple[RunPlan, dict | None, str | None]:
    """The run the command asks for (`plan_run`), the settings of the run it resumes (None: a
    new run; `run_settings`), and what differs from the experiment the run was started with
    (`changes.check`); ConfigError where the command contradicts the run dir."""
    path = args.experiment
    if path == DEFAULT_EXPERIMENT and not Path(path).exists() and _PROJECT_EXPERIMENT.exists():
        path = str(_PROJECT_EXPERIMENT)
    exp = load_experiment(path)
    plan = plan_run(exp, args)
    if args.fresh and plan.is_uri:
        raise ConfigError(f"--fresh with a URI storage: give the new run another --name "
                          f"(the run {plan.run_dir} is kept)")
    exists = can_resume(plan) if not args.fresh else False
    if args.resume and not exists:
        raise ConfigError(f"--resume: no search to resume at {plan.run_dir}")
    own = run_settings(plan) if exists else None
    began = moved_from(plan, own) if own else None
    if began:
        raise ConfigError(f"the run {plan.run_dir} was started at {began}, and a search goes "
                          f"on writing where it began (Tune's checkpoints, the Optuna journal): "
                          f"resume it from there (move it back), or start anew with --fresh")
    # An edited experiment must not go on with the old one's results (changes.py).
    differs = None if args.fresh else changes.check(exp, plan.run_dir)
    return plan, own, differs


class _Settings(NamedTuple):
    sampler: str
    seed: int
    max_trials: int
    max_concurrent: int


def _settings(args: argparse.Namespace, plan: RunPlan, own: dict | None
              ) -> tuple[_Settings, str | None]:
    """The sampler, seed, trial cap and trials at a time the search runs with: the command's,
    else the experiment's; for a resumed run (`own`: the settings it was started with, None for
    a new run) its own where it recorded them, with the line that names the flags it ignores."""
    exp = plan.exp
    run = _Settings(sampler=args.sampler or exp.search.sampler,
                    seed=exp.search.seed if args.seed is None else args.seed,
                    max_trials=args.max_trials or exp.search.max_trials,
                    max_concurrent=exp.search.max_concurrent)
    if own is None:
        return run, None
    # The resumed searcher and Tune keep what the run was started with.
    given = {"sampler": args.sampler, "seed": args.seed, "max_trials": args.max_trials}
    ignored = [f"--{k.replace('_', '-')} {v}" for k, v in given.items()
               if v is not None and v != own.get(k)]
    line = None
    if ignored:
        line = (f"{', '.join(ignored)}: ignored when resuming; the search goes on with the "
                f"sampler, seed and trial cap it was started with"
                + (f" ({own['sampler']}, seed {own['seed']}, {own['max_trials']} trials)"
                   if own else " (the trials table records the sampler)"))
    return run._replace(**{k: own[k] for k in run._fields if k in own}), line


def _end_leftovers(plan: RunPlan, pids_dir: Path) -> None:
    """What a killed driver of this run left: its servers (their pidfiles), then everything
    else it started (Ray's agents and workers: by the token its processes inherited).
    RunInUse where that driver still runs."""
    left = reap_driver(pids_dir)
    if not plan.is_uri:
        ended = reap_orphans(pids_dir)
        if ended:
            say(f"ended {len(ended)} server(s) left running by the interrupted run: {ended}")
    if left:
        say(f"ended {len(left)} process(es) left by the interrupted search (Ray's agents and "
            f"workers): {left}")


def _clean_up(address: str | None, token: str, pids_dir: Path) -> None:
    """Ray shut down and, on a local cluster, every process the search started ended."""
    # A second Ctrl-C must not cut the clean-up short.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ray
        if ray.is_initialized():
            ray.shutdown()
        if not address:
            end_driver_processes(token, os.getpid())
            forget_driver(pids_dir)
    finally:
        signal.signal(signal.SIGINT, previous)


def _search(plan: RunPlan, address: str | None, *, sampler: str, seed: int, max_trials: int,
            resume: bool, t0: float) -> int:
    """Ray up, the baseline, the trials, the closing lines; returns the exit status."""
    exp = plan.exp
    try:
        ctx = start_ray(exp.cluster, address)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 - ray raises many types for a bad address
        print(f"error: could not start or join Ray: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    try:
        check_gpus(exp.search.gpus_per_trial)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in dashboard_lines(ctx):
        say(line)
    try:
        baseline = run_baseline(plan) if exp.search.baseline else []
    except SearchStopped as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        tuner = build_tuner(plan, baseline, sampler, seed, max_trials, resume=resume)
    except ConfigError as e:        # a run saved by an older layout (a resume reuses the
        print(f"error: {e}", file=sys.stderr)   # baseline: nothing was booted)
        return 2
    grid = tuner.fit()
    # A Ctrl-C during fit is caught by Tune, which saves its state, marks the running trials
    # TERMINATED and returns: a trial without its final result (every finished trial reports
    # "feasible") was cut. It is an interruption, not a finished search.
    if any(r.error is None and "feasible" not in (r.metrics or {}) for r in grid):
        raise KeyboardInterrupt
    if exp.objective.kind == "schedule" and not stopped_early(plan):
        # The emitted schedule booted once, every level measured (search/validate.py).
        run_validation(plan)
    stopped = print_summary(plan, time.monotonic() - t0, max_trials)
    if stopped:
        print(f"error: {stopped}; fix that, then start over with --fresh", file=sys.stderr)
        return 1
    return 0
