"""What a simulated server is once started: SGLang's start-up rules, memory and draft tree.

`startup(profile, params)` applies SGLang's argument rules (`arguments.normalize_params`) and
its memory accounting and returns the server's `Facts`, the draft tree's shape and acceptance
included, or raises `StartupError` with an SGLang-like message. Pure functions, no I/O; the
performance model that runs on the Facts is `model.py`.

Memory, per GPU (weights and KV per token are split evenly over `tp_size` ranks):

    static pool   = mem_fraction_static * gpu_memory
    reserved      = pool_fixed + pool_bytes_per_graph_token * cuda_graph_max_bs * n
    KV pool       = static pool - weights(target [+ draft]) - reserved
    max_total_num_tokens = KV pool / (kv_bytes_per_token [+ draft_kv_bytes_per_token]) * tp
    running limit = min(--max-running-requests, max_total_num_tokens // request_reserve_tokens)
                    (the flag is 48 with speculation when unset, as SGLang resets it)
    headroom need = headroom_fixed + headroom_bytes_per_graph_token * cuda_graph_max_bs * n

where n = tokens verified per request per step (num_draft_tokens, or 1 without speculation).
A KV pool that cannot hold one request (`request_reserve_tokens`) is "Not enough memory";
headroom (1 - mem_fraction_static) below the need is "CUDA out of memory".

Acceptance: the profile gives conditional probabilities p_i (position i accepted given all
before it). A chain (topk = 1) accepts position i with probability prod_{j<=i} p_j. A tree
(topk > 1) with n - 1 draft nodes is modelled by widths w_i per depth i <= steps; the first
min(w_i, topk) candidates at depth i are treated as alternatives for the token on the accepted
path (SGLang's pool has topk^2 candidates below the first depth, topk under each node), so
q_i(w) = 1 - (1 - p_i) * (1 - sibling_hit) ** (w - 1): each extra candidate catches a share
`sibling_hit` of the remaining misses, never above 1 and equal to p_i for one candidate. The
widths are chosen greedily, one node at a time, where it adds the most expected tokens (SGLang
also keeps the best-scoring nodes). This is optimistic for real trees, where some siblings hang
off rejected branches; it is plausible, monotone in n, and reduces exactly to the chain.

The tree's limit: SGLang scores topk + (steps - 1) * topk^2 candidates (`draft_candidates`) and
keeps num_draft_tokens - 1 of them with `torch.topk`; a larger count passes the argument checks
and fails at boot, in the draft worker's CUDA graph capture (`startup` raises it after the
memory checks, with SGLang's message). NGRAM builds its tree otherwise and is not limited so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple

from specdecode_tune.sim import releases
from specdecode_tune.sim.adaptive import Schedule
from specdecode_tune.sim.arguments import EMULATED_VERSION, StartupError, normalize_params
from specdecode_tune.sim.profile import Profile

GiB = 1024**3
# SGLang's words when a CUDA graph capture fails, after "Capture cuda graph failed: <error>"
# (0.5.10.post1's; `releases.capture_failed_hint` gives the release's).
CUDA_GRAPH_CAPTURE_FAILED_MSG = releases.CUDA_GRAPH_CAPTURE_FAILED_MSG


@dataclass(frozen=True, slots=True)
class Facts:
    """What a server with these args is once started: normalized args, limits, memory."""

    params: Mapping[str, Any] = field(hash=False)   # normalized server args (SGLang names)
    warnings: tuple[str, ...]
    speculative: bool
    draft_model: bool              # draft passes and a draft model's memory (not NGRAM)
    num_steps: int                 # tree depth: 0 without speculation
    topk: int
    draft_tokens: int              # tokens verified per request per step (1 without speculation)
    tree_widths: tuple[int, ...]   # draft nodes per depth
    accept_greedy: tuple[float, ...]    # effective conditional acceptance per depth
    accept_sampled: tuple[float, ...]
    tp_size: int
    cuda_graph_max_bs: int
    mem_fraction_static: float
    max_total_num_tokens: int
    memory_running_limit: int      # what memory alone allows
    max_running_requests: int      # effective: min(flag, memory limit); the flag (48 with
                                   # speculation when unset) stays in params
    max_req_input_len: int
    weight_bytes: int              # per GPU
    kv_bytes: int                  # per GPU, the KV pool
    reserved_bytes: int            # per GPU, in-pool buffers
    headroom_bytes: int            # per GPU, available outside the pool
    headroom_need_bytes: int       # per GPU, needed outside the pool (the capture's peak)
    gpu_bytes: int                 # per GPU, the whole memory (free before weights, here)
    graph_kept_bytes: int          # per GPU, what the CUDA graph capture keeps (its part of
                                   # the need less the warm-up passes' share, freed again)
    free_after_capture_bytes: int  # per GPU, free after the capture: SGLang's last "avail mem"
    # SGLang's adaptive mode (a per-batch-size steps schedule, topk = 1): num_steps and
    # draft_tokens above are the largest candidate's (what the buffers are sized for); each
    # decode batch runs the steps its slot names (`shape`).
    adaptive: Schedule | None = None

    def shape(self, batch: float) -> tuple[int, int, bool]:
        """(steps, tokens verified per request, drafting) of a decode batch of `batch`."""
        if self.adaptive is None:
            return self.num_steps, self.draft_tokens, self.speculative
        s = self.adaptive.steps_for_batch(max(1, int(math.ceil(batch - 1e-9))))
        return s, s + 1, s > 0

    @property
    def memory_room(self) -> float:
        """records.MEMORY_ROOM as the SGLang backend reads it from this server's log
        (`memory_facts`): free after the capture over the free memory before the weights (the
        whole GPU here). For the benchmarks' in-process replays, which start no server."""
        return self.free_after_capture_bytes / self.gpu_bytes

    @property
    def graph_memory(self) -> float:
        """records.GRAPH_MEMORY, likewise: what the capture kept over the same memory."""
        return self.graph_kept_bytes / self.gpu_bytes

    def accept_probs(self, temperature: float) -> tuple[float, ...]:
        return self.accept_sampled if temperature > 0 else self.accept_greedy


