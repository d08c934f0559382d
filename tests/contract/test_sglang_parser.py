"""The SGLang backend against SGLang's own code (0.5.10.post1): its argument checks and its
draft tree, run on the argv and the launch commands the project builds (issue 16).

Runs `tests/contract/sglang_probe.py` once per module with the python of the venv from
`scripts/install_sglang_cpu.sh` (${SPECDECODE_CACHE}/sglang-venv, or SGLANG_PYTHON=path);
skipped only when that python does not exist. Every case goes through
`prepare_server_args(argv)` and `check_server_args()` with `--device cpu` appended (the GPU-only
branches of the checks are not taken: see docs/engines-sglang.md). The models are config-only
stand-ins (tests/contract/sglang_models.py): the Qwen3.5-MoE hybrid for the seed's
experiments, a Llama target as the control.

What SHOULD hold is asserted; where the project disagrees with SGLang today the test is
`xfail(strict=True)` with the finding, so fixing the backend flips it to a failure that asks for
the mark to go (none is marked today: findings 1, 3 and 4 of issue 16 were fixed).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from specdecode_tune import enginecache, store
from specdecode_tune.backends import get_backend
from specdecode_tune.backends.sglang_logs import memory_facts
from specdecode_tune.backends.sglang_releases import radix_spec_refusal
from specdecode_tune.config import Experiment, load_experiment
from specdecode_tune.records import (
    GRAPH_MEMORY,
    MEMORY_ROOM,
    LevelSummary,
    ServerFacts,
    TrialResult,
)
from specdecode_tune.report.data import read_run
from specdecode_tune.report.recommend import recommend, schedule
from specdecode_tune.space import BASELINE, DRAFT, STEPS, TOPK, invalid_reason, resolve
from tests.contract.sglang_models import write_models

pytestmark = [pytest.mark.engines, pytest.mark.timeout(300)]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SGLANG_PY = Path(os.environ.get("SGLANG_PYTHON")
                 or enginecache.cache_dir() / "sglang-venv" / "bin" / "python")
SGLANG_VERSION = "0.5.10.post1"
SEED_EXPERIMENTS = ("seed-sglang-eagle3", "seed-sglang-eagle3-sampled")
CPU = ["--device", "cpu"]



class Disagreement(AssertionError):
    """The project and SGLang disagree. The xfail marks expect this type only, so that a
    broken fixture or probe is an error, never an expected failure."""


def agree(cond: object, msg: object = "") -> None:
    if not cond:
        raise Disagreement(msg)


RADIX_REFUSAL = ("Speculative decoding for Qwen3_5MoeForConditionalGeneration is not compatible "
                 "with radix cache when using --mamba-scheduler-strategy no_buffer.")

# ---------------------------------------------------------------------------------------------
# Points, argv and cases


def load(name: str) -> Experiment:
    return load_experiment(REPO / "experiments" / f"{name}.toml")


def sample_points(exp: Experiment) -> list[dict[str, Any]]:
    """A deterministic sample of the space: the edges and a few inner values of each axis of
    the triple (draft tokens only where topk > 1: topk 1 derives it), the other parameters at
    their low and high ends in turn, plus the enqueued points."""
    specs = {s.name: s for s in exp.space}
    assert {STEPS, TOPK, DRAFT} <= specs.keys()
    all_steps, all_drafts = specs[STEPS].values(), specs[DRAFT].values()
    steps = sorted({v for v in (1, 2, 3, 4, 5, 8) if v in all_steps}
                   | {min(all_steps), max(all_steps)})
    drafts = sorted({v for v in (5, 8, 13) if v in all_drafts}
                    | {min(all_drafts), max(all_drafts)})
    others = [s for s in exp.space if s.name not in (STEPS, TOPK, DRAFT)]
    points: list[dict[str, Any]] = []
    for s in steps:
        for k in specs[TOPK].values():
            for d in (drafts if k > 1 else [None]):
                i = len(points)
                p = {s.name: (s.choices[i % len(s.choices)] if s.type == "categorical"
                              else (s.low, s.high)[i % 2]) for s in others}
                p.update({STEPS: s, TOPK: k})
                if d is not None:
                    p[DRAFT] = d
                points.append(p)
    return [dict(p) for p in exp.search.enqueue] + points


def stand_in(exp: Experiment, models: dict[str, Path], target: str = "qwen35_moe") -> Any:
    """The experiment's backend config with the model paths swapped for the stand-ins."""
    return dataclasses.replace(exp.backend, model_path=str(models[target]),
                               draft_model_path=str(models["eagle3"]))


