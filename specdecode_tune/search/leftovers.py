"""What a search driver leaves behind, found and ended by PID.

A search on a local Ray cluster starts many processes: Ray's GCS, raylet, dashboard and its
agents (`ray::DashboardAgent`, `ray::RuntimeEnvAgent`), a forkserver, workers (`ray::IDLE`,
trial actors) and, through the trials, the servers. A clean exit ends them through
`ray.shutdown()`, but a Ctrl-C during Ray's start-up or a SIGKILL of the driver leaves some of
them alive for minutes. Their command lines are rewritten by Ray (setproctitle), so they
cannot be found by name. Two marks find them: before it starts Ray, the driver puts a token of
its own (`RUN_TOKEN_ENV`) in its environment, which every process it starts inherits
(`/proc/<pid>/environ`); and Ray's processes keep files open in the session dir, which Ray
names after the driver's pid (a retitled process may no longer show its environment).

The driver records itself and its token in the run dir (`driver.json` beside the servers'
pidfiles). A later driver of the same run reads that record: if the recorded driver is dead
(pid gone or recycled: its start time differs), whatever still carries its token is ended;
if it is alive, the run is in use and the new driver must not start. Only processes of this
host since its last boot are judged, and only on a local cluster: the processes of a joined
cluster are the cluster's, not the driver's.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import procfs
from ..errors import RunInUse
from ..store.files import write_json
from ..store.rundir import driver_file

__all__ = [
    "DRIVER_MARKER", "KILL_WAIT_S", "RUN_TOKEN_ENV", "driver_processes", "end_driver_processes",
    "end_processes", "forget_driver", "reap_driver", "record_driver",
]

log = logging.getLogger(__name__)

RUN_TOKEN_ENV = "SPECDECODE_RUN_TOKEN"
DRIVER_MARKER = "specdecode_tune.driver"
KILL_WAIT_S = 5.0             # after SIGKILL, how long the kernel may take to finish them


def _session_pattern(driver_pid: int) -> re.Pattern[str]:
    # Ray names a local cluster's session dir after the process that started it:
    # `<temp dir>/session_<date>_<time>_<usec>_<driver pid>` (ray/_private/node.py).
    return re.compile(rf"/session_\d{{4}}-\d{{2}}-\d{{2}}_\d{{2}}-\d{{2}}-\d{{2}}_\d+_"
                      rf"{driver_pid}(?:/|$)")


def _holds_session(pid: int, pattern: re.Pattern[str]) -> bool:
    """Whether the process's command line or one of its open files is in the session dir."""
    args = procfs.cmdline(pid)
    if args is None:
        return False
    return any(pattern.search(item) for item in args + (procfs.open_files(pid) or []))


def driver_processes(token: str, driver_pid: int | None = None, *,
                     exclude: Iterable[int] = ()) -> list[int]:
    """Live pids a driver started: those whose environment holds RUN_TOKEN_ENV=token, and,
    given the driver's pid, those of its local Ray session (Ray retitles its processes, which
    can overwrite what /proc shows of their environment, but they keep files open in the
    session dir). Only this user's processes can be read; others' are not ours."""
    needle = f"{RUN_TOKEN_ENV}={token}".encode()
    pattern = _session_pattern(driver_pid) if driver_pid else None
    skip = set(exclude)
    found = []
    for pid in procfs.pids() or ():
        if pid in skip:
            continue
        env = procfs.environ(pid)
        if env is None:
            continue
        mine = needle in env
        if not mine and pattern is not None:
            mine = _holds_session(pid, pattern)
        if mine and procfs.pid_running(pid):
            found.append(pid)
    return sorted(found)


def end_processes(pids: Iterable[int], grace_s: float = 3.0, poll_s: float = 0.05) -> list[int]:
    """SIGTERM each pid, up to `grace_s` for them to exit, then SIGKILL what is left.
    Returns the pids that were alive when asked to end."""
    alive = [p for p in pids if p > 1 and p != os.getpid() and procfs.pid_running(p)]
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        if not any(procfs.pid_running(p) for p in alive):
            break
        for pid in alive:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait_s
        while any(procfs.pid_running(p) for p in alive) and time.monotonic() < deadline:
            time.sleep(poll_s)
    return alive


def end_driver_processes(token: str, driver_pid: int | None, grace_s: float = 3.0
                         ) -> list[int]:
    """End every process a driver started (`driver_processes`), but this one and its
    ancestors."""
    return end_processes(driver_processes(token, driver_pid, exclude=_ancestors()), grace_s)


def _ancestors() -> set[int]:
    out, pid = set(), os.getpid()
    while pid > 1:
        out.add(pid)
        fields = procfs.stat_fields(pid)
        if fields is None or len(fields) < 2 or not fields[1].isdigit():
            break
        pid = int(fields[1])               # the parent
    return out


def _read(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) and record.get("kind") == DRIVER_MARKER else None


def reap_driver(directory: str | os.PathLike[str]) -> list[int]:
    """End what a dead driver of this run left (by its recorded token); returns the pids ended.
    Raises RunInUse when the recorded driver is alive."""
    path = driver_file(directory)
    record = _read(path)
    if record is None:
        return []
    if record.get("host") != socket.gethostname():
        return []                             # another machine's driver: not ours to judge
    boot = procfs.boot_id()
    if boot is not None and record.get("boot_id") not in (None, boot):
        path.unlink(missing_ok=True)          # before a reboot: its processes are gone
        return []
    pid, start, token = record.get("pid"), record.get("proc_start"), record.get("token")
    if isinstance(pid, int) and pid != os.getpid() and procfs.pid_running(pid) and \
            (start is None or procfs.start_ticks(pid) == start):
        raise RunInUse(pid)
    ended = end_driver_processes(token, pid if isinstance(pid, int) else None) \
        if isinstance(token, str) and token else []
    path.unlink(missing_ok=True)
    return ended


def record_driver(directory: str | os.PathLike[str], token: str) -> Path:
    """Write this driver's record (pid, start time, host, boot, token) into `directory`."""
    path = driver_file(directory)
    write_json(path, {"kind": DRIVER_MARKER, "pid": os.getpid(),
                      "proc_start": procfs.start_ticks(os.getpid()),
                      "host": socket.gethostname(), "boot_id": procfs.boot_id(),
                      "token": token})
    return path


def forget_driver(directory: str | os.PathLike[str]) -> None:
    """Remove this driver's record at a clean exit (a record of another driver stays)."""
    path = driver_file(directory)
    record = _read(path)
    if record is not None and record.get("pid") == os.getpid():
        path.unlink(missing_ok=True)
