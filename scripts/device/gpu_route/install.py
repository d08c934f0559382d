"""3. build and 4. install: the CUDA build of llama-server in the background
(build_llama_cuda.sh), the project's wheels into work/site with every requirement checked
against what the image has, an engine's wheels into a site of its own behind its wrapper, and
the environment the project's processes run in (env_for)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import base
from .base import DEVICE, REPO, Work, say


def start_build(work: Work, manifest: dict) -> None:
    tgz = work.payload / manifest["llama_src"]
    log = open(work.results / "build.log", "ab")  # noqa: SIM115 - the detached build writes it
    cmd = ('bash "$0" "$1"; rc=$?; echo $rc > "$2.tmp"; mv "$2.tmp" "$2"')
    p = subprocess.Popen(["bash", "-c", cmd, str(DEVICE / "build_llama_cuda.sh"), str(tgz),
                          str(work.state / "build.rc")], stdin=subprocess.DEVNULL, stdout=log,
                         stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO,
                         env=os.environ | {"SPECDECODE_CACHE": str(work.cache)})
    work.write("build.pid", p.pid)
    say(f"build: llama-server (CUDA) started in the background, pid {p.pid}; log "
        f"{work.results / 'build.log'}")


def wheels(work: Work, manifest: dict) -> list[Path]:
    """The project's wheels (an engine's go to its own site: install_engine)."""
    if "wheels" in manifest:
        return [work.payload / name for name in manifest["wheels"]]
    return [work.payload / e["name"] for e in manifest["files"] if e["name"].endswith(".whl")]


def engine_python(work: Work, engine: str) -> Path:
    """The wrapper that runs the engine's Python with only the engine's own site on its path
    (written by the install step)."""
    return work.root / "engines" / engine / "python"


def wait_build(work: Work, limit_s: float) -> bool:
    """Wait for the background build, logging its progress; False if it is not done in time."""
    end, last = time.monotonic() + limit_s, 0.0
    while base.build_state(work) == "running":
        if time.monotonic() > end:
            return False
        if time.monotonic() - last > 30:
            say(f"server: waiting for the build: {last_progress(work.results / 'build.log')}")
            last = time.monotonic()
        time.sleep(2)
    return base.build_state(work) in ("ok", "failed")


def last_progress(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "no log yet"
    steps = re.findall(r"\[(\d+)/(\d+)\]", text[-20000:])
    return f"{steps[-1][0]}/{steps[-1][1]} build steps" if steps else "configuring"


# Every requirement of argv[1] (a JSON list), followed through the installed distributions'
# own requirements and extras: what is missing or in a version refused, which came carried
# (under argv[2]) and which from the image; argv[3]: names the pack left out on purpose
# (reported as such, not missing), argv[4]: who asked. Sets `out` for the caller's tail.
WALK_REQUIREMENTS = r"""
import importlib.metadata as md, json, sys
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon
site, left_out = sys.argv[2], set(json.loads(sys.argv[3]))
problems, skipped, versions, seen = [], [], {}, set()
todo = [(Requirement(r), sys.argv[4]) for r in json.loads(sys.argv[1])]
while todo:
    r, by = todo.pop()
    if canon(r.name) in left_out:
        skipped.append(f"{r.name}{r.specifier} (needed by {by})")
        continue
    try:
        dist = md.distribution(r.name)
    except md.PackageNotFoundError:
        problems.append(f"missing: {r} (needed by {by})")
        continue
    name = canon(dist.metadata["Name"])
    where = str(dist.locate_file(""))
    versions[name] = f"{dist.version} ({'carried' if where.startswith(site) else 'image'})"
    if r.specifier and not r.specifier.contains(dist.version, prereleases=True):
        problems.append(f"conflict: {name} {dist.version} is there, {by} needs {r}")
    for extra in [None, *sorted(r.extras)]:
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        for sub in map(Requirement, dist.requires or []):
            if sub.marker is None or sub.marker.evaluate({"extra": extra or ""}):
                todo.append((sub, f"{name}{'[' + extra + ']' if extra else ''}"))
out = {"problems": sorted(set(problems)), "left_out": sorted(set(skipped)),
       "versions": versions}
"""
# The project's: the walk, then the imports a search needs and the dashboard's own check.
CHECK_REQUIREMENTS = WALK_REQUIREMENTS + r"""
import ray, ray.tune, optuna, gguf, pynvml, pyarrow, aiohttp
from ray._private.utils import get_dashboard_dependency_error
print(json.dumps({**out, "dashboard": get_dashboard_dependency_error() or "ok",
                  "ray": ray.__version__, "optuna": optuna.__version__}))