def server_args_of(argv: list[str]) -> list[str]:
    """The arguments after `python -m sglang.launch_server` (or the binary)."""
    if len(argv) > 2 and argv[1] == "-m":
        return argv[3:]
    return argv[1:]


def swap_models(args: list[str], models: dict[str, Path]) -> list[str]:
    out = list(args)
    for flag, name in (("--model-path", "qwen35_moe"),
                       ("--speculative-draft-model-path", "eagle3")):
        if flag in out:
            out[out.index(flag) + 1] = str(models[name])
    return out


def triple(params: dict[str, Any]) -> list[Any]:
    return [params.get(STEPS), params.get(TOPK), params.get(DRAFT)]


@dataclasses.dataclass
class Case:
    argv: list[str]
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    params: dict[str, Any] = dataclasses.field(default_factory=dict)


def experiment_cases(name: str, models: dict[str, Path], target: str = "qwen35_moe",
                     drop_flags: tuple[str, ...] = (), prefix: str = "") -> dict[str, Case]:
    """The argv the backend builds for the baseline and for each sampled point it would boot
    (those `invalid_reason` lets through), keyed 'prefix name/target/point'; `drop_flags`
    leaves those fixed flags out (a variant of the experiment as shipped)."""
    exp = load(name)
    cfg = stand_in(exp, models, target)
    flags = {k: v for k, v in exp.backend.flags.items() if k not in drop_flags}
    cfg = dataclasses.replace(cfg, flags=flags)
    backend = get_backend(exp.backend.kind)
    cases = {}
    for i, point in enumerate([dict(BASELINE)] + sample_points(exp)):
        params = resolve(point, flags)
        if invalid_reason(params) is not None:
            continue
        argv = server_args_of(backend.argv(cfg, params, 30000)) + CPU
        key = "baseline" if i == 0 else f"p{i}"
        cases[f"{prefix}{name}/{target}/{key}"] = Case(argv, params=params)
    return cases


