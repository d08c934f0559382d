"""The server process: start it, wait until healthy, classify a failed start, end its group.

- `process`: `ServerProcess`, the context manager around one server's lifecycle.
- `failures`: `classify_failure`, why a start failed (with the backend's own log lines).
- `groups`: process groups: `process_group_alive`, `kill_process_group`.
- `pidfiles`: the JSON record of each group, and `reap_orphans` for groups of a killed run.
- `endpoint`: a free port, the base URL, the health probe.

/proc is read through `procfs`; `pid_running` stays importable from here.
"""

from ..procfs import pid_running
from .endpoint import pick_free_port
from .failures import classify_failure
from .groups import StopOutcome, kill_process_group, process_group_alive
from .pidfiles import PIDFILE_MARKER, reap_orphans
from .process import CLASSIFY_TAIL_BYTES, ERROR_TAIL_BYTES, ServerProcess

__all__ = [
    "CLASSIFY_TAIL_BYTES", "ERROR_TAIL_BYTES", "PIDFILE_MARKER", "ServerProcess", "StopOutcome",
    "classify_failure", "kill_process_group", "pick_free_port",
    "pid_running", "process_group_alive", "reap_orphans",
]
