"""Shared test fixtures: loopback ports and process checks (the processes a tagged search
started are found by `specdecode_tune.testing.processes`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from specdecode_tune.server import pick_free_port, pid_running

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
PYTHON = sys.executable


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    return pid_running(pid)


@pytest.fixture
def free_port() -> int:
    return pick_free_port()