def report_run(run_dir: Path) -> None:
    """A finished run of the default experiment (sim-default: the seed's model) with the seed's
    curve (steps 1..5, topk 1): steps 5 wins at C=1 and 4 from C=16 on, so the report
    recommends a static config and prints a per-level schedule."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "experiment.toml").write_text((REPO / "experiments/sim-default.toml").read_text())
    exp = load("sim-default")
    # tok/s at C=1, 16, 32, 64 (the experiment's levels); 0 steps is the baseline.
    curve = {steps: dict(zip(exp.measure.concurrency, tok, strict=True)) for steps, tok in {
        0: (100, 1000, 1500, 1800), 1: (123, 900, 1300, 1500), 2: (186, 1200, 1700, 1900),
        3: (234, 1450, 1900, 2100), 4: (277, 1596, 2000, 2200), 5: (300, 1119, 1500, 1700),
    }.items()}
    for n, (steps, tok) in enumerate(curve.items()):
        params = resolve({STEPS: steps, "mem_fraction_static": 0.85}, exp.backend.flags)
        trial_id = "baseline" if steps == 0 else f"t{steps}"
        levels = []
        for c, v in tok.items():
            s = LevelSummary(
                concurrency=c, mode="closed", rate=None, duration_s=10.0, requests=20,
                errors=0, output_tokens=int(v * 10), output_tok_s=float(v), requests_s=1.0,
                ttft_p50=0.1, ttft_p90=0.2, ttft_p99=0.3, tpot_p50=0.01, tpot_p90=0.02,
                tpot_p99=0.03, itl_p50=None, itl_p90=None, itl_p99=None, e2e_p50=2.0,
                e2e_p90=2.5, e2e_p99=3.0, accept_length=None, suspect=False, note="")
            store.write_level(run_dir, trial_id, s, [], params=params, repeat=0)
            levels.append(s)
        result = TrialResult(trial_id=trial_id, params=params, status="ok", reason="",
                             facts=ServerFacts(max_total_num_tokens=400000,
                                               max_running_requests=26),
                             levels=tuple(levels), repeat=0, suspect=False)
        store.write_trial(run_dir, result, extra={"finished_at": 1_700_000_000 + n,
                                                    "node": "test", "score": None})


def fact_cases(models: dict[str, Path]) -> dict[str, Case]:
    """Hand-written command lines that pin facts of SGLang's checks (docs/engines-sglang.md)."""
    q, ll, d = (str(models[n]) for n in ("qwen35_moe", "llama", "eagle3"))

    def spec(target: str, *rest: str) -> list[str]:
        return ["--model-path", target, "--tp-size", "1", "--speculative-algorithm", "EAGLE3",
                "--speculative-draft-model-path", d, *rest, *CPU]

    tri = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
           "--speculative-num-draft-tokens", "16"]
    chain = ["--speculative-num-steps", "4", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "16"]
    return {
        "fact/qwen-radix": Case(spec(q, *tri)),
        "fact/qwen-no-radix": Case(spec(q, *tri, "--disable-radix-cache")),
        "fact/qwen-no-spec": Case(["--model-path", q, *CPU]),
        "fact/qwen-extra-buffer": Case(spec(q, *chain, "--mamba-scheduler-strategy",
                                            "extra_buffer"), env={"SGLANG_ENABLE_SPEC_V2": "1"}),
        "fact/llama": Case(spec(ll, *tri)),
        "fact/llama-spec-v2-topk4": Case(spec(ll, *tri), env={"SGLANG_ENABLE_SPEC_V2": "1"}),
        "fact/llama-chain-forced": Case(spec(ll, *chain)),
        "fact/llama-auto": Case(spec(ll)),
        "fact/steps-only": Case(spec(ll, "--speculative-num-steps", "3")),
        "fact/topk-only": Case(spec(ll, "--speculative-eagle-topk", "4")),
        "fact/no-draft-count": Case(spec(ll, "--speculative-num-steps", "3",
                                         "--speculative-eagle-topk", "4")),
        "fact/qwen-auto": Case(spec(q, "--disable-radix-cache")),
        "fact/llama-mrr-set": Case(spec(ll, *tri, "--max-running-requests", "64")),
        "fact/adaptive": Case(spec(ll, *chain, "--speculative-adaptive")),
        "fact/adaptive-config": Case(spec(ll, *chain, "--speculative-adaptive-config", "x.json")),
        "fact/ngram": Case(["--model-path", ll, "--speculative-algorithm", "NGRAM", *CPU]),
        "fact/api-key": Case(["--model-path", ll, "--api-key", "secret", *CPU]),
    }


def report_cases(models: dict[str, Path], run_dir: Path) -> dict[str, Case]:
    report_run(run_dir)
    data = read_run(str(run_dir))
    rec, sched = recommend(data), schedule(data)
    cases = {}
    assert rec.command is not None, rec.command_note
    cases["report/recommended"] = Case(swap_models(shlex.split(rec.command)[3:], models) + CPU)
    sglang_file = sched.file("sglang")
    if sglang_file is not None and sglang_file.command is not None:
        cases["report/schedule"] = Case(
            swap_models(shlex.split(sglang_file.command)[3:], models) + CPU)
    return cases


def tree_grid(exp: Experiment) -> list[tuple[int, int, int]]:
    """Every (steps, topk, draft) of the space as the project resolves it (topk 1 derives the
    draft count), whether the project would boot it or not."""
    specs = {s.name: s for s in exp.space}
    out = set()
    for s in specs[STEPS].values():
        for k in specs[TOPK].values():
            for d in specs[DRAFT].values():
                p = resolve({STEPS: s, TOPK: k, DRAFT: d}, exp.backend.flags)
                out.add((p[STEPS], p[TOPK], p[DRAFT]))
    return sorted(out)


