"""The final re-measurements: each decided on every answer so far (only the incumbent's first
starts beside a running trial; the rest one at a time). The incumbent is re-measured once, then
to `repeats` while another config is within the noise band of it; a runner-up below it beyond
the band is not re-measured, one within the band is; a re-measurement that changes the ranking
brings the new incumbent's turn."""

from __future__ import annotations

import optuna
from ray.tune.search import Searcher

from specdecode_tune.search.searcher import REPEAT_KEY, RepeatingSearcher, SpecOptunaSearch
from specdecode_tune.space import DefineByRun, ParamSpec

STEPS = "speculative_num_steps"


def make(boots: dict[int, list[float]], repeats: int = 3, remeasure_top: int = 1
         ) -> RepeatingSearcher:
    """A searcher exploring exactly the points of `boots` (enqueued, in order; as many as the
    trial cap, so no early repeat runs) with the experiment's band of 0.025."""
    space = (ParamSpec(STEPS, "int", 1, 9),)
    inner = SpecOptunaSearch(space=DefineByRun(space, {}), metric="score", mode="max",
                             sampler=optuna.samplers.RandomSampler(seed=0))
    for steps in boots:
        inner.study().enqueue_trial({STEPS: steps})
    return RepeatingSearcher(inner, max_trials=len(boots), repeats=repeats,
                             remeasure_top=remeasure_top, default_band=0.025)


def drive(searcher: RepeatingSearcher, boots: dict[int, list[float]], concurrent: int = 2
          ) -> list[tuple[int, int]]:
    """Run the search as Tune does with `concurrent` trials at a time (the oldest finishes
    first); each boot of a point scores the next value of its list. Returns (steps, repeat)
    per boot, in the order they were suggested."""
    left = {k: list(v) for k, v in boots.items()}
    live: list[tuple[str, dict]] = []
    ran: list[tuple[int, int]] = []
    for i in range(100):
        while len(live) < concurrent:
            config = searcher.suggest(f"t{i}-{len(live)}")
            if config == Searcher.FINISHED:
                assert not live
                return ran
            if config is None:
                break
            live.append((f"t{i}-{len(live)}", config))
            ran.append((config[STEPS], config.get(REPEAT_KEY, 0)))
        assert live, "the searcher waits with nothing running"
        tid, config = live.pop(0)
        searcher.on_trial_complete(tid, {"score": left[config[STEPS]].pop(0),
                                         "feasible": True})
    raise AssertionError("the searcher never finished")


def boots_of(ran: list[tuple[int, int]], steps: int) -> int:
    return sum(1 for s, _ in ran if s == steps)


def test_a_runner_up_below_the_incumbent_beyond_the_band_is_not_remeasured() -> None:
    """Before: the incumbent to 3 boots and the runner-up to 2 whatever the margin (5
    re-measurements); a runner-up 10% below cannot become the pick by a second boot."""
    boots = {1: [1.00, 1.00, 1.00], 2: [0.90, 0.90], 3: [0.50]}
    ran = drive(make(boots), boots)
    assert [r for r in ran if r[1] > 0] == [(1, 1)]
    # The pick is backed by a repeat; its third is skipped: its lead is decided.
    assert boots_of(ran, 1) == 2 and boots_of(ran, 2) == 1


def test_a_runner_up_within_the_band_is_remeasured_and_the_incumbent_to_repeats() -> None:
    boots = {1: [1.00, 1.00, 1.00], 2: [0.99, 0.98], 3: [0.50]}
    ran = drive(make(boots), boots)
    # The pick's own figures first, then the runner-up within the band of it.
    assert [r for r in ran if r[1] > 0] == [(1, 1), (1, 2), (2, 1)]


def test_a_remeasurement_that_changes_the_ranking_brings_the_new_incumbents_turn() -> None:
    # The first incumbent's second boot is low: the runner-up leads, and is re-measured;
    # still within the (widened) band of the first, it gets its third boot too.
    boots = {1: [1.00, 0.90, 0.90], 2: [0.98, 0.98, 0.98], 3: [0.50]}
    searcher = make(boots)
    ran = drive(searcher, boots)
    assert [r for r in ran if r[1] > 0] == [(1, 1), (2, 1), (2, 2)]
    ranked = searcher.ranking()
    assert searcher.configs[ranked[0][0]][STEPS] == 2


def test_the_final_remeasurements_run_one_at_a_time() -> None:
    """The next decision needs the running re-measurement's answer: the second slot waits
    (before: both the incumbent's repeats ran at once)."""
    boots = {1: [1.00, 1.00, 1.00], 2: [0.99, 0.98], 3: [0.50]}
    searcher = make(boots)
    for i, steps in enumerate(boots):
        config = searcher.suggest(f"e{i}")
        assert config[STEPS] == steps
        searcher.on_trial_complete(f"e{i}", {"score": boots[steps][0], "feasible": True})
    first = searcher.suggest("r0")
    assert (first[STEPS], first[REPEAT_KEY]) == (1, 1)
    assert searcher.suggest("r1") is None
    searcher.on_trial_complete("r0", {"score": 1.0, "feasible": True})
    second = searcher.suggest("r1")
    assert (second[STEPS], second[REPEAT_KEY]) == (1, 2)


def test_the_incumbents_first_remeasurement_starts_beside_the_last_exploration() -> None:
    """It is owed unless that exploration overtakes the incumbent beyond the band, so it does
    not wait for it (a boot's wait saved); what comes after it waits for the answers."""
    boots = {1: [1.00, 1.00], 2: [0.50], 3: [0.40]}
    searcher = make(boots)
    for i in (0, 1):
        config = searcher.suggest(f"e{i}")
        searcher.on_trial_complete(f"e{i}", {"score": boots[config[STEPS]][0], "feasible": True})
    last = searcher.suggest("e2")
    assert last[STEPS] == 3 and not last.get(REPEAT_KEY)
    beside = searcher.suggest("r0")
    assert (beside[STEPS], beside[REPEAT_KEY]) == (1, 1)
    assert searcher.suggest("r1") is None          # two running: the rest waits for them


def test_a_noisy_servers_first_repeats_widen_the_band_the_decisions_use() -> None:
    """The incumbent's two boots differ by 8%: the runner-up 4% below its median is beyond the
    experiment's 2.5% band but not beyond the noise those boots show, so it is undecided: the
    incumbent gets its third boot and the runner-up its second."""
    boots = {1: [1.00, 0.92, 0.96], 2: [0.92, 0.93], 3: [0.50]}
    ran = drive(make(boots), boots)
    assert [r for r in ran if r[1] > 0] == [(1, 1), (1, 2), (2, 1)]


def test_no_repeats_asked_no_runner_up_remeasured_when_top_is_zero() -> None:
    boots = {1: [1.00, 1.00], 2: [0.99, 0.99], 3: [0.50]}
    ran = drive(make(boots, repeats=2, remeasure_top=0), boots)
    assert [r for r in ran if r[1] > 0] == [(1, 1)]
