"""scripts/device/gpu_search.py's plan for an SGLang experiment: the engine's own Python, the
EAGLE-3 test models trained by the route, the readings step (no GPU needed to plan)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tomllib
from pathlib import Path

from tests.conftest import bench_module

REPO = Path(__file__).resolve().parents[3]


def _gpu_search():
    spec = importlib.util.spec_from_file_location(
        "gpu_search", REPO / "scripts" / "device" / "gpu_search.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_search"] = mod
    spec.loader.exec_module(mod)
    return mod


def _args(**kw) -> argparse.Namespace:
    base = dict(experiment="experiments/sglang-gpu.toml", gpus_per_trial=None,
                max_concurrent=None, max_trials=None, no_check=False, record=False,
                record_onto=None, readings=None, search_args=[])
    return argparse.Namespace(**{**base, **kw})


def test_sglang_plan_runs_servers_through_the_engine_site_and_trains_the_models(tmp_path):
    gs = _gpu_search()
    work = gs.Work(tmp_path / "work")
    plan = gs.planning.make_plan(
        _args(readings="--set speculative_num_steps=3 --concurrency 8"), work, 1)
    ran = tomllib.loads(plan["run_experiment_text"])
    assert ran["backend"]["python"] == str(work.root / "engines" / "sglang" / "python")
    assert plan["engine"] == "sglang"
    assert plan["make_models"] is True
    assert plan["model"] == str(work.cache / "eagle3-models" / "target")
    assert plan["draft"] == str(work.cache / "eagle3-models" / "eagle3")
    assert plan["readings"] == ["--set", "speculative_num_steps=3", "--concurrency", "8"]
    # Everything else of the experiment is kept as written.
    orig = tomllib.loads((REPO / "experiments" / "sglang-gpu.toml").read_text())
    assert ran["space"] == orig["space"] and ran["measure"] == orig["measure"]


def test_vllm_plan_runs_servers_through_its_own_site_on_the_same_models(tmp_path):
    """vllm-gpu: vLLM's wrapper (engines/vllm/python, apart from SGLang's) as backend.python,
    and the same EAGLE-3 pair, trained by the route, as sglang-gpu."""
    gs = _gpu_search()
    work = gs.Work(tmp_path / "work")
    plan = gs.planning.make_plan(_args(experiment="experiments/vllm-gpu.toml"), work, 1)
    ran = tomllib.loads(plan["run_experiment_text"])
    assert ran["backend"]["python"] == str(work.root / "engines" / "vllm" / "python")
    assert "binary" not in ran["backend"]
    assert plan["engine"] == "vllm" and plan["make_models"] is True
    sglang = gs.planning.make_plan(_args(), gs.Work(tmp_path / "work2"), 1)
    assert (Path(plan["model"]).relative_to(work.cache),
            Path(plan["draft"]).relative_to(work.cache)) == (
        Path(sglang["model"]).relative_to(tmp_path / "work2" / "cache"),
        Path(sglang["draft"]).relative_to(tmp_path / "work2" / "cache"))
    # The experiment that runs validates as the search validates it.
    from specdecode_tune.config import load_experiment
    path = tmp_path / "vllm-gpu.toml"
    path.write_text(plan["run_experiment_text"])
    assert load_experiment(path).backend.python == str(work.root / "engines/vllm/python")


def test_the_next_part_is_named_from_the_folder_it_came_from(tmp_path, monkeypatch):
    """A pack carried from build/gpu-payload-vllm: the call says to carry that folder's next
    part, not build/gpu-payload's."""
    import json
    gs = _gpu_search()
    # Not the checkout's own build/gpu-payload: in the main checkout it holds real packs,
    # which stage() would copy (hundreds of MiB) before this test's part replaced them.
    monkeypatch.setattr(gs.staging, "PAYLOAD_DIRS", ("build/no-payload-in-tests",))
    work = gs.Work(tmp_path / "work")
    folder = tmp_path / "build" / "gpu-payload-vllm" / "part1"
    folder.mkdir(parents=True)
    (folder / "a.whl.000").write_bytes(b"x")
    manifest = {"pack_id": "p1", "parts": 2, "files": [
        {"name": "a.whl", "size": 2, "sha256": "0",
         "chunks": [{"part": 1, "file": "a.whl.000", "offset": 0, "size": 1},
                    {"part": 2, "file": "a.whl.001", "offset": 1, "size": 1}]}]}
    (folder / "manifest.json").write_text(json.dumps(manifest | {"this_part": 1}))
    staged = gs.staging.stage(work, [str(folder.parent)])
    assert staged["carried_from"] == str(folder.parent)
    assert gs.staging.missing_parts(work, staged) == [2]


