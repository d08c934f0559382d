"""ServerProcess against a real subprocess (tests/fakeserver.py) on 127.0.0.1.

Every test checks by PID that nothing it started is left alive, whatever way the block ended.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import PYTHON, pid_alive

from specdecode_tune.errors import ServerStartError
from specdecode_tune.server import ServerProcess, process_group_alive, reap_orphans

FAKE = str(Path(__file__).resolve().parent.parent / "fakeserver.py")
REPO = Path(__file__).resolve().parent.parent.parent

pytestmark = pytest.mark.timeout(60)


def fake(*args: str) -> list[str]:
    return [PYTHON, FAKE, "--port", "{port}", *args]


def wait_for_file(path: Path, timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} did not appear within {timeout_s} s")


def assert_gone(*pids: int, within_s: float = 0.0) -> None:
    deadline = time.monotonic() + within_s
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if pid_alive(p)] == []


def get(url: str) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=5) as resp:
        return int(resp.status)


# ---------------------------------------------------------------------------------------------
# The ready path


def test_ready_path_gives_a_live_url_then_tears_down(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    log = tmp_path / "server.log"
    with ServerProcess(fake("--healthy-after", "0.4", "--print-env", "CUDA_VISIBLE_DEVICES",
                            "--print-env", "EXTRA_FLAG"),
                       env={"EXTRA_FLAG": "on"}, log_path=log, boot_timeout_s=20) as srv:
        assert srv.base_url == f"http://127.0.0.1:{srv.port}"
        assert get(srv.base_url + "/health") == 200
        assert srv.alive()
        assert srv.boot_s is not None and 0.4 <= srv.boot_s < 10
        assert os.getpgid(srv.pid) == srv.pgid == srv.pid     # its own group
        pid = srv.pid
        text = srv.log_tail()
    assert "env CUDA_VISIBLE_DEVICES=2,3" in text          # the caller's env passes through
    assert "env EXTRA_FLAG=on" in text                     # plus the extras
    assert srv.stop_outcome == "terminated"
    assert_gone(pid)
    assert not srv.alive()
    assert srv.stop() == "terminated"                      # idempotent


def test_late_bind_is_waited_for(tmp_path: Path) -> None:
    with ServerProcess(fake("--bind-delay", "0.6"), log_path=tmp_path / "s.log",
                       boot_timeout_s=20) as srv:
        assert get(srv.base_url + "/health") == 200
        pid = srv.pid
    assert_gone(pid)


def test_ready_check_must_pass_after_health(tmp_path: Path) -> None:
    calls: list[str] = []

    def ready(base_url: str) -> bool:
        calls.append(base_url)
        return len(calls) >= 3

    with ServerProcess(fake(), log_path=tmp_path / "s.log", boot_timeout_s=20,
                       ready_check=ready) as srv:
        assert calls == [srv.base_url] * 3
        pid = srv.pid
    assert_gone(pid)


def test_log_tail_holds_only_this_start(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory (an earlier boot)\n")
    with ServerProcess(fake(), log_path=log, boot_timeout_s=20) as srv:
        assert "earlier boot" not in srv.log_tail()
        assert "fakeserver pid=" in srv.log_tail()
    assert "earlier boot" in log.read_text()               # appended, not truncated


# ---------------------------------------------------------------------------------------------
# Failed starts: each kind, and the group is gone before the error reaches the caller

FAILURES = [
    ("oom", ["--log", "Traceback (most recent call last):", "--log",
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
             "has a total capacity of 79.10 GiB of which 1.12 GiB is free.",
             "--exit-code", "1"], "CUDA out of memory"),
    ("kv_memory", ["--log", "RuntimeError: Not enough memory. Please try to increase "
                   "--mem-fraction-static. Current value: mem_fraction_static=0.62",
                   "--exit-code", "1"], "mem_fraction_static=0.62"),
    ("invalid_args", ["--no-such-flag", "7"], "unrecognized arguments: --no-such-flag 7"),
    ("crashed", ["--log", "RuntimeError: NCCL error: unhandled system error",
                 "--exit-code", "1", "--exit-after", "0.3"], "exit code 1: RuntimeError: NCCL"),
]


@pytest.mark.parametrize(("kind", "args", "in_reason"), FAILURES, ids=[f[0] for f in FAILURES])
def test_failed_start_is_classified_and_torn_down(tmp_path: Path, kind: str, args: list[str],
                                                  in_reason: str) -> None:
    gc = tmp_path / "grandchild.pid"
    srv = ServerProcess(fake("--grandchild", str(gc), *args), log_path=tmp_path / "s.log",
                        boot_timeout_s=20, pidfile=tmp_path / "pids" / "t.json")
    with pytest.raises(ServerStartError) as info, srv:
        pytest.fail("the block must not run for a failed start")
    err = info.value
    assert err.kind == kind
    assert in_reason in err.reason
    assert err.log_tail                                    # travels with the error
    pids = [srv.pid] + ([int(gc.read_text())] if gc.exists() else [])
    assert_gone(*pids)
    assert not (tmp_path / "pids" / "t.json").exists()


def test_missing_program_is_missing_binary(tmp_path: Path) -> None:
    with (pytest.raises(ServerStartError) as info,
          ServerProcess([str(tmp_path / "no-such-server"), "--port", "{port}"],
                        log_path=tmp_path / "s.log", boot_timeout_s=5)):
        pass
    assert info.value.kind == "missing_binary"
    assert "no-such-server" in info.value.reason


def test_missing_python_module_is_missing_binary(tmp_path: Path) -> None:
    with (pytest.raises(ServerStartError) as info,
          ServerProcess([PYTHON, "-m", "no_such_pkg_zz.launch_server", "--port", "{port}"],
                        log_path=tmp_path / "s.log", boot_timeout_s=10)):
        pass
    assert info.value.kind == "missing_binary"
    assert "no_such_pkg_zz" in info.value.reason


def test_boot_timeout_kills_a_hung_server(tmp_path: Path) -> None:
    srv = ServerProcess(fake("--hang"), log_path=tmp_path / "s.log", boot_timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as info, srv:
        pass
    assert time.monotonic() - t0 < 5
    assert info.value.kind == "timeout"
    assert "not healthy after 1 s (no answer" in info.value.reason
    assert_gone(srv.pid)


def test_boot_timeout_while_answering_503(tmp_path: Path) -> None:
    srv = ServerProcess(fake("--healthy-after", "100"), log_path=tmp_path / "s.log",
                        boot_timeout_s=1.0)
    with pytest.raises(ServerStartError) as info, srv:
        pass
    assert info.value.kind == "timeout"
    assert "last answer 503" in info.value.reason
    assert_gone(srv.pid)


def test_boot_timeout_holds_when_the_socket_never_answers(tmp_path: Path) -> None:
    srv = ServerProcess(fake("--mute"), log_path=tmp_path / "s.log", boot_timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as info, srv:
        pass
    assert time.monotonic() - t0 < 3                        # a probe never outlives the deadline
    assert info.value.kind == "timeout"
    assert_gone(srv.pid)


# ---------------------------------------------------------------------------------------------
# Teardown, whatever ends the block


def test_sigterm_ignoring_server_gets_sigkilled(tmp_path: Path) -> None:
    gc = tmp_path / "gc.pid"
    with ServerProcess(fake("--ignore-sigterm", "--grandchild", str(gc),
                            "--grandchild-ignore-sigterm"),
                       log_path=tmp_path / "s.log", boot_timeout_s=20, term_grace_s=0.5) as srv:
        pid, grandchild = srv.pid, int(wait_for_file(gc))
        t0 = time.monotonic()
    assert time.monotonic() - t0 >= 0.5                    # the grace period was given
    assert srv.stop_outcome == "killed"
    assert_gone(pid, grandchild)
    assert not process_group_alive(srv.pgid)


def test_grandchild_in_the_group_is_gone_after_exit(tmp_path: Path) -> None:
    gc = tmp_path / "gc.pid"
    with ServerProcess(fake("--grandchild", str(gc)), log_path=tmp_path / "s.log",
                       boot_timeout_s=20) as srv:
        grandchild = int(wait_for_file(gc))
        assert pid_alive(grandchild)
        assert os.getpgid(grandchild) == srv.pgid
    assert_gone(srv.pid, grandchild)


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_exception_in_the_block_still_tears_down(tmp_path: Path,
                                                 exc: type[BaseException]) -> None:
    gc = tmp_path / "gc.pid"
    srv = ServerProcess(fake("--grandchild", str(gc)), log_path=tmp_path / "s.log",
                        boot_timeout_s=20)
    with pytest.raises(exc), srv:
        wait_for_file(gc)
        raise exc("boom")
    assert_gone(srv.pid, int(gc.read_text()))


def test_generator_close_tears_down(tmp_path: Path) -> None:
    def servers() -> Iterator[ServerProcess]:
        with ServerProcess(fake(), log_path=tmp_path / "s.log", boot_timeout_s=20) as srv:
            yield srv

    gen = servers()
    srv = next(gen)
    assert srv.alive()
    gen.close()                                            # GeneratorExit inside the block
    assert_gone(srv.pid)


def test_interrupt_during_boot_tears_down(tmp_path: Path) -> None:
    def ctrl_c(base_url: str) -> bool:
        raise KeyboardInterrupt

    srv = ServerProcess(fake(), log_path=tmp_path / "s.log", boot_timeout_s=20,
                        ready_check=ctrl_c)
    with pytest.raises(KeyboardInterrupt), srv:
        pass
    assert_gone(srv.pid)


# ---------------------------------------------------------------------------------------------
# Pidfiles and orphans

PARENT = """
import os, sys, time
from specdecode_tune.server import ServerProcess
srv = ServerProcess(sys.argv[3:], pidfile=sys.argv[1], log_path=sys.argv[2], boot_timeout_s=20,
                    die_with_parent=os.environ.get("DIE_WITH_PARENT") == "1")
