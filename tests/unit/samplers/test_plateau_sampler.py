"""PlateauEscapeSampler on synthetic speculative-decoding objectives (pure, no servers, no Ray).

Scores are log-speedups over steps=1 (as the search's score is a weighted mean of
log-speedups): the seed's single-stream figures 123/186/234/277/282 tok/s give a 4 -> 5 step of
+1.8%, inside the default 2.5% noise band.
"""

from __future__ import annotations

import json
import math
import pickle
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdecode_tune.config import load_experiment
from specdecode_tune.samplers import (
    BASELINE_ATTR,
    DECISION_ATTR,
    EVENTS_ATTR,
    JUMP_OUTCOME_ATTR,
    JUMP_REASON_ATTR,
    MEASURED_ATTR,
    OUTCOMES,
    HybridSampler,
    PlateauEscapeSampler,
    baseline_attr,
    measured_attr,
)
from specdecode_tune.samplers.plateau.geometry import blocked
from specdecode_tune.search.sampler_factory import make_sampler

STEPS = "speculative_num_steps"
TOPK = "speculative_eagle_topk"
DRAFT = "speculative_num_draft_tokens"
MEM = "mem_fraction_static"

optuna.logging.set_verbosity(optuna.logging.WARNING)

# The question the project was seeded with: steps 1..5 climb, 4 -> 5 is +1.8%, then it
# falls (more draft tokens eat the KV cache): steps=10 is much worse.
SEED_TOK_S = {1: 123.0, 2: 186.0, 3: 234.0, 4: 277.0, 5: 282.0}


def seed_steps(steps: int) -> float:
    tok_s = SEED_TOK_S.get(steps, 282.0 * (1 - 0.05 * (steps - 5)))
    return math.log(tok_s / 123.0)


# Two regimes: climb to 4, plateau 4..6, a valley 7..9, a higher second regime at 10..11.
TWO_REGIMES = {
    1: 0.0, 2: 0.35, 3: 0.55, 4: 0.70, 5: 0.71, 6: 0.705, 7: 0.62, 8: 0.58,
    9: 0.60, 10: 0.80, 11: 0.84, 12: 0.66, 13: 0.55, 14: 0.50, 15: 0.45, 16: 0.35,
}
SECOND_REGIME = (10, 11)
TOPK_EFFECT = {1: 0.0, 2: -0.08, 4: -0.25, 8: -0.45}


def steps_topk(steps_score: Callable[[int], float]) -> Callable[[optuna.Trial], float]:
    """An objective over steps in [1, 16] and a categorical topk."""

    def objective(trial: optuna.Trial) -> float:
        steps = trial.suggest_int(STEPS, 1, 16)
        topk = trial.suggest_categorical(TOPK, [1, 2, 4])
        return steps_score(steps) + TOPK_EFFECT[topk]

    return objective


def two_regime_objective(trial: optuna.Trial) -> float:
    steps = trial.suggest_int(STEPS, 1, 16)
    topk = trial.suggest_categorical(TOPK, [1, 2, 4, 8])
    mem = trial.suggest_float(MEM, 0.60, 0.95)
    return TWO_REGIMES[steps] + TOPK_EFFECT[topk] - 3 * (mem - 0.88) ** 2


def sweep(study: optuna.Study, values: Sequence[int] = (1, 2, 3, 4, 5), **fixed: Any) -> None:
    """The user's hand sweep of steps, as enqueued trials."""
    for s in values:
        study.enqueue_trial({STEPS: s, TOPK: 1, **fixed})


def new_study(sampler: optuna.samplers.BaseSampler, direction: str = "maximize",
              storage: Any = None) -> optuna.Study:
    return optuna.create_study(direction=direction, sampler=sampler, storage=storage)


def events(study: optuna.Study) -> list[dict[str, Any]]:
    return list(study.user_attrs.get(EVENTS_ATTR, []))


def jump_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.trials if JUMP_REASON_ATTR in t.user_attrs]


def steps_events(study: optuna.Study) -> list[dict[str, Any]]:
    return [e for e in events(study) if e["axis"] == STEPS]


# ---------------------------------------------------------------------------- (a) seed shape


def test_seed_plateau_jumps_once_to_10_and_finds_a_peak() -> None:
    study = new_study(PlateauEscapeSampler(seed=0))
    sweep(study)
    seen_in_objective: dict[int, str | None] = {}
    objective = steps_topk(seed_steps)

    def recording(trial: optuna.Trial) -> float:
        value = objective(trial)
        seen_in_objective[trial.number] = trial.user_attrs.get(JUMP_REASON_ATTR)
        return value

    study.optimize(recording, n_trials=5 + 1 + 30)

    [event] = steps_events(study)
    jump = study.trials[5]  # the first trial after the sweep
    assert event["trial_number"] == 5
    assert jump.params == {STEPS: 10, TOPK: 1}  # far, not 6; topk stays the incumbent's
    reason = ("plateau on speculative_num_steps: 4 -> 5 gained +1.8% (noise band +-2.5%); "
              "jumping to 10")
    assert jump.user_attrs[JUMP_REASON_ATTR] == reason
    assert seen_in_objective[5] == reason  # readable inside the objective / define-by-run
    assert event["reason"] == reason
    assert (event["plateau_from"], event["plateau_to"], event["jump_to"]) == (4, 5, 10)
    assert event["gain"] == pytest.approx(math.log(282 / 277))
    assert event["noise_band"] == 0.025
    assert event["outcome"] == "peak"
    assert jump.user_attrs[JUMP_OUTCOME_ATTR] == "peak"
    assert event["delta"] == pytest.approx(seed_steps(10) - seed_steps(5))
    assert event["verdict"].startswith(
        "speculative_num_steps=4..5 (best at 5) is a peak; "
        "probe at speculative_num_steps=10: -25.0%"
    )
    # Over the next 30 trials nothing jumps again from that plateau.
    assert [t.number for t in jump_trials(study) if t.params.get(STEPS, 0) > 5] == [5]
    assert len(study.trials) == 36
    json.dumps(study.user_attrs[EVENTS_ATTR])  # the report reads it as JSON


