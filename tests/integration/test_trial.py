"""One trial against the simulator as a real subprocess: figures, failures, and no leftovers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdecode_tune import store
from specdecode_tune.config import load_experiment
from specdecode_tune.records import GRAPH_MEMORY, MEMORY_ROOM
from specdecode_tune.sim.model import Workload, predict, startup
from specdecode_tune.sim.profile import load_profile
from specdecode_tune.space import resolve
from specdecode_tune.trial import TrialContext, run_trial
from tests.conftest import DATA, REPO, pid_alive

EXP = DATA / "sim-small.toml"


def server_pids(local_dir: Path) -> list[int]:
    """The pids the trial recorded for its servers (pidfiles are removed after teardown, so
    the log names the process through the pidfile's record while it runs)."""
    return [json.loads(p.read_text())["pid"] for p in (local_dir / "pids").glob("*.json")]


def test_trial_measures_what_the_model_predicts(tmp_path: Path) -> None:
    exp = load_experiment(EXP)
    ctx = TrialContext(run_dir=str(tmp_path / "run"), local_dir=tmp_path / "logs",
                       trial_id="t-steps3")
    result = run_trial(exp, {"speculative_num_steps": 3}, ctx)
    assert result.status == "ok", result.reason
    profile = load_profile("seed-qwen35-122b")
    params = {**resolve({"speculative_num_steps": 3}, exp.backend.flags),
              "speculative_algorithm": "EAGLE3", "tp_size": 2}
    workload = Workload(input_len=256, output_len=512, temperature=0.0)
    for level in result.levels:
        want = predict(profile, params, level.concurrency, workload)
        assert want.feasible
        assert level.output_tok_s == pytest.approx(want.output_tok_s, rel=0.10), level
        assert level.accept_length == pytest.approx(want.accept_length, rel=0.10)
        assert level.errors == 0
    assert result.facts.max_total_num_tokens == want.max_total_num_tokens
    assert result.facts.max_running_requests == want.max_running_requests
    # The memory the boot left and its graphs kept, read from the server's log as SGLang words
    # it (the simulator's figures, to the log's 0.01 GB), and kept in the trials table.
    facts = startup(profile, params)
    assert result.facts.extra[MEMORY_ROOM] == pytest.approx(facts.memory_room, abs=1e-4)
    assert result.facts.extra[GRAPH_MEMORY] == pytest.approx(facts.graph_memory, abs=1e-4)
    # flagged when C=16 is above the running limit (queueing), and only then
    c16 = next(lv for lv in result.levels if lv.concurrency == 16)
    assert c16.over_running_limit == (16 > want.max_running_requests)  # noqa: SIM300 (C first)

    tables = store.read_tables(ctx.run_dir)
    assert tables.trials.num_rows == 1 and tables.levels.num_rows == 2
    assert tables.trials.column("status").to_pylist() == ["ok"]
    stored = json.loads(tables.trials.column("facts_json").to_pylist()[0])
    assert stored[MEMORY_ROOM] == result.facts.extra[MEMORY_ROOM]
    assert tables.requests.num_rows > 0
    assert not list((tmp_path / "logs" / "pids").glob("*.json"))   # teardown done


@pytest.mark.parametrize("version", ["0.5.10.post1", "0.5.17"])
def test_a_trial_reads_the_same_from_either_releases_words(tmp_path: Path, version: str) -> None:
    """The simulator imitating SGLang 0.5.17 (backend.engine_version -> --sglang-version) logs
    the capture with a comma and streams the renamed spec fields; the trial reads the same
    memory facts and the same per-request counters from them as from 0.5.10.post1's."""
    text = EXP.read_text().replace("[backend]\n", f'[backend]\nengine_version = "{version}"\n', 1)
    text = text.replace("concurrency = [1, 16]", "concurrency = [4]", 1)
    text = text.replace("duration_s = 5.0", "duration_s = 2.0", 1)
    text = text.replace("output_len = 512", "output_len = 64", 1)
    path = tmp_path / "sim-release.toml"
    path.write_text(text)
    exp = load_experiment(path)
    ctx = TrialContext(run_dir=str(tmp_path / "run"), local_dir=tmp_path / "logs",
                       trial_id="t-release")
    result = run_trial(exp, {"speculative_num_steps": 3}, ctx)
    assert result.status == "ok", result.reason
    log = (tmp_path / "logs" / "t-release.log").read_text()
    comma = "Capture target verify CUDA graph end. elapsed="
    assert (comma in log) == (version == "0.5.17") and "Capture" in log
    params = {**resolve({"speculative_num_steps": 3}, exp.backend.flags),
              "speculative_algorithm": "EAGLE3", "tp_size": 2}
    facts = startup(load_profile("seed-qwen35-122b"), params)
    assert result.facts.extra[MEMORY_ROOM] == pytest.approx(facts.memory_room, abs=1e-4)
    assert result.facts.extra[GRAPH_MEMORY] == pytest.approx(facts.graph_memory, abs=1e-4)
    rows = [r for r in store.read_tables(ctx.run_dir).requests.to_pylist()
            if r["in_window"] and r["verify_ct"]]
    assert rows
    for r in rows:   # accepted + one token per verify step + the prefill's token
        assert r["accepted_tokens"] + r["verify_ct"] + 1 == r["output_tokens"]
        assert r["draft_tokens"] == 3 * r["verify_ct"]
        assert sum(r["accept_histogram"]) == r["verify_ct"]
    assert result.levels[0].accept_length is not None


def test_refused_config_is_an_infeasible_result(tmp_path: Path) -> None:
    exp = load_experiment(EXP)
    ctx = TrialContext(run_dir=str(tmp_path / "run"), local_dir=tmp_path / "logs",
                       trial_id="t-steps12")
    t0 = time.monotonic()
    result = run_trial(exp, {"speculative_num_steps": 12}, ctx)
    assert result.status == "infeasible"
    assert result.reason.startswith("kv_memory:") and "Not enough memory" in result.reason
    assert time.monotonic() - t0 < 20
    row = store.read_tables(ctx.run_dir).trials.to_pylist()[0]
    assert row["status"] == "infeasible" and row["n_levels"] == 0


CONTEXT_REFUSAL = ("Requested token count exceeds the model's maximum context length of 262144 "
                   "tokens. You requested a total of 300256 tokens: 256 tokens from the input "
                   "messages and 300000 tokens for the completion.")


def beyond_the_context(tmp_path: Path, api: str) -> Path:
    """sim-small asking for outputs longer than the model's context: every request refused."""
    text = EXP.read_text().replace("output_len = 512", "output_len = 300000", 1)
    text = text.replace("[backend]\n", f'[backend]\napi = "{api}"\n', 1)
    path = tmp_path / f"beyond-{api}.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("api, words", [
    ("generate", "error event in an http 200 stream: "),     # SGLang streams its refusal
    ("completions", "http 400: "),                            # its OpenAI API answers 400
])
def test_a_level_where_every_request_failed_fails_the_trial_with_the_servers_words(
        tmp_path: Path, api: str, words: str) -> None:
    exp = load_experiment(beyond_the_context(tmp_path, api))
    ctx = TrialContext(run_dir=str(tmp_path / "run"), local_dir=tmp_path / "logs",
                       trial_id="t-too-long")
    result = run_trial(exp, {"speculative_num_steps": 3}, ctx)
    assert result.status == "failed"
    assert result.reason.startswith(f"no request succeeded at C=1: {words}{CONTEXT_REFUSAL}"), \
        result.reason
    # The level is kept, marked, and the trial stopped there: C=16 would measure nothing more.
    (lv,) = result.levels
    assert lv.concurrency == 1 and lv.suspect and lv.output_tok_s == 0.0
    assert lv.note.startswith("no request succeeded, not a measurement: ")
    tables = store.read_tables(ctx.run_dir)
    row = tables.trials.to_pylist()[0]
    assert (row["status"], row["reason"], row["n_levels"]) == ("failed", result.reason, 1)
    details = {r["error_detail"] for r in tables.requests.to_pylist()}
    assert len(details) == 1 and details.pop().startswith(words + CONTEXT_REFUSAL)


