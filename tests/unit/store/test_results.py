"""results: schemas, round trips through Parquet, atomic replace-on-rewrite, the reader."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdecode_tune import store
from specdecode_tune.records import LevelSummary, RequestRecord, ServerFacts, TrialResult
from specdecode_tune.store import (
    LEVELS_SCHEMA,
    REQUESTS_SCHEMA,
    TRIALS_SCHEMA,
    config_key,
    levels_by_trial,
    read_tables,
    records_from_level_table,
    records_from_request_table,
    trial_results_from_tables,
    write_level,
    write_trial,
)

PARAMS = {"speculative_num_steps": 4, "speculative_eagle_topk": 1,
          "speculative_num_draft_tokens": 5, "mem_fraction_static": 0.82,
          "max_running_requests": 64}


def request(i: int, *, level: int = 8, error: str | None = None) -> RequestRecord:
    # Gaps that float32 holds exactly, so the round trip can compare with ==.
    return RequestRecord(
        level=level, index=i, start=0.01 * i, end=1.0 + 0.01 * i,
        ttft=None if error else 0.125 + i, input_tokens=512, output_tokens=0 if error else 256,
        chunk_gaps=() if error else (0.5, 0.25, 0.0078125), verify_ct=None if error else 64,
        accepted_tokens=None if error else 192, draft_tokens=None if error else 320,
        accept_histogram=() if error else (60, 50, 40, 30), in_window=i % 5 != 0, error=error)


def level(concurrency: int = 8, **kw: object) -> LevelSummary:
    base = dict(
        concurrency=concurrency, mode="closed", rate=None, duration_s=30.0, requests=40,
        errors=1, output_tokens=10240, output_tok_s=341.3, requests_s=1.33,
        ttft_p50=0.12, ttft_p90=0.2, ttft_p99=0.31, tpot_p50=0.011, tpot_p90=0.013,
        tpot_p99=0.02, itl_p50=0.03, itl_p90=None, itl_p99=None, e2e_p50=2.9, e2e_p90=3.1,
        e2e_p99=3.3, accept_length=3.1, accept_histogram=(600, 500, 400),
        over_running_limit=False, suspect=True, note="1 error")
    base.update(kw)
    return LevelSummary(**base)  # type: ignore[arg-type]  # a dict of mixed field values


def trial(trial_id: str = "t0001", levels: tuple[LevelSummary, ...] = (), **kw: object
          ) -> TrialResult:
    base = dict(trial_id=trial_id, params=PARAMS, status="ok", reason="",
                facts=ServerFacts(max_total_num_tokens=812345, max_running_requests=64,
                                  gpu_ids=("0", "1"), boot_s=95.5,
                                  extra={"cuda_graph_max_bs": 64}),
                levels=levels, wall_s=400.25, repeat=1, suspect=False)
    base.update(kw)
    return TrialResult(**base)  # type: ignore[arg-type]  # a dict of mixed field values


# ---------------------------------------------------------------------------------------------
# Schemas


def test_every_record_field_has_a_column() -> None:
    # Guards against records.py growing a field that the tables would silently drop.
    assert {f.name for f in dataclasses.fields(RequestRecord)} <= set(REQUESTS_SCHEMA.names)
    assert {f.name for f in dataclasses.fields(LevelSummary)} <= set(LEVELS_SCHEMA.names)


def test_schema_column_types() -> None:
    assert REQUESTS_SCHEMA.field("chunk_gaps").type == pa.list_(pa.float32())
    assert REQUESTS_SCHEMA.field("accept_histogram").type == pa.list_(pa.int64())
    for schema in (LEVELS_SCHEMA, TRIALS_SCHEMA):
        assert schema.field("speculative_num_steps").type == pa.int64()
        assert schema.field("speculative_num_draft_tokens").nullable
        assert schema.field("mem_fraction_static").type == pa.float64()
    assert TRIALS_SCHEMA.field("started_at").type == pa.timestamp("us", tz="UTC")
    assert TRIALS_SCHEMA.field("gpu_ids").type == pa.list_(pa.string())
    for name in ("score", "jump_reason", "bracket_reason", "sampler", "node"):
        assert TRIALS_SCHEMA.field(name).nullable
    for schema in (REQUESTS_SCHEMA, LEVELS_SCHEMA, TRIALS_SCHEMA):
        assert schema.names[:3] == ["trial_id", "config_key", "repeat"]


# ---------------------------------------------------------------------------------------------
# Round trip


def test_round_trip_keeps_values_and_exact_types(tmp_path: Path) -> None:
    reqs8 = [request(i) for i in range(6)] + [request(6, error="timeout")]
    reqs16 = [request(i, level=16) for i in range(3)]
    l8, l16 = level(8), level(16, suspect=False, errors=0, note="")
    write_level(tmp_path, "t0001", l8, reqs8, params=PARAMS, repeat=1)
    write_level(tmp_path, "t0001", l16, reqs16, params=PARAMS, repeat=1)
    started = datetime(2026, 11, 29, 10, 0, 0, 123456, tzinfo=UTC)
    write_trial(tmp_path, trial(levels=(l8, l16)),
                extra={"score": 341.3, "jump_reason": "plateau: steps 6->10", "sampler": "pe",
                       "bracket_reason": "bracket: steps 8",
                       "node": "gpu-7", "started_at": started,
                       "finished_at": started + timedelta(seconds=400)})

    t = read_tables(tmp_path)
    assert t.requests.schema.equals(REQUESTS_SCHEMA, check_metadata=True)
    assert t.levels.schema.equals(LEVELS_SCHEMA, check_metadata=True)
    assert t.trials.schema.equals(TRIALS_SCHEMA, check_metadata=True)

    assert records_from_request_table(t.requests, trial_id="t0001", level=8) == reqs8
    assert records_from_request_table(t.requests, level=16) == reqs16
    assert records_from_level_table(t.levels, trial_id="t0001") == [l8, l16]
    assert levels_by_trial(t.levels) == {"t0001": (l8, l16)}
    assert store.level_summaries(t.levels) == [("t0001", l8), ("t0001", l16)]
    assert trial_results_from_tables(t) == [trial(levels=(l8, l16))]

    row = t.trials.to_pylist()[0]
    assert row["config_key"] == config_key(PARAMS) == t.levels["config_key"][0].as_py()
    assert (row["speculative_num_steps"], row["speculative_eagle_topk"],
            row["speculative_num_draft_tokens"], row["mem_fraction_static"]) == (4, 1, 5, 0.82)
    assert row["score"] == 341.3 and row["jump_reason"] == "plateau: steps 6->10"
    assert row["bracket_reason"] == "bracket: steps 8"
    assert (row["sampler"], row["node"], row["n_levels"]) == ("pe", "gpu-7", 2)
    assert row["started_at"] == started
    assert row["finished_at"] == started + timedelta(seconds=400)
    assert row["gpu_ids"] == ["0", "1"] and row["repeat"] == 1
    assert t.requests["repeat"].to_pylist() == [1] * 10


def test_checkpoint_dicts_round_trip_through_json() -> None:
    summary, facts = level(8), trial().facts
    assert store.level_from_dict(json.loads(json.dumps(store.level_to_dict(summary)))) \
        == summary
    assert store.facts_from_dict(json.loads(json.dumps(store.facts_to_dict(facts)))) \
        == facts
    with pytest.raises(ValueError, match="not LevelSummary fields: \\['tok_s'\\]"):
        store.level_from_dict({**store.level_to_dict(summary), "tok_s": 1.0})


def test_chunk_gaps_are_stored_as_float32() -> None:
    table = store.requests_table("t", [dataclasses.replace(request(1), chunk_gaps=(0.1,))],
                                   params=PARAMS, repeat=0)
    assert table["chunk_gaps"].type == pa.list_(pa.float32())
    assert table["chunk_gaps"][0].as_py() == [pytest.approx(0.1, rel=1e-7)]


def test_failed_trial_without_facts_or_levels(tmp_path: Path) -> None:
    params = {"speculative_num_steps": 10, "speculative_eagle_topk": 4,
              "speculative_num_draft_tokens": None, "mem_fraction_static": None}
    result = TrialResult(trial_id="t0002", params=params, status="infeasible",
                         reason="oom: torch.OutOfMemoryError: CUDA out of memory")
    write_trial(tmp_path, result)
    t = read_tables(tmp_path)
    row = t.trials.to_pylist()[0]
    assert row["speculative_num_draft_tokens"] is None and row["mem_fraction_static"] is None
    assert row["score"] is None and row["started_at"] is None and row["facts_json"] is None
    assert row["node"] == socket.gethostname()         # where it ran, by default
    assert t.requests.num_rows == t.levels.num_rows == 0
    assert trial_results_from_tables(t) == [result]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.builds(
    RequestRecord,
    level=st.integers(1, 1024), index=st.integers(0, 10**6),
    start=st.floats(0, 1e4), end=st.floats(0, 1e4),
    ttft=st.one_of(st.none(), st.floats(0, 100)),
    input_tokens=st.integers(0, 2**40), output_tokens=st.integers(0, 2**40),
    chunk_gaps=st.lists(st.floats(0, 10, width=32), max_size=5).map(tuple),
    verify_ct=st.one_of(st.none(), st.integers(0, 2**40)),
    accepted_tokens=st.one_of(st.none(), st.integers(0, 2**40)),
    draft_tokens=st.one_of(st.none(), st.integers(0, 2**40)),
    accept_histogram=st.lists(st.integers(0, 2**40), max_size=8).map(tuple),
    in_window=st.booleans(), error=st.one_of(st.none(), st.text(max_size=30))), max_size=20))
def test_any_request_records_round_trip_through_parquet(records: list[RequestRecord]) -> None:
    table = store.requests_table("t", records, params=PARAMS, repeat=0)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    back = pq.read_table(pa.BufferReader(sink.getvalue()), schema=REQUESTS_SCHEMA)
    assert records_from_request_table(back) == records


# ---------------------------------------------------------------------------------------------
# Replace, never duplicate; atomic writes


def test_rewriting_a_level_replaces_it(tmp_path: Path) -> None:
    write_level(tmp_path, "t0001", level(8, output_tok_s=100.0), [request(i) for i in range(5)],
                params=PARAMS, repeat=0)
    write_level(tmp_path, "t0001", level(8, output_tok_s=200.0), [request(i) for i in range(2)],
                params=PARAMS, repeat=0)
    write_trial(tmp_path, trial(status="failed", reason="first try"))
    write_trial(tmp_path, trial())
    t = read_tables(tmp_path)
    assert t.requests.num_rows == 2
    assert t.levels["output_tok_s"].to_pylist() == [200.0]
    assert t.trials["status"].to_pylist() == ["ok"]
    names = sorted(p.name for p in (tmp_path / "tables").rglob("*"))
    assert names == ["levels", "requests", "t0001-c8.parquet", "t0001-c8.parquet",
                     "t0001.parquet", "trials"]          # no temp file left behind


def test_rate_levels_get_their_own_file(tmp_path: Path) -> None:
    write_level(tmp_path, "t1", level(8), [], params=PARAMS, repeat=0)
    write_level(tmp_path, "t1", level(0, mode="rate", rate=2.5), [], params=PARAMS, repeat=0)
    assert sorted(p.name for p in (tmp_path / "tables" / "levels").iterdir()) == \
        ["t1-c8.parquet", "t1-r2.5.parquet"]
    assert [s.mode for s in levels_by_trial(read_tables(tmp_path).levels)["t1"]] == \
        ["closed", "rate"]


def test_leftover_temp_files_are_invisible(tmp_path: Path) -> None:
    write_level(tmp_path, "t0001", level(8), [request(0)], params=PARAMS, repeat=0)
    levels_dir = tmp_path / "tables" / "levels"
    # What a writer killed mid-write leaves: a truncated hidden temp file, and stray files.
    (levels_dir / ".t0002-c8.parquet.tmp-4242-deadbeef").write_bytes(b"PAR1\x00\x01trunc")
    (levels_dir / "_SUCCESS").write_bytes(b"")
    (levels_dir / "README.txt").write_text("not a table")
    t = read_tables(tmp_path)
    assert t.levels["trial_id"].to_pylist() == ["t0001"]


KILLED_WRITER = """
import os, signal, sys
from specdecode_tune import store
from specdecode_tune.store import files
from tests.unit.store.test_results import PARAMS, level, request
real_fsync = files._fsync
def die_before_rename(path, directory=False):
    if not directory and ".tmp-" in path:
        os.kill(os.getpid(), signal.SIGKILL)   # the temp file is complete, the rename not done
    real_fsync(path, directory)
