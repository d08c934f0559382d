"""`python -m specdecode_tune.search`: find the best speculative-decoding settings.

With no arguments it runs `experiments/sim-default.toml` on the embedded simulator: a local Ray
cluster with logical GPUs, trials on GPU pairs, Optuna (plateau escape over TPE) proposing
points, the no-speculation baseline first, re-measurement of the best points, live progress,
and at the end the best config against the baseline with the plateau verdicts.

A run dir (`<storage>/<name>`) holds Tune's experiment state and searcher (Optuna study and
sampler pickled with it), `optuna.journal` (readable by `optuna-dashboard`), `tables/`
(Arrow/Parquet: requests, levels, trials), `logs/` (a server log per trial) and `logs/pids/`
(the servers' process groups, so that a resumed run ends orphans of a killed one); the whole
layout is `store.rundir`'s.

Running the same command again resumes an interrupted search; `--fresh` moves the old run dir
aside and starts over.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import results
from .backends import check_args, get_backend, preflight
from .config import SAMPLERS, Experiment, load_experiment
from .errors import ConfigError, SearchStopped
from .leftovers import (
    RUN_TOKEN_ENV,
    RunInUse,
    end_driver_processes,
    forget_driver,
    reap_driver,
    record_driver,
)
from .objective import pareto_values, pct, scalar_score
from .records import LevelSummary, ServerFacts, TrialResult
from .samplers.model import BASELINE_ATTR, baseline_attr, measured_attr
from .searcher import (
    JUMP_KEY,
    REPEAT_KEY,
    SAMPLER_KEY,
    FailureStreak,
    RepeatingSearcher,
    SpecOptunaSearch,
)
from .server import reap_orphans
from .space import BASELINE, SHORT_NAMES, DefineByRun, resolve
from .store import rundir
from .store.codec import read_checkpoint, write_checkpoint
from .store.files import filesystem, write_atomic
from .trial import TrialContext, record_trial, run_trial

DEFAULT_EXPERIMENT = "experiments/sim-default.toml"
# Where the default experiment lives when the command runs outside the project's root.
_PROJECT_EXPERIMENT = Path(__file__).resolve().parent.parent / DEFAULT_EXPERIMENT
BASELINE_ID = "baseline"
INFEASIBLE_SCORE = -5.0      # told to Optuna with a violated constraint: never the best

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Pre-flight: everything that can be checked before anything is started or written


@dataclass(frozen=True)
class RunPlan:
    exp: Experiment
    run_dir: str            # where tables and Tune's state go (a path or a pyarrow.fs URI)
    local_dir: Path         # this node's logs and pidfiles
    storage: str
    name: str
    is_uri: bool


def _is_uri(path: str) -> bool:
    return "://" in path


def _writable_target(path: Path) -> Path | None:
    """The nearest existing ancestor of `path`, if we may create `path` under it."""
    p = path.absolute()
    while not p.exists():
        if p.parent == p:
            return None
        p = p.parent
    return p if p.is_dir() and os.access(p, os.W_OK | os.X_OK) else None


def _check_address(address: str) -> None:
    if address in ("auto", "local"):
        return
    if address.startswith("ray://"):
        host_port = address[len("ray://"):]
    else:
        host_port = address
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--address {address!r}: expected HOST:PORT of a Ray head "
                          f"(e.g. 127.0.0.1:6379), 'auto', or ray://HOST:PORT")
    try:
        with socket.create_connection((host, int(port)), timeout=3):
            pass
    except OSError as e:
        raise ConfigError(f"--address {address!r}: no Ray head answers there "
                          f"({e.strerror or e})") from None


def _check_backend(exp: Experiment) -> None:
    backend = get_backend(exp.backend.kind)
    program = backend.program(exp.backend)
    if os.sep in program or program.startswith("."):
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise ConfigError(f"backend.binary = {program!r}: no executable file there")
    elif shutil.which(program) is None:
        raise ConfigError(f"backend program {program!r} is not on PATH: install it or set "
                          f"backend.binary to its path")


def _check_module(exp: Experiment) -> None:
    """A backend launched as `python -m PKG...` needs PKG importable by this interpreter (the
    one the trials use on a local cluster)."""
    argv = get_backend(exp.backend.kind).argv(exp.backend, resolve(BASELINE, exp.backend.flags),
                                              0)
    if len(argv) > 2 and argv[0] == sys.executable and argv[1] == "-m":
        package = argv[2].split(".")[0]
        if importlib.util.find_spec(package) is None:
            raise ConfigError(f"backend.kind = {exp.backend.kind!r} runs python -m {argv[2]}, "
                              f"but {package!r} is not installed for {sys.executable}: install "
                              f"it or set backend.binary")


def _check_resources(exp: Experiment) -> None:
    """On a local cluster a trial that asks for more than the cluster has would wait forever."""
    c, s = exp.cluster, exp.search
    if c.num_gpus is not None and s.gpus_per_trial > c.num_gpus:
        raise ConfigError(f"search.gpus_per_trial = {s.gpus_per_trial}: the local cluster has "
                          f"[cluster] num_gpus = {c.num_gpus}; no trial could ever start")
    cpus = c.num_cpus if c.num_cpus is not None else os.cpu_count()
    if cpus is not None and s.cpus_per_trial > cpus:
        where = "[cluster] num_cpus" if c.num_cpus is not None else "this machine's CPU count"
        raise ConfigError(f"search.cpus_per_trial = {s.cpus_per_trial:g}: the local cluster has "
                          f"{cpus} CPU(s) ({where}); no trial could ever start")


def plan_run(exp: Experiment, args: argparse.Namespace) -> RunPlan:
    storage = args.storage or os.environ.get("SPECDECODE_STORAGE") or "runs"
    name = args.name or exp.name
    if any(c in name for c in "/\\\0") or name.startswith("."):
        raise ConfigError(f"--name {name!r}: must be a plain name without slashes")
    is_uri = _is_uri(storage)
    if is_uri:
        try:
            import pyarrow.fs as pafs
            pafs.FileSystem.from_uri(storage)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types here
            raise ConfigError(f"--storage {storage!r}: not a storage URI pyarrow.fs "
                              f"understands ({str(e).splitlines()[0]})") from None
        run_dir = storage.rstrip("/") + "/" + name
    else:
        target = Path(storage) / name
        if _writable_target(target) is None:
            raise ConfigError(f"--storage {storage!r}: not writable (the run dir "
                              f"{target} cannot be created there)")
        run_dir = str(target.absolute())
    local_dir = rundir.local_dir(run_dir)
    _check_backend(exp)
    # local files only on a local cluster: a joined cluster's nodes have their own
    preflight(exp.backend, local=not args.address)
    name_var = exp.backend.api_key_env
    if name_var and not os.environ.get(name_var):
        raise ConfigError(f"backend.api_key_env = {name_var!r}: that environment variable is "
                          f"not set or empty (export the API key in it)")
    # What the server would refuse at every boot, where its backend can tell without a boot
    # (the simulator: its flags, extra_args and fixed flags included, through its own CLI).
    check_args(exp.backend, resolve(BASELINE, exp.backend.flags))
    if args.address:
        _check_address(args.address)
    else:
        # A local cluster: the servers run on this machine, so their package and the
        # cluster's resources can be checked here (a joined cluster's nodes may differ).
        if not exp.backend.binary:
            _check_module(exp)
        _check_resources(exp)
    return RunPlan(exp=exp, run_dir=run_dir, local_dir=local_dir, storage=storage, name=name,
                   is_uri=is_uri)


# ---------------------------------------------------------------------------------------------
# Samplers


def make_sampler(name: str, exp: Experiment, seed: int) -> Any:
    import optuna

    # Constraint-aware: a config the server refused counts as infeasible, not as a bad score.
    tpe = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(6, exp.search.max_trials))
    if name == "tpe":
        return tpe
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(
            4, min(20, exp.search.max_trials // 2)))
    if name == "plateau":
        from .samplers.plateau import PlateauEscapeSampler
        return PlateauEscapeSampler(tpe, noise_band=exp.search.noise_band, seed=seed)
    if name == "model":
        from .samplers.model import ModelGuidedSampler
        return ModelGuidedSampler(tpe, space=exp.space, fixed=exp.backend.flags, seed=seed)
    raise ConfigError(f"--sampler {name!r}: must be one of {', '.join(SAMPLERS)}")


class _DefineByRunWithJump(DefineByRun):
    """Adds to the trial's config, for the tables and progress, what proposed the point: the
    sampler that ran (`enqueued` for the experiment's own points) and the plateau sampler's
    reason. Pickled with the searcher, so a resumed search records the sampler it runs."""

    def __init__(self, space: Any, fixed: Any, sampler: str) -> None:
        super().__init__(space, fixed)
        self.sampler = sampler

    def __call__(self, trial: Any) -> dict[str, Any] | None:
        constants = super().__call__(trial) or {}
        reason = trial.user_attrs.get("jump_reason")
        if reason:
            constants[JUMP_KEY] = reason
        constants[SAMPLER_KEY] = "enqueued" if _enqueued(trial) else self.sampler
        return constants


def _enqueued(trial: Any) -> bool:
    """Whether Optuna took this trial's parameters from `enqueue_trial` (its `fixed_params`
    system attribute), read through the public FrozenTrial."""
    from optuna.trial import TrialState

    for t in trial.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t.number == trial.number:
            return "fixed_params" in t.system_attrs
    return False


# ---------------------------------------------------------------------------------------------
# The Tune trainable: one trial on its GPUs


def score_of(exp: Experiment, result: TrialResult, baseline: Sequence[LevelSummary]
             ) -> tuple[bool, Any]:
    """(feasible, score or list of values) of a finished trial."""
    if result.status != "ok":
        return False, None
    if exp.objective.kind == "pareto":
        values = pareto_values(result.levels, exp.objective.metrics)
        return values is not None, values
    score = scalar_score(result.levels, baseline, exp.level_weights())
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
                         "level_errors": summary.errors, "levels_done": len(finished)},
                        checkpoint=tune.Checkpoint.from_directory(d))

    trial_ctx = TrialContext(run_dir=run_dir, local_dir=rundir.logs_dir(local_dir),
                             trial_id=trial_id, repeat=repeat)

    started_at = time.time()
    result = run_trial(exp, sampled, trial_ctx, done_levels=done,
                       done_facts=facts[-1] if facts else None, on_facts=facts.append,
                       on_level=on_level, record=False)
    feasible, value = score_of(exp, result, baseline)
    # The trials table's score: the scalar score (None for Pareto objectives and failures).
    record_trial(trial_ctx, result, started_at=started_at, extra={
        "score": value if isinstance(value, float) else None,
        "jump_reason": config.get(JUMP_KEY),
        "sampler": config.get(SAMPLER_KEY, exp.search.sampler), "node_id": _node_id()})
    final: dict[str, Any] = {"feasible": feasible, "status": result.status,
                             "reason": result.reason, "levels_done": len(result.levels),
                             "repeat": repeat}
    if exp.objective.kind == "pareto":
        # An infeasible point gets the worst value of each metric, and a violated constraint.
        from .objective import metric_modes
        for i, (m, mode) in enumerate(zip(exp.objective.metrics,
                                          metric_modes(exp.objective.metrics))):
            final[m] = value[i] if feasible else (0.0 if mode == "max" else 1e9)
    else:
        final["score"] = value if feasible else INFEASIBLE_SCORE
    # A JSON string, so Tune does not flatten it; the searcher hands it to Optuna.
    final["measured"] = json.dumps(measured_attr(
        status=result.status, reason=result.reason, params=result.params, facts=result.facts,
        levels=result.levels))
    tune.report(final)


# ---------------------------------------------------------------------------------------------
# Progress: one line per finished level and per finished trial, with the incumbent


class Progress:
    """A Tune callback printing live progress to stdout."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        from ray.tune import Callback

        class _Progress(Callback):
            def __init__(self, exp: Experiment, total: int) -> None:
                self.exp = exp
                self.total = total
                self.done = 0
                self.best: tuple[float, str] | None = None
                self.t0 = time.monotonic()

            def _label(self, trial: Any) -> str:
                return describe(trial.config)

            def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any
                               ) -> None:
                jump = trial.config.get(JUMP_KEY)
                rep = trial.config.get(REPEAT_KEY, 0)
                extra = f"  [re-measure #{rep + 1}]" if rep else ""
                extra += f"  [plateau jump: {jump}]" if jump else ""
                _say(f"  start  {trial.trial_id}  {self._label(trial)}{extra}")

            def on_trial_result(self, iteration: int, trials: list, trial: Any,
                                result: dict, **info: Any) -> None:
                if "level" in result and "feasible" not in result:
                    acc = result.get("level_accept")
                    acc_s = f", accept {acc:.2f}" if acc is not None else ""
                    err = result.get("level_errors") or 0
                    err_s = f", {err} errors" if err else ""
                    _say(f"  level  {trial.trial_id}  C={result['level']:<3d} "
                         f"{result['level_tok_s']:8.1f} tok/s{acc_s}{err_s}")

            def on_trial_complete(self, iteration: int, trials: list, trial: Any,
                                  **info: Any) -> None:
                self.done += 1
                r = trial.last_result or {}
                label = self._label(trial)
                if r.get("feasible") and "score" in r:
                    score = float(r["score"])
                    if self.best is None or score > self.best[0]:
                        self.best = (score, label)
                    what = f"score {score:+.3f} ({pct(score)} vs baseline)"
                elif r.get("feasible"):
                    what = "done"
                else:
                    what = f"{r.get('status', 'failed')}: {short_reason(r.get('reason', ''))}"
                inc = (f" | best {pct(self.best[0])}: {self.best[1]}" if self.best else "")
                _say(f"trial {self.done:>3}  {trial.trial_id}  {label}  -> {what}{inc}  "
                     f"[{time.monotonic() - self.t0:.0f}s]")

            def on_trial_error(self, iteration: int, trials: list, trial: Any,
                               **info: Any) -> None:
                _say(f"trial {trial.trial_id} raised an error (see its log in Tune's dir)")

        return _Progress(*args, **kwargs)


