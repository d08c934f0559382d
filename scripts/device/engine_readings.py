#!/usr/bin/env python3
"""Hold the backend's readings against a live server: boot it, keep what it says verbatim, and
beside it what the backend reads from the same server in the same minute.

    python3 scripts/device/engine_readings.py --experiment EXP --out DIR
        [--set name=value ...] [--concurrency 8] [--duration 10]
        [--refuse name=value ...]... [--adaptive '{"1": {"candidate_steps": [5]}, ...}']

Run on the machine where the engine serves (the GPU route runs it as the `readings` step of
gpu_search.py). Every server is started exactly as a trial starts it (the backend's argv and
environment, `ServerProcess`, the backend's failure patterns), bound to 127.0.0.1, and stopped
by its process group before the next one.

What DIR gets (the raw files are the server's own words, kept for tests/data/); which paths
are read is the backend's (`raw_paths`, `load_path`), so the probe serves every engine:

- `healthy.log`: the start-up log of the boot at `--set`;
- `raw/`: the backend's `raw_paths` as answered before any load (SGLang: `server_info.json`,
  `get_load-idle.json`, `health.txt`, `health_generate.txt`, ...; vLLM: `v1_models.json`,
  `health.txt`, `version.json`), `metrics-before.txt` and `metrics-after.txt` (around one
  measured level), `<api>-sse.txt` and `<api>-whole.json` (one answer of the experiment's API,
  streamed line by line and not: SGLang's /generate with its spec fields in the final chunk,
  vLLM's /v1/completions with its usage), `<load path>-drain.jsonl` (the server's own count
  at its `load_path`, polled through the level's end: SGLang's `get_load-drain.jsonl`, vLLM's
  `metrics-drain.jsonl` with only its busy gauges), `nvidia-smi-apps.csv` (the processes
  on the GPUs, by the driver);
- `refused-N.log` per `--refuse` boot (e.g. the memory fraction driven up until the server
  refuses), and `adaptive.log` with `raw/metrics-adaptive-C*.txt` for the `--adaptive` boot;
- `readings.json`: what the backend read (facts, memory lines, the level's summary with the
  acceptance from the final chunks, the in-flight counts beside the raw ones, the telemetry's
  GPUs and processes, each refusal's classification) and the wall time of every step.

The comparison itself (ours vs the server's) is made from these files afterwards, where the
code that reads them can change without another boot.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from specdecode_tune import telemetry  # noqa: E402
from specdecode_tune.backends import get_backend, refusals  # noqa: E402
from specdecode_tune.config import load_experiment  # noqa: E402
from specdecode_tune.errors import ServerStartError  # noqa: E402
from specdecode_tune.load import Api, LevelPlan, measure  # noqa: E402
from specdecode_tune.server import ServerProcess  # noqa: E402
from specdecode_tune.space import resolve  # noqa: E402

T0 = time.monotonic()
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def say(msg: str) -> None:
    print(f"[readings +{time.monotonic() - T0:4.0f}s] {msg}", flush=True)


def parse_sets(items: list[str], space_types: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"engine_readings: --set {item!r}: expected name=value")
        kind = space_types.get(name, "")
        if kind in ("int", "float"):
            out[name] = int(value) if kind == "int" else float(value)
            continue
        try:
            out[name] = json.loads(value)     # numbers, true/false, lists
        except ValueError:
            out[name] = value
    return out


def fetch(url: str, timeout_s: float = 10.0, body: bytes | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, str]:
    """(HTTP status, body text); (0, the error) where nothing answered."""
    req = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with _OPENER.open(req, timeout=timeout_s) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except OSError as e:
        return 0, f"{type(e).__name__}: {e}"


def nvidia_smi_apps() -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory,gpu_uuid",
             "--format=csv"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi did not run: {e}\n"


class Poller(threading.Thread):
    """GET `url` every `every_s` until stopped; each answer as one JSON line with its time
    (only the lines `keep` passes, where given: the busy gauges of a /metrics page)."""

    def __init__(self, url: str, out: Path, every_s: float = 0.05,
                 ours: Any = None, keep: Any = None) -> None:
        super().__init__(daemon=True)
        self.url, self.out, self.every_s, self.ours = url, out, every_s, ours
        self.keep = keep
        self.halt = threading.Event()

    def run(self) -> None:
        with open(self.out, "a") as f:
            while not self.halt.is_set():
                t = time.time()
                status, text = fetch(self.url, 5.0)
                if self.keep is not None:
                    text = "\n".join(ln for ln in text.splitlines() if self.keep(ln))
                row: dict[str, Any] = {"t": round(t, 3), "status": status, "body": text}
                if self.ours is not None:
                    row["ours"] = self.ours()
                f.write(json.dumps(row) + "\n")
                self.halt.wait(self.every_s)


def stream_once(url: str, body: dict[str, Any], out: Path, timeout_s: float) -> None:
    """One streamed answer, every line as the server sent it."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with _OPENER.open(req, timeout=timeout_s) as r, open(out, "wb") as f:
        for line in r:
            f.write(line)


