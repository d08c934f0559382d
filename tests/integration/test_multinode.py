"""The search on a real two-node Ray cluster on this machine, and the loss of a worker node.

Two raylets are started with `ray start --block`, each in its own process session with its own
temp dir and ports: a head on 127.0.0.2 and a worker on 127.0.0.3, 2 logical GPUs and 1 CPU
each, so each node runs one trial at a time. (`ray start` turns 127.0.0.1 into the host's
network address; other loopback addresses are kept, and they let Tune's per-trial `node_ip`
tell the two raylets apart, which the trials table's `node` column (the host name) cannot.)
Token authentication stays on, with a token made for the test.

One search runs on the cluster through `--address`; midway, while a trial runs on the worker,
the worker's raylet is killed by PID. The search must finish (or, if it stops, resume) with
every planned trial in the one run dir and no row lost or written twice.

Every process started here carries the test's tag in its environment and is ended by PID at the
end; `ray stop` is never used (it would end other clusters on this machine).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from specdecode_tune import store
from tests.conftest import DATA, REPO, pick_free_port, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

HEAD_IP = "127.0.0.2"
WORKER_IP = "127.0.0.3"
# The baseline, two trials (one a node), the third with the incumbent's early re-measurement
# (one a node: the worker's is the one cut off), then the fourth and the final re-measurement on
# the head alone: every step the test checks, with no trial more than it needs.
MAX_TRIALS = 4


# ---------------------------------------------------------------------------------------------
# Processes


def _environ(pid: int) -> list[bytes]:
    try:
        return (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def processes_with(var: str, value: str) -> dict[int, str]:
    """PID -> command line of every process whose environment holds VAR=VALUE."""
    needle = f"{var}={value}".encode()
    return {int(d.name): _cmdline(int(d.name)) for d in Path("/proc").iterdir()
            if d.name.isdigit() and needle in _environ(int(d.name))}


@dataclass
class RayNode:
    """One raylet (and its helpers) started by `ray start --block` in its own session."""

    name: str
    ip: str
    temp_dir: Path
    log_path: Path
    proc: subprocess.Popen
    tag: str

    def started(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"ray start ({self.name}) exited with {self.proc.returncode}:"
                                 f"\n{self.log_path.read_text()[-3000:]}")
        return "Ray runtime started" in self.log_path.read_text()

    def raylet_pid(self) -> int:
        """The raylet of this node: tagged, and pointed at this node's temp dir."""
        pids = [pid for pid, cmd in processes_with("SPECDECODE_TEST_NODE", self.name).items()
                if "/raylet/raylet " in cmd and str(self.temp_dir) in cmd
                and f"SPECDECODE_TEST_TAG={self.tag}".encode() in _environ(pid)]
        assert len(pids) == 1, f"expected one raylet for {self.name}, found {pids}"
        return pids[0]


@dataclass
class Cluster:
    tag: str
    env: dict[str, str]
    address: str
    nodes: dict[str, RayNode] = field(default_factory=dict)


def start_node(name: str, ip: str, extra: list[str], env: dict[str, str], tmp: Path,
               tag: str) -> RayNode:
    # Short temp dirs: Ray puts Unix sockets under them (107-byte path limit).
    temp_dir = Path(tempfile.mkdtemp(prefix=f"sdt-{name}-", dir="/tmp"))
    log_path = tmp / f"ray-{name}.log"
    ports = {flag: pick_free_port() for flag in (
        "--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port")}
    argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block",
            f"--node-ip-address={ip}", "--num-gpus=2", "--num-cpus=1",
            f"--resources={json.dumps({f'node_{name}': 1})}",
            "--disable-usage-stats", f"--temp-dir={temp_dir}",
            "--object-store-memory=100000000",
            # Workers on OS-chosen ports: two raylets must not share Ray's default port range.
            "--min-worker-port=0", "--max-worker-port=0",
            *[f"{flag}={port}" for flag, port in ports.items()], *extra]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, env={**env, "SPECDECODE_TEST_NODE": name}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    return RayNode(name=name, ip=ip, temp_dir=temp_dir, log_path=log_path, proc=proc, tag=tag)


