"""What every step of the GPU route shares: the work folder (Work), the call's lines (say,
refuse), the background jobs' states, the machine's GPUs, and the names of the files the
results come back as."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# scripts/device (build_llama_cuda.sh and the other scripts beside gpu_search.py), and the
# repository's root above it.
DEVICE = Path(__file__).resolve().parents[1]
REPO = DEVICE.parents[1]


def aside_of(table: Path) -> Path:
    """Where the recorder sets aside the rows of `table` that other weights served
    (benchmarks/record_landscape.py `aside_path`; a test holds the two to one name)."""
    return table.with_name(f"{table.stem}.other-weights{table.suffix}")


# Result files brought back in $OUT beside the search's (results.RESULT_FILES).
LANDSCAPE = "landscape.parquet"   # --record: the recorded table, brought back
LANDSCAPE_ASIDE = aside_of(Path(LANDSCAPE)).name   # ... and the rows other weights served
READINGS = "readings.tar.gz"      # --readings: the live server's words and ours, brought back
MODELS_REPORT = "eagle3-acceptance.json"
# Where the route trains the EAGLE-3 test models (specdecode_tune.testing.eagle3) when an
# experiment names them: ${SPECDECODE_CACHE}/eagle3-models/{target,eagle3}.
EAGLE3_MODELS = "eagle3-models"
# The call's clock (its lines' +Ns, its --wait) and who says the lines: gpu_search, or the
# background pipeline (pipeline.pipeline).
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


def copy_sources(dest: Path) -> None:
    """Copy the repository's sources (not its .git, builds, runs or caches) to dest, a folder
    a background job runs from while later calls re-send the repository."""
    shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns(
        ".git", "build", "runs", "__pycache__", "*.egg-info", ".whl", ".gl", ".dev*"))


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


def pipeline_state(work: Work) -> str:
    return job_state(work, "pipeline")


def last_line(path: Path) -> str:
    try:
        lines = [s for s in path.read_text(errors="replace").splitlines() if s.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def numbers_text(numbers: list[int]) -> str:
    """1,2,3,5 -> "1-3,5"."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs)
