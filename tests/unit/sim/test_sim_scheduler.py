"""The real-time scheduler without HTTP: accounting, limits, aborts, EOS and timing."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import statistics
import time

import pytest

from specdecode_tune.sim.metrics import Histogram
from specdecode_tune.sim.model import (
    accept_moments,
    expected_steps,
    prefill_time,
    startup,
    step_time,
)
from specdecode_tune.sim.profile import Eos, Noise, load_profile
from specdecode_tune.sim.scheduler import (
    RequestRejected,
    Scheduler,
    SimRequest,
    boot_speed_factor,
)

BASE = load_profile("seed-qwen35-122b")
QUIET = dataclasses.replace(BASE, noise=Noise(boot_sigma=0.0, step_sigma=0.0))
# The seed's model is a hybrid: SGLang 0.5.10 speculates on it only without radix cache.
SPEC4 = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 4,
         "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 5,
         "disable_radix_cache": True}


async def drain(req: SimRequest) -> list[list[int]]:
    chunks = []
    while True:
        ids, done = await req.queue.get()
        chunks.append(ids)
        if done:
            return chunks


def run_with(profile, params, body):
    """Run `body(scheduler)` (a coroutine function) next to a running scheduler loop."""
    async def go():
        sched = Scheduler(profile, startup(profile, params), seed=1, speed_factor=1.0, noise_seed=2)
        loop_task = asyncio.create_task(sched.run())
        try:
            return await body(sched)
        finally:
            sched.close()
            loop_task.cancel()
            await asyncio.gather(loop_task, return_exceptions=True)
    return asyncio.run(go())


def test_per_request_accounting_is_consistent() -> None:
    async def body(sched: Scheduler):
        reqs = [sched.submit(10, 57, 0.0, True) for _ in range(5)]
        chunks = await asyncio.gather(*(drain(r) for r in reqs))
        return reqs, chunks, sched

    reqs, chunks, sched = run_with(QUIET, SPEC4, body)
    for req, got in zip(reqs, chunks):
        assert sum(len(c) for c in got) == req.generated == 57
        assert len(got) == req.verify_ct + 1                       # prefill chunk + one per verify
        assert req.generated == 1 + req.verify_ct + req.correct_drafts
        assert sum(req.histogram) == req.verify_ct and len(req.histogram) == 5
        assert sum(i * n for i, n in enumerate(req.histogram)) == req.correct_drafts
        assert all(1 <= len(c) <= 5 for c in got)
        assert req.finish_reason == {"type": "length", "length": 57}
    c = sched.counters
    assert c.generation_tokens == 5 * 57 and c.requests_finished == 5 and c.prompt_tokens == 50
    assert sched.kv_reserved == 0 and not sched.running


def test_running_never_exceeds_the_limit_and_the_rest_queue() -> None:
    params = {**SPEC4, "max_running_requests": 3}
    seen: list[int] = []

    async def body(sched: Scheduler):
        reqs = [sched.submit(10, 30, 0.0, True) for _ in range(8)]
        waiter = asyncio.gather(*(drain(r) for r in reqs))
        while not waiter.done():
            seen.append(len(sched.running))
            await asyncio.sleep(0.005)
        return await waiter

    run_with(QUIET, params, body)
    assert max(seen) == 3


def test_abort_frees_slot_and_kv_running_or_queued() -> None:
    params = {**SPEC4, "max_running_requests": 2}

    async def body(sched: Scheduler):
        reqs = [sched.submit(100, 1000, 0.0, True) for _ in range(4)]
        await reqs[0].queue.get()                   # the first two are running now
        assert len(sched.running) == 2 and len(sched.waiting) == 2
        for r in reqs:
            sched.abort(r)
            sched.abort(r)                          # twice is harmless
        await asyncio.sleep(0.1)
        return sched

    sched = run_with(QUIET, params, body)
    assert not sched.running and not sched.waiting and sched.kv_reserved == 0
    assert sched.counters.requests_aborted == 4 and sched.token_usage == 0.0


def test_requests_larger_than_the_kv_pool_are_rejected() -> None:
    async def body(sched: Scheduler):
        with pytest.raises(RequestRejected, match="KV cache capacity"):
            sched.submit(10, sched.facts.max_total_num_tokens, 0.0, True)
        with pytest.raises(RequestRejected, match="context length"):
            sched.submit(sched.facts.max_req_input_len + 1, 1, 0.0, True)
    run_with(QUIET, SPEC4, body)


def test_requests_beyond_the_context_length_are_rejected_with_sglangs_message() -> None:
    """SGLang refuses input + max_new_tokens >= context length before scheduling, even where
    the KV pool would hold the request (a large mem_fraction_static): so does the simulator."""
    context = QUIET.memory.context_length
    params = {**SPEC4, "mem_fraction_static": 0.92}

    async def body(sched: Scheduler):
        assert sched.facts.max_total_num_tokens > context          # the pool is not the limit
        with pytest.raises(RequestRejected) as e:
            sched.submit(256, context - 256, 0.0, True)
        assert str(e.value) == (
            f"Requested token count exceeds the model's maximum context length of {context} "
            f"tokens. You requested a total of {context} tokens: 256 tokens from the input "
            f"messages and {context - 256} tokens for the completion. Please reduce the number "
            f"of tokens in the input messages or the completion to fit within the limit.")
        req = sched.submit(256, context - 257, 0.0, True)          # one below: accepted
        sched.abort(req)
    run_with(QUIET, params, body)


def test_eos_ends_requests_early_unless_ignore_eos() -> None:
    profile = dataclasses.replace(QUIET, eos=Eos(mean_output_tokens=20.0))

    async def body(sched: Scheduler):
        free = [sched.submit(5, 200, 0.0, False) for _ in range(20)]
        fixed = [sched.submit(5, 200, 0.0, True) for _ in range(3)]
        await asyncio.gather(*(drain(r) for r in free + fixed))
        return free, fixed

    free, fixed = run_with(profile, SPEC4, body)
    assert all(r.generated == 200 for r in fixed)
    lengths = [r.generated for r in free]
    assert max(lengths) < 200 and 5 < sum(lengths) / len(lengths) < 60
    assert all(r.finish_reason["type"] == "stop" for r in free)


def test_sampled_requests_accept_less_than_greedy() -> None:
    async def body(sched: Scheduler):
        greedy = [sched.submit(5, 150, 0.0, True) for _ in range(6)]
        sampled = [sched.submit(5, 150, 1.0, True) for _ in range(6)]
        await asyncio.gather(*(drain(r) for r in greedy + sampled))
        return greedy, sampled

    greedy, sampled = run_with(QUIET, SPEC4, body)
    def rate(reqs: list[SimRequest]) -> float:
        return sum(r.generated for r in reqs) / sum(r.verify_ct for r in reqs)

    assert rate(sampled) < rate(greedy)


def test_one_request_takes_prefill_plus_its_steps_in_real_time() -> None:
    facts = startup(QUIET, SPEC4)
    out = 121
    mean, second = accept_moments(facts.accept_greedy)
    expected = prefill_time(QUIET, facts, 50) + \
        expected_steps(out - 1, mean, second) * step_time(QUIET, facts, 1)

    async def body(sched: Scheduler):
        t0 = time.perf_counter()
        req = sched.submit(50, out, 0.0, True)
        await drain(req)
        return time.perf_counter() - t0, req

    elapsed, req = run_with(QUIET, SPEC4, body)
    # this request's own draws: prefill + exactly verify_ct steps of the model's step time
    own = prefill_time(QUIET, facts, 50) + req.verify_ct * step_time(QUIET, facts, 1)
    assert elapsed == pytest.approx(own, rel=0.05, abs=0.01)
    assert elapsed == pytest.approx(expected, rel=0.3)    # and its draws are typical of the model


def test_boot_speed_factor_has_mean_one_and_the_profiles_spread() -> None:
    sigma = BASE.noise.boot_sigma
    rng = random.Random(5)
    factors = [boot_speed_factor(sigma, rng) for _ in range(4000)]
    assert statistics.fmean(factors) == pytest.approx(1.0, abs=0.002)
    assert statistics.stdev(factors) == pytest.approx(sigma, rel=0.1)
    # no noise seed: two boots draw from fresh entropy and differ
    assert boot_speed_factor(sigma, random.Random()) != boot_speed_factor(sigma, random.Random())
    assert boot_speed_factor(0.0, rng) == 1.0


def test_inter_token_latency_counts_each_token_of_a_chunk_as_sglang_does() -> None:
    # metrics_collector.observe_inter_token_latency: interval / tokens into one bucket, counted
    # `tokens` times; the sum grows by the whole interval.
    h = Histogram.inter_token()
    h.observe_chunk(0.03, 3)
    h.observe_chunk(0.05, 1)
    assert h.count == 4 and h.total == pytest.approx(0.08)
    assert h.counts[h.buckets.index(0.010)] == 3 and h.counts[h.buckets.index(0.060)] == 1