REASON_CHARS = 100      # a reason on a live line; the table and the report keep it whole


def short_reason(reason: str, limit: int = REASON_CHARS) -> str:
    """A reason short enough for one live line: its first line, cut at a word boundary with
    an ellipsis where it is longer than `limit`."""
    text = " ".join((reason or "").strip().splitlines()[:1][0].split()) if reason else ""
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    space = cut.rfind(" ")
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:.(") + "…"


def describe(params: dict[str, Any], fixed: dict[str, Any] | None = None) -> str:
    """Short form of a point: the speculative triple first, then the rest; settings equal to
    the experiment's fixed flags are left out."""
    order = {k: i for i, k in enumerate(SHORT_NAMES)}
    parts = []
    for k in sorted(params, key=lambda k: (order.get(k, len(order)), k)):
        v = params[k]
        if k.startswith("_") or (fixed and k in fixed and fixed[k] == v):
            continue
        if k == "speculative_num_steps" and v == 0:
            return "no speculation (baseline)"
        v = f"{v:.3g}" if isinstance(v, float) else v
        parts.append(f"{SHORT_NAMES.get(k, k)}={v}")
    return " ".join(parts) or "baseline"


def _say(line: str) -> None:
    print(line, flush=True)


# ---------------------------------------------------------------------------------------------
# Ray


def start_ray(plan: RunPlan, address: str | None) -> Any:
    import ray

    kwargs: dict[str, Any] = dict(logging_level=logging.WARNING, log_to_driver=False,
                                  configure_logging=True)
    if address:
        return ray.init(address=address, **kwargs)
    cluster = plan.exp.cluster
    # A minimal Ray (plain ray[tune], no ray[default]) has no dashboard: run without one and
    # say so, rather than fail the search.
    missing = ray._private.utils.get_dashboard_dependency_error()
    if missing:
        _say(f"dashboard: not available ({missing}); install ray[default] for it")
    return ray.init(address="local", num_gpus=cluster.num_gpus, num_cpus=cluster.num_cpus,
                    include_dashboard=not missing, dashboard_host="127.0.0.1", **kwargs)


def check_gpus(plan: RunPlan) -> None:
    import ray

    need = plan.exp.search.gpus_per_trial
    have = int(ray.cluster_resources().get("GPU", 0))
    if need > have:
        raise ConfigError(f"search.gpus_per_trial = {need}: the Ray cluster has {have} GPU(s); "
                          f"declare logical GPUs with [cluster] num_gpus for the simulator, or "
                          f"join a cluster with GPUs (--address)")


def dashboard_lines(ctx: Any) -> list[str]:
    url = getattr(ctx, "dashboard_url", None)
    if not url:
        return ["dashboard: not started (install ray[default] for it)"]
    url = url if url.startswith("http") else f"http://{url}"
    token = Path.home() / ".ray" / "auth_token"
    how = (f"authenticate with the token in {token}" if token.exists()
           else "token authentication as configured for this cluster")
    return [f"dashboard: {url}  ({how}; trials run as ImplicitFunc actors, live metrics "
            f"ray_specdecode_output_tok_s / ray_specdecode_accept_length by trial_id)"]


# ---------------------------------------------------------------------------------------------
# Baseline


def _baseline_task(exp: Experiment, run_dir: str, local_dir: str) -> TrialResult:
    ctx = TrialContext(run_dir=run_dir, local_dir=rundir.logs_dir(local_dir),
                       trial_id=BASELINE_ID)
    started_at = time.time()
    result = run_trial(exp, dict(BASELINE), ctx, record=False)
    # Every score is relative to it: its own is 0.
    record_trial(ctx, result, started_at=started_at, extra={
        "score": 0.0 if result.status == "ok" else None, "sampler": "baseline",
        "node_id": _node_id()})
    return result


def _node_id() -> str | None:
    import ray
    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - outside Ray (tests calling the trainable directly)
        return None


def existing_baseline(run_dir: str) -> list[LevelSummary] | None:
    if baseline_facts(run_dir) is None:
        return None
    levels = results.read_table(run_dir, "levels")
    mine = [s for tid, s in results.level_summaries(levels) if tid == BASELINE_ID]
    return mine or None


def run_baseline(plan: RunPlan) -> list[LevelSummary]:
    import ray

    found = existing_baseline(plan.run_dir)
    if found is not None:
        _say(f"baseline: reusing the measured no-speculation baseline ({len(found)} levels)")
        return found
    _say("baseline: measuring the server without speculation first")
    s = plan.exp.search
    task = ray.remote(_baseline_task).options(num_gpus=s.gpus_per_trial,
                                               num_cpus=s.cpus_per_trial, max_retries=0)
    result: TrialResult = ray.get(task.remote(plan.exp, plan.run_dir, str(plan.local_dir)))
    if result.status != "ok":
        # Every score is relative to it, and what fails it (a workload the server refuses, a
        # model it cannot load) fails every trial: stop before booting any. Its row in the
        # trials table has the status and the reason.
        raise SearchStopped(f"the no-speculation baseline {result.status}, so the search "
                            f"stopped before any trial: {result.reason}")
    for lv in result.levels:
        _say(f"  baseline C={lv.concurrency:<3d} {lv.output_tok_s:8.1f} tok/s")
    return list(result.levels)


# ---------------------------------------------------------------------------------------------
# The search


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
    storage_path = plan.storage if plan.is_uri else str(Path(plan.storage).absolute())
    exp_path = f"{storage_path.rstrip('/')}/{plan.name}"
    if resume:
        return tune.Tuner.restore(exp_path, trainable=fn, resume_unfinished=True,
                                  resume_errored=False, restart_errored=False)
    plan.local_dir.mkdir(parents=True, exist_ok=True)
    journal = JournalStorage(JournalFileBackend(str(rundir.journal_file(plan.local_dir))))
    pareto = exp.objective.kind == "pareto"
    metric: Any = list(exp.objective.metrics) if pareto else "score"
    mode: Any = _pareto_modes(exp) if pareto else "max"
    enqueue = [dict(p) for p in s.enqueue]
    optuna_search = SpecOptunaSearch(
        space=_DefineByRunWithJump(exp.space, exp.backend.flags, sampler_name), metric=metric,
        mode=mode,        sampler=make_sampler(sampler_name, exp, seed), storage=journal,
        study_name=plan.name, points_to_evaluate=enqueue or None, seed=seed)
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
                                       default_band=s.noise_band,
                                       infeasible_score=INFEASIBLE_SCORE)
        num_samples = -1
    total = max_trials
    return tune.Tuner(
        fn,
        tune_config=tune.TuneConfig(search_alg=search_alg, num_samples=num_samples,
                                    max_concurrent_trials=s.max_concurrent, reuse_actors=False),
        run_config=tune.RunConfig(
            name=plan.name, storage_path=storage_path, verbose=0,
            callbacks=[Progress(exp, total)],
            # A trial whose node is lost is retried elsewhere from its last level checkpoint;
            # expected failures never raise (they are results), so this retries only losses.
            failure_config=tune.FailureConfig(max_failures=2),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2)),
    )


