"""benchmarks/paired_requests.py: the paired-comparison reading of a real server's C=1
requests, on small tables written here and on the kept H100 table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import bench_module

pr = bench_module("paired_requests")


def test_the_interval_of_a_ratio_is_zero_when_every_pair_has_the_same_ratio():
    den = np.array([1.0, 2.0, 5.0, 0.5])
    assert pr.rel_half(3.0 * den, den) == 0.0
    noisy = pr.rel_half(np.array([3.0, 6.5, 14.0, 1.6]), den)
    assert 0.0 < noisy < 0.2


def _table(path: Path, scale_b: float, jitter: float) -> None:
    rng = np.random.default_rng(0)
    out = rng.integers(20, 400, size=60).astype(float)
    rows = []
    for trial, scale in (("a", 1.0), ("b", scale_b)):
        t = (out / 1000.0 + 0.05) / scale * (1 + jitter * rng.standard_normal(60))
        for i in range(60):
            rows.append({"trial_id": trial, "level": 1, "prompt_id": f"p{i}", "in_window": True,
                         "error": None, "output_tokens": out[i], "input_tokens": 30.0,
                         "start": 0.0, "end": float(t[i])})
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_a_paired_ratio_is_known_exactly_where_b_is_a_in_less_time(tmp_path, capsys):
    # The same prompts, the same tokens, B exactly 1.5x as fast on each: the paired ratio's
    # interval is 0 though each level alone varies with its prompts' lengths.
    path = tmp_path / "t.parquet"
    _table(path, 1.5, 0.0)
    levels = pr.load(path)
    a, b = levels["a"], levels["b"]
    assert pr.rel_half(b["time"], a["time"]) < 1e-12
    assert pr.rel_half(a["out"], a["time"]) > 0.02      # a fixed overhead: rates differ
    assert pr.main([str(path)]) == 0
    text = capsys.readouterr().out
    assert "100%" in text and "the paired ratio +-0.0%" in text


def test_the_kept_h100_table_reads():
    levels = pr.load(pr.DEFAULT)
    assert len(levels) == 6
    assert all(len(v["out"]) >= 40 for v in levels.values())
