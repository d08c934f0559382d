"""The trained EAGLE-3 models' round trip on the GPU route, on the CPU with a fake models
folder: scripts/device/gpu_search.py --models-back cuts them into chunks that come back within
a call's limits, scripts/device/models_back.py joins and checks them here and cuts carryable
parts, and a later session's gpu_search.py --models stages those parts, unpacks them and lets
the pipeline's model step use them instead of training."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
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


def test_a_damaged_chunk_is_dropped_as_its_part_is_staged(tmp_path, capsys):
    """Each chunk's sha256 is checked as its part is staged: the damaged one is dropped at
    once with one line naming the part to carry again, the good ones stay."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.whl").write_bytes(os.urandom(3000))
    (src / "b.whl").write_bytes(os.urandom(1000))
    parts = pp.pack([src / "a.whl", src / "b.whl"], tmp_path / "pack", 2048, {})
    manifest = json.loads((parts[0] / "manifest.json").read_text())
    assert all("sha256" in c for e in manifest["files"] for c in e["chunks"])
    work = gs.Work(tmp_path / "work")
    gs.stage(work, [str(parts[0])])
    damaged = parts[1] / "a.whl.001"
    damaged.write_bytes(b"x" + damaged.read_bytes()[1:])
    staged = gs.stage(work, [str(parts[1])])
    out = capsys.readouterr().out
    assert "payload part 2: a.whl.001: sha256 differs from the manifest; dropped: carry " \
           f"{parts[1].parent}/part2 again" in out
    assert gs.missing_parts(work, staged) == [2]
    assert not (work.payload / "a.whl").exists()
    assert (work.payload / "b.whl").read_bytes() == (src / "b.whl").read_bytes()