def boot(exp: Any, backend: Any, params: dict[str, Any], log: Path) -> ServerProcess:
    argv = backend.argv(exp.backend, params, "{port}")
    env = {**os.environ, **backend.env(exp.backend, run_dir=str(log.parent))}
    return ServerProcess(argv, env=env, host="127.0.0.1", health_path=backend.health_path,
                         backend=backend, log_path=log,
                         boot_timeout_s=exp.backend.boot_timeout_s)


def healthy(exp: Any, backend: Any, params: dict[str, Any], out: Path, raw: Path,
            args: argparse.Namespace) -> dict[str, Any]:
    found: dict[str, Any] = {"params": params}
    with boot(exp, backend, params, out / "healthy.log") as srv:
        base = srv.base_url
        found["boot_s"] = srv.boot_s
        found["argv"] = backend.argv(exp.backend, params, srv.port)
        for name, path in backend.raw_paths:
            status, text = fetch(base + path, 60.0)
            (raw / name).write_text(text)
            found.setdefault("status", {})[path] = status
        facts = backend.read_facts(base)
        found["facts"] = dataclasses.asdict(facts)
        found["memory"] = backend.memory_facts(srv.log_tail(4 << 20))
        found["in_flight_idle"] = backend.in_flight(base)
        (raw / "nvidia-smi-apps.csv").write_text(nvidia_smi_apps())
        found["server_pids"] = sorted(telemetry.server_pids(srv.pid))

        # One level as a trial measures it, with the scheduler's own count polled beside ours
        # through the level and its drain.
        (raw / "metrics-before.txt").write_text(fetch(base + "/metrics")[1])
        found["metrics_snapshot_before"] = backend.metrics_snapshot(base)
        drain = backend.load_path.strip("/").split("?")[0].replace("/", "_")
        poller = Poller(base + backend.load_path, raw / f"{drain}-drain.jsonl",
                        ours=lambda: backend.in_flight(base), keep=load_lines(backend))
        sampler = telemetry.TelemetrySampler(
            os.environ.get("CUDA_VISIBLE_DEVICES"),
            own_pids=lambda: telemetry.server_pids(srv.pid))
        plan = LevelPlan(concurrency=args.concurrency, warmup_s=2.0,
                         duration_s=args.duration, request_timeout_s=120.0)
        levels: list[Any] = []
        with sampler:
            poller.start()
            sampler.cut()
            measure(base, Api(exp.backend.api, stream=backend.stream_format), exp.workload,
                    [plan], warmup_requests=2,
                    on_level=lambda s, recs: levels.append((s, recs, sampler.cut())))
            time.sleep(args.drain_s)
            poller.halt.set()
            poller.join(10)
        (raw / "metrics-after.txt").write_text(fetch(base + "/metrics")[1])
        found["metrics_snapshot_after"] = backend.metrics_snapshot(base)
        # Where the acceptance comes from the server's counters (vLLM, llama.cpp), what the
        # backend makes of the two snapshots (warm-up requests and the drain included).
        found["window_acceptance"] = backend.window_acceptance(
            found["metrics_snapshot_before"], found["metrics_snapshot_after"])
        summary, records, tele = levels[0]
        found["level"] = dataclasses.asdict(summary)
        found["requests"] = [dataclasses.asdict(r) for r in records[:200]]
        found["telemetry"] = {"available": sampler.available, "why": sampler.why,
                              "gpus": [str(g) for g in sampler.gpus],
                              "verdict": dataclasses.asdict(tele)
                              if dataclasses.is_dataclass(tele) else repr(tele)}
        answers(exp, backend, base, raw, "")
    found["stop"] = srv.stop_outcome
    return found