class _Shape(NamedTuple):
    """What the buffers and the draft tree are sized for."""

    speculative: bool
    draft_model: bool   # draft passes and a draft model's memory (not NGRAM)
    steps: int          # tree depth
    topk: int
    n: int              # tokens verified per request per step


class _Pool(NamedTuple):
    """The static pool, per GPU: the weights, the in-pool buffers, and the KV pool left."""

    weights: float
    reserved: float
    kv_bytes: float
    kv_tokens: int


def startup(profile: Profile, params: Mapping[str, Any]) -> Facts:
    """The server's facts after start-up, or StartupError as SGLang would fail.

    The steps in the order a boot meets them: SGLang's argument rules, the KV pool left
    after the weights (`_kv_pool`), the headroom the CUDA graph capture needs
    (`_capture_headroom`), the draft tree's capture (`_check_draft_pool`); then the running
    limit and the tree's acceptance."""
    args, warnings = normalize_params(profile, params)
    sched: Schedule | None = args.pop("adaptive_schedule", None)
    shape = _shape(args, sched)
    version = str(args.get("sglang_version") or EMULATED_VERSION)
    pool = _kv_pool(profile, args, shape, version)
    headroom, need = _capture_headroom(profile, args, shape.n, sched)
    m = profile.memory
    # The fixed part is allocated before the capture (workspaces, activations); of the graphs'
    # part the capture keeps all but its warm-up passes' share (freed before SGLang reads the
    # free memory: the logged room overstates the real one by that much).
    graph_kept = (1 - m.capture_transient_share) * (need - m.headroom_fixed_bytes)
    _check_draft_pool(shape, version)
    mem_limit = pool.kv_tokens // m.request_reserve_tokens
    flag = args["max_running_requests"]
    running_limit = min(mem_limit, flag) if flag else mem_limit
    hit, nodes = profile.acceptance.sibling_hit, shape.n - 1
    greedy, widths = tree_acceptance(profile.acceptance.greedy, hit, shape.steps, shape.topk, nodes)
    sampled, _ = tree_acceptance(profile.acceptance.sampled, hit, shape.steps, shape.topk, nodes)
    return Facts(
        params=args,
        warnings=warnings,
        speculative=shape.speculative,
        draft_model=shape.draft_model,
        num_steps=shape.steps,
        topk=shape.topk,
        draft_tokens=shape.n,
        tree_widths=widths,
        accept_greedy=greedy,
        accept_sampled=sampled,
        tp_size=args["tp_size"],
        cuda_graph_max_bs=args["cuda_graph_max_bs"],
        mem_fraction_static=args["mem_fraction_static"],
        max_total_num_tokens=pool.kv_tokens,
        memory_running_limit=mem_limit,
        max_running_requests=running_limit,
        max_req_input_len=min(m.context_length - 1, pool.kv_tokens - 1),
        weight_bytes=int(pool.weights),
        kv_bytes=int(pool.kv_bytes),
        reserved_bytes=int(pool.reserved),
        headroom_bytes=int(headroom),
        headroom_need_bytes=int(need),
        gpu_bytes=int(profile.hardware.gpu_memory_bytes),
        graph_kept_bytes=int(graph_kept),
        free_after_capture_bytes=int(headroom - m.headroom_fixed_bytes - graph_kept),
        adaptive=sched,
    )


