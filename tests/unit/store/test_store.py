"""store: the run dir's layout, the one atomic write, the checkpoint codec."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from specdecode_tune.records import LevelSummary, ServerFacts
from specdecode_tune.store import codec, files, rundir


def summary(concurrency: int = 8, **kw: object) -> LevelSummary:
    base: dict[str, object] = {
        "concurrency": concurrency, "mode": "closed", "rate": None, "duration_s": 30.0,
        "requests": 40, "errors": 0, "output_tokens": 10240, "output_tok_s": 341.3,
        "requests_s": 1.33, "ttft_p50": 0.12, "ttft_p90": 0.2, "ttft_p99": 0.31,
        "tpot_p50": 0.011, "tpot_p90": 0.013, "tpot_p99": 0.02, "itl_p50": 0.03,
        "itl_p90": None, "itl_p99": None, "e2e_p50": 2.9, "e2e_p90": 3.1, "e2e_p99": 3.3,
        "accept_length": 3.1, "accept_histogram": (6, 5, 4)}
    base.update(kw)
    return LevelSummary(**base)  # type: ignore[arg-type]


def test_the_layout_is_the_documented_one(tmp_path: Path) -> None:
    root = str(tmp_path)
    assert rundir.level_file(root, "levels", "t1", "c8") == f"{root}/tables/levels/t1-c8.parquet"
    assert rundir.trial_file(root, "t1") == f"{root}/tables/trials/t1.parquet"
    assert rundir.experiment_file(root) == f"{root}/experiment.toml"
    logs = rundir.logs_dir(tmp_path)
    assert logs == tmp_path / "logs"
    assert rundir.server_log(logs, "t1") == tmp_path / "logs" / "t1.log"
    assert rundir.pidfile(logs, "t1") == tmp_path / "logs" / "pids" / "t1.json"
    assert rundir.driver_file(rundir.pids_dir(logs)) == tmp_path / "logs" / "pids" / "driver.json"
    assert rundir.journal_file(tmp_path) == tmp_path / "optuna.journal"


def test_a_local_run_is_its_own_local_dir_and_a_uri_run_gets_a_temp_one(tmp_path: Path) -> None:
    assert rundir.local_dir(tmp_path / "run") == tmp_path / "run"
    assert rundir.report_dir(str(tmp_path / "run")) == str(tmp_path / "run" / "report")
    temp = Path(tempfile.gettempdir()) / "specdecode_tune"
    assert rundir.local_dir("s3://bucket/runs/exp1/") == temp / "exp1"
    assert rundir.report_dir("s3://bucket/runs/exp1") == str(temp / "exp1" / "report")


def test_level_tags_name_closed_and_open_loop_levels() -> None:
    assert rundir.level_tag(summary(16)) == "c16"
    assert rundir.level_tag(summary(0, mode="rate", rate=2.5)) == "r2.5"
    with pytest.raises(ValueError, match="must have a rate"):
        rundir.level_tag(summary(0, mode="rate"))
    for bad in ("", ".hidden", "a/b"):
        with pytest.raises(ValueError):
            rundir.check_trial_id(bad)


def test_write_file_replaces_whole_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "f.json"
    assert files.write_json(target, {"b": 1, "a": [2]}) == os.fspath(target)
    assert target.read_text() == '{"a": [2], "b": 1}'
    files.write_file(str(target), b"new")
    assert target.read_bytes() == b"new"
    assert os.listdir(target.parent) == ["f.json"]
    files.write_file("file://" + str(tmp_path / "u.txt"), "by uri")
    assert (tmp_path / "u.txt").read_text() == "by uri"


def test_a_failed_write_removes_its_temp_file(tmp_path: Path, monkeypatch) -> None:
    def fail(path: str, directory: bool = False) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(files, "_fsync", fail)
    with pytest.raises(OSError, match="disk gone"):
        files.write_file(tmp_path / "f", b"x")
    assert os.listdir(tmp_path) == []


def test_a_checkpoint_folder_round_trips(tmp_path: Path) -> None:
    levels = [summary(8), summary(16, note="n", suspect=True)]
    facts = ServerFacts(max_total_num_tokens=1000, max_running_requests=8, gpu_ids=("0", "1"),
                        boot_s=3.5, extra={"k": [1]})
    (tmp_path / "a").mkdir()
    codec.write_checkpoint(tmp_path / "a", levels, facts)
    assert sorted(os.listdir(tmp_path / "a")) == ["facts.json", "levels.json"]
    assert codec.read_checkpoint(tmp_path / "a") == (levels, facts)
    (tmp_path / "b").mkdir()
    codec.write_checkpoint(tmp_path / "b", levels[:1], None)
    assert codec.read_checkpoint(tmp_path / "b") == (levels[:1], None)
    assert json.loads((tmp_path / "b" / "levels.json").read_text())[0]["accept_histogram"] \
        == [6, 5, 4]
