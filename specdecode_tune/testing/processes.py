"""The processes a test or a benchmark started, found by a tag in their environment.

A test or benchmark gives its search `SPECDECODE_TEST_TAG=<tag>` (`TEST_TAG_ENV`): Ray's
processes, the trials and the servers all inherit the driver's environment, so
`tagged_processes` finds everything it started, and nothing else; `kill_pids` ends them by PID.
`stop_subprocess` ends one server a test started (SIGTERM, then SIGKILL), by PID, and reaps it.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path

TEST_TAG_ENV = "SPECDECODE_TEST_TAG"


def tagged_processes(tag: str) -> dict[int, str]:
    """Processes whose environment carries SPECDECODE_TEST_TAG=tag, with their command lines."""
    found = {}
    needle = f"{TEST_TAG_ENV}={tag}".encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if needle in (d / "environ").read_bytes().split(b"\0"):
                found[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            pass
    return found


def kill_pids(pids: Iterable[int]) -> None:
    """SIGKILL each pid; one that is gone already, or not ours, is passed over."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def stop_subprocess(proc: subprocess.Popen[bytes], grace_s: float = 3.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`; by PID, and reaped."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=grace_s)
        except ProcessLookupError:
            pass
    if proc.stderr is not None:
        proc.stderr.close()