def test_point_the_rules_refuse_is_never_booted(tmp_path: Path) -> None:
    exp = load_experiment(EXP)
    ctx = TrialContext(run_dir=str(tmp_path / "run"), local_dir=tmp_path / "logs",
                       trial_id="t-bad")
    result = run_trial(exp, {"speculative_num_steps": 2, "speculative_eagle_topk": 2,
                             "speculative_num_draft_tokens": 9}, ctx)
    assert result.status == "pruned" and "SGLang's draft tree" in result.reason
    assert not result.booted
    assert not (tmp_path / "logs" / "t-bad.log").exists()


def test_a_tree_the_servers_release_crashes_on_is_never_booted(tmp_path: Path) -> None:
    """SGLang >= 0.5.16 crashes at boot on a tree narrower than deep (seen on 0.5.17, an H100):
    the backend knows it from the release the servers run and spends no boot; the release
    before boots it."""
    text = EXP.read_text().replace("[backend]\n", '[backend]\nengine_version = "0.5.17"\n', 1)
    path = tmp_path / "sim-0517.toml"
    path.write_text(text)
    ctx = TrialContext(run_dir=str(tmp_path / "run"), local_dir=tmp_path / "logs",
                       trial_id="t-short")
    point = {"speculative_num_steps": 8, "speculative_eagle_topk": 2,
             "speculative_num_draft_tokens": 8}
    result = run_trial(load_experiment(path), point, ctx)
    assert result.status == "infeasible" and "checked before a boot" in result.reason
    assert "speculative_num_draft_tokens = 8 < speculative_num_steps + 1 = 9" in result.reason
    assert result.facts.boot_s is None and not (tmp_path / "logs" / "t-short.log").exists()
    assert not result.booted


