"""The GPU experiment's command lines against SGLang 0.5.17's own argument parser: the release
its servers run (experiments/sglang-gpu.toml `engine_version`), whose flag names differ from
0.5.10.post1's (`--cuda-graph-max-bs-decode`; the speculative checks moved to
`sglang/srt/arg_groups/`).

Each command line the backend builds for the experiment (the baseline, a sample of the space,
the enqueued point, the adaptive schedule the report would write) goes through the backend's
own checker, `specdecode_tune/backends/sglang_argcheck.py` (SGLang's `prepare_server_args` and
`check_server_args`, with `--device cpu` on a machine without a GPU), run by the Python of
`scripts/install_sglang_release_cpu.sh 0.5.17`: exactly what a search's trial runs before a
boot. Skipped where that Python does not exist (say so: CI builds it). The models are
config-only stand-ins (tests/contract/sglang_models.py: a Llama target, as the route trains).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from specdecode_tune import enginecache
from specdecode_tune.backends import get_backend
from specdecode_tune.backends.sglang_python import ARGCHECK
from specdecode_tune.config import load_experiment
from specdecode_tune.space import BASELINE, invalid_reason, resolve
from tests.contract.sglang_models import write_models
from tests.contract.test_sglang_parser import sample_points, server_args_of

pytestmark = [pytest.mark.engines, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
RELEASE = "0.5.17"
RELEASE_PY = Path(os.environ.get("SGLANG_0517_PYTHON")
                  or enginecache.cache_dir() / f"sglang-{RELEASE}" / "python")


def check(cases: list[list[str]]) -> dict[str, Any]:
    job = {"cases": [{"argv": a, "env": {}} for a in cases], "cpu_if_no_gpu": True}
    proc = subprocess.run([str(RELEASE_PY), ARGCHECK], input=json.dumps(job),
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def gpu_experiment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not (RELEASE_PY.is_file() and os.access(RELEASE_PY, os.X_OK)):
        pytest.skip(f"no SGLang {RELEASE} parser at {RELEASE_PY}: run "
                    f"scripts/install_sglang_release_cpu.sh {RELEASE}")
    tmp = tmp_path_factory.mktemp("sglang-release")
    models = write_models(tmp / "models")
    exp = load_experiment(REPO / "experiments" / "sglang-gpu.toml")
    assert exp.backend.engine_version == RELEASE
    cfg = dataclasses.replace(exp.backend, model_path=str(models["llama"]),
                              draft_model_path=str(models["eagle3"]))
    backend = get_backend("sglang")
    points = [dict(BASELINE), *sample_points(exp)]
    cases: dict[str, list[str]] = {}
    for i, point in enumerate(points):
        params = resolve(point, cfg.flags)
        if invalid_reason(params) is None:
            cases[f"p{i}"] = server_args_of(backend.argv(cfg, params, 30000))
    # The per-batch-size schedule the report writes for SGLang (topk 1, draft = steps + 1):
    # 5 steps alone, 1 from batch 4 on, as it was booted on the GPU machine by hand.
    schedule = tmp / "adaptive.json"
    schedule.write_text(json.dumps({"1": {"candidate_steps": [5]},
                                    "4": {"candidate_steps": [1]}}))
    top = resolve({"speculative_num_steps": 5, "speculative_eagle_topk": 1,
                   "mem_fraction_static": 0.006}, cfg.flags)
    settings, why = backend.schedule_params(cfg, top, str(schedule))
    assert settings is not None, why
    cases["schedule"] = server_args_of(backend.argv(cfg, settings, 30000))
    # Its steps outside the file's candidates: SGLang's own check must refuse that one.
    off = resolve({**top, "speculative_num_steps": 3}, cfg.flags)
    cases["schedule-off"] = server_args_of(
        backend.argv(cfg, {**off, **backend.adaptive_flags(str(schedule))}, 30000))
    out = check(list(cases.values()))
    return {"version": out["sglang"], "answers": dict(zip(cases, out["cases"], strict=True)),
            "argv": cases}


def test_the_parser_is_the_release_the_experiment_names(gpu_experiment):
    assert gpu_experiment["version"] == RELEASE


def test_every_command_line_of_the_space_parses(gpu_experiment):
    answers = {k: v for k, v in gpu_experiment["answers"].items() if k.startswith("p")}
    assert len(answers) >= 10
    bad = {k: v.get("error") for k, v in answers.items() if not v["ok"]}
    assert not bad, bad


def test_the_renamed_graph_flag_is_the_one_sent(gpu_experiment):
    argv = gpu_experiment["argv"]["p1"]
    assert "--cuda-graph-max-bs-decode" in argv and "--cuda-graph-max-bs" not in argv


def test_the_speculative_triple_reaches_sglang_as_sent(gpu_experiment):
    for key, answer in gpu_experiment["answers"].items():
        argv = gpu_experiment["argv"][key]
        if not answer["ok"] or "--speculative-num-steps" not in argv or "adaptive" in key:
            continue
        sent = [int(argv[argv.index(f) + 1]) for f in (
            "--speculative-num-steps", "--speculative-eagle-topk",
            "--speculative-num-draft-tokens")]
        assert answer["triple"] == sent, (key, answer["triple"], sent)


def test_the_adaptive_schedule_parses(gpu_experiment):
    answer = gpu_experiment["answers"]["schedule"]
    assert answer["ok"], answer.get("error")


def test_steps_outside_the_schedule_are_refused_by_sglang(gpu_experiment):
    answer = gpu_experiment["answers"]["schedule-off"]
    assert not answer["ok"] and answer["refused"], answer
    assert "candidate_steps" in answer["error"], answer["error"]
