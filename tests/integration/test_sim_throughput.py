"""What a client measures through HTTP agrees with `predict` (closed loop, ignore_eos).

Each case boots the simulator, runs C closed-loop SSE clients (plain aiohttp), lets the loop
settle, then counts the output tokens whose chunks arrive inside a fixed window. The slow cases
repeat the seed's C=1 and C=16 rows with the profile's calibration workload and print a
seed / predict / measured table (run with -s to see it).
"""

from __future__ import annotations

import asyncio
import csv
import json
import time
from pathlib import Path

import aiohttp
import pytest
from simserver import run_sim

from specdecode_tune.sim import Workload, load_profile, predict

SEED = Path(__file__).resolve().parent.parent / "data" / "seed_measurements.csv"


def _spec(steps: int) -> dict[str, object]:
    # The seed's model is a hybrid: SGLang 0.5.10 speculates on it only without radix cache.
    return {"speculative_algorithm": "EAGLE3", "speculative_num_steps": steps,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": steps + 1,
            "disable_radix_cache": True}


def _argv(params: dict[str, object]) -> list[str]:
    return [a for k, v in params.items()
            for a in ((f"--{k.replace('_', '-')}",) if v is True
                      else (f"--{k.replace('_', '-')}", str(v)))]


async def closed_loop(base: str, concurrency: int, workload: Workload, warmup: float,
                      window: float) -> float:
    """Output tokens/s arriving inside [warmup, warmup + window] with `concurrency` clients."""
    body = {"input_ids": [7] * workload.input_len, "stream": True,
            "sampling_params": {"max_new_tokens": workload.output_len,
                                "temperature": workload.temperature, "ignore_eos": True}}
    start = time.perf_counter() + warmup
    end = start + window
    counted = 0

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal counted
        while True:
            async with session.post(base + "/generate", json=body) as r:
                seen = 0      # output_ids are cumulative: a chunk's new tokens are the growth
                async for raw in r.content:
                    if not raw.startswith(b"data: {"):
                        continue
                    now = time.perf_counter()
                    if now > end:
                        return      # leaves mid-stream: the server aborts the request
                    total = len(json.loads(raw[6:])["output_ids"])
                    if now >= start:
                        counted += total - seen
                    seen = total

    timeout = aiohttp.ClientTimeout(total=warmup + window + 60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.wait_for(asyncio.gather(*(client(session) for _ in range(concurrency))),
                               warmup + window + 60)
    return counted / window


def _measure(
    params: dict[str, object], concurrency: int, workload: Workload, warmup: float, window: float
) -> tuple[float, float]:
    """(predict, measured through HTTP) output tokens/s."""
    profile = load_profile("seed-qwen35-122b")
    expected = predict(profile, params, concurrency, workload).output_tok_s
    with run_sim(*_argv(params), "--boot-time", "0.2", "--noise-seed", "3") as (base, _):
        measured = asyncio.run(closed_loop(base, concurrency, workload, warmup, window))
    return expected, measured


@pytest.mark.parametrize(
    ("steps", "concurrency"),
    [(4, 1), (4, 16), (3, 16)],    # C=16 at steps 4 queues (limit 12); at steps 3 it does not (17)
)
def test_http_throughput_matches_predict(steps: int, concurrency: int) -> None:
    workload = Workload(input_len=512, output_len=256, temperature=0.0)
    expected, measured = _measure(_spec(steps), concurrency, workload, warmup=2.0, window=8.0)
    print(f"\nC={concurrency} steps={steps} out={workload.output_len}: predict {expected:.1f} "
          f"http {measured:.1f} ({measured / expected - 1:+.1%})")
    assert measured == pytest.approx(expected, rel=0.10), \
        f"predict {expected:.0f} tok/s, measured {measured:.0f}"


def _seed_rows() -> list[tuple[int, int, float]]:
    with SEED.open() as f:
        rows = [r for r in csv.reader(f) if r and not r[0].startswith("#")]
    return [(int(r[1]), int(r[2]), float(r[3])) for r in rows
            if r[0] == "output_tok_s" and r[1] in ("1", "16")]


@pytest.mark.slow
@pytest.mark.parametrize(("concurrency", "steps", "seed"), _seed_rows())
def test_seed_rows_through_http(concurrency: int, steps: int, seed: float) -> None:
    workload = Workload.calibration(load_profile("seed-qwen35-122b"))
    expected, measured = _measure(_spec(steps), concurrency, workload, warmup=3.0, window=8.0)
    print(f"\nC={concurrency:<3} steps={steps}  seed {seed:7.0f}  predict {expected:7.1f}  "
          f"http {measured:7.1f}  ({measured / expected - 1:+.1%} vs predict, "
          f"{measured / seed - 1:+.1%} vs seed)")
    assert measured == pytest.approx(expected, rel=0.10)
