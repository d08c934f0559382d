"""benchmarks/search_efficiency.py: a tiny run, and the pieces it is built from (pure: predict
only, no servers, no Ray)."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from specdecode_tune.samplers.model import parse_measured
from specdecode_tune.sim.model import Workload, predict
from specdecode_tune.sim.profile import Noise, load_profile

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "search_efficiency.py"


@pytest.fixture(scope="module")
def se() -> ModuleType:
    spec = importlib.util.spec_from_file_location("search_efficiency", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["search_efficiency"] = module      # dataclasses and pickling look it up
    spec.loader.exec_module(module)
    return module


def test_smoke_run_prints_a_row_per_sampler_and_the_targets(se: ModuleType,
                                                            capsys: pytest.CaptureFixture) -> None:
    assert se.main(["--smoke-test"]) == 0
    out = capsys.readouterr().out
    assert "== seed-qwen35-122b" in out
    for sampler in ("random", "grid", "tpe", "plateau", "model"):
        assert any(line.split()[:1] == [sampler] for line in out.splitlines()), sampler
    assert "grid        4784" in out
    assert "targets:" in out and "model-guided median" in out
    assert "wall time" in out


def test_the_grid_runs_in_bench_speculatives_order(se: ModuleType) -> None:
    exp = se.truth_of("seed-qwen35-122b").exp
    order = se.grid_order(exp)
    # 13 memory fractions x (steps 1..12 x topk {1,2,4} x draft 2..16 with steps*topk+1 >= draft)
    assert len(order) == 13 * 368
    assert order[:4] == [(1, 1, 2, 0.8), (1, 2, 2, 0.8), (1, 2, 3, 0.8), (1, 4, 2, 0.8)]
    # topk 1 boots once per draft count the script lists, all the same server (draft = steps + 1)
    assert order[:368].count((3, 1, 4, 0.8)) == 3
    assert order[-1] == (12, 4, 16, 0.92)


def test_the_truth_is_exhaustive_noise_free_predict(se: ModuleType) -> None:
    truth = se.truth_of("seed-qwen35-122b")
    # 13 memory fractions x 333 distinct triples (draft tokens <= 1 + topk + (steps-1) * topk^2;
    # 302 under the old `steps * topk + 1` rule, 31 of them real servers it left out)
    assert len(truth.points) == 13 * 333
    assert truth.optimum == (4, 1, 5, 0.92)
    wl = Workload(256, 256, 0.0)
    params = se.server_params(truth.exp, {"speculative_num_steps": 4,
                                          "speculative_eagle_topk": 1,
                                          "mem_fraction_static": 0.92})
    tok = {c: predict(truth.profile, params, c, wl).output_tok_s for c in (1, 16, 32, 64)}
    score = sum(math.log(tok[c] / truth.base[c]) for c in tok) / 4
    assert truth.best == pytest.approx(score)
    assert sum(p.score >= truth.threshold for p in truth.points.values()) == 2


def test_a_measurement_carries_what_a_trial_would(se: ModuleType) -> None:
    truth = se.truth_of("seed-qwen35-122b")
    quiet = dataclasses.replace(truth, profile=dataclasses.replace(
        truth.profile, noise=Noise(boot_sigma=0.0, step_sigma=0.0)))
    tok, attr = se.measure(quiet, truth.optimum, seed=0)
    point = truth.points[truth.optimum]
    assert tok == pytest.approx(point.tok_s)
    obs = parse_measured(attr, {})
    assert obs.key == truth.optimum and obs.feasible
    assert (obs.kv, obs.limit) == (point.kv, point.limit)
    for lv in obs.levels:
        assert len(lv.histogram) == 5          # 0..4 accepted drafts at steps 4
        assert lv.accept_length == pytest.approx(point.accept_length, rel=0.05)
    refused = next(k for k, p in truth.points.items() if not p.feasible)
    tok, attr = se.measure(truth, refused, seed=0)
    assert tok == {} and parse_measured(attr, {}).failure in ("kv", "oom")
    # The same config measures the same in the same seed, whichever sampler asks.
    assert se.measure(truth, truth.optimum, 3)[0] == se.measure(truth, truth.optimum, 3)[0]
    assert se.measure(truth, truth.optimum, 3)[0] != se.measure(truth, truth.optimum, 4)[0]


def best_by_steps(truth: object, topk: int = 1) -> dict[int, float]:
    out: dict[int, float] = {}
    for (s, k, _, _), p in truth.points.items():
        if k == topk and p.feasible:
            out[s] = max(out.get(s, -np.inf), p.score)
    return out


def test_the_benchmark_profiles_have_their_shapes(se: ModuleType) -> None:
    two = se.truth_of("bench-two-regime")
    assert two.optimum[0] >= 10
    shallow = max(p.score for k, p in two.points.items() if k[0] <= 6)
    assert shallow < two.threshold - 0.05            # the plateau side is well below 98%
    assert all(k[0] >= 10 for k, p in two.points.items() if p.score >= two.threshold)
    steps = best_by_steps(two)
    assert abs(steps[5] - steps[4]) < 0.025           # a step inside the noise band

    shelves = best_by_steps(se.truth_of("bench-tile-shelves"))
    assert shelves[4] < shelves[3] and shelves[5] > shelves[4] and shelves[8] < shelves[7] - 0.05

    noisy = se.truth_of("bench-noisy")
    assert noisy.optimum[3] < 0.92                    # the highest fraction is not the best
    assert any("out of memory" in p.reason.lower() for p in noisy.points.values())
    assert load_profile("bench-noisy").noise.boot_sigma > 2 * load_profile(
        "seed-qwen35-122b").noise.boot_sigma


def test_a_search_counts_boots_not_answers_from_data(se: ModuleType) -> None:
    truth = se.truth_of("bench-tile-shelves")
    boots = se.run_search(truth, "tpe", seed=0, budget=12)
    assert len(boots) == 12
    assert se.first_hit([truth.best - 1, truth.best], truth.threshold) == 2
    assert se.first_hit([truth.best - 1], truth.threshold) is None


def test_a_boots_measuring_seconds_under_fixed_windows_and_the_rule(se: ModuleType) -> None:
    truth = se.truth_of("seed-qwen35-122b")
    best = truth.points[truth.optimum]
    # The fixed windows: 1 s + 4 s at each of the four levels, whatever the point.
    assert se.boot_seconds(truth, truth.optimum, "fixed") == pytest.approx(20.0)
    # The rule: its rounds per level, a round being min(C, the running limit) requests of 256
    # tokens at the level's tok/s (C=64 runs in waves of the limit).
    expect = sum(se.RULE_ROUNDS[c] * min(c, best.limit) * 256 / best.tok_s[c]
                 for c in (1, 16, 32, 64))
    assert se.boot_seconds(truth, truth.optimum, "rule") == pytest.approx(expect)
    assert best.limit < 64
    # A refused boot measures nothing; the baseline's seconds come from its own speeds.
    refused = next(k for k, p in truth.points.items() if not p.feasible)
    assert se.boot_seconds(truth, refused, "rule") == 0.0
    assert se.boot_seconds(truth, None, "rule") > se.boot_seconds(truth, truth.optimum, "rule")
