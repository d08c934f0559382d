"""Goodput targets, their intervals, GuideLLM's saturation test and the goodput score."""

from __future__ import annotations

import dataclasses
import math

import pytest

from specdecode_tune.config import experiment_from_dict
from specdecode_tune.errors import ConfigError
from specdecode_tune.load.saturation import saturation, slope_alert
from specdecode_tune.load.slo import Slo, good_requests
from specdecode_tune.objective import goodput_score, objective_score
from specdecode_tune.records import LevelSummary, RequestRecord
from specdecode_tune.stats import fraction_interval, t_ppf, wilson


def req(start: float, ttft: float | None, end: float, out: int = 11,
        gaps: tuple[float, ...] = (), error: str | None = None,
        in_window: bool = True) -> RequestRecord:
    return RequestRecord(level=1, index=0, start=start, end=end, ttft=ttft, input_tokens=10,
                         output_tokens=out, chunk_gaps=gaps, in_window=in_window, error=error)


def test_a_request_is_good_only_when_it_meets_every_target() -> None:
    slo = Slo(ttft_s=1.0, tpot_s=0.1, itl_s=0.2, percentile=90)
    ok = req(0, 0.5, 1.5)                       # tpot (1.5 - 0.5) / 10 = 0.1
    late = req(0, 1.5, 2.0)
    slow = req(0, 0.5, 2.5)                     # tpot 0.2
    gappy = req(0, 0.5, 1.0, gaps=(0.01,) * 8 + (0.5, 0.5))
    failed = req(0, 0.1, 0.2, error="http 500")
    cut = req(0, 0.1, 9.0, in_window=False)
    assert [slo.met(r) for r in (ok, late, slow, gappy)] == [True, False, False, False]
    assert good_requests([ok, late, slow, gappy, failed, cut], slo) == (1, 5)
    assert Slo(ttft_s=2.0).met(late) and Slo(tpot_s=0.15).met(late)


def test_intervals_wilson_for_one_t_over_repeats_never_narrower_than_pooled() -> None:
    lo, hi = wilson(9, 10)
    assert 0.55 < lo < 0.6 and 0.98 < hi <= 1.0
    assert fraction_interval([(9, 10)]) == (0.9, lo, hi)
    mean, lo2, hi2 = fraction_interval([(10, 10), (10, 10), (10, 10)])
    assert mean == 1.0 and lo2 < 0.95 and hi2 == 1.0      # agreement by chance: not [1, 1]
    mean, lo3, hi3 = fraction_interval([(2, 10), (8, 10)])
    assert mean == 0.5 and lo3 == 0.0 and hi3 == 1.0      # two repeats far apart: wide
    assert fraction_interval([]) is None
    assert t_ppf(0.975, 1000) == pytest.approx(1.96, abs=0.01)
    assert t_ppf(0.975, 10) == pytest.approx(2.228, abs=0.05)


def test_slope_check_needs_a_clear_positive_slope() -> None:
    xs = [float(i) for i in range(20)]
    assert slope_alert(xs, [2 * x + 1 for x in xs])[0]
    assert not slope_alert(xs, [5.0 - x for x in xs])[0]
    assert not slope_alert(xs, [(-1) ** i * 10.0 for i in range(20)])[0]   # noise, no trend
    assert not slope_alert([0.0, 1.0], [0.0, 1.0])[0]                       # too few


def test_a_queue_that_keeps_growing_is_saturated_a_steady_level_is_not() -> None:
    # Closed loop past capacity: each request waits longer than the one before it.
    growing = [req(0.2 * i, 0.5 * i, 0.2 * i + 0.5 * i + 1.0) for i in range(40)]
    sat = saturation(growing, 20.0)
    assert sat.saturated and sat.ttft_slope and sat.ttft_slope > 0
    steady = [req(0.5 * i, 0.05, 0.5 * i + 0.6) for i in range(40)]
    assert not saturation(steady, 20.0).saturated
    # Slow but steady TTFTs (over 2.5 s, flat): a long queue, not a growing one.
    flat = [req(0.5 * i, 3.0, 0.5 * i + 4.0) for i in range(40)]
    assert not saturation(flat, 25.0).saturated
    assert "too few" in saturation(growing[:3], 20.0).why


def level(c: int, good: int | None, total: int = 20, tok: float = 100.0) -> LevelSummary:
    return LevelSummary(concurrency=c, mode="closed", rate=None, duration_s=10.0, requests=total,
                        errors=0, output_tokens=int(tok * 10), output_tok_s=tok, requests_s=2.0,
                        ttft_p50=None, ttft_p90=None, ttft_p99=None, tpot_p50=None,
                        tpot_p90=None, tpot_p99=None, itl_p50=None, itl_p90=None, itl_p99=None,
                        e2e_p50=None, e2e_p90=None, e2e_p99=None, accept_length=None,
                        slo_good=good, slo_total=total)


def test_goodput_score_is_the_log_ratio_of_good_requests_per_second() -> None:
    base = [level(1, 10), level(16, 5)]
    mine = [level(1, 20), level(16, 5)]
    w = {1: 1.0, 16: 1.0}
    assert goodput_score(mine, base, w) == pytest.approx(math.log(2) / 2)
    # Neither met the targets: a tie; only the baseline did: low but finite.
    assert goodput_score([level(1, 0)], [level(1, 0)], {1: 1.0}) == 0.0
    assert goodput_score([level(1, 0)], [level(1, 10)], {1: 1.0}) == pytest.approx(
        math.log(0.05 / 1.0))
    assert goodput_score([level(1, None)], [level(1, 10)], {1: 1.0}) is None
    # objective_score picks by kind: the scalar one reads tok/s only.
    faster = [dataclasses.replace(level(1, 10), output_tok_s=200.0)]
    assert objective_score("scalar", faster, [level(1, 10)], {1: 1.0}) == pytest.approx(
        math.log(2))
    assert objective_score("goodput", faster, [level(1, 10)], {1: 1.0}) == 0.0


def exp_with(objective: dict) -> dict:
    return {"name": "x", "backend": {"kind": "sim", "model_path": "m"},
            "space": {"speculative_num_steps": {"type": "int", "low": 1, "high": 3}},
            "measure": {"concurrency": [1, 4]}, "objective": objective}


def test_goodput_objective_reads_targets_and_refuses_bad_ones() -> None:
    e = experiment_from_dict(exp_with({"kind": "goodput", "ttft_ms": 500, "tpot_ms": 50}))
    assert (e.objective.ttft_ms, e.objective.tpot_ms, e.objective.itl_ms) == (500.0, 50.0, None)
    for bad, words in (({"kind": "goodput"}, "needs at least one target"),
                       ({"kind": "goodput", "ttft_ms": -1}, "objective.ttft_ms"),
                       ({"kind": "goodput", "itl_ms": 10, "percentile": 0}, "percentile"),
                       ({"kind": "scalar", "ttft_ms": 100}, "only used with")):
        with pytest.raises(ConfigError, match=words) as exc:
            experiment_from_dict(exp_with(bad))
        assert "\n" not in str(exc.value)
