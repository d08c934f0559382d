"""The search's closing lines (`search/summary.py`)."""

from __future__ import annotations

from pathlib import Path

from tests.unit.report.test_schedule_validation import _plan


def test_the_cap_line_names_the_cap_the_search_ran_under(tmp_path: Path) -> None:
    """Without a stop reason in the study, the last line says the cap: --max-trials's where
    given (the experiment's differs), else the experiment's."""
    from specdecode_tune.search.summary import why_stopped

    plan = _plan(tmp_path, None)
    own = plan.exp.search.max_trials
    assert why_stopped(plan, None) == [
        f"stopped: the trial cap ({own} points, the experiment's max_trials) was reached, "
        "then the re-measurements"]
    assert why_stopped(plan, None, own + 3)[-1].startswith(
        f"stopped: the trial cap ({own + 3} points, --max-trials)")
    assert why_stopped(plan, "a failure streak") == ["stopped: a failure streak"]
