"""The performance model of speculative decoding: pure functions, no I/O.

`predict(profile, params, concurrency, workload)` gives the steady-state throughput of a closed
loop at that concurrency, on the `Facts` that `boot.startup` gives (SGLang's argument checks,
memory accounting and draft tree; the public names of `arguments` and `boot` are importable
from here too). The real-time server (`scheduler.py`) runs the same `step_time` /
`prefill_time` / acceptance functions, so what a client measures through HTTP converges on
`predict`.

Step time for a decode iteration with b running requests (s steps, topk k, n draft tokens):

    m = b * n tokens verified; m_pad = m rounded up to a multiple of verify_token_tile
    t = decode_fixed + scale * (verify_moe * (1 - (1 - moe_route_fraction) ** m)
                                + verify_per_token * m_pad)
        [+ spec_fixed [+ s * (draft_step_fixed + scale * draft_step_per_token * b * k)]]
    t *= eager_factor when b > cuda_graph_max_bs;  scale = (profile tp / tp) ** tp_scaling_exponent

The MoE term is the share of routed experts that m tokens touch (each one read once per pass);
the tile makes shelves: at batch 1 every draft length up to the tile costs the same. The draft
passes (the inner bracket) are a draft model's: NGRAM has none. NGRAM's acceptance uses the
profile's tables too (calibrated for its draft model: a stand-in, not an n-gram calibration).

Closed-loop steady state at concurrency C (ignore_eos, fixed lengths; see `predict`):
R = min(C, running limit, KV tokens // (input + output)) requests run, the rest queue. Each
request has one prefill iteration (first token, stalls the batch) and then N decode steps for
the other output - 1 tokens, N from renewal theory: N = x/mu + E[X^2]/(2 mu^2) - 1/2 with X the
tokens of one verify step. Without a queue and with C > 1, a finished request's replacement
arrives during the next step and misses it: one extra idle slot-step per request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specdecode_tune.sim.arguments import (
    SPEC_ALGORITHMS,
    STARTUP_KINDS,
    StartupError,
    normalize_params,
)
from specdecode_tune.sim.boot import Facts, GiB, startup, tree_acceptance
from specdecode_tune.sim.profile import Profile

__all__ = [
    "GiB",
    "SPEC_ALGORITHMS",
    "STARTUP_KINDS",
    "Facts",
    "Prediction",
    "StartupError",
    "Workload",
    "accept_moments",
    "expected_steps",
    "normalize_params",
    "predict",
    "predict_facts",
    "prefill_time",
    "startup",
    "step_time",
    "tree_acceptance",
]


@dataclass(frozen=True, slots=True)
class Workload:
    """One closed-loop request shape: prompt tokens, output tokens (ignore_eos), temperature."""

    input_len: int
    output_len: int
    temperature: float = 0.0

    @classmethod
    def calibration(cls, profile: Profile) -> Workload:
        c = profile.calibration
        return cls(c.input_len, c.output_len, c.temperature)


@dataclass(frozen=True, slots=True)
class Prediction:
    """Steady-state figures of a closed loop; infeasible configs carry the start-up reason."""

    feasible: bool
    reason: str
    output_tok_s: float
    per_request_tok_s: float       # output_tok_s / running: speed of one running request
    accept_length: float           # E[tokens per verify step] (1.0 without speculation)
    step_time_s: float             # one decode iteration at the running batch
    running: float                 # effective running batch (requests decoding per step)
    queued: int                    # concurrency above the running limit waits
    prefill_s: float               # one request's prefill iteration
    max_total_num_tokens: int
    max_running_requests: int



# --------------------------------------------------------------------------- acceptance moments


def accept_moments(probs: tuple[float, ...]) -> tuple[float, float]:
    """(E[X], E[X^2]) of X = tokens a verify step yields: 1 (bonus/correction) + accepted drafts."""
    # P(A >= i) = prod_{j<=i} q_j;  E[A] = sum P(A>=i);  E[A^2] = sum (2i - 1) P(A>=i)
    ea = ea2 = 0.0
    c = 1.0
    for i, q in enumerate(probs, start=1):
        c *= q
        ea += c
        ea2 += (2 * i - 1) * c
    return 1.0 + ea, 1.0 + 2.0 * ea + ea2


def expected_steps(tokens: float, mean: float, second: float) -> float:
    """Expected verify steps until `tokens` tokens are produced (renewal approximation)."""
    if tokens <= 0:
        return 0.0
    return max(1.0, tokens / mean + second / (2.0 * mean * mean) - 0.5)


# --------------------------------------------------------------------------- costs


def _scale(profile: Profile, facts: Facts) -> float:
    hw = profile.hardware
    return (hw.tp_size / facts.tp_size) ** hw.tp_scaling_exponent


def step_time(profile: Profile, facts: Facts, batch: float) -> float:
    """Seconds of one decode (draft + verify) iteration with `batch` running requests."""
    if batch <= 0:
        return 0.0
    c = profile.cost
    scale = _scale(profile, facts)
    num_steps, draft_tokens, speculative = facts.shape(batch)
    m = batch * draft_tokens
    m_pad = math.ceil(m / c.verify_token_tile - 1e-9) * c.verify_token_tile
    t = c.decode_fixed_s + scale * (
        c.verify_moe_s * (1.0 - (1.0 - c.moe_route_fraction) ** m) + c.verify_per_token_s * m_pad
    )
    if speculative:
        t += c.spec_fixed_s
    if facts.draft_model:
        t += num_steps * (
            c.draft_step_fixed_s + scale * c.draft_step_per_token_s * batch * facts.topk
        )
    if batch > facts.cuda_graph_max_bs:
        t *= c.eager_factor
    return t


def prefill_time(profile: Profile, facts: Facts, tokens: int) -> float:
    """Seconds of one prefill iteration over `tokens` prompt tokens (it also yields token 1)."""
    c = profile.cost
    return c.prefill_fixed_s + _scale(profile, facts) * c.prefill_per_token_s * tokens


# --------------------------------------------------------------------------- prediction


def _infeasible(reason: str, facts: Facts | None = None) -> Prediction:
    kv, limit = (facts.max_total_num_tokens, facts.max_running_requests) if facts else (0, 0)
    return Prediction(False, reason, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0.0, kv, limit)


def predict(profile: Profile, params: Mapping[str, Any], concurrency: int,
            workload: Workload) -> Prediction:
    """Steady-state closed-loop figures at `concurrency` (see the module docstring)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    try:
        facts = startup(profile, params)
    except StartupError as e:
        return _infeasible(f"{e.kind}: {e.message}")
    return predict_facts(profile, facts, concurrency, workload)


