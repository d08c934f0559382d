"""The README's main command, run as a user runs it: `python -m specdecode_tune.search` with no
arguments (the default experiment on the simulator), checked on its output and its tables.

CI (`.ci/run`) has run that very command moments before (its step "README command 1", with
SPECDECODE_STORAGE in its work folder) and hands the run over instead of paying for a second
one (about 5 minutes on a 2-core machine): SPECDECODE_README_LOG names the command's stdout and
SPECDECODE_README_RUN its run dir; `.ci/run` stops before pytest when the command failed. With
neither variable set (pytest run by hand), the test runs the search itself. Both ways go through
the same checks (`check_default_search`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from specdecode_tune import store
from specdecode_tune.config import load_experiment
from specdecode_tune.testing.processes import kill_pids, tagged_processes
from tests.conftest import REPO

pytestmark = pytest.mark.slow

HANDOFF_VARS = ("SPECDECODE_README_LOG", "SPECDECODE_README_RUN")


def check_default_search(text: str, run_dir: Path) -> int:
    """Every check of the default search, on its stdout `text` and its run dir; returns the
    number of trials in its tables."""
    for expected in ("experiment: sim-default", "the embedded simulator",
                     "dashboard: http://127.0.0.1:", "baseline C=1", "Best config:",
                     "Plateau verdict:", "How sure:", "launch: python -m sglang.launch_server",
                     "report:", "tables:"):
        assert expected in text, expected
    assert f"tables: {run_dir / 'tables'} " in text      # the output and the run dir agree
    exp = load_experiment(REPO / "experiments" / "sim-default.toml")
    tables = store.read_tables(str(run_dir))
    trials = tables.trials.to_pylist()
    spec = [r for r in trials if r["trial_id"] != "baseline"]
    assert text.count("\ntrial ") == len(spec)           # one line per finished trial
    explored = [r for r in spec if r["repeat"] == 0]
    # max_trials is a cap: the default sampler's search stops when its model knows, and
    # its last line says why (the rule's reason, or the cap).
    assert 1 <= len(explored) <= exp.search.max_trials
    last = text.rstrip().splitlines()[-1]
    assert last.startswith("stopped: "), last
    if len(explored) < exp.search.max_trials:
        assert "expected improvement" in last and "noise band" in last, last
    assert any(r["repeat"] > 0 for r in trials)           # the best was re-measured
    # What the model predicted before each boot is recorded, and the report shows it.
    assert any(r["predicted"] for r in explored)
    assert "Predicted before the boot, against measured" in (
        run_dir / "report" / "report.md").read_text()
    ok = [r for r in trials if r["status"] == "ok"]
    assert tables.levels.num_rows == len(exp.measure.concurrency) * len(ok)
    assert (run_dir / "report" / "report.md").is_file()
    assert (run_dir / "report" / "report.html").is_file()
    assert (run_dir / "experiment.toml").is_file()
    return len(trials)


def test_default_search_from_the_readme(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    assert "python3 -m specdecode_tune.search" in readme.split("\n\n")[1]
    handed = {name: os.environ.get(name) for name in HANDOFF_VARS}
    if any(handed.values()):
        # The run .ci/run made with the README's command, exactly as written.
        assert all(handed.values()), f"set both or neither of {HANDOFF_VARS}: {handed}"
        log = Path(handed["SPECDECODE_README_LOG"] or "")
        run_dir = Path(handed["SPECDECODE_README_RUN"] or "")
        assert log.is_file() and run_dir.is_dir(), handed
        n = check_default_search(log.read_text(), run_dir)
        print(f"default search (run by .ci/run, handed over): {n} trials")
        return
    tag = uuid.uuid4().hex
    env = {**os.environ, "SPECDECODE_STORAGE": str(tmp_path), "SPECDECODE_TEST_TAG": tag}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "specdecode_tune.search"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - t0
    try:
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
        n = check_default_search(out.stdout, tmp_path / "sim-default")
        print(f"default search: {wall:.0f}s wall, {n} trials")
    finally:
        kill_pids(tagged_processes(tag))
