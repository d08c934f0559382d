"""The stream server as a subprocess, and its control endpoints, for tests and benchmarks.

`start_subprocess` starts `python -m specdecode_tune.testing.streamserver` on a loopback port in
a new session and waits until it answers; `stop_subprocess` (from `..processes`) ends it by
PID; `reset` and `stats` call its `/reset` and `/stats` (see `app`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

from ..processes import stop_subprocess


def start_subprocess(
    port: int, *args: str, cpu: int | None = None, timeout_s: float = 15.0
) -> subprocess.Popen[bytes]:
    """Start the stream server on 127.0.0.1:`port` in a new session and wait until /health answers.

    `cpu` pins the server to one core, so a benchmark's client and server never share one.
    """
    def pin() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    proc = subprocess.Popen(
        [sys.executable, "-m", "specdecode_tune.testing.streamserver", "--port", str(port),
         *args],
        start_new_session=True,
        preexec_fn=pin if cpu is not None else None,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"stream server exited with {proc.returncode}: {err[-500:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.05)
    stop_subprocess(proc)
    raise RuntimeError(f"stream server on port {port} not ready after {timeout_s}s")


def _post_json(port: int, path: str, obj: dict) -> dict:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(obj).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def reset(port: int, **config: object) -> dict:
    """Reconfigure a running server (fields of `StreamConfig`) and clear its statistics."""
    return _post_json(port, "/reset", config)


def stats(port: int, t0: float | None = None, t1: float | None = None) -> dict:
    q = f"?t0={t0!r}&t1={t1!r}" if t0 is not None and t1 is not None else ""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats{q}", timeout=5) as r:
        return json.loads(r.read())
