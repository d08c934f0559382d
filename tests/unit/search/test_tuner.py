"""The Tune Tuner a new search builds (search/tuner.py), read before Ray starts: Tune's
`with_parameters` (which puts the experiment into Ray's object store) and the Tuner itself are
replaced by recorders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specdecode_tune.config import load_experiment
from tests.conftest import DATA


def built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The keyword arguments a fresh search's `build_tuner` gives `tune.Tuner`."""
    from ray import tune

    from specdecode_tune.search.preflight import RunPlan
    from specdecode_tune.search.tuner import build_tuner

    seen: dict[str, Any] = {}

    def tuner(trainable: Any, **kwargs: Any) -> dict[str, Any]:
        seen.update(kwargs)
        return seen

    monkeypatch.setattr(tune, "with_parameters", lambda fn, **_kw: fn)
    monkeypatch.setattr(tune, "Tuner", tuner)
    exp = load_experiment(DATA / "sim-small.toml")
    plan = RunPlan(exp=exp, run_dir=str(tmp_path / "r"), local_dir=tmp_path / "r",
                   storage=str(tmp_path), name="r", is_uri=False)
    build_tuner(plan, [], "hybrid", 0, 4, resume=False)
    return seen


def test_a_trial_runs_in_the_actor_of_the_trial_before_it(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Tune reuses a finished trial's actor (its worker process and GPUs) for the next trial
    of the same resources: a new actor is a new Ray worker process that imports Tune and this
    package before the trial starts, 3-5 s of each gap between trials on the README's search
    (docs/search-efficiency.md, "The README's search: where its time goes")."""
    config = built(tmp_path, monkeypatch)["tune_config"]
    assert config.reuse_actors is True
    assert config.max_concurrent_trials == 2
