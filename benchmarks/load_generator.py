"""How fast and how exact the load generator is, against the test stream server.

Prints two figures (no assertions; the numbers are for the issue note and for regressions):

1. Client capacity: streamed chunks per second that ONE client core parses and accounts,
   against a zero-delay stream (1 token per chunk, so chunks = tokens; one event per server
   write). The server runs in a separate process pinned to another core, the client is pinned
   to its own; the client's CPU utilization says which side limited the rate (near 100%: the
   client did), and chunks per client CPU-second is the per-core capacity either way. A client
   that falls behind reads several events per socket read, which is cheaper per event; so this
   is an upper bound.
2. Accuracy at C=64: client-measured output tokens/s against the tokens the server itself
   wrote inside the same measurement window (same monotonic clock, same machine), on a paced
   stream of about the rate the seed's C=64 trials stream (64 x 25 chunks/s = 1600 chunks/s).
   Here every event arrives on its own, so chunks per client CPU-second is the conservative
   per-core capacity (it includes request set-up and the 64 idle connections' overhead).

    python benchmarks/load_generator.py              # about a minute
    python benchmarks/load_generator.py --smoke-test # a few seconds, for CI
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import aiohttp

from specdecode_tune.config import WorkloadSpec
from specdecode_tune.load import LevelPlan, iter_prompts, run_level
from specdecode_tune.records import LevelSummary, RequestRecord
from specdecode_tune.server import pick_free_port
from specdecode_tune.testing import streamserver


async def _level(
    port: int, api: str, plan: LevelPlan, spec: WorkloadSpec
) -> tuple[float, float, LevelSummary, list[RequestRecord]]:
    """One level on a fresh session; returns (start time, client CPU seconds, summary, records)."""
    connector = aiohttp.TCPConnector(limit=plan.concurrency or 0)
    async with aiohttp.ClientSession(connector=connector) as session:
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        summary, records = await run_level(
            session, f"http://127.0.0.1:{port}", api, iter_prompts(spec), plan
        )
        return t0, time.process_time() - cpu0, summary, records


def capacity(port: int, api: str, concurrency: int, duration: float) -> None:
    streamserver.reset(port, tokens_per_chunk=1, chunk_delay=0.0, burst=1)
    # Long outputs so that request turnaround is negligible; generate's cumulative text grows
    # with the output, as SGLang's does, so its chunks are the heaviest to parse.
    spec = WorkloadSpec(input_len=64, output_len=1024)
    plan = LevelPlan(concurrency=concurrency, warmup_s=0.5, duration_s=duration)
    _, cpu, summary, _ = asyncio.run(_level(port, api, plan, spec))
    total_s = plan.warmup_s + plan.duration_s
    util = cpu / total_s
    print(
        f"  {api:<12} {summary.output_tok_s:>9,.0f} chunks/s   client CPU {util:>4.0%}   "
        f"-> {summary.output_tok_s / util:>9,.0f} chunks per client CPU-second"
    )


def accuracy(port: int, api: str, continuous: bool, duration: float) -> None:
    streamserver.reset(port, tokens_per_chunk=2, chunk_delay=0.04, continuous_usage=continuous)
    spec = WorkloadSpec(input_len=64, output_len=(128, 512))
    plan = LevelPlan(concurrency=64, warmup_s=2.0, duration_s=duration)
    t0, cpu, summary, _ = asyncio.run(_level(port, api, plan, spec))
    w0 = t0 + plan.warmup_s
    sent = streamserver.stats(port, w0, w0 + plan.duration_s)["window_tokens"]
    server_tok_s = sent / plan.duration_s
    diff = (summary.output_tok_s / server_tok_s - 1) * 100 if server_tok_s else float("nan")
    counting = "per-chunk counter" if continuous or api == "generate" else "1/chunk + usage"
    util = cpu / (plan.warmup_s + plan.duration_s)
    chunks_s = summary.output_tok_s / 2
    print(
        f"  {api:<12} {counting:<18} client {summary.output_tok_s:>7,.1f} tok/s   "
        f"server {server_tok_s:>7,.1f} tok/s   diff {diff:+.3f}%   "
        f"{chunks_s:,.0f} chunks/s at client CPU {util:.1%} -> {chunks_s / util:,.0f} per CPU-s"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke-test", action="store_true", help="short runs, for CI")
    ap.add_argument("--duration", type=float, default=None, help="seconds per measured level")
    a = ap.parse_args(argv)
    cap_s = a.duration or (1.0 if a.smoke_test else 5.0)
    acc_s = a.duration or (2.0 if a.smoke_test else 10.0)

    cpus = sorted(os.sched_getaffinity(0))
    client_cpu, server_cpu = (cpus[0], cpus[1]) if len(cpus) >= 2 else (None, None)
    if client_cpu is not None:
        os.sched_setaffinity(0, {client_cpu})
    port = pick_free_port()
    proc = streamserver.start_subprocess(port, cpu=server_cpu)
    try:
        where = (
            f"client on CPU {client_cpu}, server on CPU {server_cpu}"
            if client_cpu is not None
            else "one CPU only: client and server share it (capacity understated)"
        )
        print(f"load generator benchmark ({where}; Python {sys.version.split()[0]}, "
              f"aiohttp {aiohttp.__version__})")
        print(f"1. client capacity, zero-delay stream, 1 token/chunk, C=64, {cap_s:g} s:")
        for api in ("generate", "completions", "chat"):
            capacity(port, api, 64, cap_s)
        print(f"2. accuracy at C=64, paced 2 tokens / 40 ms per stream, {acc_s:g} s window:")
        accuracy(port, "generate", True, acc_s)
        accuracy(port, "completions", False, acc_s)
        if not a.smoke_test:
            accuracy(port, "chat", True, acc_s)
    finally:
        streamserver.stop_subprocess(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
