"""The Tune searcher driven directly (no cluster): exploration budget, no repeated boots of a
measured point, re-measurement of the best, constraints for refused configs."""

from __future__ import annotations

import math
import pickle

import optuna
from ray.tune.search import Searcher

from specdecode_tune.searcher import REPEAT_KEY, RepeatingSearcher, SpecOptunaSearch
from specdecode_tune.space import DefineByRun, ParamSpec


def make(max_trials: int, steps_high: int = 6, repeats: int = 3) -> RepeatingSearcher:
    space = (ParamSpec("speculative_num_steps", "int", 1, steps_high),)
    inner = SpecOptunaSearch(space=DefineByRun(space, {}), metric="score", mode="max",
                             sampler=optuna.samplers.RandomSampler(seed=3), seed=3)
    return RepeatingSearcher(inner, max_trials=max_trials, repeats=repeats, remeasure_top=1,
                             default_band=0.025)


def score(config: dict) -> dict:
    s = config["speculative_num_steps"]
    if s >= 6:
        return {"feasible": False, "score": -5.0}
    return {"feasible": True, "score": math.log(1 + s) - 0.1 * s * s / 4}


def drive(searcher: RepeatingSearcher, limit: int = 200) -> list[dict]:
    """Run every suggestion to completion, one at a time, until the searcher finishes."""
    ran = []
    for i in range(limit):
        config = searcher.suggest(f"t{i}")
        if config == Searcher.FINISHED:
            return ran
        assert config is not None
        ran.append(config)
        searcher.on_trial_complete(f"t{i}", score(config))
    raise AssertionError("the searcher never finished")


def test_explores_budget_then_remeasures_the_best_and_finishes() -> None:
    searcher = make(max_trials=5)
    ran = drive(searcher)
    explored = [c for c in ran if c.get(REPEAT_KEY, 0) == 0]
    repeats = [c for c in ran if c.get(REPEAT_KEY, 0) > 0]
    assert len(explored) == 5
    keys = [c["speculative_num_steps"] for c in explored]
    assert len(keys) == len(set(keys)), "a measured point was booted twice as exploration"
    best = max((c for c in explored if score(c)["feasible"]), key=lambda c: score(c)["score"])
    n_best = sum(1 for c in ran if c["speculative_num_steps"] == best["speculative_num_steps"])
    assert n_best == 3                        # the incumbent is measured `repeats` times
    assert repeats and all(score(c)["feasible"] for c in repeats)
    study = searcher.inner.study()
    assert "noise_band" in study.user_attrs
    # Optuna saw the refused configs as constraint violations, not as failures.
    refused = [t for t in study.trials if t.params.get("speculative_num_steps", 0) >= 6]
    assert refused and all(t.constraints == {"feasible": 1.0} for t in refused)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)


def test_a_small_space_is_not_booted_twice_and_still_finishes() -> None:
    searcher = make(max_trials=8, steps_high=3, repeats=2)   # only 3 distinct points
    ran = drive(searcher)
    explored_keys = [c["speculative_num_steps"] for c in ran if c.get(REPEAT_KEY, 0) == 0]
    assert sorted(set(explored_keys)) == [1, 2, 3]
    assert searcher.duplicates > 0


def test_state_survives_pickling_mid_search(tmp_path) -> None:
    searcher = make(max_trials=6)
    for i in range(3):
        config = searcher.suggest(f"t{i}")
        searcher.on_trial_complete(f"t{i}", score(config))
    path = tmp_path / "searcher.pkl"
    searcher.save(str(path))
    restored = make(max_trials=6)
    restored.restore(str(path))
    assert restored.explored == 3 and restored.scores == searcher.scores
    rest = drive(restored)
    assert sum(1 for c in rest if c.get(REPEAT_KEY, 0) == 0) == 3
    assert pickle.loads(pickle.dumps(restored.inner.study().trials))