# ---------------------------------------------------------------------------- (b) escape


def test_two_regime_jump_escapes_and_the_best_is_in_the_second_regime() -> None:
    study = new_study(PlateauEscapeSampler(seed=3))
    sweep(study, mem_fraction_static=0.85)
    study.optimize(two_regime_objective, n_trials=30)

    first = steps_events(study)[0]
    assert (first["plateau_from"], first["plateau_to"], first["jump_to"]) == (4, 5, 10)
    assert first["outcome"] == "escaped"
    assert first["delta"] > first["noise_band"]
    assert study.trials[first["trial_number"]].params[MEM] == 0.85  # incumbent's mem kept
    assert study.best_params[STEPS] in SECOND_REGIME
    # The logic restarts from the new top: any later steps jump starts at or beyond 10.
    assert all(e["plateau_from"] >= 10 for e in steps_events(study)[1:])


# ---------------------------------------------------------------------------- (c) infeasible


@pytest.mark.parametrize("reported", ["with-a-score", "pruned"])
def test_infeasible_jump_is_recorded_and_not_probed_again(reported: str) -> None:
    def objective(trial: optuna.Trial) -> float:
        steps = trial.suggest_int(STEPS, 1, 16)
        topk = trial.suggest_categorical(TOPK, [1, 2, 4])
        # The server refuses steps >= 8 (not enough KV memory): an infeasible trial, reported
        # with a floor score or with none at all.
        trial.set_constraint("kv_memory", 1.0 if steps >= 8 else 0.0)
        if steps >= 8 and reported == "pruned":
            raise optuna.TrialPruned()
        return seed_steps(min(steps, 7)) + TOPK_EFFECT[topk]

    study = new_study(PlateauEscapeSampler(seed=1))
    sweep(study)
    study.optimize(objective, n_trials=5 + 25)

    [event] = steps_events(study)
    assert event["jump_to"] == 10
    assert event["outcome"] == "infeasible"
    assert "infeasible" in event["verdict"]
    assert study.trials[event["trial_number"]].user_attrs[JUMP_OUTCOME_ATTR] == "infeasible"


# ---------------------------------------------------------------------------- (d) within noise


def test_jump_within_noise_is_said_so_and_not_repeated() -> None:
    def flat_after_5(steps: int) -> float:
        # +0.5% at every step count from 6 on: a plateau that goes on.
        return seed_steps(steps) if steps <= 5 else seed_steps(5) + 0.005

    study = new_study(PlateauEscapeSampler(seed=2))
    sweep(study)
    study.optimize(steps_topk(flat_after_5), n_trials=5 + 30)

    [event] = steps_events(study)
    assert event["jump_to"] == 10
    assert event["outcome"] == "within_noise"
    assert event["delta"] == pytest.approx(0.005)
    assert "within noise" in event["verdict"]


# ---------------------------------------------------------------------------- (e) noise band


def test_noise_band_from_the_study_takes_precedence() -> None:
    # Measured band 1%: the +1.8% step 4 -> 5 is a real gain, so no plateau there.
    tight = new_study(PlateauEscapeSampler(seed=0, noise_band=0.025))
    tight.set_user_attr("noise_band", 0.01)
    sweep(tight)
    tight.optimize(steps_topk(seed_steps), n_trials=6)
    assert JUMP_REASON_ATTR not in tight.trials[5].user_attrs
    assert not any(e["plateau_to"] == 5 for e in steps_events(tight))

    # Measured band 5%: a +3.0% step is inside it, though outside the constructor's 2.5%.
    def gain_3pct(steps: int) -> float:
        return seed_steps(steps) if steps != 5 else seed_steps(4) + math.log(1.03)

    wide = new_study(PlateauEscapeSampler(seed=0, noise_band=0.025))
    wide.set_user_attr("noise_band", 0.05)
    sweep(wide)
    wide.optimize(steps_topk(gain_3pct), n_trials=6)
    [event] = steps_events(wide)
    assert event["noise_band"] == 0.05
    assert wide.trials[5].user_attrs[JUMP_REASON_ATTR] == (
        "plateau on speculative_num_steps: 4 -> 5 gained +3.0% (noise band +-5.0%); "
        "jumping to 10"
    )


def test_a_bad_noise_band_in_the_study_is_named() -> None:
    study = new_study(PlateauEscapeSampler(seed=0))
    study.set_user_attr("noise_band", -0.1)
    with pytest.raises(ValueError, match=r"noise_band.*-0\.1"):
        study.optimize(steps_topk(seed_steps), n_trials=1)


# ---------------------------------------------------------------------------- (f) pickling


def _trace(study: optuna.Study) -> list[tuple[dict[str, Any], Any]]:
    return [(t.params, t.user_attrs.get(JUMP_REASON_ATTR)) for t in study.trials]


def test_pickled_mid_study_continues_exactly_as_an_uninterrupted_run() -> None:
    whole = new_study(PlateauEscapeSampler(seed=7))
    sweep(whole, mem_fraction_static=0.85)
    whole.optimize(two_regime_objective, n_trials=30)

    first = new_study(PlateauEscapeSampler(seed=7))
    sweep(first, mem_fraction_static=0.85)
    first.optimize(two_regime_objective, n_trials=7)  # the jump (trial 5) is resolved by now
    assert steps_events(first)[0]["outcome"] == "escaped"
    resumed: optuna.Study = pickle.loads(pickle.dumps(first))
    assert isinstance(resumed.sampler, PlateauEscapeSampler)
    resumed.optimize(two_regime_objective, n_trials=23)

    assert _trace(resumed) == _trace(whole)
    assert events(resumed) == events(whole)


