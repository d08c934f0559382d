"""The simulator as a subprocess on loopback: start-up rules, endpoints, errors, disconnects,
signals."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import time

import aiohttp
import pytest
from simserver import health_status, run_sim, sim_log, stop

from specdecode_tune.backends import SimBackend
from specdecode_tune.backends.speccounters import in_flight
from specdecode_tune.trial import drain

# The seed profile's model is a hybrid: SGLang 0.5.10 speculates on it only without radix cache.
NO_RADIX = "--disable-radix-cache"
SPEC4 = ("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "4",
         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "5", NO_RADIX)
FAST = ("--boot-time", "0.2", "--enable-metrics")


def _get(url: str) -> tuple[int, dict]:
    async def go() -> tuple[int, dict]:
        async with aiohttp.ClientSession() as s, s.get(url) as r:
            return r.status, await r.json(content_type=None)
    return asyncio.run(go())


def _post(url: str, body: bytes | dict) -> tuple[int, dict]:
    async def go() -> tuple[int, dict]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with aiohttp.ClientSession() as s, s.post(url, data=data) as r:
            return r.status, await r.json(content_type=None)
    return asyncio.run(go())


def _metric(base: str, name: str) -> float:
    async def go() -> str:
        async with aiohttp.ClientSession() as s, s.get(base + "/metrics") as r:
            return await r.text()
    for line in asyncio.run(go()).splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def _wait_exit(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"simulator still running after {timeout} s")


# ----------------------------------------------------------------------------- start-up


def test_health_is_503_while_booting_then_200() -> None:
    with run_sim(*SPEC4, "--boot-time", "2.0", wait=False) as (base, _):
        deadline = time.monotonic() + 10
        status = None
        while status is None and time.monotonic() < deadline:   # port bound at start
            status = health_status(base)
            time.sleep(0.02)
        assert status == 503
        assert health_status(base, "/health_generate") == 503
        assert health_status(base, "/server_info") == 503
        assert _post(base + "/generate", {"text": "hi"})[0] == 503
        while health_status(base) != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert health_status(base) == 200
        assert health_status(base, "/health_generate") == 200


def test_health_runs_a_one_token_generation_as_sglang_does() -> None:
    # SGLang 0.5.10 `health_generate`: a 1-token generation, first polled after 1 s; a plain
    # 200 with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false (docs/engines-sglang.md s. 8).
    with run_sim(*SPEC4, *FAST) as (base, _):
        t0 = time.monotonic()
        assert health_status(base) == 200
        assert 1.0 <= time.monotonic() - t0 < 1.9
    plain = {**os.environ, "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false"}
    with run_sim(*SPEC4, *FAST, env=plain) as (base, _):
        t0 = time.monotonic()
        assert health_status(base) == 200
        assert time.monotonic() - t0 < 0.5


def test_server_info_fields_as_sglang_0_5_10() -> None:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="3,5")
    with run_sim(*SPEC4, *FAST, "--random-seed", "7", env=env) as (base, _):
        status, info = _get(base + "/server_info")
        assert status == 200
        assert _get(base + "/get_server_info")[1]["max_total_num_tokens"] == \
            info["max_total_num_tokens"]
        facts = SimBackend().read_facts(base)
    assert "gpu_ids" not in info          # SGLang reports none; the trial reads its env
    assert info["disable_radix_cache"] is True
    assert info["tp_size"] == 2 and info["host"] == "127.0.0.1"
    assert (info["speculative_algorithm"], info["speculative_num_steps"]) == ("EAGLE3", 4)
    assert (info["speculative_eagle_topk"], info["speculative_num_draft_tokens"]) == (1, 5)
    assert info["mem_fraction_static"] == 0.85 and info["cuda_graph_max_bs"] == 64
    assert info["random_seed"] == 7 and info["profile"] == "seed-qwen35-122b"
    # The flag as SGLang leaves it (48: speculation without --max-running-requests), and the
    # scheduler's effective limit, derived from memory at steps 4: the facts reader takes it.
    assert info["max_running_requests"] == 48
    assert 200_000 < info["max_total_num_tokens"] < 230_000
    assert info["max_req_input_len"] > 0 and info["version"]
    state = info["internal_states"][0]
    assert state["max_running_requests"] == 48
    assert state["effective_max_running_requests_per_dp"] == 12
    assert facts.max_running_requests == 12 and facts.gpu_ids == ()
    assert {"avg_spec_accept_length", "last_gen_throughput", "memory_usage"} <= set(state)
    assert state["memory_usage"]["token_capacity"] == info["max_total_num_tokens"]


def test_the_flag_caps_running() -> None:
    with run_sim(*SPEC4, *FAST, "--max-running-requests", "5") as (base, _):
        info = _get(base + "/server_info")[1]
    assert info["max_running_requests"] == 5
    assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 5


def test_ngram_serves_with_sglangs_defaults() -> None:
    # 12 draft tokens fit the seed profile's KV only with fewer captured batch sizes.
    with run_sim("--speculative-algorithm", "NGRAM", NO_RADIX, "--cuda-graph-max-bs", "16",
                 *FAST) as (base, proc):
        info = _get(base + "/server_info")[1]
        status, body = _post(base + "/generate", {"text": "a b", "sampling_params": {
            "max_new_tokens": 20, "temperature": 0}})
        log = sim_log(proc)
    assert (info["speculative_algorithm"], info["speculative_eagle_topk"],
            info["speculative_num_draft_tokens"]) == ("NGRAM", 10, 12)
    assert status == 200 and body["meta_info"]["spec_draft_token_num"] == \
        11 * body["meta_info"]["spec_verify_ct"]
    assert "set to 12 by default for ngram" in log


def test_topk_one_forces_draft_tokens_with_a_warning() -> None:
    args = ("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "8", NO_RADIX)
    with run_sim(*args, *FAST) as (base, proc):
        info = _get(base + "/server_info")[1]
        log = sim_log(proc)
    assert info["speculative_num_draft_tokens"] == 4
    assert "WARNING" in log and "speculative_num_draft_tokens is adjusted" in log


@pytest.mark.parametrize(
    ("args", "code", "phrase"),
    [
        # SGLang's hybrid-model check comes first, raised from server_args.py: exit 1.
        (("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"), 1,
         "ValueError: Speculative decoding for Qwen3_5MoeForConditionalGeneration is not "
         "compatible with radix cache"),
        (("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", NO_RADIX), 2,
         "set together"),
        # Past SGLang's draft pool (2 + 4 candidates): its draft CUDA graph capture fails.
        (("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "2",
          "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "8",
          "--cuda-graph-max-bs", "16", NO_RADIX), 1,
         "Capture cuda graph failed: selected index k out of range"),
        (("--speculative-algorithm", "MEDUSA"), 2, "invalid choice"),
        (("--mem-fraction-static", "1.5"), 2, "mem-fraction-static"),
        (("--no-such-flag",), 2, "unrecognized arguments"),
        (("--profile", "no-such-profile"), 2, "not found"),
        (("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "10",
          "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "11", NO_RADIX), 1,
         "Not enough memory"),
        (("--mem-fraction-static", "0.5"), 1, "Not enough memory"),
        (("--mem-fraction-static", "0.97"), 1, "CUDA out of memory"),
    ],
)
def test_startup_failures_exit_nonzero_with_sglang_messages(args: tuple[str, ...], code: int,
                                                            phrase: str) -> None:
    with run_sim(*args, "--boot-time", "0.2", wait=False) as (_, proc):
        assert _wait_exit(proc) == code
        log = sim_log(proc)
    assert phrase in log
    if phrase == "Not enough memory":
        assert "increase --mem-fraction-static" in log


def test_port_in_use_exits_1() -> None:
    with run_sim(*FAST) as (base, _):
        port = base.rsplit(":", 1)[1]
        with run_sim("--port", port, "--boot-time", "0.2", wait=False) as (_, second):
            assert _wait_exit(second) == 1
            assert "cannot bind" in sim_log(second)


# ----------------------------------------------------------------------------- requests


def test_generate_stream_fields_and_consistency() -> None:
    body = {"text": "one two three four", "stream": True,
            "sampling_params": {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}}

    async def go(base: str) -> list[dict]:
        chunks = []
        async with aiohttp.ClientSession() as s, s.post(base + "/generate", json=body) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
            async for raw in r.content:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    chunks.append({"done": True})
                elif line.startswith("data: "):
                    chunks.append(json.loads(line[6:]))
        return chunks

    with run_sim(*SPEC4, *FAST) as (base, _):
        chunks = asyncio.run(go(base))
        info = _get(base + "/server_info")[1]
    assert chunks[-1] == {"done": True}
    data = chunks[:-1]
    final = data[-1]["meta_info"]
    # output_ids cumulative, as SGLang streams by default; spec fields on the final chunk only.
    assert len(data[-1]["output_ids"]) == final["completion_tokens"] == 40
    assert all(len(c["output_ids"]) == c["meta_info"]["completion_tokens"] for c in data)
    assert all(a["output_ids"] == b["output_ids"][:len(a["output_ids"])]
               for a, b in itertools.pairwise(data))
    assert not any(k.startswith("spec_") for c in data[:-1] for k in c["meta_info"])
    counts = [c["meta_info"]["completion_tokens"] for c in data]
    assert counts == sorted(counts)
    assert data[-1]["text"].split() and len(data[-1]["text"].split()) == 40       # cumulative text
    assert final["prompt_tokens"] == 4
    assert final["finish_reason"] == {"type": "length", "length": 40}
    assert all(c["meta_info"]["finish_reason"] is None for c in data[:-1])
    verify = final["spec_verify_ct"]
    assert final["spec_accept_length"] == pytest.approx(40 / verify)
    assert 40 == 1 + verify + final["spec_accept_token_num"]  # noqa: SIM300 (the total first)
    assert final["spec_draft_token_num"] == 4 * verify
    hist = final["spec_accept_histogram"]
    assert len(hist) == 5 and sum(hist) == verify
    assert sum(i * n for i, n in enumerate(hist)) == final["spec_accept_token_num"]
    assert len(data) == verify + 1                     # a chunk per iteration: prefill, verifies
    assert info["internal_states"][0]["avg_spec_accept_length"] == pytest.approx(39 / verify)


def test_openai_completions_and_chat() -> None:
    async def stream(base: str, path: str, body: dict) -> list[dict]:
        out = []
        async with aiohttp.ClientSession() as s, s.post(base + path, json=body) as r:
            assert r.status == 200
            async for raw in r.content:
                line = raw.decode().strip()
                if line.startswith("data: ") and line != "data: [DONE]":
                    out.append(json.loads(line[6:]))
        return out

    with run_sim(*SPEC4, *FAST) as (base, _):
        body = {"model": "m", "prompt": "a b c", "max_tokens": 12, "stream": True, "temperature": 0,
                "ignore_eos": True, "stream_options": {"include_usage": True}}
        chunks = asyncio.run(stream(base, "/v1/completions", body))
        body.pop("stream_options")
        plain = asyncio.run(stream(base, "/v1/completions", body))
        chat = asyncio.run(stream(base, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 6,
            "stream": True}))
        status, single = _post(base + "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 5})
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert len(text.split()) == 12
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 12, "total_tokens": 15}
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert plain[-1]["usage"]["completion_tokens"] == 12 and \
        plain[-1]["choices"][0]["finish_reason"] == "length"
    assert chat[0]["choices"][0]["delta"]["role"] == "assistant"
    assert len("".join(c["choices"][0]["delta"].get("content", "") for c in chat).split()) == 6
    assert status == 200 and single["usage"]["prompt_tokens"] == 3 and \
        single["usage"]["completion_tokens"] == 5


def test_bad_requests_get_400_and_404_and_never_crash() -> None:
    with run_sim(*SPEC4, *FAST) as (base, proc):
        cases = [
            (base + "/generate", b"{not json"),
            (base + "/generate", b"[1, 2]"),
            (base + "/generate", {"sampling_params": {}}),
            (base + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": -3}}),
            (base + "/generate", {"text": "hi", "sampling_params": {"temperature": "hot"}}),
            (base + "/generate", {"text": "", "sampling_params": {}}),
            (base + "/generate", {"text": ["a", "b"]}),
            (base + "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 10_000_000}}),
            (base + "/v1/completions", {"max_tokens": 3}),
            (base + "/v1/chat/completions", {"messages": "hi"}),
        ]
        for url, body in cases:
            status, err = _post(url, body)
            assert status == 400, (url, body, err)
            assert err["error"]["message"]
        status, err = _get(base + "/no/such/path")
        assert status == 404 and "Not Found" in err["error"]["message"]
        assert _get(base + "/generate")[0] == 405
        assert _post(base + "/generate", {"text": "still alive",
                                          "sampling_params": {"max_new_tokens": 3}})[0] == 200
        assert proc.poll() is None


def _post_stream(url: str, body: dict) -> tuple[int, list[bytes]]:
    async def go() -> tuple[int, list[bytes]]:
        # Bounded: a server that accepted the request would stream for minutes.
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout) as s, s.post(url, json=body) as r:
            return r.status, [line.strip() for line in (await r.read()).splitlines()
                              if line.strip()]
    return asyncio.run(go())


def test_a_request_beyond_the_context_is_refused_as_sglang_refuses_it() -> None:
    """max_new_tokens past the context length: SGLang's streamed /generate has answered 200
    before it validates, so the refusal is an error event then [DONE]; its OpenAI endpoints and
    the unstreamed /generate answer 400. The message is SGLang's."""
    too_long = 300_000
    phrase = "Requested token count exceeds the model's maximum context length of 262144 tokens"
    with run_sim(*SPEC4, *FAST, "--mem-fraction-static", "0.92") as (base, proc):
        status, lines = _post_stream(base + "/generate", {
            "text": "w " * 256, "stream": True,
            "sampling_params": {"max_new_tokens": too_long, "ignore_eos": True}})
        assert status == 200 and lines[-1] == b"data: [DONE]" and len(lines) == 2
        event = json.loads(lines[0].removeprefix(b"data: "))
        assert set(event) == {"error"} and event["error"]["message"].startswith(phrase)
        assert "256 tokens from the input messages and 300000 tokens" in \
            event["error"]["message"]
        status, err = _post(base + "/generate", {"text": "w " * 256,
                                                 "sampling_params": {"max_new_tokens": too_long}})
        assert status == 400 and err["error"]["message"].startswith(phrase)
        status, err = _post(base + "/v1/completions", {"prompt": "w " * 256, "stream": True,
                                                       "max_tokens": too_long})
        assert status == 400 and err["message"].startswith(phrase) and err["code"] == 400
        ok = {"text": "ok", "sampling_params": {"max_new_tokens": 3}}
        assert _post(base + "/generate", ok)[0] == 200
        assert proc.poll() is None


