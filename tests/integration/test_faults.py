"""Injected faults (`python -m specdecode_tune.sim --fault ...`) against a real trial.

Each test runs `run_trial` on the simulator with one fault and checks what a user would see:
the trial's status and reason, the levels kept in the tables (every finished level, a level
that saw the fault marked suspect), the errors the client counted against what the server says
it injected, and that the server's process group is gone (by the pid and pgid it was started
with). A hang must be caught by a deadline, not waited out, so those tests carry their own
short timeout. The last test runs the search CLI with faults on some points: the search goes on.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from specdecode_tune import store, trial
from specdecode_tune.config import load_experiment
from specdecode_tune.errors import ConfigError
from specdecode_tune.server import ServerProcess, process_group_alive
from specdecode_tune.sim.faults import parse_fault
from specdecode_tune.testing.processes import kill_pids, tagged_processes
from specdecode_tune.trial import TrialContext, run_trial
from tests.conftest import DATA, REPO, pid_alive

STEPS3 = {"speculative_num_steps": 3}


def fault_experiment(tmp_path: Path, *faults: str, concurrency: str = "[1, 4, 8]",
                     duration_s: float = 2.0, request_timeout_s: float = 10.0,
                     boot_timeout_s: float = 20.0, warmup_requests: int = 0,
                     profile: str = "seed-qwen35-122b") -> Path:
    """A small, fast sim experiment whose server runs with `faults`."""
    extra = ", ".join(f'"--fault", "{f}"' for f in faults)
    text = f"""