def test_the_state_lives_in_the_study_so_a_fresh_sampler_resumes(tmp_path: Any) -> None:
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    path = str(tmp_path / "journal.log")
    storage = JournalStorage(JournalFileBackend(path))
    study = optuna.create_study(direction="maximize", storage=storage, study_name="s",
                                sampler=PlateauEscapeSampler(seed=0))
    sweep(study)
    study.optimize(steps_topk(seed_steps), n_trials=8)
    assert steps_events(study)[0]["outcome"] == "peak"

    reopened = optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(path)),
                                 sampler=PlateauEscapeSampler(seed=1))
    reopened.optimize(steps_topk(seed_steps), n_trials=20)
    assert len(steps_events(reopened)) == 1  # the peak stays a peak for the new instance


def test_same_seed_same_search() -> None:
    runs = []
    for _ in range(2):
        study = new_study(PlateauEscapeSampler(seed=11))
        study.optimize(two_regime_objective, n_trials=25)
        runs.append((_trace(study), events(study)))
    assert runs[0] == runs[1]


# ---------------------------------------------------------------------------- (g) enqueued


def test_enqueued_trials_are_never_turned_into_jumps() -> None:
    study = new_study(PlateauEscapeSampler(seed=0))
    sweep(study)
    # At trial 5 a jump is due, but the user enqueued two configurations: a full one and a
    # partial one (topk only).
    study.enqueue_trial({STEPS: 7, TOPK: 2})
    study.enqueue_trial({TOPK: 4})
    study.optimize(steps_topk(seed_steps), n_trials=8)

    assert study.trials[5].params == {STEPS: 7, TOPK: 2}
    assert study.trials[6].params[TOPK] == 4
    for t in study.trials[:7]:
        assert JUMP_REASON_ATTR not in t.user_attrs
    assert study.trials[7].params == {STEPS: 10, TOPK: 1}
    assert study.trials[7].user_attrs[JUMP_REASON_ATTR].endswith("jumping to 10")


# ---------------------------------------------------------------------------- (h) seeds


def _finds_second_regime(sampler: optuna.samplers.BaseSampler, with_sweep: bool) -> bool:
    study = new_study(sampler)
    if with_sweep:
        sweep(study, mem_fraction_static=0.85)
    study.optimize(two_regime_objective, n_trials=25)
    return study.best_params[STEPS] in SECOND_REGIME


@pytest.mark.parametrize("with_sweep", [True, False], ids=["after-user-sweep", "from-scratch"])
def test_finds_the_second_regime_in_at_least_9_of_10_seeds(with_sweep: bool) -> None:
    seeds = range(10)
    plateau = sum(_finds_second_regime(PlateauEscapeSampler(seed=s), with_sweep) for s in seeds)
    tpe = sum(_finds_second_regime(optuna.samplers.TPESampler(seed=s), with_sweep)
              for s in seeds)
    start = "after the user sweep 1..5" if with_sweep else "from scratch"
    print(f"\nsecond regime found within 25 trials ({start}): "
          f"plateau-escape {plateau}/10 seeds, plain TPE {tpe}/10 seeds")
    assert plateau >= 9


# ---------------------------------------------------------------------------- define-by-run


def test_the_jump_fits_the_range_it_inherits_from_the_incumbent() -> None:
    # Draft tokens are bounded by the tree, steps * topk + 1: the jump keeps the incumbent's
    # steps and topk, so it must fit under their bound, not under the widest range seen.
    def objective(trial: optuna.Trial) -> float:
        steps = trial.suggest_int(STEPS, 1, 8)
        topk = trial.suggest_categorical(TOPK, [2, 4])
        draft = trial.suggest_int(DRAFT, 2, steps * topk + 1)
        return -0.1 * abs(steps - 3) - 0.1 * (topk - 2) + {2: 0.0, 3: 0.3, 4: 0.5}.get(draft, 0.51)

    study = new_study(PlateauEscapeSampler(seed=0, ordinal_params=[DRAFT]))
    study.enqueue_trial({STEPS: 8, TOPK: 4, DRAFT: 3})  # draft's widest range: [2, 33]
    for d in (2, 3, 4, 5):
        study.enqueue_trial({STEPS: 3, TOPK: 2, DRAFT: d})  # the incumbent's range: [2, 7]
    study.optimize(objective, n_trials=6)
    [event] = events(study)
    assert (event["plateau_from"], event["plateau_to"], event["jump_to"]) == (4, 5, 7)
    assert study.trials[5].params == {STEPS: 3, TOPK: 2, DRAFT: 7}

    # With the incumbent at steps 2 (range [2, 5]) there is no room beyond 5: no jump.
    pinned = new_study(PlateauEscapeSampler(seed=0, ordinal_params=[DRAFT]))
    pinned.enqueue_trial({STEPS: 8, TOPK: 4, DRAFT: 3})
    for d in (2, 3, 4, 5):
        pinned.enqueue_trial({STEPS: 2, TOPK: 2, DRAFT: d})
    pinned.optimize(objective, n_trials=12)
    assert events(pinned) == []


