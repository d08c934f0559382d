"""6. the results: what the pipeline leaves in work/results (collect, pack_readings), the
call's following of its logs (Follower), the status it sums up (status_text), and what one call
brings back in $OUT within the device's limits (deliver; bring_back: --models-back's chunks
first)."""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from . import base, install, models
from .base import LANDSCAPE, LANDSCAPE_ASIDE, MODELS_REPORT, READINGS, T0, Work, say

# The largest file that comes back in $OUT (results.tar.gz drops the trials' logs to fit).
MAX_OUT_FILE = 16 << 20
# What one call brings back from $OUT: at most 8 files, 16 MiB each, 64 MiB together; counted
# here in 4 KiB blocks (as the device counts the files that travel to it), 1 MiB kept spare.
MAX_OUT_FILES = 8
MAX_OUT_TOTAL = 63 << 20


def compiler_caches() -> list[tuple[str, Path]]:
    """Where the engines' compilers leave what they built outside the work dir: Triton's and
    Inductor's cache folders as their defaults put them (an environment variable of theirs,
    else ~/.triton/cache and <tmp>/torchinductor_<user>). Their sizes go into status.txt with
    the work dir's cache/ (vLLM's VLLM_CACHE_ROOT of the GPU experiments is cache/vllm-cache),
    so that carrying them to a later machine, which would spare its first boot of each graph
    class the compile (a speculative boot that compiled took 87-198 s to start against 44-76 s
    for one that loaded, H100, 2026-12-07, and got a smaller KV pool: docs/engines-vllm.md
    section 3), is sized from what a machine wrote."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):   # no name for this uid: Inductor itself would fail the same
        user = str(os.getuid())
    return [("triton", Path(os.environ.get("TRITON_CACHE_DIR")
                            or Path.home() / ".triton" / "cache")),
            ("inductor", Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR")
                              or Path(tempfile.gettempdir()) / f"torchinductor_{user}"))]


def pack_readings(work: Work) -> None:
    """The readings step's folder and the logs beside it, as one file to bring back."""
    tmp = work.results / f"{READINGS}.tmp"
    with tarfile.open(tmp, "w:gz") as t:
        t.add(work.results / "readings", arcname="readings")
        for name in ("readings.log", "models.log", MODELS_REPORT):
            if (work.results / name).is_file():
                t.add(work.results / name, arcname=f"readings/{name}")
    os.replace(tmp, work.results / READINGS)


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
                        str(res / "run.json")], env=install.env_for(work, work.src), cwd=work.src,
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
    lines = [f"machine: {', '.join(base.gpus_here()) or 'no GPU seen'}"]
    if plan:
        lines.append(f"experiment: {plan['experiment']} (ran as {Path(plan['run_experiment']).name}"
                     f"; {plan['gpus_per_trial']} GPU(s) per trial, {plan['max_concurrent']} "
                     f"at a time)")
        lines.append(f"search: {' '.join(plan['search_argv'][1:])}")
    installed = work.read("installed.json")
    if installed:
        lines += [f"install: {p}" for p in installed["problems"]] or ["install: ok"]
    if work.read("models-carried.json"):
        lines.append(f"models: {models.models_line(work)}")
    back = work.read("models-back.json")
    if back:
        lines.append(f"models back (--models-back): {len(back['sent'])} chunk(s) sent, in calls "
                     f"{base.numbers_text(sorted(set(back['sent'].values()))) or '-'}")
    for name, s in steps.items():
        lines.append(f"{name:7} {'ok' if s['ok'] else 'FAILED'} {s['wall_s']:7.1f}s  {s['note']}")
    caches = caches_line(work)
    if caches:
        lines.append(caches)
    calls = [c["wall_s"] for c in work.read("calls.json", [])] + [time.monotonic() - T0]
    lines.append(f"calls: {len(calls)} (this one until now last): "
                 + ", ".join(f"{c:.0f}s" for c in calls))
    return "\n".join(lines) + "\n"


def folder_size(folder: Path) -> tuple[int, int]:
    """The files under `folder` (links not followed) and their bytes."""
    n = size = 0
    for f in folder.rglob("*"):
        if f.is_file() and not f.is_symlink():
            n += 1
            size += f.stat().st_size
    return n, size


def caches_line(work: Work) -> str:
    """What the cache folders hold: each folder of the work dir's cache/ and the compilers'
    own (compiler_caches), as files and MiB; '' where there is none."""
    found = [(d.name, d) for d in sorted(work.cache.iterdir()) if d.is_dir()]
    found += [(f"{name} ({path})", path) for name, path in compiler_caches() if path.is_dir()]
    parts = []
    for name, folder in found:
        n, size = folder_size(folder)
        parts.append(f"{name} {size / 2**20:.1f} MiB in {n} file{'s' * (n != 1)}")
    return f"caches: {'; '.join(parts)}" if parts else ""


# The results, in their order of need (deliver() sends what fits).
RESULT_FILES = ("results.tar.gz", READINGS, "search.log", "report.md", "run.json", LANDSCAPE,
                LANDSCAPE_ASIDE, MODELS_REPORT, "report.html", "gpu_check.txt")


def blocks(size: int) -> int:
    return -(-size // 4096) * 4096


def deliver(work: Work, plan: dict, first: list[Path] | tuple[Path, ...] = (),
            results_first: bool = False) -> list[str]:
    """Write status.txt (also without $OUT: the call's summary prints it), then copy to $OUT
    what fits in one call's limits: status.txt, then `first` (--models-back's manifest and
    chunks), then the results in their order of need (`results_first`: the results before
    `first`); the names sent."""
    (work.results / "status.txt").write_text(status_text(work, plan))
    out = os.environ.get("OUT")
    if not out:
        say(f"results in {work.results} ($OUT is not set)")
        return []
    sent: list[str] = []
    total = 0
    found = tuple(work.results / n for n in RESULT_FILES)
    for src in (work.results / "status.txt",
                *((*found, *first) if results_first else (*first, *found))):
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


def bring_back(work: Work, plan: dict, want: str | list[int] | None,
               ended: bool = False) -> list[int]:
    """deliver(), with --models-back's files first while the pipeline runs (its results come
    again with every later call) and after the results once it has `ended` (they are whole
    and come back now: a call that filled its 8 files with chunks left the landscape's table
    on the machine, 2026-12-07; the chunks left come with the calls that follow, a second
    each); the model chunks still to come back."""
    first = models.models_back_files(work, want)
    sent = deliver(work, plan, first, results_first=ended)
    return models.models_back_sent(work, sent) if first and os.environ.get("OUT") else []