name = "faults"
[backend]
kind = "sim"
model_path = "Qwen/Qwen3.5-122B-A10B"
speculative_algorithm = "EAGLE3"
tp_size = 2
profile = "{profile}"
boot_time_s = 0.3
boot_timeout_s = {boot_timeout_s}
extra_args = [{extra}]
[backend.flags]
cuda_graph_max_bs = 64
mem_fraction_static = 0.85
disable_radix_cache = true
[space.speculative_num_steps]
type = "int"
low = 1
high = 8
[workload]
input_len = 64
output_len = 96
[measure]
concurrency = {concurrency}
warmup_s = 0.3
duration_s = {duration_s}
warmup_requests = {warmup_requests}
request_timeout_s = {request_timeout_s}
"""
    path = tmp_path / "faults.toml"
    path.write_text(text)
    return path


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch):
    """Record (pid, pgid) of every server a trial starts; afterwards each must be gone.

    The servers also carry this test's SPECDECODE_TEST_TAG, so anything left is ended by PID
    (and fails the test)."""
    started: list[tuple[int, int]] = []

    class Recording(ServerProcess):
        def _spawn(self) -> None:
            super()._spawn()
            started.append((self.pid, self.pgid))

    tag = uuid.uuid4().hex
    monkeypatch.setattr(trial, "ServerProcess", Recording)
    monkeypatch.setenv("SPECDECODE_TEST_TAG", tag)
    yield started
    left = tagged_processes(tag)
    kill_pids(left)
    assert not left, f"processes left running: {left}"


def assert_gone(started: list[tuple[int, int]]) -> None:
    assert started, "the trial started no server"
    for pid, pgid in started:
        assert not pid_alive(pid), f"server pid {pid} still alive"
        assert not process_group_alive(pgid), f"server group {pgid} still alive"


def run(tmp_path: Path, exp_path: Path, sampled: dict = STEPS3, trial_id: str = "t"
        ) -> tuple[trial.TrialResult, store.RunTables, float, str]:
    exp = load_experiment(exp_path)
    ctx = TrialContext(run_dir=str(tmp_path / "run"), local_dir=tmp_path / "logs",
                       trial_id=trial_id)
    t0 = time.monotonic()
    result = run_trial(exp, sampled, ctx)
    wall = time.monotonic() - t0
    log = (tmp_path / "logs" / f"{trial_id}.log").read_text(errors="replace")
    return result, store.read_tables(ctx.run_dir), wall, log


def injected(log: str, kind: str) -> int:
    return len(re.findall(rf"fault {re.escape(kind)} injected", log))


def assert_tables_hold(result: trial.TrialResult, tables: store.RunTables) -> None:
    """The trial row says what the result says; every finished level has its row and its
    requests, and nothing else is there."""
    rows = tables.trials.to_pylist()
    assert [(r["status"], r["reason"], r["n_levels"]) for r in rows] == \
        [(result.status, result.reason, len(result.levels))]
    assert rows[0]["suspect"] == any(lv.suspect for lv in result.levels)
    levels = tables.levels.to_pylist()
    assert sorted(r["concurrency"] for r in levels) == \
        sorted(lv.concurrency for lv in result.levels)
    for lv in result.levels:
        row = next(r for r in levels if r["concurrency"] == lv.concurrency)
        assert (row["suspect"], row["errors"], row["note"]) == (lv.suspect, lv.errors, lv.note)
    req_levels = set(tables.requests.column("level").to_pylist())
    assert req_levels == {lv.concurrency for lv in result.levels}


# --------------------------------------------------------------------------------------------
# Start-up faults


def test_crash_at_start_is_a_failed_trial(tmp_path: Path, servers: list) -> None:
    result, tables, wall, log = run(tmp_path, fault_experiment(tmp_path, "crash-at-start"))
    assert result.status == "failed"
    assert result.reason.startswith("crashed: exit code 1:"), result.reason
    assert "NCCL error" in result.reason
    assert result.levels == () and wall < 15
    assert injected(log, "crash-at-start") == 1
    assert_tables_hold(result, tables)
    assert_gone(servers)


def test_oom_at_start_is_an_infeasible_trial(tmp_path: Path, servers: list) -> None:
    result, tables, wall, _ = run(tmp_path, fault_experiment(tmp_path, "oom-at-start"))
    assert result.status == "infeasible"
    assert result.reason.startswith("oom:") and "CUDA out of memory" in result.reason
    assert result.levels == () and wall < 15
    assert_tables_hold(result, tables)
    assert_gone(servers)


def test_slow_start_past_the_boot_deadline_times_out(tmp_path: Path, servers: list) -> None:
    exp = fault_experiment(tmp_path, "slow-start:60", boot_timeout_s=2.0)
    result, tables, wall, _ = run(tmp_path, exp)
    assert result.status == "failed"
    assert result.reason.startswith("timeout: not healthy after 2 s"), result.reason
    assert wall < 15, "the boot deadline was not kept"
    assert_tables_hold(result, tables)
    assert_gone(servers)


def test_a_fault_in_the_profile_with_a_condition(tmp_path: Path, servers: list) -> None:
    """`faults` in a profile apply like --fault; `@steps>=5` limits them to such boots."""
    seed = (REPO / "specdecode_tune" / "sim" / "profiles" / "seed-qwen35-122b.toml").read_text()
    profile = tmp_path / "oom-at-5.toml"
    profile.write_text('faults = ["oom-at-start@steps>=5"]\n' + seed)
    exp = fault_experiment(tmp_path, profile=str(profile), concurrency="[1]", duration_s=0.5)
    result, _, _, _ = run(tmp_path, exp, {"speculative_num_steps": 6}, trial_id="s6")
    assert result.status == "infeasible" and "CUDA out of memory" in result.reason
    result, _, _, log = run(tmp_path, exp, {"speculative_num_steps": 2}, trial_id="s2")
    assert result.status == "ok" and result.levels[0].errors == 0, result.reason
    assert "injected" not in log
    assert_gone(servers)


# --------------------------------------------------------------------------------------------
# Faults while measuring


def test_crash_midway_keeps_the_finished_levels(tmp_path: Path, servers: list) -> None:
    result, tables, _, log = run(tmp_path, fault_experiment(tmp_path, "crash-after:8"))
    assert result.status == "failed"
    assert result.reason.startswith("server exited during the run:"), result.reason
    assert injected(log, "crash-after") == 1
    # It died in a level after the first: the trial stopped there, not at the last level.
    assert 2 <= len(result.levels) < 3, [lv.concurrency for lv in result.levels]
    *before, dead = result.levels
    assert all(not lv.suspect and lv.errors == 0 for lv in before)
    assert dead.suspect and "server died during the level" in dead.note
    assert dead.errors > 0
    assert_tables_hold(result, tables)
    assert_gone(servers)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("after,warmup", [(8, 0), (0, 1)], ids=["in-a-level", "in-warm-up"])
def test_hang_is_caught_by_a_deadline(tmp_path: Path, servers: list, after: int,
                                      warmup: int) -> None:
    """The server stops answering (socket open, no bytes, /health silent): requests time out,
    the health probe gives up, the trial fails without waiting out the hang."""
    exp = fault_experiment(tmp_path, f"hang-after:{after}", request_timeout_s=1.5,
                           warmup_requests=warmup)
    result, tables, wall, log = run(tmp_path, exp)
    assert result.status == "failed"
    assert result.reason.startswith("server hung: no answer from /health within 1.5 s"), \
        result.reason
    assert injected(log, "hang-after") == 1
    hung = result.levels[-1]
    assert hung.suspect and "server stopped answering" in hung.note
    assert len(result.levels) < 3                        # nothing measured after the hang
    if after == 0:
        assert len(result.levels) == 1
    assert wall < 20, f"the hang was waited out ({wall:.0f} s)"
    assert_tables_hold(result, tables)
    assert_gone(servers)


# A stream fault and the request errors it may cause.
STREAM_FAULTS = {
    "malformed-sse:0.03": ("malformed chunk",),
    "drop-midway:0.25": ("disconnect", "truncated stream (no [DONE])"),
}


@pytest.mark.parametrize("fault", sorted(STREAM_FAULTS))
def test_broken_streams_are_counted_and_mark_the_level(tmp_path: Path, servers: list,
                                                       fault: str) -> None:
    """Each malformed event or dropped connection fails its request: the client counts it, the
    level that had one is kept and marked suspect, the trial carries on."""
    exp = fault_experiment(tmp_path, fault, concurrency="[4, 8]")
    result, tables, _, log = run(tmp_path, exp)
    assert result.status == "ok", result.reason
    errors = [r["error"] for r in tables.requests.to_pylist() if r["error"]]
    assert errors and all(e.startswith(STREAM_FAULTS[fault]) for e in errors), set(errors)
    # Every injected fault is one failed request, except one that reached a request the client
    # was dropping at a window's end (at most one per level).
    n = injected(log, fault.split(":")[0])
    assert n - len(result.levels) <= len(errors) <= n
    for lv in result.levels:
        assert lv.suspect == (lv.errors > 0)
        assert ("errors: " in lv.note) == (lv.errors > 0)
    assert any(lv.errors for lv in result.levels)
    assert_tables_hold(result, tables)
    assert_gone(servers)


def test_slowdown_midway_is_flagged_by_the_level_itself(tmp_path: Path, servers: list) -> None:
    """Throttling 1.9 s into the only level (its window 0.3-3.3 s, halves split at 1.8 s; the
    fault is timed from the first request): no errors, but the level's own chunk gaps
    show two speeds, so it is kept and marked suspect."""
    exp = fault_experiment(tmp_path, "slowdown-after:1.9:3", concurrency="[4]", duration_s=3.0)
    result, tables, _, log = run(tmp_path, exp)
    assert result.status == "ok", result.reason
    assert injected(log, "slowdown-after") == 1
    (lv,) = result.levels
    assert lv.errors == 0
    assert lv.suspect and "median inter-chunk gap rose" in lv.note, lv.note
    assert_tables_hold(result, tables)
    assert_gone(servers)


def test_fault_specs_are_checked() -> None:
    assert parse_fault("slowdown-after:5:2.5").args == (5.0, 2.5)
    assert parse_fault("oom-at-start@steps>=10").condition == ("speculative_num_steps", ">=", 10)
    for bad in ("crash", "crash-after", "crash-after:-1", "malformed-sse:1.5",
                "slowdown-after:5:0.5", "hang-after:3@steps~3", "oom-at-start:1"):
        with pytest.raises(ConfigError, match="--fault"):
            parse_fault(bad)


# --------------------------------------------------------------------------------------------
# The search goes on


@pytest.mark.slow
def test_the_search_goes_on_through_faults(tmp_path: Path) -> None:
    """OOM at steps=6 and a crash midway at steps=2, both enqueued: each becomes a row with its
    status, the other trials run, the search finishes and picks a config."""
    # How the search carries on is what is checked, not what it measures: outputs of 128 tokens
    # and 2 s windows instead of sim-small's 512 and 5 s (as tests/integration/test_search.py).
    text = (DATA / "sim-small.toml").read_text()
    for old, new in (("output_len = 512", "output_len = 128"),
                     ("duration_s = 5.0", "duration_s = 2.0")):
        assert old in text, old
        text = text.replace(old, new, 1)
    text = text.replace("[backend.flags]", 'extra_args = ["--fault", "oom-at-start@steps=6", '
                        '"--fault", "crash-after:6@steps=2"]\n\n[backend.flags]', 1)
    text = text.replace("[search]\n", "[search]\nenqueue = [{ speculative_num_steps = 6 }, "
                        "{ speculative_num_steps = 2 }]\n", 1)
    exp = tmp_path / "faulty.toml"
    exp.write_text(text)
    tag = uuid.uuid4().hex
    env = {**os.environ, "SPECDECODE_TEST_TAG": tag}
    try:
        out = subprocess.run(
            [sys.executable, "-m", "specdecode_tune.search", "--experiment", str(exp),
             "--storage", str(tmp_path / "runs"), "--max-trials", "4"],
            cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert "Best config:" in out.stdout
        assert "-> infeasible: oom:" in out.stdout          # progress says what happened
        assert "-> failed: server exited during the run" in out.stdout
        rows = store.read_tables(str(tmp_path / "runs" / "sim-small")).trials.to_pylist()
        by_steps = {}
        for r in rows:
            by_steps.setdefault(json.loads(r["params_json"])["speculative_num_steps"], r)
        assert by_steps[6]["status"] == "infeasible" and "CUDA out of memory" in \
            by_steps[6]["reason"]
        assert by_steps[2]["status"] == "failed"
        assert by_steps[2]["reason"].startswith("server exited during the run")
        explored = [r for r in rows if r["trial_id"] != "baseline" and r["repeat"] == 0]
        assert len(explored) == 4
        assert sum(r["status"] == "ok" for r in explored) >= 2
        time.sleep(1.0)
        sims = [p for p, cmd in tagged_processes(tag).items() if "specdecode_tune.sim" in cmd]
        assert not sims, f"simulator servers left running: {sims}"
    finally:
        kill_pids(tagged_processes(tag))
