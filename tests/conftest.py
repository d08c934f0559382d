"""Shared test fixtures: loopback ports and process checks."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Iterable

import pytest

from specdecode_tune.server import pid_running

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
PYTHON = sys.executable


def pick_free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    return pid_running(pid)


@pytest.fixture
def free_port() -> int:
    return pick_free_port()


def tagged_processes(tag: str) -> dict[int, str]:
    """Processes whose environment carries SPECDECODE_TEST_TAG=tag, with their command lines.

    A test gives its search this tag: Ray's processes, the trials and the servers all inherit
    the driver's environment, so this finds everything the test started, and nothing else."""
    found = {}
    needle = f"SPECDECODE_TEST_TAG={tag}".encode()
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
    for pid in pids:
        try:
            os.kill(pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
