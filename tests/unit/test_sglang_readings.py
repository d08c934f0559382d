"""The SGLang backend's readings of a server, in the forms of 0.5.10.post1 and 0.5.17.

Every 0.5.17 line here is rendered from 0.5.17's own source (the f-string at the file and line
named beside it) with values chosen for the test: FROM SOURCE, NOT A LIVE SERVER. Live captures
of a 0.5.17 boot go under tests/data/ once the GPU run has them. The 0.5.10.post1 lines are from
its source likewise (tests/contract renders them from the installed package's own f-strings).
docs/engines-sglang.md section 12 is the table of these readings.
"""

from __future__ import annotations

import pytest

from specdecode_tune.backends import get_backend, sglang
from specdecode_tune.records import GRAPH_MEMORY, MEMORY_ROOM

SGLANG = get_backend("sglang")

# --------------------------------------------------------------------------- memory lines

# 0.5.10.post1, from source: model_runner.py L1075 (load), L2460-2461 (target capture),
# eagle_worker.py L257 / L272 (draft, draft extend); every rank writes every line.
LOG_0510 = """\
[2026-12-04 10:00:00 TP0] Load weight begin. avail mem=78.00 GB
[2026-12-04 10:00:09 TP0] Capture cuda graph end. Time elapsed: 8.00 s. mem usage=1.50 GB. avail mem=20.00 GB.
[2026-12-04 10:00:10 TP0] Load weight begin. avail mem=19.00 GB
[2026-12-04 10:00:12 TP0] Capture draft cuda graph end. Time elapsed: 2.00 s. mem usage=0.50 GB. avail mem=18.00 GB.
[2026-12-04 10:00:13 TP0] Capture draft extend cuda graph end. Time elapsed: 1.00 s. mem usage=0.40 GB. avail mem=17.16 GB.
"""  # noqa: E501

# 0.5.17, FROM SOURCE (values chosen), an EAGLE-3 boot on two ranks in 0.5.17's order
# (scheduler.py `init_model_worker` L974-984: both models' weights, both pools, then the
# captures, prefill before decode): model_runner.py L1012 "Load weight begin", L1100-1106 "Load
# weight end" (its "avail mem=..., mem usage=..." is no capture), kv_cache_configurator.py
# L258-259 "Memory pool end" (target, draft), model_runner_components/cuda_graph_setup.py
# L363-365 / L374-376 (prefill begin / end), L430-432 / L453-455 (verify begin / end),
# eagle_worker_v2.py L364-366 / L384-387 (draft decode) and L457-459 / L479-482 (draft extend),
# those two on TP0 only (`log_info_on_rank0`).
LOG_0517_TP2 = """\
[2026-12-04 10:00:00 TP0] Load weight begin. avail mem=78.00 GB
[2026-12-04 10:00:00 TP1] Load weight begin. avail mem=78.00 GB
[2026-12-04 10:00:05 TP0] Load weight end. elapsed=5.00 s, type=LlamaForCausalLM, avail mem=62.00 GB, mem usage=16.00 GB.
[2026-12-04 10:00:05 TP0] Load weight begin. avail mem=62.00 GB
[2026-12-04 10:00:05 TP1] Load weight begin. avail mem=62.00 GB
[2026-12-04 10:00:06 TP0] Memory pool end. avail mem=21.00 GB
[2026-12-04 10:00:06 TP1] Memory pool end. avail mem=20.00 GB
[2026-12-04 10:00:06 TP0] Memory pool end. avail mem=20.50 GB
[2026-12-04 10:00:06 TP1] Memory pool end. avail mem=19.50 GB
[2026-12-04 10:00:06 TP0] Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[4, 8, 16], avail mem=20.40 GB
[2026-12-04 10:00:08 TP0] Capture target prefill CUDA graph end. elapsed=2.10 s, mem usage=0.40 GB, avail mem=20.00 GB.
[2026-12-04 10:00:08 TP1] Capture target prefill CUDA graph end. elapsed=2.10 s, mem usage=0.40 GB, avail mem=19.00 GB.
[2026-12-04 10:00:08 TP0] Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4, bs=[1, 2, 4, 8], avail mem=20.00 GB
[2026-12-04 10:00:09 TP0] Capture target verify CUDA graph end. elapsed=0.93 s, mem usage=1.00 GB, avail mem=19.00 GB.
[2026-12-04 10:00:09 TP1] Capture target verify CUDA graph end. elapsed=0.93 s, mem usage=1.00 GB, avail mem=18.00 GB.
[2026-12-04 10:00:10 TP0] Capture draft prefill CUDA graph end. elapsed=0.50 s, mem usage=0.10 GB, avail mem=18.90 GB.
[2026-12-04 10:00:10 TP1] Capture draft prefill CUDA graph end. elapsed=0.50 s, mem usage=0.10 GB, avail mem=17.90 GB.
[2026-12-04 10:00:10 TP0] Capture draft decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2, 4, 8], avail mem=18.90 GB
[2026-12-04 10:00:11 TP0] Capture draft decode CUDA graph end. elapsed=0.70 s, mem usage=0.30 GB, avail mem=18.60 GB.
[2026-12-04 10:00:11 TP0] Capture draft extend CUDA graph begin. backend=full, num_tokens_per_req=4, bs=[1, 2, 4, 8], avail mem=18.60 GB
[2026-12-04 10:00:12 TP0] Capture draft extend CUDA graph end. elapsed=0.40 s, mem usage=0.20 GB, avail mem=18.40 GB.
[2026-12-04 10:00:20 TP0] max_total_num_tokens=1812363, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=48, context_len=131072, available_gpu_mem=18.40 GB
"""  # noqa: E501


