"""benchmarks/readme_search.py's reading of where a search's time goes besides measuring (pure:
the trials table's rows, no search run; the real search is tests/integration's)."""

from __future__ import annotations

from datetime import datetime, timedelta
from types import ModuleType

import pytest

from tests.conftest import bench_module


@pytest.fixture(scope="module")
def rs() -> ModuleType:
    return bench_module("readme_search")


def row(tid: str, start: float | None, end: float | None) -> dict:
    t0 = datetime(2026, 12, 6, 22, 0, 0)
    return {"trial_id": tid,
            "started_at": None if start is None else t0 + timedelta(seconds=start),
            "finished_at": None if end is None else t0 + timedelta(seconds=end)}


def test_a_gap_runs_from_the_latest_end_before_a_boot_to_its_start(rs: ModuleType) -> None:
    # The baseline, then the first trial alone, then two at a time on two pairs.
    rows = [row("baseline", 0, 60), row("a", 63, 100), row("b", 104, 150),
            row("c", 100.5, 140), row("d", 140.2, 190), row("e", 150.3, 200)]
    levels = {"baseline": 54.0, "a": 30.0, "b": 37.0, "c": 31.0, "d": 41.0, "e": 40.0}
    gaps, besides = rs.boot_gaps(rows, levels)
    # a after the baseline, c and b after a (b's actor took longer), d after c, e after b.
    assert gaps == pytest.approx([3.0, 0.5, 4.0, 0.2, 0.3])
    assert besides == pytest.approx([6.0, 7.0, 9.0, 8.5, 8.8, 9.7])


def test_a_boot_without_times_or_levels_is_left_out(rs: ModuleType) -> None:
    """A row without its times (a run written before they were recorded) has no gap, and a
    boot that measured no level (refused at start-up) nothing besides its levels."""
    rows = [row("baseline", 0, 60), row("old", None, None), row("refused", 61, 62.5),
            row("a", 62.6, 100)]
    gaps, besides = rs.boot_gaps(rows, {"baseline": 50.0, "a": 30.0})
    assert gaps == pytest.approx([1.0, 0.1])
    assert besides == pytest.approx([10.0, 7.4])
    assert rs._spread([1.0, 0.2, 4.0]) == "median 1.0 s (0.2-4.0 s, 3)"
    assert rs._spread([]) == "-"
