"""Pidfiles: a JSON record of each server group, and the reaping of groups left orphaned.

`ServerProcess(pidfile=...)` writes a record (atomically) when the server starts and removes
it once the group is gone. If the process that started the server is SIGKILLed, a later run
calls `reap_orphans(dir)`, which ends the groups whose owner is dead after checking that each
pid still is the process recorded. A record:

    {"kind": PIDFILE_MARKER, "pid": leader, "pgid": group, "argv0": what was executed,
     "started_at": ISO time, "host": hostname, "boot_id": the kernel's boot id,
     "proc_start": the leader's start ticks, "owner_pid": the starter,
     "owner_start": the starter's start ticks}

Start ticks and the boot id come from `procfs`; with the pid they name one process, so a
recycled pid is never mistaken for the recorded one.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .. import procfs
from ..store.files import write_json
from .groups import group_members, kill_process_group

log = logging.getLogger("specdecode_tune.server")   # one logger for the whole package

PIDFILE_MARKER = "specdecode_tune.server"


def write_pidfile(path: Path, pid: int, argv0: str) -> None:
    """Record the group that `pid` leads (started as `argv0`) by this process, at `path`."""
    write_json(path, {
        "kind": PIDFILE_MARKER,
        "pid": pid,
        "pgid": pid,    # the server leads its own session, so its group id is its pid
        "argv0": argv0,
        "started_at": datetime.now(UTC).isoformat(),
        "host": socket.gethostname(),
        "boot_id": procfs.boot_id(),
        "proc_start": procfs.start_ticks(pid),
        "owner_pid": os.getpid(),
        "owner_start": procfs.start_ticks(os.getpid()),
    })


def _cmdline_matches(cmdline: Sequence[str], argv0: str) -> bool:
    # A script with a shebang (`vllm`, `fakeserver.py`) shows as [interpreter, script, ...],
    # so argv[0] may be the second item; a PATH lookup may show it bare or as a full path.
    base = os.path.basename(argv0)
    return any(item == argv0 or os.path.basename(item) == base for item in cmdline[:2])


def _owner_alive(record: Mapping[str, Any]) -> bool:
    pid = record.get("owner_pid")
    if not isinstance(pid, int) or not procfs.pid_running(pid):
        return False
    start = record.get("owner_start")
    return start is None or procfs.start_ticks(pid) == start


def reap_orphans(directory: str | os.PathLike[str], *, grace_s: float = 5.0) -> list[int]:
    """End server groups left behind by a run that was killed; return the leader pids ended.

    Reads every pidfile `ServerProcess(pidfile=...)` wrote under `directory` (recursively;
    files are recognised by their content, not their name). A record is acted on only when it
    was written on this host since its last boot and its owner (the process that started the
    server) is dead, so servers of a live run are left alone. Before killing, the leader pid
    must still be the recorded process: same start time and a command line whose first items
    match the recorded argv[0]; a pid recycled by an unrelated process is never signalled. If
    the leader is gone but members of its group live on (orphaned schedulers, engine cores),
    those are ended. Files whose processes are gone are removed; files for live servers of a
    live owner, or of another host, stay.
    """
    root = Path(directory)
    if not root.is_dir():
        return []
    host, boot = socket.gethostname(), procfs.boot_id()
    ended: list[int] = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")):
        try:
            record = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if not isinstance(record, dict) or record.get("kind") != PIDFILE_MARKER:
            continue
        if record.get("host") != host:
            continue                      # another node's server: not ours to judge
        pid, pgid, argv0 = record.get("pid"), record.get("pgid"), record.get("argv0")
        if not (isinstance(pid, int) and isinstance(pgid, int) and isinstance(argv0, str)):
            log.warning("ignoring malformed pidfile %s", path)
            continue
        if boot is not None and record.get("boot_id") not in (None, boot):
            path.unlink(missing_ok=True)  # written before a reboot: its processes are gone
            continue
        if _owner_alive(record):
            continue                      # a live run's server, not an orphan
        start = record.get("proc_start")
        if procfs.pid_running(pid):
            cmdline = procfs.cmdline(pid) or []
            same = _cmdline_matches(cmdline, argv0) and \
                (start is None or procfs.start_ticks(pid) == start)
            if not same:
                log.info("pidfile %s: pid %d is now another process (%s); not touched",
                         path, pid, " ".join(cmdline[:3]))
                path.unlink(missing_ok=True)
                continue
        else:
            members = group_members(pgid) or []
            # Survivors of a dead leader can only have started after it; a member older than
            # the recorded leader means the group id now belongs to someone else.
            starts = [t for t in map(procfs.start_ticks, members) if t is not None]
            if not members or (start is not None and any(t < start for t in starts)):
                path.unlink(missing_ok=True)
                continue
        if pgid <= 1 or pgid == os.getpgrp():
            log.warning("pidfile %s names pgid %d; not touched", path, pgid)
            continue
        try:
            outcome = kill_process_group(pgid, grace_s)
        except PermissionError:
            log.warning("pidfile %s: no permission to signal group %d", path, pgid)
            continue
        if outcome != "stuck":
            path.unlink(missing_ok=True)
            if outcome != "gone":
                ended.append(pid)
    return ended
