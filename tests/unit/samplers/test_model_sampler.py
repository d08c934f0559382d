"""ModelGuidedSampler: the fit recovers known coefficients, and the sampler uses it (pure: no
servers, no simulator, no Ray cluster).

The synthetic server below follows the model's own physics with chosen coefficients, so a fit
can be checked against the truth; a second one does not (its tok/s are noise), so the handover
to the base sampler can be checked too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
import pytest

from specdecode_tune.records import GRAPH_MEMORY, MEMORY_ROOM, LevelSummary, ServerFacts
from specdecode_tune.samplers.model import (
    BASELINE_ATTR,
    DECISION_ATTR,
    H_GRID,
    MEASURED_ATTR,
    PRIOR_SHRINK,
    LevelObs,
    ModelGuidedSampler,
    StepRows,
    TrialObs,
    accept_length,
    baseline_attr,
    enumerate_space,
    fit_acceptance,
    fit_kv,
    fit_model,
    fit_step,
    measured_attr,
    parse_baseline,
    parse_measured,
    ruled_out,
    score_draws,
    step_features,
    tree_widths,
)
from specdecode_tune.space import (
    DRAFT,
    MEM,
    STEPS,
    TOPK,
    DefineByRun,
    ParamSpec,
    invalid_reason,
    resolve,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)

P_TRUE = (0.95, 0.9, 0.85, 0.8, 0.4, 0.35, 0.3, 0.25, 0.2, 0.2)
H_TRUE = 0.3
KV_TRUE = (7.16e6, 5.8e6, 79_713.0)            # a, b, c: kv = a * mem - b - c * n
RESERVE = 17_300
BASE_KV = 455_357
THETA = np.array([0.010, 0.012, 8e-5, 0.004, 2e-4, 4e-5, 7e-5])
TILE, ROUTE = 8, 0.03
LEVELS = (1, 16, 32, 64)

SPACE = (
    ParamSpec(STEPS, "int", low=1, high=8),
    ParamSpec(TOPK, "categorical", choices=(1, 2, 4)),
    ParamSpec(DRAFT, "int", low=2, high=10),
    ParamSpec(MEM, "float", low=0.84, high=0.92, step=0.02),
)


def exact_histogram(q: list[float], steps: int, rng: np.random.Generator) -> list[int]:
    at_least = np.cumprod([1.0, *q])
    exact = np.maximum(at_least - np.append(at_least[1:], 0.0), 0.0)
    return rng.multinomial(steps, exact / exact.sum()).tolist()


def tree_q(p: tuple[float, ...], h: float, steps: int, topk: int, draft: int) -> list[float]:
    widths = tree_widths(p, h, steps, topk, draft - 1)[-1]
    return [1.0 - (1.0 - p[i]) * (1.0 - h) ** (w - 1) for i, w in enumerate(widths)]


def obs(steps: int, topk: int, draft: int, mem: float = 0.9, hists: list[list[int]] = (),
        kv: int | None = None, limit: int | None = None, feasible: bool = True,
        failure: str | None = None) -> TrialObs:
    levels = tuple(LevelObs(c, 100.0, None, tuple(h)) for c, h in zip(LEVELS, hists))
    return TrialObs(steps, topk, draft, mem, feasible, failure, kv, limit, levels)


# ---------------------------------------------------------------------------------- the fit


def test_acceptance_recovers_per_position_probabilities_from_chain_histograms() -> None:
    rng = np.random.default_rng(0)
    trials = [obs(s, 1, s + 1, hists=[exact_histogram(list(P_TRUE[:s]), 3000, rng)
                                      for _ in LEVELS]) for s in (3, 6, 8)]
    fit = fit_acceptance(trials, depth=10)
    assert fit.measured_depth == 8
    np.testing.assert_allclose(fit.p_mean[:7], P_TRUE[:7], atol=0.04)
    # Position 8 was reached by few verify steps: the prior still pulls it a little.
    assert abs(fit.p_mean[7] - P_TRUE[7]) < 0.07
    # Positions no trial reached take the exchangeable prior: about the measured positions'
    # (count-weighted) acceptance, drawn PRIOR_SHRINK of the way to 0.5, and wide.
    n = fit.n_grid.sum(axis=1)
    m = (fit.p_grid * fit.n_grid).sum(axis=1) / n
    prior = float(np.dot(fit.h_post, (1 - PRIOR_SHRINK) * m + PRIOR_SHRINK * 0.5))
    np.testing.assert_allclose(fit.p_mean[8:], prior, atol=1e-9)
    assert 0.5 < prior < 0.8
    p, h = fit.draws(np.random.default_rng(1), 200)
    assert p.shape == (200, 10) and h.shape == (200,)
    assert p[:, 9].std() > 0.15 and p[:, 0].std() < 0.02


def test_acceptance_recovers_the_sibling_share_from_tree_histograms() -> None:
    rng = np.random.default_rng(1)
    trials = [obs(6, 1, 7, hists=[exact_histogram(list(P_TRUE[:6]), 3000, rng)
                                  for _ in LEVELS])]
    for steps, topk, draft in ((4, 2, 6), (5, 4, 9), (6, 4, 12), (3, 4, 10)):
        q = tree_q(P_TRUE, H_TRUE, steps, topk, draft)
        trials.append(obs(steps, topk, draft,
                          hists=[exact_histogram(q, 3000, rng) for _ in LEVELS]))
    fit = fit_acceptance(trials, depth=10)
    assert abs(fit.h_mean - H_TRUE) < 0.06
    np.testing.assert_allclose(fit.p_mean[:6], P_TRUE[:6], atol=0.05)
    # And the tree's tokens per step, predicted from the fit, are the true ones.
    for steps, topk, draft in ((5, 4, 9), (6, 2, 10)):
        true_l = 1.0 + np.cumprod(tree_q(P_TRUE, H_TRUE, steps, topk, draft)).sum()
        widths = tree_widths(fit.p_mean, fit.h_mean, steps, topk, draft - 1)[-1]
        pred = accept_length(fit.p_mean[None, :], np.array([fit.h_mean]), widths)[0]
        assert pred == pytest.approx(true_l, rel=0.03)


def test_acceptance_without_trees_leaves_the_sibling_share_unknown() -> None:
    rng = np.random.default_rng(2)
    fit = fit_acceptance([obs(4, 1, 5, hists=[exact_histogram(list(P_TRUE[:4]), 500, rng)])],
                         depth=6)
    np.testing.assert_allclose(fit.h_post, 1.0 / len(H_GRID))


def kv_of(mem: float, n: int) -> int:
    a, b, c = KV_TRUE
    return int(a * mem - b - c * n)


def test_kv_line_and_running_limit_are_recovered_from_server_facts() -> None:
    points = [(0.85, 2), (0.88, 5), (0.90, 4), (0.92, 8)]
    trials = [obs(n - 1, 1, n, mem=m, kv=kv_of(m, n), limit=kv_of(m, n) // RESERVE)
              for m, n in points]
    base = parse_baseline({"levels": {"1": {"output_tok_s": 90.0}},
                           "facts": {"max_total_num_tokens": BASE_KV,
                                     "max_running_requests": BASE_KV // RESERVE}})
    fit = fit_kv(trials, base)
    np.testing.assert_allclose(fit.mean, KV_TRUE, rtol=5e-3)
    assert fit.cap is None
    pairs = [(kv_of(m, n), kv_of(m, n) // RESERVE) for m, n in points]
    pairs.append((BASE_KV, BASE_KV // RESERVE))
    lo, hi = max(kv / (lim + 1) for kv, lim in pairs), min(kv / lim for kv, lim in pairs)
    assert lo < fit.reserve <= hi
    for m, n in ((0.88, 6), (0.91, 3), (0.92, 2)):
        kv = fit.kv(fit.mean[None, :], np.array([m]), np.array([float(n)]))[0]
        assert kv[0] == pytest.approx(kv_of(m, n), rel=5e-3)
        assert fit.limit(np.array([kv_of(m, n)]))[0] == kv_of(m, n) // RESERVE


def test_a_running_limit_set_by_a_flag_is_a_cap() -> None:
    trials = [obs(n - 1, 1, n, mem=m, kv=kv_of(m, n), limit=8)
              for m, n in ((0.85, 2), (0.9, 4), (0.92, 6))]
    base = parse_baseline({"levels": {"1": {"output_tok_s": 90.0}}})
    fit = fit_kv(trials, base)
    assert fit.cap == 8
    assert fit.limit(np.array([1e6]))[0] == 8


def test_a_speculative_limit_is_capped_by_the_speculative_boots_not_the_baseline() -> None:
    # SGLang lowers max_running_requests under speculation (48 where the flag is unset), so a
    # speculative boot runs min(flag, kv // r) while the baseline's limit follows its KV
    # (26 here, above the flag): the cap is the speculative boots', r is everyone's.
    flag = 20
    points = [(0.92, 3), (0.90, 3), (0.88, 3)]      # memory allows 31, 23, 15
    trials = [obs(n - 1, 1, n, mem=m, kv=kv_of(m, n), limit=min(flag, kv_of(m, n) // RESERVE))
              for m, n in points]
    base = parse_baseline({"levels": {"1": {"output_tok_s": 90.0}},
                           "facts": {"max_total_num_tokens": BASE_KV,
                                     "max_running_requests": BASE_KV // RESERVE}})
    assert flag < BASE_KV // RESERVE
    for measured in (trials, trials[:1]):
        # One boot at the flag is enough: the baseline's r says its KV allowed 31.
        fit = fit_kv(measured, base)
        assert fit.cap == flag
        for m, n in ((0.92, 2), (0.90, 4), (0.88, 3), (0.88, 4)):
            assert fit.limit(np.array([kv_of(m, n)]))[0] == min(flag, kv_of(m, n) // RESERVE)


def test_without_a_speculative_limit_the_baseline_s_is_kept() -> None:
    trials = [obs(n - 1, 1, n, mem=m, kv=kv_of(m, n)) for m, n in ((0.92, 3), (0.9, 2))]
    base = parse_baseline({"levels": {"1": {"output_tok_s": 90.0}},
                           "facts": {"max_total_num_tokens": BASE_KV,
                                     "max_running_requests": BASE_KV // RESERVE}})
    fit = fit_kv(trials, base)
    assert fit.limit(np.array([float(BASE_KV)]))[0] == BASE_KV // RESERVE


def step_rows(n_rows: int, noise: float, rng: np.random.Generator) -> StepRows:
    cols: dict[str, list[float]] = {k: [] for k in ("r", "n", "s", "k", "L", "spec", "t")}
    for c in LEVELS:      # the baseline
        r = float(min(c, 40))
        cols_add(cols, r, 1, 0, 1, 1.0, 0.0, noise, rng)
    while len(cols["t"]) < n_rows:
        s, k = int(rng.integers(1, 9)), int(rng.choice([1, 2, 4]))
        n = s + 1 if k == 1 else int(rng.integers(2, min(16, s * k + 1) + 1))
        for c in LEVELS:
            r = float(min(c, int(rng.integers(10, 50))))
            cols_add(cols, r, n, s, k, float(rng.uniform(1.5, 5.5)), 1.0, noise, rng)
    return StepRows(**{k: np.array(v) for k, v in cols.items()})


def cols_add(cols: dict[str, list[float]], r: float, n: int, s: int, k: int, L: float,
             spec: float, noise: float, rng: np.random.Generator) -> None:
    feats = step_features(np.array(r), np.array(float(n)), np.array(float(s)),
                          np.array(float(k)), np.array(L), np.array(spec), TILE, ROUTE)
    t = float(feats @ THETA) * math.exp(rng.normal(0.0, noise)) if noise else float(feats @ THETA)
    for name, v in zip(cols, (r, n, s, k, L, spec, t)):
        cols[name].append(float(v))


TYPICAL = np.array([1.0, 0.6, 160.0, 1.0, 5.0, 200.0, 60.0])


def test_step_time_fit_recovers_the_coefficients_tile_and_route() -> None:
    rows = step_rows(60, 0.0, np.random.default_rng(3))
    fit = fit_step(rows, TYPICAL, t_ref=0.011)
    assert (fit.tile, fit.route) == (TILE, ROUTE)
    np.testing.assert_allclose(fit.mean, THETA, rtol=0.03)
    assert fit.rms < 1e-3


def test_step_time_fit_with_noise_predicts_unseen_points() -> None:
    rng = np.random.default_rng(4)
    fit = fit_step(step_rows(80, 0.01, rng), TYPICAL, t_ref=0.011)
    held = step_rows(40, 0.0, np.random.default_rng(5))
    feats = step_features(held.r, held.n, held.s, held.k, held.L, held.spec, fit.tile, fit.route)
    err = np.abs(np.log(feats @ fit.mean / held.t))
    assert err.max() < 0.03
    assert fit.rms == pytest.approx(0.01, abs=0.004)


# ---------------------------------------------------------------------------------- a server


@dataclass(frozen=True)
class Server:
    """A synthetic server following the model's physics with known coefficients."""

    physical: bool = True

    def facts(self, mem: float, n: int) -> tuple[int, int] | None:
        kv = kv_of(mem, n)
        return (kv, kv // RESERVE) if kv >= RESERVE else None

    def tok_s(self, steps: int, topk: int, n: int, L: float, kv: float, limit: int,
              spec: bool) -> dict[int, float]:
        out = {}
        for c in LEVELS:
            r = float(min(c, limit, kv // 512))
            feats = step_features(np.array(r), np.array(float(n)), np.array(float(steps)),
                                  np.array(float(topk)), np.array(L),
                                  np.array(1.0 if spec else 0.0), TILE, ROUTE)
            out[c] = r * L / float(feats @ THETA)
        return out

    def baseline(self) -> dict[int, float]:
        return self.tok_s(0, 1, 1, 1.0, BASE_KV, BASE_KV // RESERVE, False)

    def measure(self, params: dict[str, Any], rng: np.random.Generator
                ) -> tuple[float | None, dict[str, Any]]:
        steps, topk, n, mem = params[STEPS], params[TOPK], params[DRAFT], params[MEM]
        facts = self.facts(mem, n)
        if facts is None:
            return None, measured_attr(status="infeasible", params=params,
                                       reason="kv_memory: RuntimeError: Not enough memory.")
        q = tree_q(P_TRUE, H_TRUE, steps, topk, n)
        L = 1.0 + float(np.cumprod(q).sum())
        tok = self.tok_s(steps, topk, n, L, *facts, spec=True)
        if not self.physical:     # a server the model cannot express
            key = zlib.crc32(json.dumps(params, sort_keys=True).encode())
            tok = {c: v * (0.3 + 1.4 * ((key >> (c % 16)) % 97) / 97) for c, v in tok.items()}
        levels = []
        for c, v in tok.items():
            v *= math.exp(rng.normal(0.0, 0.005))
            levels.append(LevelSummary(
                concurrency=c, mode="closed", rate=None, duration_s=4.0, requests=10, errors=0,
                output_tokens=int(v * 4), output_tok_s=v, requests_s=1.0, ttft_p50=None,
                ttft_p90=None, ttft_p99=None, tpot_p50=None, tpot_p90=None, tpot_p99=None,
                itl_p50=None, itl_p90=None, itl_p99=None, e2e_p50=None, e2e_p90=None,
                e2e_p99=None, accept_length=L,
                accept_histogram=tuple(exact_histogram(q, 2000, rng))))
            tok[c] = v
        attr = measured_attr(status="ok", params=params,
                             facts=ServerFacts(max_total_num_tokens=facts[0],
                                               max_running_requests=facts[1]),
                             levels=levels)
        return score(tok, self.baseline()), attr


def score(tok: dict[int, float], base: dict[int, float]) -> float:
    return sum(math.log(max(tok[c] / base[c], 0.01)) for c in LEVELS) / len(LEVELS)


def true_scores(server: Server) -> dict[tuple, float]:
    cands = enumerate_space(SPACE, {})
    out = {}
    for key in cands.keys:
        steps, topk, n, mem = key
        facts = server.facts(mem, n)
        if facts is None:
            continue
        L = 1.0 + float(np.cumprod(tree_q(P_TRUE, H_TRUE, steps, topk, n)).sum())
        out[key] = score(server.tok_s(steps, topk, n, L, *facts, spec=True), server.baseline())
    return out


def new_study(sampler: optuna.samplers.BaseSampler, server: Server,
              with_baseline: bool = True) -> optuna.Study:
    study = optuna.create_study(direction="maximize", sampler=sampler)
    if with_baseline:
        base = server.baseline()
        study.set_user_attr(BASELINE_ATTR, baseline_attr(
            levels=[{"concurrency": c, "output_tok_s": v} for c, v in base.items()],
            weights={c: 1.0 for c in LEVELS},
            facts={"max_total_num_tokens": BASE_KV, "max_running_requests": BASE_KV // RESERVE},
            request_tokens=512))
    return study


def run(study: optuna.Study, server: Server, n: int, seed: int = 0) -> list[dict[str, Any]]:
    space = DefineByRun(SPACE, {})
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        trial = study.ask()
        space(trial)
        params = resolve(trial.params, {})
        value, attr = server.measure(params, rng)
        trial.set_user_attr(MEASURED_ATTR, attr)
        trial.set_constraint("feasible", 0.0 if value is not None else 1.0)
        study.tell(trial, value if value is not None else -5.0)
        out.append(params)
    return out


def sampler(seed: int = 0, **kw: Any) -> ModelGuidedSampler:
    base = optuna.samplers.TPESampler(seed=seed, n_startup_trials=6)
    return ModelGuidedSampler(base, space=SPACE, seed=seed, **kw)


# ---------------------------------------------------------------------------------- the sampler


def test_the_whole_model_fits_a_physical_server_and_finds_its_optimum() -> None:
    server = Server()
    truth = true_scores(server)
    best = max(truth.values())
    study = new_study(sampler(), server)
    proposed = run(study, server, 10)
    hits = [i for i, p in enumerate(proposed, 1)
            if truth.get((p[STEPS], p[TOPK], p[DRAFT], round(p[MEM], 6)), -9) >= best - 0.02]
    assert hits and hits[0] <= 8, (hits, proposed)
    decisions = [t.user_attrs[DECISION_ATTR] for t in study.trials]
    assert [d["by"] for d in decisions[:2]] == ["base", "base"]
    assert "thin data" in decisions[0]["why"]
    modelled = [d for d in decisions if d["by"] == "model"]
    assert modelled and modelled[-1]["fit_error"] < 0.02
    assert modelled[-1]["tile"] == TILE


def test_the_fit_predicts_measured_scores() -> None:
    server = Server()
    study = new_study(sampler(), server)
    run(study, server, 8)
    observations = [parse_measured(t.user_attrs[MEASURED_ATTR], t.params) for t in study.trials]
    base = parse_baseline(study.user_attrs[BASELINE_ATTR])
    cands = enumerate_space(SPACE, {})
    fit = fit_model(observations, base, cands, depth=8)
    draws = score_draws(fit, cands, np.random.default_rng(0), 64)
    truth = true_scores(server)
    measured = {o.key for o in observations if o.feasible}
    for i, key in enumerate(cands.keys):
        if key in measured:
            assert np.median(draws[:, i]) == pytest.approx(truth[key], abs=0.03)


def test_a_server_the_model_cannot_express_goes_to_the_base_sampler() -> None:
    server = Server(physical=False)
    study = new_study(sampler(), server)
    run(study, server, 8)
    late = [t.user_attrs[DECISION_ATTR] for t in study.trials[4:]]
    assert all(d["by"] == "base" and "poor fit" in d["why"] for d in late), late


def test_without_a_baseline_the_base_sampler_proposes() -> None:
    server = Server()
    study = new_study(sampler(), server, with_baseline=False)
    run(study, server, 4)
    assert all(t.user_attrs[DECISION_ATTR]["by"] == "base" for t in study.trials)
    assert "no baseline" in study.trials[-1].user_attrs[DECISION_ATTR]["why"]


def test_proposals_follow_sglangs_rules_and_are_never_repeated() -> None:
    server = Server()
    study = new_study(sampler(seed=3), server)
    proposed = run(study, server, 14)
    keys = [(p[STEPS], p[TOPK], p[DRAFT], p[MEM]) for p in proposed]
    assert all(invalid_reason(p) is None for p in proposed)
    modelled = [k for k, t in zip(keys, study.trials)
                if t.user_attrs[DECISION_ATTR]["by"] == "model"]
    assert len(set(modelled)) == len(modelled)
    assert not set(modelled) & {k for k, t in zip(keys, study.trials)
                                if t.user_attrs[DECISION_ATTR]["by"] == "base"}


def test_deterministic_for_a_seed() -> None:
    a = run(new_study(sampler(seed=7), Server()), Server(), 7)
    b = run(new_study(sampler(seed=7), Server()), Server(), 7)
    assert a == b


def test_pickles_and_a_fresh_copy_carries_on() -> None:
    server = Server()
    original = sampler(seed=5)
    study = new_study(original, server)
    run(study, server, 5)
    copy = pickle.loads(pickle.dumps(original))
    assert copy.decide(study, 5) == original.decide(study, 5)
    assert str(copy) == "ModelGuidedSampler(TPESampler)"


def test_an_enqueued_point_is_left_alone() -> None:
    server = Server()
    study = new_study(sampler(), server)
    run(study, server, 4)
    study.enqueue_trial({STEPS: 2, TOPK: 1, MEM: 0.84})
    run(study, server, 1)
    last = study.trials[-1]
    assert (last.params[STEPS], last.params[MEM]) == (2, 0.84)
    assert DECISION_ATTR not in last.user_attrs


def test_a_refused_boot_rules_out_its_neighbourhood() -> None:
    cands = enumerate_space(SPACE, {})
    trials = [obs(4, 1, 5, mem=0.9, kv=kv_of(0.9, 5), limit=kv_of(0.9, 5) // RESERVE,
                  hists=[[1, 1, 1, 1, 10]] * 4),
              obs(6, 1, 7, mem=0.9, feasible=False, failure="oom")]
    base = parse_baseline({"levels": {str(c): {"output_tok_s": 50.0} for c in LEVELS},
                           "facts": {"max_total_num_tokens": BASE_KV,
                                     "max_running_requests": 26}})
    fit = fit_model(trials, base, cands, depth=8)
    refused = ruled_out(fit, cands)
    for key, r in zip(cands.keys, refused):
        assert r == (key[2] >= 7 and key[3] >= 0.9 - 1e-9)


def test_measured_attr_from_records_is_json_and_parses_back() -> None:
    good = LevelSummary(16, "closed", None, 4.0, 10, 0, 7000, 1750.0, 2.5, *([None] * 12),
                        accept_length=4.5, accept_histogram=(1, 2, 3, 4, 90))
    suspect = LevelSummary(32, "closed", None, 4.0, 10, 3, 7000, 1750.0, 2.5, *([None] * 12),
                           accept_length=4.5, suspect=True)
    params = {STEPS: 4, TOPK: 1, DRAFT: 5, MEM: 0.88, "speculative_algorithm": "EAGLE3"}
    attr = measured_attr(status="ok", params=params,
                         facts=ServerFacts(max_total_num_tokens=300_000,
                                           max_running_requests=17, gpu_ids=("0", "1"),
                                           extra={MEMORY_ROOM: 0.07, GRAPH_MEMORY: 0.02}),
                         levels=[good, suspect])
    text = json.dumps(attr)
    back = parse_measured(json.loads(text), {})
    assert back.key == (4, 1, 5, 0.88)
    assert (back.kv, back.limit, back.feasible) == (300_000, 17, True)
    assert (back.room, back.graph) == (0.07, 0.02)
    assert [lv.concurrency for lv in back.levels] == [16]
    assert back.levels[0].histogram == (1, 2, 3, 4, 90)
    refused = parse_measured(measured_attr(
        status="infeasible", params=params,
        reason="oom: Capture cuda graph failed: torch.OutOfMemoryError: CUDA out of memory."), {})
    assert (refused.feasible, refused.failure) == (False, "oom")
    assert parse_measured(measured_attr(status="ok", params={STEPS: 0}), {}) is None


def test_a_multi_objective_study_is_refused() -> None:
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler())
    with pytest.raises(ValueError, match="single-objective"):
        study.ask()


def test_bad_settings_are_named() -> None:
    with pytest.raises(ValueError, match="max_residual"):
        ModelGuidedSampler(max_residual=0)
    with pytest.raises(ValueError, match="min_trials"):
        ModelGuidedSampler(min_trials=-1)
    with pytest.raises(TypeError, match="BaseSampler"):
        ModelGuidedSampler(base_sampler="tpe")  # type: ignore[arg-type]


def test_inside_ray_tunes_optuna_search_with_the_attrs_set_on_completion() -> None:
    """The wiring the search uses: OptunaSearch asks, the result carries the measurement, the
    searcher puts it on the Optuna trial before telling it; the searcher pickles."""
    from ray.tune.search.optuna import OptunaSearch

    server = Server()
    searcher = OptunaSearch(space=DefineByRun(SPACE, {}), metric="score", mode="max",
                            sampler=sampler(seed=2), seed=2)
    base = server.baseline()
    searcher._ot_study.set_user_attr(BASELINE_ATTR, baseline_attr(
        levels=[{"concurrency": c, "output_tok_s": v} for c, v in base.items()],
        weights={c: 1.0 for c in LEVELS},
        facts={"max_total_num_tokens": BASE_KV, "max_running_requests": BASE_KV // RESERVE}))
    rng = np.random.default_rng(0)
    for i in range(5):
        config = searcher.suggest(f"t{i}")
        params = resolve({k: v for k, v in config.items() if k != DRAFT or config[TOPK] > 1}, {})
        value, attr = server.measure(params, rng)
        ot_trial = searcher._ot_trials[f"t{i}"]
        ot_trial.set_user_attr(MEASURED_ATTR, json.loads(json.dumps(attr)))
        ot_trial.set_constraint("feasible", 0.0 if value is not None else 1.0)
        searcher.on_trial_complete(f"t{i}", {"score": value if value is not None else -5.0})
    restored = pickle.loads(pickle.dumps(searcher))
    trials = restored._ot_study.trials
    assert len(trials) == 5
    assert trials[-1].user_attrs[DECISION_ATTR]["by"] == "model"


def _run_with_an_extra_parameter(extra: ParamSpec, n: int,
                                 slow_value: Any = None) -> optuna.Study:
    """`n` trials of the model sampler on SPACE plus `extra`, a parameter the simulated server
    ignores, except that at `slow_value` it runs 40% slower."""
    space = (*SPACE, extra)
    server = Server()
    study = new_study(ModelGuidedSampler(optuna.samplers.TPESampler(seed=1), space=space,
                                         seed=1), server)
    define = DefineByRun(space, {})
    rng = np.random.default_rng(0)
    for _ in range(n):
        trial = study.ask()
        define(trial)
        params = resolve({k: v for k, v in trial.params.items() if k != extra.name}, {})
        value, attr = server.measure(params, rng)
        if value is not None and slow_value is not None \
                and trial.params[extra.name] == slow_value:
            for lv in attr["levels"].values():
                lv["output_tok_s"] *= 0.6
            value += math.log(0.6)
        trial.set_user_attr(MEASURED_ATTR, attr)
        trial.set_constraint("feasible", 0.0 if value is not None else 1.0)
        study.tell(trial, value if value is not None else -5.0)
    return study


def test_a_discrete_parameter_the_model_does_not_know_is_a_context() -> None:
    """llama.cpp's n-gram size, say: acceptance and step time depend on it in ways the model
    has no term for. One fit per value of it (the pooled fit where a value has no boot yet),
    EI over every (value, point); here the server is 40% slower at one value, and once each
    value has been booted the model keeps to the fast one."""
    extra = ParamSpec("ngram_size", "categorical", choices=(1, 2))
    study = _run_with_an_extra_parameter(extra, 9, slow_value=2)
    modelled = [t for t in study.trials if t.user_attrs[DECISION_ATTR]["by"] == "model"]
    assert len(modelled) >= 5
    assert all(t.user_attrs[DECISION_ATTR]["why"].startswith(f"at ngram_size="
                                                              f"{t.params[extra.name]}: ")
               for t in modelled)
    booted = {t.params[extra.name] for t in study.trials if t.value is not None and t.value > -5}
    assert booted == {1, 2}
    assert [t.params[extra.name] for t in modelled[-3:]] == [1, 1, 1]


def test_too_many_unknown_values_follow_the_incumbent() -> None:
    extra = ParamSpec("cuda_graph_max_bs", "int", low=1, high=64)
    study = _run_with_an_extra_parameter(extra, 6)
    last = study.trials[-1]
    assert last.user_attrs[DECISION_ATTR]["by"] == "model"
    incumbent = max((t for t in study.trials[:-1] if t.value > -5), key=lambda t: t.value)
    assert last.params[extra.name] == incumbent.params[extra.name]


def test_a_space_without_memory_fraction_or_topk() -> None:
    space = (ParamSpec(STEPS, "int", low=1, high=8),)
    fixed = {MEM: 0.9}
    server = Server()
    study = new_study(ModelGuidedSampler(optuna.samplers.TPESampler(seed=0), space=space,
                                         fixed=fixed, seed=0), server)
    define = DefineByRun(space, fixed)
    rng = np.random.default_rng(0)
    for _ in range(6):
        trial = study.ask()
        define(trial)
        value, attr = server.measure(resolve(trial.params, fixed), rng)
        trial.set_user_attr(MEASURED_ATTR, attr)
        study.tell(trial, value if value is not None else -5.0)
    decisions = [t.user_attrs[DECISION_ATTR]["by"] for t in study.trials]
    assert decisions[2:] == ["model"] * 4
    assert len({t.params[STEPS] for t in study.trials}) == 6


# ------------------------------------------------------------------ noise, cold start, concurrency


def test_ei_is_measured_against_the_models_view_of_the_incumbent_not_its_luckiest_boot() -> None:
    """On a noisy server the best measured value is the luckiest boot (the winner's curse):
    against it every prediction, which averages over boots, looks like no improvement and a
    search would stop on a lucky draw. The reference is the model's own mean of the measured
    configurations, so a boot that ran 30% fast changes nothing the model proposes."""
    server = Server()
    study = new_study(sampler(seed=2), server)
    run(study, server, 3)
    best = max((t for t in study.trials if t.value > -5), key=lambda t: t.value)
    lucky = new_study(sampler(seed=2), server)
    for t in study.trials:
        value = t.value + 0.3 if t.number == best.number else t.value
        lucky.add_trial(optuna.trial.create_trial(
            params=t.params, distributions=t.distributions, value=value,
            user_attrs=t.user_attrs, system_attrs=t.system_attrs))
    plain_decision, plain_plan = study.sampler.decide(study, 3)
    lucky_decision, lucky_plan = lucky.sampler.decide(lucky, 3)
    assert plain_decision["by"] == lucky_decision["by"] == "model"
    assert plain_plan == lucky_plan
    assert plain_decision["ei"] == pytest.approx(lucky_decision["ei"])
    assert plain_decision["ei"] > 0


def test_before_any_speculative_boot_runs_anchors_bisect_the_memory_fraction() -> None:
    """Cold start: no blind proposal. The chain (topk 1) three steps deep, in the middle of
    the memory fractions; an out-of-memory refusal moves it down, a KV-pool refusal up."""
    server = Server()
    study = new_study(ModelGuidedSampler(optuna.samplers.TPESampler(seed=0), space=SPACE,
                                         seed=0, min_trials=1, cold_start=True), server)
    define = DefineByRun(SPACE, {})
    seen = []
    for reason in ("oom: torch.OutOfMemoryError: CUDA out of memory",
                   "kv_memory: RuntimeError: Not enough memory.", None):
        trial = study.ask()
        define(trial)
        params = resolve(trial.params, {})
        seen.append((params[STEPS], params[TOPK], params[MEM]))
        decision = trial.user_attrs[DECISION_ATTR] if DECISION_ATTR in trial.user_attrs \
            else study.trials[-1].user_attrs[DECISION_ATTR]
        assert decision["by"] == "model" and decision["anchor"], decision
        if reason is None:
            value, attr = server.measure(params, np.random.default_rng(0))
        else:
            value, attr = None, measured_attr(status="infeasible", params=params, reason=reason)
        trial.set_user_attr(MEASURED_ATTR, attr)
        study.tell(trial, value if value is not None else -5.0)
    # memory fractions 0.84 .. 0.92 by 0.02: the middle, then below the OOM, then above the KV
    assert seen == [(3, 1, 0.88), (3, 1, 0.84), (3, 1, 0.86)]
    trial = study.ask()
    define(trial)
    assert study.trials[-1].user_attrs[DECISION_ATTR].get("anchor") is None   # the model now


def test_without_a_memory_axis_the_anchor_is_the_middle_of_the_steps_range() -> None:
    """Where no memory fraction is searched (llama.cpp, vLLM n-gram) depth does not decide
    whether a point boots: the first boot measures acceptance at the centre of the range."""
    space = (ParamSpec(STEPS, "int", low=0, high=24),)
    server = Server()
    study = new_study(ModelGuidedSampler(optuna.samplers.TPESampler(seed=0), space=space,
                                         fixed={MEM: 0.9}, seed=0, min_trials=1,
                                         cold_start=True), server)
    trial = study.ask()
    DefineByRun(space, {MEM: 0.9})(trial)
    decision = study.trials[-1].user_attrs[DECISION_ATTR]
    assert decision["anchor"] and decision["why"].endswith("the centre of the steps range)")
    assert study.trials[-1].params[STEPS] == 13   # speculative steps 1..24: 12.5, the deeper


def test_a_running_point_below_a_boot_that_ran_does_not_erase_the_memory_boundary() -> None:
    """A concurrent proposal counts running points as refused; one that no boundary line can
    join with the measurements (it would have to run out of memory below a point that ran)
    is left out, and the boundary the refusals measured stays."""
    from specdecode_tune.samplers.model.oom import fit_oom, fit_oom_running
    measured = [obs(4, 1, 5, mem=0.92, feasible=False, failure="oom"),
                obs(5, 1, 6, mem=0.90)]
    liar = obs(6, 1, 7, mem=0.80, feasible=False, failure="oom")
    assert fit_oom([*measured, liar]) is None               # no line: the bug it guards
    fit = fit_oom_running(measured, [liar], fit_oom(measured))
    assert fit is not None and fit.p_feasible(0.92, 5) == 0.0
    # A running point a line can join is counted: the boundary moves below it.
    near = obs(5, 1, 6, mem=0.91, feasible=False, failure="oom")
    assert fit_oom_running(measured, [near], fit_oom(measured)).p_feasible(0.91, 6) == 0.0


def logged(o: TrialObs, room: float, graph: float) -> TrialObs:
    return dataclasses.replace(o, room=room, graph=graph)


def test_boots_that_logged_their_memory_bound_the_boundary_without_a_refusal() -> None:
    """A boundary line alpha - beta * n (alpha 0.95, beta 0.0075: the need grows 1.5x as fast
    as the graphs' kept 0.005 per draft token) seen only through two boots' logs: each says the
    fraction could rise by at most its room and at least room - graphs, and their graphs'
    growth bounds the slope. Points beyond every line are certain refusals, points below every
    line certain boots, with no boot refused."""
    from specdecode_tune.samplers.model.oom import fit_oom

    def boot(n: int) -> TrialObs:
        boundary, graph = 0.95 - 0.0075 * n, 0.005 * n
        transient = 0.0025 * n                       # freed before the reading
        return logged(obs(n - 1, 1, n, mem=0.85), room=boundary + transient - 0.85, graph=graph)

    measured = [boot(4), boot(6)]
    assert fit_oom([dataclasses.replace(o, room=None, graph=None) for o in measured]) is None
    fit = fit_oom(measured)
    assert fit is not None
    assert fit.beta.min() >= 0.005 - 1e-9 and fit.beta.max() <= 0.01 + 1e-9
    assert fit.p_feasible(0.93 + 1e-3, 4) == 0.0          # above boot(4)'s room
    assert fit.p_feasible(0.86, 8) == 1.0                  # truth 0.89: below every line
    assert fit.p_feasible(0.93, 8) == 0.0                  # truth 0.89
    assert 0.0 < fit.p_feasible(0.915, 4) < 1.0            # truth 0.92: inside the bracket


def test_a_refusal_that_contradicts_the_logged_lower_bounds_drops_them() -> None:
    """The lower bounds rest on an assumption (the capture's warm-up uses no more than its
    graphs keep); a refusal below one drops them, and the upper bounds (what the log says for
    certain) stay with the refusal."""
    from specdecode_tune.samplers.model.oom import fit_oom
    ran = logged(obs(3, 1, 4, mem=0.85), room=0.08, graph=0.02)     # lower 0.91, upper 0.93
    refused = obs(3, 1, 4, mem=0.90, feasible=False, failure="oom")
    fit = fit_oom([ran, refused])
    assert fit is not None
    assert fit.p_feasible(0.90, 4) == 0.0 and fit.p_feasible(0.935, 4) == 0.0
    assert 0.0 < fit.p_feasible(0.875, 4) < 1.0


def test_the_slopes_the_logged_graphs_allow_are_spread_evenly_across_their_band() -> None:
    """One boot that logged its room and graphs bounds the slope to [0, 2 g / n]; its steep
    half, where a capture with a large warm-up puts the boundary (SGLang's own batch sizes,
    docs/engines-sglang.md 6b), holds half the slopes (the log-spaced grid for refusals alone
    put a seventh there)."""
    from specdecode_tune.samplers.model.oom import fit_oom
    from specdecode_tune.samplers.model.trials import TrialObs

    boot = TrialObs(4, 1, 5, 0.85, True, None, None, None, (), room=0.0725, graph=0.0191)
    fit = fit_oom([boot])
    assert fit is not None
    steepest = 2 * 0.0191 / 5
    assert fit.beta.max() == pytest.approx(steepest)
    assert np.mean(fit.beta > steepest / 2) == pytest.approx(0.5, abs=0.05)


def test_points_the_servers_release_crashes_on_are_no_candidates() -> None:
    """SGLang >= 0.5.16 crashes at boot on a tree narrower than deep (topk > 1, draft < steps +
    1; seen on 0.5.17, an H100): the search's samplers get `backends.known_refusal` for their
    backend, and such points leave the model's candidates; for an older release none do. The
    sampler holding it pickles (Ray Tune checkpoints the searcher)."""
    import functools

    from specdecode_tune.backends import known_refusal
    from specdecode_tune.config import BackendConfig, load_experiment
    from specdecode_tune.search.sampler_factory import make_sampler

    def refuses(version: str) -> Any:
        return functools.partial(known_refusal, BackendConfig(
            kind="sglang", model_path="m", draft_model_path="d", engine_version=version,
            binary="/opt/sglang-server"))

    every = enumerate_space(SPACE, {})
    assert every is not None
    short = {t for t in every.triples if t[1] > 1 and t[2] < t[0] + 1}
    assert short
    kept = enumerate_space(SPACE, {}, refuses("0.5.17"))
    assert kept is not None and set(kept.triples) == set(every.triples) - short
    older = enumerate_space(SPACE, {}, refuses("0.5.14"))
    assert older is not None and older.keys == every.keys

    from tests.conftest import REPO
    exp = load_experiment(REPO / "experiments" / "sglang-gpu.toml")
    assert exp.backend.engine_version == "0.5.17"
    sampler = pickle.loads(pickle.dumps(make_sampler("hybrid", exp, 0)))
    cands = sampler.model._candidates([])
    assert cands is not None and cands.triples
    assert all(not (k > 1 and d < s + 1) for s, k, d in cands.triples)


def test_step_time_draws_keep_a_combination_the_data_pin() -> None:
    """Every speculative boot at steps 4 / draft 5: the data pin only a combination of the fixed
    speculative cost and the per-draft-step cost. The draws (the posterior truncated to
    non-negative coefficients) keep it: their step time at each measured speculative level
    stays within a few % of the measurement. Clipping each coordinate of an untruncated draw
    at zero (the old draws) broke it: median +70% there."""
    from specdecode_tune.samplers.model.steptime import StepFit

    true = np.array([0.010, 0.0, 0.00002, 0.0012, 0.0006, 0.00001, 0.000002])
    cols: dict[str, list[float]] = {k: [] for k in ("r", "n", "s", "k", "L", "spec")}
    for r in (1, 16, 32, 48):
        for row in ((r, 1, 0, 1, 1.0, 0.0), (r, 5, 4, 1, 3.0, 1.0), (r, 5, 4, 1, 2.9, 1.0)):
            for key, v in zip(cols, row):
                cols[key].append(float(v))
    a = {k: np.array(v) for k, v in cols.items()}
    f = step_features(a["r"], a["n"], a["s"], a["k"], a["L"], a["spec"], 1, None)
    t = f @ true * (1 + 0.01 * np.random.default_rng(0).standard_normal(len(a["r"])))
    typical = np.median(step_features(a["r"], a["n"], a["s"], a["k"], a["L"], a["spec"], 1,
                                      0.1), axis=0)
    fit = fit_step(StepRows(t=t, **a), typical, float(t[a["spec"] == 0].min()))
    spec = a["spec"] == 1
    feats = step_features(a["r"], a["n"], a["s"], a["k"], a["L"], a["spec"], fit.tile,
                          fit.route)[spec]
    draws = fit.draws(np.random.default_rng(0), 256)
    assert draws.min() >= 0.0
    rel = (draws @ feats.T) / t[spec][None, :] - 1.0
    lo, hi = np.percentile(rel, [10, 90], axis=0)
    assert np.all(lo > -0.03) and np.all(hi < 0.03)
    # deterministic given the generator
    assert np.array_equal(draws, fit.draws(np.random.default_rng(0), 256))
    # the old draws, for the record: the clip moves the combination far off
    clipped = np.maximum(np.random.default_rng(0).multivariate_normal(
        fit.mean, fit.cov, 256, method="eigh"), 0.0)
    assert np.median((clipped @ feats.T) / t[spec][None, :] - 1.0) > 0.1
    assert isinstance(fit, StepFit)


def test_while_a_boundary_bet_runs_a_proposal_keeps_to_points_every_boundary_line_boots() -> None:
    """Two proposals booted together both over the out-of-memory edge (bench-noisy with the
    truncated step-time draws): while a running boot is unsure under the boundary's version
    space, the next proposal is a point every line boots, where one is free."""
    from types import SimpleNamespace

    from specdecode_tune.samplers.model.improvement import Option, pick, sure_points
    from specdecode_tune.samplers.model.oom import OOMFit, oom_sure

    oom = OOMFit(beta=np.array([0.004, 0.0075]), lo=np.array([0.88, 0.88]),
                 hi=np.array([0.92, 0.92]))
    cands = SimpleNamespace(mem=np.array([0.89, 0.85, 0.80]), draft=np.array([7, 5, 5]))
    sure = oom_sure(oom, cands)
    assert sure.tolist() == [False, False, True]       # 0.85 + 0.0075 * 5 > 0.88
    scores = np.tile(np.array([0.8, 0.6, 0.4]), (8, 1))
    scores[0, 0] = -np.inf                               # the risky one fails in a draw
    free = np.ones(3, dtype=bool)
    option = Option({}, None, cands, [], free, {}, scores, sure)
    assert sure_points([option])
    chosen, _ = pick(option, 0.0, None, False, True)
    assert chosen.at == 2
    chosen, _ = pick(option._replace(sure=None), 0.0, None, False, False)
    assert chosen.at == 0                                # no bet running: the best EI
    assert not sure_points([option._replace(sure=None)])


def test_the_gain_beyond_the_band_beside_a_running_boot_counts_over_what_it_reaches() -> None:
    """The slot beside a running boot: a neighbour the model scores like the running point
    gains beyond the band only in the draws where the running boot is not counted (the
    pessimistic view counts it refused). Over what the running boot reaches in the same draw,
    it gains nothing: the stop rule's figure says so, the proposal's own EI does not change."""
    from types import SimpleNamespace

    from specdecode_tune.samplers.model.improvement import Option, pick

    rng = np.random.default_rng(0)
    common = 0.1 + 0.05 * rng.standard_normal(64)          # what both points share, per draw
    scores = np.stack([common + 0.002, common - 0.3], axis=1)  # the neighbour, a poor point
    running = common                                         # the running point, same draws
    cands = SimpleNamespace(mem=np.array([0.91, 0.85]), draft=np.array([16, 5]))
    free = np.ones(2, dtype=bool)
    option = Option({}, None, cands, [], free, {}, scores)
    alone, beyond_alone = pick(option, 0.0, 0.025, False)
    beside, beyond_beside = pick(option._replace(believed=running), 0.0, 0.025, False)
    assert beyond_alone > 0.0125                 # worth a boot by the rule, over the reference
    assert beyond_beside == 0.0                  # nothing over what the running boot reaches
    assert (beside.at, beside.ei) == (alone.at, alone.ei)    # the proposal itself unchanged
    # A running point that reaches less than the reference in a draw leaves the reference.
    low = np.full(64, -1.0)
    _, beyond_low = pick(option._replace(believed=low), 0.0, 0.025, False)
    assert beyond_low == beyond_alone
