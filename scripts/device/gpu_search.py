#!/usr/bin/env python3
"""The GPU route: run an experiment's search on an offline GPU machine, in calls of <10 minutes.

    python3 scripts/device/gpu_search.py [--experiment experiments/llamacpp-gpu.toml]
        [--gpus-per-trial N] [--max-concurrent N|auto] [--max-trials N] [--wait S]
        [--no-check] [--retry | --restart] [--models DIR | --models-back [CHUNKS]]
        [--resume-run TAR]
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

This script holds the command line and each call's flow; the steps are modules of gpu_route/
beside it (gpu_route/__init__.py lists them).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# The steps live beside this script, in gpu_route/ (standard library only, as this script:
# the machine's python3 runs them before any wheel is installed). The script's folder is on
# sys.path when it runs as a script; this puts it there when it is loaded from its path.
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gpu_route import (  # noqa: E402 - the package beside this script, found through HERE
    base,
    install,
    models,
    pipeline,
    planning,
    results,
    staging,
)
from gpu_route.base import LANDSCAPE, READINGS, REPO, T0, Work, say  # noqa: E402

# Not done yet: call again with the same command.
CALL_AGAIN = 75


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
    ap.add_argument("--resume-run", default=None, metavar="TAR",
                    help="go on with a search an earlier session began: the results.tar.gz it "
                         "brought back, as a path in the working tree (e.g. "
                         "build/resume/results.tar.gz), carried once before the pipeline "
                         "starts; its run dir is unpacked where the search resumes it")
    ap.add_argument("--readings", default=None, metavar="ARGS",
                    help="before the search, hold the backend's readings against the live "
                         "server: scripts/device/engine_readings.py with these arguments (one "
                         f"string); its files come back as {READINGS}")
    ap.add_argument("--models", default=None, metavar="DIR",
                    help="carry the trained EAGLE-3 models instead of training them: DIR holds "
                         "part*/manifest.json from scripts/device/models_back.py (e.g. "
                         "build/eagle3-models); carry one part a call")
    ap.add_argument("--models-back", nargs="?", const="next", default=None,
                    type=models.chunks_arg, metavar="CHUNKS",
                    help="bring the trained EAGLE-3 models back in $OUT: one tar cut into "
                         f"chunks of {models.MODELS_CHUNK >> 20} MiB, first in $OUT (4 a call), "
                         f"with {models.MODELS_BACK}; each call the next chunks, or CHUNKS again "
                         f"(e.g. 5,7)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/specdecode-gpu"))
    ap.add_argument("--pipeline", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.search_args = search_args
    work = Work(args.work)
    if args.pipeline:
        rc = pipeline.pipeline(work)
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
    if args.resume_run and args.record:
        say("--resume-run: a search's run dir; a landscape goes on with --record-onto")
        return 2
    gpus = base.gpus_here()
    say(f"machine: {len(gpus)} GPU(s) {gpus[:1]}, {os.cpu_count()} cores, python "
        f"{sys.version.split()[0]}; work dir {work.root}")
    if args.restart:
        pipeline.stop_pipeline(work)
    manifest = staging.stage(work, args.payload)
    models.stage_models(work, args.models)
    if manifest is None and work.read("models-carried.json"):
        return carry_next(parts_to_carry(work, None, args))
    if manifest is None:
        say("nothing staged and no part carried: pack here with "
            "`python3 scripts/device/pack_payload.py`, then carry build/gpu-payload/part1")
        return 2
    # The ShareGPT text (part 1) is unpacked at once: a sharegpt workload validates against
    # it, and the EAGLE-3 test models train on it while the other parts arrive.
    models.sharegpt_site(work, manifest)
    plan = planning.settle_plan(args, work, len(gpus))
    start_jobs(work, plan, manifest)
    resumed = planning.resume_run(args, work, plan)
    if staging.missing_parts(work, manifest) or not resumed:
        return carry_next(parts_to_carry(work, manifest, args))
    if not work.read("installed.json") and not install.install(work, manifest):
        return 1
    return run_pipeline(args, work, plan)


def start_jobs(work: Work, plan: dict, manifest: dict) -> None:
    """The background jobs that may start before every part is staged: the llama.cpp build,
    and the models' training (not when the models are carried: --models)."""
    if plan["needs_llama_build"] and base.build_state(work) == "none":
        if manifest.get("llama_src") and (work.payload / manifest["llama_src"]).exists():
            install.start_build(work, manifest)
        elif (work.cache / "llama.cpp-cuda/bin/llama-server").exists():
            (work.state / "build.rc").write_text("0\n")
    elif plan["needs_llama_build"]:
        say(f"build: {base.build_state(work)}; "
            f"{install.last_progress(work.results / 'build.log')}")
    if plan.get("make_models") and models.models_state(work) == "none" and not (
            Path(plan["model"]) / "config.json").is_file():
        models.start_models(work, plan, manifest)
    elif plan.get("make_models"):
        say(f"models: {models.models_line(work)}")


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
        return [*models.model_parts_to_carry(work),
                f"{(args.payload or staging.PAYLOAD_DIRS)[0]}/part1"]
    src = manifest.get("carried_from", staging.PAYLOAD_DIRS[0])
    resume = [args.resume_run] if args.resume_run and not work.read(planning.RESUMED) else []
    return [*resume, *models.model_parts_to_carry(work),
            *(f"{src}/part{i}" for i in staging.missing_parts(work, manifest))]