def test_killing_the_trial_midway_leaves_no_server(tmp_path: Path) -> None:
    """SIGKILL the process running a trial while it measures: its server must not survive
    (the server leads its own process group; the next run reaps it by pidfile)."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "specdecode_tune.trial", "--experiment", str(EXP),
         "--set", "speculative_num_steps=4", "--run-dir", str(run_dir)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not pids:
            pids = server_pids(run_dir / "logs")
            time.sleep(0.2)
        assert pids, "the trial never started its server"
        time.sleep(1.5)                       # inside the first level
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        # The server follows its trial's death (PR_SET_PDEATHSIG), no reaping needed.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
            time.sleep(0.1)
        assert not any(pid_alive(p) for p in pids)
        # Its pidfile is left behind for a resumed run, which finds nothing left to end.
        from specdecode_tune.server import reap_orphans
        assert reap_orphans(run_dir / "logs" / "pids") == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for p in pids:
            if pid_alive(p):
                os.kill(p, signal.SIGKILL)


def test_trial_cli_prints_a_table_per_level(tmp_path: Path) -> None:
    # What the CLI prints is checked, not the figures: 128-token outputs in 2 s windows
    # (sim-small's 512 and 5 s took 19 s on 2 cores).
    text = EXP.read_text()
    for old, new in (("output_len = 512", "output_len = 128"),
                     ("duration_s = 5.0", "duration_s = 2.0")):
        assert old in text, old
        text = text.replace(old, new, 1)
    exp = tmp_path / "sim-small.toml"
    exp.write_text(text)
    out = subprocess.run(
        [sys.executable, "-m", "specdecode_tune.trial", "--experiment", str(exp),
         "--set", "speculative_num_steps=2", "--run-dir", str(tmp_path / "run")],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "status: ok" in out.stdout
    assert "C=1" in out.stdout and "C=16" in out.stdout
    assert "max_running_requests=21" in out.stdout          # the seed's figure at steps=2


def test_trial_cli_rejects_an_unknown_parameter(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "specdecode_tune.trial", "--experiment", str(EXP),
         "--set", "speculative_num_stepz=2", "--run-dir", str(tmp_path / "run")],
        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "speculative_num_stepz" in out.stderr
    assert not (tmp_path / "run").exists()
