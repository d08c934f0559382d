"""The server process as a context manager: start it, wait until healthy, classify a failed
start, and tear down its whole process group.

    with ServerProcess(argv, env={"SGLANG_X": "1"}, log_path=trial_dir / "server.log",
                       boot_timeout_s=900, pidfile=trial_dir / "pids" / "t1.json") as srv:
        measure(srv.base_url, ...)
    # here no process of the server's group is alive, whatever happened in the block

The lifecycle follows vLLM's `benchmarks/sweep`:

- `argv` is a list, never a shell string. The items' placeholders "{port}" and "{host}" become
  the chosen values (plain replacement, so JSON flags such as `--speculative-config '{...}'`
  pass through untouched). `port=None` picks a free port on the bind host.
- The server starts in a new session, so it leads its own process group and everything it
  spawns (SGLang's schedulers and detokenizer, vLLM's engine core) can be ended as one. Its
  stdout and stderr go to one log file, appended; `log_tail` reads only this start's part.
- The environment is the caller's (`CUDA_VISIBLE_DEVICES` in particular) plus `env`.
- Readiness: GET the health URL against a monotonic deadline, checking before each probe that
  the process is alive. 200 is healthy (then the optional `ready_check(base_url)` must say
  True); 503, any other status or no connection means still starting.
- A failed start is torn down first, then raised as `ServerStartError(kind, reason, log_tail)`
  with the kind from `classify_failure(returncode, log_tail)`.
- Teardown on leaving the block for any reason (normal exit, exception, KeyboardInterrupt,
  GeneratorExit): SIGTERM to the group, a grace period, SIGKILL, then a bounded wait until no
  live member of the group remains (`kill_process_group`).
- `pidfile`: a JSON record of the group, written atomically at start and removed once the group
  is gone. If this process is SIGKILLed, a later run calls `reap_orphans(dir)`, which ends the
  groups whose owner is dead after checking that each pid still is the process recorded.

Linux is assumed for `/proc` (zombie filtering, start times, command lines; read through
`procfs`); where `/proc` is missing the checks degrade to `os.killpg(pgid, 0)` alone.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, NoReturn

from .errors import ServerStartError

# /proc is read in procfs; these names stay importable from here (pid_running above all).
from .procfs import boot_id as _boot_id
from .procfs import cmdline as _proc_cmdline
from .procfs import pid_running
from .procfs import pids as _proc_pids
from .procfs import start_ticks as _proc_start_ticks
from .procfs import stat_fields as _proc_stat
from .store.files import write_json

log = logging.getLogger(__name__)

StopOutcome = Literal["gone", "terminated", "killed", "stuck"]

# Runs in the child before the server: ask the kernel for SIGTERM when our parent dies, make
# sure the parent did not die already, then become the server (same pid: exec keeps the
# setting). Spawned with argv, so nothing here is a shell string.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(1)\n"
    "try:\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "except OSError as e:\n"
    "    print(f'cannot execute {sys.argv[2]!r}: {e.strerror}', file=sys.stderr)\n"
    "    sys.exit(127)\n"
)

# How much log the classifier reads, and how much travels with a ServerStartError (it is
# pickled back through Ray, so keep it small; the full log stays on disk).
CLASSIFY_TAIL_BYTES = 64 * 1024
ERROR_TAIL_BYTES = 8 * 1024

PIDFILE_MARKER = "specdecode_tune.server"

# ---------------------------------------------------------------------------------------------
# Failure classification (pure)

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

# A `python -m pkg.mod` whose package is not installed: the interpreter prints
# "<python>: No module named pkg.mod" or "... Error while finding module specification ...".
_MISSING_MODULE = re.compile(
    r"python[\w.]*: (?:No module named \S+|Error while finding module specification.*)")

# GPU memory exhausted (weights, activations, CUDA graphs), in PyTorch's, CUDA's, NCCL's and
# vLLM's words. Deliberately not a bare "out of memory": SGLang's hints say "out-of-memory"
# and "This is not an out-of-memory error", which must not count.
_OOM = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError|HIP out of memory"
    r"|cudaErrorMemoryAllocation|hipErrorOutOfMemory|Cuda failure 'out of memory'"
    r"|Free memory on device .* is less than desired GPU memory utilization")

# The model fits but the KV pool left over is empty or too small (SGLang's memory pool check,
# vLLM's cache-block and max-model-len checks, old and new spellings).
_KV = re.compile(
    r"Not enough memory\. Please try to increase --mem-fraction-static"
    r"|No available memory for the cache blocks"
    r"|KV cache is needed, which is larger than the available KV cache memory"
    r"|larger than the maximum number of tokens that can be stored in KV cache"
    r"|Insufficient memory for KV cache|InsufficientKVCacheMemoryError|insufficient KV cache",
    re.IGNORECASE)

# argparse's own messages (exit code 2).
_ARGPARSE = re.compile(
    r": error: (?:argument |unrecognized arguments|the following arguments are required"
    r"|one of the arguments|invalid choice|ambiguous option)")

_USAGE = re.compile(r"^usage:|error:")

# The exception of a start-up argument check: SGLang asserts and raises ValueError in
# server_args.py; vLLM raises in arg_utils.py / vllm/config/ and pydantic's ValidationError.
_ASSERT_OR_VALIDATION = re.compile(r"(?:^|[\s)])(?:[\w]+\.)*(AssertionError|ValidationError)\b")
_VALUE_ERROR = re.compile(r"(?:^|[\s)])(?:[\w]+\.)*(ValueError|TypeError)\b(?::|$)")
_ARG_CHECK_FRAME = re.compile(
    r'File "[^"]*(?:server_args\.py|arg_utils\.py|cli_args\.py|argparse\.py|/config/[^"]*\.py'
    r'|config\.py)"')

# The last line that names an exception, for the reason of a plain crash.
_EXCEPTION_LINE = re.compile(r"(?:^|[\s)])(?:[\w]+\.)*\w*(?:Error|Exception|Interrupt)\b(?::|$)"
                             r"|Segmentation fault|core dumped|Fatal Python error|Aborted")

_REASON_MAX = 300


def _clean_lines(log_tail: str) -> list[str]:
    return [ln.strip() for ln in _ANSI.sub("", log_tail).splitlines() if ln.strip()]


def _short(line: str) -> str:
    return line if len(line) <= _REASON_MAX else line[: _REASON_MAX - 3] + "..."


def _first(pattern: re.Pattern[str], lines: Sequence[str]) -> str | None:
    # The first match is the root cause; later ones tend to be other ranks or consequences.
    for ln in lines:
        if pattern.search(ln):
            return ln
    return None


def _exit_text(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        text = f"killed by {name}"
        if -returncode == signal.SIGKILL:
            # Nobody here sent it during boot; the kernel's OOM killer is the usual sender.
            text += " (host out of memory? the kernel's OOM killer sends SIGKILL)"
        return text
    return f"exit code {returncode}"


def classify_failure(returncode: int | None, log_tail: str) -> tuple[str, str]:
    """Why a server did not become healthy: (kind, one-line reason).

    `returncode` is the exit status (negative: killed by that signal), or None when the process
    was still alive at the deadline. Kinds are checked in this order: "missing_binary" (exit
    127, or `python -m` of a module that is not installed), "oom", "kv_memory", "invalid_args"
    (argparse's exit 2 and messages, an AssertionError or pydantic ValidationError, a
    ValueError/TypeError raised from an argument-checking file), then "crashed". With
    `returncode=None` the kind is "timeout", unless the log already shows an OOM or KV shortage
    (a server that logged that and then hung is still a config that does not fit). The reason
    is the matching log line, trimmed.
    """
    lines = _clean_lines(log_tail)
    if returncode is not None:
        if returncode == 127:
            return "missing_binary", _short(f"exit code 127 (command not found): "
                                            f"{lines[-1] if lines else '(empty log)'}")
        line = _first(_MISSING_MODULE, lines)
        if line is not None:
            return "missing_binary", _short(line)

    line = _first(_OOM, lines)
    if line is not None:
        return "oom", _short(line)
    line = _first(_KV, lines)
    if line is not None:
        return "kv_memory", _short(line)

    if returncode is None:
        last = lines[-1] if lines else "(empty log)"
        return "timeout", _short(f"alive but not healthy at the deadline; last log line: {last}")

    line = _first(_ARGPARSE, lines)
    if line is not None:
        return "invalid_args", _short(line)
    if returncode == 2:
        usage = _first(_USAGE, lines[::-1])
        return "invalid_args", _short(f"exit code 2 (argument error): "
                                      f"{usage or (lines[-1] if lines else '(empty log)')}")
    line = _first(_ASSERT_OR_VALIDATION, lines)
    if line is not None:
        return "invalid_args", _short(line)
    if any(_ARG_CHECK_FRAME.search(ln) for ln in lines):
        line = _first(_VALUE_ERROR, lines)
        if line is not None:
            return "invalid_args", _short(line)

    exit_text = _exit_text(returncode)
    culprit = next((ln for ln in reversed(lines) if _EXCEPTION_LINE.search(ln)), None)
    if culprit is None:
        culprit = lines[-1] if lines else "(empty log)"
    if returncode == 0:
        exit_text = "exited with code 0 before it was healthy"
    return "crashed", _short(f"{exit_text}: {culprit}")


# ---------------------------------------------------------------------------------------------
# Process groups


def _group_members(pgid: int) -> list[int] | None:
    """Live (non-zombie) pids of group `pgid`, or None where /proc cannot be read."""
    pids = _proc_pids()
    if pids is None:
        return None
    members = []
    for pid in pids:
        fields = _proc_stat(pid)
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
    members = _group_members(pgid)
    return True if members is None else bool(members)


def _signal_group(pgid: int, sig: int) -> None:
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
    _signal_group(pgid, signal.SIGTERM)
    # A stopped process keeps SIGTERM pending until continued; SIGCONT lets it act on it.
    _signal_group(pgid, signal.SIGCONT)
    if _wait_group_gone(pgid, grace_s, poll_s):
        return "terminated"
    _signal_group(pgid, signal.SIGKILL)
    if _wait_group_gone(pgid, kill_wait_s, poll_s):
        return "killed"
    log.warning("process group %d still alive %.1f s after SIGKILL (members: %s)",
                pgid, kill_wait_s, _group_members(pgid))
    return "stuck"


# ---------------------------------------------------------------------------------------------
# Pidfiles and orphans


def _cmdline_matches(cmdline: Sequence[str], argv0: str) -> bool:
    # A script with a shebang (`vllm`, `fakeserver.py`) shows as [interpreter, script, ...],
    # so argv[0] may be the second item; a PATH lookup may show it bare or as a full path.
    base = os.path.basename(argv0)
    return any(item == argv0 or os.path.basename(item) == base for item in cmdline[:2])


def _owner_alive(record: Mapping[str, Any]) -> bool:
    pid = record.get("owner_pid")
    if not isinstance(pid, int) or not pid_running(pid):
        return False
    start = record.get("owner_start")
    return start is None or _proc_start_ticks(pid) == start


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
    host, boot = socket.gethostname(), _boot_id()
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
        if pid_running(pid):
            cmdline = _proc_cmdline(pid) or []
            same = _cmdline_matches(cmdline, argv0) and \
                (start is None or _proc_start_ticks(pid) == start)
            if not same:
                log.info("pidfile %s: pid %d is now another process (%s); not touched",
                         path, pid, " ".join(cmdline[:3]))
                path.unlink(missing_ok=True)
                continue
        else:
            members = _group_members(pgid) or []
            # Survivors of a dead leader can only have started after it; a member older than
            # the recorded leader means the group id now belongs to someone else.
            starts = [t for t in map(_proc_start_ticks, members) if t is not None]
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


# ---------------------------------------------------------------------------------------------
# The server process


def pick_free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on `host` a moment ago (bound to 0, then released).

    Another process may take it before the server binds; the server then fails to bind and the
    start is reported as a crash, which a retry of the trial resolves.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _url_host(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


# Loopback probes must never go through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http_status(url: str, timeout_s: float) -> int | None:
    """The status of GET `url`, or None when nothing answered."""
    try:
        with _OPENER.open(url, timeout=timeout_s) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        e.close()
        return int(e.code)
    except (urllib.error.URLError, OSError, http.client.HTTPException):
        return None


class ServerProcess:
    """One server process group, from start to a verified end. See the module docstring.

    argv: the command as a list; "{port}" / "{host}" in items are replaced.
    env: extra variables on top of this process's environment.
    host: the bind host (the URL uses 127.0.0.1 for "0.0.0.0"). port: None = a free port.
    health_path: polled until 200. ready_check: called with base_url after a 200; must be True.
    log_path: stdout+stderr, appended (None: a kept temp file, the only record of a failure).
    boot_timeout_s: the readiness deadline, from the start of the process.
    pidfile: where to record the group for `reap_orphans` (removed once the group is gone).
    term_grace_s: time between SIGTERM and SIGKILL at teardown.
    die_with_parent: on Linux, the server gets SIGTERM when the thread that started it dies
        (PR_SET_PDEATHSIG, set by a tiny exec shim), so a SIGKILLed trial takes its server
        with it within seconds; pidfiles remain the backstop for the server's own children.

    After start: `base_url`, `port`, `pid`, `pgid`, `boot_s` (seconds to healthy); after the
    end: `stop_outcome` ("gone", "terminated", "killed" or "stuck") and `returncode`. The flat
    keyword signature mirrors `subprocess.Popen`, which callers already know.
    """

    def __init__(
        self,
        argv: Sequence[str | os.PathLike[str]],
        *,
        env: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        health_path: str = "/health",
        log_path: str | os.PathLike[str] | None = None,
        boot_timeout_s: float = 900.0,
        ready_check: Callable[[str], bool] | None = None,
        pidfile: str | os.PathLike[str] | None = None,
        term_grace_s: float = 10.0,
        die_with_parent: bool = True,
    ) -> None:
        if isinstance(argv, (str, bytes)):
            raise ValueError(f"argv must be a list of arguments, not a shell string, "
                             f"got {argv!r}")
        items = [os.fspath(a) for a in argv]
        if not items or not all(isinstance(a, str) for a in items):
            raise ValueError(f"argv must be a non-empty list of str, got {argv!r}")
        if port is None and not any("{port}" in a for a in items):
            raise ValueError("argv has no '{port}' placeholder, so the server cannot learn the "
                             "port picked for it: put '{port}' in argv or pass port=")
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"port must be in 1..65535, got {port=}")
        if boot_timeout_s <= 0:
            raise ValueError(f"boot_timeout_s must be > 0, got {boot_timeout_s=}")
        if term_grace_s < 0:
            raise ValueError(f"term_grace_s must be >= 0, got {term_grace_s=}")
        if not health_path.startswith("/"):
            raise ValueError(f"health_path must start with '/', got {health_path=}")
        self._argv_template = items
        self._env_extra = dict(env or {})
        self.host = host
        self._port_arg = port
        self.health_path = health_path
        self.log_path = Path(log_path) if log_path is not None else None
        self.boot_timeout_s = float(boot_timeout_s)
        self.ready_check = ready_check
        self.pidfile = Path(pidfile) if pidfile is not None else None
        self.term_grace_s = float(term_grace_s)

        self.die_with_parent = die_with_parent and sys.platform.startswith("linux")
        self.port: int | None = None
        self.base_url: str = ""
        self.boot_s: float | None = None
        self.stop_outcome: StopOutcome | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._pgid: int | None = None
        self._log_offset = 0
        self._lock = threading.RLock()

    # -- public state ---------------------------------------------------------------------

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("the server has not been started")
        return self._proc.pid

    @property
    def pgid(self) -> int:
        if self._pgid is None:
            raise RuntimeError("the server has not been started")
        return self._pgid

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def alive(self) -> bool:
        """True while the server's leader process runs."""
        return self._proc is not None and self._proc.poll() is None

    def answers(self, timeout_s: float) -> bool:
        """True once the health path answers 200 within `timeout_s`: the readiness probe,
        asked again after boot (retried: a busy server may say 503 for a moment)."""
        url = self.base_url + self.health_path
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            if _http_status(url, remaining) == 200:
                return True
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        return False

    def log_tail(self, n_bytes: int = 16384) -> str:
        """The last `n_bytes` of this start's log output (earlier starts appended to the same
        file are not included)."""
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(self._log_offset, size - n_bytes))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    # -- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        """Start the server and wait until it is healthy; on failure tear it down and raise
        ServerStartError. Prefer the `with` form, which always stops it."""
        if self._proc is not None:
            raise RuntimeError("a ServerProcess can be started once")
        try:
            self._spawn()
            self._wait_ready()
        except BaseException:
            # A failed start, or Ctrl-C during a long boot: never leave the group behind.
            self.stop()
            raise

    def _spawn(self) -> None:
        self.port = self._port_arg if self._port_arg is not None else pick_free_port(self.host)
        argv = [a.replace("{port}", str(self.port)).replace("{host}", self.host)
                for a in self._argv_template]
        self.base_url = f"http://{_url_host(self.host)}:{self.port}"
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="specdecode-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self._env_extra}
        if self.die_with_parent:
            if shutil.which(argv[0], path=env.get("PATH")) is None:
                raise ServerStartError(
                    "missing_binary", f"{argv[0]!r} not found (no such file, or not on PATH)")
            argv = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]
        with open(self.log_path, "ab") as logf:
            self._log_offset = logf.seek(0, os.SEEK_END)
            try:
                self._proc = subprocess.Popen(
                    argv, env=env, stdin=subprocess.DEVNULL, stdout=logf,
                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
            except FileNotFoundError as e:
                raise ServerStartError(
                    "missing_binary", f"{argv[0]!r} not found (no such file, or not on PATH)",
                    str(e)) from e
            except (PermissionError, NotADirectoryError, IsADirectoryError) as e:
                raise ServerStartError(
                    "missing_binary", f"{argv[0]!r} cannot be executed: {e.strerror}",
                    str(e)) from e
        self._t0 = time.monotonic()
        # start_new_session makes the child a session and group leader: pgid == pid.
        self._pgid = self._proc.pid
        if self.pidfile is not None:
            write_json(self.pidfile, {
                "kind": PIDFILE_MARKER,
                "pid": self._proc.pid,
                "pgid": self._pgid,
                "argv0": argv[0],
                "started_at": datetime.now(timezone.utc).isoformat(),
                "host": socket.gethostname(),
                "boot_id": _boot_id(),
                "proc_start": _proc_start_ticks(self._proc.pid),
                "owner_pid": os.getpid(),
                "owner_start": _proc_start_ticks(os.getpid()),
            })

    def _wait_ready(self) -> None:
        assert self._proc is not None
        url = self.base_url + self.health_path
        deadline = self._t0 + self.boot_timeout_s
        interval = 0.1
        last_status: int | None = None
        while True:
            returncode = self._proc.poll()
            if returncode is not None:
                self._fail(returncode)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._fail(None, last_status)
            last_status = _http_status(url, max(0.05, min(5.0, remaining)))
            if last_status == 200 and (self.ready_check is None
                                       or self._ready_check_passes()):
                if self._proc.poll() is None:   # healthy, and not a stranger on our port
                    self.boot_s = time.monotonic() - self._t0
                    return
            time.sleep(max(0.0, min(interval, deadline - time.monotonic())))
            interval = min(interval * 1.25, 0.25)

    def _ready_check_passes(self) -> bool:
        assert self.ready_check is not None
        try:
            return bool(self.ready_check(self.base_url))
        except (OSError, http.client.HTTPException):
            return False   # connection trouble while starting: not ready yet

    def _fail(self, returncode: int | None, last_status: int | None = None) -> NoReturn:
        """Tear down, classify from the log, raise ServerStartError."""
        self.stop()
        tail = self.log_tail(CLASSIFY_TAIL_BYTES)
        kind, reason = classify_failure(returncode, tail)
        if kind == "timeout":
            answer = "no answer" if last_status is None else f"last answer {last_status}"
            last = _clean_lines(tail)
            reason = _short(f"not healthy after {self.boot_timeout_s:g} s ({answer} from "
                            f"{self.health_path}); killed. Last log line: "
                            f"{last[-1] if last else '(empty log)'}")
        raise ServerStartError(kind, reason, tail[-ERROR_TAIL_BYTES:])

    def stop(self) -> StopOutcome:
        """End the whole process group (idempotent); returns how it ended."""
        with self._lock:
            if self._proc is None or self._pgid is None:
                return "gone"
            if self.stop_outcome is not None:
                return self.stop_outcome
            try:
                outcome = kill_process_group(self._pgid, self.term_grace_s)
            except BaseException:
                # Interrupted during the grace period (a second Ctrl-C): do not wait politely.
                _signal_group(self._pgid, signal.SIGKILL)
                self._reap(1.0)
                raise
            self._reap(1.0 if outcome != "stuck" else 0.0)
            self.stop_outcome = outcome
            if outcome != "stuck" and self.pidfile is not None:
                self.pidfile.unlink(missing_ok=True)
            return outcome

    def _reap(self, timeout_s: float) -> None:
        assert self._proc is not None
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("server pid %d not reaped: still running", self._proc.pid)