def test_the_0510_capture_lines_are_read() -> None:
    assert sglang.memory_facts(LOG_0510) == {MEMORY_ROOM: round(17.16 / 78, 6),
                                             GRAPH_MEMORY: round(2.4 / 78, 6)}


def test_the_0517_capture_lines_with_a_comma_are_read() -> None:
    """0.5.17 writes "mem usage=K GB, avail mem=X GB" (0.5.10 a period): the backend read
    nothing of a 0.5.17 boot before. One line per graph kind (target prefill and verify, draft
    prefill, decode and extend), their usage summed; the "Load weight end" and "Memory pool end"
    lines, which also carry "avail mem", are not captures."""
    one_rank = "\n".join(ln for ln in LOG_0517_TP2.splitlines() if " TP1]" not in ln)
    assert sglang.memory_facts(one_rank) == {MEMORY_ROOM: round(18.4 / 78, 6),
                                             GRAPH_MEMORY: round(2.0 / 78, 6)}


def test_a_rank_without_the_drafts_capture_lines_is_given_tp0s() -> None:
    """From 0.5.12 the draft worker logs its decode and extend captures on TP0 only: TP1's log
    stops at 17.90 GB after its draft prefill. Its missing captures are taken as TP0's (0.5 GB),
    so TP1, with less room, is the rank read: (17.90 - 0.5) / 78, graphs 2.0 / 78."""
    assert sglang.memory_facts(LOG_0517_TP2) == {MEMORY_ROOM: round(17.4 / 78, 6),
                                                 GRAPH_MEMORY: round(2.0 / 78, 6)}


@pytest.mark.parametrize("line", [
    # 0.5.17 multi_layer_eagle_draft_extend_cuda_graph_runner.py L602-605 (per step; FROM SOURCE)
    "Capture draft extend CUDA graph end. step=2, elapsed=0.31 s, mem usage=0.12 GB, "
    "avail mem=10.00 GB.",
    # 0.5.17 same file L905-907 (single-CG draft extend; FROM SOURCE)
    "Capture single-CG draft extend end. elapsed=0.31 s, mem usage=0.12 GB, avail mem=10.00 GB.",
    # 0.5.10.post1 model_runner.py L2574-2575 (piecewise prefill graphs)
    "Capture piecewise CUDA graph end. Time elapsed: 0.31 s. mem usage=0.12 GB. "
    "avail mem=10.00 GB.",
])
def test_every_capture_kind_is_read(line: str) -> None:
    log = f"[t TP0] Load weight begin. avail mem=50.00 GB\n[t TP0] {line}"
    assert sglang.memory_facts(log) == {MEMORY_ROOM: 0.2, GRAPH_MEMORY: round(0.12 / 50, 6)}


def test_lines_that_are_no_capture_end_say_nothing() -> None:
    """0.5.17's begin lines, "Load weight end", "Init torch distributed ends" (mem usage, no
    avail mem), the post-capture KV resize (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING, off by
    default; kv_pool_runtime.py L121-127) and the capture progress (not read: docs section 6b)."""
    log = "\n".join([
        "[t TP0] Load weight begin. avail mem=50.00 GB",
        "[t TP0] Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4, "
        "bs=[1, 2], avail mem=40.00 GB",
        "[t TP0] Load weight end. elapsed=1.00 s, type=X, avail mem=30.00 GB, mem usage=20.00 GB.",
        "[t TP0] Init torch distributed ends. elapsed=0.50 s, mem usage=0.20 GB",
        "[t TP0] Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: 100, "
        "KV size: 1.00 GB, avail mem=3.00 GB",
        "[t TP0] Capturing batches (bs=8 avail_mem=12.00 GB)",
    ])
    assert sglang.memory_facts(log) == {}