def predict_facts(profile: Profile, facts: Facts, concurrency: int,
                  workload: Workload) -> Prediction:
    """`predict` for already computed Facts (a benchmark varying concurrency or workload)."""
    per_request_kv = workload.input_len + workload.output_len
    if workload.input_len > facts.max_req_input_len:
        reason = (f"input of {workload.input_len} tokens exceeds max_req_input_len "
                  f"{facts.max_req_input_len}")
        return _infeasible(reason, facts)
    if per_request_kv >= profile.memory.context_length:   # refused as SGLang refuses it
        reason = (f"input + output = {per_request_kv} tokens reaches the context length "
                  f"{profile.memory.context_length}")
        return _infeasible(reason, facts)
    if per_request_kv > facts.max_total_num_tokens:   # the server rejects such a request (400)
        reason = (f"input + output = {per_request_kv} tokens exceeds the KV pool "
                  f"{facts.max_total_num_tokens}")
        return _infeasible(reason, facts)
    cap = min(facts.max_running_requests, facts.max_total_num_tokens // per_request_kv)
    running = min(concurrency, cap)
    queued = concurrency - running
    probs = facts.accept_probs(workload.temperature)
    if facts.adaptive is not None:     # the steps of the running batch's slot
        probs = probs[:facts.shape(running)[0]]
    mean, second = accept_moments(probs)
    steps = expected_steps(workload.output_len - 1, mean, second)
    t_pf = prefill_time(profile, facts, workload.input_len)
    # Without a queue, a replacement request misses the step during which it arrives.
    miss = 1.0 if (queued == 0 and running > 1) else 0.0
    batch = running * steps / (steps + miss) if steps > 0 else float(running)
    t = step_time(profile, facts, batch)
    cycle = (steps + miss) * t + running * t_pf      # time for `running` requests to finish once
    tok_s = running * workload.output_len / cycle
    return Prediction(
        feasible=True,
        reason="",
        output_tok_s=tok_s,
        per_request_tok_s=tok_s / running,
        accept_length=mean,
        step_time_s=t,
        running=batch,
        queued=queued,
        prefill_s=t_pf,
        max_total_num_tokens=facts.max_total_num_tokens,
        max_running_requests=facts.max_running_requests,
    )