def test_other_experiments_get_no_engine_and_no_models(tmp_path):
    gs = _gpu_search()
    work = gs.Work(tmp_path / "work")
    plan = gs.planning.make_plan(
        _args(experiment="experiments/llamacpp-gpu.toml", gpus_per_trial=1), work, 1)
    assert plan["engine"] is None and plan["make_models"] is False
    assert plan["readings"] is None
    assert "python" not in tomllib.loads(plan["run_experiment_text"])["backend"]


def test_set_key_writes_strings_as_toml_strings():
    gs = _gpu_search()
    text = gs.planning.set_key('[backend]\nkind = "sglang"\n', "backend", "python", '/a "b"/python')
    assert tomllib.loads(text)["backend"]["python"] == '/a "b"/python'


def test_a_recording_continues_the_table_an_earlier_session_brought_back(tmp_path):
    """--record-onto: the table in the repository is where record_landscape.py goes on (its
    points and repeats are not booted again); without --record, or with no such file, the call
    says so and stops (exit 2) before anything is staged."""
    gs = _gpu_search()
    work = gs.Work(tmp_path / "work")
    table = "benchmarks/data/llamacpp-cpu-ngram.parquet"
    plan = gs.planning.make_plan(_args(record=True, record_onto=table,
                                       search_args=["--axis", "speculative_num_steps=0-2"]),
                                 work, 1)
    out = work.results / gs.base.LANDSCAPE
    assert out.read_bytes() == (REPO / table).read_bytes()
    argv = plan["search_argv"]
    assert argv[1] == "benchmarks/record_landscape.py" and argv[argv.index("--out") + 1] == str(out)
    # The recorder's run dir (its boots' server logs) is the one results.tar.gz brings back.
    assert plan["run_dir"] == argv[argv.index("--run-dir") + 1] == str(work.runs / "landscape")
    assert not (work.results / gs.base.LANDSCAPE_ASIDE).exists()
    for bad in (_args(record_onto=table), _args(record=True, record_onto="no/such.parquet")):
        assert gs.call(bad, gs.Work(tmp_path / "other")) == 2


def test_a_continued_recording_takes_the_rows_other_weights_served_along(tmp_path):
    """The rows the recorder set aside (other weights served them) travel with their table, so
    that rows set aside on the machine join them and both come back."""
    gs = _gpu_search()
    mine = tmp_path / "repo" / "t.parquet"
    mine.parent.mkdir()
    mine.write_bytes(b"table")
    (mine.parent / "t.other-weights.parquet").write_bytes(b"aside")
    work = gs.Work(tmp_path / "work")
    gs.planning.make_plan(_args(record=True, record_onto=str(mine),
                                search_args=["--axis", "speculative_num_steps=0-2"]), work, 1)
    assert (work.results / gs.base.LANDSCAPE).read_bytes() == b"table"
    assert (work.results / gs.base.LANDSCAPE_ASIDE).read_bytes() == b"aside"
    assert gs.base.LANDSCAPE_ASIDE in gs.results.RESULT_FILES
    # the name the recorder gives them beside the route's table
    recorder = bench_module("record_landscape")
    assert recorder.aside_path(Path(gs.base.LANDSCAPE)).name == gs.base.LANDSCAPE_ASIDE


def _results_tar(path: Path, run_name: str, trials: int) -> None:
    """A results.tar.gz as the route brings it back: the run dir under its name, device/ beside."""
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as t:
        def add(name: str, text: str) -> None:
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        add(f"{run_name}/experiment.toml", "name = 'x'\n")
        add(f"{run_name}/optuna.journal", "{}\n")
        for i in range(trials):
            add(f"{run_name}/t{i}_steps=3/params.json", "{}\n")
        add("device/pipeline.log", "search: start\n")


