#!/usr/bin/env python3
"""Here: join the trained EAGLE-3 models that `gpu_search.py --models-back` brought back, and
cut them into the parts a later session carries (`gpu_search.py --models build/eagle3-models`).

    python3 scripts/device/models_back.py /work/.device/7 /work/.device/8 \\
        [--out build/eagle3-models] [--part-mib N]

Why: GPU training is not bit-deterministic, so a pair trained anew each session is a slightly
different pair each session (greedy accept length 3.69, 3.99, 3.80, 3.77 in four sessions); a
landscape recorded over several sessions, or SGLang held against vLLM, must be served the same
weights. Carried, they also spare a session the ~150-200 s of GPU time the training takes.

Each call's $OUT folder holds eagle3-models.json (the archive's and each chunk's sha256, and
what the models are: trained when, on which GPU, with which torch, their acceptance) and some
of the chunks (eagle3-models.tar.001, ...). This checks every chunk against its sha256, joins
them, checks the archive's sha256 and that it holds the pair (target/, eagle3/,
acceptance.json), keeps it as <out>/cache/eagle3-models.tar, and cuts it into <out>/part1,
part2, ... of at most --part-mib MiB with pack_payload.py's pack(): the payload's manifest
format and chunking (each chunk with its sha256), kind "eagle3-models", the models' facts under
"models". On the machine gpu_search.py stages them in a lane of their own (the payload's single
manifest per work dir would take a models part for another pack and start over).

Exit: 0 done; 1 a chunk missing or damaged (the line names the chunks to bring back again with
`--models-back N,M`); 2 bad arguments (no manifest, or chunks of two different archives).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import pack_payload  # noqa: E402 - the sibling script, whose format and chunking the parts use

MANIFEST = "eagle3-models.json"       # gpu_route/models.py's MODELS_BACK
KIND = "eagle3-models"                # gpu_route/staging.py's MODELS_KIND: the parts' kind
FOLDER = "eagle3-models"              # the archive's top folder (gpu_route/base.py's EAGLE3_MODELS)
NEEDED = ("target/config.json", "target/model.safetensors", "eagle3/config.json",
          "eagle3/model.safetensors", "acceptance.json")


def say(msg: str) -> None:
    print(f"[models_back] {msg}", flush=True)


def read_manifest(dirs: list[Path]) -> tuple[dict, dict[str, list[Path]]]:
    """The manifest (the same in every call's folder) and where each chunk file was found;
    ValueError for a folder that is not a --models-back call's, or of another archive."""
    manifest: dict | None = None
    found: dict[str, list[Path]] = {}
    for d in dirs:
        path = d / MANIFEST
        if not path.is_file():
            raise ValueError(f"{d}: no {MANIFEST} (not the $OUT of a call with --models-back)")
        m = json.loads(path.read_text())
        if manifest and m["sha256"] != manifest["sha256"]:
            raise ValueError(f"{d} holds chunks of another archive ({m['sha256'][:12]}, not "
                             f"{manifest['sha256'][:12]}): give the calls of one session")
        manifest = manifest or m
        for c in m["chunks"]:
            if (d / c["file"]).is_file():
                found.setdefault(c["file"], []).append(d / c["file"])
    if manifest is None:
        raise ValueError("no folder given")
    return manifest, found


def good_chunks(manifest: dict, found: dict[str, list[Path]]) -> tuple[dict[str, Path], list]:
    """Each chunk's first copy whose sha256 matches; the numbers of those with none, and why."""
    good: dict[str, Path] = {}
    bad = []
    for c in manifest["chunks"]:
        copies = found.get(c["file"], [])
        match = next((p for p in copies if p.stat().st_size == c["size"]
                      and pack_payload.sha256(p) == c["sha256"]), None)
        if match:
            good[c["file"]] = match
        else:
            bad.append((c["n"], f"{c['file']}: " + (
                f"sha256 differs from the manifest in {', '.join(map(str, copies))}"
                if copies else "not in any folder given")))
    return good, bad


def join(manifest: dict, good: dict[str, Path], archive: Path) -> None:
    """The chunks end to end into `archive`, checked against the archive's sha256."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_name(f".{archive.name}.tmp")
    written = pack_payload.write_hashed(tmp, [(good[c["file"]], 0, None)
                                              for c in manifest["chunks"]])
    if written != manifest["sha256"]:
        tmp.unlink()
        raise SystemExit("models_back: the joined archive's sha256 differs from the manifest "
                         "(every chunk matched its own): bring all chunks back again")
    os.replace(tmp, archive)


def missing_in(archive: Path) -> list[str]:
    """What of the pair the archive lacks (nothing, for one the route trained)."""
    with tarfile.open(archive) as t:
        names = set(t.getnames())
    return [n for n in NEEDED if f"{FOLDER}/{n}" not in names]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("calls", nargs="+", type=Path,
                    help="the $OUT folders of the calls that brought the chunks back")
    ap.add_argument("--out", type=Path, default=REPO / "build" / "eagle3-models",
                    help="where the parts go (default build/eagle3-models, git-ignored)")
    ap.add_argument("--part-mib", type=int, default=None,
                    help="largest part in MiB (default: what a call's 64 MiB leaves beside the "
                         "repository, as for the payload)")
    args = ap.parse_args(argv)
    try:
        manifest, found = read_manifest(args.calls)
    except ValueError as e:
        print(f"models_back: {e}", file=sys.stderr)
        return 2
    good, bad = good_chunks(manifest, found)
    for _, why in bad:
        say(why)
    if bad:
        numbers = ",".join(str(n) for n, _ in bad)
        say(f"{len(bad)} of {len(manifest['chunks'])} chunk(s) missing or damaged: bring them "
            f"back again (a call with `--models-back {numbers}`), then run this with every "
            f"call's folder")
        return 1
    archive = args.out / "cache" / manifest["archive"]
    join(manifest, good, archive)
    if lacks := missing_in(archive):
        say(f"{archive}: the archive lacks {', '.join(lacks)}: not a trained pair")
        return 1
    part_mib = args.part_mib or pack_payload.room_beside_repository()
    facts = manifest["models"]
    dirs = pack_payload.pack([archive], args.out, part_mib << 20,
                             {"kind": KIND, "models": facts, "archive_sha256": manifest["sha256"],
                              "brought_back": manifest.get("made_at")})
    report(manifest, dirs, archive, part_mib)
    return 0


def report(manifest: dict, dirs: list[Path], archive: Path, part_mib: int) -> None:
    f = manifest["models"]
    say(f"{archive} ({manifest['size'] / 2**20:.1f} MiB, sha256 {manifest['sha256'][:12]}): "
        f"trained {f['trained_at']} on {f['gpu']} (torch {f['torch']}), greedy accept length "
        f"{f['accept_length']}")
    say(f"{len(dirs)} part(s) of at most {part_mib} MiB; carry one a call with `gpu_search.py "
        f"... --models {shown(dirs[0].parent)}` at every call:")
    for d in dirs:
        size = sum(p.stat().st_size for p in d.iterdir())
        print(f"  {shown(d)}  {size / 2**20:.1f} MiB")


def shown(path: Path) -> Path:
    path = path.resolve()
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


if __name__ == "__main__":
    sys.exit(main())
