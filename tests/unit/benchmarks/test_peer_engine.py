"""The stand-in engine that replays a landscape to the peers' own code (issue 34): the argv it
reads, the boot it replays (the landscapes' draw rule), what it serves and where it refuses;
tune_speculative_k's rule as benchmarks/peers.py applies it. Loopback only, seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import bench_module

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "benchmarks"
TABLE = BENCH / "data" / "vllm-cpu-ngram.parquet"
STEPS = "speculative_num_steps"


def _load(name: str) -> ModuleType:
    return bench_module(name)


@pytest.fixture(scope="module")
def argv_mod() -> ModuleType:
    return _load("peer_argv")


@pytest.fixture(scope="module")
def engine() -> ModuleType:
    return _load("peer_engine")


def test_vllm_argv_reads_the_speculative_config_and_memory(argv_mod: ModuleType) -> None:
    cfg = json.dumps({"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_max": 2})
    p = argv_mod.parse(["vllm", "serve", "org/m", "--host", "127.0.0.1", "--port", "8123",
                        "--speculative-config", cfg, "--gpu-memory-utilization=0.85",
                        "--enforce-eager"])
    assert p["engine"] == "vllm" and p["model"] == "org/m" and p["port"] == 8123
    s = p["settings"]
    assert s[STEPS] == 7 and s["speculative_eagle_topk"] == 1
    assert s["speculative_num_draft_tokens"] == 8 and s["spec_ngram_simple_size_n"] == 2
    assert s["mem_fraction_static"] == 0.85 and p["flags"]["enforce_eager"] is True
    # no speculative config: the baseline, at vLLM's default memory
    base = argv_mod.parse(["vllm", "serve", "org/m"])["settings"]
    assert base[STEPS] == 0 and base["mem_fraction_static"] == 0.9


def test_sglang_argv_and_bad_input(argv_mod: ModuleType) -> None:
    p = argv_mod.parse([sys.executable, "-m", "sglang.launch_server", "--model-path", "m",
                        "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                        "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8",
                        "--mem-fraction-static", "0.88", "--port", "20000"])
    assert p["engine"] == "sglang" and p["port"] == 20000
    assert p["settings"] == {STEPS: 3, "speculative_eagle_topk": 4,
                             "speculative_num_draft_tokens": 8, "method": "EAGLE",
                             "mem_fraction_static": 0.88}
    with pytest.raises(ValueError, match="not JSON"):
        argv_mod.parse(["vllm", "serve", "m", "--speculative-config", "{k: 1"])
    with pytest.raises(ValueError, match="not a `vllm serve`"):
        argv_mod.parse(["vllm", "bench", "latency"])


def test_replay_draws_the_repeats_landscapes_draws(engine: ModuleType) -> None:
    land = _load("landscapes").landscape_of(str(TABLE))
    replay = engine.Replay(str(TABLE), seed=3)
    first = replay.boot({STEPS: 5})
    second = replay.boot({STEPS: 5})
    assert first.key == (5,) and second.key == (5,)
    assert first.tok_s == land.draw((5,), 3, 0).tok_s
    assert second.tok_s == land.draw((5,), 3, 1).tok_s       # nth counts this search's boots
    assert replay.boot({STEPS: 0}).tok_s == land.draw_baseline(3).tok_s
    # off the grid: the nearest recorded point, and the snap is said
    far = replay.boot({STEPS: 40})
    assert far.key == (max(land.points)[0],) and far.snapped == {STEPS: (40, 16)}


def test_interpolation_between_and_past_the_levels(engine: ModuleType) -> None:
    tok = {1: 100.0, 4: 400.0}
    assert engine.interpolate(tok, 2) == pytest.approx(200.0)     # log-log: a power law here
    assert engine.interpolate(tok, 50) == 400.0                    # past the last: the last
    assert engine.interpolate(tok, 1) == 100.0


def _env(state: Path, landscape: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "SPECDECODE_PEER_LANDSCAPE": landscape,
            "SPECDECODE_PEER_SEED": "0", "SPECDECODE_PEER_STATE": str(state),
            "SPECDECODE_PEER_SPEEDUP": "50"}


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def test_serves_health_models_and_a_stream(tmp_path: Path, free_port: int) -> None:
    cfg = json.dumps({"method": "ngram", "num_speculative_tokens": 4})
    proc = subprocess.Popen([sys.executable, str(BENCH / "peer_engine.py"), "vllm", "serve",
                             "org/m", "--port", str(free_port), "--speculative-config", cfg],
                            env=_env(tmp_path, str(TABLE)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{free_port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                _get(base + "/health")
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        assert _get(base + "/v1/models")["data"][0]["id"] == "org/m"
        req = urllib.request.Request(base + "/v1/completions", method="POST", data=json.dumps(
            {"model": "org/m", "prompt": "hi", "max_tokens": 40, "stream": True}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            events = [ln for ln in r.read().decode().splitlines() if ln.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        last = json.loads(events[-2][6:])
        assert last["usage"]["completion_tokens"] == 40
        assert last["choices"][0]["finish_reason"] == "length"
        boot = json.loads((tmp_path / "boots.jsonl").read_text().splitlines()[0])
        assert boot["key"] == [4] and boot["status"] == "ok"
        with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
            assert "vllm:num_requests_waiting 0" in r.read().decode()
        # `vllm bench serve` (vllm-optimizer's measurement): the served figure at its level
        subprocess.run([sys.executable, str(BENCH / "peer_engine.py"), "vllm", "bench", "serve",
                        "--port", str(free_port), "--max-concurrency", "4", "--save-result",
                        "--result-dir", str(tmp_path / "r"), "--result-filename", "r.json"],
                       env=_env(tmp_path, str(TABLE)), check=True, timeout=30,
                       capture_output=True)
        res = json.loads((tmp_path / "r" / "r.json").read_text())
        assert res["output_throughput"] == pytest.approx(boot["tok_s"]["4"])
        assert res["completed"] == res["num_prompts"] and res["failed"] == 0
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_refuses_at_start_up_where_the_recording_refused(tmp_path: Path, free_port: int
                                                          ) -> None:
    # the seed profile refuses steps 4 at mem 0.80: not enough memory for the KV pool
    cfg = json.dumps({"method": "eagle3", "num_speculative_tokens": 4})
    out = subprocess.run([sys.executable, str(BENCH / "peer_engine.py"), "vllm", "serve", "m",
                          "--port", str(free_port), "--speculative-config", cfg,
                          "--gpu-memory-utilization", "0.80"],
                         env=_env(tmp_path, "seed-qwen35-122b"), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1
    assert "infeasible" in out.stderr and "memory" in out.stderr.lower()


def test_k_rule_ties_to_the_smaller_k_and_drops_unstable_ones() -> None:
    peers = _load("peers")
    runs = {1: {0: [100.0] * 3, 2: [150.0] * 3, 4: [151.0] * 3, 6: [200.0, 100.0, 300.0]}}
    # K 4 is within 1% of K 2's conservative figure: the smaller K wins; K 6 is too noisy
    assert peers.k_rule(runs) == {1: 2}
    # a spread lowers a K's conservative figure: median 155 less 1.4826 x MAD 7 = 144.6
    assert peers.k_rule({1: {2: [150.0] * 3, 3: [148.0, 155.0, 162.0]}}) == {1: 2}
    assert peers.k_rule({1: {2: [150.0] * 3, 3: [155.0] * 3}}) == {1: 3}


def test_vllm_tuner_search_code_boots_through_the_replay(tmp_path: Path) -> None:
    """vllm-tuner's own search code (its venv, cached outside the repository) on the replay:
    its argv reach the oracle, each boot is a recorded point, its pick one it booted."""
    peers = _load("peers")
    py = peers.PEER_VENVS / "vllm-tuner" / "bin" / "python"
    if not py.exists():
        pytest.skip(f"no vllm-tuner venv at {py.parent.parent} (benchmarks/peers.py says how "
                    f"to make one)")
    ks = (2, 9, 16)
    conf = tmp_path / "c.yaml"
    conf.write_text(json.dumps({"model": "m", "optimization": {"n_trials": 3}, "parameters": [
        {"name": "speculative_config", "options": [json.dumps(
            {"method": "ngram", "num_speculative_tokens": k}) for k in ks]}]}))
    oracle = ["env", f"PYTHONPATH={ROOT}", sys.executable, str(BENCH / "peer_engine.py"),
              "oracle", str(TABLE), "0"]
    out = subprocess.run([str(py), str(BENCH / "peer_drivers" / "vllm_tuner_run.py"),
                          str(conf), json.dumps(oracle)], capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""},
                         timeout=120, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["sampler"] == "tpe" and r["baseline"]["key"] is None
    assert len(r["boots"]) == 3 and all(b["key"][0] in ks for b in r["boots"])
    assert r["best"]["key"] in [b["key"] for b in r["boots"]]
    assert r["best"]["value"] == max(b["at"] for b in r["boots"])


def test_a_recorded_eagle_table_serves_a_chain_at_steps_plus_one_and_peers_see_its_axes() -> None:
    """SGLang's recorded table keys topk 1 at steps + 1 draft tokens (as the server runs it).
    The replay used to snap a chain's draft tokens to the grid's 8 or 16, a point never
    recorded, so every chain a peer booted read "not on the recorded grid" and every peer's
    pick scored 0%; and the peers took the table for an n-gram engine's."""
    pe, peers = _load("peer_engine"), _load("peers")
    table = str(Path(__file__).resolve().parents[3] / "benchmarks" / "data"
                / "sglang-gpu-h100.parquet")
    replay = pe.Replay(table, 0)
    served = replay.boot({"speculative_num_steps": 6, "speculative_eagle_topk": 1,
                          "speculative_num_draft_tokens": 7, "mem_fraction_static": 0.9})
    assert served.key == (6, 1, 7, 0.0045) and served.ok
    assert replay.boot({"speculative_num_steps": 2, "speculative_eagle_topk": 2,
                        "speculative_num_draft_tokens": 16}).status == "infeasible"
    land = peers.Land(table)
    assert not land.n_gram
    params, _, missing = peers.tuner_space(land)
    assert [p["name"] for p in params] == ["speculative_config"]   # one memory value: its own
    assert all(json.loads(o)["method"] == "eagle3" for o in params[0]["options"])
    boots = peers.bench_speculative_boots(land)
    assert {s.get("speculative_eagle_topk") for _, s in boots if s["speculative_num_steps"]} \
        == {1, 2, 4}