srv.start()
print(srv.pid, flush=True)
time.sleep(60)
"""


def test_pidfile_is_written_at_start_and_removed_after(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids" / "trial-1.json"
    with ServerProcess(fake(), log_path=tmp_path / "s.log", boot_timeout_s=20,
                       pidfile=pidfile) as srv:
        record = json.loads(pidfile.read_text())
        assert record["pid"] == record["pgid"] == srv.pid
        assert record["argv0"] == PYTHON
        assert record["owner_pid"] == os.getpid()
        assert record["started_at"].endswith("+00:00")
        assert reap_orphans(tmp_path / "pids") == []       # its owner (us) is alive
        assert srv.alive()
    assert not pidfile.exists()


@contextmanager
def killed_parent(tmp_path: Path, name: str, **env: str) -> Iterator[tuple[Path, int, int]]:
    """A parent process starts a server (that spawns a grandchild) and is SIGKILLed without
    cleanup. Yields (pids dir, server pid, grandchild pid); whatever is left is ended after."""
    pids_dir = tmp_path / "pids"
    gc = tmp_path / "gc.pid"
    parent = subprocess.Popen(
        [PYTHON, "-c", PARENT, str(pids_dir / f"{name}.json"), str(tmp_path / "s.log"),
         *fake("--grandchild", str(gc))],
        stdout=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, **env})
    started: list[int] = []
    try:
        started.append(int(parent.stdout.readline() if parent.stdout else ""))
        started.append(int(wait_for_file(gc)))
        parent.send_signal(signal.SIGKILL)                 # the driver dies without cleanup
        parent.wait(timeout=10)
        yield pids_dir, started[0], started[1]
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=10)
        if parent.stdout:
            parent.stdout.close()
        for pid in started:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_reap_orphans_ends_the_server_of_a_killed_parent(tmp_path: Path) -> None:
    with killed_parent(tmp_path, "t7") as (pids_dir, server_pid, grandchild):
        assert pid_alive(server_pid) and pid_alive(grandchild)   # an orphan now
        assert reap_orphans(pids_dir) == [server_pid]
        assert_gone(server_pid, grandchild, within_s=2)
        assert not (pids_dir / "t7.json").exists()
        assert reap_orphans(pids_dir) == []


def test_server_follows_its_parent_and_reap_ends_the_rest(tmp_path: Path) -> None:
    """With die_with_parent (the default) the leader gets SIGTERM when the process that
    started it is SIGKILLed; what the leader spawned is found by its pidfile and ended."""
    with killed_parent(tmp_path, "t9", DIE_WITH_PARENT="1") as (pids_dir, server_pid,
                                                               grandchild):
        assert_gone(server_pid, within_s=5)            # followed its parent
        assert pid_alive(grandchild)                   # its own child is still an orphan
        reap_orphans(pids_dir)
        assert_gone(grandchild, within_s=5)


def test_reap_orphans_ends_survivors_of_a_dead_leader(tmp_path: Path) -> None:
    with killed_parent(tmp_path, "t8") as (pids_dir, server_pid, grandchild):
        os.kill(server_pid, signal.SIGKILL)                # the leader dies, its child lives on
        assert_gone(server_pid, within_s=5)
        assert pid_alive(grandchild)
        assert reap_orphans(pids_dir) == [server_pid]
        assert_gone(grandchild, within_s=2)


def test_reap_orphans_never_kills_a_recycled_pid(tmp_path: Path) -> None:
    # An unrelated process now holds the pid a stale pidfile names.
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    dead = subprocess.Popen([PYTHON, "-c", "pass"])
    dead.wait(timeout=10)
    try:
        pids_dir = tmp_path / "pids"
        pids_dir.mkdir()
        (pids_dir / "stale.json").write_text(json.dumps({
            "kind": "specdecode_tune.server", "pid": other.pid, "pgid": other.pid,
            "argv0": PYTHON, "started_at": "2026-01-01T00:00:00+00:00",
            "host": socket.gethostname(), "boot_id": None, "proc_start": None,
            "owner_pid": dead.pid, "owner_start": None}))
        (pids_dir / "notes.json").write_text('{"unrelated": true}')
        assert reap_orphans(pids_dir) == []
        time.sleep(0.1)
        assert other.poll() is None                        # still running
        assert not (pids_dir / "stale.json").exists()      # the stale record is dropped
        assert (pids_dir / "notes.json").exists()          # other files are left alone
    finally:
        other.kill()
        other.wait(timeout=10)


def test_reap_orphans_on_a_missing_dir(tmp_path: Path) -> None:
    assert reap_orphans(tmp_path / "nothing-here") == []


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))


def test_secrets_never_reach_the_servers_log(tmp_path: Path) -> None:
    """SGLang takes its API key only on its command line and logs its server_args with it;
    a server started with secrets writes its log through a copier that masks them."""
    key = "sk-" + "7f3a9c" * 6
    log_path = tmp_path / "server.log"
    with ServerProcess(fake("--healthy-after", "0.1",
                            "--log", f"server_args=ServerArgs(api_key='{key}', port=1)",
                            "--log", f"again {key}{key} and done"),
                       log_path=log_path, boot_timeout_s=10, secrets=[key]) as srv:
        assert srv.pid is not None
    text = log_path.read_text()
    assert key not in text and key[:-1] not in text
    assert "server_args=ServerArgs(api_key='***', port=1)" in text
    assert "again ****** and done" in text


def test_the_masking_copier_catches_a_secret_split_between_reads(tmp_path: Path) -> None:
    import os

    from specdecode_tune.server.redact import RedactingCopier

    key = "secret-value-123"
    out = tmp_path / "log"
    r, w = os.pipe()
    copier = RedactingCopier(r, open(out, "ab"), [key])  # noqa: SIM115 - the copier closes it
    for part in (b"start secret-va", b"lue-123 mid secre", b"t-value-123", b" end\n"):
        os.write(w, part)
        time.sleep(0.05)            # separate reads on the copier's side
    os.close(w)
    copier.join(5.0)
    assert out.read_bytes() == b"start *** mid *** end\n"
