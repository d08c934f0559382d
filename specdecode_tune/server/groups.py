"""Process groups: whether one still has a live member, and ending all of it.

A server started in a new session leads its own process group, so everything it spawns
(SGLang's schedulers and detokenizer, vLLM's engine core) can be ended as one: SIGTERM to the
group, a grace period, SIGKILL, then a bounded wait until no live member remains.

Members are read through `procfs` (zombie filtering); where /proc is missing the checks
degrade to `os.killpg(pgid, 0)` alone.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Literal

from .. import procfs

log = logging.getLogger("specdecode_tune.server")   # one logger for the whole package

StopOutcome = Literal["gone", "terminated", "killed", "stuck"]


def group_members(pgid: int) -> list[int] | None:
    """Live (non-zombie) pids of group `pgid`, or None where /proc cannot be read."""
    pids = procfs.pids()
    if pids is None:
        return None
    members = []
    for pid in pids:
        fields = procfs.stat_fields(pid)
        if fields is not None and len(fields) > 2 and int(fields[2]) == pgid \
                and fields[0] != "Z":
            members.append(pid)
    return members


def process_group_alive(pgid: int) -> bool:
    """True while group `pgid` has a member that is not a zombie.

    `os.killpg(pgid, 0)` alone is not enough: it succeeds while only zombies remain, and an
    orphaned grandchild stays a zombie for as long as PID 1 fails to reap it (common in
    containers). Members are checked through /proc where it exists.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    members = group_members(pgid)
    return True if members is None else bool(members)


def signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to group `pgid`; a group already gone is not an error."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _wait_group_gone(pgid: int, timeout_s: float, poll_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if not process_group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def kill_process_group(pgid: int, grace_s: float = 10.0, *, kill_wait_s: float = 5.0,
                       poll_s: float = 0.05) -> StopOutcome:
    """End every process of group `pgid`: SIGTERM, up to `grace_s` to exit, then SIGKILL and up
    to `kill_wait_s` for the kernel to finish them.

    Returns "gone" (nothing was alive), "terminated" (gone after SIGTERM), "killed" (SIGKILL
    was needed) or "stuck" (still alive after SIGKILL, e.g. in uninterruptible sleep inside a
    GPU driver; logged as a warning). Zombies count as gone: only their parent can reap them.
    """
    if pgid <= 1:
        raise ValueError(f"pgid must be > 1, got {pgid=}")
    if pgid == os.getpgrp():
        raise ValueError(f"refusing to kill this process's own group, got {pgid=}")
    if not process_group_alive(pgid):
        return "gone"
    signal_group(pgid, signal.SIGTERM)
    # A stopped process keeps SIGTERM pending until continued; SIGCONT lets it act on it.
    signal_group(pgid, signal.SIGCONT)
    if _wait_group_gone(pgid, grace_s, poll_s):
        return "terminated"
    signal_group(pgid, signal.SIGKILL)
    if _wait_group_gone(pgid, kill_wait_s, poll_s):
        return "killed"
    log.warning("process group %d still alive %.1f s after SIGKILL (members: %s)",
                pgid, kill_wait_s, group_members(pgid))
    return "stuck"
