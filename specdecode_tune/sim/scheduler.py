"""Continuous batching in real time: the simulated server's engine loop (asyncio).

One loop, as SGLang's scheduler: each iteration is either a prefill of the requests admitted
from the waiting queue (it yields each one's first token and stalls decoding, as a separate
prefill batch does) or one decode step of every running request (draft + verify: each request
gets 1 + its accepted draft tokens, drawn per position from the acceptance model). The iteration
takes `model.step_time` / `model.prefill_time` times a per-boot speed factor and a per-iteration
jitter; the loop sleeps until the iteration's absolute deadline (next_t += dt, so lateness never
accumulates as drift) and then hands each request its tokens as one chunk. Requests that arrive
during an iteration wait for the next one. Admission: at most `max_running_requests` running and
the KV reservations (input + max_new_tokens each) within `max_total_num_tokens`; no preemption.
A request is refused at submission, as SGLang's tokenizer manager refuses it, when its input
reaches the context length or input + max_new_tokens does (SGLang's own message), or when it
could never fit the KV pool.
Without `ignore_eos`, a request also ends at a random EOS when the profile's
`[eos] mean_output_tokens` is above 0; the seed profile sets 0, so every request runs to
`max_new_tokens` either way (the sim has no text to end).

Per-request statistics follow SGLang's meta_info: completion_tokens = 1 (from prefill) +
verify_ct + correct drafts. `histogram[i]` counts the verify steps that accepted exactly i draft
tokens (i = 0..depth), SGLang's `spec_accept_histogram`; on the step that reaches
max_new_tokens, accepted drafts past the limit are dropped, and counted as not accepted.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass, field

from specdecode_tune.sim.boot import Facts
from specdecode_tune.sim.counters import Counters
from specdecode_tune.sim.model import prefill_time, step_time
from specdecode_tune.sim.profile import Profile
from specdecode_tune.sim.promptkind import scaled

DECODE_LOG_INTERVAL = 40   # decode iterations per "log interval" (SGLang's default)
IDLE_STATS_S = 30.0        # an idle scheduler writes its stats this long after the last write
VOCAB_SIZE = 151_936       # ids drawn for synthetic output; any id below it is valid
EOS_TOKEN_ID = 151_645


class RequestRejected(ValueError):
    """The request can never be served (too long for the KV pool or the context)."""


@dataclass(eq=False, slots=True)
class SimRequest:
    """One request as the scheduler tracks it; the HTTP handler reads `queue`."""

    rid: str
    input_len: int
    max_new_tokens: int
    temperature: float
    stop_at: int                       # tokens at which it ends (max_new_tokens or an EOS)
    probs: tuple[float, ...]           # effective conditional acceptance per depth
    created: float                     # perf_counter at submit
    # (new token ids, finished) per iteration; the handler drains it.
    queue: asyncio.Queue[tuple[list[int], bool]] = field(default_factory=asyncio.Queue)
    generated: int = 0
    verify_ct: int = 0
    correct_drafts: int = 0
    histogram: list[int] = field(default_factory=list)
    first_token_at: float | None = None
    last_token_at: float | None = None   # when its last chunk of tokens was handed out
    finished: bool = False
    aborted: bool = False
    # /health's 1-token generation: in no counter, and no draw from the acceptance stream
    # (SGLang's health-check requests are kept out of the request metrics).
    health: bool = False

    @property
    def kv_reserved(self) -> int:
        return self.input_len + self.max_new_tokens

    @property
    def finish_reason(self) -> dict[str, object]:
        if self.generated < self.max_new_tokens:
            return {"type": "stop", "matched": EOS_TOKEN_ID}
        return {"type": "length", "length": self.max_new_tokens}


class Scheduler:
    """The engine loop. `submit` from handlers, `abort` on disconnect, `run` as one task."""

    def __init__(
        self, profile: Profile, facts: Facts, seed: int | None, speed_factor: float,
        noise_seed: int | None = None,
    ) -> None:
        self.profile = profile
        self.facts = facts
        self.speed_factor = speed_factor
        self._rng = random.Random(seed)                 # acceptance, EOS, output ids
        self._noise = random.Random(noise_seed)         # per-iteration jitter
        # per-request acceptance factors by prompt kind: their own stream, so a profile
        # without [prompt_kinds] draws exactly what it drew before
        self._kind_rng = random.Random(None if seed is None else seed ^ 0x5EED)
        self._sigma = profile.noise.step_sigma
        self._step_cache: dict[int, float] = {}
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.prefilling: list[SimRequest] = []   # admitted, in the current prefill iteration
        self.kv_reserved = 0
        self.counters = Counters()
        # What /metrics shows as num_running_reqs / num_queue_reqs: SGLang writes these from
        # its stats on each prefill batch, every DECODE_LOG_INTERVAL-th decode batch, and when
        # idle for IDLE_STATS_S since the last write, so they lag; /get_load is current.
        self.stats_running = 0
        self.stats_queued = 0
        self._stats_at = 0.0
        self._wake = asyncio.Event()
        self._closed = False
        self._frozen = False
        self._ids = itertools.count()

    # ------------------------------------------------------------------ handler side

    def submit_health_check(self) -> SimRequest:
        """A 1-token generation for /health, outside the counters."""
        req = SimRequest(rid=f"HEALTH_CHECK_{next(self._ids):x}", input_len=1, max_new_tokens=1,
                         temperature=0.0, stop_at=1, probs=(), created=time.perf_counter(),
                         histogram=[0], health=True)
        self.waiting.append(req)
        self._wake.set()
        return req

    def submit(self, input_len: int, max_new_tokens: int, temperature: float,
               ignore_eos: bool, kind: str | None = None) -> SimRequest:
        f = self.facts
        if input_len > f.max_req_input_len:
            raise RequestRejected(
                f"The input ({input_len} tokens) is longer than the model's context length "
                f"({f.max_req_input_len} tokens)."
            )
        context = self.profile.memory.context_length
        if input_len + max_new_tokens >= context:
            # SGLang's TokenizerManager._validate_one_request, word for word (>=, as there).
            raise RequestRejected(
                f"Requested token count exceeds the model's maximum context length of {context} "
                f"tokens. You requested a total of {input_len + max_new_tokens} tokens: "
                f"{input_len} tokens from the input messages and {max_new_tokens} tokens for the "
                f"completion. Please reduce the number of tokens in the input messages or the "
                f"completion to fit within the limit."
            )
        if input_len + max_new_tokens > f.max_total_num_tokens:
            raise RequestRejected(
                f"input ({input_len}) + max_new_tokens ({max_new_tokens}) exceeds the KV cache "
                f"capacity ({f.max_total_num_tokens} tokens)."
            )
        stop_at = max_new_tokens
        mean_eos = self.profile.eos.mean_output_tokens
        if not ignore_eos and mean_eos > 0:
            # geometric length with the profile's mean, at least one token
            stop_at = min(stop_at, 1 + int(self._rng.expovariate(1.0 / max(mean_eos - 1.0, 1e-9))))
        req = SimRequest(
            rid=f"{next(self._ids):x}",
            input_len=input_len,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            stop_at=stop_at,
            probs=self._probs(temperature, kind),
            created=time.perf_counter(),
            histogram=[0] * (len(f.tree_widths) + 1),
        )
        self.waiting.append(req)
        self._wake.set()
        return req

    def _probs(self, temperature: float, kind: str | None) -> tuple[float, ...]:
        """Conditional acceptance per depth for one request: the facts' table, scaled by the
        profile's factor for the prompt's kind (sim/promptkind.py)."""
        probs = self.facts.accept_probs(temperature)
        pk = self.profile.prompt_kinds
        if pk is None:
            return probs
        return scaled(probs, kind, pk.factors(), pk.request_sigma, self._kind_rng)

    def abort(self, req: SimRequest) -> None:
        """Drop a request (client gone): frees its slot and KV. Safe to call more than once."""
        if req.finished or req.aborted:
            return
        req.aborted = True
        if not req.health:
            self.counters.requests_aborted += 1
        if req in self.waiting:
            self.waiting.remove(req)
        elif req in self.running:
            self.running.remove(req)
            self.kv_reserved -= req.kv_reserved

    def close(self) -> None:
        """Stop the loop and end every open stream (server shutdown)."""
        self._closed = True
        self._wake.set()
        for req in [*self.waiting, *self.prefilling, *self.running]:
            req.aborted = True
            req.queue.put_nowait(([], True))
        self.waiting.clear()
        self.prefilling.clear()
        self.running.clear()

    def freeze(self) -> None:
        """Stop iterating, keeping every request where it is (an injected hang)."""
        self._frozen = True
        self._wake.set()

    @property
    def token_usage(self) -> float:
        used = sum(r.input_len + r.generated for r in self.running)
        return used / self.facts.max_total_num_tokens

    # ------------------------------------------------------------------ engine loop

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_t = loop.time()
        decode_iters, interval_start, interval_tokens, interval_verify = 0, loop.time(), 0, 0
        while not self._closed:
            if self._frozen:
                await asyncio.Event().wait()     # until the task is cancelled at shutdown
            if not self.running and not self.waiting:
                self._wake.clear()
                # Idle: SGLang's idle self-check writes the stats once IDLE_STATS_S have passed
                # since the last write.
                wait_s = self._stats_at + IDLE_STATS_S - loop.time()
                if wait_s <= 0 and (self.stats_running or self.stats_queued):
                    self._write_stats(loop.time())
                    continue
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=max(wait_s, 0.05)
                                           if self.stats_running or self.stats_queued else None)
                except TimeoutError:
                    continue
                next_t = loop.time()     # idle time is not owed to anyone
                continue
            admitted = self.prefilling = self._admit()
            if admitted:
                dt = prefill_time(self.profile, self.facts, sum(r.input_len for r in admitted))
            else:
                batch = list(self.running)
                dt = self._step_time(len(batch))
            next_t += dt * self.speed_factor * self._jitter()
            await asyncio.sleep(max(0.0, next_t - loop.time()))
            if self._closed:
                break
            if self._frozen:
                continue
            if admitted:
                self._finish_prefill(admitted)
                self.prefilling = []
                self._write_stats(loop.time())
                continue
            produced, verified = self._decode(batch)
            decode_iters += 1
            interval_tokens += produced
            interval_verify += verified
            if decode_iters % DECODE_LOG_INTERVAL == 0:
                now = loop.time()
                self._write_stats(now)
                c = self.counters
                c.interval_gen_throughput = interval_tokens / max(now - interval_start, 1e-9)
                c.interval_accept_length = (interval_tokens / interval_verify
                                            if interval_verify else 0.0)
                steps, tokens, _ = self.facts.shape(len(batch))
                c.interval_num_steps, c.interval_num_draft_tokens = (
                    (steps, tokens) if self.facts.speculative else (0, 0))
                interval_start, interval_tokens, interval_verify = now, 0, 0

    def _write_stats(self, now: float) -> None:
        self.stats_running, self.stats_queued = len(self.running), len(self.waiting)
        self._stats_at = now

    def load(self) -> int:
        """Requests running or waiting now (what SGLang's /get_load asks the scheduler)."""
        return len(self.running) + len(self.prefilling) + len(self.waiting)

    def _jitter(self) -> float:
        if self._sigma <= 0:
            return 1.0
        # mean-one log-normal: exp(N(-s^2/2, s))
        return self._noise.lognormvariate(-self._sigma * self._sigma / 2, self._sigma)

    def _step_time(self, batch: int) -> float:
        t = self._step_cache.get(batch)
        if t is None:
            t = self._step_cache[batch] = step_time(self.profile, self.facts, batch)
        return t

    def _admit(self) -> list[SimRequest]:
        admitted: list[SimRequest] = []
        limit, capacity = self.facts.max_running_requests, self.facts.max_total_num_tokens
        while self.waiting and len(self.running) + len(admitted) < limit:
            req = self.waiting[0]
            if self.kv_reserved + req.kv_reserved > capacity:
                break
            self.waiting.pop(0)
            self.kv_reserved += req.kv_reserved
            admitted.append(req)
        return admitted

    def _finish_prefill(self, admitted: list[SimRequest]) -> None:
        now = time.perf_counter()
        for req in admitted:
            if req.aborted:
                self.kv_reserved -= req.kv_reserved
                continue
            req.first_token_at = now
            if not req.health:
                self.counters.prompt_tokens += req.input_len
                self.counters.ttft.observe(now - req.created)   # at the first chunk, as SGLang
            self.running.append(req)
            self._emit(req, 1, now)

    def _decode(self, batch: list[SimRequest]) -> tuple[int, int]:
        """One verify step for each request still running; returns (tokens, verify steps)."""
        rand = self._rng.random
        now = time.perf_counter()
        produced = 0
        live = [r for r in batch if not r.aborted and not r.finished]
        # Adaptive mode: the whole batch runs the steps of its size's slot (SGLang routes the
        # batch before its draft phase); the step time follows the same slot (model.step_time).
        depth = self.facts.shape(len(batch))[0] if self.facts.adaptive is not None else None
        for req in live:
            accepted = 0
            for q in (req.probs if depth is None else req.probs[:depth]):
                if rand() >= q:
                    break
                accepted += 1
            n = min(accepted + 1, req.stop_at - req.generated)
            req.verify_ct += 1
            req.correct_drafts += n - 1
            req.histogram[n - 1] += 1
            produced += n
            self._emit(req, n, now)
        c = self.counters
        c.verify_ct += len(live)
        c.verify_tokens += produced
        return produced, len(live)

    def _emit(self, req: SimRequest, n: int, now: float) -> None:
        randrange = self._rng.randrange
        if req.last_token_at is not None and not req.health:
            self.counters.itl.observe_chunk(now - req.last_token_at, n)
        req.last_token_at = now
        req.generated += n
        if not req.health:
            self.counters.generation_tokens += n
        done = req.generated >= req.stop_at
        ids = [0] * n if req.health else [randrange(VOCAB_SIZE) for _ in range(n)]
        if done:
            if req.generated < req.max_new_tokens:
                ids[-1] = EOS_TOKEN_ID
            self._finish(req, now)
        req.queue.put_nowait((ids, done))

    def _finish(self, req: SimRequest, now: float) -> None:
        req.finished = True
        self.running.remove(req)
        self.kv_reserved -= req.kv_reserved
        if req.health:
            return
        c = self.counters
        c.requests_finished += 1
        c.finished_verify_ct += req.verify_ct
        c.finished_generation_tokens += req.generated
        c.e2e.observe(now - req.created)


def boot_speed_factor(sigma: float, rng: random.Random) -> float:
    """Per-boot speed factor (multiplies every iteration): mean-one log-normal."""
    return rng.lognormvariate(-sigma * sigma / 2, sigma) if sigma > 0 else 1.0
