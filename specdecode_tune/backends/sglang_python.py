"""What the backend asks of the Python that runs SGLang's servers (`backend.python`, else this
one): the sglang release it has, and SGLang's own argument check (`sglang_argcheck.py`) run by
it on command lines, before any boot.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from importlib import metadata
from typing import Any

# SGLang's own argument check (backends/sglang_argcheck.py), run by the servers' Python.
ARGCHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sglang_argcheck.py")
ARGCHECK_TIMEOUT_S = 300.0


@functools.cache
def installed_version() -> str | None:
    """The sglang release installed in this Python, or None (read once)."""
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def python_sglang_version(python: str) -> str | None:
    """The sglang release installed for another Python, or None (read once per Python)."""
    try:
        out = subprocess.run([python, "-c", "import importlib.metadata as m; "
                              "print(m.version('sglang'))"], capture_output=True, text=True,
                             timeout=60, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split()
    return lines[-1] if out.returncode == 0 and lines else None


@functools.cache
def argcheck(python: str, job: str) -> dict[str, Any]:
    """SGLang's answers for a job (JSON) run by `python`; cached: a search asks about the
    same command line again (re-measurements, resumed trials)."""
    try:
        out = subprocess.run([python, ARGCHECK], input=job, capture_output=True, text=True,
                             timeout=ARGCHECK_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"sglang": None, "error": f"the argument check did not run: {e}"}
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        err = [ln for ln in out.stderr.splitlines() if ln.strip()]
        return {"sglang": None, "error": f"the argument check failed (exit status "
                                         f"{out.returncode}): {err[-1] if err else 'no output'}"}
    return answer


def without_endpoint(args: list[str]) -> list[str]:
    """Server arguments without `--host`/`--port` (the trial's port is a placeholder here)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("--host", "--port"):
            skip = True
        else:
            out.append(a)
    return out