@pytest.mark.parametrize("narrowed_to, expected", [(7, "clamped"), (5, "unreachable")])
def test_a_range_narrowed_on_resume_clamps_the_jump_or_makes_it_unreachable(
    narrowed_to: int, expected: str
) -> None:
    # The user edits the experiment between runs: draft tokens' upper bound drops from 17 to
    # `narrowed_to` after the jump was decided (the study is resumed with the new space).
    study = new_study(PlateauEscapeSampler(seed=0, ordinal_params=[DRAFT]))
    for d in (2, 3, 4, 5):
        study.enqueue_trial({TOPK: 1, DRAFT: d})
    high = 17

    def objective(trial: optuna.Trial) -> float:
        topk = trial.suggest_categorical(TOPK, [1, 2])
        draft = trial.suggest_int(DRAFT, 2, high)
        return -0.1 * topk + {2: 0.0, 3: 0.3, 4: 0.5}.get(draft, 0.51)

    study.optimize(objective, n_trials=4)
    trial = study.ask()  # the jump is decided here, against the old range
    assert trial.user_attrs[JUMP_REASON_ATTR].endswith("jumping to 10")
    high = narrowed_to
    study.tell(trial, objective(trial))

    [event] = events(study)
    jump = study.trials[4]
    assert jump.params[TOPK] == 1 and jump.params[DRAFT] <= narrowed_to
    if expected == "clamped":
        assert jump.params[DRAFT] == 7 and event["jump_to"] == 7
        assert jump.user_attrs[JUMP_REASON_ATTR].endswith("jumping to 7 (clamped from 10)")
        assert event["outcome"] == "within_noise"
    else:
        assert jump.params[DRAFT] == 5  # a re-measure of the incumbent, said so
        assert event["outcome"] == "unreachable"
        assert jump.user_attrs[JUMP_OUTCOME_ATTR] == "unreachable"
        assert "unreachable: this trial's range is [2, 5]" in jump.user_attrs[JUMP_REASON_ATTR]


def test_downward_probe_when_enabled() -> None:
    def falling(steps: int) -> float:
        # The sweep went down from 10: flat 7 -> 6 at the bottom, better again at 3.
        return {3: 0.9, 6: 0.81, 7: 0.8, 8: 0.7, 9: 0.6, 10: 0.5}.get(steps, 0.0)

    study = new_study(PlateauEscapeSampler(seed=0, probe_downward=True))
    sweep(study, values=(10, 9, 8, 7, 6))
    study.optimize(steps_topk(falling), n_trials=7)
    up, down = events(study)
    assert (up["direction"], up["plateau_to"], up["jump_to"], up["outcome"]) == (
        "up", 7, 14, "peak")
    assert (down["direction"], down["plateau_from"], down["plateau_to"], down["jump_to"]) == (
        "down", 7, 6, 3)
    assert study.trials[6].user_attrs[JUMP_REASON_ATTR].endswith("jumping down to 3")
    assert down["outcome"] == "escaped"

    up_only = new_study(PlateauEscapeSampler(seed=0))
    sweep(up_only, values=(10, 9, 8, 7, 6))
    up_only.optimize(steps_topk(falling), n_trials=7)
    assert [e["direction"] for e in events(up_only)] == ["up"]


def test_float_axis_jumps_to_the_far_end_of_its_range() -> None:
    # mem_fraction_static: climbs to 0.80, flat 0.80 -> 0.82; the jump rule max(t + 2 (t - s),
    # 2 t) lands past the range, so the probe is the top of the range.
    def objective(trial: optuna.Trial) -> float:
        mem = trial.suggest_float(MEM, 0.60, 0.95)
        topk = trial.suggest_categorical(TOPK, [1, 2])
        return min(mem, 0.80) + 0.5 * (mem - 0.80) * (mem > 0.80) - 0.1 * topk

    study = new_study(PlateauEscapeSampler(seed=0))
    for mem in (0.60, 0.70, 0.80, 0.82):
        study.enqueue_trial({MEM: mem, TOPK: 1})
    study.optimize(objective, n_trials=5)
    [event] = events(study)
    assert (event["plateau_from"], event["plateau_to"], event["jump_to"]) == (0.80, 0.82, 0.95)
    assert study.trials[4].user_attrs[JUMP_REASON_ATTR] == (
        "plateau on mem_fraction_static: 0.8 -> 0.82 gained +1.0% (noise band +-2.5%); "
        "jumping to 0.95"
    )
    assert event["outcome"] == "escaped"  # +6.5% at 0.95


def test_a_numeric_categorical_is_an_axis_only_when_named() -> None:
    def objective(trial: optuna.Trial) -> float:
        topk = trial.suggest_categorical(TOPK, [1, 2, 4, 8, 16])
        return {1: 0.0, 2: 0.30, 4: 0.31, 8: 0.10, 16: 0.0}[topk]

    for ordinal, expected in ((None, []), ([TOPK], [(2, 4, 8, "peak")])):
        study = new_study(PlateauEscapeSampler(seed=0, ordinal_params=ordinal))
        for k in (1, 2, 4):
            study.enqueue_trial({TOPK: k})
        study.optimize(objective, n_trials=4)
        assert [(e["plateau_from"], e["plateau_to"], e["jump_to"], e["outcome"])
                for e in events(study)] == expected

    named_text = new_study(PlateauEscapeSampler(seed=0, ordinal_params=["backend"]))
    named_text.enqueue_trial({"backend": "fa3"})
    with pytest.raises(ValueError, match="'backend', but its choices are not all numbers"):
        named_text.optimize(
            lambda t: float(len(t.suggest_categorical("backend", ["fa3", "triton"]))),
            n_trials=2,
        )


def test_minimize_direction() -> None:
    study = new_study(PlateauEscapeSampler(seed=0), direction="minimize")
    sweep(study)
    study.optimize(lambda t: -steps_topk(seed_steps)(t), n_trials=6)
    [event] = events(study)
    assert event["jump_to"] == 10 and event["outcome"] == "peak"
    assert event["delta"] == pytest.approx(seed_steps(10) - seed_steps(5))


# ---------------------------------------------------------------------------- OptunaSearch


def define_by_run(trial: Any) -> dict[str, Any] | None:
    """The project's space shape: draft tokens only when topk > 1, bounded by the tree."""
    steps = trial.suggest_int(STEPS, 1, 16)
    topk = trial.suggest_categorical(TOPK, [1, 2, 4])
    if topk > 1:
        trial.suggest_int(DRAFT, 2, steps * topk + 1)
    trial.suggest_float(MEM, 0.70, 0.95)
    reason = trial.user_attrs.get(JUMP_REASON_ATTR)
    return {JUMP_REASON_ATTR: reason} if reason else None


def tune_score(config: Mapping[str, Any]) -> float:
    return (TWO_REGIMES[config[STEPS]] - 0.05 * (config[TOPK] - 1)
            - 2 * (config[MEM] - 0.88) ** 2)


