"""report: verdicts, recommendation, schedule and command line from known tables.

Each test builds a run dir with `store.write_level` / `store.write_trial` from synthetic
trials whose figures are known (a no-speculation baseline first), writes the report and checks
what a reader would see against what the data says.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import matplotlib.image
import pytest

from specdecode_tune import store
from specdecode_tune.records import LevelSummary, ServerFacts, TrialResult
from specdecode_tune.report import write_report
from specdecode_tune.report.cli import main as report_main
from specdecode_tune.report.curves import shape
from specdecode_tune.report.data import read_run
from specdecode_tune.report.recommend import Schedule, recommend, runner_up_line, schedule
from specdecode_tune.report.verdicts import verdicts
from specdecode_tune.space import resolve

EXPERIMENT = """
name = "report-test"
[backend]
kind = "sim"
model_path = "Qwen/Qwen3.5-122B-A10B"
draft_model_path = "Qwen3.5-122B-A10B-EAGLE3"
tp_size = 2
[backend.flags]
cuda_graph_max_bs = 64
[space.speculative_num_steps]
type = "int"
low = 1
high = 12
[space.speculative_eagle_topk]
type = "categorical"
choices = [1]
[measure]
concurrency = [1, 16]
[search]
noise_band = 0.025
"""

BASE = {1: 100.0, 16: 1000.0}
# The seed (tests/data/seed_measurements.csv): steps 1..5 rise at C=1, 4 -> 5 is +1.8% at C=1
# and -30% at C=16; the probe at steps=10 is worse everywhere.
SEED = {1: {1: 123, 16: 900}, 2: {1: 186, 16: 1200}, 3: {1: 234, 16: 1450},
        4: {1: 277, 16: 1596}, 5: {1: 282, 16: 1119}}
PROBE_PEAK = {1: 240, 16: 600}
# A plateau that is escaped: 4 -> 5 flat in score, steps=10 better by far more than the band.
ESCAPE = {**SEED, 5: {1: 282, 16: 1610}}
PROBE_ESCAPE = {1: 330, 16: 1800}


def level(c: int, tok: float, *, accept: float | None = None, suspect: bool = False,
          note: str = "") -> LevelSummary:
    return LevelSummary(
        concurrency=c, mode="closed", rate=None, duration_s=10.0, requests=20, errors=0,
        output_tokens=int(tok * 10), output_tok_s=float(tok), requests_s=1.0,
        ttft_p50=0.1, ttft_p90=0.2, ttft_p99=0.3, tpot_p50=0.01, tpot_p90=0.02, tpot_p99=0.03,
        itl_p50=None, itl_p90=None, itl_p99=None, e2e_p50=2.0, e2e_p90=2.5, e2e_p99=3.0,
        accept_length=accept, suspect=suspect, note=note)


class Run:
    """A run dir under construction: trials are written in the order they are added."""

    def __init__(self, path: Path, experiment: bool = True, baseline: bool = True) -> None:
        self.path = path
        self.n = 0
        path.mkdir(parents=True, exist_ok=True)
        if experiment:
            (path / "experiment.toml").write_text(EXPERIMENT)
        if baseline:
            self.add("baseline", {"speculative_num_steps": 0}, BASE)

    def add(self, trial_id: str, sampled: dict[str, Any], tok: dict[int, float] | None,
            *, status: str = "ok", reason: str = "", repeat: int = 0, suspect: bool = False,
            level_suspect: tuple[int, ...] = (), jump: str | None = None,
            bracket: str | None = None,
            mrr: int | None = None, score: float | None = None,
            predicted: dict[str, Any] | None = None,
            answered: list[str] | None = None, kv: int | None = None,
            note: str = "clocks throttled", extra: dict[str, Any] | None = None) -> None:
        params = resolve(sampled, {"cuda_graph_max_bs": 64})
        steps = params.get("speculative_num_steps", 0)
        levels = []
        for c, v in (tok or {}).items():
            s = level(c, v, accept=min(steps + 1, 1 + 0.8 * steps) if steps else None,
                      suspect=c in level_suspect, note=note if c in level_suspect else "")
            store.write_level(self.path, trial_id, s, [], params=params, repeat=repeat)
            levels.append(s)
        facts = ServerFacts(max_total_num_tokens=kv or 455357 - 40000 * steps,
                            max_running_requests=mrr if mrr is not None else max(2, 26 - 3 * steps),
                            extra=extra or {})
        result = TrialResult(trial_id=trial_id, params=params, status=status, reason=reason,
                             facts=facts if status == "ok" else ServerFacts(),
                             levels=tuple(levels), repeat=repeat, suspect=suspect)
        self.n += 1
        store.write_trial(self.path, result, extra={
            "jump_reason": jump, "bracket_reason": bracket,
            "finished_at": 1_700_000_000 + self.n, "node": "test",
            "score": score, "predicted": None if predicted is None else json.dumps(predicted),
            "plateau_answered": None if answered is None else json.dumps(answered)})


def seed_run(path: Path, probe: dict[int, float] = PROBE_PEAK,
             curve: dict[int, dict[int, float]] = SEED) -> Run:
    run = Run(path)
    for steps, tok in curve.items():
        run.add(f"t{steps:02d}", {"speculative_num_steps": steps}, tok)
    run.add("t10", {"speculative_num_steps": 10}, probe,
            jump="plateau on speculative_num_steps: 4 -> 5 gained +1.8%; jumping to 10")
    return run


def steps_verdict(path: Path) -> Any:
    data = read_run(str(path))
    return data, next(v for v in verdicts(data) if v.axis == "speculative_num_steps")


# ---------------------------------------------------------------------------------------------
# Verdicts


def test_seed_plateau_is_a_peak(tmp_path: Path) -> None:
    seed_run(tmp_path)
    data, v = steps_verdict(tmp_path)
    assert data.band == pytest.approx(0.025)          # no repeats: the experiment's band
    assert v.kind == "peak" and v.best_value == 4
    assert v.beyond_value == 5
    expected_5 = (math.log(2.82) + math.log(1.119)) / 2 - (math.log(2.77)
                                                               + math.log(1.596)) / 2
    assert v.beyond_delta == pytest.approx(expected_5)
    # The seed's sentence, with N from the data.
    assert "steps 4 -> 5: +1.8% at C=1, within noise (±2.5%); -29.9% at C=16" in v.headline
    assert "steps=4 is the peak" in v.headline
    assert "probe at steps=10 (plateau jump): -13.4% at C=1; -62.4% at C=16" in v.headline
    assert (10, pytest.approx(((math.log(2.4) + math.log(0.6))
                               - (math.log(2.77) + math.log(1.596))) / 2), True) in v.probes
    # At C=1 alone the curve plateaus at 4..5, and the probe shows it is a peak.
    c1 = next(s for s in v.per_level if s.startswith("C=1:"))
    assert "plateau at steps=4..5" in c1 and "steps=10: -14.9%" in c1 and "a peak" in c1
    c16 = next(s for s in v.per_level if s.startswith("C=16:"))
    assert "best at steps=4 (1596 tok/s)" in c16 and "steps=5: -29.9%" in c16
    step45 = next(s for s in v.steps if (s.a, s.b) == (4, 5))
    assert step45.levels[1][1] is True and step45.levels[16][1] is False
    assert not step45.score_within


def test_plateau_escaped_by_a_jump(tmp_path: Path) -> None:
    seed_run(tmp_path, probe=PROBE_ESCAPE, curve=ESCAPE)
    _, v = steps_verdict(tmp_path)
    assert v.escaped and v.escaped_from == (4, 5) and v.best_value == 10
    s5 = (math.log(2.82) + math.log(1.61)) / 2
    s10 = (math.log(3.3) + math.log(1.8)) / 2
    assert v.escape_delta == pytest.approx(s10 - s5)
    assert s10 - s5 > 0.025
    assert "the plateau at steps=4..5 (4 -> 5: score +1.3%, within noise (±2.5%)) was " \
           "escaped at steps=10 (plateau jump): score +14.4% over steps=5" in v.headline
    assert "+17.0% at C=1; +11.8% at C=16" in v.headline
    assert v.kind == "edge" and "not known whether larger values climb" in v.headline


LEVEL_JUMP = ("plateau at C=1 on speculative_num_steps: 4 -> 5 gained +1.8% (noise band "
              "+-2.5%); jumping to 10")


def test_the_configurations_table_says_why_the_plateau_question_booted_each_point(
        tmp_path: Path) -> None:
    """The jump and its bracket each say why they were booted, in the table of configurations
    (the trials table's jump_reason and bracket_reason, as the search wrote them)."""
    run = seed_run(tmp_path)
    why = ("bracket: the jump on speculative_num_steps to 10 came back no better; "
           "speculative_num_steps 6..9 is unmeasured between the plateau's edge and the jump")
    run.add("t07", {"speculative_num_steps": 7}, {1: 270, 16: 700}, bracket=why)
    data = read_run(str(tmp_path))
    by_steps = {cf.params["speculative_num_steps"]: cf for cf in data.configs}
    assert by_steps[7].bracket_reason == why and by_steps[7].jump_reason is None
    assert by_steps[10].bracket_reason is None
    md = Path(write_report(str(tmp_path)).path).read_text()
    rows = {line.split("|")[2].split()[0]: line for line in md.splitlines()
            if line.startswith("| ") and "topk=" in line.split("|")[2]}
    assert "plateau question (why it was booted)" in md
    assert rows["steps=10"].rstrip(" |").endswith(
        "jump: plateau on speculative_num_steps: 4 -> 5 gained +1.8%; jumping to 10")
    assert rows["steps=7"].rstrip(" |").endswith(why)
    assert not rows["steps=4"].rstrip(" |").endswith(("jump", "bracket"))


def test_the_report_says_which_plateau_questions_a_boot_answered_and_which_the_model(
        tmp_path: Path) -> None:
    """The model's answers (the trials table's plateau_answered, on the trial proposed while
    it answered) and the jumps a boot answered, in the summary and the verdicts section."""
    run = seed_run(tmp_path)
    said = ("speculative_eagle_topk=1..1 (best at 1): predicted no climb beyond the noise band "
            "at speculative_eagle_topk=4, answered by the model without a boot: a climb "
            "beyond the noise band at speculative_eagle_topk=4 has probability 1% under the "
            "model")
    run.add("t11", {"speculative_num_steps": 3}, {1: 250, 16: 1500}, answered=[said])
    data = read_run(str(tmp_path))
    assert data.model_answers == [said]
    assert [tid for tid, _ in data.booted_questions] == ["t10"]
    out = write_report(str(tmp_path))
    assert ("Plateau questions: 1 answered by a boot, 1 by the model (predicted, not "
            "booted).") in out.summary_lines
    md = Path(out.path).read_text()
    assert "Answered by the model (predicted, not booted): " + said in md
    assert "Answered by a boot: t10: plateau on speculative_num_steps: 4 -> 5" in md


def test_a_probe_of_one_levels_plateau_names_the_level(tmp_path: Path) -> None:
    # Under a schedule objective the plateau sampler probes a level's own plateau (C=1 flat
    # 4 -> 5 while the score peaks at 4): the probe is marked with its level in the verdict,
    # on that level's line (only there) and in the steps table.
    run = Run(tmp_path)
    for steps, tok in SEED.items():
        run.add(f"t{steps:02d}", {"speculative_num_steps": steps}, tok)
    run.add("t10", {"speculative_num_steps": 10}, PROBE_PEAK, jump=LEVEL_JUMP)
    data, v = steps_verdict(tmp_path)
    assert "probe at steps=10 (plateau jump at C=1): -13.4% at C=1; -62.4% at C=16" \
        in v.headline
    c1 = next(s for s in v.per_level if s.startswith("C=1:"))
    assert "plateau at steps=4..5" in c1
    assert "steps=10 (plateau jump at C=1): -14.9%: the plateau is a peak" in c1
    c16 = next(s for s in v.per_level if s.startswith("C=16:"))
    assert "jump" not in c16
    assert next(s for s in v.steps if s.b == 10).jump_level == 1
    md = Path(write_report(str(tmp_path)).path).read_text()
    assert "| 5 -> 10 (jump at C=1) |" in md
    assert LEVEL_JUMP in md                               # the configurations table


def test_a_levels_probe_inside_its_plateau_or_at_its_best_is_still_marked(
        tmp_path: Path) -> None:
    run = Run(tmp_path)
    for steps, tok in SEED.items():
        run.add(f"t{steps:02d}", {"speculative_num_steps": steps}, tok)
    # C=1 at 10 is within noise of 5 (inside the plateau), 12 falls: the line names 12 as the
    # value beyond, and the probe at 10 in a clause of its own.
    run.add("t10", {"speculative_num_steps": 10}, {1: 280, 16: 600}, jump=LEVEL_JUMP)
    run.add("t12", {"speculative_num_steps": 12}, {1: 200, 16: 500})
    _, v = steps_verdict(tmp_path)
    c1 = next(s for s in v.per_level if s.startswith("C=1:"))
    assert "plateau at steps=4..10" in c1 and "steps=12: -29.1%: the plateau is a peak" in c1
    assert c1.endswith("; probe at steps=10 (plateau jump at C=1): -0.7%")

    escaped = tmp_path / "escaped"
    run = Run(escaped)
    for steps, tok in ESCAPE.items():
        run.add(f"t{steps:02d}", {"speculative_num_steps": steps}, tok)
    run.add("t10", {"speculative_num_steps": 10}, PROBE_ESCAPE, jump=LEVEL_JUMP)
    _, v = steps_verdict(escaped)
    assert "escaped at steps=10 (plateau jump at C=1): score +14.4% over steps=5" in v.headline
    c1 = next(s for s in v.per_level if s.startswith("C=1:"))
    assert "best at steps=10 (plateau jump at C=1) (330 tok/s)" in c1


def test_the_level_is_read_from_the_reason_the_sampler_writes() -> None:
    from specdecode_tune.report.rundata import jump_level
    from specdecode_tune.samplers.plateau.events import reason
    from specdecode_tune.samplers.plateau.geometry import Plateau

    p = Plateau(axis="speculative_num_steps", direction="up", plateau_from=4, plateau_to=5,
                gain=0.018, values=(4, 5), jump_to=10, incumbent_value=0.8, level=16)
    assert jump_level(reason(p, 0.025)) == 16
    assert jump_level(reason(dataclasses.replace(p, level=None), 0.025)) is None
    assert jump_level(None) is None


def test_difference_inside_the_noise_is_not_a_win(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.add("a", {"speculative_num_steps": 2}, {1: 186, 16: 1200})
    run.add("b", {"speculative_num_steps": 3}, {1: 234, 16: 1450})
    run.add("c", {"speculative_num_steps": 4}, {1: 236.3, 16: 1464.5})   # +1.0% everywhere
    data, v = steps_verdict(tmp_path)
    assert v.kind == "plateau_edge" and v.plateau == (3, 4)
    step = v.steps[-1]
    assert step.score == pytest.approx(math.log(1.01), abs=1e-3) and step.score_within
    assert all(within for _, within in step.levels.values())
    assert "+1.0% at C=1, within noise (±2.5%); +1.0% at C=16, within noise (±2.5%)" \
        in v.headline
    assert "nothing measured beyond steps=4" in v.headline
    rec = recommend(data)
    assert rec.config is not None and rec.config.param("speculative_num_steps") == 4
    assert rec.runner_within and rec.runner_up.param("speculative_num_steps") == 3


def test_measured_band_from_repeats_swallows_a_small_gain(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.add("a", {"speculative_num_steps": 3}, {1: 234, 16: 1450})
    # steps=4 measured three times, scattered by about +-4%: the band widens past 4%.
    for i, f in enumerate((1.0, 1.04, 0.96)):
        run.add(f"b{i}", {"speculative_num_steps": 4}, {1: 243.4 * f, 16: 1508 * f},
                repeat=i)
    run.add("c", {"speculative_num_steps": 2}, {1: 186 * 1.04, 16: 1200 * 1.04})
    run.add("c1", {"speculative_num_steps": 2}, {1: 186 * 0.96, 16: 1200 * 0.96}, repeat=1)
    data, v = steps_verdict(tmp_path)
    assert data.band_measured and data.band > 0.04
    step = next(s for s in v.steps if (s.a, s.b) == (3, 4))
    assert step.score == pytest.approx(math.log(1.04), abs=1e-3) and step.score_within
    # Ranking is by median less the spread shrunk towards the band: steps=4 scatters no more
    # than steps=2 (the band), and steps=3 measured once carries the pooled spread, not none:
    # the better median ranks first, and the recommendation says the two are within noise.
    rec = recommend(data)
    assert rec.config is not None and rec.config.param("speculative_num_steps") == 4
    assert rec.config.robust.sigma > data.band / 2       # its own scatter still counts
    assert rec.runner_up is not None and rec.runner_up.n == 1 and rec.runner_within
    assert rec.runner_up.robust.sigma == pytest.approx(data.band / 2)


def test_the_runner_up_measured_once_says_so_and_why_when_beyond_noise(tmp_path: Path) -> None:
    """The searcher re-measures a runner-up only within the band of the best: the "How sure"
    line says when it was measured once, and why no second boot where it is beyond noise."""
    run = Run(tmp_path / "beyond")
    for i in range(2):
        run.add(f"b{i}", {"speculative_num_steps": 4}, {1: 243.4, 16: 1508}, repeat=i)
    run.add("c", {"speculative_num_steps": 3}, {1: 234 * 0.95, 16: 1450 * 0.95})   # -9%
    data = read_run(str(tmp_path / "beyond"))
    line = runner_up_line(data, recommend(data))
    assert line is not None and "worse beyond noise" in line
    assert ", measured once (the search re-measures a runner-up only within the noise band of " \
           "the best): score" in line
    run = Run(tmp_path / "within")
    for i in range(2):
        run.add(f"b{i}", {"speculative_num_steps": 4}, {1: 243.4, 16: 1508}, repeat=i)
    run.add("c", {"speculative_num_steps": 3}, {1: 241, 16: 1495})                 # -1%
    data = read_run(str(tmp_path / "within"))
    line = runner_up_line(data, recommend(data))
    assert line is not None and ", measured once: score" in line and "within noise" in line
    run.add("c1", {"speculative_num_steps": 3}, {1: 241, 16: 1495}, repeat=1)
    data = read_run(str(tmp_path / "within"))
    line = runner_up_line(data, recommend(data))
    assert line is not None and "measured once" not in line


def test_suspect_trials_are_left_out_and_listed(tmp_path: Path) -> None:
    run = seed_run(tmp_path)
    run.add("s1", {"speculative_num_steps": 6}, {1: 900, 16: 5000}, suspect=True)
    run.add("s2", {"speculative_num_steps": 7}, {1: 950, 16: 5200}, level_suspect=(16,))
    data, v = steps_verdict(tmp_path)
    assert 6 not in v.values and 7 not in v.values
    assert v.kind == "peak" and v.best_value == 4
    assert data.best is not None and data.best.param("speculative_num_steps") == 4
    out = write_report(str(tmp_path))
    md = Path(out.path).read_text()
    section = md.split("### Suspect trials")[1].split("###")[0]
    assert "| s1 |" in section and "| s2 |" in section and "C=16: clocks throttled" in section


def test_a_best_whose_re_measurement_was_suspect_says_so(tmp_path: Path) -> None:
    """The "How sure" line of a best counted once: no repeat, or a repeat that was suspect and
    left out, with its reason (the vLLM search of 2026-12-07: d8bf2e3d re-measured the best and
    its C=64 level was flagged, yet the line said no repeat backed the figures)."""
    run = seed_run(tmp_path / "once")
    sure = next(line for line in write_report(str(tmp_path / "once")).summary_lines
                if line.startswith("How sure: "))
    assert sure.startswith("How sure: best measured 1x (once: no repeat backs its figures; "
                           "re-measure it before trusting a small margin); ")
    run = seed_run(tmp_path / "suspect")
    run.add("d8bf2e3d", {"speculative_num_steps": 4}, SEED[4], repeat=1, level_suspect=(16,))
    data = read_run(str(tmp_path / "suspect"))
    assert data.best is not None and data.best.n == 1
    sure = next(line for line in write_report(str(tmp_path / "suspect")).summary_lines
                if line.startswith("How sure: "))
    assert sure.startswith("How sure: best measured 1x (once counted: its re-measurement "
                           "d8bf2e3d was suspect (C=16: clocks throttled) and left out; "
                           "re-measure it before trusting a small margin); ")
    # Two suspect levels, each note of several clauses: each level's first clause, not the
    # first level's alone (the rounds and warm-up that follow stay in the trials table).
    run = seed_run(tmp_path / "two")
    run.add("d8bf2e3d", {"speculative_num_steps": 4}, SEED[4], repeat=1,
            level_suspect=(1, 16), note="clocks throttled; 31 rounds kept; warm-up 4.0 s")
    out = write_report(str(tmp_path / "two"))
    sure = next(line for line in out.summary_lines if line.startswith("How sure: "))
    assert "was suspect (C=1: clocks throttled; C=16: clocks throttled) and left out" in sure
    assert "rounds kept" not in sure
    assert "31 rounds kept" in Path(out.path).read_text()
    # Counted twice: nothing about the suspect one in this line.
    run = seed_run(tmp_path / "suspect")
    run.add("b2", {"speculative_num_steps": 4}, SEED[4], repeat=2)
    sure = next(line for line in write_report(str(tmp_path / "suspect")).summary_lines
                if line.startswith("How sure: "))
    assert sure.startswith("How sure: best measured 2x; ")


def test_infeasible_configs_are_shown(tmp_path: Path) -> None:
    run = seed_run(tmp_path)
    run.add("t12", {"speculative_num_steps": 12}, None, status="infeasible",
            reason="oom: CUDA out of memory while allocating the KV pool")
    _, v = steps_verdict(tmp_path)
    assert (12, "oom: CUDA out of memory while allocating the KV pool") in v.infeasible
    assert "refused by the server: steps=12 (oom, steps=12 topk=1 draft=13)" in v.headline
    out = write_report(str(tmp_path))
    md = Path(out.path).read_text()
    section = md.split("### Infeasible, failed and pruned trials")[1]
    assert "| t12 | steps=12 topk=1 draft=13 | infeasible | oom: CUDA" in section


def test_curves_compare_the_best_config_at_each_value(tmp_path: Path) -> None:
    run = Run(tmp_path)
    mem = "mem_fraction_static"
    run.add("a", {"speculative_num_steps": 3, mem: 0.85}, {1: 200, 16: 1300})
    run.add("b", {"speculative_num_steps": 3, mem: 0.9}, {1: 234, 16: 1450})
    run.add("c", {"speculative_num_steps": 4, mem: 0.85}, {1: 277, 16: 1596})
    run.add("d", {"speculative_num_steps": 3, "speculative_eagle_topk": 2,
                  "speculative_num_draft_tokens": 5, mem: 0.85}, {1: 210, 16: 1100})
    run.add("e", {"speculative_num_steps": 3, "speculative_eagle_topk": 2,
                  "speculative_num_draft_tokens": 7, mem: 0.85}, {1: 220, 16: 1000})
    data = read_run(str(tmp_path))
    assert data.axes == ("speculative_num_steps", "speculative_eagle_topk",
                         "speculative_num_draft_tokens", "mem_fraction_static")
    by_axis = {v.axis: v for v in verdicts(data)}
    steps = by_axis["speculative_num_steps"]
    # Steps are judged among chains (the recommended config's topk), not against trees.
    assert steps.scope == {"speculative_eagle_topk": 1}
    assert steps.headline.startswith("among topk=1 configs: ")
    assert steps.values == (3, 4) and [cf.trials[0].trial_id for cf in steps.configs] == \
        ["b", "c"]
    assert "caution: the curve's configs also differ in mem (0.9 at steps=3, 0.85 at " \
           "steps=4)" in steps.headline
    # Draft tokens are an axis of their own only for trees: chains have draft = steps + 1.
    draft = by_axis["speculative_num_draft_tokens"]
    assert draft.values == (5, 7) and all(cf.param("speculative_eagle_topk") == 2
                                          for cf in draft.configs)
    out = write_report(str(tmp_path))
    assert "tok_s_vs_steps.png" in {Path(p).name for p in out.figures}


def test_run_without_baseline_uses_the_search_scores(tmp_path: Path) -> None:
    run = Run(tmp_path, baseline=False)
    run.add("a", {"speculative_num_steps": 3}, {1: 234, 16: 1450}, score=0.61)
    run.add("b", {"speculative_num_steps": 4}, {1: 277, 16: 1596}, score=0.74)
    out = write_report(str(tmp_path))
    assert out.summary_lines[0].startswith("Best config: steps=4 topk=1 draft=5; no "
                                           "no-speculation baseline was measured")


def test_html_escapes_what_the_tables_say(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.add("a", {"speculative_num_steps": 3}, {1: 234, 16: 1450})
    run.add("b", {"speculative_num_steps": 9}, None, status="failed",
            reason="crashed: <script>alert(1)</script> & more")
    page = Path(write_report(str(tmp_path)).html_path).read_text()
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page


def test_shape_on_a_plain_curve() -> None:
    sh = shape([0.1, 0.3, 0.31, 0.1], band=0.025)
    assert (sh.best, sh.lo, sh.hi, sh.escaped) == (2, 1, 2, None)
    sh = shape([0.1, 0.3, 0.31, 0.6], band=0.025)
    assert sh.best == 3 and sh.escaped == (1, 2)


# ---------------------------------------------------------------------------------------------
# Recommendation, command line, schedule


def test_recommendation_and_launch_command(tmp_path: Path) -> None:
    seed_run(tmp_path)
    data = read_run(str(tmp_path))
    rec = recommend(data)
    assert rec.config is not None and rec.config.param("speculative_num_steps") == 4
    assert rec.vs_baseline == "better"
    assert rec.command == (
        "python -m sglang.launch_server --model-path Qwen/Qwen3.5-122B-A10B --tp-size 2 "
        "--speculative-algorithm EAGLE3 --speculative-draft-model-path "
        "Qwen3.5-122B-A10B-EAGLE3 --speculative-num-steps 4 --speculative-eagle-topk 1 "
        "--speculative-num-draft-tokens 5 --cuda-graph-max-bs 64 --enable-metrics")
    rows = {row.c: row for row in rec.rows}
    assert rows[1].tok_s == 277 and rows[1].base == 100 and rows[1].speedup == pytest.approx(2.77)
    assert rows[16].speedup == pytest.approx(1.596)


def test_no_experiment_means_no_command_and_says_why(tmp_path: Path) -> None:
    run = Run(tmp_path, experiment=False)
    run.add("a", {"speculative_num_steps": 3}, {1: 234, 16: 1450})
    data = read_run(str(tmp_path))
    rec = recommend(data)
    assert rec.command is None and "no experiment.toml in the run dir" in rec.command_note
    md = Path(write_report(str(tmp_path)).path).read_text()
    assert "no launch command: no experiment.toml in the run dir" in md


def content(s: Schedule, engine: str) -> Any:
    """The JSON of that engine's schedule file, as its backend wrote it."""
    f = s.file(engine)
    assert f is not None, engine
    return f.content


def command(s: Schedule, engine: str) -> str:
    """That engine's command for its file ('' where it has none)."""
    f = s.file(engine)
    assert f is not None, engine
    return f.command or ""


def test_schedule_per_level_and_its_formats(tmp_path: Path) -> None:
    # steps=5 is +8.3% at C=1 (beyond noise) and -30% at C=16: a schedule pays.
    seed_run(tmp_path, curve={**SEED, 5: {1: 300, 16: 1119}})
    # A release that reads the per-batch-size file (SGLang >= 0.5.13).
    (tmp_path / "experiment.toml").write_text(EXPERIMENT.replace(
        "tp_size = 2\n", 'tp_size = 2\nengine_version = "0.5.13"\n', 1))
    data = read_run(str(tmp_path))
    s = schedule(data)
    assert [(e.c, e.steps, e.tok_s) for e in s.chain] == [(1, 5, 300), (16, 4, 1596)]
    assert not any(e.within_noise or e.kept_static for e in s.chain)
    # Keys are running batches: the schedule server has steps 5's KV pool, whose running limit
    # (11) is what C=16 runs; a batch between 1 and 11 takes the steps of the nearer level in
    # log scale, so C=16's slot starts at ceil(sqrt(1 * 11)) = 4 (its dips below 11 stay in it).
    assert content(s, "sglang") == {"1": {"candidate_steps": [5]}, "4": {"candidate_steps": [4]}}
    assert content(s, "trtllm")["draft_len_schedule"] == {1: 5, 3: 5, 11: 4}
    assert content(s, "vllm") == {"method": "eagle3", "model": "Qwen3.5-122B-A10B-EAGLE3",
                      "num_speculative_tokens": 5,
                      "num_speculative_tokens_per_batch_size": [[1, 3, 5], [4, 4, 4]]}
    assert command(s, "sglang")
    assert "--speculative-num-steps 5 --speculative-eagle-topk 1 " \
           "--speculative-num-draft-tokens 6" in command(s, "sglang")
    assert "--speculative-adaptive --speculative-adaptive-config sglang-adaptive-config.json" \
        in command(s, "sglang")
    out = write_report(str(tmp_path))
    paths = {Path(p).name: p for p in out.schedule_paths}
    assert json.loads(Path(paths["sglang-adaptive-config.json"]).read_text()) == \
        content(s, "sglang")
    assert json.loads(Path(paths["vllm-speculative-config.json"]).read_text()) == \
        content(s, "vllm")


@pytest.mark.parametrize(("version", "words"), [
    (None, "SGLang 0.5.10.post1 (the release the simulator imitates; set "
           "backend.engine_version) has no --speculative-adaptive"),
    ("0.5.10.post1", "SGLang 0.5.10.post1 (backend.engine_version) has no"),
    ("0.5.12", "SGLang 0.5.12 (backend.engine_version) reads --speculative-adaptive-config as "
               "one flat object"),
])
def test_schedule_command_only_for_a_release_that_takes_it(tmp_path: Path, version: str | None,
                                                           words: str) -> None:
    # --speculative-adaptive[-config] do not exist in 0.5.10.post1 (argparse exit 2); 0.5.11
    # and 0.5.12 have them with another file format: the report says which release it needs
    # and still writes the file.
    seed_run(tmp_path, curve={**SEED, 5: {1: 300, 16: 1119}})
    if version is not None:
        (tmp_path / "experiment.toml").write_text(EXPERIMENT.replace(
            "tp_size = 2\n", f'tp_size = 2\nengine_version = "{version}"\n', 1))
    s = schedule(read_run(str(tmp_path)))
    assert content(s, "sglang") == {"1": {"candidate_steps": [5]}, "4": {"candidate_steps": [4]}}
    assert command(s, "sglang") == ""
    note = next(n for n in s.notes if n.startswith("No SGLang schedule command"))
    assert words in note and "needs SGLang >= 0.5.13" in note
    out = write_report(str(tmp_path))
    assert "sglang-adaptive-config.json" in {Path(p).name for p in out.schedule_paths}
    assert note in Path(out.path).read_text()


def test_schedule_does_not_switch_for_a_gain_inside_the_noise(tmp_path: Path) -> None:
    seed_run(tmp_path)       # steps=5 is the fastest at C=1, by +1.8%: inside the 2.5% band
    s = schedule(read_run(str(tmp_path)))
    assert [(e.c, e.steps, e.within_noise) for e in s.entries] == [(1, 5, True), (16, 4, False)]
    assert [(e.c, e.steps, e.kept_static) for e in s.chain] == [(1, 4, True), (16, 4, False)]
    # The static config's steps at every level: no file (a per-batch-size mode of one step
    # count only adds its own cost; vLLM 0.26.0's needs piecewise CUDA graphs).
    assert s.ask is None and all(f.content is None for f in s.files)
    assert any("only within noise" in n for n in s.notes)
    assert any("equals the static config" in n for n in s.notes)
    assert any("No schedule file is written" in n for n in s.notes)
    write_report(str(tmp_path))
    assert not list((tmp_path / "report").glob("*.json"))


def test_schedule_keeps_no_speculation_where_the_baseline_wins(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.add("a", {"speculative_num_steps": 3}, {1: 234, 16: 950})
    run.add("b", {"speculative_num_steps": 2}, {1: 186, 16: 990})
    s = schedule(read_run(str(tmp_path)))
    assert [(e.c, e.steps) for e in s.chain] == [(1, 3), (16, 0)]
    assert content(s, "sglang") == {"1": {"candidate_steps": [3]}, "4": {"candidate_steps": [0]}}
    assert content(s, "vllm")["num_speculative_tokens_per_batch_size"] == [[1, 3, 3], [4, 4, 0]]


def test_no_schedule_is_offered_where_it_loses_beyond_noise(tmp_path: Path) -> None:
    # The static best is a tree (topk 2); a schedule switches only a chain's steps, and the
    # best chain at C=1 is 21% slower than the tree there (beyond the 2.5% band) though it
    # is 5% faster at C=16: the run of issue 35 printed that schedule, "-23.9% vs static" and
    # all. No schedule line then, one line why, in the closing lines and the report alike.
    (tmp_path / "experiment.toml").write_text(EXPERIMENT.replace("choices = [1]",
                                                                 "choices = [1, 2]"))
    run = Run(tmp_path, experiment=False)
    run.add("tree", {"speculative_num_steps": 4, "speculative_eagle_topk": 2,
                     "speculative_num_draft_tokens": 8}, {1: 350, 16: 1600})
    run.add("chain", {"speculative_num_steps": 4}, {1: 277, 16: 1680})
    data = read_run(str(tmp_path))
    assert data.best is not None and data.best.param("speculative_eagle_topk") == 2
    s = schedule(data)
    assert s.withheld is not None
    assert "at C=1 -20.9%;" in s.withheld and "C=16" not in s.withheld
    assert s.withheld.endswith("recommended: the static config")
    assert s.files == ()
    out = write_report(str(tmp_path))
    assert not any(line.startswith("Per-level schedule") for line in out.summary_lines)
    assert s.withheld + "." in out.summary_lines
    md = Path(out.path).read_text()
    assert "Per-level schedule:" not in md and s.withheld in md
    assert out.schedule_paths == []


def test_report_says_how_well_and_how_long_each_level_was_measured(tmp_path: Path) -> None:
    # Levels measured in rounds carry their precision and seconds; a saturated level without
    # acceptance says why in its note. The report shows the first two per level and says why
    # the acceptance is missing, and the closing lines count the seconds spent measuring.
    (tmp_path / "experiment.toml").write_text(EXPERIMENT.replace(
        "concurrency = [1, 16]", "concurrency = [1, 16]\nprecision = 0.02\nmin_rounds = 2"))
    Run(tmp_path, experiment=False)    # the baseline
    params = resolve({"speculative_num_steps": 4}, {"cuda_graph_max_bs": 64})
    why = "no request completed in the level: acceptance not read from the requests"
    levels = [dataclasses.replace(level(1, 277, accept=4.6), rounds=5, precision=0.012,
                                  accept_precision=0.004, level_s=6.0),
              dataclasses.replace(level(16, 1596), rounds=3, precision=0.018, level_s=14.0,
                                  note=why)]
    for s in levels:
        store.write_level(tmp_path, "t4", s, [], params=params, repeat=0)
    store.write_trial(tmp_path, TrialResult(trial_id="t4", params=params, status="ok",
                                              facts=ServerFacts(max_running_requests=14),
                                              levels=tuple(levels)),
                        extra={"finished_at": 1_700_000_100, "node": "test"})
    data = read_run(str(tmp_path))
    rec = recommend(data)
    assert [(r.c, r.precision, r.level_s) for r in rec.rows] == [(1, 0.012, 6.0),
                                                                (16, 0.018, 14.0)]
    assert rec.rows[1].accept_why == why and rec.rows[0].accept_why is None
    out = write_report(str(tmp_path))
    md = Path(out.path).read_text()
    assert "| C=1 | 277.0 | +-1.2% |" in md and "| C=16 | 1596.0 | +-1.8% |" in md
    assert "| 4.60 | 6 |" in md and "| - | 14 |" in md
    assert f"Acceptance not read: C=16: {why}." in md
    assert "measured in whole rounds until the 95% interval" in md and "+-2.0%" in md
    trials_line = next(x for x in out.summary_lines if x.startswith("Trials:"))
    assert "measuring took 20 s over 1 boot(s) (20 s a boot)" in trials_line


def test_vllm_experiment_gets_vllm_commands(tmp_path: Path) -> None:
    run = Run(tmp_path)
    (tmp_path / "experiment.toml").write_text(
        EXPERIMENT.replace('kind = "sim"', 'kind = "vllm"\nspeculative_algorithm = "NEXTN"')
        .replace("[backend.flags]\ncuda_graph_max_bs = 64\n", ""))
    mem = "mem_fraction_static"
    run.add("a", {"speculative_num_steps": 3, mem: 0.9}, {1: 234, 16: 1450})
    run.add("b", {"speculative_num_steps": 5, mem: 0.9}, {1: 300, 16: 1100})
    data = read_run(str(tmp_path))
    rec = recommend(data)
    assert rec.command is not None and rec.command.startswith(
        "vllm serve Qwen/Qwen3.5-122B-A10B --tensor-parallel-size 2 --speculative-config")
    assert '"num_speculative_tokens":3' in rec.command
    s = schedule(data)
    assert content(s, "vllm")["method"] == "mtp"      # the backend's name for NEXTN
    assert content(s, "vllm")["num_speculative_tokens_per_batch_size"] == [[1, 3, 5], [4, 4, 3]]
    # The vLLM backend's own command (its flags as the static launch command has them).
    assert "--gpu-memory-utilization 0.9" in command(s, "vllm")
    assert '"num_speculative_tokens":5' in command(s, "vllm")
    assert '"num_speculative_tokens_per_batch_size":[[1,3,5],[4,4,3]]' in command(s, "vllm")
    assert command(s, "sglang") == ""      # not an SGLang experiment: the JSON only
    # ... and no line saying it boots nothing: the vLLM backend boots its own file now.
    assert not any("is not booted" in n for n in s.notes)
    # An SGLang-form schedule for another engine's experiment: the vLLM backend translates it.
    (tmp_path / "experiment.toml").write_text(EXPERIMENT.replace(
        'kind = "sim"', 'kind = "sglang"\nspeculative_algorithm = "NEXTN"'))
    s = schedule(read_run(str(tmp_path)))
    assert content(s, "vllm")["method"] == "mtp"
    assert command(s, "vllm").startswith(
        "vllm serve Qwen/Qwen3.5-122B-A10B --tensor-parallel-size 2 --speculative-config")


# ---------------------------------------------------------------------------------------------
# Files: summary, figures, HTML, CLI


def test_report_files_figures_and_offline_html(tmp_path: Path) -> None:
    seed_run(tmp_path)
    out = write_report(str(tmp_path))
    assert Path(out.path) == tmp_path / "report" / "report.md"
    names = sorted(Path(p).name for p in out.figures)
    assert names == ["accept_vs_steps.png", "history.png", "kv_vs_steps.png", "pareto.png",
                     "tok_s_vs_steps.png"]
    for p in out.figures:
        raw = Path(p).read_bytes()
        assert raw.startswith(b"\x89PNG\r\n\x1a\n")
        assert matplotlib.image.imread(p).shape[0] > 100
    page = Path(out.html_path).read_text()
    srcs = re.findall(r'src="([^"]+)"', page)
    assert len(srcs) == len(out.figures)
    assert all(s.startswith("data:image/png;base64,") for s in srcs)
    embedded = {base64.b64decode(s.split(",", 1)[1]) for s in srcs}
    assert embedded == {Path(p).read_bytes() for p in out.figures}
    assert "http://" not in page and "https://" not in page and "<link" not in page \
        and "<script" not in page
    md = Path(out.path).read_text()
    # The ten-second summary opens the report and is what the search prints.
    head = md.split("## ")[0]
    for line in out.summary_lines:
        assert line in head
    assert out.summary_lines[0].startswith("Best config: steps=4 topk=1 draft=5")
    assert "C=1 2.77x, C=16 1.60x" in out.summary_lines[0]
    assert out.summary_lines[1].startswith("Plateau verdict: steps 4 -> 5: +1.8% at C=1")
    # Which plateau questions a boot answered and which the model did (here: the jump).
    assert out.summary_lines[2] == ("Plateau questions: 1 answered by a boot, 0 by the model "
                                    "(predicted, not booted).")
    assert "noise band ±2.5% assumed" in out.summary_lines[3]
    assert not list((tmp_path / "report").glob(".*"))       # no temporary files left


def test_cli_prints_summary_and_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    seed_run(tmp_path / "run")
    out_dir = tmp_path / "elsewhere"
    assert report_main([str(tmp_path / "run"), "--out", str(out_dir)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Best config: steps=4")
    assert f"report: {out_dir / 'report.md'}" in text
    assert (out_dir / "report.html").is_file() and not (tmp_path / "run" / "report").exists()


def test_missing_or_empty_run_dir_exits_2(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert report_main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such run dir" in err
    (tmp_path / "empty").mkdir()
    assert report_main([str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no trials recorded" in err


def test_module_entry_point(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "specdecode_tune.report",
                           str(tmp_path / "missing")], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error:") and len(proc.stderr.splitlines()) == 1


def test_search_closing_table_prints_the_reports_medians(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    """The search's closing "best config, per level (median of N)" table and the report show
    the same figures: the medians over the best config's measurements, not its first run."""
    from types import SimpleNamespace

    from specdecode_tune.search import summary

    run = seed_run(tmp_path)
    run.add("t04r1", {"speculative_num_steps": 4}, {1: 270.0, 16: 1580.0}, repeat=1)
    summary.report(SimpleNamespace(run_dir=str(tmp_path)))      # type: ignore[arg-type]
    out = " ".join(capsys.readouterr().out.split())
    assert "best config, per level (median of 2 measurement(s))" in out
    # steps=4 measured 277 and 270 at C=1, 1596 and 1580 at C=16: medians 273.5 and 1588.
    assert "C=1 273.5 tok/s baseline 100.0 2.73x" in out, out
    assert "C=16 1588.0 tok/s baseline 1000.0 1.59x" in out, out
    md = (tmp_path / "report" / "report.md").read_text()
    assert "2.73x" in md and "1.59x" in md


def test_a_schedule_of_the_static_steps_everywhere_says_so(tmp_path: Path) -> None:
    """The closing line of a run whose best chain at every level is the static config's steps
    read "Per-level schedule: C=1 steps=4, C=16 steps=4", as if there were something to
    switch (seen on sim-default, 2026-12-07)."""
    seed_run(tmp_path)       # steps=5 wins C=1 by +1.8% only: inside the band, steps 4 kept
    out = write_report(str(tmp_path))
    line = next(x for x in out.summary_lines if x.startswith("Per-level schedule"))
    assert line == ("Per-level schedule: steps=4 at every level, the static config's own: "
                    "nothing to switch.")


def test_a_kv_pool_that_moved_between_boots_of_one_config_is_named(tmp_path: Path) -> None:
    """vLLM 0.26.0 on an H100 (2026-12-07) sized K 4 at 0.0125 to 44,432 tokens at one boot and
    49,184 at its re-measurement: the trials section names it; a pool that held is not."""
    from specdecode_tune.report.trials import kv_moves

    run = Run(tmp_path)
    run.add("a", {"speculative_num_steps": 4}, SEED[4], kv=44_432)
    run.add("b", {"speculative_num_steps": 4}, SEED[4], repeat=1, kv=49_184)
    run.add("c", {"speculative_num_steps": 3}, SEED[3], kv=50_000)
    run.add("d", {"speculative_num_steps": 3}, SEED[3], repeat=1, kv=50_100)
    line = kv_moves(read_run(str(tmp_path)))
    assert "44,432 (a), 49,184 (b), +10.7%" in line and "steps=4" in line
    assert "steps=3" not in line and "\n" not in line
    run2 = Run(tmp_path / "held")
    run2.add("c", {"speculative_num_steps": 3}, SEED[3], kv=50_000)
    run2.add("d", {"speculative_num_steps": 3}, SEED[3], repeat=1, kv=50_100)
    assert kv_moves(read_run(str(tmp_path / "held"))) == ""
    # Where the boots' logs say it: which compiled their graphs and which loaded them, and
    # whether every compiling boot got the smaller pool (the search's boots of 2026-12-07:
    # the slow first boots of a config held 44,432 tokens, its fast re-boots 49,184).
    cold = {"compiled_graphs": 2.0, "loaded_graphs": 0.0}
    warm = {"compiled_graphs": 0.0, "loaded_graphs": 2.0}
    run3 = Run(tmp_path / "logs")
    run3.add("a", {"speculative_num_steps": 4}, SEED[4], kv=44_432, extra=cold)
    run3.add("b", {"speculative_num_steps": 4}, SEED[4], repeat=1, kv=49_184, extra=warm)
    line = kv_moves(read_run(str(tmp_path / "logs")))
    assert "44,432 (a, compiled at boot), 49,184 (b, graphs from the cache), +10.7%" in line
    assert line.endswith("Each boot that compiled its graphs got a smaller pool than each "
                         "that loaded them from the engine's compile cache.")
    run4 = Run(tmp_path / "mixed")
    run4.add("a", {"speculative_num_steps": 4}, SEED[4], kv=49_184, extra=cold)
    run4.add("b", {"speculative_num_steps": 4}, SEED[4], repeat=1, kv=44_432, extra=warm)
    line = kv_moves(read_run(str(tmp_path / "mixed")))
    assert "49,184 (a, compiled at boot)" in line and "Each boot that compiled" not in line


def test_a_config_measured_only_by_boots_that_compiled_is_named_against_its_memorys_pool(
        tmp_path: Path) -> None:
    """vLLM 0.26.0 compiles once per class of K (K 1, K 2, K >= 3 at 64 sequences: its compile
    cache's key holds the largest CUDA-graph size) and sizes its pool in the run that compiles:
    on an H100 (2026-12-07) K 2 at 0.0075 compiled and held 6,688 tokens where K 4 there,
    loading its graphs, held 11,440. A config booted once that way has no second boot for its
    pool to move between; the boots at its memory say it had less."""
    from specdecode_tune.report.trials import kv_moves

    cold = {"compiled_graphs": 2.0, "loaded_graphs": 0.0}
    warm = {"compiled_graphs": 0.0, "loaded_graphs": 2.0}
    mem = "mem_fraction_static"
    run = Run(tmp_path)
    run.add("k4", {"speculative_num_steps": 4, mem: 0.0075}, SEED[4], kv=11_440, extra=warm)
    run.add("k2", {"speculative_num_steps": 2, mem: 0.0075}, SEED[2], kv=6_688, extra=cold)
    run.add("k3", {"speculative_num_steps": 3, mem: 0.01}, SEED[3], kv=25_568, extra=cold)
    run.add("k5", {"speculative_num_steps": 5, mem: 0.0075}, SEED[5], kv=11_440, extra=warm)
    line = kv_moves(read_run(str(tmp_path)))
    assert line.startswith("Measured only by boots that compiled their graphs at start")
    assert "(k2: 6,688 tokens, against 11,440 or more where a boot at mem_fraction_static " \
           "0.0075 loaded its graphs)" in line
    assert "k3" not in line and "k4" not in line and line.count("steps=") == 1
    # No boot at that memory loaded its graphs, or the compiled one held as much: nothing said.
    run2 = Run(tmp_path / "none")
    run2.add("k3", {"speculative_num_steps": 3, mem: 0.01}, SEED[3], kv=25_568, extra=cold)
    run2.add("k4", {"speculative_num_steps": 4, mem: 0.0075}, SEED[4], kv=11_440, extra=warm)
    run2.add("k2", {"speculative_num_steps": 2, mem: 0.0075}, SEED[2], kv=11_440, extra=cold)
    assert kv_moves(read_run(str(tmp_path / "none"))) == ""
