"""The shipped experiments say what they claim, and each would boot what its comments describe.

Loading every file is `test_config.test_shipped_experiments_load`; here: invariants over all of
them (names, valid enqueued points, servers sized for the measured concurrency, a prompt file
usable from any working directory) and the seed's two setups and the vLLM one in detail, down
to the server command lines.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from specdecode_tune.backends import get_backend
from specdecode_tune.config import Experiment, load_experiment
from specdecode_tune.load import make_prompts
from specdecode_tune.space import BASELINE, invalid_reason, resolve
from tests.conftest import REPO

EXPERIMENTS = sorted((REPO / "experiments").glob("*.toml"))
PROMPTS = REPO / "experiments" / "prompts"
SEED_MODEL = "Qwen/Qwen3.5-122B-A10B"


def load(name: str) -> Experiment:
    return load_experiment(REPO / "experiments" / f"{name}.toml")


def argv_of(exp: Experiment, point: dict) -> list[str]:
    return get_backend(exp.backend.kind).argv(exp.backend, resolve(point, exp.backend.flags),
                                              "PORT")


def flag(argv: list[str], name: str) -> str:
    assert name in argv, f"{name} missing from {argv}"
    return argv[argv.index(name) + 1]


# ---------------------------------------------------------------------------------------------
# Every experiment


def test_the_issue_s_experiments_are_all_shipped() -> None:
    names = {p.stem for p in EXPERIMENTS}
    assert {"sim-default", "seed-sglang-eagle3", "seed-sglang-eagle3-sampled", "vllm-eagle3",
            "vllm-cpu", "llamacpp-cpu"} <= names


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_named_after_its_file_and_described(path: Path) -> None:
    # The run dir is <storage>/<name>: one name per file keeps runs of different files apart.
    exp = load_experiment(path)
    assert exp.name == path.stem
    assert exp.description


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_enqueued_points_and_the_baseline_would_boot(path: Path) -> None:
    exp = load_experiment(path)
    for point in [*exp.search.enqueue, BASELINE]:
        params = resolve(point, exp.backend.flags)
        assert invalid_reason(params) is None, (point, invalid_reason(params))
        argv = argv_of(exp, point)
        assert all(isinstance(a, str) for a in argv)


@pytest.mark.parametrize("path", [p for p in EXPERIMENTS
                                  if load_experiment(p).backend.kind in ("sglang", "sim")],
                         ids=lambda p: p.name)
def test_sglang_servers_are_sized_for_the_highest_concurrency(path: Path) -> None:
    # SERVERS.md: CUDA graphs must cover the largest batch measured, and speculative mode caps
    # running requests at 48 unless the flag is set.
    exp = load_experiment(path)
    top = max(exp.measure.concurrency)
    argv = argv_of(exp, exp.search.enqueue[0] if exp.search.enqueue else {})
    # The flag's name is the release's (from SGLang 0.5.14: --cuda-graph-max-bs-decode).
    name = "--cuda-graph-max-bs-decode" if "--cuda-graph-max-bs-decode" in argv \
        else "--cuda-graph-max-bs"
    assert int(flag(argv, name)) >= top
    if exp.backend.kind == "sglang":
        assert int(flag(argv, "--max-running-requests")) >= top


def _hybrid(path: Path) -> bool:
    """An SGLang experiment, or a simulator one whose profile is a hybrid model (the seed's);
    a simulator profile of another model (bench-schedule: dense) has no radix-cache rule."""
    from specdecode_tune.sim.arguments import RADIX_SPEC_REFUSED
    from specdecode_tune.sim.profile import DEFAULT_PROFILE, load_profile
    exp = load_experiment(path)
    if exp.backend.kind == "sglang":
        return exp.backend.model_path == SEED_MODEL   # (sglang-gpu: a Llama the route trains)
    return exp.backend.kind == "sim" and load_profile(
        exp.backend.profile or DEFAULT_PROFILE).architecture in RADIX_SPEC_REFUSED


@pytest.mark.parametrize("path", [p for p in EXPERIMENTS if _hybrid(p)], ids=lambda p: p.name)
def test_the_hybrid_seed_model_speculates_without_radix_cache(path: Path) -> None:
    # SGLang 0.5.10 refuses speculation on Qwen3.5-MoE with radix cache on (a hybrid model;
    # docs/engines-sglang.md section 1), and so does the simulator on the seed's profile: every
    # speculative point of these experiments must pass --disable-radix-cache.
    exp = load_experiment(path)
    assert exp.backend.model_path == SEED_MODEL
    assert exp.backend.flags.get("disable_radix_cache") is True
    assert "--disable-radix-cache" in argv_of(exp, exp.search.enqueue[0])
    if exp.backend.kind == "sim":
        from specdecode_tune.sim.__main__ import build_parser, server_args
        from specdecode_tune.sim.model import normalize_params
        from specdecode_tune.sim.profile import load_profile
        argv = get_backend("sim").argv(exp.backend, resolve(exp.search.enqueue[0],
                                                            exp.backend.flags), 30000)
        ns = build_parser().parse_args(argv[3:])
        profile = load_profile(ns.profile)
        assert profile.architecture == "Qwen3_5MoeForConditionalGeneration"
        normalize_params(profile, server_args(ns, profile.model_path))


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_real_servers_use_the_cluster_s_gpus(path: Path) -> None:
    # Logical GPUs are for the simulator and CPU engines on a local cluster; an experiment for
    # a real GPU server must not declare GPUs the machine may not have.
    exp = load_experiment(path)
    if exp.backend.kind in ("sglang", "vllm") and exp.search.gpus_per_trial > 0:
        assert exp.cluster.num_gpus is None


@pytest.mark.parametrize("path", [p for p in EXPERIMENTS
                                  if load_experiment(p).workload.kind == "jsonl"],
                         ids=lambda p: p.name)
def test_a_prompt_file_is_found_from_any_working_directory(path: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    # Ray Tune runs each trial in its own working directory (the trial dir), so a prompt path
    # relative to where the search was started does not resolve inside the trial.
    monkeypatch.chdir(REPO)
    exp = load_experiment(path.relative_to(REPO))        # as `--experiment experiments/X.toml`
    monkeypatch.chdir(tmp_path)
    assert os.path.isfile(exp.workload.path), (
        f"workload.path {exp.workload.path!r} only resolves from the directory the experiment "
        f"was loaded from; the loader should make it absolute")
    assert make_prompts(exp.workload, 3)


# ---------------------------------------------------------------------------------------------
# The seed's setups


def test_seed_greedy_is_the_seed_s_benchmark_on_sglang() -> None:
    exp = load("seed-sglang-eagle3")
    b = exp.backend
    assert (b.kind, b.model_path, b.speculative_algorithm, b.tp_size) == (
        "sglang", SEED_MODEL, "EAGLE3", 2)
    assert b.draft_model_path and "EAGLE3" in b.draft_model_path
    assert b.api == "generate"                # acceptance per request needs /generate
    assert exp.search.gpus_per_trial == 2     # one GPU pair per trial, TP=2 across it
    assert exp.measure.concurrency == (1, 16, 32, 64)
    w = exp.workload
    assert (w.kind, w.temperature, w.ignore_eos) == ("random", 0.0, True)
    # The user's hand-tuned point (steps 4, topk 1, so 5 draft tokens) runs first.
    argv = argv_of(exp, exp.search.enqueue[0])
    assert [flag(argv, f) for f in ("--speculative-num-steps", "--speculative-eagle-topk",
                                    "--speculative-num-draft-tokens")] == ["4", "1", "5"]
    assert flag(argv, "--speculative-draft-model-path") == b.draft_model_path
    assert flag(argv, "--tp-size") == "2"
    # The plateau question: steps 10 must be reachable.
    steps = exp.param("speculative_num_steps")
    assert steps is not None and steps.low <= 4 and steps.high >= 10


def test_seed_baseline_boots_the_same_server_without_speculation() -> None:
    exp = load("seed-sglang-eagle3")
    argv = argv_of(exp, BASELINE)
    assert not [a for a in argv if a.startswith("--speculative")]
    assert flag(argv, "--model-path") == SEED_MODEL and flag(argv, "--tp-size") == "2"


def test_seed_sampled_is_the_same_server_under_a_realistic_workload() -> None:
    greedy, sampled = load("seed-sglang-eagle3"), load("seed-sglang-eagle3-sampled")
    # Comparable: the same server, flags, space and levels; only the load differs.
    assert sampled.backend == greedy.backend
    assert sampled.space == greedy.space
    assert sampled.measure.concurrency == greedy.measure.concurrency
    w = sampled.workload
    assert (w.kind, w.temperature, w.ignore_eos) == ("jsonl", 0.7, False)
    assert isinstance(w.output_len, tuple) and w.output_len[1] >= 4 * w.output_len[0]
    assert Path(w.path).resolve().parent == PROMPTS.resolve()
    prompts = make_prompts(w, 200)
    assert {p.temperature for p in prompts} == {0.7}
    assert not any(p.ignore_eos for p in prompts)
    words = sorted(p.input_len for p in prompts)
    assert words[-1] >= 10 * words[0], "prompt lengths are not mixed"
    assert len({p.output_len for p in prompts}) > 50, "output lengths are not mixed"
    assert all(p.text.startswith("<|im_start|>") and p.text.endswith("<|im_start|>assistant\n")
               for p in prompts)


def test_vllm_eagle3_runs_the_seed_s_benchmark_on_vllm() -> None:
    exp, seed = load("vllm-eagle3"), load("seed-sglang-eagle3")
    assert (exp.backend.kind, exp.backend.model_path, exp.backend.tp_size) == (
        "vllm", SEED_MODEL, 2)
    assert exp.workload == seed.workload and exp.measure.concurrency == seed.measure.concurrency
    argv = argv_of(exp, exp.search.enqueue[0])
    conf = json.loads(flag(argv, "--speculative-config"))
    assert conf == {"method": "eagle3", "num_speculative_tokens": 3,
                    "model": exp.backend.draft_model_path}
    assert flag(argv, "--tensor-parallel-size") == "2"
    assert int(flag(argv, "--max-num-seqs")) >= max(exp.measure.concurrency)
    assert "--speculative-config" not in argv_of(exp, BASELINE)


def test_vllm_gpu_is_sglang_gpu_s_physics_on_vllm(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    """The same trained pair, workload and levels as sglang-gpu; vLLM's EAGLE-3 through the
    flags that ran on the GPU machine (Triton attention, no FlashInfer sampler)."""
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    exp, sg = load("vllm-gpu"), load("sglang-gpu")
    assert (exp.backend.kind, exp.backend.tp_size) == ("vllm", 1)
    assert (exp.backend.model_path, exp.backend.draft_model_path) == (
        sg.backend.model_path, sg.backend.draft_model_path)
    # The same workload and measuring rule; the window's cap is 20 s against SGLang's 30
    # (vllm-gpu.toml says why: the H100 run of 2026-12-07 ran every level to the cap).
    assert exp.workload == sg.workload
    assert dataclasses.replace(exp.measure, max_duration_s=sg.measure.max_duration_s) == \
        sg.measure and exp.measure.max_duration_s == 20.0
    assert exp.objective == sg.objective
    argv = argv_of(exp, exp.search.enqueue[0])
    assert json.loads(flag(argv, "--speculative-config")) == {
        "method": "eagle3", "num_speculative_tokens": 3,
        "model": f"{tmp_path}/eagle3-models/eagle3"}
    assert flag(argv, "--model") == f"{tmp_path}/eagle3-models/target"
    assert flag(argv, "--attention-backend") == "TRITON_ATTN"
    assert flag(argv, "--gpu-memory-utilization") == "0.02"
    assert int(flag(argv, "--max-num-seqs")) >= max(exp.measure.concurrency)
    assert flag(argv, "--max-model-len") == "2048"
    env = get_backend("vllm").env(exp.backend, run_dir=str(tmp_path / "trial"))
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert env["VLLM_CACHE_ROOT"] == f"{tmp_path}/vllm-cache"     # shared by every trial
    assert "--speculative-config" not in argv_of(exp, BASELINE)


def test_vllm_cpu_boots_without_torch_compile() -> None:
    """-O0 on the CPU: no Dynamo/Inductor at each boot (~10 s of a ~40 s boot on 2 cores, 23 s
    more where nothing was compiled yet), for the baseline and a speculative point alike."""
    exp = load("vllm-cpu")
    for point in (BASELINE, {"speculative_num_steps": 4}):
        assert flag(argv_of(exp, point), "--optimization-level") == "0"


def test_vllm_cpu_compiles_into_the_engine_cache(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    """The CPU experiment's boots share one compile cache beside the engines (kept between CI
    runs), not one per run dir: a first boot compiles ~25 s longer on 2 cores. (It boots with
    -O0, which compiles nothing; the cache stays where an experiment without -O0 needs it.)"""
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    exp = load("vllm-cpu")
    for run_dir in ("run-a/logs", "run-b/logs"):
        env = get_backend("vllm").env(exp.backend, run_dir=str(tmp_path / run_dir))
        assert env["VLLM_CACHE_ROOT"] == f"{tmp_path}/vllm-cache"
        assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_vllm_gpu_memory_range_brackets_the_kv_need_of_its_trained_pair() -> None:
    """The file's arithmetic, from the preset the route trains: the KV entry per token, the
    need of C=64 requests of max_total_len tokens, and a range whose low end binds (or is
    refused) and whose high end is ample on an H100 and an H200, for the non-KV memory the H100
    showed (0.52 GiB at U = 0.02, tests/data/vllm-0.26.0) give or take 0.15 GiB, with points of
    the grid between where the budget binds at C=64: two or more on an H100 (the card the route
    ran on), one at least on an H200 (its 139.8 GiB make a step of U worth 0.17 GiB)."""
    from specdecode_tune.testing.eagle3.presets import PRESETS
    p = PRESETS["gpu"]
    exp = load("vllm-gpu")
    per_token = (p.layers + 1) * 2 * p.kv_heads * (p.hidden // p.heads) * 2   # + the head
    assert per_token == 11_264
    c, k_max = max(exp.measure.concurrency), exp.param("speculative_num_steps").high
    need = c * (exp.workload.max_total_len + k_max) * per_token
    assert 0.3 * 2**30 < need < 0.4 * 2**30
    assert exp.backend.flags["max_model_len"] == p.max_position
    mem = exp.param("mem_fraction_static")
    for total_gib in (79.2, 139.8):                    # what torch reports: H100, H200
        for non_kv_gib in (0.37, 0.52, 0.67):
            low, high = (u * total_gib - non_kv_gib for u in (mem.low, mem.high))  # GiB
            assert low * 2**30 < need, (total_gib, non_kv_gib)
            assert high * 2**30 > 2.5 * need, (total_gib, non_kv_gib)
            grid = [mem.low + i * mem.step for i in range(round((mem.high - mem.low)
                                                                / mem.step) + 1)]
            binds = [u for u in grid if 0 < (u * total_gib - non_kv_gib) * 2**30 < need]
            assert len(binds) >= (2 if total_gib < 100 else 1), (total_gib, non_kv_gib, binds)


# ---------------------------------------------------------------------------------------------
# The prompt files


def chatml(messages: list[dict]) -> str:
    """Qwen's chat template for a conversation, ending where the assistant's answer starts."""
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def test_the_rendered_prompts_are_the_chat_prompts_in_chatml() -> None:
    chats = jsonl(PROMPTS / "mixed-chat.jsonl")
    rendered = jsonl(PROMPTS / "mixed-chat.qwen-chatml.jsonl")
    assert [r["prompt"] for r in rendered] == [chatml(c["messages"]) for c in chats]


def test_the_chat_prompts_are_a_small_mixed_set() -> None:
    chats = jsonl(PROMPTS / "mixed-chat.jsonl")
    assert 20 <= len(chats) <= 200
    assert (PROMPTS / "mixed-chat.jsonl").stat().st_size < 64 * 1024
    assert all(c["messages"][-1]["role"] == "user" for c in chats)
    assert any(sum(m["role"] == "user" for m in c["messages"]) > 1 for c in chats)  # multi-turn
    assert any("```" in c["messages"][-1]["content"] for c in chats)   # code in the prompt


def test_sglang_gpu_grid_searches_exactly_the_recorded_landscape_s_grid() -> None:
    """sglang-gpu-grid's pick is held against benchmarks/data/sglang-gpu-h100.parquet: its space
    is that table's grid (steps 0 is the baseline, measured first), everything else is
    sglang-gpu's, and its first point is the one the replay starts from."""
    import pyarrow.parquet as pq

    table = REPO / "benchmarks" / "data" / "sglang-gpu-h100.parquet"
    meta = json.loads(pq.read_schema(table).metadata[b"landscape"])
    grid, sg = load("sglang-gpu-grid"), load("sglang-gpu")
    axes = {name: tuple(v for v in vals if not (name == "speculative_num_steps" and v == 0))
            for name, vals in meta["axes"]}
    assert {s.name: s.choices for s in grid.space} == axes
    assert all(s.type == "categorical" for s in grid.space)
    assert (grid.backend, grid.workload, grid.measure, grid.objective) == (
        sg.backend, sg.workload, sg.measure, sg.objective)
    assert grid.search.enqueue == ({"speculative_num_steps": 4, "speculative_eagle_topk": 1,
                                    "mem_fraction_static": 0.0045},)


