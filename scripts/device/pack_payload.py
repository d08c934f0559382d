#!/usr/bin/env python3
"""Pack, here (where PyPI is reachable), what the offline GPU machine lacks for a search.

    python3 scripts/device/pack_payload.py            # -> build/gpu-payload/part1, part2, ...

What goes in (Python 3.12 manylinux wheels, so the machine's own python3 can use them):

- the wheels of the project's runtime dependencies (pyproject's [project].dependencies, which
  include ray[default,tune] for the dashboard, plus gguf for the test model) and of everything
  they pull in, EXCEPT the distributions the machine's image already has
  (scripts/device/image-packages.txt): pandas, pyarrow, aiohttp, numpy, nvidia-ml-py... stay;
- llama.cpp's source (the tree vendored in the llama-cpp-python sdist, as
  scripts/build_llama_server.sh uses it), trimmed to ~10 MB, for the CUDA build of llama-server.

A device call carries at most 64 MiB, and the ray wheel alone is ~79 MB, so the files are cut
into numbered parts of at most --part-mib MiB each (big files split across parts). Part 1 holds
the llama.cpp source, so the first call can start the build. Every part has the same
manifest.json (names, sizes, sha256, which chunk is in which part); gpu_search.py on the machine
joins and verifies the files once all their chunks have arrived. Downloads are kept in
build/gpu-payload/cache and reused; the parts are rewritten at every run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
            *[a for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
                          "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
                          "manylinux2014_x86_64", "manylinux1_x86_64", "any")
              for a in ("--platform", p)]]
# Not needed to run a search: llama.cpp's docs, tests, examples, CI, Python tools, vocab files
# other than the llama SentencePiece one (app/ and scripts/ stay: CMakeLists.txt adds them).
LLAMA_DROP = ("docs", "tests", "benches", "examples", "media", "pocs", "ci", "gguf-py",
              "conversion", "skills", "requirements", ".devops", ".github")
LLAMA_VOCAB = "ggml-vocab-llama-spm.gguf"


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def say(msg: str) -> None:
    print(f"pack_payload: {msg}", flush=True)


def requirements() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    reqs += [r for r in project.get("optional-dependencies", {}).get("engines", [])
             if norm(re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0]) == "gguf"]
    return reqs


def image_packages() -> dict[str, str | None]:
    """Name -> the version seen on the image (None where only the name is known)."""
    out: dict[str, str | None] = {}
    for line in (HERE / "image-packages.txt").read_text().splitlines():
        entry = line.split("#")[0].strip()
        if entry:
            name, _, version = entry.partition("==")
            out[norm(name)] = version.strip() or None
    return out


# The machine's Python, for the environment markers of the requirements.
MARKER_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "os_name": "posix",
              "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
              "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def resolve(reqs: list[str]) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    """(name, version) of every distribution the requirements need, for Python 3.12 x86-64,
    and every requirement on a distribution as (name, specifier, needed by), extras followed."""
    from packaging.requirements import Requirement

    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run",
                        "--ignore-installed", "--target", f"{tmp}/t", *PLATFORM,
                        "--report", str(report), *reqs], check=True)
        data = json.loads(report.read_text())
    meta = {norm(i["metadata"]["name"]): i["metadata"] for i in data["install"]}
    demands, seen = [], set()
    todo = [(Requirement(r), "the project") for r in reqs]
    while todo:
        req, by = todo.pop()
        name = norm(req.name)
        demands.append((name, str(req.specifier), by))
        for extra in ["", *sorted(req.extras)]:
            if (name, extra) in seen or name not in meta:
                continue
            seen.add((name, extra))
            for r in meta[name].get("requires_dist", []):
                sub = Requirement(r)
                if sub.marker is None or sub.marker.evaluate(MARKER_ENV | {"extra": extra}):
                    todo.append((sub, f"{name}[{extra}]" if extra else name))
    pins = sorted((m["name"], m["version"]) for m in meta.values())
    return pins, demands


def needs_carrying(name: str, image: dict[str, str | None],
                   demands: list[tuple[str, str, str]]) -> str | None:
    """Why a distribution must travel: not on the image, or its version there is excluded."""
    from packaging.specifiers import SpecifierSet

    if name not in image:
        return "not on the image"
    have = image[name]
    for dname, spec, by in demands:
        if dname == name and have and spec and \
                not SpecifierSet(spec).contains(have, prereleases=True):
            return f"the image has {have}, {by} needs {spec}"
    return None


def download(pins: list[tuple[str, str]], cache: Path) -> list[Path]:
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PLATFORM,
                    "-d", str(wheels), *[f"{n}=={v}" for n, v in pins]], check=True)
    want = {(norm(n), v) for n, v in pins}
    out = []
    for w in sorted(wheels.glob("*.whl")):
        dist, ver = w.name.split("-")[:2]
        if (norm(dist), ver) in want:
            out.append(w)
    got = {(norm(w.name.split("-")[0]), w.name.split("-")[1]) for w in out}
    if got != want:
        raise SystemExit(f"pack_payload: no wheel for {sorted(want - got)}")
    return out


def llama_source(cache: Path, version: str) -> Path:
    out = cache / f"llama-src-{version}.tgz"
    if out.is_file():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:",
                        "--no-deps", "-d", tmp, f"llama-cpp-python=={version}"], check=True)
        sdist = next(Path(tmp).glob("llama*cpp*python-*.tar.gz"))
        with tarfile.open(sdist) as t:
            t.extractall(tmp, filter="data")
        src = next(Path(tmp).glob("*/vendor/llama.cpp"))
        for d in LLAMA_DROP:
            shutil.rmtree(src / d, ignore_errors=True)
        for f in (src / "models").rglob("*"):
            if f.is_file() and f.name != LLAMA_VOCAB:
                f.unlink()
        with tarfile.open(f"{out}.tmp", "w:gz") as t:
            t.add(src, arcname="llama.cpp")
        os.replace(f"{out}.tmp", out)
    return out


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pack(files: list[Path], out: Path, part_bytes: int, extra: dict) -> list[Path]:
    """Lay the files end to end into parts of at most part_bytes, cutting files at part ends."""
    if out.exists():
        for old in out.glob("part*"):
            shutil.rmtree(old)
    entries, parts = [], [[]]
    room = part_bytes
    for f in files:
        size, done, chunks = f.stat().st_size, 0, []
        while done < size:
            if room == 0:
                parts.append([])
                room = part_bytes
            n = min(room, size - done)
            name = f.name if n == size else f"{f.name}.{len(chunks):03d}"
            chunks.append({"part": len(parts), "file": name, "offset": done, "size": n})
            parts[-1].append((f, done, n, name))
            done += n
            room -= n
        entries.append({"name": f.name, "size": size, "sha256": sha256(f), "chunks": chunks})
    body = {"files": entries, "parts": len(parts), **extra}
    body["pack_id"] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]
    dirs = []
    for i, items in enumerate(parts, 1):
        d = out / f"part{i}"
        d.mkdir(parents=True)
        for src, off, n, name in items:
            with open(src, "rb") as a, open(d / name, "wb") as b:
                a.seek(off)
                left = n
                while left:
                    block = a.read(min(left, 1 << 22))
                    b.write(block)
                    left -= len(block)
        (d / "manifest.json").write_text(json.dumps(body | {"this_part": i}, indent=1))
        dirs.append(d)
    return dirs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "build" / "gpu-payload",
                    help="where the parts go (default build/gpu-payload, git-ignored)")
    ap.add_argument("--part-mib", type=int, default=60,
                    help="largest part in MiB (a call carries 64 MiB with the repository)")
    ap.add_argument("--llama-version", default="0.3.36",
                    help="llama-cpp-python sdist whose llama.cpp is built (0.3.36)")
    args = ap.parse_args()
    cache = args.out / "cache"
    reqs = requirements()
    say(f"resolving {' '.join(reqs)} for Python 3.12 x86-64")
    pins, demands = resolve(reqs)
    image = image_packages()
    why = {n: needs_carrying(norm(n), image, demands) for n, _ in pins}
    carried = [(n, v) for n, v in pins if why[n]]
    skipped = [f"{n}=={v}" for n, v in pins if not why[n]]
    say(f"{len(pins)} distributions needed; {len(skipped)} already on the image, "
        f"{len(carried)} carried")
    for n, v in carried:
        if why[n] != "not on the image":
            say(f"  carried although on the image: {n}=={v} ({why[n]})")
    wheels = download(carried, cache)
    src = llama_source(cache, args.llama_version)
    # Part 1 starts with the llama.cpp source (the first call starts the build), then the small
    # wheels; the biggest (ray) comes last and is the one cut across parts.
    files = [src] + sorted(wheels, key=lambda w: w.stat().st_size)
    extra = {"llama_src": src.name, "python": "3.12",
             "carried": [f"{n}=={v}" for n, v in carried], "on_image": skipped,
             "requirements": reqs}
    dirs = pack(files, args.out, args.part_mib << 20, extra)
    total = sum(f.stat().st_size for f in files)
    say(f"{len(files)} files, {total / 2**20:.1f} MiB, in {len(dirs)} part(s):")
    for d in dirs:
        size = sum(f.stat().st_size for f in d.iterdir())
        print(f"  {d.relative_to(REPO) if d.is_relative_to(REPO) else d}  "
              f"{size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
