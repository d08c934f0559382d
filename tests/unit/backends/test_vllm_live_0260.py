"""The vLLM backend's readings held against what vLLM 0.26.0 with EAGLE-3 said on an H100.

Every file read here is the live server's own words (tests/data/vllm-0.26.0/README.md says
what each is and what was cut), kept by `scripts/device/engine_readings.py` on the GPU route
(2026-12-06): the trained test pair (docs/eagle3-models.md), `num_speculative_tokens` 3 at
`--gpu-memory-utilization` 0.02, the refusal at 0.005, and the per-batch-size schedule
[[1, 8, 5], [9, 64, 2]] booted with piecewise CUDA graphs. `readings.json` is what the
backend read from the same server in the same minute; these tests read the kept words again
with today's code and must agree with the server and with that record.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from specdecode_tune.backends import get_backend, prometheus, speccounters
from specdecode_tune.server.failures import classify_failure
from tests.unit.backends.test_backend_contract import Replay

LIVE = Path(__file__).resolve().parents[2] / "data" / "vllm-0.26.0"
VLLM = get_backend("vllm")
READ = json.loads((LIVE / "readings.json").read_text())


def words(name: str) -> str:
    return (LIVE / name).read_text()


def snapshot(name: str) -> dict[str, float]:
    return speccounters.snapshot(prometheus.parse(words(name)), "vllm:")


@pytest.fixture(scope="module")
def idle_server() -> Iterator[str]:
    """The healthy server's idle answers at the backend's own paths, on loopback."""
    files = {path: LIVE / name for name, path in VLLM.raw_paths}
    files["/metrics"] = LIVE / "metrics-before.txt"
    replay = Replay({path: f.read_bytes() for path, f in files.items() if f.is_file()})
    yield replay.url
    replay.close()


def test_the_kv_budget_read_is_the_one_the_log_states(idle_server: str) -> None:
    """`vllm:cache_config_info`'s blocks x block size is the log's "GPU KV cache size", and
    its concurrency the log's "Maximum concurrency" (0.26.0 has no kv_cache_size_tokens)."""
    facts = VLLM.read_facts(idle_server)
    log = words("healthy-startup.log")
    tokens = int(re.search(r"GPU KV cache size: ([\d,]+) tokens", log)[1].replace(",", ""))
    conc = float(re.search(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x",
                           log)[1])
    assert facts.max_total_num_tokens == tokens == 101_040
    assert float(facts.extra["kv_cache_max_concurrency"]) == pytest.approx(conc, abs=0.01)
    assert facts.extra["max_model_len"] == 2048
    assert facts.max_total_num_tokens == READ["healthy"]["facts"]["max_total_num_tokens"]
    # vLLM does not report its running limit: the --max-num-seqs it was given is the limit.
    assert facts.max_running_requests is None
    assert VLLM.running_limit(facts, READ["healthy"]["params"]) == 64


def test_the_bytes_per_token_are_the_pairs_kv_layout() -> None:
    """1.06 GiB for 101,040 tokens: 11 layers (10 target + the EAGLE-3 head's 1) x K and V x
    4 KV heads x 64 x 2 bytes = 11,264 B a token, as experiments/vllm-gpu.toml derives."""
    log = words("healthy-startup.log")
    gib = float(re.search(r"Available KV cache memory: ([\d.]+) GiB", log)[1])
    per_token = gib * 2**30 / 101_040
    assert per_token == pytest.approx(11 * 2 * 4 * 64 * 2, rel=0.01)


def test_the_window_acceptance_is_the_counters_delta() -> None:
    """The level's acceptance from /metrics before and after it: 1 + accepted / drafts, and
    the exactly-j histogram sums to the drafts and to the accepted tokens."""
    before, after = snapshot("metrics-before.txt"), snapshot("metrics-after.txt")
    length, exact = VLLM.window_acceptance(before, after)
    drafts = after["vllm:spec_decode_num_drafts_total"] - before[
        "vllm:spec_decode_num_drafts_total"]
    accepted = after["vllm:spec_decode_num_accepted_tokens_total"] - before[
        "vllm:spec_decode_num_accepted_tokens_total"]
    assert length == pytest.approx(1 + accepted / drafts)
    assert length == pytest.approx(READ["healthy"]["window_acceptance"][0])
    assert len(exact) == 3 + 1                      # num_speculative_tokens 3: j = 0..3
    assert sum(exact) == drafts
    assert sum(j * n for j, n in enumerate(exact)) == accepted
    assert list(exact) == READ["healthy"]["window_acceptance"][1]
    # A trained head: acceptance falls with the draft position, and most steps take all 3.
    per_pos = speccounters.per_position(exact)
    assert per_pos[0] > per_pos[1] > per_pos[2] and exact[3] > drafts / 2