def _shape(args: Mapping[str, Any], sched: Schedule | None) -> _Shape:
    """The speculative shape of normalized args; under an adaptive schedule the deepest
    candidate's."""
    spec = args["speculative_algorithm"] is not None
    ngram = args["speculative_algorithm"] == "NGRAM"
    draft_model = spec and not ngram     # NGRAM loads no draft model and runs no draft passes
    topk = args["speculative_eagle_topk"] or 1
    n = args["speculative_num_draft_tokens"] or 1
    # NGRAM's trie paths may run as deep as its draft tokens; the EAGLE tree is `steps` deep.
    steps = n - 1 if ngram else args["speculative_num_steps"] or 0
    if sched is not None:     # the deepest candidate: the acceptance tables and histogram
        steps, n = sched.max_steps, sched.max_steps + 1
    return _Shape(spec, draft_model, steps, topk, n)


def _kv_pool(profile: Profile, args: Mapping[str, Any], shape: _Shape, version: str) -> _Pool:
    """The static pool's parts per GPU; StartupError ("kv_memory") where the KV pool cannot
    hold one request, in the words of SGLang `version`."""
    m, gpu = profile.memory, profile.hardware.gpu_memory_bytes
    tp, gbs, frac = args["tp_size"], args["cuda_graph_max_bs"], args["mem_fraction_static"]
    draft_model, n = shape.draft_model, shape.n
    weights = (m.target_weight_bytes + (m.draft_weight_bytes if draft_model else 0)) / tp
    cell = (m.kv_bytes_per_token + (m.draft_kv_bytes_per_token if draft_model else 0)) / tp
    reserved = m.pool_fixed_bytes + m.pool_bytes_per_graph_token * gbs * n
    kv_bytes = frac * gpu - weights - reserved
    kv_tokens = int(kv_bytes // cell) if kv_bytes > 0 else 0
    if kv_tokens < m.request_reserve_tokens:
        # SGLang: RuntimeError("Not enough memory. Please try to increase --mem-fraction-static.")
        # where the pool holds no token; from 0.5.14 a budget that is not positive (the weights
        # fill the static part) is its own ValueError ("Loaded weights leave no GPU memory ...").
        head = ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
                if kv_bytes > 0 or not releases.at_least(version, releases.KV_NO_BUDGET_SINCE)
                else releases.no_kv_budget(frac, (gpu - weights - reserved) / GiB, gpu / GiB))
        raise StartupError(
            "kv_memory",
            f"{head} (mem_fraction_static={frac}: static pool {frac * gpu / GiB:.2f} GiB, "
            f"weights {weights / GiB:.2f} GiB, reserved {reserved / GiB:.2f} GiB, KV pool "
            f"{kv_bytes / GiB:.2f} GiB = {kv_tokens} tokens, one request needs "
            f"{m.request_reserve_tokens})",
        )
    return _Pool(weights, reserved, kv_bytes, kv_tokens)


def _capture_headroom(profile: Profile, args: Mapping[str, Any], n: int,
                      sched: Schedule | None) -> tuple[float, float]:
    """(the memory outside the static pool, what the CUDA graph capture needs of it) per GPU;
    StartupError ("oom") where the capture would run out, as PyTorch says it."""
    m, gpu = profile.memory, profile.hardware.gpu_memory_bytes
    gbs, frac = args["cuda_graph_max_bs"], args["mem_fraction_static"]
    headroom = (1 - frac) * gpu
    if sched is None:
        need = m.headroom_fixed_bytes + m.headroom_bytes_per_graph_token * gbs * n
    else:
        # Buffers (and so the KV pool above) sized for the largest candidate, n; one runtime
        # state per candidate, its CUDA graphs for the graph batch sizes that route to it
        # (SGLang's `cuda_graph_bs_for_step`), each as large as a static server's would be.
        need = m.headroom_fixed_bytes + sum(
            m.headroom_bytes_per_graph_token * max(bs) * (s + 1)
            for s in sched.candidate_steps if (bs := sched.graph_bs_for_step(s)))
    if headroom < need:
        raise StartupError(
            "oom",
            "Capture cuda graph failed: torch.OutOfMemoryError: CUDA out of memory. Tried to "
            f"allocate {(need - headroom) / GiB:.2f} GiB. GPU 0 has a total capacity of "
            f"{gpu / GiB:.2f} GiB of which {headroom / GiB:.2f} GiB is free outside the static "
            f"pool (mem_fraction_static={frac}, cuda_graph_max_bs={gbs}, draft tokens={n}). "
            "Possible solutions: 1. set --mem-fraction-static to a smaller value "
            "2. set --cuda-graph-max-bs to a smaller value 3. use fewer draft tokens "
            "4. set --max-running-requests lower",
        )
    return headroom, need


