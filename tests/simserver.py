"""Test helper: run the simulator as a real subprocess on a free loopback port.

    with run_sim("--speculative-algorithm", "EAGLE3", ..., "--boot-time", "0.2") as (url, proc):
        ...   # url = "http://127.0.0.1:PORT", healthy

The process starts in its own session, logs to a temp file (`sim_log(proc)` reads it) and is
always stopped by its PID on exit: SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from conftest import pick_free_port

from specdecode_tune.testing.processes import stop_subprocess

_LOGS: dict[int, Path] = {}


def sim_log(proc: subprocess.Popen[bytes]) -> str:
    """Everything the simulator process wrote (stdout and stderr) so far."""
    path = _LOGS.get(proc.pid)
    return path.read_text(errors="replace") if path and path.exists() else ""


def health_status(base_url: str, path: str = "/health") -> int | None:
    """HTTP status of GET base_url+path; None if nothing answers."""
    try:
        with urllib.request.urlopen(base_url + path, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return None


def wait_healthy(base_url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Poll /health until 200; raise if the process dies or the deadline passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"simulator exited with {proc.returncode} before healthy:\n"
                               f"{sim_log(proc)[-3000:]}")
        if health_status(base_url) == 200:
            return
        time.sleep(0.05)
    raise TimeoutError(f"simulator not healthy after {timeout} s:\n{sim_log(proc)[-3000:]}")


def stop(proc: subprocess.Popen[bytes], grace: float = 5.0) -> int:
    """SIGTERM the process by PID, SIGKILL after `grace` seconds; returns the exit code."""
    stop_subprocess(proc, grace)
    return proc.returncode


def start_sim(*args: str, env: dict[str, str] | None = None) -> tuple[str, subprocess.Popen[bytes]]:
    """Start `python -m specdecode_tune.sim ARGS` on a free port (unless ARGS has --port)."""
    argv = list(args)
    if "--port" in argv:
        port = int(argv[argv.index("--port") + 1])
    else:
        port = pick_free_port()
        argv += ["--port", str(port)]
    if "--host" not in argv:
        argv += ["--host", "127.0.0.1"]
    fd, log_path = tempfile.mkstemp(prefix="sim-", suffix=".log")
    full_env = dict(os.environ if env is None else env)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    with os.fdopen(fd, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "specdecode_tune.sim", *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            start_new_session=True,
        )
    _LOGS[proc.pid] = Path(log_path)
    return f"http://127.0.0.1:{port}", proc


@contextmanager
def run_sim(
    *args: str, env: dict[str, str] | None = None, wait: bool = True, timeout: float = 30.0
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Run the simulator for the block; waits until healthy unless `wait=False`."""
    base_url, proc = start_sim(*args, env=env)
    try:
        if wait:
            wait_healthy(base_url, proc, timeout)
        yield base_url, proc
    finally:
        stop(proc)
        path = _LOGS.pop(proc.pid, None)
        if path is not None:
            path.unlink(missing_ok=True)