def test_vllm_gpu_grid_searches_the_grid_docs_gpu_records_with_the_schedule_validated() -> None:
    """vllm-gpu-grid (issue 33) is vllm-gpu's server, workload and measuring on the grid that
    docs/gpu.md section 4's vLLM recording boots (K 0 there is the baseline), every memory
    point on vllm-gpu's own lattice, and the schedule objective (the same weights), so the
    search ends by booting the per-batch-size K once; its first point is on the grid."""
    import re

    grid, vg = load("vllm-gpu-grid"), load("vllm-gpu")
    doc = (REPO / "docs" / "gpu.md").read_text(encoding="utf-8")
    block = doc[doc.index("**vLLM's landscape (issue 33)"):]
    block = block[block.index("```"):][3:]
    axes = {name: tuple(float(v) if "." in v else int(v) for v in vals.split(","))
            for name, vals in re.findall(r"--axis (\w+)=([\d.,]+)", block[:block.index("```")])}
    axes["speculative_num_steps"] = tuple(k for k in axes["speculative_num_steps"] if k != 0)
    assert {s.name: s.choices for s in grid.space} == axes
    assert all(s.type == "categorical" for s in grid.space)
    mem = vg.param("mem_fraction_static")
    for u in axes["mem_fraction_static"]:
        assert mem.low <= u <= mem.high and abs((u - mem.low) / mem.step
                                                 - round((u - mem.low) / mem.step)) < 1e-9
    assert (grid.backend, grid.workload, grid.measure) == (vg.backend, vg.workload, vg.measure)
    assert grid.objective.kind == "schedule" and vg.objective.kind == "scalar"
    assert grid.objective.weights == vg.objective.weights
    (first,) = grid.search.enqueue
    assert all(first[s.name] in s.choices for s in grid.space)
    # ... and the table that grid recorded (whole since 2026-12-08), which its pick is held
    # against, has those axes
    import pyarrow.parquet as pq

    table = REPO / "benchmarks" / "data" / "vllm-gpu-h100.parquet"
    meta = json.loads(pq.read_schema(table).metadata[b"landscape"])
    assert {name: tuple(v for v in vals if not (name == "speculative_num_steps" and v == 0))
            for name, vals in meta["axes"]} == axes
