"""5. the pipeline: a background process of its own session (gpu_search.py --pipeline, run from
the source snapshot) that outlives the call: scripts/gpu_check.py, the model (made, trained or
carried), the server binary, the readings, the search, then the results; each step's outcome in
state/steps.json, so a step done is not run again. --restart stops it (stop_pipeline)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from . import base, install, models, planning, results
from .base import Work, say


def start_pipeline(work: Work, plan: dict) -> None:
    (work.state / "pipeline.rc").unlink(missing_ok=True)
    planning.validate(plan, work)   # (re)writes the experiment that runs
    work.write("plan.json", plan)
    log = open(work.results / "pipeline.log", "ab")  # noqa: SIM115 - the detached pipeline writes it
    p = subprocess.Popen([sys.executable, str(work.src / "scripts/device/gpu_search.py"),
                          "--work", str(work.root), "--pipeline"], stdin=subprocess.DEVNULL,
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                         cwd=work.src, env=install.env_for(work, work.src))
    work.write("pipeline.pid", p.pid)
    say(f"pipeline: started in the background, pid {p.pid} (check, model, server, search, "
        f"results)")


def pipeline(work: Work) -> int:
    base.WHO[0] = "pipeline"
    plan = work.read("plan.json")
    manifest = work.read("manifest.json")
    steps = work.read("steps.json", {})
    env = install.env_for(work, work.src)

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
            return models.eagle3_models(work, plan, manifest)
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
        results.pack_readings(work)
        # A reading that failed is in readings.json; the search runs either way.
        return True, f"exit {rc}: {base.last_line(work.results / 'readings.log')}"

    def server():
        if not plan["needs_llama_build"]:
            return True, "not a llama.cpp experiment"
        if not install.wait_build(work, 1200):
            return False, "the build did not finish in 20 minutes"
        if base.build_state(work) != "ok":
            tail = (work.results / "build.log").read_text(errors="replace")[-1500:]
            return False, f"the build failed:\n{tail}"
        built = work.cache / "llama.cpp-cuda" / "bin" / "llama-server"
        want = Path(plan["binary"]) if plan["binary"] else built
        if want != built and not want.exists():
            want.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(built, want)
            shutil.copy2(built.with_name("vocab.gguf"), want.with_name("vocab.gguf"))
        return True, f"{want}; {base.last_line(work.results / 'build.log')}"

    def search():
        with open(work.results / "search.log", "a") as out:
            rc = subprocess.run(plan["search_argv"], stdout=out, stderr=subprocess.STDOUT,
                                env=env, cwd=work.src, check=False).returncode
        return rc == 0, f"exit {rc}: {base.last_line(work.results / 'search.log')}"

    ok = (step("check", check) and step("model", model) and step("server", server)
          and step("readings", readings) and step("search", search))
    results.collect(work, plan)
    say(f"pipeline: {'finished' if ok else 'stopped'}")
    return 0 if ok else 1


def stop_pipeline(work: Work) -> None:
    pid = work.read("pipeline.pid")
    if base.alive(pid):
        say(f"restart: interrupting the pipeline (process group {pid})")
        os.killpg(pid, signal.SIGINT)
        for _ in range(60):
            if not base.alive(pid):
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
