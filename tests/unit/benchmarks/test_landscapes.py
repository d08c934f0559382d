"""benchmarks/landscapes.py (replaying a recorded real landscape) and the recorder's table and
resume (benchmarks/record_landscape.py), on small tables written here: no server."""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from specdecode_tune.records import LevelSummary, ServerFacts, TrialResult
from specdecode_tune.search.searcher import INFEASIBLE_SCORE
from tests.conftest import bench_module

EXPERIMENT = Path(__file__).resolve().parents[3] / "experiments" / "llamacpp-cpu.toml"
STEPS = "speculative_num_steps"
NGRAM = "spec_ngram_simple_size_n"


def _load(name: str) -> ModuleType:
    return bench_module(name)


@pytest.fixture(scope="module")
def rec() -> ModuleType:
    return _load("record_landscape")


@pytest.fixture(scope="module")
def land_mod() -> ModuleType:
    return _load("landscapes")


def level(c: int, tok_s: float, accept: float | None = 2.0) -> LevelSummary:
    return LevelSummary(c, "closed", None, 3.0, 10, 0, int(tok_s * 3), tok_s, 1.0,
                        *([None] * 12), accept_length=accept, accept_histogram=(3, 4, 5))


# Per point (steps, n) the tok/s of each repeat at C=1 (C=4 is twice it): distinct numbers, so
# a drawn repeat is recognisable and never equal to a mean.
BASE = [100.0, 104.0, 96.0]
TRUE = {
    (1, 1): [110.0, 130.0, 120.0],
    (1, 2): [150.0, 171.0, 162.0],      # the best mean: 161
    (2, 1): [158.0, 163.0, 160.0],      # mean 160.33: within 2% of the best
    (2, 2): None,                        # refused at every repeat
    (3, 1): [140.0, None, 146.0],        # refused once
    (3, 2): [90.0, 95.0, 85.0],
}


def result_for(point: dict[str, Any], repeat: int) -> TrialResult:
    if point.get(STEPS) == 0:
        tok = BASE[repeat]
    else:
        series = TRUE[(point[STEPS], point[NGRAM])]
        tok = None if series is None else series[repeat]
    if tok is None:
        return TrialResult("t", dict(point), "infeasible",
                           "invalid_args: the server refused it", wall_s=1.0)
    # One boot compiled the engine's graphs at start (vLLM's first of a K class on a machine):
    # the slow point's first, which --contenders would otherwise pass over.
    cold = repeat == 0 and (point.get(STEPS), point.get(NGRAM)) == (3, 2)
    facts = ServerFacts(16384, 4, boot_s=0.5, extra={"compiled_graphs": float(cold)})
    return TrialResult("t", dict(point), "ok", facts=facts,
                       levels=(level(1, tok), level(4, 2 * tok)), wall_s=5.0, repeat=repeat)


def write_recording(rec: ModuleType, path: Path, monkeypatch: pytest.MonkeyPatch,
                    stop_after: int | None = None, extra: Sequence[str] = ()
                    ) -> list[tuple[str, int]]:
    """Run the recorder with the trial replaced by the table above; returns the boots it made
    (point id, repeat). `stop_after` boots, it is interrupted (KeyboardInterrupt)."""
    booted: list[tuple[str, int]] = []

    def fake_trial(exp: Any, sampled: dict[str, Any], ctx: Any, **_kw: Any) -> TrialResult:
        if stop_after is not None and len(booted) >= stop_after:
            raise KeyboardInterrupt
        booted.append((rec.point_id(sampled), ctx.repeat))
        return result_for(sampled, ctx.repeat)

    monkeypatch.setattr(rec, "run_trial", fake_trial)
    monkeypatch.setattr(rec, "preflight", lambda cfg: None)
    monkeypatch.setattr(rec, "engine_version", lambda exp: "version: 1 (test)")
    argv = ["--experiment", str(EXPERIMENT), "--axis", f"{STEPS}=0-3", "--axis", f"{NGRAM}=1,2",
            "--repeats", "3", "--duration-s", "3", "--out", str(path),
            "--run-dir", str(path.parent / "runs"), *extra]
    if stop_after is None:
        assert rec.main(argv) == 0
    else:
        with pytest.raises(KeyboardInterrupt):
            rec.main(argv)
    return booted