def end_tagged(tag: str) -> list[int]:
    """SIGTERM each `ray start` (it ends its own raylet, GCS and agents), then SIGKILL every
    process still carrying the tag. Returns the PIDs that needed the SIGKILL."""
    for pid, cmd in processes_with("SPECDECODE_TEST_TAG", tag).items():
        if "ray.scripts.scripts start" in cmd:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and processes_with("SPECDECODE_TEST_TAG", tag):
        time.sleep(0.5)
    left = list(processes_with("SPECDECODE_TEST_TAG", tag))
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    tag = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # Every node and the driver must present the same token; worker nodes only send one when
    # the mode is set explicitly.
    env.update(SPECDECODE_TEST_TAG=tag, RAY_AUTH_MODE="token",
               RAY_AUTH_TOKEN=secrets.token_hex(32), RAY_USAGE_STATS_ENABLED="0")
    port = pick_free_port()
    c = Cluster(tag=tag, env=env, address=f"{HEAD_IP}:{port}")
    try:
        c.nodes["head"] = start_node("head", HEAD_IP, [
            "--head", f"--port={port}", "--include-dashboard=false"], env, tmp_path, tag)
        wait_for(c.nodes["head"].started, 60, "the Ray head")
        c.nodes["worker"] = start_node("worker", WORKER_IP, [f"--address={c.address}"], env,
                                       tmp_path, tag)
        wait_for(c.nodes["worker"].started, 60, "the Ray worker node")
        yield c
    finally:
        end_tagged(tag)
        for node in c.nodes.values():
            shutil.rmtree(node.temp_dir, ignore_errors=True)
        sims = [pid for pid, cmd in processes_with("SPECDECODE_TEST_TAG", tag).items()
                if "specdecode_tune.sim" in cmd]
        assert not sims, f"simulator servers left running: {sims}"


# ---------------------------------------------------------------------------------------------
# What the run dir says


def trials_rows(run_dir: Path) -> list[dict]:
    if not (run_dir / "tables" / "trials").exists():
        return []
    return store.read_tables(str(run_dir)).trials.to_pylist()


def tune_nodes(run_dir: Path) -> dict[str, list[str]]:
    """Tune trial id -> IPs of the nodes it reported from, in order (Tune adds `node_ip` to
    every result; a trial moved to another node after a failure shows both)."""
    out: dict[str, list[str]] = {}
    for path in run_dir.glob("*/result.json"):
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                ips = out.setdefault(r["trial_id"], [])
                if not ips or ips[-1] != r["node_ip"]:
                    ips.append(r["node_ip"])
    return out


def trial_on(node: str, tag: str, run_dir: Path) -> str | None:
    """The trial whose simulator server runs on `node` now (its pidfile names the server)."""
    sims = {pid for pid, cmd in processes_with("SPECDECODE_TEST_NODE", node).items()
            if "specdecode_tune.sim" in cmd
            and f"SPECDECODE_TEST_TAG={tag}".encode() in _environ(pid)}
    for pidfile in (run_dir / "logs" / "pids").glob("*.json"):
        try:
            if json.loads(pidfile.read_text())["pid"] in sims:
                return pidfile.stem
        except (OSError, ValueError, KeyError):
            continue
    return None


# ---------------------------------------------------------------------------------------------
# The test


