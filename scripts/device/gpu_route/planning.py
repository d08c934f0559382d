"""2. plan: read the experiment, apply --gpus-per-trial / --max-concurrent to a copy of it,
check the machine has the GPUs, and validate it as the search does; the plan (plan.json) says
what the pipeline runs: the search's command (or --record's), the engine, the model to make or
train, whether llama-server must be built."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

from . import base, install
from .base import EAGLE3_MODELS, LANDSCAPE, LANDSCAPE_ASIDE, REPO, Work, refuse, say

# Engines that come in the payload as wheels, each into a site of its own.
ENGINE_KINDS = ("sglang", "vllm")
# The test models specdecode_tune.testing.models makes, named by their shape.
TEST_MODEL = re.compile(r"cycle-llama-d(?P<dim>\d+)-l(?P<layers>\d+)(?:-h(?P<heads>\d+))?"
                        r"(?:-kv(?P<kv_heads>\d+))?-c(?P<cycle>\d+)-n(?P<noise>[0-9.]+)"
                        r"(?:-(?P<dtype>f16|f32))?\.gguf")


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
        derived = set_key(derived, "backend", "python", str(install.engine_python(work, engine)))
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
        # The rows other weights served (record_landscape's <table>.other-weights.parquet)
        # go with it, so that those the recorder sets aside there join them.
        table = work.results / LANDSCAPE
        if args.record_onto and not table.exists():
            onto = REPO / args.record_onto
            if (aside := base.aside_of(onto)).is_file():
                shutil.copyfile(aside, work.results / LANDSCAPE_ASIDE)
            shutil.copyfile(onto, table)
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
    base.copy_sources(work.src)


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
        if base.pipeline_state(work) != "running":
            snapshot(work)
        validate(new, work)
        plan = new
        work.write("plan.json", plan)
    say(f"plan: {plan['experiment']} as {Path(plan['run_experiment']).name}: "
        f"{plan['gpus_per_trial']} GPU(s) per trial, {plan['max_concurrent']} at a time, "
        f"backend {plan['backend']}")
    return plan


# --resume-run: what this machine unpacked (the carried tarball, its run dir, its trials).
RESUMED = "resumed.json"


def resume_run(args: argparse.Namespace, work: Work, plan: dict) -> bool:
    """--resume-run TAR: unpack the run dir of an earlier session's results.tar.gz into
    work/runs, where the search's --storage finds it and resumes it (a machine given back keeps
    nothing, so a search longer than one session's device time goes on in the next one).
    True when there is nothing (more) to do; False while TAR is still to be carried."""
    if not args.resume_run or work.read(RESUMED):
        return True
    run_dir = Path(plan["run_dir"])
    if base.pipeline_state(work) != "none":
        say(f"--resume-run: the pipeline already started on this machine; its run dir "
            f"{run_dir} is kept")
        return True
    src = REPO / args.resume_run
    if not src.is_file():
        return False
    if run_dir.exists():
        raise refuse(f"--resume-run {args.resume_run}: this machine already has a run dir "
                     f"{run_dir}; nothing is unpacked over it (--restart starts it anew)")
    prefix = f"{run_dir.name}/"
    with tarfile.open(src, "r:*") as t:
        members = [m for m in t.getmembers() if m.name.startswith(prefix)]
        if not members:
            names = sorted({m.name.split("/")[0] for m in t.getmembers()} - {"device"})
            raise refuse(f"--resume-run {args.resume_run}: holds no run dir {run_dir.name!r} "
                         f"(the experiment's name; it holds {', '.join(names) or 'none'}): "
                         f"give the results.tar.gz of a search of this experiment")
        tmp = work.runs / f".{run_dir.name}.resume"
        shutil.rmtree(tmp, ignore_errors=True)
        t.extractall(tmp, members=members, filter="data")
    os.replace(tmp / run_dir.name, run_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    trials = sum(1 for p in run_dir.iterdir() if (p / "params.json").is_file())
    work.write(RESUMED, {"tar": args.resume_run, "files": len(members), "trial_dirs": trials})
    say(f"--resume-run: unpacked {run_dir.name} ({len(members)} files, {trials} trial dir(s)) "
        f"from {args.resume_run}: the search resumes it")
    return True
