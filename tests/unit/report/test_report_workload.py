"""The report's workload sections from known tables: the levels table with goodput, its
interval and saturation; the goodput figure; per-request acceptance histograms."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from specdecode_tune import store
from specdecode_tune.records import LevelSummary, RequestRecord, ServerFacts, TrialResult
from specdecode_tune.report import write_report
from specdecode_tune.report.data import read_run
from specdecode_tune.report.prompts import prompt_spread
from specdecode_tune.space import resolve

EXPERIMENT = """
name = "goodput-report"
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
[objective]
kind = "goodput"
ttft_ms = 1000
tpot_ms = 50
"""


def level(c: int, tok: float, good: int, total: int, saturated: bool = False) -> LevelSummary:
    return LevelSummary(
        concurrency=c, mode="closed", rate=None, duration_s=10.0, requests=total, errors=0,
        output_tokens=int(tok * 10), output_tok_s=tok, requests_s=total / 10,
        ttft_p50=0.1, ttft_p90=0.2, ttft_p99=0.3, tpot_p50=0.01, tpot_p90=0.02, tpot_p99=0.03,
        itl_p50=None, itl_p90=None, itl_p99=None, e2e_p50=2.0, e2e_p90=2.5, e2e_p99=3.0,
        accept_length=None, slo_good=good, slo_total=total, saturated=saturated)


def request(i: int, out: int, verify: int | None) -> RequestRecord:
    return RequestRecord(level=1, index=i, start=0.0, end=1.0, ttft=0.1, input_tokens=10,
                         output_tokens=out, verify_ct=verify, prompt_id=f"p{i % 5}")


def add(path: Path, n: int, trial_id: str, steps: int, levels: list[LevelSummary],
        accept: list[float], repeat: int = 0) -> None:
    params = resolve({"speculative_num_steps": steps}, {"cuda_graph_max_bs": 64})
    reqs = [request(i, 100, round(100 / a) if steps else None) for i, a in enumerate(accept)]
    for k, s in enumerate(levels):
        store.write_level(path, trial_id, s, reqs if k == 0 else [], params=params,
                            repeat=repeat)
    store.write_trial(path, TrialResult(
        trial_id=trial_id, params=params, status="ok", facts=ServerFacts(max_running_requests=20),
        levels=tuple(levels), repeat=repeat), extra={"finished_at": 1_700_000_000 + n,
                                                     "node": "test"})


def test_levels_table_goodput_interval_saturation_and_acceptance_spread(tmp_path: Path) -> None:
    (tmp_path / "experiment.toml").write_text(EXPERIMENT)
    add(tmp_path, 0, "baseline", 0, [level(1, 100, 10, 10), level(16, 900, 5, 20)], [1.0] * 5)
    spread = [1.5, 2.0, 2.5, 3.0, 3.5, 4.0] * 3
    for rep in range(3):
        add(tmp_path, 1 + rep, f"t3-{rep}", 3,
            [level(1, 200, 10, 10), level(16, 1000, 15 + rep, 20, saturated=rep == 0)],
            spread, repeat=rep)
    data = read_run(str(tmp_path))
    best = data.configs[0]
    assert best.robust.median > 0          # goodput 1.5-1.7 good/s against 0.5: the score
    out = write_report(str(tmp_path))
    md = Path(out.path).read_text()
    assert "## Levels: goodput and saturation" in md
    assert "TTFT <= 1000 ms, TPOT <= 50 ms" in md
    # The best config at C=16: mean fraction 80% over three repeats, saturated once of three.
    section = md.split("## Levels: goodput")[1].split("## Per-request acceptance")[0]
    row = next(line for line in section.splitlines() if line.startswith("| C=16 | 1000.0"))
    assert "80% [" in row and "yes (1/3)" in row
    assert "| C=16 | 900.0 | 25% [" in section   # the baseline, one measurement: Wilson's
    spread_rows = md.split("## Per-request acceptance")[1].splitlines()
    # 18 requests x 3 repeats; p10 1.5 and p90 ~4 of each request's 100 / round(100 / a)
    assert any(line.startswith("| `steps=3") and "| 54 | 1.49 | 2.77 | 4.00 |" in line
               for line in spread_rows)
    names = {Path(f).name for f in out.figures}
    assert {"goodput.png", "accept_spread.png"} <= names
    assert md.index("## Levels: goodput") < md.index("## How the figures are computed")
    per_prompt = prompt_spread(data)
    assert set(per_prompt) == {f"p{i}" for i in range(5)}


def test_no_goodput_no_section_figure_but_levels_table_still_flags_saturation(
        tmp_path: Path) -> None:
    (tmp_path / "experiment.toml").write_text(EXPERIMENT.replace(
        'kind = "goodput"\nttft_ms = 1000\ntpot_ms = 50', 'kind = "scalar"'))

    def plain(c: int, tok: float, sat: bool = False) -> LevelSummary:
        return dataclasses.replace(level(c, tok, 0, 10, sat), slo_good=None, slo_total=None)

    add(tmp_path, 0, "baseline", 0, [plain(1, 100), plain(16, 900)], [1.0])
    add(tmp_path, 1, "t3", 3, [plain(1, 200), plain(16, 1000, True)], [2.0, 3.0])
    out = write_report(str(tmp_path))
    md = Path(out.path).read_text()
    assert "goodput.png" not in {Path(f).name for f in out.figures}
    assert "Objective: goodput" not in md
    section = md.split("## Levels: goodput")[1]
    assert "| C=16 | 1000.0 | - | - | yes (1/1) |" in section
