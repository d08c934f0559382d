"""1. stage: the carried parts, copied into the work folder as they come (each chunk checked
against the manifest's sha256), and each file joined and checked once all its chunks came. Two
lanes: the payload (pack_payload.py's parts) and the trained EAGLE-3 models (--models:
models_back.py's parts)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import NamedTuple

from pack_payload import write_hashed  # the packer beside gpu_search.py: one way to check

from .base import REPO, Work, say

# Where the payload's parts are looked for (beside the --payload folders), from the repository.
PAYLOAD_DIRS = ("build/gpu-payload",)
# The trained EAGLE-3 models as carried parts (scripts/device/models_back.py): their manifest's
# kind, which keeps them apart from the payload's parts.
MODELS_KIND = "eagle3-models"


class Lane(NamedTuple):
    """One kind of carried parts, staged apart from the others: the payload (wheels, the
    llama.cpp source: pack_payload.py) or the trained EAGLE-3 models (--models:
    models_back.py). Each keeps its own manifest, staging folder and joined files, so carrying
    one never makes the other's chunks stale (a lane starts from scratch only when a part of
    another pack of that same lane comes)."""

    name: str                 # as the lines say it
    manifest: str             # its manifest, in work/state
    stage: str                # work/<stage>: the chunks as they come
    joined: str               # work/<joined>: the files, whole and checked
    stale: tuple[str, ...]    # state files that a new pack of the lane makes stale
    kind: str | None          # the manifest's "kind" (the payload's manifests have none)


PAYLOAD = Lane("payload", "manifest.json", "stage", "payload", ("installed.json",), None)
# A new models pack makes the unpacked one stale (unpack_models replaces it when whole); the
# intent (models-carried.json: --models was given) stays.
MODELS = Lane("models", "models-manifest.json", "models-stage", "models-joined",
              ("models-unpacked.json",), MODELS_KIND)


def part_folders(dirs: list[str] | tuple[str, ...]) -> list[Path]:
    """The carried parts under these folders (part*/manifest.json, or a part itself)."""
    found = []
    for d in dirs:
        base = REPO / d if not os.path.isabs(d) else Path(d)
        found += sorted(p.parent for p in base.glob("part*/manifest.json"))
        found += [base] if (base / "manifest.json").is_file() else []
    return found


def shown(path: Path) -> Path:
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def stage(work: Work, extra_dirs: list[str], lane: Lane = PAYLOAD) -> dict | None:
    """Copy the carried parts into work/<lane.stage>; join complete files into
    work/<lane.joined>. The payload's parts are looked for in build/gpu-payload and the
    --payload folders; the models' in the --models folder."""
    for d in (lane.stage, lane.joined):
        (work.root / d).mkdir(exist_ok=True)
    manifest = work.read(lane.manifest)
    for part in part_folders((*PAYLOAD_DIRS, *extra_dirs) if lane is PAYLOAD else extra_dirs):
        m = json.loads((part / "manifest.json").read_text())
        if m.get("kind") != lane.kind:
            say(f"{shown(part)}: a part of {m.get('kind') or 'the payload'}, not of the "
                f"{lane.name}: left alone (the payload's folders are --payload, the models' "
                f"--models)")
            continue
        manifest = take_part(work, lane, part, m, manifest)
    if manifest is None:
        return None
    join_files(work, lane, manifest)
    return manifest


def take_part(work: Work, lane: Lane, part: Path, m: dict, manifest: dict | None) -> dict:
    """Stage one carried part: its chunks not staged or joined yet, each checked against its
    sha256 in the manifest where the manifest has one (a damaged chunk is dropped, and the
    part named to carry again)."""
    stage_dir, joined = work.root / lane.stage, work.root / lane.joined
    if manifest and m["pack_id"] != manifest["pack_id"]:
        say(f"{shown(part)}: from another pack ({m['pack_id']}, staged: "
            f"{manifest['pack_id']}); staging the new pack from scratch")
        for d in (stage_dir, joined):
            shutil.rmtree(d)
            d.mkdir()
        for name in lane.stale:
            (work.state / name).unlink(missing_ok=True)
        manifest = None
    if manifest is None:
        manifest = {k: v for k, v in m.items() if k != "this_part"}
    # Where this pack's parts are carried from (build/gpu-payload, or a --payload folder such
    # as build/gpu-payload-vllm, or the --models folder): what the NEXT line names.
    manifest["carried_from"] = str(shown(part.parent))
    work.write(lane.manifest, manifest)
    chunks = {c["file"]: c for e in manifest["files"] for c in e["chunks"]}
    n, bad = 0, []
    for f in sorted(part.iterdir()):
        if f.name == "manifest.json" or (stage_dir / f.name).exists() or \
                (joined / chunk_owner(manifest, f.name)).exists():
            continue
        tmp = stage_dir / f".{f.name}.tmp"
        got = write_hashed(tmp, [(f, 0, None)])
        want = chunks.get(f.name, {}).get("sha256")
        if want and got != want:
            tmp.unlink()
            bad.append(f.name)
            continue
        os.replace(tmp, stage_dir / f.name)
        n += 1
    if bad:
        say(f"{lane.name} part {m['this_part']}: {', '.join(bad)}: sha256 differs from the "
            f"manifest; dropped: carry {manifest['carried_from']}/part{m['this_part']} again")
    say(f"staged {lane.name} part {m['this_part']} of {m['parts']} ({n} new file(s)) from "
        f"{shown(part)}")
    return manifest


def join_files(work: Work, lane: Lane, manifest: dict) -> None:
    """Join each file whose chunks have all come, and check it against its sha256."""
    stage_dir, joined = work.root / lane.stage, work.root / lane.joined
    for entry in manifest["files"]:
        out = joined / entry["name"]
        if out.exists() or not all((stage_dir / c["file"]).exists() for c in entry["chunks"]):
            continue
        tmp = joined / f".{entry['name']}.tmp"
        if write_hashed(tmp, [(stage_dir / c["file"], 0, None)
                              for c in entry["chunks"]]) != entry["sha256"]:
            tmp.unlink()
            for c in entry["chunks"]:
                (stage_dir / c["file"]).unlink()
            say(f"{entry['name']}: sha256 differs from the manifest; dropped, carry its part(s) "
                f"again")
            continue
        os.replace(tmp, out)
        for c in entry["chunks"]:
            (stage_dir / c["file"]).unlink()


def chunk_owner(manifest: dict, chunk: str) -> str:
    for entry in manifest["files"]:
        if any(c["file"] == chunk for c in entry["chunks"]):
            return entry["name"]
    return chunk


def missing_parts(work: Work, manifest: dict, lane: Lane = PAYLOAD) -> list[int]:
    stage_dir, joined = work.root / lane.stage, work.root / lane.joined
    return sorted({c["part"] for e in manifest["files"] if not (joined / e["name"]).exists()
                   for c in e["chunks"] if not (stage_dir / c["file"]).exists()})
