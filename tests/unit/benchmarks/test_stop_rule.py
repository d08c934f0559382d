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


def test_rebuild_makes_rounds_of_a_runs_requests(tmp_path) -> None:
    """A C=2 level of four requests, two completing at 1.0 and 1.2 s (round 1), two at 2.0 and
    2.4 s (round 2), and two cut at the level's end (3.0 s, in flight): two rounds, the tokens
    of each chunk in the round it arrived in, the cut requests' tokens counted where they came."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for i, (start, end, n) in enumerate([(0.0, 1.0, 10), (0.0, 1.2, 12), (1.0, 2.0, 10),
                                         (1.2, 2.4, 12), (2.0, 3.0, 10), (2.4, 3.0, 6)]):
        gaps = [(end - start - 0.1) / (n - 1)] * (n - 1)
        rows.append({"trial_id": "t", "level": 2, "start": start, "end": end, "ttft": 0.1,
                     "output_tokens": n, "chunk_gaps": gaps, "verify_ct": None,
                     "error": None, "index": i})
    out = tmp_path / "run" / "tables" / "requests"
    out.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), out / "t-c2.parquet")
    levels = sr.rebuild(tmp_path / "run")
    bs = levels[("t", 2)]
    assert [(round(b.start, 3), round(b.end, 3), b.completed) for b in bs] == [
        (0.0, 1.2, 2), (1.2, 2.4, 2)]
    # The chunks that arrived by the last round's end (2.4 s): the four completed requests'
    # 44 tokens and those of the cut requests' chunks before it (the one sent at 2.0: 2.1-2.4;
    # a chunk on a boundary falls either side by float sums), at most 48.
    assert 44 <= sum(b.tokens for b in bs) <= 48
    table = tmp_path / "rounds.parquet"
    sr.write(levels, table)
    back = sr.load(table)
    assert [(b.start, b.end, b.tokens) for b in back[("t", 2)]] == \
        [(b.start, b.end, b.tokens) for b in bs]
