"""The trained EAGLE-3 models' round trip on the GPU route, on the CPU with a fake models
folder: scripts/device/gpu_search.py --models-back cuts them into chunks that come back within
a call's limits, scripts/device/models_back.py joins and checks them here and cuts carryable
parts, and a later session's gpu_search.py --models stages those parts, unpacks them and lets
the pipeline's model step use them instead of training."""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(
        name, REPO / "scripts" / "device" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


gs = _load("gpu_search")
pp = _load("pack_payload")


def test_a_damaged_chunk_is_dropped_as_its_part_is_staged(tmp_path, capsys, monkeypatch):
    """Each chunk's sha256 is checked as its part is staged: the damaged one is dropped at
    once with one line naming the part to carry again, the good ones stay."""
    # Only this test's parts, not a checkout's own build/gpu-payload (real packs, another pack).
    monkeypatch.setattr(gs.staging, "PAYLOAD_DIRS", ("build/no-payload-in-tests",))
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.whl").write_bytes(os.urandom(3000))
    (src / "b.whl").write_bytes(os.urandom(1000))
    parts = pp.pack([src / "a.whl", src / "b.whl"], tmp_path / "pack", 2048, {})
    manifest = json.loads((parts[0] / "manifest.json").read_text())
    assert all("sha256" in c for e in manifest["files"] for c in e["chunks"])
    # A file's own sha256, taken as its chunks were copied over two parts, is the file's
    assert [e["sha256"] for e in manifest["files"]] == [
        hashlib.sha256((src / n).read_bytes()).hexdigest() for n in ("a.whl", "b.whl")]
    work = gs.Work(tmp_path / "work")
    gs.staging.stage(work, [str(parts[0])])
    damaged = parts[1] / "a.whl.001"
    data = damaged.read_bytes()
    damaged.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])     # a byte that differs
    staged = gs.staging.stage(work, [str(parts[1])])
    out = capsys.readouterr().out
    assert "payload part 2: a.whl.001: sha256 differs from the manifest; dropped: carry " \
           f"{parts[1].parent}/part2 again" in out
    assert gs.staging.missing_parts(work, staged) == [2]
    assert not (work.payload / "a.whl").exists()
    assert (work.payload / "b.whl").read_bytes() == (src / "b.whl").read_bytes()


# --- the machine, faked: a GPU name, a payload installed, no source snapshots ---------------

GPU = "NVIDIA H100 80GB HBM3, 9.0, 81559 MiB"
SIZES = {"target": 3_000_000, "eagle3": 1_200_000}


def _machine(tmp_path, monkeypatch, name="work", pipeline="ok"):
    """A work dir as the route leaves it once the payload is installed; the pipeline ended
    ("ok") or running ("running": this test's own pid stands for it)."""
    # Never the real build/gpu-payload (in the main checkout it holds the packs).
    monkeypatch.setattr(gs.staging, "PAYLOAD_DIRS", ("build/no-payload-in-tests",))
    monkeypatch.setattr(gs.base, "gpus_here", lambda: [GPU])
    monkeypatch.setattr(gs.planning, "snapshot", lambda work: None)
    monkeypatch.setattr(gs.planning, "validate", lambda plan, work: Path(
        plan["run_experiment"]).parent.mkdir(parents=True, exist_ok=True))
    work = gs.Work(tmp_path / name)
    work.write("manifest.json", {"pack_id": "p1", "parts": 1, "files": []})
    work.write("installed.json", {"at": 0, "pack_id": "p1", "problems": []})
    if pipeline == "ok":
        (work.state / "pipeline.rc").write_text("0\n")
    else:
        work.write("pipeline.pid", os.getpid())
    return work


def _trained(work) -> Path:
    """A fake trained pair (random bytes) in the layout the training leaves."""
    folder = work.cache / "eagle3-models"
    for d, n in SIZES.items():
        (folder / d).mkdir(parents=True)
        (folder / d / "model.safetensors").write_bytes(os.urandom(n))
        (folder / d / "config.json").write_text(json.dumps({"d": d}))
    (folder / "target" / "tokenizer.json").write_text('{"model": {}}')
    (folder / "acceptance.json").write_text(json.dumps({
        "device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "preset": "gpu",
        "seed": 0, "greedy": {"mean_accept_length": 3.77}, "target_loss": {"held_out": 3.03}}))
    (work.state / "models.rc").write_text("0\n")
    (work.results / "models.log").write_text(
        "train...\nmodels: gpu preset on NVIDIA H100: greedy accept length 3.77; 202 s\n")
    return folder


