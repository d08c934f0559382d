"""The contract every sampler of the search keeps, one parametrized suite over all of them (as
Optuna's own tests/samplers_tests/test_samplers.py does with `parametrize_sampler`).

The samplers are built as the search builds them: `search.sampler_factory.make_sampler` by each
name `config.SAMPLERS` allows (a sampler added there is covered here without a change), over the
default experiment with a smaller space. They are driven as the search drives them, without Ray
or a server: the project's define-by-run space (`space.DefineByRun`) asks, two trials at a time
(the experiment's max_concurrent), and a synthetic server answers in microseconds. The server
follows the model sampler's physics (so the model's path is taken, not only its hand-over to
TPE), refuses boots for memory (out of memory above a line in (mem, draft tokens), not enough KV
memory below one), and the trials numbered in `CRASHED` fail outright. A refusal is told as the
trainable tells it (`INFEASIBLE_SCORE` with a violated "feasible" constraint and the measured
attr), a crash as a failed trial.

The contract, per sampler:
- every proposal lies in the space: ints in range, floats on their step grid, choices chosen;
- every proposal is a configuration SGLang boots (`space`'s rules): topk 1 means draft tokens =
  steps + 1 (derived, not searched), and draft tokens fit the draft tree, 1 + topk + (steps - 1)
  * topk^2 at most;
- the same seed gives the same proposals (and the same recorded decisions);
- a study resumed from its storage (an Optuna journal, as the tuner keeps it) with the sampler
  pickled at the interruption (Ray keeps the searcher so) proposes what the uninterrupted study
  did; with a fresh sampler it carries on (the trials stored stay, the numbering goes on, no
  crash). Optuna 5's own NSGA-II failed it (its threading.Lock does not pickle):
  `samplers.nsga2` is the one the search builds;
- refused and crashed trials do not stop it, and the project's samplers (those that plan
  proposals themselves: `planned.PlannedSampler`) never plan a point that was refused, crashed
  or measured before (the model and the hybrid plan from their first trials here; the plateau
  probe finds no plateau in these runs). A proposal a sampler hands to its base sampler (TPE)
  may repeat a point: the searcher answers a repeated proposal from data
  (`search.searcher.MAX_DUPLICATES`), so that is not the sampler's contract.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
import shutil
import zlib
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from specdecode_tune.config import SAMPLERS, load_experiment
from specdecode_tune.samplers import (
    BASELINE_ATTR,
    MEASURED_ATTR,
    PlannedSampler,
    baseline_attr,
    measured_attr,
)
from specdecode_tune.samplers.model import step_features, tree_widths
from specdecode_tune.search.sampler_factory import make_sampler
from specdecode_tune.space import (
    DRAFT,
    MEM,
    STEPS,
    TOPK,
    DefineByRun,
    ParamSpec,
    invalid_reason,
    is_baseline,
    resolve,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)

REPO = Path(__file__).resolve().parents[3]
SPACE = (
    ParamSpec(STEPS, "int", low=1, high=6),
    ParamSpec(TOPK, "categorical", choices=(1, 2, 4)),
    ParamSpec(DRAFT, "int", low=2, high=12),
    ParamSpec(MEM, "float", low=0.84, high=0.92, step=0.02),
)
SEED = 3
TRIALS = 12             # per run: past TPE's 6 random startup trials and NSGA-II's first generation
BATCH = 2               # trials asked before the first of them is told (max_concurrent)
CRASHED = {0, 3, 8}     # trial numbers that fail outright (told FAIL, nothing measured)
INFEASIBLE_SCORE = -5.0  # search.searcher.INFEASIBLE_SCORE (importing it imports Ray)

parametrize_sampler = pytest.mark.parametrize("name", SAMPLERS)


# ---------------------------------------------------------------------------- the server

LEVELS = (1, 16, 32, 64)
P_ACCEPT = (0.92, 0.86, 0.8, 0.72, 0.62, 0.55, 0.5, 0.45, 0.4, 0.35, 0.3, 0.3)
H_SIBLING = 0.3                                  # share of misses a sibling candidate catches
THETA = np.array([0.010, 0.012, 8e-5, 0.004, 2e-4, 4e-5, 7e-5])   # step time coefficients
TILE, ROUTE = 8, 0.03
KV_LINE = (7.16e6, 5.8e6, 79_713.0)              # KV tokens = a * mem - b - c * draft tokens
RESERVE = 17_300                                 # KV tokens per running request
OOM_LINE = (0.955, 0.006)                        # out of memory where mem > a - b * draft tokens
BASE_KV = 455_357


def tok_s(steps: int, topk: int, n: int, accept: float, kv: float, spec: bool
          ) -> dict[int, float]:
    out = {}
    for c in LEVELS:
        r = float(min(c, kv // RESERVE, kv // 512))
        feats = step_features(np.array(r), np.array(float(n)), np.array(float(steps)),
                              np.array(float(topk)), np.array(accept),
                              np.array(1.0 if spec else 0.0), TILE, ROUTE)
        out[c] = r * accept / float(feats @ THETA)
    return out


BASELINE = tok_s(0, 1, 1, 1.0, BASE_KV, spec=False)


def serve(params: dict[str, Any]) -> tuple[float | None, dict[str, Any]]:
    """(The score, or None for a refused boot; the trial's "measured" attr). A pure function
    of the point: its noise is seeded by the point."""
    steps, topk, n, mem = params[STEPS], params[TOPK], params[DRAFT], params[MEM]
    if mem > OOM_LINE[0] - OOM_LINE[1] * n:
        return None, measured_attr(status="infeasible", params=params,
                                   reason="oom: torch.OutOfMemoryError: CUDA out of memory")
    kv = KV_LINE[0] * mem - KV_LINE[1] - KV_LINE[2] * n
    if kv < RESERVE:
        return None, measured_attr(status="infeasible", params=params,
                                   reason="kv_memory: RuntimeError: Not enough memory.")
    rng = np.random.default_rng(zlib.crc32(json.dumps(params, sort_keys=True).encode()))
    widths = tree_widths(P_ACCEPT, H_SIBLING, steps, topk, n - 1)[-1]
    q = [1.0 - (1.0 - P_ACCEPT[i]) * (1.0 - H_SIBLING) ** (w - 1) for i, w in enumerate(widths)]
    accept = 1.0 + float(np.cumprod(q).sum())
    at_least = np.cumprod([1.0, *q])
    exact = np.maximum(at_least - np.append(at_least[1:], 0.0), 0.0)
    levels, score = [], 0.0
    for c, v in tok_s(steps, topk, n, accept, kv, spec=True).items():
        v *= math.exp(rng.normal(0.0, 0.01))
        levels.append({"concurrency": c, "mode": "closed", "output_tok_s": v,
                       "accept_length": accept,
                       "accept_histogram": rng.multinomial(2000, exact / exact.sum()).tolist()})
        score += math.log(v / BASELINE[c]) / len(LEVELS)
    facts = {"max_total_num_tokens": int(kv), "max_running_requests": int(kv // RESERVE)}
    return score, measured_attr(status="ok", params=params, facts=facts, levels=levels)


# ---------------------------------------------------------------------------- driving it


@cache
def experiment() -> Any:
    exp = load_experiment(REPO / "experiments" / "sim-default.toml")
    return dataclasses.replace(exp, space=SPACE)


def build(name: str) -> optuna.samplers.BaseSampler:
    return make_sampler(name, experiment(), SEED)


def new_study(sampler: optuna.samplers.BaseSampler, storage: Any = None) -> optuna.Study:
    """A study as the tuner creates one: the baseline measured first is in its attrs."""
    study = optuna.create_study(direction="maximize", sampler=sampler, storage=storage,
                                study_name="contract")
    study.set_user_attr(BASELINE_ATTR, baseline_attr(
        levels=[{"concurrency": c, "output_tok_s": v} for c, v in BASELINE.items()],
        weights=experiment().level_weights(),
        facts={"max_total_num_tokens": BASE_KV, "max_running_requests": BASE_KV // RESERVE},
        request_tokens=512))
    return study


def drive(study: optuna.Study, n: int) -> None:
    """`n` more trials, `BATCH` at a time, answered by the synthetic server. Each trial is
    asked and its point suggested at once (OptunaSearch.suggest), then the batch is told."""
    exp = experiment()
    define = DefineByRun(exp.space, exp.backend.flags)
    for _ in range(0, n, BATCH):
        asked = []
        for _ in range(BATCH):
            asked.append(study.ask())
            define(asked[-1])
        for trial in asked:
            if trial.number in CRASHED:
                study.tell(trial, state=TrialState.FAIL)
                continue
            sampled = {k: v for k, v in resolve(trial.params, exp.backend.flags).items()
                       if k in (STEPS, TOPK, DRAFT, MEM)}
            value, attr = serve(sampled)
            trial.set_user_attr(MEASURED_ATTR, attr)
            trial.set_constraint("feasible", 0.0 if value is not None else 1.0)
            study.tell(trial, INFEASIBLE_SCORE if value is None else value)


@cache
def run(name: str) -> tuple[FrozenTrial, ...]:
    """The trials of one uninterrupted run of `name` (shared by the tests: read only)."""
    study = new_study(build(name))
    drive(study, TRIALS)
    return tuple(study.get_trials())


def record(trials: Any) -> list[tuple[Any, ...]]:
    """What two runs must agree on: each trial's point, state, value and attrs."""
    return [(t.number, t.params, t.state, t.values, t.user_attrs) for t in trials]


def key_of(params: dict[str, Any]) -> tuple[Any, ...]:
    """A point as the server runs it."""
    full = resolve(params, experiment().backend.flags)
    if is_baseline(full):
        return ("baseline",)
    return (full[STEPS], full[TOPK], full[DRAFT], round(float(full[MEM]), 6))


def planned(sampler: Any, trial: FrozenTrial) -> bool:
    """Whether the sampler planned this trial's point itself (not its base sampler)."""
    return isinstance(sampler, PlannedSampler) and sampler.plan_key in trial.system_attrs


def assert_no_planned_repeat(sampler: Any, trials: Any) -> int:
    """No trial the sampler planned is at a point an earlier trial ran, was refused at or
    crashed at; the number of planned trials."""
    seen: set[tuple[Any, ...]] = set()
    count = 0
    for t in trials:
        key = key_of(t.params)
        if planned(sampler, t):
            count += 1
            assert key not in seen, (t.number, t.params, t.system_attrs)
        seen.add(key)
    return count


# ---------------------------------------------------------------------------- the contract


def test_the_suite_covers_every_sampler_the_search_offers() -> None:
    assert {"hybrid", "plateau", "model", "tpe", "nsga2", "random"} <= set(SAMPLERS)


def on_grid(spec: ParamSpec, value: Any) -> bool:
    if spec.type == "categorical":
        return any(type(value) is type(c) and value == c for c in spec.choices)
    if spec.type == "int":
        step = int(spec.step or 1)
        return (type(value) is int and spec.lo <= value <= spec.hi
                and (value - int(spec.lo)) % step == 0)
    if isinstance(value, bool) or not isinstance(value, float):
        return False
    if not spec.lo - 1e-12 <= value <= spec.hi + 1e-12:
        return False
    if spec.step is None:
        return True
    k = (value - spec.lo) / spec.step
    return abs(k - round(k)) < 1e-9


@parametrize_sampler
def test_proposals_lie_in_the_space(name: str) -> None:
    trials = run(name)
    assert len(trials) == TRIALS
    specs = {s.name: s for s in SPACE}
    for t in trials:
        assert set(t.params) <= set(specs), t.params
        # Every parameter but the draft tokens is asked on every trial (those only at topk > 1).
        assert set(specs) - {DRAFT} <= set(t.params), t.params
        for k, v in t.params.items():
            assert on_grid(specs[k], v), (t.number, k, v)


@parametrize_sampler
def test_proposals_follow_sglangs_draft_tree_rules(name: str) -> None:
    flags = experiment().backend.flags
    for t in run(name):
        full = resolve(t.params, flags)
        steps, topk, draft = full[STEPS], full[TOPK], full[DRAFT]
        assert steps >= 1
        if topk == 1:
            # Derived, never searched: two draft counts would be one server under two names.
            assert DRAFT not in t.params and draft == steps + 1, t.params
        else:
            assert 2 <= t.params[DRAFT] <= 1 + topk + (steps - 1) * topk * topk, t.params
        assert invalid_reason(full) is None, t.params


@parametrize_sampler
def test_the_same_seed_gives_the_same_proposals(name: str) -> None:
    again = new_study(build(name))
    drive(again, TRIALS)
    assert record(again.get_trials()) == record(run(name))


@parametrize_sampler
def test_a_resumed_study_goes_on_where_it_stopped(name: str, tmp_path: Path) -> None:
    half = TRIALS // 2
    journal = tmp_path / "journal.log"
    sampler = build(name)
    drive(new_study(sampler, JournalStorage(JournalFileBackend(str(journal)))), half)
    saved = pickle.dumps(sampler)                     # what Ray keeps of the searcher
    shutil.copy(journal, tmp_path / "fresh.log")

    # Pickled at the interruption: as if it had never stopped.
    resumed = optuna.load_study(study_name="contract", sampler=pickle.loads(saved),
                                storage=JournalStorage(JournalFileBackend(str(journal))))
    drive(resumed, TRIALS - half)
    assert record(resumed.get_trials()) == record(run(name))

    # A fresh sampler over the stored study: the stored trials stay, the numbering goes on.
    fresh = build(name)
    study = optuna.load_study(study_name="contract", sampler=fresh,
                              storage=JournalStorage(JournalFileBackend(str(tmp_path
                                                                            / "fresh.log"))))
    drive(study, TRIALS - half)
    trials = study.get_trials()
    # (Their attrs may gain what a fresh sampler resolves late, a stale jump's outcome, say.)
    assert [(t.params, t.state, t.values) for t in trials[:half]] == \
        [(t.params, t.state, t.values) for t in run(name)[:half]]
    assert [t.number for t in trials] == list(range(TRIALS))
    assert all(t.state.is_finished() for t in trials)
    assert_no_planned_repeat(fresh, trials)


@parametrize_sampler
def test_refused_and_crashed_trials_are_not_proposed_again(name: str) -> None:
    trials = run(name)
    # The run holds what the test is about: refusals for memory, and crashes.
    reasons = {t.user_attrs[MEASURED_ATTR]["reason"].split(":")[0] for t in trials
               if t.state == TrialState.COMPLETE and t.values == [INFEASIBLE_SCORE]}
    assert reasons and reasons <= {"oom", "kv_memory"}, reasons
    assert {t.number for t in trials if t.state == TrialState.FAIL} == CRASHED
    # It kept going: every trial asked after them finished.
    assert all(t.state.is_finished() for t in trials) and len(trials) == TRIALS
    planned_trials = assert_no_planned_repeat(build(name), trials)
    # The model (alone or in the hybrid) plans from its first trials; the plateau probe only
    # where it finds a plateau, which this landscape does not offer it in the run (its rule,
    # that a level a completed trial measured is never jumped to, is test_plateau_sampler's).
    if name in ("model", "hybrid"):
        assert planned_trials > 0, "the sampler planned nothing"