def load_lines(backend: Any) -> Any:
    """Which lines of the load path's answer the drain poll keeps: a /metrics page only its
    busy gauges (the rest is kept before and after the level); anything else whole."""
    gauges = tuple(getattr(backend, "busy_gauges", ()))
    if backend.load_path != "/metrics" or not gauges:
        return None
    named = tuple(g + c for g in gauges for c in "{ ")     # the gauge itself, labels or not
    return lambda line: line.startswith(named)


def answers(exp: Any, backend: Any, base: str, raw: Path, tag: str) -> None:
    """One answer of the experiment's API kept whole, streamed and not, as the server words it
    (SGLang's /generate: the final chunk's spec fields; an OpenAI API: its usage)."""
    prompt = "The quick brown fox jumps over the lazy dog. " * 4
    api = Api(exp.backend.api, stream=backend.stream_format)
    body = api.body(_Prompt(prompt, 64, exp.workload.temperature, exp.workload.ignore_eos))
    kind = exp.backend.api
    stream_once(base + api.path, body, raw / f"{kind}-sse{tag}.txt", 120.0)
    whole = {k: v for k, v in body.items() if k != "stream_options"} | {"stream": False}
    (raw / f"{kind}-whole{tag}.json").write_text(fetch(
        base + api.path, 120.0, json.dumps(whole).encode(),
        {"Content-Type": "application/json"})[1])


def other_point(exp: Any, backend: Any, params: dict[str, Any], out: Path, raw: Path,
                tag: str) -> dict[str, Any]:
    """Another healthy boot, kept for its words only: its log, the first of the backend's
    raw paths (SGLang's /server_info, vLLM's /v1/models), the answers."""
    with boot(exp, backend, params, out / f"point{tag}.log") as srv:
        name, path = backend.raw_paths[0]
        stem, dot, ext = name.rpartition(".")
        (raw / f"{stem}{tag}{dot}{ext}").write_text(fetch(srv.base_url + path)[1])
        answers(exp, backend, srv.base_url, raw, tag)
        return {"params": params, "boot_s": srv.boot_s,
                "facts": dataclasses.asdict(backend.read_facts(srv.base_url)),
                "memory": backend.memory_facts(srv.log_tail(4 << 20))}


def argcheck(exp: Any, backend: Any, points: list[dict[str, Any]]) -> dict[str, Any]:
    """The engine's own argument check (run by the servers' Python) on these points."""
    return {"points": points, "refusals": refusals(exp.backend, points)}


@dataclasses.dataclass(frozen=True)
class _Prompt:
    text: str
    output_len: int
    temperature: float
    ignore_eos: bool
    messages: tuple[dict[str, str], ...] = ()


def refused(exp: Any, backend: Any, params: dict[str, Any], log: Path) -> dict[str, Any]:
    t = time.monotonic()
    try:
        with boot(exp, backend, params, log) as srv:
            return {"params": params, "booted": True, "boot_s": srv.boot_s,
                    "facts": dataclasses.asdict(backend.read_facts(srv.base_url)),
                    "memory": backend.memory_facts(srv.log_tail(4 << 20))}
    except ServerStartError as e:
        return {"params": params, "booted": False, "kind": e.kind, "reason": e.reason,
                "wall_s": round(time.monotonic() - t, 1)}


