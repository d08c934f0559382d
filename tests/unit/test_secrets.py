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

from specdecode_tune import store
from specdecode_tune.backends import BACKENDS
from specdecode_tune.config import BackendConfig, load_experiment
from specdecode_tune.errors import KeyRefused
from specdecode_tune.records import FACTS_UNREAD
from specdecode_tune.report import RunDirError, write_report
from specdecode_tune.server import ServerProcess
from specdecode_tune.store import read_table
from specdecode_tune.trial import TrialContext, run_trial

KEY_VAR = "SPECDECODE_TEST_API_KEY"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def experiment(tmp_path: Path, *, client_key: bool = True, server_key: bool = True,
               name: str = "secret") -> Path:
    """The simulator with a key: the experiment names it (`client_key`: the trial sends it, and
    the simulator is given it), and/or the simulator is given it on its own (`server_key`)."""
    path = tmp_path / f"{name}.toml"
    client = f'api_key_env = "{KEY_VAR}"' if client_key else ""
    server = f'extra_args = ["--api-key-env", "{KEY_VAR}"]' if server_key else ""
    path.write_text(f"""
name = "{name}"
[backend]
kind = "sim"
model_path = "Qwen/Qwen3.5-122B-A10B"
tp_size = 2
boot_time_s = 0.2
boot_timeout_s = 20
{client}
{server}
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
    # ... and so did the trial's own reads: the facts (/server_info wants the key).
    assert result.facts.max_total_num_tokens and result.facts.max_running_requests
    assert FACTS_UNREAD not in result.facts.extra, result.facts.extra
    assert seen["no_key"] == 401 and seen["wrong_key"] == 401                # the server wants it
    assert seen["with_key"] == 200 and seen["health"] == 200
    assert not seen["info_has_key"], "/server_info reports the key"
    assert KEY_VAR.encode() in seen["argv"] and secret.encode() not in b"\0".join(seen["argv"])
    assert seen["titles"] == [], "the key is in a process title"
    assert seen["listening"] == {"0100007F"}, seen["listening"]             # 127.0.0.1 only

    # Nowhere on disk: tables (read back as values, since Parquet pages are compressed), logs,
    # pidfiles, and the report.
    tables = store.read_tables(ctx.run_dir)
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


def test_a_trial_with_a_key_reads_the_same_server_facts_as_one_without(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/server_info wants the key as SGLang's does: the facts read must send it, or the KV
    model, the running limit and the saturation notes lose their input."""
    monkeypatch.setenv(KEY_VAR, f"sk-test-{uuid.uuid4().hex}")
    facts = {}
    for keyed in (True, False):
        exp = load_experiment(experiment(tmp_path, client_key=keyed, server_key=keyed,
                                         name=f"facts-{keyed}"))
        ctx = TrialContext(run_dir=str(tmp_path / f"run-{keyed}"),
                           local_dir=tmp_path / f"logs-{keyed}", trial_id=f"facts-{keyed}")
        result = run_trial(exp, {"speculative_num_steps": 3}, ctx)
        assert result.status == "ok", result.reason
        facts[keyed] = result.facts
    with_key, without = facts[True], facts[False]
    assert without.max_total_num_tokens and without.max_running_requests   # what there is to read
    assert (with_key.max_total_num_tokens, with_key.max_running_requests) == \
        (without.max_total_num_tokens, without.max_running_requests)
    assert with_key.extra == without.extra and FACTS_UNREAD not in with_key.extra
    # The row keeps them too (the KV model and the report read the table).
    (row,) = read_table(str(tmp_path / "run-True"), "trials").to_pylist()
    assert row["max_total_num_tokens"] == without.max_total_num_tokens


def test_a_keyed_server_whose_key_the_trial_lacks_fails_the_trial_at_its_facts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server is given a key the experiment does not name: the trial's first read is
    refused, and the trial says so before measuring anything (no silent None, no level of
    401s)."""
    monkeypatch.setenv(KEY_VAR, f"sk-test-{uuid.uuid4().hex}")
    exp = load_experiment(experiment(tmp_path, client_key=False, server_key=True))
    ctx = TrialContext(run_dir=str(tmp_path / "run"), local_dir=tmp_path / "logs",
                       trial_id="no-key")
    result = run_trial(exp, {"speculative_num_steps": 3}, ctx)
    assert result.status == "failed"
    assert result.reason == ("the server refused the API key: GET /server_info answered http "
                             "401 (no API key was sent: name its variable in "
                             "backend.api_key_env)"), result.reason
    assert result.levels == ()
    assert list((tmp_path / "logs" / "pids").glob("*.json")) == []   # the server was stopped


# ---------------------------------------------------------------------------------------------
# Every engine's reads carry the key to every path that wants it (a stand-in server that guards
# its paths as each engine does; its facts are fixed).

GUARDS = {
    # SGLang (utils/auth.py): every path but /health* and /metrics*.
    "sglang": lambda path: not path.startswith(("/health", "/metrics")),
    # vLLM (AuthenticationMiddleware): every /v1 path.
    "vllm": lambda path: path.startswith("/v1"),
    # llama-server (middleware_validate_api_key): every path but its public ones.
    "llamacpp": lambda path: path not in ("/health", "/v1/health", "/models", "/v1/models"),
}
METRICS = "\n".join([
    '# TYPE vllm:cache_config_info gauge',
    'vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1.0',
    "vllm:num_requests_running 0", "vllm:num_requests_waiting 0",
    "vllm:spec_decode_num_drafts_total 4", "vllm:spec_decode_num_accepted_tokens_total 6",
    "llamacpp:requests_processing 0", "llamacpp:requests_deferred 0",
    'sglang:generation_tokens_total{is_streaming="true"} 9', "sglang:spec_verify_calls_total 3",
    "llamacpp:spec_decode_num_drafts_total 4", "llamacpp:spec_decode_num_accepted_tokens_total 6",
]) + "\n"
ANSWERS = {
    "/server_info": {"max_total_num_tokens": 4096,
                     "internal_states": [{"effective_max_running_requests_per_dp": 7}]},
    "/get_load": [{"num_reqs": 0}],
    "/v1/models": {"data": [{"id": "m", "max_model_len": 2048}]},
    "/props": {"total_slots": 4, "default_generation_settings": {"n_ctx": 1024}},
}
EXPECTED = {"sglang": (4096, 7), "vllm": (1600, None), "llamacpp": (4096, 4)}


@pytest.fixture
def keyed_server():
    """start(kind, key, known=True) -> (base URL, [(path, had the key)]); `known=False` answers
    404 on every facts path. Bound to 127.0.0.1, in a thread of this process."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    servers = []

    def start(kind: str, key: str, known: bool = True):
        seen: list[tuple[str, bool]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                had = self.headers.get("Authorization") == f"Bearer {key}"
                seen.append((self.path, had))
                if GUARDS[kind](self.path) and not had:
                    body, code, ctype = b'{"error": "Unauthorized"}', 401, "application/json"
                elif self.path == "/metrics":
                    body, code, ctype = METRICS.encode(), 200, "text/plain"
                elif known and self.path in ANSWERS:
                    body, code = json.dumps(ANSWERS[self.path]).encode(), 200
                    ctype = "application/json"
                else:
                    body, code, ctype = b'{"error": "Not Found"}', 404, "application/json"
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}", seen

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("kind", sorted(GUARDS))
def test_every_read_of_every_engine_brings_the_key_where_it_is_wanted(
        kind: str, keyed_server) -> None:
    key = f"sk-test-{uuid.uuid4().hex}"
    headers = {"Authorization": f"Bearer {key}"}
    backend = BACKENDS[kind]
    base, seen = keyed_server(kind, key)
    facts = backend.read_facts(base, 5.0, headers=headers)
    busy = backend.in_flight(base, headers, 5.0)
    snapshot = backend.metrics_snapshot(base, headers)
    assert (facts.max_total_num_tokens, facts.max_running_requests) == EXPECTED[kind]
    assert FACTS_UNREAD not in facts.extra
    assert busy == 0
    assert snapshot is not None                         # SGLang's from 0.5.13
    guarded = [path for path, _ in seen if GUARDS[kind](path)]
    assert guarded, "the reads asked no path this engine guards: nothing was tested"
    assert all(had for path, had in seen if GUARDS[kind](path)), seen

    # Without the key: the guarded facts read is refused out loud, never a silent None.
    with pytest.raises(KeyRefused, match=r"answered http 401 \(no API key was sent"):
        backend.read_facts(base, 5.0)


@pytest.mark.parametrize("kind", sorted(GUARDS))
def test_facts_an_engine_does_not_give_are_marked_unread(kind: str, keyed_server) -> None:
    key = f"sk-test-{uuid.uuid4().hex}"
    base, _ = keyed_server(kind, key, known=False)
    facts = BACKENDS[kind].read_facts(base, 5.0, headers={"Authorization": f"Bearer {key}"})
    assert "http 404" in facts.extra[FACTS_UNREAD], facts.extra


@pytest.mark.parametrize(("kind", "variable"), [("vllm", "VLLM_API_KEY"),
                                                ("llamacpp", "LLAMA_API_KEY")])
def test_vllm_and_llama_server_get_the_key_in_their_environment_not_on_argv(
        kind: str, variable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both read their key from an environment variable of their own (vLLM's envs.py,
    llama.cpp's common/arg.cpp): the experiment's key is handed over under that name, so the
    server wants the key the trial sends, and argv and the launch command never hold it."""
    key = f"sk-test-{uuid.uuid4().hex}"
    monkeypatch.setenv(KEY_VAR, key)
    backend = BACKENDS[kind]
    cfg = BackendConfig(kind=kind, model_path="/m.gguf", api_key_env=KEY_VAR,
                        speculative_algorithm="ngram")
    assert backend.env(cfg, run_dir="/tmp/x")[variable] == key
    assert key not in " ".join(backend.argv(cfg, {"speculative_num_steps": 2}, 8000))
    command = backend.launch_command(cfg, {"speculative_num_steps": 2})
    assert key not in command and command.endswith(f'--api-key "${KEY_VAR}"')
    plain = BackendConfig(kind=kind, model_path="/m.gguf", speculative_algorithm="ngram")
    assert variable not in backend.env(plain, run_dir="/tmp/x")