def test_integrates_with_ray_tune_optuna_search(tmp_path: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ray.tune.search.optuna import OptunaSearch

    points = [{STEPS: s, TOPK: 1, MEM: 0.85} for s in (1, 2, 3, 4, 5)]
    searcher = OptunaSearch(space=define_by_run, metric="score", mode="max",
                            sampler=PlateauEscapeSampler(seed=1), points_to_evaluate=points)
    configs: dict[str, dict[str, Any]] = {}
    in_flight: list[str] = []
    for i in range(30):
        trial_id = f"t{i}"
        configs[trial_id] = searcher.suggest(trial_id)
        in_flight.append(trial_id)
        if len(in_flight) == 2:  # two GPU pairs: two trials run at once
            done = in_flight.pop(0)
            searcher.on_trial_complete(done, {"score": tune_score(configs[done])})
        if i == 12:  # Ray Tune checkpoints the searcher (sampler included) and restores it
            searcher.save(str(tmp_path / "searcher.pkl"))
            searcher = OptunaSearch()
            searcher.restore(str(tmp_path / "searcher.pkl"))
    for done in in_flight:
        searcher.on_trial_complete(done, {"score": tune_score(configs[done])})

    study = searcher._ot_study
    evs = events(study)
    first = evs[0]
    jump_config = configs[f"t{first['trial_number']}"]
    assert first["axis"] == STEPS and first["outcome"] == "escaped"
    assert jump_config[STEPS] == 10 and jump_config[MEM] == 0.85 and jump_config[TOPK] == 1
    assert jump_config[JUMP_REASON_ATTR] == first["reason"]  # the trial's config carries it
    assert all(e["outcome"] in OUTCOMES for e in evs)
    for config in configs.values():
        if DRAFT in config:
            assert config[DRAFT] <= config[STEPS] * config[TOPK] + 1
    best = max(configs.values(), key=tune_score)
    assert best[STEPS] in SECOND_REGIME


# ---------------------------------------------------------------------------- invariants


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scores=st.lists(st.floats(0.0, 1.0), min_size=16, max_size=16),
    infeasible_from=st.integers(6, 17),
    seed=st.integers(0, 2**16),
)
def test_invariants_on_arbitrary_curves(scores: list[float], infeasible_from: int,
                                        seed: int) -> None:
    def objective(trial: optuna.Trial) -> float:
        steps = trial.suggest_int(STEPS, 1, 16)
        topk = trial.suggest_categorical(TOPK, [1, 2, 4])
        trial.set_constraint("kv_memory", 1.0 if steps >= infeasible_from else 0.0)
        return scores[steps - 1] + TOPK_EFFECT[topk]

    study = new_study(PlateauEscapeSampler(seed=seed))
    sweep(study)
    study.optimize(objective, n_trials=30)
    evs = events(study)
    json.dumps(evs)
    by_trial = {t.number: t for t in study.trials}
    assert sorted(e["trial_number"] for e in evs) == [t.number for t in jump_trials(study)]
    for e in evs:
        trial = by_trial[e["trial_number"]]
        assert e["outcome"] in OUTCOMES  # every jump is resolved once the study is done
        assert trial.user_attrs[JUMP_OUTCOME_ATTR] == e["outcome"]
        assert trial.user_attrs[JUMP_REASON_ATTR] == e["reason"]
        assert "fixed_params" not in trial.system_attrs
        incumbent = by_trial[e["incumbent_trial"]]
        assert trial.params[TOPK] == incumbent.params[TOPK]  # only the axis moves
        assert e["jump_to"] > e["plateau_to"]
        assert e["jump_to"] - e["plateau_to"] >= 2  # far, not the next value
    # One jump per plateau: a later jump on an axis stands on a clearly higher incumbent.
    for earlier, later in zip(evs, evs[1:]):
        assert earlier["trial_number"] < later["trial_number"]
        assert later["incumbent_value"] - earlier["incumbent_value"] > earlier["noise_band"]


# ---------------------------------------------------------------------------- contract