def test_search_spans_two_nodes_and_survives_losing_one(tmp_path: Path,
                                                        cluster: Cluster) -> None:
    t0 = time.monotonic()
    storage = tmp_path / "runs"
    run_dir = storage / "sim-small"
    # What is checked is where the trials ran and what the run dir kept, not what they measured:
    # outputs of 128 tokens instead of sim-small's 512 (each trial's warm-up request is one),
    # as tests/integration/test_search.py. The 5 s windows stay: the worker's raylet is killed
    # about a second into a level, which must still be running then.
    exp = tmp_path / "sim-small.toml"
    text = (DATA / "sim-small.toml").read_text()
    assert "output_len = 512" in text
    exp.write_text(text.replace("output_len = 512", "output_len = 128", 1))
    cmd = [sys.executable, "-m", "specdecode_tune.search", "--experiment",
           str(exp), "--address", cluster.address, "--storage",
           str(storage), "--max-trials", str(MAX_TRIALS)]
    log_path = tmp_path / "search.log"
    with open(log_path, "w") as log:
        driver = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                  env=cluster.env)
    interrupted: list[str] = []
    try:
        # Let each node finish a trial; then, once a trial on the worker has reported its first
        # level (a checkpoint), kill the worker's raylet while it measures the next one.
        def both_nodes_done_one() -> bool:
            nodes = tune_nodes(run_dir)
            done = {r["trial_id"] for r in trials_rows(run_dir)}
            return {nodes[t][-1] for t in done if t in nodes} >= {HEAD_IP, WORKER_IP}

        wait_for(both_nodes_done_one, 180, "a finished trial on each node")

        def worker_trial_past_first_level() -> bool:
            tid = trial_on("worker", cluster.tag, run_dir)
            if tid and f"level  {tid}  C=1 " in log_path.read_text():
                interrupted[:] = [tid]
                return True
            return False

        wait_for(worker_trial_past_first_level, 90, "a worker trial past its first level")
        time.sleep(1.0)
        before = {r["trial_id"] for r in trials_rows(run_dir)}
        os.kill(cluster.nodes["worker"].raylet_pid(), signal.SIGKILL)
        killed_at = time.monotonic() - t0
        rc = driver.wait(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    out = log_path.read_text()
    resumed = ""
    if rc != 0:
        # The search may stop on the lost node; the same command resumes it on the head alone.
        res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240,
                             env=cluster.env, check=False)
        resumed = res.stdout + res.stderr
        assert res.returncode == 0, out[-3000:] + "\n--- resume ---\n" + resumed[-3000:]
        assert "resuming" in res.stdout
    nodes = tune_nodes(run_dir)
    rows = trials_rows(run_dir)
    ids = [r["trial_id"] for r in rows]
    per_node = Counter(nodes[t][-1] for t in ids if t in nodes)
    print(f"\ntrials finished per node: {dict(per_node)} (+ the baseline); worker lost at "
          f"{killed_at:.0f}s while {interrupted[0]} ran on it (nodes it reported from: "
          f"{nodes.get(interrupted[0])}); driver exit {rc}; total {time.monotonic() - t0:.0f}s")

    assert len(ids) == len(set(ids)), f"a trial row was written twice: {ids}"
    assert before <= set(ids), "rows written before the node was lost are gone"
    explored = [r for r in rows if r["trial_id"] != "baseline" and r["repeat"] == 0]
    assert len(explored) == MAX_TRIALS, (len(explored), out[-3000:], resumed[-2000:])
    assert per_node[HEAD_IP] >= 1 and per_node[WORKER_IP] >= 1, per_node

    # Nothing lost: the trial cut off by the node's loss was finished on the head, from its
    # checkpoint (its first level is not measured again), not dropped as an errored trial.
    assert interrupted[0] in ids, (
        f"trial {interrupted[0]} (running on the lost node) has no row: it errored instead of "
        f"being retried on another node\n" + out[-3000:])
    assert nodes[interrupted[0]][0] == WORKER_IP and nodes[interrupted[0]][-1] == HEAD_IP
    assert "Trials did not complete" not in out + resumed

    # One run dir for both nodes: every table is complete, with no row twice.
    tables = store.read_tables(str(run_dir))
    lv = [(r["trial_id"], r["concurrency"]) for r in tables.levels.to_pylist()]
    assert len(lv) == len(set(lv)), "a level row was written twice"
    assert {t for t, _ in lv} <= set(ids), "level rows of a trial that has no row"
    for r in rows:
        if r["status"] == "ok":
            assert sum(1 for t, _ in lv if t == r["trial_id"]) == 2, r["trial_id"]
    req = [(r["trial_id"], r["level"], r["index"]) for r in tables.requests.to_pylist()]
    assert len(req) == len(set(req)), "a request row was written twice"