def test_a_recorded_vllm_eagle_table_is_a_chain_engine_s_to_the_peers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's EAGLE-3 table (issue 33, to come) has steps and the memory, no topk axis: the
    peers must drive EAGLE-3 on it (not vLLM's n-gram method, as for the n-gram tables), and
    SGLang's bench_speculative sweeps chains there."""
    from specdecode_tune.records import LevelSummary, ServerFacts, TrialResult

    rec, peers = _load("record_landscape"), _load("peers")
    exp = Path(__file__).resolve().parents[3] / "experiments" / "vllm-gpu.toml"

    def lv(c: int, tok: float) -> LevelSummary:
        return LevelSummary(c, "closed", None, 3.0, 10, 0, int(tok * 3), tok, 1.0,
                            *([None] * 12), accept_length=2.5)

    def fake_trial(e: object, sampled: dict, ctx: object, **_kw: object) -> TrialResult:
        steps, mem = int(sampled.get("speculative_num_steps", 0)), sampled.get(
            "mem_fraction_static", 0.01)
        tok = 100.0 + 10 * steps + 1000 * float(mem)
        return TrialResult("t", dict(sampled), "ok", facts=ServerFacts(16384, 64, boot_s=0.5),
                           levels=tuple(lv(c, tok * c ** 0.5) for c in (1, 16, 64)), wall_s=5.0,
                           repeat=getattr(ctx, "repeat", 0))

    monkeypatch.setattr(rec, "run_trial", fake_trial)
    monkeypatch.setattr(rec, "preflight", lambda cfg: None)
    monkeypatch.setattr(rec, "engine_version", lambda e: "vllm 0.26.0 (test)")
    monkeypatch.setattr(rec, "model_facts", lambda e: {"name": "target", "bytes": 1})
    table = tmp_path / "vllm-eagle.parquet"
    assert rec.main(["--experiment", str(exp), "--axis", "speculative_num_steps=0,1,2,4",
                     "--axis", "mem_fraction_static=0.0075,0.01", "--repeats", "1",
                     "--out", str(table), "--run-dir", str(tmp_path / "runs")]) == 0
    land = peers.Land(str(table))
    assert not land.n_gram and "speculative_eagle_topk" not in land.values
    params, _, _ = peers.tuner_space(land)
    assert {json.loads(o)["method"] for o in params[0]["options"]} == {"eagle3"}
    assert params[1] == {"name": "gpu_memory_utilization", "options": ["0.0075", "0.01"]}
    boots = peers.bench_speculative_boots(land)
    chains = {(s["speculative_num_steps"], s.get("speculative_eagle_topk"),
               s.get("speculative_num_draft_tokens")) for _, s in boots
              if s["speculative_num_steps"]}
    assert chains == {(k, 1, k + 1) for k in (1, 2, 4)}
