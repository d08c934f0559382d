"""The Tune searcher driven directly (no cluster): exploration budget, no repeated boots of a
measured point, re-measurement of the best, constraints for refused configs."""

from __future__ import annotations

import math
import pickle

import optuna
from ray.tune.search import Searcher

from specdecode_tune.search.searcher import (
    FAILURE_STREAK,
    REPEAT_KEY,
    FailureStreak,
    RepeatingSearcher,
    SpecOptunaSearch,
    failure_signature,
)
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
    # The incumbent is re-measured (here by the early repeat); its lead over every other
    # point is beyond the band, so no third boot and no runner-up's second
    # (test_final_remeasure.py has the cases that need them).
    assert n_best == 2
    assert repeats and all(c["speculative_num_steps"] == best["speculative_num_steps"]
                           for c in repeats)
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


def test_a_point_proposed_while_it_runs_waits_for_its_answer() -> None:
    searcher = make(max_trials=4)
    study = searcher.inner.study()
    study.enqueue_trial({"speculative_num_steps": 2})
    study.enqueue_trial({"speculative_num_steps": 2})     # a second pair asks for the same point
    first = searcher.suggest("t0")
    second = searcher.suggest("t1")                        # while t0 is still running
    assert first["speculative_num_steps"] == 2
    assert second is not None and second.get(REPEAT_KEY, 0) == 0
    assert second["speculative_num_steps"] != 2, "the running point was booted twice"
    assert searcher.duplicates == 1 and searcher.explored == 2
    waiting = [t for t in study.trials if t.params == {"speculative_num_steps": 2}]
    assert len(waiting) == 2
    assert all(t.state == optuna.trial.TrialState.RUNNING for t in waiting)
    searcher.on_trial_complete("t0", {"score": 0.7, "feasible": True,
                                      "measured": '{"levels": {}}'})
    waiting = [t for t in study.trials if t.params == {"speculative_num_steps": 2}]
    assert [t.state for t in waiting] == [optuna.trial.TrialState.COMPLETE] * 2
    assert [t.value for t in waiting] == [0.7, 0.7]
    # What the trial measured is told once: a model must not learn it twice.
    assert ["measured" in t.user_attrs for t in waiting] == [True, False]
    assert searcher.followers == {}


def test_a_running_refused_or_failed_point_answers_its_followers_alike() -> None:
    for result, error, state, constraint in (
            ({"score": -5.0, "feasible": False}, False, optuna.trial.TrialState.COMPLETE,
             {"feasible": 1.0}),
            (None, True, optuna.trial.TrialState.FAIL, {})):
        searcher = make(max_trials=4)
        study = searcher.inner.study()
        for _ in range(2):
            study.enqueue_trial({"speculative_num_steps": 3})
        searcher.suggest("t0")
        searcher.suggest("t1")
        searcher.on_trial_complete("t0", result, error=error)
        both = [t for t in study.trials if t.params == {"speculative_num_steps": 3}]
        assert [t.state for t in both] == [state, state]
        assert [t.constraints for t in both] == [constraint, constraint]


def test_a_one_point_space_remeasures_the_running_point_instead_of_waiting() -> None:
    searcher = make(max_trials=3, steps_high=1)
    first = searcher.suggest("t0")
    second = searcher.suggest("t1")                        # nothing else to propose
    assert first["speculative_num_steps"] == 1 and REPEAT_KEY not in first
    assert second == {**first, REPEAT_KEY: 1}
    searcher.on_trial_complete("t0", score(first))
    searcher.on_trial_complete("t1", score(second))
    assert list(searcher.scores.values()) == [[score(first)["score"]] * 2]
    # Every proposal that waited on t0 was answered with t0's figure.
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in searcher.inner.study().trials)


# --- trials failing for a reason no config changes stop the search ---------------------------

REFUSED = ("no request succeeded at C=1: http 400: Requested token count exceeds the model's "
           "maximum context length of 262144 tokens.")


def failing(config: dict) -> dict:
    """What the trainable reports when the server refused every request of the first level."""
    return {"feasible": False, "score": -5.0, "status": "failed", "reason": REFUSED}


def test_trials_failing_the_same_way_stop_the_search_after_the_streak() -> None:
    searcher = make(max_trials=20)
    ran = []
    for i in range(50):
        config = searcher.suggest(f"t{i}")
        if config == Searcher.FINISHED:
            break
        ran.append(config)
        searcher.on_trial_complete(f"t{i}", failing(config))
    assert len(ran) == FAILURE_STREAK == 3            # 3 boots, not the budget of 20
    assert len({c["speculative_num_steps"] for c in ran}) == 3
    assert searcher.streak.tripped == (
        "the search stopped early: 3 trials in a row, at 3 distinct configs, failed with the "
        f"same reason (a cause that does not depend on the config): {REFUSED}")
    assert searcher.suggest("t-after") == Searcher.FINISHED       # and stays stopped


