"""What the backend reads in an SGLang server's log: why a start failed (`FAILURE_PATTERNS`,
which the server's classifier applies) and how much memory the boot left and its CUDA graphs
kept (`memory_facts`, into the trial's facts). Each line's source, per release, is in
docs/engines-sglang.md sections 6b and 12.
"""

from __future__ import annotations

import re

from ..records import GRAPH_MEMORY, MEMORY_ROOM
from .failurepatterns import FailurePatterns

# SGLang's start-up failures (docs/engines-sglang.md section 12 has each line's source, per
# release): the memory pool checks (the KV pool, or a hybrid model's state cache, left after
# the weights cannot hold a request), and the argument checks, which assert or raise ValueError
# in server_args.py (0.5.10.post1) or, from 0.5.13, in arg_groups/*.py (the speculative ones:
# arg_groups/speculative_hook.py, called from server_args.py). Every pattern is kept whatever
# the release: a line of one release never means another thing in another.
# Its out-of-memory lines are PyTorch's (the classifier knows those for every engine; a capture
# that runs out says "Capture cuda graph failed: CUDA out of memory. ..." in every release);
# its hints say "out-of-memory", "an OOM problem" and "This is not an out-of-memory error",
# which must not count.
FAILURE_PATTERNS = FailurePatterns(
    kv_memory=(
        # 0.5.10.post1 model_runner_kv_cache_mixin.py L57; 0.5.17 pool_configurator.py L64 (a
        # budget that rounds to no token)
        r"Not enough memory\. Please try to increase --mem-fraction-static",
        # 0.5.14+ (0.5.17 mem_cache/kv_cache_configurator.py L1648): the weights (target and
        # draft) leave no budget; 0.5.10.post1 said "Not enough memory" for this too
        r"Loaded weights leave no GPU memory for the KV cache",
        # 0.5.13+ (0.5.17 kv_cache_configurator.py L1964, L1754): a hybrid model's state cache
        r"Not enough GPU memory for hybrid \(mamba/linear-attention\) state cache",
        r"state cache is too small to serve any requests",
        # 0.5.14+ (0.5.17 pool_configurator.py L576): sliding-window models
        r"leaves no room for the full KV pool",
    ),
    arg_exceptions=("AssertionError",),
    arg_check_files=(r"server_args\.py", r"arg_groups[/\\]\w+\.py"),
)


# SGLang's memory lines: each rank logs the free memory of its GPU ("avail mem=X GB", X in
# 2**30 bytes, read after emptying the allocator's cache) before it loads weights, and after
# each CUDA graph capture with what that capture kept. "Load weight begin. avail mem=X GB" is
# the same in every release (0.5.10.post1 model_runner.py L1075, 0.5.17 L1012); the first one
# of a rank is the target's (the draft model loads after it). The capture's end line:
# - 0.5.10.post1 to 0.5.13: "Capture cuda graph end. Time elapsed: T s. mem usage=K GB. avail
#   mem=X GB." (model_runner.py L2460-2461; the piecewise prefill graphs' L2574-2575; the EAGLE
#   draft worker's "Capture draft cuda graph end. ..." and "Capture draft extend cuda graph
#   end. ...", eagle_worker.py L257, L272): a period after the usage.
# - from 0.5.14 (`CAPTURE_COMMA_SINCE`): one line per graph kind, a comma after the usage:
#   "Capture target verify CUDA graph end. elapsed=T s, mem usage=K GB, avail mem=X GB." (0.5.17
#   model_runner_components/cuda_graph_setup.py L453-455: "{target|draft} {decode|verify}";
#   L374-376: "target prefill" / "draft prefill"; eagle_worker_v2.py L384-387 "draft decode",
#   L479-482 "draft extend"; multi-layer EAGLE's per-step draft extend,
#   multi_layer_eagle_draft_extend_cuda_graph_runner.py L602-605, L905-907).
# Both forms are read. From 0.5.12 the draft worker writes its own captures' lines (draft
# decode, draft extend) on TP rank 0 only (`log_info_on_rank0`; 0.5.17 eagle_worker_v2.py L362,
# L382, L455, L477), after the lines every rank writes, so with tp > 1 the other ranks' logs
# stop short: their missing captures are taken as TP0's (the draft is sharded alike), their
# usage taken off the rank's last reading and added to what its captures kept.
# The rank tags come from SGLang's log prefix ("[%(asctime)s DP0 PP0 ATTN_CP0 MOE_DP0 TP1 EP1]",
# configure_logger's prefix as the scheduler builds it; the same in 0.5.17, scheduler.py
# L4846-4856).
CAPTURE_COMMA_SINCE = "0.5.14"
_LOAD_BEGIN = re.compile(r"Load weight begin\. avail mem=([0-9.]+) GB")
_CAPTURE_END = re.compile(r"Capture [^\n]*? end\. [^\n]*?mem usage=(-?[0-9.]+) GB[.,] "
                          r"avail mem=([0-9.]+) GB")
_RANK = re.compile(r"\b([A-Z][A-Z_]*\d+)\b")


def memory_facts(log_text: str) -> dict[str, float]:
    """records.MEMORY_ROOM and GRAPH_MEMORY from a boot's log: the free memory after the last
    CUDA graph capture, and the memory the captures kept (their "mem usage" summed), over the
    free memory before the weights, on the rank with the least room; {} where the log has no
    capture line (CUDA graphs off, a CPU server). A rank whose log lacks the last captures of
    the rank with the most (SGLang >= 0.5.12 logs the draft's on TP0 only) is given that
    rank's usage for them.

    SGLang sizes its static pool as mem_fraction_static times the memory free at start-up (the
    rest outside the pool is that times 1 - mem_fraction_static: `profile_max_num_token`;
    0.5.17 kv_cache_configurator.py `_profile_available_bytes`, where the draft's weights are
    in the pool too), so adding r to the fraction takes r times that memory from what the
    capture had: the room is how far the fraction could have risen, at most. Not the boundary
    itself: the warm-up passes before each capture use memory they free before the reading."""
    first: dict[str, float] = {}
    captures: dict[str, list[tuple[float, float]]] = {}    # (mem usage, avail mem) per line
    for line in log_text.splitlines():
        head = line[:line.find("]") + 1] if line.startswith("[") else ""
        rank = " ".join(_RANK.findall(head))
        if (m := _LOAD_BEGIN.search(line)) is not None:
            first.setdefault(rank, float(m.group(1)))
        elif (m := _CAPTURE_END.search(line)) is not None and rank in first:
            captures.setdefault(rank, []).append((max(0.0, float(m.group(1))),
                                                  float(m.group(2))))
    if not captures:
        return {}
    fullest = max(captures.values(), key=len)
    room: dict[str, tuple[float, float]] = {}
    for rank, lines in captures.items():
        if first[rank] <= 0:
            continue
        unseen = sum(usage for usage, _ in fullest[len(lines):])
        room[rank] = ((lines[-1][1] - unseen) / first[rank],
                      (sum(usage for usage, _ in lines) + unseen) / first[rank])
    if not room:
        return {}
    left, graphs = min(room.values())
    return {MEMORY_ROOM: round(max(0.0, left), 6), GRAPH_MEMORY: round(graphs, 6)}