"""
# An engine's: the walk only (its imports need the GPU: the server's boot shows them).
CHECK_ENGINE = WALK_REQUIREMENTS + r"""
print(json.dumps(out))
"""


def compile_site(site: Path, python: str = sys.executable) -> float:
    """Byte-compile every module of `site` now, once (seconds taken). The machine's image keeps
    Python from writing bytecode as it imports (on the H100, 2026-12-06, every SGLang boot
    compiled its modules again in each of its three processes: the compile-time SyntaxWarning
    of torchao's quant_api.py came three times in every boot's log, and 35 s passed between the
    server's spawn and its first log line); compileall writes the files whatever that says."""
    t = time.monotonic()
    subprocess.run([python, "-m", "compileall", "-q", "-j", "0", str(site)],
                   capture_output=True, text=True, check=False,
                   env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    return time.monotonic() - t


def install(work: Work, manifest: dict) -> bool:
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--no-compile", "--no-cache-dir", "--upgrade", "--target",
                        str(work.site), *map(str, wheels(work, manifest))],
                       capture_output=True, text=True, check=False)
    if r.returncode:
        say(f"install: pip failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        return False
    compile_site(work.site)
    r = subprocess.run([sys.executable, "-c", CHECK_REQUIREMENTS,
                        json.dumps(manifest["requirements"]), str(work.site), "[]",
                        "the project"],
                       capture_output=True, text=True,
                       env=env_for(work), cwd=REPO, check=False)
    if r.returncode:
        say(f"install: the installed packages do not import:\n{r.stderr[-3000:]}")
        return False
    info = json.loads(r.stdout.strip().splitlines()[-1])
    (work.results / "install.json").write_text(json.dumps(info, indent=1))
    say(f"install: {len(wheels(work, manifest))} wheels into {work.site} in "
        f"{time.monotonic() - t:.0f}s; ray {info['ray']}, optuna {info['optuna']}, dashboard "
        f"{info['dashboard']}")
    problems = list(info["problems"])
    if manifest.get("engine"):
        engine = install_engine(work, manifest["engine"])
        if engine is None:
            return False
        problems += [f"engine {engine['name']}: {p}" for p in engine["problems"]]
    for p in problems:
        say(f"install: WARNING {p}")
    work.write("installed.json", {"at": time.time(), "pack_id": manifest["pack_id"],
                                  "problems": problems})
    return True


# Run in the engine's Python (its wrapper): every requirement of the engine, followed through
# the distributions found, met by the engine's site or the image; importlib.metadata only (the
# engine's own imports need the GPU and its CUDA libraries: that is for the server to do).


def install_engine(work: Work, engine: dict, python: str = sys.executable) -> dict | None:
    """Install the engine's wheels into work/engines/<name>/site, apart from the project's
    site, behind work/engines/<name>/python (the machine's python3 with only that site on
    PYTHONPATH: what backend.python names, so the server never sees the project's site), and
    check there that every requirement of the engine is met. Returns the engine's facts (also
    in work/state/engine.json), or None if pip failed."""
    t = time.monotonic()
    home = work.root / "engines" / engine["name"]
    site, wrapper = home / "site", home / "python"
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    r = subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site),
                        *[str(work.payload / w) for w in engine["wheels"]]],
                       capture_output=True, text=True, check=False,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    if r.returncode:
        say(f"install: pip failed for {engine['requirement']}:\n{r.stdout[-2000:]}"
            f"{r.stderr[-2000:]}")
        return None
    compile_site(site, python)
    wrapper.write_text(f"#!/bin/sh\n# {engine['requirement']}: the machine's Python with only "
                       f"the engine's site (gpu_search.py)\nPYTHONPATH={shlex.quote(str(site))} "
                       f"exec {shlex.quote(python)} \"$@\"\n")
    wrapper.chmod(0o755)
    left_out = sorted({e["name"] for e in engine.get("left_out", [])})
    r = subprocess.run([str(wrapper), "-c", CHECK_ENGINE, json.dumps([engine["requirement"]]),
                        str(site), json.dumps(left_out), "the engine"],
                       capture_output=True, text=True, cwd=home, check=False)
    if r.returncode:
        info = {"problems": [f"the requirement check failed: {r.stderr.strip()[-1500:]}"],
                "left_out": [], "versions": {}}
    else:
        info = json.loads(r.stdout.strip().splitlines()[-1])
    facts = {"name": engine["name"], "requirement": engine["requirement"],
             "version": engine.get("version"), "python": str(wrapper), "site": str(site),
             "wheels": len(engine["wheels"]), "problems": info["problems"],
             "left_out": info["left_out"], "versions": info["versions"], "at": time.time()}
    work.write("engine.json", facts)
    say(f"install: {engine['requirement']}: {len(engine['wheels'])} wheels into {site} in "
        f"{time.monotonic() - t:.0f}s; its Python: {wrapper}; {len(info['problems'])} "
        f"problem(s), {len(info['left_out'])} requirement(s) left out by the pack")
    return facts


def env_for(work: Work, src: Path | None = None) -> dict[str, str]:
    src = src or REPO
    env = dict(os.environ)
    env.update(PYTHONPATH=f"{work.site}:{src}", SPECDECODE_CACHE=str(work.cache),
               PYTHONUNBUFFERED="1", PATH=f"{work.site / 'bin'}:{env.get('PATH', '')}")
    return env
