"""benchmarks/stop_rule.py: the precision rule replayed on real servers' rounds (SGLang 0.5.17
and vLLM 0.26.0 EAGLE-3 on H100s). With the interval over rounds and 2 of them, a stop before
the cap could be far off its level (the served vLLM run's 17%); with 30 rounds kept and the
interval over batches of them, every stop is near it."""

from __future__ import annotations

import re

from tests.conftest import bench_module

sr = bench_module("stop_rule")


def _rows(out: str) -> dict[tuple[str, str, int], tuple[int, float]]:
    rows = {}
    for m in re.finditer(r"^(SGLang 0\.5\.17|vLLM 0\.26\.0)\s+(rounds|10 batches)\s+(\d+)\s+"
                         r"(\d+)\s+(\d+)\s+\S+\s+(\d+)\s+\S+%\s+(\S+)%$", out, re.M):
        rows[(m[1], m[2], int(m[3]))] = (int(m[5]), float(m[7]))
    return rows


def test_few_rounds_stop_far_off_and_thirty_rounds_stop_near_the_level(capsys) -> None:
    assert sr.main(["--min-rounds", "2,30"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert set(rows) == {(e, i, m) for e in ("SGLang 0.5.17", "vLLM 0.26.0")
                         for i in ("rounds", "10 batches") for m in (2, 30)}
    assert rows[("vLLM 0.26.0", "rounds", 2)][1] > 20.0     # worst stop, % off its level
    assert rows[("SGLang 0.5.17", "rounds", 2)][1] > 10.0
    # Over rounds, 30 of them never stop vLLM's levels (neighbouring rounds alike early,
    # the level's wander late); over 10 batches they stop, near the level.
    assert rows[("vLLM 0.26.0", "rounds", 30)][0] == 0
    stops, worst = rows[("vLLM 0.26.0", "10 batches", 30)]
    assert stops > 0 and worst < 5.0
    stops, worst = rows[("SGLang 0.5.17", "10 batches", 30)]
    assert stops > 0 and worst < 3.0


def test_the_vllm_rounds_rebuild_from_the_runs_requests_as_the_live_rule_read_them() -> None:
    """The kept table (rebuilt from the run's request table) gives the levels' live figures:
    steps 4's C=16 12,294.9 tok/s, steps 6's C=1 1,054.3 (docs/gpu-runs.md)."""
    from specdecode_tune.load.rounds import known
    from specdecode_tune.load.scheduler import warmup_rounds

    lv = sr.load(sr.TABLES["vLLM 0.26.0"])
    assert len(lv) == 30
    for key, live in ((("602ef6e8", 16), 12294.9), (("540ae074", 1), 1054.3)):
        bs = lv[key]
        k = known(bs, warmup_rounds([b.end for b in bs], 0.0, 2.0))
        assert k is not None and abs(k.tok_s.value / live - 1) < 0.002