def baseline_facts(run_dir: str) -> dict[str, Any] | None:
    """The baseline trial's row (it holds max_total_num_tokens and max_running_requests)."""
    rows = [r for r in results.read_table(run_dir, "trials").to_pylist()
            if r["trial_id"] == BASELINE_ID and r["status"] == "ok"]
    return rows[-1] if rows else None


def request_tokens(exp: Experiment) -> float | None:
    """Mean KV tokens one request holds (input + output), for random workloads."""
    w = exp.workload
    if w.kind != "random":
        return None

    def mean(x: int | tuple[int, int]) -> float:
        return sum(x) / 2 if isinstance(x, tuple) else float(x)

    return mean(w.input_len) + mean(w.output_len)


def _pareto_modes(exp: Experiment) -> list[str]:
    from .objective import metric_modes
    return metric_modes(exp.objective.metrics)


def keep_experiment(plan: RunPlan) -> None:
    """A copy of the experiment file in the run dir: the report and a later resume read the
    settings the run was started with, even if the original file changes."""
    import pyarrow.fs as pafs

    fs, root = filesystem(plan.run_dir)
    target = rundir.experiment_file(root)
    if fs.get_file_info(target).type == pafs.FileType.NotFound:
        write_atomic(fs, target, Path(plan.exp.source).read_bytes())


