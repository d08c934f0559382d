"""What a killed search driver left is found and ended by the next driver of the same run.

A dead driver is stood in for by a short-lived process whose pid is recorded; its 'leftovers'
are processes that carry its token in their environment, or that hold a file open in a Ray
session dir named after its pid (as Ray names them). A live stranger is never touched."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from specdecode_tune.errors import RunInUse
from specdecode_tune.procfs import pid_running, start_ticks
from specdecode_tune.search.leftovers import (
    RUN_TOKEN_ENV,
    driver_processes,
    reap_driver,
    record_driver,
)
from specdecode_tune.store.rundir import DRIVER_FILE

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_dead_drivers_token_and_session_holders_are_ended(tmp_path: Path, procs) -> None:
    token, dead = uuid.uuid4().hex, _dead_pid()
    by_token = subprocess.Popen(SLEEP, env={**os.environ, RUN_TOKEN_ENV: token})
    session = tmp_path / f"session_2026-12-01_20-27-59_656506_{dead}" / "logs"
    session.mkdir(parents=True)
    holder = subprocess.Popen(SLEEP, stdout=open(session / "raylet.out", "w"))  # noqa: SIM115
    stranger = subprocess.Popen(SLEEP, env={**os.environ, RUN_TOKEN_ENV: "another"})
    procs += [by_token, holder, stranger]
    (tmp_path / DRIVER_FILE).write_text(json.dumps({
        "kind": "specdecode_tune.driver", "pid": dead, "proc_start": None,
        "host": socket.gethostname(), "boot_id": None, "token": token}))
    time.sleep(0.2)
    assert set(driver_processes(token, dead)) == {by_token.pid, holder.pid}
    ended = reap_driver(tmp_path)
    assert sorted(ended) == sorted([by_token.pid, holder.pid])
    time.sleep(0.2)
    assert not pid_running(by_token.pid) or by_token.poll() is not None
    assert holder.poll() is not None and by_token.poll() is not None
    assert stranger.poll() is None                   # not the dead driver's: left alone
    assert not (tmp_path / DRIVER_FILE).exists()


def test_a_live_driver_keeps_its_run(tmp_path: Path) -> None:
    record_driver(tmp_path, uuid.uuid4().hex)        # this process: alive
    data = json.loads((tmp_path / DRIVER_FILE).read_text())
    data["pid"] = os.getppid()                       # a live process other than this one
    data["proc_start"] = start_ticks(os.getppid())
    (tmp_path / DRIVER_FILE).write_text(json.dumps(data))
    with pytest.raises(RunInUse) as e:
        reap_driver(tmp_path)
    assert e.value.pid == os.getppid()
