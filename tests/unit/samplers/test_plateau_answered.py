"""Plateau questions the model answers without a boot (`samplers.answered`), and the rules that
send a question to a boot instead: too few checked predictions, errors on this run over the
band, nothing shown at the jump's value, a climb the draws cannot rule out."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution

from specdecode_tune.samplers import BASELINE_ATTR, baseline_attr, measured_attr
from specdecode_tune.samplers import answered as answers
from specdecode_tune.samplers.observations import PREDICTED_ATTR

STEPS, TOPK = "speculative_num_steps", "speculative_eagle_topk"
BASE = {1: 100.0, 16: 1000.0}
BAND = 0.025


class Model:
    """A stand-in for the fitted model: its joint draws are set by the test."""

    def __init__(self, diff: np.ndarray, rms: float = 0.02) -> None:
        self.diff, self.rms, self.asked = diff, rms, 0

    def fit_limit(self, study: Any) -> float:
        return 0.08

    def pair_draws(self, study: Any, a: dict, b: dict, **_: Any) -> Any:
        self.asked += 1
        n = len(self.diff)
        fit = type("Fit", (), {"rms": self.rms})()
        levels = {c: np.stack([np.full(n, 1.0) + self.diff, np.full(n, 1.0)], axis=1)
                  for c in BASE}
        scores = np.stack([self.diff, np.zeros(n)], axis=1)
        return fit, levels, scores, np.ones((n, 2), dtype=bool)


def _study(points: list[tuple[int, float, float]]) -> optuna.Study:
    """A study of boots at steps s whose prediction erred by `err` (log, every level) and
    whose score is `score`; the baseline and its weights as the search sets them."""
    study = optuna.create_study(direction="maximize")
    study.set_user_attr(BASELINE_ATTR, baseline_attr(
        levels=[{"concurrency": c, "output_tok_s": v} for c, v in BASE.items()],
        weights={c: 1.0 for c in BASE}))
    for steps, err, score in points:
        measured = {c: v * math.exp(score) for c, v in BASE.items()}
        params = {STEPS: steps, TOPK: 1}
        study.add_trial(optuna.trial.create_trial(
            params=params,
            distributions={STEPS: IntDistribution(1, 12), TOPK: CategoricalDistribution([1, 2])},
            value=score,
            user_attrs={
                "measured": measured_attr(status="ok", params=params, levels=[
                    {"concurrency": c, "output_tok_s": v} for c, v in measured.items()]),
                PREDICTED_ATTR: {"tok_s": {str(c): v * math.exp(err)
                                           for c, v in measured.items()}},
            }))
    return study


def _ask(study: optuna.Study, model: Model, jump_to: int = 10,
         level: int | None = None) -> answers.Answer:
    return answers.answer(model, study, study.get_trials(), STEPS, "up", jump_to,
                          {STEPS: 5, TOPK: 1}, level, BAND)  # type: ignore[arg-type]


def test_the_model_answers_where_it_was_shown_right_there_and_rules_the_climb_out() -> None:
    study = _study([(3, 0.01, 0.2), (4, 0.005, 0.25), (5, 0.01, 0.3), (11, 0.01, 0.1)])
    model = Model(np.full(200, -0.1))
    ans = _ask(study, model)
    assert ans.by_model and ans.p_climb == 0.0 and ans.delta == pytest.approx(-0.1)
    assert "probability 0%" in ans.why and "at speculative_num_steps=10 or beyond" in ans.why


def test_nothing_measured_at_the_jump_or_beyond_sends_the_question_to_a_boot() -> None:
    """The seed's 4 -> 10 question: the model never predicted a boot that deep, so its answer
    there is an extrapolation, whatever its draws say."""
    study = _study([(3, 0.01, 0.2), (4, 0.005, 0.25), (5, 0.01, 0.3), (9, 0.01, 0.1)])
    model = Model(np.full(200, -0.1))
    ans = _ask(study, model)
    assert not ans.by_model and "nothing has shown the model right at" in ans.why
    assert model.asked == 0


@pytest.mark.parametrize(("points", "said"), [
    ([(3, 0.01, 0.2), (11, 0.01, 0.1)], "fewer than 3"),
    ([(3, 0.05, 0.2), (4, 0.04, 0.25), (5, 0.06, 0.3), (11, 0.01, 0.1)],
     "larger than the noise band"),
    ([(3, 0.01, 0.2), (4, 0.005, 0.25), (5, 0.01, 0.3), (11, 0.04, 0.1)],
     "the model missed trial 3"),
])
def test_errors_on_this_run_send_the_question_to_a_boot(points: list, said: str) -> None:
    ans = _ask(_study(points), Model(np.full(200, -0.1)))
    assert not ans.by_model and said in ans.why


def test_a_climb_the_draws_cannot_rule_out_is_booted() -> None:
    study = _study([(3, 0.01, 0.2), (4, 0.005, 0.25), (5, 0.01, 0.3), (11, 0.01, 0.1)])
    diff = np.full(200, -0.1)
    diff[:20] = 0.05                      # 10% of the draws climb beyond the band
    ans = _ask(study, Model(diff))
    assert not ans.by_model and ans.p_climb == pytest.approx(0.1)
    assert "cannot rule out a climb" in ans.why
    diff[:20], diff[:5] = -0.1, 0.05      # 2.5%: ruled out
    assert _ask(study, Model(diff)).by_model


def test_a_poor_fit_is_booted_and_a_level_question_reads_that_level() -> None:
    study = _study([(3, 0.01, 0.2), (4, 0.005, 0.25), (5, 0.01, 0.3), (11, 0.01, 0.1)])
    assert not _ask(study, Model(np.full(200, -0.1), rms=0.2)).by_model
    assert _ask(study, Model(np.full(200, -0.1)), level=16).by_model


def test_the_score_error_is_the_levels_errors_weighted_as_the_score_weighs_them() -> None:
    study = _study([(3, 0.01, 0.2)])
    [(_, err)] = answers.errors(study.get_trials(), None, {c: 1.0 for c in BASE})
    assert err == pytest.approx(0.01)
    assert answers.errors(study.get_trials(), 16)[0][1] == pytest.approx(0.01)


def test_a_later_boot_off_its_prediction_beyond_the_edge_contradicts_the_answer() -> None:
    study = _study([(3, 0.01, 0.2), (4, 0.005, 0.25), (5, 0.01, 0.3), (11, 0.01, 0.1),
                    (2, 0.1, 0.0), (7, 0.1, 0.3)])
    event = {"axis": STEPS, "level": None, "noise_band": BAND, "answered_at": 3,
             "plateau_to": 5, "direction": "up"}
    weights = {c: 1.0 for c in BASE}
    # Trial 4 (steps 2) missed by 10% but below the plateau; trial 5 (steps 7) beyond it.
    why = answers.contradiction(event, study.get_trials(), weights)
    assert why is not None and why.startswith("trial 5 at speculative_num_steps=7")
    event["answered_at"] = 5
    assert answers.contradiction(event, study.get_trials(), weights) is None


# ---------------------------------------------------------------------- in the hybrid sampler

def _hybrid_study(monkeypatch: pytest.MonkeyPatch, says: list[answers.Answer]
                  ) -> optuna.Study:
    """The seed's hand sweep 1..5 (a plateau at 4..5) under the hybrid sampler, the model's
    answers to plateau questions set by the test (`says`, in turn)."""
    from specdecode_tune.samplers import HybridSampler

    calls = iter(says)
    monkeypatch.setattr(answers, "answer", lambda *a, **k: next(calls))
    study = optuna.create_study(direction="maximize", sampler=HybridSampler(seed=0))
    for s in (1, 2, 3, 4, 5):
        study.enqueue_trial({STEPS: s, TOPK: 1})
    return study


def _seed(trial: optuna.Trial) -> float:
    steps = trial.suggest_int(STEPS, 1, 12)
    trial.suggest_categorical(TOPK, [1])
    # Climbs to 4, +1% to 5 (inside the 2.5% band: a plateau), falls beyond.
    return math.log(1.0 + min(steps, 4)) + {5: 0.01}.get(steps, -0.1 if steps > 5 else 0.0)


def test_the_hybrid_records_the_models_answer_on_the_trial_it_plans_and_boots_no_jump(
        monkeypatch: pytest.MonkeyPatch) -> None:
    said = answers.Answer(True, "ruled out", 0.01, -0.05)
    study = _hybrid_study(monkeypatch, [said] * 50)
    study.optimize(_seed, n_trials=6)
    [event] = [e for e in study.user_attrs["plateau_events"] if e["axis"] == STEPS]
    assert event["outcome"] == answers.PREDICTED and event["trial_number"] is None
    assert event["answered_at"] == 5 and event["p_climb"] == 0.01
    assert "answered by the model without a boot: ruled out" in event["verdict"]
    sixth = study.trials[5]
    assert sixth.params[STEPS] != 10                    # no jump booted
    assert sixth.user_attrs[answers.PLATEAU_ANSWER_ATTR] == [event["verdict"]]
    outlook = study.sampler.outlook(study)  # type: ignore[attr-defined]
    assert outlook["by"] != "plateau"                   # the question is answered


def test_the_hybrid_boots_the_jump_where_the_model_cannot_answer_and_says_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    study = _hybrid_study(monkeypatch, [answers.Answer(False, "nothing shown there")] * 50)
    assert study.sampler.outlook(study)["by"] != "plateau"  # type: ignore[attr-defined]
    study.optimize(_seed, n_trials=6)
    jump = study.trials[5]
    assert jump.params[STEPS] == 10
    assert jump.user_attrs["jump_reason"].endswith("(booted: nothing shown there)")


def test_a_model_answer_is_checked_by_one_boot_once_the_model_no_longer_answers_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ok = answers.Answer(True, "ruled out", 0.01, -0.05)
    # Answered while trial 5 is planned; the re-ask before trial 6 finds it open again.
    study = _hybrid_study(monkeypatch, [ok, answers.Answer(False, "a climb is possible")]
                          + [ok] * 50)
    study.optimize(_seed, n_trials=7)
    check = study.trials[6]
    assert check.params[STEPS] == 10
    assert check.user_attrs["jump_reason"].startswith("check of the model's answer (")
    [event] = [e for e in study.user_attrs["plateau_events"] if e["axis"] == STEPS]
    assert event["trial_number"] == 6 and event["outcome"] in ("peak", "within_noise")
    assert "a climb is possible" in event["check"] and event["model_verdict"]
    study.optimize(_seed, n_trials=3)                   # checked once, not again
    assert sum(1 for t in study.trials if "jump_reason" in t.user_attrs) == 1