@pytest.fixture()
def table(rec: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "tiny.parquet"
    write_recording(rec, path, monkeypatch)
    return path


def record_a_faster_session(rec: ModuleType, table: Path, tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A later session adds a fourth repeat to `table` on a machine twice as fast: every
    figure of the first repeat doubled, the baseline's too."""
    import dataclasses

    def faster(exp: Any, sampled: dict[str, Any], ctx: Any, **_kw: Any) -> TrialResult:
        r = result_for(sampled, ctx.repeat % 3)
        return dataclasses.replace(r, levels=tuple(
            dataclasses.replace(lv, output_tok_s=2 * lv.output_tok_s) for lv in r.levels))

    monkeypatch.setattr(rec, "preflight", lambda cfg: None)
    monkeypatch.setattr(rec, "engine_version", lambda exp: "version: 1 (test)")
    monkeypatch.setattr(rec, "run_trial", faster)
    assert rec.main(["--experiment", str(EXPERIMENT), "--axis", f"{STEPS}=0-3", "--axis",
                     f"{NGRAM}=1,2", "--repeats", "4", "--duration-s", "3", "--out",
                     str(table), "--run-dir", str(tmp_path / "runs")]) == 0


# ------------------------------------------------------------------------------- the recorder


def test_axes_parse_ranges_and_lists_and_refuse_bad_ones(rec: ModuleType) -> None:
    assert rec.parse_axis("speculative_num_steps=0-3") == (STEPS, [0, 1, 2, 3])
    assert rec.parse_axis("spec_ngram_simple_size_n=1,3") == (NGRAM, [1, 3])
    for bad in ("steps", "x=4-2", "x=1,1", "x=a-b"):
        with pytest.raises(rec.ConfigError):
            rec.parse_axis(bad)
    with pytest.raises(rec.ConfigError, match="first axis"):
        rec.grid_points([(NGRAM, [1, 2]), (STEPS, [0, 1])])
    # The baseline once, then every (steps >= 1, n)
    points = rec.grid_points([(STEPS, [0, 1, 2]), (NGRAM, [1, 2])])
    assert points[0] == {STEPS: 0} and len(points) == 1 + 2 * 2


def test_the_recorder_writes_a_row_per_point_repeat_and_level(table: Path) -> None:
    import pyarrow.parquet as pq

    t = pq.read_table(table)
    rows = t.to_pylist()
    assert len(rows) == (1 + 3 * 2) * 3 * 2       # points x repeats x levels
    meta = json.loads(t.schema.metadata[b"landscape"])
    assert meta["axes"] == [[STEPS, [0, 1, 2, 3]], [NGRAM, [1, 2]]]
    assert meta["experiment"]["measure"]["duration_s"] == 3
    assert meta["levels"] == [1, 4]
    (session,) = meta["sessions"]
    assert session["boots"] == 21 and session["engine_version"] == "version: 1 (test)"
    assert "record_landscape" in session["command"] and session["wall_s"] >= 0
    refused = [r for r in rows if r["axis_speculative_num_steps"] == 2
               and r["axis_spec_ngram_simple_size_n"] == 2]
    assert len(refused) == 6 and all(r["status"] == "infeasible" and r["output_tok_s"] is None
                                     for r in refused)
    one = next(r for r in rows if r["point"] == json.dumps({NGRAM: 2, STEPS: 1})
               and r["repeat"] == 1 and r["concurrency"] == 4)
    assert one["output_tok_s"] == 2 * 171.0 and one["accept_histogram"] == [3, 4, 5]
    assert "--spec-ngram-simple-size-m 1" in one["launch_command"]


def test_an_interrupted_recording_resumes_without_booting_a_point_twice(
        rec: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow.parquet as pq

    path = tmp_path / "resume.parquet"
    first = write_recording(rec, path, monkeypatch, stop_after=8)
    assert len(first) == 8
    assert len(pq.read_table(path)) == 8 * 2      # written after every boot
    # Repeat-major: the first 7 boots are the whole grid once
    assert {r for _, r in first[:7]} == {0}
    second = write_recording(rec, path, monkeypatch)
    assert len(second) == 21 - 8 and not set(first) & set(second)
    rows = pq.read_table(path).to_pylist()
    assert len(rows) == 21 * 2
    assert len({(r["point"], r["repeat"], r["concurrency"]) for r in rows}) == len(rows)
    meta = json.loads(pq.read_table(path).schema.metadata[b"landscape"])
    assert [s["boots"] for s in meta["sessions"]] == [8, 13]
    # Nothing left: a third run boots nothing
    assert write_recording(rec, path, monkeypatch) == []


def test_a_boots_own_facts_are_kept_and_a_table_from_before_them_resumes(
        rec: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each row keeps what the server said of itself beyond the pool (`facts_json`: whether
    vLLM compiled at that boot sizes its pool); a table recorded before the column existed
    (vLLM's first landscape session, 2026-12-07) resumes, its rows null there."""
    import pyarrow.parquet as pq

    path = tmp_path / "old.parquet"
    write_recording(rec, path, monkeypatch, stop_after=8)
    old = pq.read_table(path)
    pq.write_table(old.drop_columns(["facts_json"]), path)
    write_recording(rec, path, monkeypatch)
    rows = pq.read_table(path).to_pylist()
    assert len(rows) == 21 * 2
    assert sum(r["facts_json"] is None for r in rows) == 8 * 2
    kept = [json.loads(r["facts_json"]) for r in rows
            if r["facts_json"] is not None and r["status"] == "ok"]
    assert kept and {f["compiled_graphs"] for f in kept} <= {0.0, 1.0}
    assert any(f["compiled_graphs"] == 0.0 for f in kept)


def test_resuming_with_other_axes_is_refused(rec: ModuleType, table: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(rec, "preflight", lambda cfg: None)
    monkeypatch.setattr(rec, "engine_version", lambda exp: "")
    assert rec.main(["--experiment", str(EXPERIMENT), "--axis", f"{STEPS}=0-5",
                     "--out", str(table)]) == 2
    assert "other axes" in capsys.readouterr().err


def test_a_later_session_adds_repeats_though_the_search_settings_changed(
        rec: ModuleType, table: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The search's sampler and budget do not change what a boot measures: more repeats may
    be added to a table after the experiment file changed there. A change to what is measured
    (the workload here) is refused."""
    import pyarrow.parquet as pq

    text = EXPERIMENT.read_text()
    changed = tmp_path / "changed-search.toml"
    changed.write_text(text.replace("[search]", "[search]\nmax_trials = 3", 1)
                       if "max_trials" not in text.split("[search]", 1)[-1]
                       else re.sub(r"max_trials = \d+", "max_trials = 3", text))
    monkeypatch.setattr(rec, "preflight", lambda cfg: None)
    monkeypatch.setattr(rec, "engine_version", lambda exp: "version: 1 (test)")
    monkeypatch.setattr(rec, "run_trial",
                        lambda exp, sampled, ctx, **_kw: result_for(sampled, ctx.repeat % 3))
    argv = ["--axis", f"{STEPS}=0-3", "--axis", f"{NGRAM}=1,2", "--repeats", "4",
            "--duration-s", "3", "--out", str(table), "--run-dir", str(tmp_path / "runs")]
    assert rec.main(["--experiment", str(changed), *argv]) == 0
    t = pq.read_table(table)
    assert len(t) == (1 + 3 * 2) * 4 * 2
    meta = json.loads(t.schema.metadata[b"landscape"])
    assert meta["repeats"] == 4 and [s["boots"] for s in meta["sessions"]] == [21, 7]
    other = tmp_path / "other-workload.toml"
    other.write_text(re.sub(r"output_len = \d+", "output_len = 99", text))
    assert other.read_text() != text
    assert rec.main(["--experiment", str(other), *argv]) == 2
    assert "another experiment" in capsys.readouterr().err


def test_a_session_that_measures_the_same_points_otherwise_is_warned_about(
        rec: ModuleType, table: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A later session on another machine (one measured the llama.cpp CPU grid 1.9x faster
    than the machine of the first) must not pass as more repeats of the same landscape."""
    import pyarrow.parquet as pq

    record_a_faster_session(rec, table, tmp_path, monkeypatch)
    err = capsys.readouterr().err
    meta = json.loads(pq.read_table(table).schema.metadata[b"landscape"])
    drift = meta["sessions"][-1]["drift"]
    # twice repeat 0's figures against the mean of repeats 0-2: about 2x, per point-level
    assert drift["pairs"] == 12 and drift["ratio"] == pytest.approx(2.0, rel=0.05)
    assert f"{drift['ratio']:.2f}x the earlier sessions' tok/s" in err
    assert "drift" not in meta["sessions"][0]       # the first session has nothing to match


def _as_format_1(table: Path, per_pos: list[int], accept: float) -> None:
    """Rewrite a table as a format-1 recording of a counter engine wrote it: per-position
    accepted counts in every level's histogram."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pq.read_table(table)
    meta = json.loads(t.schema.metadata[b"landscape"])
    meta["format"] = 1
    rows = t.to_pylist()
    for r in rows:
        if r["accept_histogram"]:
            r["accept_histogram"], r["accept_length"] = per_pos, accept
    out = pa.Table.from_pylist(rows, schema=t.schema).replace_schema_metadata(
        {b"landscape": json.dumps(meta).encode()})
    pq.write_table(out, table)


def test_tied_points_are_those_the_recording_cannot_rank_below_the_optimum(
        land_mod: ModuleType, table: Path) -> None:
    import dataclasses

    land = land_mod.load_landscape(table)
    # (2, 1) is within 2%; (3, 1) trails by 11.8% with a standard error of the difference of
    # about 4.3%; (1, 1) by 29%: the recording ranks those two below the optimum.
    assert land_mod.tied(land) == {(1, 2), (2, 1)}
    # A point 5% behind whose repeats spread by +-30% cannot be ranked below it.
    Boot = land_mod.Boot
    wide = tuple(Boot(i, "ok", "", {1: v, 4: 2 * v}, (), {}) for i, v in
                 enumerate([100.0, 155.0, 205.0]))
    scores = dict(land.scores)
    scores[(1, 1)] = land_mod.score({1: 153.3, 4: 306.6}, land.base_mean,
                                    land.exp.level_weights())
    noisy = dataclasses.replace(land, points={**land.points, (1, 1): wide}, scores=scores)
    assert (1, 1) in land_mod.tied(noisy)
    land_mod.landscape_of.cache_clear()
    strict, near, again = land_mod.both_hits(str(table), "grid", 0, 99)
    assert strict is not None and near is not None and near <= strict
    assert again is not None


def test_format_1_histograms_of_counter_engines_replay_in_sglangs_form(
        land_mod: ModuleType, table: Path) -> None:
    """vLLM's and llama.cpp's tables of format 1 hold per-position accepted counts; a search
    hands the samplers SGLang's form (verify steps per number of accepted tokens), and so
    does the replay: 10 steps with (9, 8, 8) accepted per position are (1, 1, 0, 8)."""
    _as_format_1(table, [9, 8, 8], 1.0 + 25 / 10)
    land = land_mod.landscape_of.__wrapped__(str(table))
    boot = land.points[(1, 2)][0]
    assert [lv["accept_histogram"] for lv in boot.levels] == [[1, 1, 0, 8], [1, 1, 0, 8]]


def test_resuming_a_format_1_table_turns_its_histograms_into_sglangs_form(
        rec: ModuleType, table: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow.parquet as pq

    _as_format_1(table, [9, 8, 8], 3.5)
    monkeypatch.setattr(rec, "preflight", lambda cfg: None)
    monkeypatch.setattr(rec, "engine_version", lambda exp: "version: 1 (test)")
    monkeypatch.setattr(rec, "run_trial",
                        lambda exp, sampled, ctx, **_kw: result_for(sampled, ctx.repeat % 3))
    assert rec.main(["--experiment", str(EXPERIMENT), "--axis", f"{STEPS}=0-3", "--axis",
                     f"{NGRAM}=1,2", "--repeats", "4", "--duration-s", "3", "--out",
                     str(table), "--run-dir", str(tmp_path / "runs")]) == 0
    t = pq.read_table(table)
    assert json.loads(t.schema.metadata[b"landscape"])["format"] == 2
    rows = t.to_pylist()
    old = [r["accept_histogram"] for r in rows if r["repeat"] < 3 and r["accept_histogram"]]
    new = [r["accept_histogram"] for r in rows if r["repeat"] == 3 and r["accept_histogram"]]
    assert old and all(h == [1, 1, 0, 8] for h in old)
    assert new and all(h == [3, 4, 5] for h in new)       # written as the trial gave them


# ----------------------------------------------------------------------------------- the replay


def test_every_repeat_is_kept_and_the_truth_is_their_mean(land_mod: ModuleType,
                                                          table: Path) -> None:
    land = land_mod.load_landscape(table)
    assert len(land.baseline) == 3
    assert all(len(boots) == 3 for boots in land.points.values())
    assert sorted(b.tok_s[1] for b in land.points[(1, 2)]) == [150.0, 162.0, 171.0]
    base = statistics.fmean(BASE)
    assert land.base_mean == {1: base, 4: 2 * base}
    assert land.optimum == (1, 2)
    assert land.best == pytest.approx(math.log(161.0 / base))
    assert land.scores[(2, 1)] >= land.threshold > land.scores[(1, 1)]
    # A point refused once: its truth is the mean of the repeats that measured
    assert land.scores[(3, 1)] == pytest.approx(math.log(143.0 / base))
    assert land.scores[(2, 2)] == INFEASIBLE_SCORE
    # The space the samplers search: the grid without the baseline
    specs = {s.name: s for s in land.exp.space}
    assert specs[STEPS].values() == [1, 2, 3] and specs[NGRAM].values() == [1, 2]
    assert land.exp.search.max_trials == 16


def test_a_boot_draws_one_recorded_repeat_never_a_mean(land_mod: ModuleType,
                                                       table: Path) -> None:
    land = land_mod.load_landscape(table)
    recorded = {b.tok_s[1] for b in land.points[(1, 2)]}
    drawn = [land.draw((1, 2), seed, nth).tok_s[1] for seed in range(10) for nth in range(4)]
    assert set(drawn) == recorded                 # every repeat comes up, nothing else does
    assert statistics.fmean(recorded) not in drawn
    # Seeded: the same search seed and boot draw the same repeat
    assert land.draw((1, 2), 3, 1) == land.draw((1, 2), 3, 1)
    assert {land.draw_baseline(s).tok_s[1] for s in range(20)} == set(BASE)


def test_refusals_replay_as_refusals(land_mod: ModuleType, table: Path) -> None:
    land = land_mod.load_landscape(table)
    assert all(b.status == "infeasible" for b in land.points[(2, 2)])
    outcomes = {land.draw((3, 1), s, 0).status for s in range(30)}
    assert outcomes == {"ok", "infeasible"}
    trace: list[Any] = []
    boots = land_mod.run_search(land, "random", 0, 12, trace=trace)
    assert len(boots) == len(trace) == 12
    for key, boot, attr in trace:
        assert attr["status"] == boot.status
        if boot.status == "infeasible":
            assert "refused" in attr["reason"]
        else:
            measured = {b.tok_s[1] for b in land.points[key] if b.measured}
            assert attr["levels"]["1"]["output_tok_s"] in measured
    assert any(k == (2, 2) for k, _, _ in trace)  # the random search meets the refused point
    assert all(s == land.scores[k] for s, (k, _, _) in zip(boots, trace, strict=True))


def test_every_sampler_runs_and_the_grid_is_deterministic(land_mod: ModuleType,
                                                          table: Path) -> None:
    se = _load("search_efficiency")
    rows = land_mod.run_benchmark([str(table)], ["grid", "random", "tpe", "model"], 2, 8,
                                  se.Row)
    by = {r.sampler: r for r in rows}
    # The grid's order: (1,1), (1,2) -> the optimum at the second boot
    assert by["grid"].hits == (2, 2) and by["grid"].budget == 6
    for name in ("random", "tpe", "model"):
        assert len(by[name].hits) == 2
        assert all(h is None or 1 <= h <= 8 for h in by[name].hits)
    lines: list[str] = []
    land_mod.report(rows, say=lines.append)
    text = "\n".join(lines)
    assert "== recorded: tiny" in text and "optimum steps=1 spec_ngram_simple_size_n=2" in text
    assert "1 refused" in text


def test_a_table_without_the_landscape_metadata_is_refused(land_mod: ModuleType,
                                                           tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"x": [1]}), path)
    with pytest.raises(ValueError, match="not a recorded landscape"):
        land_mod.load_landscape(path)


def test_an_unfinished_recording_is_refused_with_what_is_missing(
        rec: ModuleType, land_mod: ModuleType, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "part.parquet"
    write_recording(rec, path, monkeypatch, stop_after=5)   # 5 of the 7 points once
    with pytest.raises(ValueError, match="2 of the 6 grid points have no recorded boot"):
        land_mod.load_landscape(path)


def test_the_optimums_bootstrap_says_how_firmly_the_recording_names_it(
        land_mod: ModuleType, table: Path) -> None:
    """(1, 2)'s repeats 150/171/162 and (2, 1)'s 158/163/160: resampled, either can come out
    on top; pushed 20% down, (2, 1) never does and the optimum is named in every resample."""
    import dataclasses

    land = land_mod.load_landscape(table)
    st = land_mod.optimum_stability(land, resamples=400, seed=1)
    assert land.optimum == (1, 2)
    assert math.isclose(sum(st.argmax_share.values()), 1.0)
    assert set(st.argmax_share) <= {(1, 2), (2, 1)}
    assert 0.2 < st.optimum_share < 0.95 and 0.0 < st.argmax_share[(2, 1)] < 0.8
    assert st.within_share >= st.optimum_share and st.near_points >= 1.0
    Boot = land_mod.Boot
    low = tuple(Boot(i, "ok", "", {1: v, 4: 2 * v}, (), {}) for i, v in
                enumerate([126.0, 130.0, 128.0]))
    firm = dataclasses.replace(land, points={**land.points, (2, 1): low})
    st = land_mod.optimum_stability(firm, resamples=400, seed=1)
    assert st.argmax_share == {(1, 2): 1.0} and st.optimum_share == 1.0
    assert st.within_share == 1.0 and st.near_points == 1.0
    assert any("argmax in 100%" in line for line in land_mod.describe(firm))


def test_a_point_booted_once_takes_the_tables_repeat_spread(
        land_mod: ModuleType, table: Path) -> None:
    """`--contenders` leaves points booted once, and a session can end before the best
    point's repeat (vLLM's H100 table, 2026-12-08: its optimum booted once). Such a point has
    no spread of its own: it takes the table's sd of a repeat (`noise_sigma`, here ~0.036),
    so a one-boot runner-up 4% behind a one-boot optimum is tied to it and one 29% behind is
    not; and resampled, the two change places in a share of the tables, where the one boot
    of each would have come back unchanged, the optimum named in every resample."""
    import dataclasses

    land = land_mod.load_landscape(table)
    Boot = land_mod.Boot

    def once(v: float) -> tuple[Any, ...]:
        return (Boot(0, "ok", "", {1: v, 4: 2 * v}, (), {}),)

    def three(*vs: float) -> tuple[Any, ...]:
        return tuple(Boot(i, "ok", "", {1: v, 4: 2 * v}, (), {}) for i, v in enumerate(vs))

    w = land.exp.level_weights()
    points = {**land.points, (1, 2): once(161.0), (3, 1): once(155.0), (1, 1): once(120.0),
              (2, 1): three(126.0, 130.0, 128.0)}
    scores = {k: (land_mod.score(land_mod._mean_tok_s(v), land.base_mean, w)
                  if land.scores[k] > INFEASIBLE_SCORE else land.scores[k])
              for k, v in points.items()}
    one = dataclasses.replace(land, points=points, scores=scores)
    sigma = land_mod.noise_sigma(one)
    assert 0.03 < sigma < 0.08
    gap = scores[(1, 2)] - scores[(3, 1)]
    assert sigma < gap < sigma * math.sqrt(2)          # inside the difference's error
    assert one.optimum == (1, 2)
    assert land_mod.tied(one) == {(1, 2), (3, 1)}
    st = land_mod.optimum_stability(one, resamples=400, seed=1)
    assert set(st.argmax_share) == {(1, 2), (3, 1)}
    assert 0.6 < st.optimum_share < 0.95
    assert any("3 point(s) booted once drawn with a repeat's sd" in line
               for line in land_mod.describe(one))


def test_boots_to_a_resampled_optimum(land_mod: ModuleType, table: Path) -> None:
    """The third view: each resampled table's optimum, and the points within 2% of it, are
    among (1, 2) and (2, 1) (the two the recording cannot tell apart), never (3, 2) or
    (1, 1); a search's boots are judged against each, the lower middle kept."""
    path = str(table)
    land_mod.landscape_of.cache_clear()
    land_mod.resampled_targets.cache_clear()
    targets = land_mod.resampled_targets(path)
    assert len(targets) == land_mod.RESAMPLES
    assert all(t and t <= {(1, 2), (2, 1)} for t in targets)
    assert any((1, 2) in t for t in targets) and any((2, 1) in t for t in targets)
    assert land_mod.resampled_hit(path, [(3, 2), (1, 1)]) is None
    assert land_mod.resampled_hit(path, [(3, 2), (1, 2), (2, 1)]) in (2, 3)
    assert land_mod.resampled_hit(path, [(1, 2), (2, 1)]) in (1, 2)


# ------------------------------------------------------------- SGLang's EAGLE axes (topk, draft)

TOPK = "speculative_eagle_topk"
DRAFT = "speculative_num_draft_tokens"
SIM = Path(__file__).resolve().parents[3] / "experiments" / "sim-default.toml"


def test_eagle_grid_points_are_the_points_a_server_runs(rec: ModuleType) -> None:
    """topk 1 forces steps + 1 draft tokens (one point per steps, whatever the draft axis
    says); a tree too small for its draft tokens (steps 2, topk 2 holds at most 7) is left
    out: no boot is spent on a duplicate or on a refusal known in advance."""
    points = rec.grid_points([(STEPS, [0, 2, 4]), (TOPK, [1, 2]), (DRAFT, [4, 8])])
    got = [(p[STEPS], p.get(TOPK), p.get(DRAFT)) for p in points]
    assert got == [(0, None, None), (2, 1, 3), (2, 2, 4), (4, 1, 5), (4, 2, 4), (4, 2, 8)]


def test_an_eagle_landscape_records_and_replays(rec: ModuleType, land_mod: ModuleType,
                                                tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Recorded on the EAGLE axes, replayed by a sampler that proposes topk 1 points without a
    draft count and topk 2 trees too small for theirs: every proposal maps to a recorded point
    or is refused without a boot."""
    def fake_trial(exp: Any, sampled: dict[str, Any], ctx: Any, **_kw: Any) -> TrialResult:
        steps = sampled.get(STEPS, 0)
        tok = 100.0 + 10 * steps * (sampled.get(TOPK) or 0) + ctx.repeat
        return TrialResult("t", dict(sampled), "ok", facts=ServerFacts(16384, 4, boot_s=0.5),
                           levels=tuple(level(c, tok * c) for c in (1, 16, 32, 64)),
                           wall_s=5.0, repeat=ctx.repeat)

    monkeypatch.setattr(rec, "run_trial", fake_trial)
    monkeypatch.setattr(rec, "preflight", lambda cfg: None)
    monkeypatch.setattr(rec, "engine_version", lambda exp: "version: 1 (test)")
    out = tmp_path / "eagle.parquet"
    assert rec.main(["--experiment", str(SIM), "--axis", f"{STEPS}=0,2,4",
                     "--axis", f"{TOPK}=1,2", "--axis", f"{DRAFT}=4,8", "--repeats", "2",
                     "--out", str(out),
                     "--run-dir", str(tmp_path / "runs")]) == 0
    land = land_mod.load_landscape(out)
    assert sorted(land.points) == [(2, 1, 3), (2, 2, 4), (4, 1, 5), (4, 2, 4), (4, 2, 8)]
    assert land.key_of({STEPS: 2, TOPK: 1}) == (2, 1, 3)
    assert land.key_of({STEPS: 2, TOPK: 2, DRAFT: 8}) is None
    boots = land_mod.run_search(land, "random", seed=0, budget=6)
    assert len(boots) == 6 and all(b in land.scores.values() for b in boots)


def test_a_pair_trained_again_has_another_fingerprint(rec: ModuleType, tmp_path: Path) -> None:
    # Models trained again on a GPU differ in their last bits under the same name and size.
    from types import SimpleNamespace
    target, draft = tmp_path / "m" / "target", tmp_path / "m" / "eagle3"
    for d in (target, draft):
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"\x01" * 1000)
    backend = SimpleNamespace(model_path=str(target), draft_model_path=str(draft))
    exp = SimpleNamespace(backend=backend)
    first = rec.model_facts(exp)
    assert first["name"] == "target" and first["bytes"] == 1000
    (draft / "model.safetensors").write_bytes(b"\x01" * 999 + b"\x02")   # the head's last bit
    second = rec.model_facts(exp)
    assert second["bytes"] == 1000 and second["sha256"] != first["sha256"]


def test_rows_other_weights_served_are_set_aside_and_booted_again(
        rec: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's landscape, 2026-12-07: its first session's pair accepted 3.79 tokens a step at
    K 4, the second session's (trained again) 3.56. One table holds one pair's rows: the other
    pair's go beside it, kept, and their points are booted again."""
    import pyarrow.parquet as pq

    path = tmp_path / "weights.parquet"
    pair = {"sha256": "aaaa"}
    monkeypatch.setattr(rec, "model_facts", lambda exp: {"name": "target", "bytes": 1, **pair})
    first = write_recording(rec, path, monkeypatch, stop_after=5)
    pair["sha256"] = "bbbb"
    second = write_recording(rec, path, monkeypatch)
    assert set(first) <= set(second) and len(second) == 21      # all booted with bbbb
    out = capsys.readouterr().out
    assert re.search(r"5 boot\(s\) served other weights \(aaaa; now bbbb\): moved to \S+"
                     r"weights\.other-weights\.parquet and booted again", out)
    t = pq.read_table(path)
    meta = json.loads(t.schema.metadata[b"landscape"])
    assert len(t) == 21 * 2 and meta["sessions"][1]["set_aside"] == {
        "boots": 5, "to": "weights.other-weights.parquet", "weights": ["aaaa"]}
    assert set(rec.row_weights(t.to_pylist(), meta["sessions"])) == {"bbbb"}
    side = pq.read_table(rec.aside_path(path))
    assert len(side) == 5 * 2
    # never replayed: the replay's default tables leave it out
    land_mod = _load("landscapes")
    monkeypatch.setattr(land_mod, "DATA", tmp_path)
    assert land_mod.recorded_paths(None) == [str(path)]
    assert {(r["point"], r["repeat"]) for r in side.to_pylist()} == set(first)
    # Kept on purpose: nothing moves, nothing is booted, the mix is warned about
    pair["sha256"] = "cccc"
    assert write_recording(rec, path, monkeypatch, extra=["--keep-other-weights"]) == []
    assert "served other weights (bbbb; now cccc), kept" in capsys.readouterr().err
    assert len(pq.read_table(path)) == 21 * 2 and len(pq.read_table(rec.aside_path(path))) == 10


def test_a_row_is_served_by_the_session_that_booted_it(rec: ModuleType) -> None:
    sessions = [{"started_utc": "2026-12-07T14:09:35+00:00", "model": {"sha256": "a"}},
                {"started_utc": "2026-12-07T15:44:09+00:00", "model": {"name": "target"}},
                {"started_utc": "2026-12-07T17:00:00+00:00", "model": {"sha256": "c"}}]
    import datetime as dt

    def ts(hms: str) -> float:
        return dt.datetime.fromisoformat(f"2026-12-07T{hms}+00:00").timestamp()

    # A table from before rows kept their weights: each row goes by the session that booted it
    at = [ts("14:29:49.3"), ts("15:44:25.5"), ts("17:00:00.2"), None]
    rows: list[dict[str, Any]] = [{"started_at": t} for t in at]
    assert rec.row_weights(rows, sessions) == ["a", None, "c", None]
    kept, aside = rec.set_aside_other_weights(rows, sessions, "c")
    assert len(aside) == 1 and aside[0]["started_at"] == at[0]     # unknown ones stay
    assert rec.set_aside_other_weights(rows, sessions, None) == (rows, [])
    # A row's own fingerprint wins over the time (two sessions may start in one second)
    assert rec.row_weights([{"started_at": at[2], "weights": "a"}], sessions) == ["a"]


def test_contenders_repeat_only_the_points_near_the_best(
        rec: ModuleType, land_mod: ModuleType, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow.parquet as pq

    path = tmp_path / "contenders.parquet"
    booted = write_recording(rec, path, monkeypatch, extra=["--contenders", "0.10"])
    first = [b for b in booted if b[1] == 0]
    assert len(first) == 7                      # the first repeat: the whole grid
    # Later repeats: the baseline and the two points within 10% of the best first repeat
    # ((2, 1) 158 and (1, 2) 150 of 158); (3, 1) at 140 is 87-89% as the best's mean moves,
    # the refused one has no score
    later = {(json.loads(pid)[STEPS], json.loads(pid).get(NGRAM), r) for pid, r in booted
             if r > 0}
    # ... and (3, 2) once more, 56% of the best: its only boot compiled at start
    assert later == {(0, None, 1), (1, 2, 1), (2, 1, 1), (0, None, 2), (1, 2, 2), (2, 1, 2),
                     (3, 2, 1)}
    out = capsys.readouterr().out
    assert re.search(r"not booted: 8\d\.\d% of the best point's score, under 90% "
                     r"\(--contenders 0.1\)", out)
    assert "not booted: no repeat of it measured every level" in out
    assert re.search(r"r1 \{\S+ 2, \S+ 3\} booted though 5\d\.\d% of the best point's score, "
                     r"under 90% \(--contenders 0.1\): every boot of it so far compiled at start",
                     out)
    meta = json.loads(pq.read_table(path).schema.metadata[b"landscape"])
    assert meta["contenders"] == 0.10 and len(meta["sessions"][0]["not_contenders"]) == 7
    assert meta["sessions"][0]["repeated_compiled"] == [
        'r1 {"spec_ngram_simple_size_n": 2, "speculative_num_steps": 3}']
    # The replay takes each point's repeats as they are: one below, three near the best
    land = land_mod.load_landscape(path)
    assert len(land.points[(1, 1)]) == 1 and len(land.points[(1, 2)]) == 3
    assert len(land.points[(3, 2)]) == 2        # the compiled boot and one after it
    assert land.optimum == (1, 2) and land.base_mean[1] == pytest.approx(100.0)
    assert land.scores[(1, 1)] == pytest.approx(math.log(110 / 100))
    # Run again: the same points are passed over, nothing is booted twice
    assert write_recording(rec, path, monkeypatch, extra=["--contenders", "0.10"]) == []


def test_a_session_boots_the_baseline_first_and_each_steps_roomiest_fraction_first(
        rec: ModuleType) -> None:
    """vLLM compiles at the first boot of a K on a machine and has ~51 MiB less KV pool then
    (41% of it at 0.0075 on the test pair, 2026-12-07): the session's order puts that boot at
    the roomiest fraction, whose pool still holds C=64. The continuation of the H100 table
    (2026-12-07: the first repeat whole, 9 second repeats to go) would, in the plain shuffle,
    have compiled K 6 at 0.01 (the best point, 16% less pool) and K 2 at 0.0075 (41% less)
    again."""
    mem = "mem_fraction_static"
    points = rec.grid_points([(STEPS, [0, 1, 2, 4]), (mem, [0.0075, 0.01, 0.0125])])
    todo = rec.schedule(points, 2)
    done = {(rec.point_id(p), 0) for p, r in todo[:5] if r == 0}
    left = [(p, r) for p, r in todo if (rec.point_id(p), r) not in done]
    order = rec.session_order(left)
    assert sorted(map(repr, order)) == sorted(map(repr, left))      # the same boots
    assert [rep for _, rep in order] == sorted(rep for _, rep in order)       # repeat-major
    for r in (0, 1):
        mine = [p for p, rep in order if rep == r]
        if any(p.get(STEPS) == 0 for p in mine):
            assert mine[0] == {STEPS: 0}
        for k in (1, 2, 4):
            fracs = [p[mem] for p in mine if p.get(STEPS) == k]
            if fracs:
                assert fracs[0] == max(fracs), (r, k, fracs)
    # The other slots keep the shuffle's places: the fractions do not come in sorted order
    second = [p.get(mem) for p, r in order if r == 1 and p.get(STEPS)]
    assert second != sorted(second, reverse=True)
    # No memory axis (an SGLang or llama.cpp grid): the baseline first, the rest as shuffled
    plain = rec.schedule(rec.grid_points([(STEPS, [0, 1, 2]), (NGRAM, [1, 2])]), 1)
    assert rec.session_order(plain) == [plain[[p for p, _ in plain].index({STEPS: 0})]] + [
        (p, r) for p, r in plain if p != {STEPS: 0}]


def test_a_session_says_which_machine_booted_it(rec: ModuleType, table: Path) -> None:
    """Every lent GPU machine is node "vm": the session's facts carry the GPUs' UUIDs and the
    kernel's boot id, so rows of two machines (H100s 30-44% apart on the test models) and a
    restart on one machine are told apart."""
    import pyarrow.parquet as pq

    from specdecode_tune import procfs

    facts = rec.machine_facts()
    assert isinstance(facts["gpu_uuids"], list)             # [] here: no GPU, no driver
    assert facts["boot_id"] == (procfs.boot_id() or "")
    meta = json.loads(pq.read_table(table).schema.metadata[b"landscape"])
    assert meta["sessions"][0]["machine"]["boot_id"] == facts["boot_id"]


def test_contenders_take_a_fraction(rec: ModuleType, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert rec.main(["--experiment", str(EXPERIMENT), "--axis", f"{STEPS}=0-1",
                     "--contenders", "5", "--out", str(tmp_path / "t.parquet")]) == 2
    assert "--contenders 5: a fraction of the best score, between 0 and 1" in \
        capsys.readouterr().err
    assert not (tmp_path / "t.parquet").exists()


def test_an_enqueued_point_off_the_recorded_grid_is_replayed_at_its_nearest_grid_point() -> None:
    """sglang-gpu enqueues steps 3 / topk 1 at memory 0.006; its landscape's grid is steps
    2-8 by twos at 0.0045. The whole search's replay crashed on it ("'3' not in (2, 4, 6, 8)"):
    the search itself refuses an enqueued point outside its space."""
    L = _load("landscapes")
    axes = [(STEPS, (0, 2, 4, 6, 8)), ("speculative_eagle_topk", (1, 2, 4)),
            ("mem_fraction_static", (0.0045,))]
    assert L._on_grid({STEPS: 3, "speculative_eagle_topk": 1, "mem_fraction_static": 0.006},
                      axes) == {STEPS: 4, "speculative_eagle_topk": 1,
                                "mem_fraction_static": 0.0045}
    assert L._on_grid({STEPS: 1, "speculative_num_draft_tokens": 9}, axes) == {STEPS: 2}
    assert L._on_grid({STEPS: 6}, axes) == {STEPS: 6}


def test_the_whole_search_replays_on_sglangs_landscape_and_counts_no_boot_for_a_refused_tree(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded SGLang table (benchmarks/data/sglang-gpu-h100.parquet): steps 2-8 by twos,
    where a proposal like steps 2 / topk 2 / 8 draft tokens is no point the server runs (the
    tree holds 7). The trial refuses it before a boot (`trial.run_trial`: "pruned"); the replay
    crashed on it (KeyError: None) and would have counted it as a boot."""
    L = _load("landscapes")
    peers = _load("peers")
    draws = []
    real = L.Landscape.draw
    monkeypatch.setattr(L.Landscape, "draw",
                        lambda self, key, seed, nth: draws.append(key) or real(self, key, seed,
                                                                              nth))
    land = peers.Land(str(Path(L.DATA) / "sglang-gpu-h100.parquet"))
    pick, drive = peers.whole_recorded_drive(land, 0)
    assert drive.boots == 1 + len(draws)            # the baseline, then one draw a boot
    assert pick in land.tied


def test_the_replay_gives_the_model_the_request_tokens_the_search_gives_it() -> None:
    """sglang-gpu's ShareGPT workload: the search's model reads a request's KV tokens from its
    sample (`search.tuner.request_tokens`, ~267), not the caps (256 + 256): with the caps the
    model ran 25 requests at C=64 where SGLang ran a median 44-56, and its fit error (19-23%)
    kept the replayed search from ever stopping by itself."""
    from specdecode_tune.search.tuner import request_tokens

    L = _load("landscapes")
    land = L.load_landscape(Path(L.DATA) / "sglang-gpu-h100.parquet")
    assert land.request_tokens == pytest.approx(request_tokens(land.exp))
    assert 150 < land.request_tokens < 400


def test_a_recorded_landscape_says_what_its_own_windows_took() -> None:
    """The measuring seconds a recorded real landscape prints come from its own windows, not
    only from the simulator's rounds per level: SGLang's table was recorded under the rule
    (+-2%, at most 30 s), whose windows mostly ran to the cap, 15x what the simulator's five
    rounds a level model (issue 35: the real H100 run of 2026-12-07 ran every level to it)."""
    W = _load("whole_search")
    L = _load("landscapes")
    sec = W.recorded_seconds(str(Path(L.DATA) / "sglang-gpu-h100.parquet"))
    assert sec["ran_rule"] and sec["cap"] == 30.0
    assert 3 * 25.0 < sec["measured"] < 3 * 30.5          # three levels, near the cap
    assert sec["measured"] > 10 * sec["rule"]
    assert sec["levels"] == 3 * 21 and sec["capped"] > sec["levels"] // 2
    fixed = W.recorded_seconds(str(Path(L.DATA) / "llamacpp-gpu-h200.parquet"))
    assert not fixed["ran_rule"] and fixed["measured"] <= fixed["fixed"]
    lines: list[str] = []
    W.report_recorded([str(Path(L.DATA) / "sglang-gpu-h100.parquet")], 0, say=lines.append)
    assert any("as measured: " in ln and "do not model this server" in ln for ln in lines)


# ------------------------------------------------------------- the boots by session (machine)


def test_each_boot_is_scored_over_its_own_sessions_baseline_and_the_tables(
        rec: ModuleType, table: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A second session on a machine twice as fast (every figure doubled, the baseline's too):
    over its own baseline each boot scores as the first machine's boot of the same repeat
    figures; over the table's mean baseline it scores higher by the machine's factor."""
    import datetime as dt

    import pyarrow.parquet as pq

    sessions_mod = _load("landscape_sessions")
    # The first session an hour before the second (both would start in one second here)
    first_t = pq.read_table(table)
    first_meta = json.loads(first_t.schema.metadata[b"landscape"])
    for s in first_meta["sessions"]:
        for k in ("started_utc", "ended_utc"):
            s[k] = (dt.datetime.fromisoformat(s[k]) - dt.timedelta(hours=1)).isoformat()
    rows = first_t.to_pylist()
    for r in rows:
        r["started_at"] -= 3600.0
    rec.write_table(table, rows, first_t.schema, first_meta)

    record_a_faster_session(rec, table, tmp_path, monkeypatch)
    t = pq.read_table(table)
    meta = json.loads(t.schema.metadata[b"landscape"])
    boots = sessions_mod.session_boots(t.to_pylist(), meta)
    assert sorted({b.session for b in boots}) == [1, 2]
    assert len([b for b in boots if b.session == 2]) == 6    # the baseline and 5 measured points
    base1 = statistics.fmean(BASE)                           # session 1: 100
    base_table = statistics.fmean([*BASE, 2 * BASE[0]])      # 125
    (second,) = [b for b in boots if b.session == 2 and b.point == {STEPS: 1, NGRAM: 2}]
    # C=1 and C=4 (twice C=1) move together: the score is one level's log ratio
    assert second.own == pytest.approx(math.log(2 * 150.0 / (2 * BASE[0])))
    assert second.table == pytest.approx(math.log(2 * 150.0 / base_table))
    (first,) = [b for b in boots if b.session == 1 and b.point == {STEPS: 1, NGRAM: 2}
                and b.repeat == 1]
    assert first.own == pytest.approx(math.log(171.0 / base1))
    spread = {tuple(sorted(s.point.items())): s for s in sessions_mod.spreads(boots)}
    s = spread[((NGRAM, 2), (STEPS, 1))]
    assert s.sessions == (1, 1, 1, 2)
    assert s.own == pytest.approx(math.log(171.0 / 150.0))          # repeats 1 and 0 (own)
    assert s.table == pytest.approx(math.log(300.0 / 125.0 / (150.0 / 125.0)))
    # the cold boot is told apart; a point never booted in session 2 has no spread line
    assert [b.compiled for b in boots if b.point == {STEPS: 3, NGRAM: 2}][:1] == [True]
    assert ((NGRAM, 2), (STEPS, 2)) not in spread                   # refused every time

    # two boots of a point in one session differ by its noise; across, by the machine's 2x too
    same, cross = sessions_mod.pair_gaps(boots)
    # (1, 1), (1, 2), (2, 1), (3, 2): 3 boots in session 1; (3, 1) 2 (refused once); 1 each in 2
    assert len(same) == 3 + 3 + 3 + 3 + 1 and len(cross) == 3 + 3 + 3 + 3 + 2
    assert max(same) < math.log(1.2) and statistics.median(cross) > math.log(1.5)
    assert sessions_mod.main([str(table)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"in one session 1\.\d+x over 13 pair\(s\); across sessions [12]\.\d+x "
                     r"over 14", out), out
    assert "23 measured boots in 2 session(s)" in out     # 28 less the 5 refused
    assert re.search(r"num_steps=1 spec_ngram_simple_size_n=2\s+sessions 1,1,1,2\s+own\s+"
                     r"1\.140x\s+table\s+2\.000x", out), out
    assert sessions_mod.main([str(tmp_path / "none.parquet")]) == 2
    assert "no such file" in capsys.readouterr().err
    plain = tmp_path / "plain.parquet"
    pq.write_table(pq.read_table(table).replace_schema_metadata({}), plain)
    assert sessions_mod.main([str(plain)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a recorded landscape" in err


def test_a_row_belongs_to_the_last_session_started_before_its_boot(
        land_mod: ModuleType) -> None:
    starts = [100.0, 200.0, 300.0]
    assert [land_mod.session_index(t, starts) for t in (99.0, 100.0, 250.0, 300.5, None)] \
        == [None, 0, 1, 2, None]


def test_the_sessions_machines_are_fitted_from_the_points_they_share(
        land_mod: ModuleType) -> None:
    """Three sessions, no noise: the second machine runs everything twice as fast, and only the
    second booted K 3; the third booted one point no other did. The fit finds the factor from
    the baseline and K 1 (both booted twice), scores K 3 at its own 2x where the table's mean
    baseline makes it 2.67x, predicts a held-out boot exactly where the point's other boots
    miss by the factor, and says which session it cannot place."""
    sessions_mod = _load("landscape_sessions")
    SB = sessions_mod.SessionBoot

    def boot(session: int, steps: int, tok: float) -> Any:
        return SB(session, {STEPS: steps}, 0, None, None, {1: tok, 4: 2 * tok})

    boots = [boot(1, 0, 100.0), boot(1, 1, 150.0), boot(1, 2, 120.0),
             boot(2, 0, 200.0), boot(2, 1, 300.0), boot(2, 3, 400.0), boot(3, 4, 500.0)]
    fit = sessions_mod.machine_fit(boots)
    for c in (1, 4):
        assert math.exp(fit.sessions[2][c] - fit.sessions[1][c]) == pytest.approx(2.0, rel=1e-3)
    assert sessions_mod.unlinked(boots) == {3}
    cal = {json.loads(p)[STEPS]: math.exp(v)
           for p, v in sessions_mod.calibrated_scores(fit, {1: 1.0, 4: 1.0}).items()}
    assert cal[1] == pytest.approx(1.5, rel=1e-3) and cal[2] == pytest.approx(1.2, rel=1e-3)
    assert cal[3] == pytest.approx(2.0, rel=1e-3)         # over the table's mean: 400/150
    n, plain, fitted = sessions_mod.leave_one_out(boots)
    assert n == 8                                         # 2 points x 2 boots x 2 levels
    assert plain == pytest.approx(math.log(2.0)) and fitted < 0.01
    lines: list[str] = []
    sessions_mod.machines(boots, {1: 1.0, 4: 1.0}, say=lines.append)
    assert any(line.startswith("  session 3:") and "shares no point" in line for line in lines)
    assert "(100% less)" in lines[-1] or "(99% less)" in lines[-1]