def test_the_schedule_drafted_five_alone_and_two_in_a_batch() -> None:
    """[[1, 8, 5], [9, 64, 2]] booted (piecewise graphs): at C=1 every verify step carried 5
    draft tokens, in the C=16 window about 2; what the counters say, not what we asked."""
    c1, c16 = snapshot("metrics-adaptive-C1.txt"), snapshot("metrics-adaptive-C16.txt")
    d, t = "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total"
    assert c1[t] / c1[d] == pytest.approx(5.0)
    assert (c16[t] - c1[t]) / (c16[d] - c1[d]) == pytest.approx(2.0, abs=0.05)
    length, exact = VLLM.window_acceptance(c1, c16)
    assert length is not None and 1 < length < 3     # at most 2 drafted + the bonus token
    log = words("adaptive-startup.log")
    assert "num_spec_tokens=5" in log and "Capturing decode CUDA graphs (FULL)" not in log
    assert READ["adaptive"]["params"]["compilation_config"] == '{"cudagraph_mode":"PIECEWISE"}'


def test_the_refusal_below_the_weights_is_a_kv_refusal() -> None:
    kind, reason = classify_failure(1, words("refused-kv-0.005.log"), VLLM)
    assert kind == "kv_memory" == READ["refused-0"]["kind"]
    assert "No available memory for the cache blocks" in reason
    assert classify_failure(1, words("refused-kv-0.005.log"))[0] == "kv_memory"


def test_the_drain_count_is_the_servers_gauges() -> None:
    """Polled through the level's end, the backend's in-flight count and the raw gauges
    (num_requests_running + num_requests_waiting) are two reads a few ms apart: at C=16, with
    requests ending every ~20 ms, they differ by 2 at most while it runs, agree when idle, and
    both reach 0 within 0.1 s of the level's end."""
    rows = [json.loads(ln) for ln in words("metrics-drain.jsonl").splitlines()]
    raw = [sum(int(s.value) for s in prometheus.parse(r["body"]) if s.name in VLLM.busy_gauges)
           for r in rows]
    assert all(abs(r["ours"] - n) <= 2 for r, n in zip(rows, raw, strict=True))
    assert all(r["ours"] == 0 for r, n in zip(rows, raw, strict=True) if n == 0)
    busy = [r["t"] for r in rows if r["ours"] > 0]
    idle_after = [r["t"] for r in rows if r["t"] > busy[-1]]
    assert max(raw) == 16 and idle_after and idle_after[0] - busy[-1] < 0.15


def test_the_healthy_log_is_no_refusal() -> None:
    assert classify_failure(None, words("healthy-startup.log"), VLLM)[0] == "timeout"


def test_the_boot_log_says_which_graphs_were_compiled_and_the_kv_memory_left() -> None:
    """A boot that compiled its graphs (the backbone's and the EAGLE-3 head's) and one that
    loaded them from the compile cache, and the KV memory each left. The landscape's boots of
    2026-12-07 on one H100, both K at 0.01 of its memory: the first speculative boot on the
    machine compiled (torch.compile 15.0 + 9.2 s) and left 0.27 GiB, 25,568 tokens; the next
    (K 4, the same compile cache directory: K 4 and K 8 share a CUDA-graph size, 512) loaded
    both graphs (2.2 + 0.3 s) and left 0.32 GiB, 30,304 tokens. vLLM compiles inside the
    profile run that sizes its KV memory; this is the reading the report's KV-moves paragraph
    names."""
    from specdecode_tune.records import COMPILED_GRAPHS, LOADED_GRAPHS

    cold = VLLM.memory_facts(words("landscape-cold-startup.log"))
    warm = VLLM.memory_facts(words("landscape-warm-startup.log"))
    assert (cold[COMPILED_GRAPHS], cold[LOADED_GRAPHS]) == (2, 0)
    assert (warm[COMPILED_GRAPHS], warm[LOADED_GRAPHS]) == (0, 2)
    assert cold["kv_memory_gib"] == pytest.approx(0.27)
    assert warm["kv_memory_gib"] == pytest.approx(0.32)
    for name, tokens in (("landscape-cold-startup.log", 25_568),
                         ("landscape-warm-startup.log", 30_304)):
        said = re.search(r"GPU KV cache size: ([\d,]+) tokens", words(name))
        assert said is not None and int(said[1].replace(",", "")) == tokens
    # The readings step's boots of 2026-12-06 compiled too (a fresh cache each).
    for name in ("healthy-startup.log", "adaptive-startup.log"):
        facts = VLLM.memory_facts(words(name))
        assert (facts[COMPILED_GRAPHS], facts[LOADED_GRAPHS]) == (2, 0), name
        assert facts["kv_memory_gib"] == pytest.approx(1.06)
    assert VLLM.memory_facts(words("refused-kv-0.005.log")).get("kv_memory_gib") is None
    assert VLLM.memory_facts("INFO nothing of the kind") == {}
