"""The README's main command, run as a user runs it: `python -m specdecode_tune.search` with no
arguments (the default experiment on the simulator), checked on its output and its tables."""

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


def test_default_search_from_the_readme(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    assert "python3 -m specdecode_tune.search" in readme.split("\n\n")[1]
    tag = uuid.uuid4().hex
    env = {**os.environ, "SPECDECODE_STORAGE": str(tmp_path), "SPECDECODE_TEST_TAG": tag}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "specdecode_tune.search"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - t0
    try:
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
        text = out.stdout
        for expected in ("experiment: sim-default", "the embedded simulator",
                         "dashboard: http://127.0.0.1:", "baseline C=1", "Best config:",
                         "Plateau verdict:", "How sure:", "launch: python -m sglang.launch_server",
                         "report:", "tables:"):
            assert expected in text, expected
        run_dir = tmp_path / "sim-default"
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
        print(f"default search: {wall:.0f}s wall, {len(trials)} trials")
    finally:
        kill_pids(tagged_processes(tag))
