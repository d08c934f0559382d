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
  with the kind from `classify_failure(returncode, log_tail, backend)` (`failures`): the
  backend, when given, names the engine whose log lines apply; None applies every engine's.
- Teardown on leaving the block for any reason (normal exit, exception, KeyboardInterrupt,
  GeneratorExit): SIGTERM to the group, a grace period, SIGKILL, then a bounded wait until no
  live member of the group remains (`groups.kill_process_group`).
- `pidfile`: a JSON record of the group, written atomically at start and removed once the group
  is gone. If this process is SIGKILLed, a later run calls `reap_orphans(dir)` (`pidfiles`),
  which ends the groups whose owner is dead after checking that each pid still is the process
  recorded.
- `die_with_parent` (Linux): the server is exec'd from a tiny Python shim that first asks the
  kernel for SIGTERM when the starting thread dies (PR_SET_PDEATHSIG), so the argv[0] recorded
  in the pidfile is this interpreter.
"""

from __future__ import annotations

import http.client
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, Self

from ..errors import ServerStartError
from .endpoint import base_url, http_status, pick_free_port
from .failures import classify_failure, clean_lines, short
from .groups import StopOutcome, kill_process_group, signal_group
from .pidfiles import write_pidfile
from .redact import RedactingCopier

if TYPE_CHECKING:
    from ..backends import Backend

log = logging.getLogger("specdecode_tune.server")   # one logger for the whole package

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
    backend: the engine, whose log lines classify a failed start (None: every engine's).

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
        backend: Backend | None = None,
        secrets: Sequence[str] = (),
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
        self.backend = backend
        # Strings the log must never hold (an API key that SGLang takes only on its command
        # line, and logs): with any, the server writes through a masking copier (redact.py).
        self.secrets = tuple(s for s in secrets if s)
        self._copier: RedactingCopier | None = None

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
            if http_status(url, remaining) == 200:
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

    def __enter__(self) -> Self:
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
        self.base_url = base_url(self.host, self.port)
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
            out: Any = logf
            if self.secrets:
                read_fd, out = os.pipe()
            try:
                self._proc = subprocess.Popen(
                    argv, env=env, stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
            except FileNotFoundError as e:
                raise ServerStartError(
                    "missing_binary", f"{argv[0]!r} not found (no such file, or not on PATH)",
                    str(e)) from e
            except (PermissionError, NotADirectoryError, IsADirectoryError) as e:
                raise ServerStartError(
                    "missing_binary", f"{argv[0]!r} cannot be executed: {e.strerror}",
                    str(e)) from e
            finally:
                if self.secrets:
                    os.close(out)     # the server holds the write end now
            if self.secrets:
                self._copier = RedactingCopier(read_fd, open(self.log_path, "ab"),  # noqa: SIM115 - the copier closes it
                                               self.secrets)
        self._t0 = time.monotonic()
        # start_new_session makes the child a session and group leader: pgid == pid.
        self._pgid = self._proc.pid
        if self.pidfile is not None:
            write_pidfile(self.pidfile, self._proc.pid, argv[0])

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
            last_status = http_status(url, max(0.05, min(5.0, remaining)))
            # Healthy, and not a stranger on our port (our process still runs).
            if last_status == 200 and (self.ready_check is None
                                       or self._ready_check_passes()) \
                    and self._proc.poll() is None:
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
        kind, reason = classify_failure(returncode, tail, self.backend)
        if kind == "timeout":
            answer = "no answer" if last_status is None else f"last answer {last_status}"
            last = clean_lines(tail)
            reason = short(f"not healthy after {self.boot_timeout_s:g} s ({answer} from "
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
                signal_group(self._pgid, signal.SIGKILL)
                self._reap(1.0)
                raise
            self._reap(1.0 if outcome != "stuck" else 0.0)
            if self._copier is not None:
                self._copier.join(2.0)    # the last lines reach the log before it is read
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
