"""benchmarks/capture_memory.py's bisection and figures, with a stand-in for the GPU probe (the
probe itself needs CUDA: the benchmark runs on a GPU machine)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "capture_memory.py"
GiB = 1 << 30


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("capture_memory", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bisection_finds_the_room_and_the_figures_follow(monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """A capture that needs 3 GiB at its peak and keeps 2 GiB (the warm-up's 1 GiB freed before
    every reading, as `torch.cuda.graph` empties the cache: the progress's least reading is the
    end reading, as measured on an H200): the true room at the reference is the reference's free
    memory less 3 GiB, to the bisection's 16 MiB."""
    cm = load()
    peak, kept = 3 * GiB, 2 * GiB

    def probe(tokens: int, leave: int, bs_list: str = "pow2") -> dict:
        if leave < peak:
            return {"oom": True}
        return {"oom": False, "before": leave, "after": leave - kept,
                "least_progress": leave - kept}

    monkeypatch.setattr(cm, "run_probe", probe)
    row = cm.measure(4)
    true = (cm.REFERENCE_FREE - peak) / GiB
    assert row["true_room_gib"] == pytest.approx(true, abs=16 / 1024)
    assert row["least_progress_gib"] == pytest.approx(true + 1)
    assert row["end_reading_gib"] == pytest.approx(true + 1)
    assert row["graphs_gib"] == pytest.approx(2)
    assert row["warm_up_over_graphs"] == pytest.approx(0.5, abs=0.01)