# A payload of one file in one chunk (part 1), none of it staged.
MANIFEST = {"files": [{"name": "a.whl", "chunks": [{"file": "a.whl.000", "part": 1}]}]}


def test_a_search_goes_on_from_the_run_dir_an_earlier_session_brought_back(tmp_path):
    """--resume-run: the carried results.tar.gz's run dir is unpacked where the search's
    --storage finds it (and resumes it); until it is carried, NEXT names it first; a machine
    that already has the run keeps it; the wrong experiment's tarball is refused."""
    import pytest

    gs = _gpu_search()
    work = gs.Work(tmp_path / "work")
    tar = tmp_path / "results.tar.gz"
    args = _args(resume_run=str(tar), payload=[])
    plan = gs.planning.make_plan(args, work, 1)
    assert gs.planning.resume_run(args, work, plan) is False          # not carried yet
    assert gs.parts_to_carry(work, MANIFEST, args)[0] == str(tar)
    _results_tar(tar, "sglang-gpu", trials=2)
    assert gs.planning.resume_run(args, work, plan) is True
    run_dir = Path(plan["run_dir"])
    assert run_dir == work.runs / "sglang-gpu"
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "experiment.toml", "optuna.journal", "t0_steps=3", "t1_steps=3"]
    assert not (work.runs / "device").exists()
    assert work.read(gs.planning.RESUMED)["trial_dirs"] == 2
    assert str(tar) not in gs.parts_to_carry(work, MANIFEST, args)
    # Once unpacked, later calls (the tarball no longer carried) do nothing more.
    tar.unlink()
    assert gs.planning.resume_run(args, work, plan) is True

    other = gs.Work(tmp_path / "other")
    _results_tar(tar, "vllm-gpu", trials=1)
    with pytest.raises(SystemExit):
        gs.planning.resume_run(args, other, gs.planning.make_plan(args, other, 1))
    assert not (other.runs / "sglang-gpu").exists()


def test_the_status_sizes_each_cache_a_later_machine_could_be_carried(tmp_path, monkeypatch):
    """status.txt names each folder of the work dir's cache/ and the compilers' own (Triton's,
    Inductor's) with its files and MiB, links not followed: the sizes a carry of the compile
    caches between sessions would move, read from the machine that wrote them."""
    gs = _gpu_search()
    work = gs.Work(tmp_path / "work")
    graphs = work.cache / "vllm-cache" / "torch_compile_cache" / "c441aaa250"
    graphs.mkdir(parents=True)
    (graphs / "artifact").write_bytes(b"x" * (3 << 20))
    (work.cache / "vllm-cache" / "modelinfos.json").write_text("{}")
    triton = tmp_path / "triton"
    (triton / "k1").mkdir(parents=True)
    (triton / "k1" / "kernel.cubin").write_bytes(b"y" * (1 << 20))
    (triton / "link").symlink_to(triton / "k1" / "kernel.cubin")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(triton))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "absent"))
    text = gs.results.status_text(work, None)
    assert (f"caches: vllm-cache 3.0 MiB in 2 files; triton ({triton}) 1.0 MiB in 1 file\n"
            in text)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "absent"))
    assert "caches:" not in gs.results.status_text(gs.Work(tmp_path / "bare"), None)


def test_the_last_calls_summary_is_the_status_it_wrote(tmp_path, monkeypatch, capsys):
    """The call that finds the pipeline ended prints status.txt as bring_back() wrote it (one
    walk of the caches, not two), $OUT set or not."""
    gs = _gpu_search()
    monkeypatch.delenv("OUT", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "absent"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "absent"))
    work = gs.Work(tmp_path / "work")
    work.results.mkdir(parents=True, exist_ok=True)
    (work.cache / "vllm-cache").mkdir(parents=True)
    assert gs.finished(work, None, "ok", gs.results.bring_back(work, None, None, ended=True)) == 0
    written = (work.results / "status.txt").read_text()
    assert "caches: vllm-cache 0.0 MiB in 0 files\n" in written
    assert written in capsys.readouterr().out
