"""Shared test fixtures: loopback ports, process checks (the processes a tagged search started
are found by `specdecode_tune.testing.processes`) and a bounded wait."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from specdecode_tune.server import pick_free_port, pid_running

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
PYTHON = sys.executable


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    return pid_running(pid)


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll `predicate` every 0.5 s until it holds; AssertionError naming `what` after
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


@pytest.fixture
def free_port() -> int:
    return pick_free_port()


def bench_module(name: str):
    """benchmarks/<name>.py as a module (once per process; benchmarks/ on sys.path, since the
    benchmark scripts import each other from beside themselves)."""
    import importlib.util
    import sys
    if name in sys.modules:
        return sys.modules[name]
    bench = REPO / "benchmarks"
    if str(bench) not in sys.path:
        sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location(name, bench / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module          # dataclasses and pickling look it up
    spec.loader.exec_module(module)
    return module