def _move_aside(plan: RunPlan) -> str | None:
    if plan.is_uri:
        raise ConfigError(f"--fresh with a URI storage: give the new run another --name "
                          f"(the run {plan.run_dir} is kept)")
    old = Path(plan.run_dir)
    if not old.exists():
        return None
    aside = old.with_name(f"{old.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
    old.rename(aside)
    return str(aside)


# ---------------------------------------------------------------------------------------------
# Summary of a finished search


def stopped_early(plan: RunPlan) -> str | None:
    """Why the searcher stopped before its budget (searcher.FailureStreak: trials in a row at
    distinct configs failing with the same reason), or None. The rule is replayed over the
    trials table in the order the trials finished, so a resumed run that stops says so too."""
    rows = [r for r in results.read_table(plan.run_dir, "trials").to_pylist()
            if r["trial_id"] != BASELINE_ID]
    rows.sort(key=lambda r: (r["finished_at"] is None, r["finished_at"]))
    streak = FailureStreak()
    for r in rows:
        streak.observe(r["config_key"], r["status"], r["reason"])
    return streak.tripped


def trial_counts(plan: RunPlan) -> str:
    """One line counting the trials by status (the trials table only: the requests table, a
    row per request, is not needed here)."""
    trials = [r for r in results.read_table(plan.run_dir, "trials").to_pylist()
              if r["trial_id"] != BASELINE_ID]
    keys = {r["config_key"] for r in trials}
    n = {s: sum(1 for r in trials if r["status"] == s) for s in ("ok", "infeasible")}
    other = len(trials) - n["ok"] - n["infeasible"]
    return (f"trials: {len(trials)} measured ({n['ok']} ok, {n['infeasible']} infeasible, "
            f"{other} failed/pruned), {len(keys)} distinct configs")


# ---------------------------------------------------------------------------------------------
# CLI


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m specdecode_tune.search",
        description="Search speculative-decoding settings with Ray Tune + Optuna.")
    ap.add_argument("--experiment", default=DEFAULT_EXPERIMENT,
                    help="experiment TOML (default: %(default)s, the simulator)")
    ap.add_argument("--max-trials", type=int, default=None,
                    help="points Optuna explores (re-measurements come on top)")
    ap.add_argument("--address", default=None,
                    help="join this Ray cluster (HOST:PORT, 'auto'); default: a local one")
    ap.add_argument("--storage", default=None,
                    help="where run dirs live: a path or a pyarrow.fs URI (default: runs)")
    ap.add_argument("--name", default=None, help="run name (default: the experiment's)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--resume", action="store_true",
                   help="resume the run (the default when it exists)")
    g.add_argument("--fresh", action="store_true",
                   help="move an existing run dir aside and start over")
    ap.add_argument("--sampler", default=None,
                    help="plateau | tpe | nsga2 | random | model (default: the experiment's)")
    ap.add_argument("--seed", type=int, default=None, help="sampler seed")
    return ap.parse_args(argv)


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
    args = parse_args(argv)
    t0 = time.monotonic()
    try:
        path = args.experiment
        if path == DEFAULT_EXPERIMENT and not Path(path).exists() and \
                _PROJECT_EXPERIMENT.exists():
            path = str(_PROJECT_EXPERIMENT)
        exp = load_experiment(path)
        if args.max_trials is not None and args.max_trials < 1:
            raise ConfigError(f"--max-trials {args.max_trials}: must be >= 1")
        if args.sampler is not None and args.sampler not in SAMPLERS:
            raise ConfigError(f"--sampler {args.sampler!r}: must be one of "
                              f"{', '.join(SAMPLERS)}")
        plan = plan_run(exp, args)
        from ray import tune
        exists = tune.Tuner.can_restore(f"{plan.run_dir}") if not args.fresh else False
        if args.resume and not exists:
            raise ConfigError(f"--resume: no search to resume at {plan.run_dir}")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sampler = args.sampler or exp.search.sampler
    seed = exp.search.seed if args.seed is None else args.seed
    max_trials = args.max_trials or exp.search.max_trials
    pids_dir = rundir.pids_dir(rundir.logs_dir(plan.local_dir))
    # What a killed driver of this run left: its servers (their pidfiles), then everything
    # else it started (Ray's agents and workers: by the token its processes inherited).
    try:
        left = reap_driver(pids_dir)
    except RunInUse as e:
        print(f"error: the run {plan.run_dir} is in use by the search with PID {e.pid}; stop "
              f"it first, or give this one another --name", file=sys.stderr)
        return 2
    if not plan.is_uri:
        ended = reap_orphans(pids_dir)
        if ended:
            _say(f"ended {len(ended)} server(s) left running by the interrupted run: {ended}")
    if left:
        _say(f"ended {len(left)} process(es) left by the interrupted search (Ray's agents and "
             f"workers): {left}")
    if args.fresh:
        aside = _move_aside(plan)
        if aside:
            _say(f"fresh start: the previous run was moved to {aside}")
    _say(f"experiment: {exp.name} ({exp.source}) on backend {exp.backend.kind}"
         + (" (the embedded simulator, not a real server)" if exp.backend.kind == "sim" else ""))
    if exists and args.sampler is not None:
        _say(f"--sampler {args.sampler}: ignored when resuming; the search goes on with the "
             f"sampler it was started with (the trials table records it)")
    _say(f"run dir: {plan.run_dir}  ({'resuming' if exists else 'new'}; "
         + ("" if exists and args.sampler is not None else f"sampler {sampler}, ")
         + f"{max_trials} trials, {exp.search.max_concurrent} at a time, "
         f"{exp.search.gpus_per_trial} GPU(s) each)")
    keep_experiment(plan)
    # On a local cluster every process this driver starts (Ray's, the trials', the servers')
    # inherits this token, so none can outlive the search unseen.
    token = uuid.uuid4().hex
    if not args.address:
        os.environ[RUN_TOKEN_ENV] = token
        record_driver(pids_dir, token)
    try:
        return _search(plan, args, sampler=sampler, seed=seed, max_trials=max_trials,
                       resume=exists, t0=t0)
    except KeyboardInterrupt:
        print(f"interrupted: the run is kept in {plan.run_dir}; the same command resumes it",
              file=sys.stderr)
        return 130
    finally:
        # A second Ctrl-C must not cut the clean-up short.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            import ray
            if ray.is_initialized():
                ray.shutdown()
            if not args.address:
                end_driver_processes(token, os.getpid())
                forget_driver(pids_dir)
        finally:
            signal.signal(signal.SIGINT, previous)