def run_pipeline(args: argparse.Namespace, work: Work, plan: dict) -> int:
    """Start the pipeline (or again from its failed step, with --retry), follow it until it
    ends or --wait has passed, and bring back what there is."""
    state = base.pipeline_state(work)
    if state == "none" or (state == "failed" and args.retry):
        if state == "failed":
            say("pipeline: --retry: starting again from the failed step (the steps done are "
                "kept; a search resumes)")
        planning.snapshot(work)
        pipeline.start_pipeline(work, plan)
    if plan.get("make_models") and models.models_awaited(work) \
            and base.pipeline_state(work) == "running":
        # The model step waits for them: following it now would spend the call on a wait
        # that only the next call's carry can end.
        results.deliver(work, plan)
        say(f"NEXT: the pipeline's model step waits for the carried models: call again with "
            f"the same command, carrying {', '.join(models.model_parts_to_carry(work))} (one "
            f"part a call; within 30 s)")
        return CALL_AGAIN
    pos = work.read("follow.json", {})
    follower = results.Follower([work.results / "pipeline.log", work.results / "search.log"], pos)
    while base.pipeline_state(work) == "running" and time.monotonic() - T0 < args.wait:
        follower.poll()
        time.sleep(2)
    follower.poll()
    work.write("follow.json", follower.pos)
    state = base.pipeline_state(work)
    if state == "running":
        steps = work.read("steps.json", {})
        # What is there so far comes back with every call: the device's time may run out
        # before the pipeline ends, and a machine given back keeps nothing.
        results.collect(work, plan)
        if (work.results / "readings").is_dir() and not (work.results / READINGS).is_file():
            results.pack_readings(work)
        left = results.bring_back(work, plan, args.models_back)
        say(f"NEXT: the pipeline is still running ({', '.join(steps) or 'starting'} so far); "
            f"call again with the same command (no carry needed) within 30 s"
            + (f" (--models-back: chunks {base.numbers_text(left)} next)" if left else ""))
        return CALL_AGAIN
    return finished(work, plan, state,
                    results.bring_back(work, plan, args.models_back, ended=True))


def finished(work: Work, plan: dict, state: str, models_left: list[int]) -> int:
    """The pipeline has ended: its summary; DONE, or FAILED; NEXT while model chunks are left."""
    # bring_back() has just written it (the caches' walk once, not twice)
    print((work.results / "status.txt").read_text(), end="")
    search_log = work.results / "search.log"
    if search_log.is_file():
        print("--- the search's last lines ---")
        print("\n".join(search_log.read_text(errors="replace").splitlines()[-15:]))
    say("DONE" if state == "ok" else "FAILED: see status.txt and the logs in results.tar.gz; "
        "fix, then call again with --retry (from the failed step) or --restart (a new search)")
    if models_left:
        say(f"NEXT: the models' chunks {base.numbers_text(models_left)} are still to come back: "
            f"call again with the same command (--models-back, no carry needed) within 30 s")
        return CALL_AGAIN
    return 0 if state == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