def test_the_stop_survives_pickling() -> None:
    searcher = make(max_trials=20)
    for i in range(2):
        config = searcher.suggest(f"t{i}")
        searcher.on_trial_complete(f"t{i}", failing(config))
    restored = pickle.loads(pickle.dumps(searcher))
    config = restored.suggest("t2")
    restored.on_trial_complete("t2", failing(config))
    assert restored.suggest("t3") == Searcher.FINISHED


def test_the_streak_counts_distinct_configs_failing_alike_and_nothing_else() -> None:
    s = FailureStreak()
    s.observe("a", "failed", REFUSED)
    s.observe("b", "infeasible", "oom: CUDA out of memory")   # a property of the point: skipped
    s.observe("a", "failed", REFUSED)                         # a repeat: counted once
    s.observe("c", "pruned", "steps * topk + 1 < draft tokens")
    assert s.tripped is None and s.configs == {"a"}
    s.observe("d", "failed", REFUSED.replace("  ", " "))       # whitespace does not matter
    assert s.tripped is None
    s.observe("e", "failed", REFUSED)
    assert s.tripped is not None and REFUSED in s.tripped


def test_a_success_or_another_reason_ends_the_streak() -> None:
    s = FailureStreak()
    for key, status, reason in [("a", "failed", REFUSED), ("b", "failed", REFUSED),
                                ("c", "ok", ""),                      # some config serves
                                ("d", "failed", REFUSED), ("e", "failed", "timeout: boot"),
                                ("f", "failed", REFUSED), ("g", "failed", REFUSED),
                                ("h", None, None)]:                   # a trial that raised
        s.observe(key, status, reason)
    assert s.tripped is None and s.configs == {"f", "g"}


def test_the_signature_masks_what_changes_between_boots_but_not_the_servers_limits() -> None:
    a = "crashed: [2026-01-02 12:00:01,123] bind 127.0.0.1:34567 failed (pid 4242, 0xdeadbeef)"
    b = "crashed: [2026-01-02 12:07:55,999] bind 127.0.0.1:40001 failed (pid 5151, 0xcafe)"
    assert failure_signature(a) == failure_signature(b)
    # A KV pool that depends on mem_fraction_static: config-dependent, never alike.
    kv = "no request succeeded at C=1: http 400: input (256) + max_new_tokens (200000) " \
         "exceeds the KV cache capacity ({} tokens)."
    assert failure_signature(kv.format(137064)) != failure_signature(kv.format(180112))


def test_a_pareto_search_stops_on_the_streak_too() -> None:
    space = (ParamSpec("speculative_num_steps", "int", 1, 12),)
    search = SpecOptunaSearch(space=DefineByRun(space, {}), metric=["a", "b"],
                              mode=["max", "min"], sampler=optuna.samplers.RandomSampler(seed=1),
                              seed=1)
    search.streak = FailureStreak()
    seen = []
    for i in range(10):
        config = search.suggest(f"t{i}")
        if config == Searcher.FINISHED:
            break
        seen.append(config["speculative_num_steps"])
        search.on_trial_complete(f"t{i}", {"a": 0.0, "b": 1e9, "feasible": False,
                                           "status": "failed", "reason": REFUSED})
    assert search.streak.tripped is not None
    assert len(set(seen)) == 3 and len(seen) <= 6   # random proposals may repeat a point


RADIX = ("invalid_args: ValueError: Speculative decoding for Qwen3_5MoeForConditionalGeneration "
         "is not compatible with radix cache when using --mamba-scheduler-strategy no_buffer.")


def test_the_same_argument_refusal_at_two_configs_is_the_experiments() -> None:
    """SGLang refusing every speculative argv the same way (issue 16: the hybrid model with
    radix cache on) is not a property of the points: two distinct configs trip the stop, even
    with an ok trial between them; memory refusals never do."""
    s = FailureStreak()
    s.observe("a", "infeasible", "kv_memory: Not enough memory. Please try to increase ...")
    s.observe("b", "infeasible", "kv_memory: Not enough memory. Please try to increase ...")
    assert s.tripped is None
    s.observe("c", "infeasible", RADIX)
    s.observe("c", "infeasible", RADIX)                 # the same config twice: one
    assert s.tripped is None
    s.observe("d", "ok", "")
    s.observe("e", "infeasible", RADIX)
    assert s.tripped is not None and "2 distinct configs" in s.tripped
    assert "not compatible with radix cache" in s.tripped


def test_a_searcher_pickled_before_the_refusal_rule_still_observes() -> None:
    s = FailureStreak()
    del s.__dict__["refusals"]                          # as unpickled from an older run
    s.observe("a", "infeasible", RADIX)
    s.observe("b", "infeasible", RADIX)
    assert s.tripped is not None
