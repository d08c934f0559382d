"""The search asks SGLang's own parser before a boot (issue 16, "pre-flight with the engine's
own parser on the node"): the backend runs `specdecode_tune/backends/sglang_argcheck.py` with
the Python that launches the servers (`backend.python`, here the SGLang venv's from
`scripts/install_sglang_cpu.sh`), so an argv SGLang refuses costs no boot, and a refusal of
every point stops the search before the first one. The models are the config-only stand-ins.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path

import pytest

from specdecode_tune.backends import get_backend, refusals
from specdecode_tune.errors import ConfigError
from specdecode_tune.search.preflight import plan_run
from specdecode_tune.space import resolve
from specdecode_tune.trial import TrialContext, run_trial
from tests.contract.sglang_models import write_models
from tests.contract.test_sglang_parser import (
    RADIX_REFUSAL,
    SGLANG_PY,
    SGLANG_VERSION,
    load,
    stand_in,
)

pytestmark = [pytest.mark.engines, pytest.mark.timeout(600)]

SEED = "seed-sglang-eagle3"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not (SGLANG_PY.is_file() and os.access(SGLANG_PY, os.X_OK)):
        pytest.skip(f"no SGLang venv python at {SGLANG_PY}: run scripts/install_sglang_cpu.sh")
    return write_models(tmp_path_factory.mktemp("sglang-preflight") / "models")


def seed_experiment(models: dict[str, Path], *, radix: bool = False):
    """The seed's experiment on the stand-ins, its servers launched by the SGLang venv's
    Python; `radix` leaves out the `disable_radix_cache` it ships with."""
    exp = load(SEED)
    cfg = dataclasses.replace(stand_in(exp, models), python=str(SGLANG_PY))
    if radix:
        cfg = dataclasses.replace(cfg, flags={k: v for k, v in cfg.flags.items()
                                              if k != "disable_radix_cache"})
    return dataclasses.replace(exp, backend=cfg)


POINTS = ({"speculative_num_steps": 4, "speculative_eagle_topk": 1},
          {"speculative_num_steps": 3, "speculative_eagle_topk": 4,
           "speculative_num_draft_tokens": 16},
          {"speculative_num_steps": 8, "speculative_eagle_topk": 2,
           "speculative_num_draft_tokens": 8})


def test_the_backend_reads_the_servers_sglang_version(models: dict[str, Path]) -> None:
    exp = seed_experiment(models)
    assert get_backend("sglang").engine_version(exp.backend) == (
        SGLANG_VERSION, "the sglang of backend.python")


def test_the_backends_check_is_sglangs_verdict(models: dict[str, Path],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """As shipped every point parses; without the flag each gets SGLang's own refusal, the
    same words for every point; a model this machine cannot read is not a verdict."""
    shipped, radix = seed_experiment(models), seed_experiment(models, radix=True)
    resolved = [resolve(p, shipped.backend.flags) for p in POINTS]
    assert refusals(shipped.backend, resolved) == [None] * len(POINTS)
    found = refusals(radix.backend, [resolve(p, radix.backend.flags) for p in POINTS])
    assert all(f is not None and RADIX_REFUSAL in f for f in found), found
    assert len(set(found)) == 1 and f"SGLang {SGLANG_VERSION}'s own" in found[0]
    hub = dataclasses.replace(radix.backend, model_path="Qwen/Qwen3.5-122B-A10B")
    # Unreadable here because the hub is: offline at once (the parser's Python inherits it),
    # instead of after ~22 s of retries on a machine without network.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert refusals(hub, [resolve(POINTS[0], hub.flags)]) == [None]   # cannot tell: boots


def test_a_refusal_of_every_point_stops_the_search_before_a_boot(
        models: dict[str, Path], tmp_path: Path) -> None:
    args = argparse.Namespace(storage=str(tmp_path / "runs"), name=None, address=None)
    exp = seed_experiment(models, radix=True)
    exp = dataclasses.replace(exp, cluster=dataclasses.replace(exp.cluster, num_gpus=2))
    with pytest.raises(ConfigError) as e:
        plan_run(exp, args)
    line = str(e.value)
    # The backend knows this refusal (its own check comes first, in SGLang's words); where
    # it does not, the parser's run on the points says the same (test above).
    assert "\n" not in line and RADIX_REFUSAL in line
    assert "disable_radix_cache = true" in line          # what to set
    assert not (tmp_path / "runs").exists()              # nothing written
    plan_run(seed_experiment(models), args)              # as shipped: it passes


def test_a_flag_sglang_does_not_know_stops_the_search_in_its_words(
        models: dict[str, Path], tmp_path: Path) -> None:
    args = argparse.Namespace(storage=str(tmp_path / "runs"), name=None, address=None)
    exp = seed_experiment(models)
    exp = dataclasses.replace(exp, backend=dataclasses.replace(
        exp.backend, extra_args=("--speculative-adaptive",)))
    with pytest.raises(ConfigError) as e:
        plan_run(exp, args)
    line = str(e.value)
    assert "\n" not in line and f"SGLang {SGLANG_VERSION}'s own argument check" in line
    assert "unrecognized arguments: --speculative-adaptive" in line


def test_a_refused_point_costs_no_boot(models: dict[str, Path], tmp_path: Path) -> None:
    exp = seed_experiment(models, radix=True)
    ctx = TrialContext(run_dir=str(tmp_path / "run"), local_dir=tmp_path / "logs",
                       trial_id="t-refused")
    t0 = time.monotonic()
    result = run_trial(exp, POINTS[1], ctx)
    assert result.status == "infeasible"
    assert result.reason.startswith("invalid_args: ") and RADIX_REFUSAL in result.reason
    assert "checked before a boot" in result.reason
    assert result.facts.boot_s is None                   # no server was started
    assert not list((tmp_path / "logs").rglob("*.log"))
    assert time.monotonic() - t0 < 120