def test_multi_objective_is_refused_clearly() -> None:
    study = optuna.create_study(directions=["maximize", "minimize"],
                                sampler=PlateauEscapeSampler(seed=0))
    with pytest.raises(ValueError, match="single-objective study, got 2 directions"):
        study.ask()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"noise_band": -0.01}, "noise_band must be a finite number >= 0"),
        ({"noise_band": float("nan")}, "noise_band must be a finite number >= 0"),
        ({"min_values_before_jump": 1}, "min_values_before_jump must be an int >= 2"),
    ],
)
def test_constructor_names_the_bad_value(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PlateauEscapeSampler(**kwargs)


def test_wraps_any_base_sampler_and_pickles() -> None:
    sampler = PlateauEscapeSampler(optuna.samplers.RandomSampler(seed=0), noise_band=0.03)
    clone = pickle.loads(pickle.dumps(sampler))
    assert isinstance(clone.base_sampler, optuna.samplers.RandomSampler)
    study = new_study(clone)
    sweep(study)
    study.optimize(steps_topk(seed_steps), n_trials=6)
    assert steps_events(study)[0]["noise_band"] == 0.03


def test_the_search_call_form_a_seeded_base_plus_seed() -> None:
    # search.make_sampler passes its own TPE and the run's seed: accepted, the seed is unused.
    tpe = optuna.samplers.TPESampler(seed=5, n_startup_trials=6)
    study = new_study(PlateauEscapeSampler(tpe, noise_band=0.025, seed=5))
    sweep(study)
    study.optimize(steps_topk(seed_steps), n_trials=6)
    assert study.trials[5].params == {STEPS: 10, TOPK: 1}


# ---------------------------------------------------------------------------- per level
#
# Under [objective] kind = "schedule" the sampler also looks for plateaus on each concurrency
# level's own score: its log-speedup over the baseline, from the trial's "measured" attr and the
# study's "baseline" attr, as the search writes them. The objectives below record what each
# trial measured at C=1 and C=64 and score the mean of the two log-speedups (equal weights).

REPO = Path(__file__).resolve().parents[3]
LEVEL_BASE = {1: 100.0, 64: 1000.0}


def c1_climbs_on(steps: int) -> float:
    """C=1: the seed's climb, 4 -> 5 flat (+1.8%), then it climbs again: 332 tok/s at 10."""
    tok_s = SEED_TOK_S.get(steps, 282.0 + 10.0 * (steps - 5))
    return math.log(tok_s / 123.0)


def c64_peaks_at_4(steps: int) -> float:
    """C=64: a clear peak at steps 4 (a longer draft costs a full batch more than it gains)."""
    return {1: 0.0, 2: 0.30, 3: 0.45, 4: 0.50, 5: 0.40}.get(steps, 0.40 - 0.1 * (steps - 5))


def c64_flat_2_3(steps: int) -> float:
    """C=64: flat 2 -> 3 (+1.0%), falling beyond."""
    return {1: 0.0, 2: 0.50, 3: 0.51, 4: 0.30, 5: 0.20}.get(steps, 0.20 - 0.1 * (steps - 5))


ESCAPE_AT_C1 = {1: c1_climbs_on, 64: c64_peaks_at_4}
BOTH_FLAT = {1: seed_steps, 64: c64_flat_2_3}


def level_objective(curves: Mapping[int, Callable[[int], float]],
                    missing: Callable[[int], tuple[int, ...]] = lambda steps: (),
                    ) -> Callable[[optuna.Trial], float]:
    """Each level's log-speedup by steps (topk costs every level alike); `missing(steps)`: the
    levels a trial at those steps did not measure (a suspect level, left out as the search
    leaves it out)."""

    def objective(trial: optuna.Trial) -> float:
        steps = trial.suggest_int(STEPS, 1, 16)
        topk = trial.suggest_categorical(TOPK, [1, 2, 4])
        logs = {c: f(steps) + TOPK_EFFECT[topk] for c, f in curves.items()}
        trial.set_user_attr(MEASURED_ATTR, measured_attr(
            status="ok", params=trial.params,
            levels=[{"concurrency": c, "output_tok_s": LEVEL_BASE[c] * math.exp(x)}
                    for c, x in logs.items() if c not in missing(steps)]))
        return sum(logs.values()) / len(logs)

    return objective


def with_baseline(study: optuna.Study) -> optuna.Study:
    study.set_user_attr(BASELINE_ATTR, baseline_attr(
        levels=[{"concurrency": c, "output_tok_s": v} for c, v in LEVEL_BASE.items()],
        weights={c: 1.0 for c in LEVEL_BASE}))
    return study


def level_study(per_level: bool = True, seed: int = 0) -> optuna.Study:
    return with_baseline(new_study(PlateauEscapeSampler(seed=seed, per_level=per_level)))


def outcomes(study: optuna.Study) -> list[tuple[Any, ...]]:
    return [(e.get("level"), e["plateau_to"], e["jump_to"], e["outcome"]) for e in events(study)]


def test_per_level_probes_the_plateau_of_c1_that_the_score_does_not_show() -> None:
    study = level_study()
    sweep(study)
    study.optimize(level_objective(ESCAPE_AT_C1), n_trials=5 + 1)

    # The score peaks at steps 4 (C=64 falls 4 -> 5 by far more than C=1 gains), so it has no
    # plateau; C=1's own curve is flat 4 -> 5 around C=1's incumbent, steps 5.
    scores = [t.value for t in study.trials[:5]]
    assert max(range(5), key=lambda i: scores[i]) == 3
    [event] = events(study)
    jump = study.trials[5]
    reason = ("plateau at C=1 on speculative_num_steps: 4 -> 5 gained +1.8% (noise band "
              "+-2.5%); jumping to 10")
    assert jump.params == {STEPS: 10, TOPK: 1}
    assert jump.user_attrs[JUMP_REASON_ATTR] == reason == event["reason"]
    assert event["level"] == 1 and event["baseline_tok_s"] == LEVEL_BASE[1]
    assert event["incumbent_trial"] == 4  # C=1's own incumbent (steps 5), not the score's (4)
    assert event["incumbent_value"] == pytest.approx(c1_climbs_on(5))
    assert event["gain"] == pytest.approx(math.log(282 / 277))
    # Resolved on C=1's value: C=1 climbs +17.7% at steps 10 while the score falls by far more
    # than the band (C=64 collapses there): escaped at C=1.
    assert jump.value < scores[3] - 0.1
    assert event["value"] == pytest.approx(c1_climbs_on(10))
    assert event["delta"] == pytest.approx(math.log(332 / 282))
    assert event["outcome"] == "escaped" == jump.user_attrs[JUMP_OUTCOME_ATTR]
    assert event["verdict"] == (
        "C=1: escaped the plateau at speculative_num_steps=5; "
        "probe at speculative_num_steps=10: +17.7% (noise band +-2.5%)")
    json.dumps(study.user_attrs[EVENTS_ATTR])


def test_scalar_mode_ignores_the_levels_and_searches_as_before() -> None:
    def trace(study: optuna.Study) -> list[tuple[Any, ...]]:
        return [(t.params, t.value, t.user_attrs.get(JUMP_REASON_ATTR)) for t in study.trials]

    # The same data, with and without what each level measured and the baseline.
    scalar = level_study(per_level=False, seed=4)
    sweep(scalar)
    scalar.optimize(level_objective(ESCAPE_AT_C1), n_trials=25)
    bare = new_study(PlateauEscapeSampler(seed=4))
    sweep(bare)
    bare.optimize(level_objective(ESCAPE_AT_C1), n_trials=25)

    assert trace(scalar) == trace(bare)
    assert events(scalar) == events(bare)
    assert JUMP_REASON_ATTR not in scalar.trials[5].user_attrs  # the score has no plateau
    assert all(e["level"] is None and "C=" not in e["reason"] for e in events(scalar))


def test_levels_go_lowest_first_then_the_score_and_each_is_blocked_on_its_own() -> None:
    study = level_study()
    sweep(study)
    study.optimize(level_objective(BOTH_FLAT), n_trials=5 + 30)

    # C=1 flat 4 -> 5 (jump to 10), C=64 flat 2 -> 3 (jump to 6), the score flat 3 -> 4 (jump
    # to 8): one probe each, in that order, each a peak on its own scale; C=1's peak blocks
    # neither C=64's plateau nor the score's, and nothing is probed again in 30 trials.
    assert outcomes(study) == [(1, 5, 10, "peak"), (64, 3, 6, "peak"), (None, 4, 8, "peak")]
    assert [e["trial_number"] for e in events(study)] == [5, 6, 7]
    c1, c64, score = events(study)
    assert study.trials[6].params == {STEPS: 6, TOPK: 1}
    assert c64["reason"] == ("plateau at C=64 on speculative_num_steps: 2 -> 3 gained +1.0% "
                             "(noise band +-2.5%); jumping to 6")
    assert c64["verdict"].startswith(
        "C=64: speculative_num_steps=2..3 (best at 3) is a peak; "
        "probe at speculative_num_steps=6: ")
    assert c64["delta"] == pytest.approx(c64_flat_2_3(6) - c64_flat_2_3(3))
    assert score["reason"].startswith("plateau on speculative_num_steps: 3 -> 4")
    assert score["verdict"].startswith("speculative_num_steps=3..4 (best at 3) is a peak")
    assert score["baseline_tok_s"] is None


def test_blocked_holds_per_axis_direction_and_level() -> None:
    old = {"axis": STEPS, "direction": "up", "incumbent_value": 0.8}      # before levels: the
    at_1 = {**old, "level": 1}                                            # score's
    for events_, level, expected in [
        ([at_1], 1, True), ([at_1], 64, False), ([at_1], None, False),
        ([old], None, True), ([old], 1, False),
    ]:
        assert blocked(STEPS, "up", 0.81, 1.0, 0.025, events_, level=level) is expected
    assert not blocked(STEPS, "down", 0.81, 1.0, 0.025, [at_1], level=1)
    assert not blocked(MEM, "up", 0.81, 1.0, 0.025, [at_1], level=1)
    assert not blocked(STEPS, "up", 0.90, 1.0, 0.025, [at_1], level=1)  # a higher plateau


def test_a_level_probe_that_did_not_measure_its_level_has_failed() -> None:
    # The probe's C=1 window was suspect (left out of what it measured): no C=1 value to judge.
    study = level_study()
    sweep(study)
    study.optimize(level_objective(ESCAPE_AT_C1, missing=lambda s: (1,) if s == 10 else ()),
                   n_trials=6)
    [event] = events(study)
    assert (event["level"], event["outcome"], event["value"]) == (1, "failed", None)
    assert event["verdict"] == (
        "C=1: probe at speculative_num_steps=10 ended COMPLETE without a measurement at C=1; "
        "not probed again from speculative_num_steps=5")


def test_without_a_baseline_per_level_mode_probes_the_score_only() -> None:
    study = new_study(PlateauEscapeSampler(seed=0, per_level=True))
    sweep(study)
    study.optimize(level_objective(BOTH_FLAT), n_trials=7)
    assert outcomes(study) == [(None, 4, 8, "peak")]


def test_an_event_from_before_levels_loads_resolves_and_blocks_as_the_scores() -> None:
    study = level_study(per_level=False)
    sweep(study)
    objective = level_objective(BOTH_FLAT)
    study.optimize(objective, n_trials=5)
    trial = study.ask()  # scalar mode: the score's jump (3 -> 4, to 8)
    # Written by an older version: no level, no baseline; told while another sampler ran, so
    # it is resolved by the next decision (`_resolve_stale`).
    old = [{k: v for k, v in e.items() if k not in ("level", "baseline_tok_s")}
           for e in events(study)]
    study.set_user_attr(EVENTS_ATTR, old)
    study.sampler = optuna.samplers.RandomSampler(seed=0)
    study.tell(trial, objective(trial))
    assert events(study)[0]["outcome"] is None

    study.sampler = PlateauEscapeSampler(seed=0, per_level=True)
    study.optimize(objective, n_trials=20)
    first = events(study)[0]
    assert "level" not in first and first["outcome"] == "peak"
    assert first["verdict"].startswith("speculative_num_steps=3..4 (best at 3) is a peak")
    # The levels are probed; the score's plateau is not probed again.
    assert outcomes(study) == [(None, 4, 8, "peak"), (1, 5, 10, "peak"), (64, 3, 6, "peak")]


def test_per_level_pickled_mid_study_continues_exactly_as_an_uninterrupted_run() -> None:
    whole = level_study(seed=7)
    sweep(whole)
    whole.optimize(level_objective(BOTH_FLAT), n_trials=25)

    first = level_study(seed=7)
    sweep(first)
    first.optimize(level_objective(BOTH_FLAT), n_trials=6)  # C=1's probe resolved, C=64's next
    assert outcomes(first) == [(1, 5, 10, "peak")]
    resumed: optuna.Study = pickle.loads(pickle.dumps(first))
    assert isinstance(resumed.sampler, PlateauEscapeSampler) and resumed.sampler.per_level
    resumed.optimize(level_objective(BOTH_FLAT), n_trials=19)

    assert _trace(resumed) == _trace(whole)
    assert events(resumed) == events(whole)
    assert len(events(whole)) == 3


def test_a_sampler_pickled_before_per_level_mode_unpickles_as_scalar() -> None:
    sampler = PlateauEscapeSampler(seed=0, per_level=True)
    del sampler.__dict__["_per_level"]
    assert pickle.loads(pickle.dumps(sampler)).per_level is False


def test_hybrid_passes_per_level_to_its_plateau_probe_and_its_outlook_names_the_level() -> None:
    assert HybridSampler(seed=0).plateau.per_level is False
    study = with_baseline(new_study(HybridSampler(seed=0, per_level=True)))
    assert study.sampler.plateau.per_level  # type: ignore[attr-defined]
    sweep(study)
    objective = level_objective(ESCAPE_AT_C1)
    study.optimize(objective, n_trials=5)
    assert study.sampler.outlook(study) == {  # type: ignore[attr-defined]
        "by": "plateau", "why": "a plateau at C=1 on speculative_num_steps is not probed yet"}
    study.optimize(objective, n_trials=1)
    jump = study.trials[5]
    assert jump.params == {STEPS: 10, TOPK: 1}
    assert jump.user_attrs[DECISION_ATTR] == {"by": "plateau",
                                              "why": jump.user_attrs[JUMP_REASON_ATTR]}
    assert jump.user_attrs[JUMP_REASON_ATTR].startswith("plateau at C=1 on ")
    assert events(study)[0]["outcome"] == "escaped"


@pytest.mark.parametrize("experiment, per_level", [("sim-schedule", True),
                                                   ("sim-default", False)])
def test_the_search_sets_per_level_for_a_schedule_objective(experiment: str,
                                                            per_level: bool) -> None:
    exp = load_experiment(REPO / "experiments" / f"{experiment}.toml")
    assert (exp.objective.kind == "schedule") is per_level
    assert make_sampler("plateau", exp, 0).per_level is per_level
    assert make_sampler("hybrid", exp, 0).plateau.per_level is per_level


# ---------------------------------------------------------------------------- the bracket


def _flat_after_5(trial: optuna.Trial) -> float:
    # A plateau from 5 on whose far end (10) measures within noise of it.
    steps = trial.suggest_int(STEPS, 1, 16)
    trial.suggest_categorical(TOPK, [1])
    return seed_steps(min(steps, 5)) + (0.005 if steps > 5 else 0.0)


def test_a_jump_that_came_back_no_better_is_bracketed_once_in_the_middle() -> None:
    study = new_study(HybridSampler(seed=2))
    sweep(study)
    study.optimize(_flat_after_5, n_trials=6)       # the sweep, then the jump
    [event] = steps_events(study)
    assert (event["plateau_to"], event["jump_to"], event["outcome"]) == (5, 10, "within_noise")
    # Before it is booted the plateau question is open: the stop rule does not stop.
    outlook = study.sampler.outlook(study)  # type: ignore[attr-defined]
    assert outlook["by"] == "plateau" and outlook["why"].startswith("bracket: ")
    study.optimize(_flat_after_5, n_trials=1)
    bracket = study.trials[6]
    assert bracket.params == {STEPS: 7, TOPK: 1}
    why = bracket.user_attrs[DECISION_ATTR]
    assert why["by"] == "plateau"
    assert "speculative_num_steps 6..9 is unmeasured" in why["why"]
    assert "within noise of the incumbent (+0.5%)" in why["why"]
    [event] = steps_events(study)
    assert (event["bracket_trial"], event["bracket_at"]) == (6, 7)
    # Asked once: later trials are not brackets of the same jump.
    study.optimize(_flat_after_5, n_trials=4)
    later = [t.user_attrs.get(DECISION_ATTR, {}).get("why", "") for t in study.trials[7:]]
    assert not any(w.startswith("bracket: ") for w in later)


def test_no_bracket_where_the_stretch_was_measured_or_too_short() -> None:
    # Steps 7 measured (someone's own point) after the jump to 10 came back: the stretch
    # 6..9 is not unmeasured.
    study = new_study(HybridSampler(seed=2))
    sweep(study)
    study.optimize(_flat_after_5, n_trials=6)
    assert [(e["plateau_to"], e["jump_to"]) for e in steps_events(study)] == [(5, 10)]
    study.enqueue_trial({STEPS: 7, TOPK: 1})
    study.optimize(_flat_after_5, n_trials=3)
    assert all(not t.user_attrs.get(DECISION_ATTR, {}).get("why", "").startswith("bracket: ")
               for t in study.trials)
    assert all("bracket_trial" not in e for e in events(study))

    # A jump from 14 to 16 leaves one value between: nothing to bisect.
    def flat_after_14(trial: optuna.Trial) -> float:
        steps = trial.suggest_int(STEPS, 1, 16)
        trial.suggest_categorical(TOPK, [1])
        return 0.1 * min(steps, 13) + (0.001 if steps >= 14 else 0.0)

    short = new_study(HybridSampler(seed=2))
    sweep(short, values=(10, 11, 12, 13, 14))
    short.optimize(flat_after_14, n_trials=9)
    assert any(e["jump_to"] == 16 for e in steps_events(short))
    assert all("bracket_trial" not in e for e in events(short))


def test_the_search_shows_why_the_bracket_is_booted(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    from types import SimpleNamespace

    from specdecode_tune.search.progress import Progress
    from specdecode_tune.search.searcher import BRACKET_KEY, ProposalSpace
    from specdecode_tune.space import ParamSpec

    study = new_study(HybridSampler(seed=2))
    sweep(study)
    study.optimize(_flat_after_5, n_trials=6)
    space = ProposalSpace((ParamSpec(STEPS, "int", low=1, high=16),
                           ParamSpec(TOPK, "categorical", choices=(1,))), {}, "hybrid")
    trial = study.ask()
    config = {**(space(trial) or {}), **trial.params}
    assert config[STEPS] == 7
    assert config[BRACKET_KEY].startswith("bracket: the jump on speculative_num_steps to 10 ")
    progress = Progress(load_experiment(Path("experiments/sim-default.toml")), total=16)
    progress.on_trial_start(0, [], SimpleNamespace(trial_id="t7", config=config))
    assert "[plateau bracket: the jump on speculative_num_steps to 10 " in capsys.readouterr().out