def test_client_disconnects_free_slots_and_kv() -> None:
    body = {"text": "w " * 100, "stream": True,
            "sampling_params": {"max_new_tokens": 5000, "temperature": 0, "ignore_eos": True}}

    async def one(session: aiohttp.ClientSession, base: str, chunks_before_leaving: int) -> None:
        async with session.post(base + "/generate", json=body) as r:
            seen = 0
            async for raw in r.content:
                seen += raw.startswith(b"data: ")
                if seen >= chunks_before_leaving:
                    return          # leave mid-stream: the connection is closed with the session

    async def go(base: str) -> None:
        # 20 streams > running limit 12: 8 wait in the queue at first
        async with aiohttp.ClientSession() as s:
            # each leaves after 3 chunks; the queued ones get admitted as slots free, then leave
            await asyncio.gather(*(one(s, base, 3) for _ in range(20)))
            # cancelled after 0.3 s: 12 running and 8 still queued at that moment
            tasks = [asyncio.create_task(one(s, base, 10**6)) for _ in range(20)]
            await asyncio.sleep(0.3)
            # what a trial's drain reads: running + queued, from SGLang's /get_load
            busy.append(await asyncio.to_thread(SimBackend().in_flight, base))
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    busy: list[int | None] = []
    with run_sim(*SPEC4, *FAST) as (base, proc):
        asyncio.run(go(base))
        left, waited = drain(lambda: SimBackend().in_flight(base), 5.0)
        assert busy == [20]
        assert left == 0, f"aborted requests still hold slots after {waited:.1f} s"
        assert _metric(base, "sglang:token_usage") == 0.0
        assert _metric(base, "sglang:num_aborted_requests_total") == 40
        status, out = _post(base + "/generate",
                            {"text": "after", "sampling_params": {"max_new_tokens": 4}})
        assert status == 200 and out["meta_info"]["completion_tokens"] == 4
        assert proc.poll() is None