def _search(plan: RunPlan, args: argparse.Namespace, *, sampler: str, seed: int,
            max_trials: int, resume: bool, t0: float) -> int:
    exp = plan.exp
    try:
        ctx = start_ray(plan, args.address)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 - ray raises many types for a bad address
        print(f"error: could not start or join Ray: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    try:
        check_gpus(plan)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in dashboard_lines(ctx):
        _say(line)
    try:
        baseline = run_baseline(plan) if exp.search.baseline else []
    except SearchStopped as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    tuner = build_tuner(plan, baseline, sampler, seed, max_trials, resume=resume)
    tuner.fit()
    stopped = stopped_early(plan)
    _say("")
    _say(f"search finished in {time.monotonic() - t0:.0f}s")
    if stopped:
        _say(stopped)
    _say(trial_counts(plan))
    _report(plan)
    _say(f"tables: {plan.run_dir}/{rundir.TABLES_DIR} (Parquet: requests, levels, trials); "
         f"Optuna study: {rundir.journal_file(plan.local_dir)}")
    if stopped:
        print(f"error: {stopped}; fix that, then start over with --fresh", file=sys.stderr)
        return 1
    return 0


def _report(plan: RunPlan) -> None:
    from .report import RunDirError, write_report

    try:
        out = write_report(plan.run_dir)
    except RunDirError as e:
        # The tables are written; a report that cannot be made must not hide them.
        _say("no feasible configuration was measured")
        _say(f"report: not written ({e})")
        return
    # The best config's figures are the report's (one computation for both).
    for line in out.best_lines + out.summary_lines:
        _say(line)
    _say(f"report: {out.path} (and report.html beside it)")


if __name__ == "__main__":
    sys.exit(main())
