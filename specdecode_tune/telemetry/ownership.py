"""Whose compute processes are on the trial's GPUs: the trial's own, or foreign ones.

NVML reports process ids; the trial's own are `own_pids()` (the server's session, see
`server_pids`) and this process. In a container with its own PID namespace, older drivers
report host pids, which match nothing here: a pid that is not in this PID namespace is then
"unattributed" (a caveat in the note, not a flag), unless the namespace is the host's or one of
the trial's own pids was seen in NVML's list (the driver translates pids), in which case it is a
foreign process of another container.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from .. import procfs
from .nvml import text
from .samples import MIB, GpuProcess


def server_pids(root_pid: int) -> set[int]:
    """The pids of a server started in its own session (`start_new_session=True`): every
    process whose session or process group is `root_pid`, and their descendants. Empty where
    /proc cannot be read."""
    pids = procfs.pids()
    if pids is None:
        return set()
    parent: dict[int, int] = {}
    out = {root_pid}
    for pid in pids:
        fields = procfs.stat_fields(pid)
        if fields is None or len(fields) < 4:
            continue
        ppid, pgrp, session = int(fields[1]), int(fields[2]), int(fields[3])
        parent[pid] = ppid
        if root_pid in (pgrp, session):
            out.add(pid)
    changed = True
    while changed:                     # descendants that left the session (setsid)
        changed = False
        for pid, ppid in parent.items():
            if ppid in out and pid not in out:
                out.add(pid)
                changed = True
    return out


def foreign_processes(listed: Mapping[int, Sequence[Any]], own: set[int], *,
                      same_pid_ns: bool, nvml: Any) -> dict[int, tuple[GpuProcess, ...]]:
    """The processes NVML listed per GPU (cuda index -> its process infos) that are not in
    `own`. `same_pid_ns`: NVML's pids are known to be this namespace's (see the module doc);
    without that evidence a pid that exists here may be a different process (a host pid that
    collides with ours), so none is attributed."""
    out: dict[int, tuple[GpuProcess, ...]] = {}
    for gpu, procs in listed.items():
        found = []
        for p in procs:
            pid = int(p.pid)
            if pid in own:
                continue
            used = getattr(p, "usedGpuMemory", None)
            found.append(GpuProcess(
                pid=pid, name=process_name(pid, nvml, local=same_pid_ns and procfs.visible(pid)),
                used_mib=None if used is None else used / MIB, gpu=gpu,
                attributed=same_pid_ns))
        out[gpu] = tuple(found)
    return out


def process_name(pid: int, nvml: Any, *, local: bool) -> str:
    """The process's name: from /proc where the pid is ours, else as NVML tells it."""
    if local:
        name = procfs.comm(pid)
        if name:
            return name
    try:
        return os.path.basename(text(nvml.nvmlSystemGetProcessName(pid))) or "?"
    except Exception:  # noqa: BLE001 - a name is only decoration; NVML (or a fake) may refuse
        return "?"
