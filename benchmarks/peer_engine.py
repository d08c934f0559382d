"""A stand-in engine that replays a landscape to a peer's own code (issue 34). Test tooling.

A peer (vllm-tuner, vllm-optimizer, SGLang's bench_speculative, vLLM's sweep) launches its
server itself. `write_bin(dir, ...)` writes a `vllm` executable (and `python -m
sglang.launch_server` is answered by `main(["sglang", ...])`) that takes the peer's real argv,
reads the speculative config and the flags (`benchmarks/peer_argv.py`), and:

- refuses at start-up (exit 1, the recording's reason on stderr) where the boot it replays was
  refused or failed;
- else serves `/health`, `/v1/models`, `/v1/completions` and `/v1/chat/completions` (streamed
  or not), `/get_server_info` and `/metrics` on 127.0.0.1, answering at the speed of ONE boot
  of that point: on a recorded table the repeat `landscapes.Landscape.draw(key, seed, nth)`
  picks, on a simulator profile what `search_efficiency.measure(truth, key, seed, nth)`
  measures, `nth` counting this search's boots of the point (kept in the state folder), so
  every tool meets the same noise as our samplers do for the same seed. No speculative config
  is the baseline (`draw_baseline` / `measured_baseline`).

A level between the recorded concurrencies is served at the log-log interpolation of the two
around it, one past the last at the last (the recorded server's running limit). The speed is
the boot's tok/s times `SPEEDUP` (an env setting, default 1): a faster clock keeps the ranking
and lets many seeds run.

`python benchmarks/peer_engine.py oracle LANDSCAPE SEED` answers one JSON line per argv line
(the same replay without HTTP): the drivers that run a peer's search code for many seeds ask it
what the engine would have served.

Environment of the executable: SPECDECODE_PEER_LANDSCAPE (a simulator profile name or a
recorded table's path), SPECDECODE_PEER_SEED, SPECDECODE_PEER_STATE (a folder: boot counts and
a log of boots), SPECDECODE_PEER_SPEEDUP.
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import peer_argv  # noqa: E402

ENV_LANDSCAPE = "SPECDECODE_PEER_LANDSCAPE"
ENV_SEED = "SPECDECODE_PEER_SEED"
ENV_STATE = "SPECDECODE_PEER_STATE"
ENV_SPEEDUP = "SPECDECODE_PEER_SPEEDUP"


@dataclass(frozen=True)
class Served:
    """What one boot serves: the outcome and, where it measured, per level tok/s."""

    key: tuple[Any, ...] | None          # None: the baseline
    status: str                          # ok / infeasible / failed
    reason: str
    tok_s: dict[int, float]
    accept_length: dict[int, float] = field(default_factory=dict)
    snapped: dict[str, Any] = field(default_factory=dict)   # asked -> served, where they differ

    @property
    def ok(self) -> bool:
        return self.status == "ok" and bool(self.tok_s)

    def at(self, concurrency: float) -> float:
        """tok/s at `concurrency`: log-log between the recorded levels, the last one past it."""
        return interpolate(self.tok_s, concurrency)


def interpolate(tok_s: dict[int, float], c: float) -> float:
    levels = sorted(tok_s)
    if not levels:
        return 0.0
    if c <= levels[0]:
        return tok_s[levels[0]] * (c / levels[0] if c < levels[0] else 1.0)
    if c >= levels[-1]:
        return tok_s[levels[-1]]
    for lo, hi in zip(levels, levels[1:], strict=False):
        if lo <= c <= hi:
            f = (math.log(c) - math.log(lo)) / (math.log(hi) - math.log(lo))
            return math.exp((1 - f) * math.log(tok_s[lo]) + f * math.log(tok_s[hi]))
    return tok_s[levels[-1]]


def _nearest(values: Sequence[Any], v: Any) -> Any:
    return min(values, key=lambda x: (abs(float(x) - float(v)), float(x)))


class Replay:
    """One landscape, one seed: the boot a settings dict gets (nth counted per point)."""

    def __init__(self, landscape: str, seed: int, counts: dict[str, int] | None = None):
        self.name = landscape
        self.seed = int(seed)
        self.counts: dict[str, int] = counts if counts is not None else {}
        self.recorded = landscape.endswith(".parquet")
        if self.recorded:
            import landscapes
            self.land = landscapes.landscape_of(str(Path(landscape).resolve()))
            self.names = self.land.names
            self.values = {n: tuple(v for v in vals if not (n == peer_argv.STEPS and v == 0))
                           for n, vals in self.land.axes}
        else:
            import search_efficiency as se
            self.se = se
            self.truth = se.truth_of(landscape)
            specs = {s.name: s for s in self.truth.exp.space}
            self.names = tuple(specs)
            self.values = {n: tuple(s.values()) for n, s in specs.items()}

    # ---------------------------------------------------------------- settings -> point

    def key_of(self, settings: dict[str, Any]) -> tuple[tuple[Any, ...] | None, dict[str, Any]]:
        """(the landscape's key, or None for the baseline; {axis: (asked, served)} where the
        asked value is not on the landscape's axis and the nearest one is served)."""
        if int(settings.get(peer_argv.STEPS, 0) or 0) == 0:
            return None, {}
        snapped: dict[str, Any] = {}
        point: dict[str, Any] = {}
        for n in self.names:
            vals = self.values[n]
            asked = settings.get(n)
            if asked is None:       # not expressible by this argv: the axis' value nearest
                asked = {peer_argv.MEM: peer_argv.VLLM_MEM_DEFAULT,
                         peer_argv.NGRAM_N: peer_argv.VLLM_NGRAM_DEFAULT}.get(n, vals[0])
                if n == peer_argv.DRAFT and not self.recorded:
                    asked = None
            if asked is None:
                continue
            served = _nearest(vals, asked)
            if abs(float(served) - float(asked)) > 1e-6:
                snapped[n] = (asked, served)
            point[n] = served
        if self.recorded:
            if peer_argv.TOPK in point:
                # A recorded EAGLE table keys each point as the server runs it: topk 1 at
                # steps + 1 draft tokens, whatever was asked; a tree too small for its draft
                # tokens is left as asked (no recorded point: refused at boot).
                from specdecode_tune.space import as_served
                point = as_served(point) or point
            return tuple(point[n] for n in self.names), snapped
        se = self.se
        from specdecode_tune.space import resolve
        if int(point.get(peer_argv.TOPK, 1)) == 1:
            point.pop(peer_argv.DRAFT, None)
        return se.key_of(resolve(point, self.truth.exp.backend.flags)), snapped

    # ---------------------------------------------------------------- a boot

    def boot(self, settings: dict[str, Any]) -> Served:
        key, snapped = self.key_of(settings)
        if key is None:
            return self._baseline()
        tag = json.dumps(list(key))
        nth = self.counts.get(tag, -1) + 1
        self.counts[tag] = nth
        if self.recorded:
            if key not in self.land.points:
                return Served(key, "infeasible", f"{dict(zip(self.names, key, strict=True))} "
                              f"is not on the recorded grid", {}, snapped=snapped)
            b = self.land.draw(key, self.seed, nth)
            acc = {int(lv["concurrency"]): float(lv["accept_length"])
                   for lv in b.levels if "accept_length" in lv}
            status = b.status if b.status != "ok" or b.tok_s else "failed"
            return Served(key, status, b.reason, dict(b.tok_s), acc, snapped)
        if key not in self.truth.points:
            return Served(key, "infeasible", f"{settings} is not a valid configuration "
                          f"(draft tokens over steps * topk + 1)", {}, snapped=snapped)
        tok_s, attr = self.se.measure(self.truth, key, self.seed, nth)
        if not tok_s:
            return Served(key, "infeasible", str(attr.get("reason", "refused")), {},
                          snapped=snapped)
        acc = {int(c): float(lv["accept_length"]) for c, lv in attr["levels"].items()}
        return Served(key, "ok", "", tok_s, acc, snapped)

    def _baseline(self) -> Served:
        if self.recorded:
            b = self.land.draw_baseline(self.seed)
            return Served(None, b.status, b.reason, dict(b.tok_s))
        return Served(None, "ok", "", self.se.measured_baseline(self.truth, self.seed))

    def truth_score(self, key: tuple[Any, ...]) -> float:
        """The landscape's true score of a point (INFEASIBLE_SCORE where refused)."""
        if self.recorded:
            return self.land.scores[key]
        return self.truth.points[key].score

    @property
    def best(self) -> float:
        return self.land.best if self.recorded else self.truth.best


# ---------------------------------------------------------------------------- the server


class _State:
    def __init__(self, served: Served, model: str, speedup: float, chunk: int = 16):
        self.served = served
        self.model = model
        self.speedup = speedup
        self.chunk = chunk
        self.lock = threading.Lock()
        self.inflight = 0
        self.requests = 0
        self.tokens = 0


def _handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:      # quiet
            pass

        def _json(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path in ("/health", "/health_generate", "/ping"):
                self._json(200, {})
            elif path == "/v1/models":
                self._json(200, {"object": "list", "data": [
                    {"id": state.model, "object": "model", "owned_by": "peer-engine"}]})
            elif path == "/get_server_info":
                self._json(200, {"model_path": state.model, "stand_in": True,
                                 "served_tok_s": state.served.tok_s,
                                 "accept_length": state.served.accept_length})
            elif path == "/metrics":
                data = (f"vllm:num_requests_running {state.inflight}\n"
                        f"vllm:num_requests_waiting 0\n"
                        f"stand_in_requests_total {state.requests}\n"
                        f"stand_in_tokens_total {state.tokens}\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            else:
                self._json(404, {"error": f"no route {path}"})

        def do_POST(self) -> None:
            path = self.path.split("?")[0]
            n = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(n) or b"{}")
            except json.JSONDecodeError:
                self._json(400, {"error": "body is not JSON"})
                return
            if path not in ("/v1/completions", "/v1/chat/completions"):
                self._json(404, {"error": f"no route {path}"})
                return
            self._complete(body, chat=path.endswith("chat/completions"))

        def _complete(self, body: dict[str, Any], chat: bool) -> None:
            tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
            stream = bool(body.get("stream"))
            with state.lock:
                state.inflight += 1
                state.requests += 1
            try:
                self._serve(tokens, stream, chat, body)
            finally:
                with state.lock:
                    state.inflight -= 1
                    state.tokens += tokens

        def _pace(self, k: int) -> None:
            """Sleep the time `k` tokens take for one request among those in flight."""
            with state.lock:
                c = max(1, state.inflight)
            rate = state.served.at(c) * state.speedup / c
            time.sleep(k / max(rate, 1e-9))

        def _serve(self, tokens: int, stream: bool, chat: bool, body: dict[str, Any]) -> None:
            kind = "chat.completion" if chat else "text_completion"
            usage = {"prompt_tokens": 0, "completion_tokens": tokens, "total_tokens": tokens}
            if not stream:
                self._pace(tokens)
                choice = ({"index": 0, "message": {"role": "assistant",
                                                   "content": "x " * tokens},
                           "finish_reason": "length"} if chat else
                          {"index": 0, "text": "x " * tokens, "finish_reason": "length"})
                self._json(200, {"id": "cmpl-stand-in", "object": kind,
                                 "model": state.model, "choices": [choice], "usage": usage})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            sent = 0
            with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            try:
                while sent < tokens:
                    k = min(state.chunk if sent else 1, tokens - sent)
                    self._pace(k)
                    sent += k
                    last = sent >= tokens
                    text = "x " * k
                    choice = ({"index": 0, "delta": {"content": text},
                               "finish_reason": "length" if last else None} if chat else
                              {"index": 0, "text": text,
                               "finish_reason": "length" if last else None})
                    chunk: dict[str, Any] = {"id": "cmpl-stand-in", "object": kind,
                                             "model": state.model, "choices": [choice]}
                    if last or with_usage:
                        chunk["usage"] = {"prompt_tokens": 0, "completion_tokens": sent,
                                          "total_tokens": sent}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.close_connection = True

    return H


def _load_counts(state_dir: Path) -> dict[str, int]:
    p = state_dir / "counts.json"
    return json.loads(p.read_text()) if p.exists() else {}


def serve(argv: Sequence[str], env: dict[str, str] | None = None) -> int:
    """The stand-in for one boot: parse the argv, replay, refuse or serve until SIGTERM."""
    env = dict(os.environ if env is None else env)
    parsed = peer_argv.parse(argv)
    state_dir = Path(env.get(ENV_STATE) or ".")
    state_dir.mkdir(parents=True, exist_ok=True)
    counts = _load_counts(state_dir)
    replay = Replay(env[ENV_LANDSCAPE], int(env.get(ENV_SEED, "0")), counts)
    served = replay.boot(parsed["settings"])
    (state_dir / "counts.json").write_text(json.dumps(replay.counts))
    with (state_dir / "boots.jsonl").open("a") as f:
        f.write(json.dumps({"argv": list(argv), "settings": parsed["settings"],
                            "key": None if served.key is None else list(served.key),
                            "status": served.status, "tok_s": served.tok_s,
                            "snapped": {k: list(v) for k, v in served.snapped.items()}}) + "\n")
    if not served.ok:
        print(f"ERROR stand-in engine: the recorded boot of {parsed['settings']} was "
              f"{served.status}: {served.reason or 'no level measured'}", file=sys.stderr,
              flush=True)
        return 1
    if parsed["host"] not in ("127.0.0.1", "localhost"):
        print(f"stand-in engine: binding 127.0.0.1, not {parsed['host']}", file=sys.stderr)
    speedup = float(env.get(ENV_SPEEDUP, "1") or 1)
    state = _State(served, parsed["model"] or "stand-in", speedup)
    httpd = ThreadingHTTPServer(("127.0.0.1", parsed["port"]), _handler(state))
    httpd.daemon_threads = True
    print(f"INFO stand-in engine serving {parsed['settings']} on 127.0.0.1:{parsed['port']} "
          f"({served.tok_s})", flush=True)
    import signal

    def _stop(*_: Any) -> None:
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        httpd.serve_forever(poll_interval=0.05)
    finally:
        httpd.server_close()
    return 0


def oracle(landscape: str, seed: int, stdin: Any = None, stdout: Any = None) -> int:
    """One JSON answer per line: what the engine would serve for that boot. A line is the argv
    (a JSON list) or {"argv": [...], "concurrency": C}; with C the answer's "at" is the tok/s
    served at that concurrency (`Served.at`)."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    replay = Replay(landscape, seed)
    for line in stdin:
        if not line.strip():
            continue
        asked = json.loads(line)
        argv = asked["argv"] if isinstance(asked, dict) else asked
        parsed = peer_argv.parse(argv)
        s = replay.boot(parsed["settings"])
        stdout.write(json.dumps({"key": None if s.key is None else list(s.key),
                                 "status": s.status if s.ok else (s.status if s.status != "ok"
                                                                  else "failed"),
                                 "reason": s.reason, "tok_s": {str(c): v for c, v in
                                                               s.tok_s.items()},
                                 "accept_length": {str(c): v for c, v in
                                                   s.accept_length.items()},
                                 "snapped": {k: list(v) for k, v in s.snapped.items()},
                                 **({"at": s.at(float(asked["concurrency"])) if s.ok else 0.0}
                                    if isinstance(asked, dict) and "concurrency" in asked
                                    else {})}) + "\n")
        stdout.flush()
    return 0


def write_bin(folder: Path, landscape: str, seed: int, state: Path, speedup: float = 1.0,
              python: str = sys.executable) -> Path:
    """A folder with the `vllm` executable (put it first on PATH) for one search."""
    folder.mkdir(parents=True, exist_ok=True)
    me = Path(__file__).resolve()
    for name in ("vllm",):
        exe = folder / name
        exe.write_text(f"#!/bin/sh\n{ENV_LANDSCAPE}='{landscape}' {ENV_SEED}={int(seed)} "
                       f"{ENV_STATE}='{state}' {ENV_SPEEDUP}={speedup} "
                       f"exec '{python}' '{me}' vllm \"$@\"\n")
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


STAND_IN_VERSION = "0.30.0+stand-in"     # what `vllm --version` answers (vllm-optimizer pins 0.30)


def bench_serve(argv: Sequence[str]) -> int:
    """`vllm bench serve ...` against a running stand-in: the result JSON vLLM writes
    (`--save-result`), with the tok/s the stand-in serves at `--max-concurrency` (the replayed
    boot's figure, read from its /get_server_info) instead of a wall-clock run: the landscape's
    number, at once."""
    import urllib.request

    _, flags = peer_argv._flags(list(argv))
    host, port = str(flags.get("host", "127.0.0.1")), int(flags.get("port", 8000))
    if flags.get("base_url"):
        base = str(flags["base_url"]).rstrip("/")
    else:
        base = f"http://{host}:{port}"
    with urllib.request.urlopen(base + "/get_server_info", timeout=30) as r:
        info = json.loads(r.read())
    tok_s = {int(c): float(v) for c, v in info["served_tok_s"].items()}
    c = int(flags.get("max_concurrency", 0) or 0) or max(tok_s)
    n = int(flags.get("num_prompts", 1000))
    out_len = int(flags.get("random_output_len", 128))
    in_len = int(flags.get("random_input_len", 1024))
    served = interpolate(tok_s, c)
    duration = n * out_len / max(served, 1e-9)
    tpot = 1000.0 * min(c, n) / max(served, 1e-9)
    result: dict[str, Any] = {
        "backend": str(flags.get("backend", "vllm")), "model_id": str(flags.get("model", "")),
        "num_prompts": n, "completed": n, "failed": 0, "max_concurrency": c,
        "request_rate": "inf", "dataset_name": str(flags.get("dataset_name", "random")),
        "duration": duration, "total_input_tokens": n * in_len, "total_output_tokens": n * out_len,
        "request_throughput": n / duration, "output_throughput": served,
        "total_token_throughput": served * (in_len + out_len) / out_len, "stand_in": True}
    for stem, value in (("ttft", tpot), ("tpot", tpot), ("itl", tpot),
                        ("e2el", tpot * out_len)):
        for stat_ in ("mean", "median", "p50", "p90", "p95", "p99"):
            result[f"{stat_}_{stem}_ms"] = value
    print(f"============ Serving Benchmark Result (stand-in) ============\n"
          f"Output token throughput (tok/s): {served:.2f}", flush=True)
    if flags.get("save_result") or flags.get("result_dir"):
        folder = Path(str(flags.get("result_dir", ".")))
        folder.mkdir(parents=True, exist_ok=True)
        name = str(flags.get("result_filename", "result.json"))
        (folder / name).write_text(json.dumps(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["oracle"] and len(args) == 3:
        return oracle(args[1], int(args[2]))
    if args[:1] == ["vllm"] and args[1:2] in (["--version"], ["-v"]):
        print(STAND_IN_VERSION)
        return 0
    if args[:1] == ["vllm"] and args[1:3] == ["bench", "serve"]:
        return bench_serve(args[3:])
    if args[:1] == ["vllm"]:
        return serve(args[1:]) if args[1:2] == ["serve"] else _unsupported(args)
    if args[:1] == ["sglang"]:
        return serve(args[1:])
    return _unsupported(args)


def _unsupported(args: Sequence[str]) -> int:
    print(f"stand-in engine: unsupported command {list(args)!r} (serves `vllm serve ...` and "
          f"`sglang ...launch_server` argv, or `oracle LANDSCAPE SEED`)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