files._fsync = die_before_rename
store.write_level(sys.argv[1], "t0001", level(8, output_tok_s=999.0),
                    [request(i) for i in range(9)], params=PARAMS, repeat=0)
"""


def test_writer_killed_between_temp_and_rename_leaves_the_old_file(tmp_path: Path) -> None:
    write_level(tmp_path, "t0001", level(8, output_tok_s=100.0), [request(0)],
                params=PARAMS, repeat=0)
    repo = Path(__file__).resolve().parents[3]
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], cwd=repo,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    temps = [p.name for p in (tmp_path / "tables").rglob(".*.tmp-*")]
    assert len(temps) == 1                                  # it died holding a temp file
    t = read_tables(tmp_path)
    assert t.levels["output_tok_s"].to_pylist() == [100.0]  # the old level, whole
    assert t.requests.num_rows == 1


def test_a_table_that_fails_to_build_writes_nothing(tmp_path: Path) -> None:
    bad = dataclasses.replace(request(0), input_tokens=None)  # type: ignore[arg-type]  # on purpose
    with pytest.raises(ValueError, match="'input_tokens' must not be null"):
        write_level(tmp_path, "t0001", level(8), [bad], params=PARAMS, repeat=0)
    assert not (tmp_path / "tables").exists() or not list((tmp_path / "tables").rglob("*.*"))


# ---------------------------------------------------------------------------------------------
# Reader


def test_empty_run_dir_gives_empty_tables_with_full_schemas(tmp_path: Path) -> None:
    for run_dir in (tmp_path / "never-written", tmp_path):
        t = read_tables(run_dir)
        assert t.requests.num_rows == t.levels.num_rows == t.trials.num_rows == 0
        assert t.requests.schema.equals(REQUESTS_SCHEMA)
        assert t.levels.schema.equals(LEVELS_SCHEMA)
        assert t.trials.schema.equals(TRIALS_SCHEMA)
        assert trial_results_from_tables(t) == []


def test_file_uri_and_plain_path_are_the_same_place(tmp_path: Path) -> None:
    uri = "file://" + str(tmp_path / "run")
    write_level(uri, "t0001", level(8), [request(0), request(1)], params=PARAMS, repeat=0)
    write_trial(uri, trial(levels=(level(8),)))
    assert (tmp_path / "run" / "tables" / "trials" / "t0001.parquet").is_file()
    by_path, by_uri = read_tables(tmp_path / "run"), read_tables(uri)
    assert by_path.requests.equals(by_uri.requests) and by_uri.requests.num_rows == 2
    assert trial_results_from_tables(by_uri) == [trial(levels=(level(8),))]


def test_files_from_an_older_schema_keep_every_column(tmp_path: Path) -> None:
    # The RAY_OPTUNA.md trap: a dataset read without a schema takes the first file's columns.
    write_trial(tmp_path, trial("t0002"), extra={"sampler": "tpe", "score": 1.5})
    old = store.trials_table(trial("t0001")).drop_columns(["sampler", "jump_reason", "score"])
    pq.write_table(old, tmp_path / "tables" / "trials" / "t0001.parquet")   # sorts first
    t = read_tables(tmp_path).trials
    assert t.schema.equals(TRIALS_SCHEMA)
    assert t["trial_id"].to_pylist() == ["t0001", "t0002"]
    assert t["sampler"].to_pylist() == [None, "tpe"]
    assert t["score"].to_pylist() == [None, 1.5]


def test_requests_written_before_error_detail_read_back_without_it(tmp_path: Path) -> None:
    fresh = dataclasses.replace(request(1, error="http 400"), error_detail="http 400: too long")
    write_level(tmp_path, "t0002", level(8), [fresh], params=PARAMS, repeat=0)
    old = store.requests_table("t0001", [request(0, error="http 400")], params=PARAMS,
                                 repeat=0).drop_columns(["error_detail"])
    pq.write_table(old, tmp_path / "tables" / "requests" / "t0001-c8.parquet")  # sorts first
    t = read_tables(tmp_path).requests
    assert t.schema.equals(REQUESTS_SCHEMA)
    assert t["error_detail"].to_pylist() == [None, "http 400: too long"]
    assert records_from_request_table(t, trial_id="t0002") == [fresh]


def test_read_table_rejects_unknown_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="got 'level'"):
        store.read_table(tmp_path, "level")


# ---------------------------------------------------------------------------------------------
# config_key and validation


def test_config_key_is_stable_and_canonical() -> None:
    key = config_key(PARAMS)
    # sha256 of the canonical JSON, computed independently with sha256sum
    assert key == "0b2f8b84877b"
    assert config_key(dict(reversed(list(PARAMS.items())))) == key
    assert config_key({**PARAMS, "speculative_num_steps": 4.0}) == key
    assert config_key({**PARAMS, "speculative_num_steps": np.int64(4)}) == key
    assert config_key({**PARAMS, "speculative_num_draft_tokens_x": None}) == key
    assert config_key({**PARAMS, "speculative_num_steps": 5}) != key
    assert config_key(PARAMS, readable=True) == (
        "max_running_requests=64,mem=0.82,topk=1,draft=5,steps=4#" + key)


@pytest.mark.parametrize(("call", "message"), [
    (lambda d: write_trial(d, trial(status="done")), "status must be one of"),
    (lambda d: write_trial(d, trial(), extra={"scoer": 1.0}), "unknown keys \\['scoer'\\]"),
    (lambda d: write_trial(d, trial(), extra={"started_at": datetime(2026, 1, 1)}),
     "timezone-aware"),
    (lambda d: write_trial(d, trial(), extra={"score": "high"}), "score"),
    (lambda d: write_trial(d, trial(trial_id="../evil")), "trial_id"),
    (lambda d: write_trial(d, trial(params={**PARAMS, "speculative_num_steps": True})),
     "'speculative_num_steps'\\] must be an integer, got True"),
    (lambda d: write_trial(d, trial(params={**PARAMS, "mem_fraction_static": float("nan")})),
     "finite"),
    (lambda d: write_level(d, "t", level(mode="burst"), [], params=PARAMS, repeat=0),
     "mode must be 'closed' or 'rate'"),
])
def test_bad_input_names_the_value(tmp_path: Path, call: Callable[[Path], object],
                                   message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(tmp_path)
    assert not (tmp_path / "tables").exists()
