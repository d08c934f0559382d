"""The schedule's validation in the report: the trial booted with the emitted schedule is kept
out of the static configs, and each level is set against the static best, the best config for
that level alone and its own tier, with noise verdicts; a schedule is recommended only where it
beats the static config beyond noise somewhere and loses beyond noise nowhere."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from test_report import SEED, Run

from specdecode_tune.backends import get_backend
from specdecode_tune.report import write_report
from specdecode_tune.report.data import read_run
from specdecode_tune.report.recommend import schedule
from specdecode_tune.report.validation import validate

ADAPTIVE = {"speculative_adaptive": True, "speculative_adaptive_config": "/x/sglang.json"}
# steps 5 is +8.3% at C=1 and -30% at C=16: the per-level figures expect a schedule to pay.
CURVE = {**SEED, 5: {1: 300, 16: 1119}}


def run_with(tmp_path: Path, sched_tok: dict[int, float], same_tok: dict[int, float] | None
             = None, **kw: Any) -> Run:
    run = Run(tmp_path)
    for steps, tok in CURVE.items():
        run.add(f"t{steps:02d}", {"speculative_num_steps": steps}, tok)
    run.add("schedule", {"speculative_num_steps": 5, **ADAPTIVE}, sched_tok, mrr=11, **kw)
    if same_tok is not None:
        run.add("schedule-same", {"speculative_num_steps": 4, **ADAPTIVE}, same_tok)
    return run


def test_the_validation_trial_is_not_a_static_config(tmp_path: Path) -> None:
    run_with(tmp_path, {1: 299, 16: 1590})
    data = read_run(str(tmp_path))
    assert [t.trial_id for t in data.schedule_trials] == ["schedule"]
    assert all(t.trial_id != "schedule" for cf in data.configs for t in cf.trials)
    assert data.best is not None and data.best.param("speculative_num_steps") == 4


def test_a_schedule_that_wins_where_expected_is_recommended(tmp_path: Path) -> None:
    run_with(tmp_path, {1: 299, 16: 1590}, same_tok={1: 274, 16: 1580})
    data = read_run(str(tmp_path))
    v = validate(data, schedule(data).slots)
    assert v is not None and v.recommended
    by = {k.c: k for k in v.checks}
    assert by[1].steps == 5 and by[1].vs_static == "better" and by[1].vs_alone == "within noise"
    assert by[16].steps == 4 and by[16].vs_static == "within noise" and not by[16].collapse
    assert by[1].same_tok_s == 274 and by[1].mode_cost == "within noise"
    md = Path(write_report(str(tmp_path)).path).read_text()
    assert "Validation: the schedule on one server" in md and "Recommended: the schedule." in md


def test_a_threshold_collapse_is_flagged_and_the_static_config_recommended(
        tmp_path: Path) -> None:
    # C=16 runs steps 4 on the schedule server but measures 30% under the static steps=4.
    run_with(tmp_path, {1: 299, 16: 1100})
    data = read_run(str(tmp_path))
    v = validate(data, schedule(data).slots)
    assert v is not None and not v.recommended
    by = {k.c: k for k in v.checks}
    assert by[16].collapse and by[16].vs_static == "worse"
    assert "falls below the static config beyond noise at C=16" in v.why
    assert "Recommended: the static config steps=4" in v.why
    # No schedule-same: the static tier decides, and the paragraph says the mode was not
    # taken out.
    assert by[16].tier_mode_tok_s is None and by[16].vs_tier == "worse"
    md = Path(write_report(str(tmp_path)).path).read_text()
    assert ("Threshold collapse at C=16: the schedule runs below the static server with the "
            "same steps, beyond noise (no schedule-same measured there to take out the mode's "
            "own cost).") in md
    assert "| 1596.0 | -31.1% (worse (threshold collapse)) | - |" in md


# vLLM 0.26.0 on an H100, 2026-12-07: the per-batch-size mode needs piecewise CUDA graphs, which
# alone cost 45-71% (schedule-same against the static server).
VLLM_LEVELS = "concurrency = [1, 16, 64]"
VLLM_STATIC = {0: {1: 620.0, 16: 7400.0, 64: 19800.0},
               2: {1: 950.0, 16: 10900.0, 64: 25600.0},
               4: {1: 1165.8, 16: 12294.9, 64: 28100.7},
               8: {1: 1270.9, 16: 10400.0, 64: 20500.0}}
VLLM_SCHEDULE = {1: 234.3, 16: 3566.7, 64: 13233.4}       # steps 8 at C=1, 4 above
VLLM_SAME = {1: 350.6, 16: 3605.1, 64: 15341.1}           # steps 4 everywhere


def vllm_run(tmp_path: Path, sched_tok: dict[int, float]) -> Any:
    from test_report import EXPERIMENT

    run = Run(tmp_path, experiment=False, baseline=False)
    text = EXPERIMENT.replace("concurrency = [1, 16]", VLLM_LEVELS, 1).replace(
        "noise_band = 0.025", "noise_band = 0.03", 1)
    assert VLLM_LEVELS in text and "noise_band = 0.03" in text
    (tmp_path / "experiment.toml").write_text(text)
    for steps, tok in VLLM_STATIC.items():
        run.add("baseline" if steps == 0 else f"t{steps:02d}",
                {"speculative_num_steps": steps}, tok)
    run.add("schedule", {"speculative_num_steps": 8, **ADAPTIVE}, sched_tok, mrr=128)
    run.add("schedule-same", {"speculative_num_steps": 4, **ADAPTIVE}, VLLM_SAME, mrr=128)
    data = read_run(str(tmp_path))
    assert data.best is not None and data.best.param("speculative_num_steps") == 4
    assert data.level_bands == {1: 0.03, 16: 0.03, 64: 0.03}
    v = validate(data, schedule(data).slots)
    assert v is not None
    return v, Path(write_report(str(tmp_path)).path).read_text()


def test_the_modes_own_cost_is_no_threshold_collapse(tmp_path: Path) -> None:
    """The schedule is judged against its tier as the mode runs it: the tier times schedule-same
    over the static server. At C=16 it runs the static steps 4 and matches schedule-same (-1.1%):
    the whole loss is the mode's. At C=1 (steps 8: 1270.9 x 350.6 / 1165.8 = 382.2) and C=64
    (schedule-same itself, its KV pool sized for steps 8) it loses beyond that: collapses."""
    v, md = vllm_run(tmp_path, VLLM_SCHEDULE)
    by = {k.c: k for k in v.checks}
    assert [by[c].steps for c in (1, 16, 64)] == [8, 4, 4]
    assert all(k.vs_tier == "worse" and k.vs_static == "worse" for k in v.checks)
    assert round(by[1].tier_mode_tok_s or 0, 1) == 382.2
    # The static steps at C=16 and C=64: the tier is the static best, so schedule-same itself.
    assert by[16].tier_mode_tok_s == pytest.approx(3605.1)
    assert by[64].tier_mode_tok_s == pytest.approx(15341.1)
    assert [(by[c].vs_tier_mode, by[c].collapse, by[c].mode_explains) for c in (1, 16, 64)] == [
        ("worse", True, False), ("within noise", False, True), ("worse", True, False)]
    assert ("| 12294.9 | -71.0% (worse); vs tier in the mode 3605.1: -1.1% (within noise: "
            "the mode's own cost explains it) | 3605.1 (-70.7%, worse) |") in md
    assert ("| 28100.7 | -52.9% (worse); vs tier in the mode 15341.1: -13.7% (worse: threshold "
            "collapse) | 15341.1 (-45.4%, worse) |") in md
    assert ("| 1270.9 | -81.6% (worse); vs tier in the mode 382.2: -38.7% (worse: threshold "
            "collapse) | 350.6 (-69.9%, worse) |") in md
    assert ("Threshold collapse at C=1, C=64: the schedule runs below its tier in the mode "
            "(the static server with the same steps, scaled by schedule-same vs the static "
            "server) beyond noise, a loss from switching beyond the mode's own cost. At C=16 "
            "the loss against the static tier is the mode's own cost (schedule-same vs the "
            "static server: C=16 -70.7%).") in md
    assert "Recommended: the static config steps=4" in v.why and not v.recommended


def test_where_the_mode_explains_every_loss_one_line_says_so(tmp_path: Path) -> None:
    # C=1 and C=64 within noise of their tier in the mode (-0.6%, -0.9%): no collapse anywhere.
    v, md = vllm_run(tmp_path, {**VLLM_SCHEDULE, 1: 380.0, 64: 15200.0})
    assert not any(k.collapse for k in v.checks)
    assert all(k.mode_explains for k in v.checks)
    assert "Threshold collapse at" not in md and "threshold collapse)" not in md
    assert ("The losses are the per-batch-size mode's own cost (schedule-same vs the static "
            "server): C=1 -69.9%, C=16 -70.7%, C=64 -45.4%; against its tier in the mode the "
            "schedule is within noise or better at every level.") in md


def test_the_measurement_counts_over_the_per_level_figures(tmp_path: Path) -> None:
    # The per-level figures expect +8.3% at C=1; the schedule's own boot measures no gain.
    run_with(tmp_path, {1: 280, 16: 1590})
    data = read_run(str(tmp_path))
    v = validate(data, schedule(data).slots)
    assert v is not None and not v.recommended
    assert "beats the static config beyond noise at no level" in v.why
    assert "expected a gain at C=1 that the schedule's own boot did not measure" in v.why


def test_without_a_validation_trial_the_report_says_so(tmp_path: Path) -> None:
    run = Run(tmp_path)
    for steps, tok in CURVE.items():
        run.add(f"t{steps:02d}", {"speculative_num_steps": steps}, tok)
    data = read_run(str(tmp_path))
    assert validate(data, schedule(data).slots) is None
    out = write_report(str(tmp_path))
    assert any("The schedule was not validated" in line for line in out.summary_lines)


def _plan(tmp_path: Path, version: str | None) -> Any:
    from test_report import EXPERIMENT

    from specdecode_tune.config import experiment_from_dict
    from specdecode_tune.search.preflight import RunPlan

    text = EXPERIMENT if version is None else EXPERIMENT.replace(
        "tp_size = 2\n", f'tp_size = 2\nengine_version = "{version}"\n', 1)
    (tmp_path / "experiment.toml").write_text(text)
    import tomllib
    exp = experiment_from_dict(tomllib.loads(text), where="test")
    return RunPlan(exp=exp, run_dir=str(tmp_path), local_dir=tmp_path, storage=str(tmp_path),
                   name="t", is_uri=False)


def test_the_validation_boots_the_emitted_file_and_the_same_steps_mode(tmp_path: Path) -> None:
    import json

    from specdecode_tune.search.validate import plan_validation

    run = Run(tmp_path)
    for steps, tok in CURVE.items():
        run.add(f"t{steps:02d}", {"speculative_num_steps": steps}, tok)
    trials, why = plan_validation(_plan(tmp_path, "0.5.13"))
    assert why == "" and [t for t, _ in trials] == ["schedule", "schedule-same"]
    params = dict(trials[0][1])
    assert params["speculative_adaptive"] is True and params["speculative_num_steps"] == 5
    assert params["speculative_num_draft_tokens"] == 6 and params["speculative_eagle_topk"] == 1
    with open(params["speculative_adaptive_config"]) as f:
        assert json.load(f) == {"1": {"candidate_steps": [5]}, "4": {"candidate_steps": [4]}}
    with open(trials[1][1]["speculative_adaptive_config"]) as f:
        assert json.load(f) == {"1": {"candidate_steps": [4]}}
    # A release without the per-batch-size format: no boot, and which release it needs.
    trials, why = plan_validation(_plan(tmp_path, "0.5.10.post1"))
    assert trials == [] and "needs SGLang >= 0.5.13" in why


def test_each_backend_boots_its_own_schedule_file_or_says_why_not(tmp_path: Path) -> None:
    """The search asks the backend (`schedule_params`), not the backend's class: SGLang's and the
    simulator's give the adaptive-mode settings for a release that reads the per-batch-size
    file; vLLM's give its --speculative-config with the file's ranges, the largest K and
    piecewise CUDA graphs (0.26.0's full draft graphs cannot hold a schedule); llama.cpp's says
    in one line why it boots none."""
    import json

    from specdecode_tune.backends import BACKENDS, get_backend

    sglang_plan = _plan(tmp_path, "0.5.13")
    vllm_file = tmp_path / "vllm-speculative-config.json"
    vllm_file.write_text(json.dumps({"method": "eagle3", "num_speculative_tokens": 5,
                                     "num_speculative_tokens_per_batch_size": [
                                         [1, 3, 5], [4, 4, 1]]}))
    for kind in BACKENDS:
        path = str(vllm_file) if kind == "vllm" else "/x/s.json"
        settings, why = get_backend(kind).schedule_params(
            sglang_plan.exp.backend, {"speculative_num_steps": 3}, path)
        if kind in ("sglang", "sim"):
            assert why == "" and settings == {"speculative_num_steps": 3,
                                              "speculative_adaptive": True,
                                              "speculative_adaptive_config": "/x/s.json"}
        elif kind == "vllm":
            assert why == "" and settings == {
                "speculative_num_steps": 5,
                "num_speculative_tokens_per_batch_size": [[1, 3, 5], [4, 4, 1]],
                "compilation_config": '{"cudagraph_mode":"PIECEWISE"}'}
            bad, why = get_backend(kind).schedule_params(sglang_plan.exp.backend,
                                                         {"speculative_num_steps": 3},
                                                         str(tmp_path / "none.json"))
            assert bad is None and "cannot be read" in why and "\n" not in why
        else:
            assert settings is None and "\n" not in why and why, kind



def test_a_vllm_experiment_boots_its_own_per_batch_size_k(tmp_path: Path) -> None:
    """vllm-gpu-grid's validation (issue 33) on the same run: vLLM's own file, booted with the
    ranges it holds, K the largest and piecewise CUDA graphs; beside it the static best's K in
    one range (the mode's own cost)."""
    import json
    import tomllib

    from test_report import EXPERIMENT

    from specdecode_tune.config import experiment_from_dict
    from specdecode_tune.search.preflight import RunPlan
    from specdecode_tune.search.validate import plan_validation

    run = Run(tmp_path)
    for steps, tok in CURVE.items():
        run.add(f"t{steps:02d}", {"speculative_num_steps": steps}, tok)
    text = EXPERIMENT.replace('kind = "sim"', 'kind = "vllm"', 1)
    assert 'kind = "vllm"' in text
    exp = experiment_from_dict(tomllib.loads(text), where="test")
    plan = RunPlan(exp=exp, run_dir=str(tmp_path), local_dir=tmp_path, storage=str(tmp_path),
                   name="t", is_uri=False)
    trials, why = plan_validation(plan)
    assert why == "" and [t for t, _ in trials] == ["schedule", "schedule-same"]
    sched, same = (dict(p) for _, p in trials)
    assert sched["speculative_num_steps"] == 5 and same["speculative_num_steps"] == 4
    assert sched["compilation_config"] == same["compilation_config"] == \
        '{"cudagraph_mode":"PIECEWISE"}'
    # C=1's slot drafts 5, C=16's from batch 4 (sqrt(1 x 16)) 4, kept past the last range.
    ranges = sched["num_speculative_tokens_per_batch_size"]
    assert ranges == [[1, 3, 5], [4, 4, 4]]
    assert same["num_speculative_tokens_per_batch_size"] == [[1, 1, 4]]
    written = json.loads((tmp_path / "schedule" / "vllm-speculative-config.json").read_text())
    assert written["num_speculative_tokens_per_batch_size"] == ranges
    argv = " ".join(get_backend("vllm").server_args(exp.backend, sched))
    assert "num_speculative_tokens_per_batch_size" in argv and "PIECEWISE" in argv
    # The report's schedule notes: vLLM boots its file, so no line says why not (the served
    # run of 2026-12-07 printed "vLLM's schedule file  cannot be read: ... ''": the report
    # asked with the schedule's settings and no file).
    from specdecode_tune.report import recommend
    from specdecode_tune.report.data import read_run

    notes = recommend.schedule(read_run(str(tmp_path), exp)).notes
    assert notes and not [n for n in notes if "cannot be read" in n or "vLLM's" in n], notes


def test_a_schedule_of_the_static_steps_everywhere_is_not_booted(tmp_path: Path) -> None:
    """SEED's levels gain nothing beyond noise from switching (C=1's best, steps 5, is +1.8%
    within the band): the schedule runs the static config's steps 4 at every level, so its
    boot and the same-steps one would be one server twice. Nothing is booted, one line says
    why (the served SGLang search of 2026-12-07 printed "steps=6 at every level ...: nothing
    to switch" for its run)."""
    from test_report import SEED

    from specdecode_tune.search.validate import plan_validation

    run = Run(tmp_path)
    for steps, tok in SEED.items():
        run.add(f"t{steps:02d}", {"speculative_num_steps": steps}, tok)
    trials, why = plan_validation(_plan(tmp_path, "0.5.13"))
    assert trials == [] and "\n" not in why
    assert why == ("schedule validation: not booted. The schedule runs the static config's "
                   "steps (4) at every level: nothing to switch")
    assert not (tmp_path / "schedule").exists()
