"""SGLang's rules for the speculative triple, and the define-by-run space."""

from __future__ import annotations

import optuna
import pytest

from specdecode_tune.space import (
    DRAFT,
    STEPS,
    TOPK,
    DefineByRun,
    ParamSpec,
    invalid_reason,
    resolve,
)


def test_topk_one_derives_draft_tokens() -> None:
    assert resolve({STEPS: 4}, {}) == {STEPS: 4, TOPK: 1, DRAFT: 5}
    # a draft count given with topk = 1 is overridden, as SGLang does
    assert resolve({STEPS: 4, TOPK: 1, DRAFT: 9}, {})[DRAFT] == 5


def test_fixed_flags_fill_in_and_sampled_values_win() -> None:
    p = resolve({STEPS: 3, TOPK: 2}, {"mem_fraction_static": 0.8, DRAFT: 6, STEPS: 9})
    assert p == {"mem_fraction_static": 0.8, STEPS: 3, TOPK: 2, DRAFT: 6}
    assert resolve({STEPS: 3, TOPK: 4}, {})[DRAFT] == 13   # the whole tree when unsaid


def test_baseline_carries_no_triple() -> None:
    p = resolve({STEPS: 0, TOPK: 4, DRAFT: 8}, {"mem_fraction_static": 0.8})
    assert p == {"mem_fraction_static": 0.8, STEPS: 0}
    assert invalid_reason(p) is None


@pytest.mark.parametrize("params,words", [
    ({STEPS: 2, TOPK: 2, DRAFT: 6}, "> steps * topk + 1 = 5"),
    ({STEPS: 2, TOPK: 2, DRAFT: 1}, ">= 2"),
    ({STEPS: 2, TOPK: 2}, "set together"),
    ({STEPS: 2, TOPK: 1, DRAFT: 3, "mem_fraction_static": 1.5}, "(0, 1]"),
])
def test_invalid_points_are_named(params: dict, words: str) -> None:
    reason = invalid_reason(params)
    assert reason is not None and words in reason


def test_define_by_run_never_samples_draft_with_topk_one_and_respects_the_tree() -> None:
    space = (ParamSpec(STEPS, "int", 1, 6), ParamSpec(TOPK, "categorical", choices=(1, 2, 4)),
             ParamSpec(DRAFT, "int", 2, 16))
    fn = DefineByRun(space, {})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen_topk = set()
    for _ in range(60):
        trial = study.ask()
        constants = fn(trial) or {}
        params = resolve({**trial.params, **constants}, {})
        seen_topk.add(params[TOPK])
        if params[TOPK] == 1:
            assert DRAFT not in trial.params and params[DRAFT] == params[STEPS] + 1
        else:
            assert 2 <= trial.params[DRAFT] <= params[STEPS] * params[TOPK] + 1
        assert invalid_reason(params) is None
        study.tell(trial, 0.0)
    assert seen_topk == {1, 2, 4}
