"""report/predictions.py: each config's first boot beside what the sampler's model predicted
for it before the boot (the trials table's `predicted` column), and the median error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specdecode_tune.report import render as r
from specdecode_tune.report.data import read_run
from specdecode_tune.report.predictions import blocks, median_error, rows
from specdecode_tune.space import STEPS
from tests.unit.report.test_report import Run


def pred(tok: dict[int, float], accept: float = 2.0, p: float = 0.9) -> dict[str, Any]:
    return {"tok_s": {str(c): v for c, v in tok.items()}, "accept_length": accept,
            "p_feasible": p}


@pytest.fixture
def run(tmp_path: Path) -> Path:
    run = Run(tmp_path)                                                # the baseline first
    run.add("t1", {STEPS: 1}, {1: 100.0, 16: 1000.0}, predicted=pred({1: 110.0, 16: 1100.0}))
    run.add("t2", {STEPS: 2}, {1: 200.0, 16: 1200.0}, predicted=pred({1: 180.0, 16: 1200.0}))
    # a re-measurement of t2's config: not a first boot, its prediction is not counted
    run.add("t2r", {STEPS: 2}, {1: 100.0, 16: 100.0}, predicted=pred({1: 1.0, 16: 1.0}),
            repeat=1)
    run.add("t3", {STEPS: 3}, {1: 250.0, 16: 900.0})                   # no prediction
    run.add("t9", {STEPS: 9}, None, predicted=pred({1: 300.0}, p=0.2), status="failed")
    return tmp_path


def test_first_boots_only_and_their_errors(run: Path) -> None:
    found = rows(read_run(str(run)))
    assert [row.trial.trial_id for row in found] == ["t1", "t2", "t3", "t9"]
    errors = {row.trial.trial_id: row.errors for row in found}
    assert errors["t1"] == pytest.approx({1: 0.10, 16: 0.10})
    assert errors["t2"] == pytest.approx({1: -0.10, 16: 0.0})
    assert errors["t3"] == {} and errors["t9"] == {}       # nothing predicted / nothing measured
    assert median_error(found) == pytest.approx(0.10)       # |.1|, |.1|, |-.1|, 0
    assert median_error([]) is None


def test_the_section_says_how_many_were_predicted_and_the_median(run: Path) -> None:
    out = blocks(read_run(str(run)))
    text = " ".join(b.text for b in out if isinstance(b, r.Para))
    assert "3 of 4 configurations had a prediction" in text
    assert "median error of tok/s over their measured levels: 10.0%" in text
    (table,) = [b for b in out if isinstance(b, r.Table)]
    by_id = {row[0]: row for row in table.rows}
    assert by_id["t1"][3] == "90%" and by_id["t1"][4] == "110.0 / 100.0 (+10.0%)"
    assert by_id["t3"][3] == "-" and by_id["t3"][4] == "- / 250.0 (-)"
    assert by_id["t9"][3] == "20%" and by_id["t9"][2] == "failed"


def test_no_prediction_anywhere_says_so(tmp_path: Path) -> None:
    Run(tmp_path).add("t1", {STEPS: 1}, {1: 100.0, 16: 1000.0})
    out = blocks(read_run(str(tmp_path)))
    assert any(isinstance(b, r.Para) and "No trial carries a prediction" in b.text for b in out)