def _call(work, out: Path, *extra: str) -> int:
    out.mkdir(parents=True)
    os.environ["OUT"] = str(out)
    try:
        return gs.main(["--experiment", "experiments/sglang-gpu.toml", "--no-check",
                        "--wait", "0", "--work", str(work.root), *extra])
    finally:
        del os.environ["OUT"]


def _small_limits(monkeypatch):
    """Chunks of 1 MiB, 2.5 MiB a call: the 4.2 MB pair needs several calls."""
    monkeypatch.setattr(gs.models, "MODELS_CHUNK", 1 << 20)
    monkeypatch.setattr(gs.results, "MAX_OUT_FILE", 1 << 20)
    monkeypatch.setattr(gs.results, "MAX_OUT_TOTAL", (5 << 20) // 2)


def _bring_back(tmp_path, monkeypatch, capsys) -> list[Path]:
    """The models brought back call after call, as a session would; the calls' $OUT folders."""
    _small_limits(monkeypatch)
    work = _machine(tmp_path, monkeypatch)
    _trained(work)
    outs = []
    for i in range(1, 10):
        outs.append(tmp_path / "device" / str(i))
        rc = _call(work, outs[-1], "--models-back")
        said = capsys.readouterr().out
        if "still to come back" not in said:
            break
        assert rc == gs.CALL_AGAIN and "NEXT:" in said
    assert rc == 0                           # the pipeline had ended: DONE once all came back
    # 4.0 MiB in 1 MiB chunks, 2 of them a call (and the short last one where it fits).
    assert "all 5 have come back (calls 1-2)" in said
    return outs


def test_the_models_come_back_in_chunks_within_each_calls_limits(tmp_path, monkeypatch,
                                                                  capsys):
    outs = _bring_back(tmp_path, monkeypatch, capsys)
    assert len(outs) == 2
    chunks = []
    for out in outs:
        files = sorted(out.iterdir())
        assert len(files) <= gs.results.MAX_OUT_FILES
        assert all(f.stat().st_size <= gs.results.MAX_OUT_FILE for f in files)
        assert sum(gs.results.blocks(f.stat().st_size) for f in files) \
            <= gs.results.MAX_OUT_TOTAL
        # status.txt always; the manifest with every chunk.
        assert {"status.txt", gs.models.MODELS_BACK} <= {f.name for f in files}
        chunks += [f.name for f in files if f.name.startswith(gs.models.MODELS_ARCHIVE + ".")]
    manifest = json.loads((outs[0] / gs.models.MODELS_BACK).read_text())
    assert sorted(chunks) == [c["file"] for c in manifest["chunks"]]      # each once
    assert manifest["compression"] == "none" and manifest["size"] > sum(SIZES.values())
    models = manifest["models"]
    assert models["gpu"] == "NVIDIA H100 80GB HBM3" and models["torch"] == "2.11.0+cu130"
    assert models["accept_length"] == 3.77
    assert models["summary"].endswith("greedy accept length 3.77; 202 s")


def test_models_back_waits_for_the_training_and_leaves_a_running_pipeline_alone(
        tmp_path, monkeypatch, capsys):
    """While the pair trains nothing is sent (the call follows the pipeline as ever); once it
    is trained, a call that follows a running pipeline brings chunks first and the results
    that still fit, and leaves the pipeline running."""
    _small_limits(monkeypatch)
    work = _machine(tmp_path, monkeypatch, pipeline="running")
    work.write("models.pid", os.getpid())
    rc = _call(work, tmp_path / "o1", "--models-back")
    assert rc == gs.CALL_AGAIN
    assert "not trained yet (running)" in capsys.readouterr().out
    assert not [f for f in (tmp_path / "o1").iterdir() if f.name.startswith("eagle3-models")]
    (work.state / "models.pid").unlink()
    _trained(work)
    (work.results / "search.log").write_text("trial 1\n")
    rc = _call(work, tmp_path / "o2", "--models-back")
    said = capsys.readouterr().out
    # 2 chunks of 1 MiB fill the call but for the short last one, and the small results.
    assert rc == gs.CALL_AGAIN and "(--models-back: chunks 3-4 next)" in said
    got = sorted(f.name for f in (tmp_path / "o2").iterdir())
    assert got == sorted(["status.txt", gs.models.MODELS_BACK, "results.tar.gz", "search.log",
                          *(f"{gs.models.MODELS_ARCHIVE}.{i:03d}" for i in (1, 2, 5))])
    assert gs.base.pipeline_state(work) == "running"


def test_once_the_pipeline_has_ended_its_results_come_back_before_the_chunks(
        tmp_path, monkeypatch, capsys):
    """The landscape's session of 2026-12-07: the call after the recording ended would have
    filled its 8 files with chunks and left the table on the machine. Once the pipeline has
    ended, every result comes back with that call, and the chunks that do not fit beside them
    with the calls that follow."""
    _small_limits(monkeypatch)
    work = _machine(tmp_path, monkeypatch)
    _trained(work)
    results = ("results.tar.gz", "search.log", "run.json", gs.base.LANDSCAPE,
               gs.base.MODELS_REPORT)
    for name in results:
        (work.results / name).write_text(name)
    monkeypatch.setattr(gs.results, "collect", lambda work, plan: None)
    rc = _call(work, tmp_path / "o1", "--models-back")
    said = capsys.readouterr().out
    got = {f.name for f in (tmp_path / "o1").iterdir()}
    assert set(results) <= got and len(got) == gs.results.MAX_OUT_FILES
    assert rc == gs.CALL_AGAIN and "still to come back" in said
    def chunks_in(out: Path) -> set[str]:
        return {f.name for f in out.iterdir() if f.name.startswith(gs.models.MODELS_ARCHIVE)}

    chunks = chunks_in(tmp_path / "o1")
    for i in range(2, 6):
        out = tmp_path / f"o{i}"
        rc = _call(work, out, "--models-back")
        said = capsys.readouterr().out
        chunks |= chunks_in(out)
        if rc == 0:
            break
    manifest = json.loads((tmp_path / "o1" / gs.models.MODELS_BACK).read_text())
    assert rc == 0 and sorted(chunks) == [c["file"] for c in manifest["chunks"]]


def test_a_chunk_whose_call_was_lost_comes_back_again_by_its_number(tmp_path, monkeypatch,
                                                                    capsys):
    _bring_back(tmp_path, monkeypatch, capsys)
    work = gs.Work(tmp_path / "work")
    assert _call(work, tmp_path / "again", "--models-back", "2,4") == 0
    assert sorted(f.name for f in (tmp_path / "again").iterdir() if ".tar." in f.name) == [
        f"{gs.models.MODELS_ARCHIVE}.002", f"{gs.models.MODELS_ARCHIVE}.004"]


def test_the_real_limits_bring_four_chunks_a_call():
    """4 chunks of MODELS_CHUNK beside status.txt and the manifest: the ~101 MiB pair comes
    back in 2 calls."""
    assert gs.models.MODELS_CHUNK <= gs.results.MAX_OUT_FILE
    assert 4 * gs.models.MODELS_CHUNK + 2 * (64 << 10) <= gs.results.MAX_OUT_TOTAL
    assert 5 * gs.models.MODELS_CHUNK > gs.results.MAX_OUT_TOTAL


# --- here: join the chunks, cut the parts -------------------------------------------------

mb = _load("models_back")


def _joined(tmp_path, monkeypatch, capsys) -> Path:
    """The chunks brought back and joined here into parts of 2 MiB: build/eagle3-models."""
    outs = _bring_back(tmp_path, monkeypatch, capsys)
    build = tmp_path / "build" / "eagle3-models"
    assert mb.main([*map(str, outs), "--out", str(build), "--part-mib", "2"]) == 0
    return build


def test_the_chunks_join_here_into_parts_a_later_session_carries(tmp_path, monkeypatch,
                                                                 capsys):
    build = _joined(tmp_path, monkeypatch, capsys)
    said = capsys.readouterr().out
    assert "trained" in said and "on NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130), greedy " \
                                 "accept length 3.77" in said
    parts = sorted(build.glob("part*"))
    assert len(parts) == 3                                    # 4.0 MiB in parts of 2 MiB
    manifest = json.loads((parts[0] / "manifest.json").read_text())
    assert manifest["kind"] == "eagle3-models" and manifest["parts"] == 3
    assert manifest["models"]["accept_length"] == 3.77
    for p in parts:
        assert sum(f.stat().st_size for f in p.iterdir() if f.name != "manifest.json") \
            <= 2 << 20
    # The archive kept here is the one the machine made.
    back = json.loads((tmp_path / "device" / "1" / gs.models.MODELS_BACK).read_text())
    assert manifest["archive_sha256"] == back["sha256"] == manifest["files"][0]["sha256"]
    assert pp.sha256(build / "cache" / gs.models.MODELS_ARCHIVE) == back["sha256"]


def test_a_damaged_or_missing_chunk_is_refused_with_its_number(tmp_path, monkeypatch, capsys):
    outs = _bring_back(tmp_path, monkeypatch, capsys)
    chunk = next(outs[0].glob(f"{gs.models.MODELS_ARCHIVE}.002"))
    data = chunk.read_bytes()
    # the last byte flipped (writing a 0 there changed nothing where the tar pads with zeros)
    chunk.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    build = tmp_path / "build" / "eagle3-models"
    assert mb.main([*map(str, outs), "--out", str(build), "--part-mib", "2"]) == 1
    said = capsys.readouterr().out
    assert "eagle3-models.tar.002: sha256 differs from the manifest" in said
    assert "a call with `--models-back 2`" in said
    assert not build.exists()
    # Chunk 4 left out (its call's folder not given) as well: both named.
    assert mb.main([str(outs[0]), "--out", str(build), "--part-mib", "2"]) == 1
    said = capsys.readouterr().out
    assert "eagle3-models.tar.004: not in any folder given" in said
    assert "`--models-back 2,3,4`" in said
    # A folder that is no --models-back call's $OUT: refused.
    assert mb.main([str(tmp_path), "--out", str(build)]) == 2


# --- a later session: carry the parts, train nothing ----------------------------------------


def _no_training(*_a, **_k):
    raise AssertionError("carried models: nothing is trained")


def _later(tmp_path, monkeypatch, capsys, payload_done=True):
    """The parts joined here (3 of them), and a fresh machine of a later session: the
    payload staged (part 2 still to come unless payload_done), installed; a pipeline started
    is this test's pid (nothing runs)."""
    build = _joined(tmp_path, monkeypatch, capsys)
    capsys.readouterr()
    work = _machine(tmp_path, monkeypatch, name="later", pipeline=None)
    (work.state / "pipeline.pid").unlink()
    if not payload_done:
        work.write("manifest.json", {"pack_id": "p1", "parts": 2, "carried_from":
                                     "build/gpu-payload", "files": [{
                                         "name": "x.whl", "size": 1, "sha256": "0", "chunks": [
                                             {"part": 2, "file": "x.whl", "offset": 0,
                                              "size": 1}]}]})
    monkeypatch.setattr(gs.models, "start_models", _no_training)
    monkeypatch.setattr(gs.pipeline, "start_pipeline",
                        lambda w, plan: w.write("pipeline.pid", os.getpid()))
    return build, work


def _carry(build: Path, carry: Path, *numbers: int) -> None:
    """What one call carries: build/eagle3-models with only these parts in it."""
    shutil.rmtree(carry, ignore_errors=True)
    carry.mkdir(parents=True)
    for n in numbers:
        shutil.copytree(build / f"part{n}", carry / f"part{n}")


def test_the_parts_are_staged_across_calls_then_unpacked_and_nothing_trains(
        tmp_path, monkeypatch, capsys):
    build, work = _later(tmp_path, monkeypatch, capsys, payload_done=False)
    carry = tmp_path / "carry" / "eagle3-models"
    rcs, said = [], []
    for n in (1, 2, 3):
        _carry(build, carry, n)
        rcs.append(_call(work, tmp_path / "out" / str(n), "--models", str(carry)))
        said.append(capsys.readouterr().out)
    assert rcs == [gs.CALL_AGAIN] * 3
    # The models' missing parts are named first, then the payload's.
    assert f"carrying {carry}/part2, {carry}/part3, build/gpu-payload/part2 (one part" in said[0]
    assert "models: waiting for the carried models (1 of 3 part(s) staged), not training" \
        in said[0]
    assert f"carrying {carry}/part3, build/gpu-payload/part2 (one part" in said[1]
    assert "models: carried (trained " in said[2] and "on NVIDIA H100 80GB HBM3, accept " \
        "length 3.77), not trained; unpacked into" in said[2]
    assert "carrying build/gpu-payload/part2 (one part" in said[2]
    assert gs.models.models_state(work) == "ok"
    trained = tmp_path / "work" / "cache" / "eagle3-models"
    got = work.cache / "eagle3-models"
    for f in trained.rglob("*"):
        if f.is_file():
            assert (got / f.relative_to(trained)).read_bytes() == f.read_bytes()


def test_a_pipeline_started_before_the_models_came_names_their_part_at_once(
        tmp_path, monkeypatch, capsys):
    """The payload's last part came first: the pipeline starts (its model step will wait),
    and the call does not follow it for --wait seconds but names the models' next part."""
    build, work = _later(tmp_path, monkeypatch, capsys)
    carry = tmp_path / "carry" / "eagle3-models"
    _carry(build, carry, 1)
    t = time.monotonic()
    rc = _call(work, tmp_path / "out" / "1", "--models", str(carry), "--wait", "60")
    said = capsys.readouterr().out
    assert rc == gs.CALL_AGAIN and time.monotonic() - t < 20
    assert "NEXT: the pipeline's model step waits for the carried models: call again with " \
           f"the same command, carrying {carry}/part2, {carry}/part3 (one part" in said
    assert gs.models.models_state(work) == "running"
    # A damaged part 2 is dropped with one line; carried again whole, it is staged.
    _carry(build, carry, 2)
    chunk = next(f for f in (carry / "part2").iterdir() if f.name != "manifest.json")
    data = chunk.read_bytes()
    chunk.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])
    _call(work, tmp_path / "out" / "2", "--models", str(carry))
    said = capsys.readouterr().out
    assert f"models part 2: {chunk.name}: sha256 differs from the manifest; dropped: carry " \
           f"{carry}/part2 again" in said
    assert f"carrying {carry}/part2, {carry}/part3" in said
    # A models part passed as a payload folder by mistake is left alone.
    _carry(build, carry, 2)
    _call(work, tmp_path / "out" / "3", "--models", str(carry), "--payload", str(carry))
    said = capsys.readouterr().out
    assert "a part of eagle3-models, not of the payload: left alone" in said
    assert "staged models part 2 of 3 (1 new file(s))" in said
    assert work.read("manifest.json")["pack_id"] == "p1"          # the payload's, untouched