def adaptive(exp: Any, backend: Any, params: dict[str, Any], schedule: dict[str, Any],
             out: Path, raw: Path, args: argparse.Namespace) -> dict[str, Any]:
    path = out / "adaptive-config.json"
    path.write_text(json.dumps(schedule))
    settings, why = backend.schedule_params(exp.backend, params, str(path))
    if settings is None:
        return {"skipped": why}
    found: dict[str, Any] = {"params": settings}
    with boot(exp, backend, settings, out / "adaptive.log") as srv:
        found["boot_s"] = srv.boot_s
        for c in (1, args.concurrency):
            plan = LevelPlan(concurrency=c, warmup_s=2.0, duration_s=min(args.duration, 8.0),
                             request_timeout_s=120.0)
            res = measure(srv.base_url, Api(exp.backend.api, stream=backend.stream_format),
                          exp.workload, [plan], warmup_requests=1)
            text = fetch(srv.base_url + "/metrics")[1]
            (raw / f"metrics-adaptive-C{c}.txt").write_text(text)
            found[f"C{c}"] = {"tokens_per_s": res[0][0].output_tok_s,
                              "accept_length": res[0][0].accept_length,
                              "spec_gauges": [ln for ln in text.splitlines()
                                              if ":spec_" in ln and not ln.startswith("#")]}
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="the point of the healthy boot (the rest: the space's first choice)")
    ap.add_argument("--refuse", action="append", default=[], metavar="NAME=VALUE[,NAME=VALUE]",
                    help="a boot expected to be refused: the healthy point with these changed")
    ap.add_argument("--adaptive", default=None,
                    help="a per-batch-size steps file to boot once on top of the point")
    ap.add_argument("--adaptive-set", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--point", action="append", default=[], metavar="NAME=VALUE[,...]",
                    help="another healthy boot (the --set point with these changed), kept for "
                         "its log, the first of the backend's raw paths and one answer")
    ap.add_argument("--argcheck", action="append", default=[], metavar="NAME=VALUE[,...]",
                    help="a point for the engine's own argument check (no boot)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--drain-s", type=float, default=3.0)
    args = ap.parse_args(argv)
    exp = load_experiment(args.experiment)
    backend = get_backend(exp.backend.kind)
    types = {p.name: p.type for p in exp.space}
    base_point = parse_sets(args.set, types)
    params = resolve(base_point, exp.backend.flags)
    out = args.out
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    found: dict[str, Any] = {"experiment": exp.name,
                             "engine_version": backend.engine_version(exp.backend)
                             if hasattr(backend, "engine_version") else None,
                             "steps": {}}

    def step(name: str, fn: Any) -> None:
        t = time.monotonic()
        say(f"{name}: start")
        try:
            found[name] = fn()
            ok = True
        except Exception as e:  # noqa: BLE001 - recorded; the next step still runs
            found[name] = {"error": f"{type(e).__name__}: {e}"}
            ok = False
        found["steps"][name] = {"ok": ok, "wall_s": round(time.monotonic() - t, 1)}
        (out / "readings.json").write_text(json.dumps(found, indent=1, default=str))
        say(f"{name}: {'done' if ok else 'FAILED'} in {time.monotonic() - t:.0f}s"
            + ("" if ok else f": {found[name]['error']}"))

    step("healthy", lambda: healthy(exp, backend, params, out, raw, args))
    for i, change in enumerate(args.point):
        point = {**base_point, **parse_sets(change.split(","), types)}
        step(f"point-{i}", lambda p=point, i=i: other_point(
            exp, backend, resolve(p, exp.backend.flags), out, raw, f"-{i}"))
    if args.argcheck:
        # What the person wrote wins over the space's completion of the triple (resolve sets
        # topk 1's draft tokens to steps + 1): the point is SGLang's to judge as written.
        pts = [{**resolve({**base_point, **asked}, exp.backend.flags), **asked}
               for asked in (parse_sets(c.split(","), types) for c in args.argcheck)]
        step("argcheck", lambda: argcheck(exp, backend, pts))
    for i, change in enumerate(args.refuse):
        point = {**base_point, **parse_sets(change.split(","), types)}
        step(f"refused-{i}", lambda p=point, i=i: refused(
            exp, backend, resolve(p, exp.backend.flags), out / f"refused-{i}.log"))
    if args.adaptive:
        point = {**base_point, **parse_sets(args.adaptive_set, types)}
        step("adaptive", lambda: adaptive(exp, backend, resolve(point, exp.backend.flags),
                                          json.loads(args.adaptive), out, raw, args))
    say(f"readings in {out}")
    return 0 if all(s["ok"] for s in found["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