@pytest.fixture(scope="module")
def sglang(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every case and tree of this module, run through SGLang in one subprocess (its import
    takes ~10 s; a parse takes ~10 ms)."""
    if not (SGLANG_PY.is_file() and os.access(SGLANG_PY, os.X_OK)):
        pytest.skip(f"no SGLang venv python at {SGLANG_PY}: run scripts/install_sglang_cpu.sh")
    tmp = tmp_path_factory.mktemp("sglang-contract")
    models = write_models(tmp / "models")
    cases: dict[str, Case] = {}
    for name in SEED_EXPERIMENTS:
        cases.update(experiment_cases(name, models))
        cases.update(experiment_cases(name, models, target="llama"))
    cases.update(fact_cases(models))
    # The seed's experiment without the flag that finding 1 added: what SGLang says then.
    cases.update(experiment_cases(SEED_EXPERIMENTS[0], models, drop_flags=("disable_radix_cache",),
                                  prefix="fact/radix-on/"))
    cases.update(report_cases(models, tmp / "run"))
    trees = sorted({t for name in SEED_EXPERIMENTS for t in tree_grid(load(name))})
    job = {"cases": [{"argv": c.argv, "env": c.env} for c in cases.values()],
           "trees": [list(t) for t in trees], "memory_templates": True}
    (tmp / "in.json").write_text(json.dumps(job))
    proc = subprocess.run([str(SGLANG_PY), str(HERE / "sglang_probe.py"), str(tmp / "in.json"),
                           str(tmp / "out.json")], capture_output=True, text=True, timeout=240,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads((tmp / "out.json").read_text())
    return {"version": out["sglang"], "cases": cases,
            "answers": dict(zip(cases, out["cases"], strict=True)),
            "trees": dict(zip(trees, out["trees"], strict=True)),
            "memory_templates": out["memory_templates"]}


def answers(sglang: dict[str, Any], prefix: str) -> dict[str, dict[str, Any]]:
    found = {k: v for k, v in sglang["answers"].items() if k.startswith(prefix)}
    assert found, f"no cases under {prefix}"
    return found


def refused(found: dict[str, dict[str, Any]]) -> list[str]:
    return [f"{k}: {v['error']}" for k, v in found.items() if not v["ok"]]


# ---------------------------------------------------------------------------------------------
# The project's argv


def test_the_installed_sglang_is_the_one_checked(sglang: dict[str, Any]) -> None:
    assert sglang["version"] == SGLANG_VERSION


@pytest.mark.parametrize("name", SEED_EXPERIMENTS)
def test_baseline_argv_parses(sglang: dict[str, Any], name: str) -> None:
    ans = answers(sglang, f"{name}/qwen35_moe/baseline")
    agree(not refused(ans), refused(ans))


@pytest.mark.parametrize("name", SEED_EXPERIMENTS)
def test_seed_experiment_parses_as_shipped(sglang: dict[str, Any], name: str) -> None:
    # p1 is the first enqueued point: the seed's hand-tuned steps=4, topk=1.
    assert load(name).search.enqueue, "the seed's experiment enqueues its hand-tuned point"
    key = f"{name}/qwen35_moe/p1"
    assert key in sglang["answers"], "the enqueued point is one the project boots"
    agree(not refused({key: sglang["answers"][key]}), refused({key: sglang["answers"][key]}))


@pytest.mark.parametrize("name", SEED_EXPERIMENTS)
def test_every_argv_of_the_space_parses(sglang: dict[str, Any], name: str) -> None:
    bad = refused(answers(sglang, f"{name}/qwen35_moe/"))
    agree(not bad, f"{len(bad)} refused: {bad[:3]}")


@pytest.mark.parametrize("name", SEED_EXPERIMENTS)
def test_every_argv_of_the_space_parses_for_a_llama_target(sglang: dict[str, Any],
                                                           name: str) -> None:
    # The control: the same space and flags on a non-hybrid target are all accepted, so the
    # refusal above belongs to the model, not to the numbers.
    bad = refused(answers(sglang, f"{name}/llama/"))
    agree(not bad, f"{len(bad)} refused: {bad[:3]}")


@pytest.mark.parametrize("name", SEED_EXPERIMENTS)
def test_sglang_normalizes_to_the_projects_triple(sglang: dict[str, Any], name: str) -> None:
    # topk = 1 forces draft = steps + 1 in SGLang (`_handle_speculative_decoding`); the project
    # derives the same. Checked on the Llama target, which SGLang accepts today, so the
    # normalization is held whatever becomes of the Qwen refusal.
    cases = sglang["cases"]
    for key, ans in answers(sglang, f"{name}/llama/p").items():
        agree(ans["ok"], f"{key}: {ans.get('error')}")
        agree(ans["triple"] == triple(cases[key].params), (key, ans["triple"]))


def test_the_draft_limit_is_sglangs(sglang: dict[str, Any]) -> None:
    # Booted by the project exactly when SGLang's own draft-tree code takes the triple.
    differ = [(t, ans.get("error")) for t, ans in sglang["trees"].items()
              if (invalid_reason(dict(zip((STEPS, TOPK, DRAFT), t, strict=True))) is None)
              != ans["ok"]]
    agree(not differ,
          f"{len(differ)} of {len(sglang['trees'])} triples differ, e.g. {differ[:3]}")


def test_sglangs_draft_limit_is_the_candidate_count(sglang: dict[str, Any]) -> None:
    # The rule the project should use: draft - 1 <= topk + (steps - 1) * topk^2.
    for (steps, topk, draft), ans in sglang["trees"].items():
        n = topk + (steps - 1) * topk ** 2
        assert ans["ok"] == (draft - 1 <= n), (steps, topk, draft, ans)
        if ans["ok"]:
            assert ans["candidates"] == n
        else:
            assert "selected index k out of range" in ans["error"]


def test_every_speculative_argv_sets_the_whole_triple(sglang: dict[str, Any]) -> None:
    # SGLang chooses the triple itself only when none of the three is given, and a partial
    # triple crashes its checks (test_fact_partial_triples): the backend must pass all three,
    # so that the numbers the project records are the ones the server runs.
    names = ("--speculative-num-steps", "--speculative-eagle-topk",
             "--speculative-num-draft-tokens")
    for key, case in sglang["cases"].items():
        if key.startswith(SEED_EXPERIMENTS) and not key.endswith("/baseline"):
            agree(all(n in case.argv for n in names), f"{key}: {case.argv}")


def test_the_reports_launch_command_parses(sglang: dict[str, Any]) -> None:
    ans = sglang["answers"]["report/recommended"]
    agree(ans["ok"], ans.get("error"))


def test_the_reports_schedule_command_parses_or_says_which_version(
        sglang: dict[str, Any], tmp_path: Path) -> None:
    ans = sglang["answers"].get("report/schedule")
    if ans is None:
        report_run(tmp_path)
        notes = " ".join(schedule(read_run(str(tmp_path))).notes)
        agree("--speculative-adaptive" in notes, notes)
        return
    agree(ans["ok"], ans.get("error"))


# ---------------------------------------------------------------------------------------------
# Facts of SGLang 0.5.10.post1 that the backend's fixes will rely on (docs/engines-sglang.md)


def test_fact_hybrid_refusal_and_disable_radix_cache(sglang: dict[str, Any]) -> None:
    a = sglang["answers"]
    assert not a["fact/qwen-radix"]["ok"] and RADIX_REFUSAL in a["fact/qwen-radix"]["error"]
    assert a["fact/qwen-no-radix"]["ok"] and a["fact/qwen-no-radix"]["triple"] == [3, 4, 16]
    assert a["fact/qwen-no-spec"]["ok"]           # no speculation: radix cache stays on
    assert a["fact/qwen-no-spec"]["disable_radix_cache"] is False
    # The other route is CUDA-only (asserted before the speculative checks run).
    assert "only supported on CUDA" in a["fact/qwen-extra-buffer"]["error"]
    # Spec v2 (the env var that route needs) refuses topk > 1 on any model.
    assert "Spec v2 currently only supports topk = 1" in a["fact/llama-spec-v2-topk4"]["error"]


def test_fact_the_refusal_does_not_depend_on_the_point(sglang: dict[str, Any]) -> None:
    # Without --disable-radix-cache, every speculative point of the seed's space gets the same
    # message (the baseline parses): a problem of the experiment, which the search should stop
    # on. The backend holds these words, and the simulator copies them (test_backends_engines).
    found = answers(sglang, "fact/radix-on/seed-sglang-eagle3/qwen35_moe/p")
    msgs = {v.get("error") for v in found.values()}
    assert msgs == {"ValueError: " + radix_spec_refusal("Qwen3_5MoeForConditionalGeneration")}
    assert RADIX_REFUSAL in msgs.pop()
    assert answers(sglang, "fact/radix-on/seed-sglang-eagle3/qwen35_moe/baseline")[
        "fact/radix-on/seed-sglang-eagle3/qwen35_moe/baseline"]["ok"]


def test_fact_normalization(sglang: dict[str, Any]) -> None:
    a = sglang["answers"]
    assert a["fact/llama"]["triple"] == [3, 4, 16]          # no cap at parse time
    assert a["fact/llama-chain-forced"]["triple"] == [4, 1, 5]
    assert a["fact/llama-auto"]["triple"] == [5, 4, 8]       # auto_choose_speculative_params
    assert a["fact/qwen-auto"]["triple"] == [3, 1, 4]
    # Speculation without --max-running-requests caps running requests at 48.
    assert a["fact/llama"]["max_running_requests"] == 48
    assert a["fact/llama-mrr-set"]["max_running_requests"] == 64


def test_fact_flags_of_this_version(sglang: dict[str, Any]) -> None:
    a = sglang["answers"]
    for key, flag in (("fact/adaptive", "--speculative-adaptive"),
                      ("fact/adaptive-config", "--speculative-adaptive-config")):
        assert a[key]["exit"] == 2 and f"unrecognized arguments: {flag}" in a[key]["error"]
    assert a["fact/api-key"]["ok"]
    # NGRAM is an algorithm SGLang knows; its check refuses any device but CUDA.
    assert "Ngram speculative decoding only supports CUDA device" in a["fact/ngram"]["error"]


def test_fact_partial_triples(sglang: dict[str, Any]) -> None:
    a = sglang["answers"]
    # Steps without topk: `self.speculative_eagle_topk > 1` on None.
    assert "TypeError" in a["fact/steps-only"]["error"]
    # Topk without steps: the bare assert before auto_choose_speculative_params.
    assert a["fact/topk-only"]["error"].startswith("AssertionError")
    # Steps and topk > 1 without a draft count parse, leaving it None (no default).
    assert a["fact/no-draft-count"]["ok"] and a["fact/no-draft-count"]["triple"] == [3, 4, None]


# ---------------------------------------------------------------------------------------------
# SGLang's memory lines


def _render(template: dict[str, Any], values: dict[str, Any]) -> str:
    """One of SGLang's memory f-strings with each field's value chosen by what its source
    computes."""
    args = []
    for field in template["fields"]:
        key = next((k for k in values if k in field), None)
        assert key is not None, f"a field the test has no value for: {field!r}"
        args.append(values[key])
    return template["template"].format(*args)


def test_the_memory_lines_read_are_sglangs_own(sglang: dict[str, Any]) -> None:
    """A boot log of two tensor-parallel ranks built from SGLang's own f-strings (read from its
    source by the probe: the weight load, the target's capture, the draft's and the draft
    extend's) gives the room and the graphs' memory of the rank with the least room."""
    found = sglang["memory_templates"]
    # "end. Time elapsed" in model_runner: the decode graphs' capture ("Capture {graph backend}
    # end") and the piecewise prefill graphs' ("Capture piecewise CUDA graph end").
    templates = {t["phrase"]: t for t in found
                 if "piecewise" not in t["template"]}
    assert set(templates) == {"Load weight begin", "end. Time elapsed",
                              "Capture draft cuda graph end",
                              "Capture draft extend cuda graph end"}, found
    assert any("piecewise" in t["template"] for t in found), found
    lines = []
    # (free before weights, then per capture: (kept, free after)) per rank
    ranks = {"TP0": (139.5, [(2.0, 11.0), (0.5, 10.5), (0.25, 10.25)]),
             "TP1": (139.0, [(2.0, 10.0), (0.5, 9.5), (0.25, 9.25)])}
    for rank, (before, captures) in ranks.items():
        prefix = f"[2026-12-04 10:00:00 {rank}] "
        lines.append(prefix + _render(templates["Load weight begin"],
                                      {"get_available_gpu_memory": before}))
        for phrase, (kept, after) in zip(("end. Time elapsed", "Capture draft cuda graph end",
                                          "Capture draft extend cuda graph end"), captures,
                                         strict=True):
            lines.append(prefix + _render(templates[phrase], {
                "graph_backend": "cuda graph", "perf_counter": 12.5, "graph_mem_usage": kept,
                "before_mem - after_mem": kept, "after_mem": after}))
    facts = memory_facts("\n".join(lines))
    assert facts[MEMORY_ROOM] == pytest.approx(9.25 / 139.0, abs=1e-5)
    assert facts[GRAPH_MEMORY] == pytest.approx(2.75 / 139.0, abs=1e-5)
    assert memory_facts("\n".join(lines[:1])) == {}        # no capture: nothing to say
