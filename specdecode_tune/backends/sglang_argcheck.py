"""SGLang's own argument check, run by the Python that launches SGLang's servers.

    PYTHON sglang_argcheck.py < IN.json > OUT.json

IN.json: {"cases": [{"argv": [...], "env": {...}}, ...], "cpu_if_no_gpu": true}
OUT.json: {"sglang": version or null, "cases": [answer, ...]} in the same order; when sglang
does not import in that Python: {"sglang": null, "error": "..."} and no cases.

A case is one server command line without `python -m sglang.launch_server`. It goes through
`sglang.srt.server_args.prepare_server_args(argv)` and then `ServerArgs.check_server_args()`,
the two checks `sglang.launch_server` runs before it loads any weights (the second from
`Engine._launch_subprocesses`; SGLang 0.5.10.post1 `entrypoints/engine.py`). `env` is set for
that case only (SGLang reads its `envs` when asked). With `cpu_if_no_gpu` and no `--device` in
argv, `--device cpu` is appended where torch sees no CUDA device (a CPU machine: CI), so that
SGLang's device probing does not decide the answer.

An answer is
    {"ok": true, "triple": [steps, topk, draft], ...the normalized FIELDS}
    {"ok": false, "refused": true, "error": "...", "exit": argparse's code or null}
    {"ok": false, "refused": false, "error": "..."}
`refused` is true for SGLang's own verdicts: argparse's (exit 2: an unknown flag, a bad value)
and an exception raised in `sglang/srt/server_args.py` (its ValueError/AssertionError checks)
or, from SGLang 0.5.13, in `sglang/srt/arg_groups/` (the speculative checks moved to
`arg_groups/speculative_hook.py`, which `ServerArgs.__post_init__` calls: 0.5.17
server_args.py L3590-3592).
Anything else (a model's config.json not readable here, a hub id with no network, an import
error) is not a verdict on the command line: the caller cannot tell, and boots.

This file imports nothing of the project, so any Python with sglang can run it by its path
(the search's trials run it before a boot; tests/contract runs it in the SGLang venv).
"""

from __future__ import annotations

import os
import sys

# Run by its path, this file's folder comes first on sys.path, and it holds the backend's own
# modules: `sglang.py` would hide SGLang (and a module named as one of the standard library's
# would hide it: `tokenize.py` once did, which `traceback` imports through `linecache`; it is
# `tokenize_endpoint.py` now). Out before anything else is imported.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from importlib import metadata  # noqa: E402
from typing import Any  # noqa: E402

FIELDS = ("speculative_algorithm", "disable_radix_cache", "max_running_requests",
          "mamba_scheduler_strategy", "attention_backend", "page_size",
          "disable_overlap_schedule", "mem_fraction_static", "cuda_graph_max_bs", "device")
SERVER_ARGS_FILE = os.path.join("sglang", "srt", "server_args.py")
ARG_GROUPS_DIR = os.path.join("sglang", "srt", "arg_groups") + os.sep


def _raised_in_server_args(exc: BaseException) -> bool:
    """Whether `exc` was raised by SGLang's argument checks: its innermost frame is in
    server_args.py or in the arg_groups package."""
    frames = traceback.extract_tb(exc.__traceback__)
    name = frames[-1].filename if frames else ""
    return name.endswith(SERVER_ARGS_FILE) or ARG_GROUPS_DIR in name


def _no_gpu() -> bool:
    try:
        import torch
        return not torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - no torch: SGLang's probing decides
        return False


def run_case(case: dict[str, Any], cpu_if_no_gpu: bool = False) -> dict[str, Any]:
    from sglang.srt.server_args import prepare_server_args

    argv = list(case["argv"])
    if cpu_if_no_gpu and "--device" not in argv and _no_gpu():
        argv += ["--device", "cpu"]
    saved = {k: os.environ.get(k) for k in case.get("env", {})}
    os.environ.update(case.get("env", {}))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = prepare_server_args(argv)
            args.check_server_args()
    except SystemExit as e:   # argparse: an unknown flag, a bad value
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return {"ok": False, "refused": e.code == 2, "exit": e.code,
                "error": lines[-1] if lines else f"exit {e.code}"}
    except Exception as e:  # noqa: BLE001 - SGLang's checks raise ValueError/AssertionError/...
        return {"ok": False, "refused": _raised_in_server_args(e), "exit": None,
                "error": f"{type(e).__name__}: {e}".splitlines()[0]}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    out: dict[str, Any] = {"ok": True, "triple": [
        args.speculative_num_steps, args.speculative_eagle_topk,
        args.speculative_num_draft_tokens]}
    out.update({k: getattr(args, k, None) for k in FIELDS})
    return out


def answer(job: dict[str, Any]) -> dict[str, Any]:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    try:
        version = metadata.version("sglang")
        import sglang.srt.server_args  # noqa: F401
    except Exception as e:  # noqa: BLE001 - not installed, or does not import here
        return {"sglang": None, "error": f"{type(e).__name__}: {e}".splitlines()[0]}
    cpu = bool(job.get("cpu_if_no_gpu"))
    return {"sglang": version, "cases": [run_case(c, cpu) for c in job.get("cases", [])]}


def main() -> None:
    out = answer(json.load(sys.stdin))
    sys.stdout.write("\n" + json.dumps(out) + "\n")   # the last line is the answer


if __name__ == "__main__":
    main()
