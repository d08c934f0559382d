"""benchmarks/warmup_truncation.py: the warm-up and stop rule replayed on a real server's rounds
(the kept H100 table), the rule as run held to what the live run itself wrote in its notes."""

from __future__ import annotations

from tests.conftest import bench_module

wt = bench_module("warmup_truncation")
ARGS = (2.0, 0.02, 2, 32.0)


def test_the_replay_of_the_rule_as_run_drops_what_the_live_run_said_it_dropped():
    # The H100 run's notes (benchmarks/data/recording/sglang-gpu-h100.parquet): "first 46 of 95
    # rounds left out as warm-up" (C=1) and "first 38 of 92" (C=16). The rebuilt rounds spread
    # each request's tokens evenly over its chunks, so the match is the rule's, not exact bytes.
    lv = wt.levels(wt.DEFAULT)
    assert len(lv) == 18
    c1 = lv[("land-r0-static0.0045-topk4-tokens8-steps2", 1)]
    c16 = lv[("land-r0-static0.0045-topk4-tokens16-steps4", 16)]
    assert wt.live(c1, *ARGS, wt.WHOLE_LEVEL)[1] == 46
    _, dropped, value = wt.live(c16, *ARGS, wt.WHOLE_LEVEL)
    assert dropped == 38
    assert abs(value / 11178.7 - 1) < 0.01         # the live figure
    # The rule now: the start-up only (warmup_s, then at most 3 rounds).
    for bs in (c1, c16):
        first = wt.first_rounds(bs, 2.0)
        assert wt.live(bs, *ARGS)[1] <= first + 3


def test_it_prints_every_level_and_the_large_drops_of_each_rule(capsys):
    assert wt.main([]) == 0
    out = capsys.readouterr().out
    assert out.count(" C=") >= 18
    assert "as run (whole level): levels where a quarter or more of the rounds were dropped: 3" \
        in out
    assert "now (first 8): levels where a quarter or more of the rounds were dropped: 0" in out