def test_the_model_step_waits_for_the_carried_models_and_trains_nothing(
        tmp_path, monkeypatch, capsys):
    """The pipeline's model step while the models' last part is still on its way: it waits
    (as for a training) and goes on with the carried pair, its note says where they came
    from, and nothing is trained."""
    build, work = _later(tmp_path, monkeypatch, capsys)
    monkeypatch.setattr(gs.base, "WHO", ["gpu_search"])
    carry = tmp_path / "carry" / "eagle3-models"
    _carry(build, carry, 1, 2)
    gs.models.stage_models(work, str(carry))
    args = argparse.Namespace(experiment="experiments/sglang-gpu.toml", gpus_per_trial=None,
                              max_concurrent=None, max_trials=None, no_check=True,
                              record=False, record_onto=None, readings=None, search_args=[])
    plan = gs.planning.make_plan(args, work, 1)
    plan["search_argv"] = [sys.executable, "-c", "pass"]
    work.write("plan.json", plan)
    assert gs.models.models_state(work) == "running"

    def last_part_comes():
        _carry(build, carry, 3)
        gs.models.stage_models(work, None)

    threading.Timer(1.0, last_part_comes).start()
    assert gs.pipeline.pipeline(work) == 0
    steps = work.read("steps.json")
    assert steps["model"]["ok"] and steps["model"]["wall_s"] >= 1.0
    assert steps["model"]["note"].startswith("carried (trained ")
    assert steps["model"]["note"].endswith("on NVIDIA H100 80GB HBM3, accept length 3.77), "
                                           "not trained")
    assert json.loads((work.results / gs.base.MODELS_REPORT).read_text())["greedy"][
        "mean_accept_length"] == 3.77
    assert "models: carried (trained" in gs.results.status_text(work, plan)
