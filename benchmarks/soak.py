"""Soak: 256 concurrent streams against the simulator for a minute, with nothing lost.

The project's own client (`load.measure`, one closed-loop level) streams from the simulator
(`python -m specdecode_tune.sim`, started through `ServerProcess` on a loopback port) at 256
concurrent requests for at least 60 s. The simulator runs a copy of the seed profile whose
memory lets 256 requests run at once, so all 256 streams are live, not queued.

What it checks, and prints:
- no request lost or double-counted: the client's records against the simulator's own
  counters in /metrics, read before and after (requests finished, requests aborted when the
  window ended, tokens generated); every record's index is unique; no request failed;
- client memory flat: this process's RSS sampled every half second (start, peak, end, and the
  growth over the second half of the run, when the records kept are the only thing that grows);
- figures: requests, tokens/s, chunks/s, the server's running requests (peak), client CPU.

    python benchmarks/soak.py                 # 256 streams, 60 s window (about 75 s)
    python benchmarks/soak.py --smoke-test    # 32 streams, 5 s, for CI

Exit code 0 when every check holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from specdecode_tune.config import WorkloadSpec
from specdecode_tune.load import LevelPlan, measure
from specdecode_tune.server import ServerProcess
from specdecode_tune.sim.profile import PROFILE_DIR

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def scrape(base_url: str) -> dict[str, float]:
    with _NO_PROXY.open(base_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(sglang:\w+)\{[^}]*\} (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def soak_profile(directory: Path, streams: int) -> Path:
    """The seed profile with a per-request KV reservation small enough for `streams` running."""
    text = (PROFILE_DIR / "seed-qwen35-122b.toml").read_text()
    text = re.sub(r"^request_reserve_tokens = .*$", "request_reserve_tokens = 512", text,
                  flags=re.M)
    text = text.replace('name = "seed-qwen35-122b"', 'name = "soak"')
    path = directory / "soak.toml"
    path.write_text(text)
    return path


class Sampler(threading.Thread):
    """RSS of this process and the server's running requests, every `interval_s`."""

    def __init__(self, base_url: str, interval_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.base_url = base_url
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []     # (monotonic time, RSS MB)
        self.running_peak = 0.0
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.samples.append((time.monotonic(), rss_mb()))
            try:
                self.running_peak = max(self.running_peak,
                                        scrape(self.base_url).get("sglang:num_running_reqs", 0))
            except OSError:
                pass
            self.stop_event.wait(self.interval_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--duration", type=float, default=60.0, help="measurement window, s")
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--smoke-test", action="store_true", help="32 streams for 5 s")
    args = ap.parse_args(argv)
    if args.smoke_test:
        args.streams, args.duration = 32, 5.0
    warmup_s = 5.0 if not args.smoke_test else 1.0

    with tempfile.TemporaryDirectory() as tmp:
        profile = soak_profile(Path(tmp), args.streams)
        argv_sim = [sys.executable, "-m", "specdecode_tune.sim", "--profile", str(profile),
                    "--boot-time", "0.3", "--tp-size", "2", "--enable-metrics",
                    "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
                    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
                    "--mem-fraction-static", "0.88", "--cuda-graph-max-bs", "64",
                    "--max-running-requests", str(args.streams), "--disable-radix-cache",
                    "--host", "{host}", "--port", "{port}"]
        with ServerProcess(argv_sim, log_path=Path(tmp) / "sim.log", boot_timeout_s=60,
                           term_grace_s=5) as srv:
            before = scrape(srv.base_url)
            sampler = Sampler(srv.base_url)
            rss_start = rss_mb()
            sampler.start()
            cpu0, t0 = time.process_time(), time.monotonic()
            plan = LevelPlan(concurrency=args.streams, warmup_s=warmup_s,
                             duration_s=args.duration, request_timeout_s=300)
            spec = WorkloadSpec(input_len=128, output_len=args.output_len, seed=1)
            ((summary, records),) = measure(srv.base_url, "generate", spec, [plan],
                                            warmup_requests=0)
            wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
            time.sleep(1.0)            # the server notices the window's cancellations
            sampler.stop_event.set()
            sampler.join()
            after = scrape(srv.base_url)
            rss_end = rss_mb()
            server_limit = before.get("sglang:num_running_reqs")   # (0 at rest; see peak)
            del server_limit

    # -- the client's account -------------------------------------------------------------------
    completed = [r for r in records if r.error is None and r.output_tokens == args.output_len
                 and r.end <= warmup_s + summary.duration_s + 1e-9]
    failed = [r for r in records if r.error is not None]
    cut = [r for r in records if r.error is None and r not in completed]
    indices = [r.index for r in records]
    chunks = sum(len(r.chunk_gaps) + (1 if r.ttft is not None else 0) for r in records)
    client_tokens = sum(r.output_tokens for r in records)

    # -- the server's account -------------------------------------------------------------------
    def delta(name: str) -> int:
        return int(after.get(name, 0) - before.get(name, 0))

    finished = delta("sglang:num_requests_total")
    aborted = delta("sglang:num_aborted_requests_total")
    generated = delta("sglang:generation_tokens_total")

    times = [t for t, _ in sampler.samples]
    rss = [m for _, m in sampler.samples]
    peak = max(rss + [rss_start, rss_end])
    half = times[0] + (times[-1] - times[0]) / 2 if times else 0.0
    second = [m for t, m in sampler.samples if t >= half]
    growth_2nd = (second[-1] - second[0]) if len(second) > 1 else 0.0

    print(f"soak: {args.streams} concurrent streams, window {summary.duration_s:.1f} s "
          f"(+{warmup_s:g} s ramp), {wall:.1f} s wall")
    print(f"  requests: {len(records)} sent, {len(completed)} completed, {len(cut)} cut at the "
          f"window end, {len(failed)} failed")
    print(f"  server:   {finished} finished, {aborted} aborted, {generated} tokens generated; "
          f"running requests peak {sampler.running_peak:.0f}")
    print(f"  figures:  {summary.output_tok_s:.0f} output tok/s, {summary.requests_s:.2f} req/s, "
          f"{chunks / wall:.0f} chunks/s, TTFT p50 {summary.ttft_p50 or 0:.3f} s, "
          f"ITL p50 {(summary.itl_p50 or 0) * 1e3:.1f} ms, client CPU {100 * cpu / wall:.0f}%")
    print(f"  client RSS: start {rss_start:.1f} MB, peak {peak:.1f} MB, end {rss_end:.1f} MB; "
          f"second half {growth_2nd:+.1f} MB ({len(records)} records kept, "
          f"{chunks} chunk timestamps)")
    print(f"  tokens:   client received {client_tokens}, server generated {generated} "
          f"(difference {generated - client_tokens}: tokens in flight when "
          f"{aborted} requests were cut)")

    checks = {
        "every request the client sent is one the server finished or aborted":
            len(records) == finished + aborted,
        "completed on the client == finished on the server": len(completed) == finished,
        "cut by the client == aborted on the server": len(cut) == aborted,
        "no request failed": not failed,
        "no request recorded twice": len(indices) == len(set(indices)),
        "no token counted that the server did not generate": client_tokens <= generated,
        f"all {args.streams} streams ran at once": sampler.running_peak >= args.streams,
        "client RSS flat (second half grew < 32 MB, peak < start + 256 MB)":
            growth_2nd < 32 and peak < rss_start + 256,
    }
    for what, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {what}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