def _check_draft_pool(shape: _Shape, version: str) -> None:
    """StartupError ("crashed") where the draft tree keeps more nodes than SGLang scores, or,
    from 0.5.16, is narrower than it is deep."""
    pool = draft_candidates(shape.steps, shape.topk)
    short = releases.short_tree_crash(shape.steps, shape.topk, shape.n, version)
    if shape.draft_model and short is not None:
        raise StartupError("crashed", short)
    if shape.draft_model and shape.n - 1 > pool:
        # SGLang's argument checks take any draft count; the draft worker's CUDA graph capture
        # runs draft_forward, whose organize_draft_results does torch.topk(scores, n - 1) over
        # a pool of `pool` candidates (eagle_draft_cuda_graph_runner.py wraps the error).
        raise StartupError(
            "crashed",
            "Exception: Capture cuda graph failed: selected index k out of range\n"
            + releases.capture_failed_hint(version),
        )


# --------------------------------------------------------------------------- the draft tree


def draft_candidates(steps: int, topk: int) -> int:
    """Candidates SGLang's EAGLE draft tree scores (`EAGLEWorker.draft_forward`:
    `select_top_k_tokens` yields topk at the first step, topk^2 at each later one); it keeps
    the best num_draft_tokens - 1 of them."""
    return topk + (steps - 1) * topk * topk if steps > 0 else 0


@lru_cache(maxsize=4096)
def tree_acceptance(
    probs: tuple[float, ...], sibling_hit: float, steps: int, topk: int, nodes: int
) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Effective conditional acceptance per depth, and the draft nodes per depth.

    `nodes` draft nodes (num_draft_tokens - 1) go, one at a time, where they add the most
    expected accepted tokens: a new depth (if the one above it has a node) or one more
    candidate at an existing depth (up to `topk`). See the module docstring for q_i(w). Nodes
    left once every depth has `topk` (SGLang's pool holds topk^2 below the first depth) widen
    the deeper depths, up to topk children of each of the topk nodes above: they hang off
    other branches than the accepted one, so they add verify work and no acceptance.
    """
    depth_max = min(steps, nodes)
    if depth_max <= 0:
        return (), ()
    base = [probs[min(i, len(probs) - 1)] for i in range(depth_max)]
    widths = [0] * depth_max
    q = [0.0] * depth_max

    def q_of(i: int, w: int) -> float:
        return 0.0 if w == 0 else 1.0 - (1.0 - base[i]) * (1.0 - sibling_hit) ** (w - 1)

    for _ in range(nodes):
        # prefix[i] = P(every depth before i accepted)
        cum, prefix = 1.0, []
        for qi in q:
            prefix.append(cum)
            cum *= qi
        best, best_gain = -1, -1.0
        for i in range(depth_max):
            if widths[i] >= topk or (i > 0 and widths[i - 1] == 0):
                continue
            new = q_of(i, widths[i] + 1)
            # gain = prefix[i] * (new - q_i) * (1 + expected accepted after depth i | depth i)
            after, c = 0.0, 1.0
            for j in range(i + 1, depth_max):
                c *= q[j]
                if c == 0.0:
                    break
                after += c
            gain = prefix[i] * (new - q[i]) * (1.0 + after)
            if gain > best_gain + 1e-15:
                best, best_gain = i, gain
        if best < 0:
            break
        widths[best] += 1
        q[best] = q_of(best, widths[best])
    left = nodes - sum(widths)
    for i in range(1, depth_max):
        extra = min(left, topk * min(widths[i - 1], topk) - widths[i])
        if extra > 0:
            widths[i] += extra
            left -= extra
    used = [i for i in range(depth_max) if widths[i] > 0]
    return tuple(q[i] for i in used), tuple(widths[i] for i in used)