def test_metrics_names_and_flush_cache() -> None:
    with run_sim(*SPEC4, *FAST) as (base, _):
        before = asyncio.run(_metrics_text(base))
        _post(base + "/generate",
              {"text": "a b", "sampling_params": {"max_new_tokens": 30, "temperature": 0}})

        async def text(path: str) -> tuple[int, str]:
            async with aiohttp.ClientSession() as s, s.post(base + path) as r:
                return r.status, await r.text()
        flushed = asyncio.run(text("/flush_cache"))
        body = asyncio.run(_metrics_text(base))
        model = _get(base + "/model_info")[1]
    for name in ("sglang:generation_tokens_total", "sglang:num_running_reqs",
                 "sglang:num_queue_reqs", "sglang:token_usage", "sglang:spec_accept_length",
                 "sglang:time_to_first_token_seconds_bucket",
                 "sglang:inter_token_latency_seconds_bucket",
                 "sglang:e2e_request_latency_seconds_bucket"):
        assert f"\n{name}{{" in "\n" + body, name
    # SGLang 0.5.10 has no time-per-output-token histogram, and its labelled histograms show
    # samples only once a request has been observed.
    assert "sglang:time_per_output_token_seconds" not in body
    assert "\nsglang:inter_token_latency_seconds_bucket{" not in before
    assert "# TYPE sglang:inter_token_latency_seconds histogram" in before
    # 29 tokens after the first, each counted once (a chunk of n counts n observations).
    assert 'sglang:inter_token_latency_seconds_count{model_name="Qwen/Qwen3.5-122B-A10B-FP8"} ' \
           '29' in body
    assert 'sglang:generation_tokens_total{model_name="Qwen/Qwen3.5-122B-A10B-FP8"} 30.0' in body
    assert flushed[0] == 200
    assert model["model_path"] == "Qwen/Qwen3.5-122B-A10B-FP8"


