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
    first_valid_point,
    invalid_reason,
    max_draft_tokens,
    resolve,
)


def test_topk_one_derives_draft_tokens() -> None:
    assert resolve({STEPS: 4}, {}) == {STEPS: 4, TOPK: 1, DRAFT: 5}
    # a draft count given with topk = 1 is overridden, as SGLang does
    assert resolve({STEPS: 4, TOPK: 1, DRAFT: 9}, {})[DRAFT] == 5


def test_fixed_flags_fill_in_and_sampled_values_win() -> None:
    p = resolve({STEPS: 3, TOPK: 2}, {"mem_fraction_static": 0.8, DRAFT: 6, STEPS: 9})
    assert p == {"mem_fraction_static": 0.8, STEPS: 3, TOPK: 2, DRAFT: 6}
    assert resolve({STEPS: 3, TOPK: 4}, {})[DRAFT] == 13   # steps * topk + 1 when unsaid


def test_baseline_carries_no_triple() -> None:
    p = resolve({STEPS: 0, TOPK: 4, DRAFT: 8}, {"mem_fraction_static": 0.8})
    assert p == {"mem_fraction_static": 0.8, STEPS: 0}
    assert invalid_reason(p) is None


@pytest.mark.parametrize("params,words", [
    ({STEPS: 2, TOPK: 2, DRAFT: 8}, "> 7: SGLang's draft tree"),
    ({STEPS: 3, TOPK: 4, DRAFT: 38}, "has topk + (steps - 1) * topk^2 = 36 candidates"),
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
            assert 2 <= trial.params[DRAFT] <= max_draft_tokens(params[STEPS], params[TOPK])
        assert invalid_reason(params) is None
        study.tell(trial, 0.0)
    assert seen_topk == {1, 2, 4}


def test_the_draft_limit_is_sglangs_candidate_pool() -> None:
    # SGLang's draft tree: topk candidates at the first step, topk^2 at each later one; it
    # keeps draft tokens - 1 of them (eagle_utils.organize_draft_results). topk 1: a chain.
    assert [max_draft_tokens(s, 1) for s in (1, 2, 5)] == [2, 3, 6]
    assert max_draft_tokens(1, 4) == 5 and max_draft_tokens(2, 2) == 7
    assert max_draft_tokens(3, 4) == 37
    # Points the old `steps * topk + 1` grid rule (bench_speculative.py) refused are booted.
    for steps, topk, draft in ((2, 2, 7), (3, 4, 16), (7, 2, 16)):
        assert draft > steps * topk + 1
        assert invalid_reason({STEPS: steps, TOPK: topk, DRAFT: draft}) is None
    assert invalid_reason({STEPS: 2, TOPK: 2, DRAFT: 8}) is not None


def test_first_valid_point_uses_the_tree_limit() -> None:
    # steps 1, topk 2 holds at most 3 draft tokens; steps 2, topk 2 holds 7, which the old
    # rule (5) would have refused.
    space = (ParamSpec(STEPS, "int", 1, 2), ParamSpec(TOPK, "categorical", choices=(2,)),
             ParamSpec(DRAFT, "int", 6, 16))
    assert first_valid_point(space, {}) == {STEPS: 2, TOPK: 2, DRAFT: 6}
    space = (ParamSpec(STEPS, "int", 1, 2), ParamSpec(TOPK, "categorical", choices=(2,)),
             ParamSpec(DRAFT, "categorical", choices=(8, 9)))
    assert first_valid_point(space, {}) is None
