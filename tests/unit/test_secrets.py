"""Secrets and exposure: the API key and where servers listen.

The key comes from the environment variable the experiment names (`backend.api_key_env`). It
goes to the client (an Authorization header) and to the server (the simulator reads it with
`--api-key-env NAME`, so only the variable's NAME is on its command line), and it must never
show in the tables, the logs, the report or any process's title. One short trial on the
simulator with a key set is checked for all of them, and while it runs the server must refuse
requests without the key. Servers bind 127.0.0.1 unless the experiment says otherwise, and argv
is always a list.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from specdecode_tune import results
from specdecode_tune.backends import BACKENDS
from specdecode_tune.config import BackendConfig, load_experiment
from specdecode_tune.report import RunDirError, write_report
from specdecode_tune.server import ServerProcess
from specdecode_tune.trial import TrialContext, run_trial

KEY_VAR = "SPECDECODE_TEST_API_KEY"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def experiment(tmp_path: Path) -> Path:
    path = tmp_path / "secret.toml"
    path.write_text(f"""
name = "secret"
[backend]
kind = "sim"
model_path = "Qwen/Qwen3.5-122B-A10B"
tp_size = 2
boot_time_s = 0.2
boot_timeout_s = 20
api_key_env = "{KEY_VAR}"
extra_args = ["--api-key-env", "{KEY_VAR}"]
[backend.flags]
cuda_graph_max_bs = 64
disable_radix_cache = true
[space.speculative_num_steps]
type = "int"
low = 1
high = 6
[workload]
input_len = 32
output_len = 32
[measure]
concurrency = [2]
warmup_s = 0.2
duration_s = 1.0
warmup_requests = 1
request_timeout_s = 10
""")
    return path


def status_of(url: str, key: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with _NO_PROXY.open(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read()


def process_titles() -> dict[int, bytes]:
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out[int(d.name)] = (d / "cmdline").read_bytes() + b"\0" + (d / "comm").read_bytes()
            except OSError:
                pass
    return out


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a listening TCP socket on `port` (from /proc/net/tcp{,6})."""
    found = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, _, hexport = local.rpartition(":")
            if state == "0A" and int(hexport, 16) == port:     # 0A = LISTEN
                found.add(addr)
    return found


def test_the_key_reaches_server_and_client_and_nothing_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture) -> None:
    secret = f"sk-test-{uuid.uuid4().hex}"
    monkeypatch.setenv(KEY_VAR, secret)
    exp = load_experiment(experiment(tmp_path))
    ctx = TrialContext(run_dir=str(tmp_path / "run"), local_dir=tmp_path / "logs",
                       trial_id="secret-trial")
    seen: dict[str, object] = {}

    def while_running(summary, records) -> None:
        # The server is up: find it by its pidfile, then look at it from outside.
        (pidfile,) = (tmp_path / "logs" / "pids").glob("*.json")
        pid = json.loads(pidfile.read_text())["pid"]
        argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
        port = int(argv[argv.index(b"--port") + 1])
        base = f"http://127.0.0.1:{port}"
        seen["argv"] = argv
        seen["listening"] = listening_addresses(port)
        seen["titles"] = [p for p, t in process_titles().items() if secret.encode() in t]
        seen["no_key"] = status_of(base + "/server_info")[0]
        seen["wrong_key"] = status_of(base + "/generate", "not-the-key")[0]
        code, body = status_of(base + "/server_info", secret)
        seen["with_key"] = code
        seen["info_has_key"] = secret.encode() in body
        seen["health"] = status_of(base + "/health")[0]

    caplog.set_level(logging.DEBUG)
    result = run_trial(exp, {"speculative_num_steps": 3}, ctx, on_level=while_running)

    assert result.status == "ok", result.reason
    assert result.levels[0].errors == 0 and result.levels[0].requests > 0   # the client sent it
    assert seen["no_key"] == 401 and seen["wrong_key"] == 401                # the server wants it
    assert seen["with_key"] == 200 and seen["health"] == 200
    assert not seen["info_has_key"], "/server_info reports the key"
    assert KEY_VAR.encode() in seen["argv"] and secret.encode() not in b"\0".join(seen["argv"])
    assert seen["titles"] == [], "the key is in a process title"
    assert seen["listening"] == {"0100007F"}, seen["listening"]             # 127.0.0.1 only

    # Nowhere on disk: tables (read back as values, since Parquet pages are compressed), logs,
    # pidfiles, and the report.
    tables = results.read_tables(ctx.run_dir)
    for table in tables:
        assert secret not in json.dumps(table.to_pylist(), default=str)
    try:
        write_report(ctx.run_dir, experiment=exp)
    except RunDirError as e:          # a single trial may be too little to report on
        pytest.fail(f"no report to check: {e}")
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".parquet"]
    assert any(p.suffix == ".log" for p in files) and any("report" in p.parts for p in files)
    for p in files:
        assert secret.encode() not in p.read_bytes(), f"the key is in {p}"
    out = capsys.readouterr()
    assert secret not in out.out + out.err
    assert secret not in "\n".join(r.getMessage() for r in caplog.records)
    assert secret not in repr(result)


@pytest.mark.parametrize("kind", sorted(BACKENDS))
def test_servers_bind_loopback_unless_the_experiment_says_otherwise(kind: str) -> None:
    backend = BACKENDS[kind]
    for host in ("127.0.0.1", "0.0.0.0"):
        cfg = BackendConfig(kind=kind, model_path="m", speculative_algorithm=None, host=host)
        argv = backend.argv(cfg, {"speculative_num_steps": 0}, 30000)
        assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
        assert argv[argv.index("--host") + 1] == host
        if host == "127.0.0.1":
            assert "0.0.0.0" not in argv and "::" not in argv
    assert BackendConfig(kind=kind, model_path="m").host == "127.0.0.1"


def test_a_shell_string_is_refused() -> None:
    with pytest.raises(ValueError, match="not a shell string"):
        ServerProcess("python -m specdecode_tune.sim --port {port}")


def test_sglang_gets_its_key_on_argv_and_the_launch_command_names_the_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang has no environment form of --api-key (server_args.py 0.5.10): argv carries the
    key at boot; the report's launch command names the variable, never the key."""
    from specdecode_tune.errors import ConfigError

    key = "sk-test-" + uuid.uuid4().hex
    monkeypatch.setenv(KEY_VAR, key)
    cfg = BackendConfig(kind="sglang", model_path="Qwen/Qwen3.5-122B-A10B",
                        api_key_env=KEY_VAR)
    sglang = BACKENDS["sglang"]
    argv = sglang.argv(cfg, {"speculative_num_steps": 0}, 8000)
    assert argv[argv.index("--api-key") + 1] == key
    cmd = sglang.launch_command(cfg, {"speculative_num_steps": 0})
    assert key not in cmd and cmd.endswith(f'--api-key "${KEY_VAR}"')
    # The simulator is named the variable instead (its own flag): no key on its command line.
    sim_argv = BACKENDS["sim"].argv(BackendConfig(kind="sim", model_path="m",
                                                  api_key_env=KEY_VAR), {}, 8000)
    assert key not in " ".join(sim_argv) and "--api-key-env" in sim_argv
    with pytest.raises(ConfigError, match="backend.api_key_env instead"):
        sglang.validate(BackendConfig(kind="sglang", model_path="m",
                                      extra_args=("--api-key", key)))