async def _metrics_text(base: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(base + "/metrics") as r:
        return await r.text()


def test_metrics_absent_without_enable_metrics() -> None:
    with run_sim(*SPEC4, "--boot-time", "0.2") as (base, _):
        assert health_status(base, "/metrics") == 404


# ----------------------------------------------------------------------------- signals


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_promptly_even_mid_stream(sig: signal.Signals) -> None:
    with run_sim(*SPEC4, *FAST) as (base, proc):
        async def go() -> None:
            body = {"text": "x", "stream": True,
                    "sampling_params": {"max_new_tokens": 100_000 // 10}}
            async with aiohttp.ClientSession() as s, s.post(base + "/generate", json=body) as r:
                async for _ in r.content:
                    proc.send_signal(sig)
                    break
        asyncio.run(go())
        t0 = time.monotonic()
        code = _wait_exit(proc, timeout=5)
        assert time.monotonic() - t0 < 3
    assert code == 0


def test_sigterm_during_boot() -> None:
    with run_sim(*SPEC4, "--boot-time", "30", wait=False) as (base, proc):
        deadline = time.monotonic() + 10
        while health_status(base) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        t0 = time.monotonic()
        assert stop(proc) == 0
        assert time.monotonic() - t0 < 3


@pytest.mark.parametrize("version", [None, "0.5.17"])
def test_the_drain_after_a_cut_level_ends_at_once_though_the_gauges_lag(version: str | None
                                                                         ) -> None:
    """SGLang's num_running_reqs / num_queue_reqs are the last stats it wrote (each prefill,
    every 40th decode batch, 30 s after going idle): after a level's requests are cut they keep
    their value. The drain asks the scheduler, which is current: it ends within 2 s of the cut.
    0.5.10 has /get_load only (/v1/loads is a 404 there); 0.5.17 is asked /v1/loads, so its
    log gets none of the deprecation lines /get_load writes on every call."""
    body = {"text": "w " * 100, "stream": True,
            "sampling_params": {"max_new_tokens": 5000, "temperature": 0, "ignore_eos": True}}

    async def cut_level(base: str) -> None:
        async with aiohttp.ClientSession() as s:
            async def one() -> None:
                async with s.post(base + "/generate", json=body) as r:
                    async for _ in r.content:
                        pass
            tasks = [asyncio.create_task(one()) for _ in range(8)]
            await asyncio.sleep(1.0)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    release = ("--sglang-version", version) if version else ()
    with run_sim(*SPEC4, *FAST, *release) as (base, proc):
        asyncio.run(cut_level(base))
        t_cut = time.monotonic()
        backend = SimBackend()
        left, waited = drain(lambda: backend.in_flight(base), 5.0)
        drained_in = time.monotonic() - t_cut
        gauges = in_flight(base, ("sglang:num_running_reqs", "sglang:num_queue_reqs"))
        print(f"drained in {drained_in:.3f} s after the cut; lagging gauges say {gauges}")
        assert left == 0 and drained_in < 2.0, (left, drained_in)
        # The gauges still say what the last stats said: a drain on them would wait ~30 s.
        assert gauges is not None and gauges > 0, gauges
        assert proc.poll() is None
        assert (base in backend._no_v1_loads) is (version is None)
        if version:
            assert _get(base + "/get_load")[0] == 200
            assert sim_log(proc).count("Endpoint '/get_load' is deprecated") == 1
