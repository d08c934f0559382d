"""The search's pre-flight: everything that can be checked before anything is started or
written, each failure one `ConfigError` line (the CLI prints it and exits 2).

`plan_run` checks, in this order: the run's name and storage (a writable folder, or a URI
pyarrow.fs understands), the backend's program, the backend's own rules and, on a local
cluster, the local files it names, and the API-key variable (`backends.preflight`), what the
server would refuse at every boot where its backend can tell without one (`backends.check_args`
on the baseline's command line: the simulator's CLI checks its flags), then either the Ray head
to join (`--address`) or, on a local cluster, the server's Python package and whether one trial
fits the cluster's GPUs and CPUs. It returns the `RunPlan`: where the run's files go.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..backends import check_args, get_backend, preflight, refusals
from ..config import Experiment
from ..errors import ConfigError
from ..space import BASELINE, first_valid_point, is_baseline, resolve
from ..store import rundir
from ..store.files import check_writable, is_uri


@dataclass(frozen=True)
class RunPlan:
    exp: Experiment
    run_dir: str            # where tables and Tune's state go (a path or a pyarrow.fs URI)
    local_dir: Path         # this node's logs and pidfiles
    storage: str
    name: str
    is_uri: bool


def _check_speculative_points(exp: Experiment) -> None:
    """A refusal the server gives every speculative point is the experiment's, not the
    points': checked, where the backend can tell without a boot, on the experiment's own
    enqueued points and the first valid point of its space. When each is refused with the same
    message, the search stops here, before any boot, quoting the server."""
    points = [dict(p) for p in exp.search.enqueue]
    first = first_valid_point(exp.space, exp.backend.flags)
    if first is not None and first not in points:
        points.append(first)
    resolved = [params for params in (resolve(p, exp.backend.flags) for p in points[:3])
                if not is_baseline(params)]
    messages = []
    for problem in refusals(exp.backend, resolved):
        if problem is None:
            return                          # one speculative point passes: nothing to say
        messages.append(problem)
    if messages and len(set(messages)) == 1:
        advice = get_backend(exp.backend.kind).refusal_advice(messages[0])
        raise ConfigError(f"every speculative point checked ({len(messages)}) is refused the "
                          f"same way, so the refusal is the experiment's, not the points': "
                          f"{messages[0]}" + (f"; {advice}" if advice else ""))


def plan_run(exp: Experiment, args: argparse.Namespace) -> RunPlan:
    """The run's plan from the experiment and the command's `--storage`, `--name` and
    `--address`; raises ConfigError for the first thing that would fail."""
    storage = args.storage or os.environ.get("SPECDECODE_STORAGE") or "runs"
    name = args.name or exp.name
    if any(c in name for c in "/\\\0") or name.startswith("."):
        raise ConfigError(f"--name {name!r}: must be a plain name without slashes")
    uri = is_uri(storage)
    run_dir = storage.rstrip("/") + "/" + name if uri else str((Path(storage) / name).absolute())
    check_writable("--storage", storage, run_dir)
    local_dir = rundir.local_dir(run_dir)
    _check_program(exp)
    # local files only on a local cluster: a joined cluster's nodes have their own
    preflight(exp.backend, local=not args.address)
    # What the server would refuse at every boot, where its backend can tell without a boot
    # (the simulator: its flags, extra_args and fixed flags included, through its own CLI).
    check_args(exp.backend, resolve(BASELINE, exp.backend.flags))
    if args.address:
        _check_address(args.address)
    else:
        # A local cluster: the servers run on this machine, so their package and the
        # cluster's resources can be checked here (a joined cluster's nodes may differ).
        if not exp.backend.binary:
            _check_module(exp)
        _check_resources(exp)
    # Last, since it runs the server's argument check once per point checked.
    _check_speculative_points(exp)
    return RunPlan(exp=exp, run_dir=run_dir, local_dir=local_dir, storage=storage, name=name,
                   is_uri=uri)


def _check_address(address: str) -> None:
    if address in ("auto", "local"):
        return
    host_port = address.removeprefix("ray://")
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--address {address!r}: expected HOST:PORT of a Ray head "
                          f"(e.g. 127.0.0.1:6379), 'auto', or ray://HOST:PORT")
    try:
        with socket.create_connection((host, int(port)), timeout=3):
            pass
    except OSError as e:
        raise ConfigError(f"--address {address!r}: no Ray head answers there "
                          f"({e.strerror or e})") from None


def _check_program(exp: Experiment) -> None:
    program = get_backend(exp.backend.kind).program(exp.backend)
    if os.sep in program or program.startswith("."):
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise ConfigError(f"backend.binary = {program!r}: no executable file there")
    elif shutil.which(program) is None:
        raise ConfigError(f"backend program {program!r} is not on PATH: install it or set "
                          f"backend.binary to its path")


def _check_module(exp: Experiment) -> None:
    """A backend launched as `python -m PKG...` needs PKG importable by this interpreter (the
    one the trials use on a local cluster)."""
    argv = get_backend(exp.backend.kind).argv(exp.backend, resolve(BASELINE, exp.backend.flags),
                                              0)
    if len(argv) > 2 and argv[1] == "-m":
        package = argv[2].split(".")[0]
        if argv[0] == sys.executable:
            found = importlib.util.find_spec(package) is not None
        else:   # backend.python: another interpreter (SGLang in its own venv)
            try:
                found = subprocess.run(
                    [argv[0], "-c", f"import importlib.util, sys; "
                                    f"sys.exit(importlib.util.find_spec({package!r}) is None)"],
                    capture_output=True, timeout=60, check=False,
                    stdin=subprocess.DEVNULL).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                found = False
        if not found:
            raise ConfigError(f"backend.kind = {exp.backend.kind!r} runs python -m {argv[2]}, "
                              f"but {package!r} is not installed for {argv[0]}: install "
                              f"it, or set backend.python or backend.binary")


def _check_resources(exp: Experiment) -> None:
    """On a local cluster a trial that asks for more than the cluster has would wait forever."""
    c, s = exp.cluster, exp.search
    if c.num_gpus is not None and s.gpus_per_trial > c.num_gpus:
        raise ConfigError(f"search.gpus_per_trial = {s.gpus_per_trial}: the local cluster has "
                          f"[cluster] num_gpus = {c.num_gpus}; no trial could ever start")
    cpus = c.num_cpus if c.num_cpus is not None else os.cpu_count()
    if cpus is not None and s.cpus_per_trial > cpus:
        where = "[cluster] num_cpus" if c.num_cpus is not None else "this machine's CPU count"
        raise ConfigError(f"search.cpus_per_trial = {s.cpus_per_trial:g}: the local cluster has "
                          f"{cpus} CPU(s) ({where}); no trial could ever start")
