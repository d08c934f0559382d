"""The simulator's copy of SGLang's adaptive mode (`--speculative-adaptive`): the config's
format and errors, the router (largest key <= the batch after CUDA-graph padding), the release
that has the flags, the fallback where the mode is unsupported, and its costs (buffers and KV
sized for the largest candidate, graphs per candidate)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdecode_tune.backends.sglang_releases import DEFAULT_VERSION
from specdecode_tune.sim import adaptive
from specdecode_tune.sim.__main__ import check_args
from specdecode_tune.sim.arguments import EMULATED_VERSION, StartupError
from specdecode_tune.sim.model import Workload, predict, startup
from specdecode_tune.sim.profile import load_profile

PROFILE = load_profile("bench-schedule")
WORK = Workload.calibration(PROFILE)
CHAIN = {"speculative_algorithm": "EAGLE3", "speculative_eagle_topk": 1,
         "mem_fraction_static": 0.85}


def chain(steps: int) -> dict[str, object]:
    return {**CHAIN, "speculative_num_steps": steps, "speculative_num_draft_tokens": steps + 1}


def write(tmp_path: Path, content: object) -> str:
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps(content))
    return str(path)


def adaptive_params(path: str, steps: int, version: str = "0.5.13") -> dict[str, object]:
    return {**chain(steps), "speculative_adaptive": True, "speculative_adaptive_config": path,
            "sglang_version": version}


def test_the_emulated_release_is_the_backends_default() -> None:
    assert EMULATED_VERSION == DEFAULT_VERSION


def test_the_router_pads_to_the_graph_size_then_takes_the_largest_key_below() -> None:
    sched = adaptive.Schedule(slots=((4, 8), (16, 3)), cuda_graph_bs=adaptive.spec_capture_bs(64))
    assert sched.cuda_graph_bs[:10] == (1, 2, 3, 4, 5, 6, 7, 8, 10, 12)
    assert sched.steps_for_batch(1) == 8          # below every key: the smallest key's
    assert sched.key_for_batch(14) == 4 and sched.steps_for_batch(14) == 8
    assert sched.key_for_batch(15) == 16          # 15 is not captured: it runs as 16
    assert sched.steps_for_batch(15) == 3
    assert sched.key_for_batch(9) == 4            # 9 pads to 10 -> key 4
    assert sched.steps_for_batch(100) == 3
    # Past the largest graph there is no padding: the batch itself.
    small = adaptive.Schedule(slots=((1, 5), (12, 2)), cuda_graph_bs=adaptive.spec_capture_bs(8))
    assert small.key_for_batch(11) == 1 and small.key_for_batch(12) == 12
    assert sched.graph_bs_for_step(3)[0] == 16 and max(sched.graph_bs_for_step(8)) == 14


@pytest.mark.parametrize("content, words", [
    ({"strategy": "ema"}, "must contain at least one integer-string BS key"),
    ({"1": {"candidate_steps": []}}, "BS 1: candidate_steps must be a list of non-negative"),
    ({"1": {"candidate_steps": [-1]}}, "BS 1: candidate_steps must be a list of non-negative"),
    ({"1": {"steps": [3]}}, "BS 1: candidate_steps must be a list of non-negative ints, got None"),
    ([1, 2], "must be a JSON object, got list"),
])
def test_a_config_sglang_refuses_is_refused_in_its_words(content: object, words: str,
                                                         tmp_path: Path) -> None:
    with pytest.raises(StartupError, match="ValueError") as e:
        startup(PROFILE, adaptive_params(write(tmp_path, content), 3))
    assert words in e.value.message and e.value.exit_code == 1


def test_the_flags_exist_only_in_releases_that_have_them(tmp_path: Path) -> None:
    path = write(tmp_path, {"1": {"candidate_steps": [3]}})
    with pytest.raises(StartupError, match="unrecognized arguments: --speculative-adaptive"):
        startup(PROFILE, adaptive_params(path, 3, version="0.5.10.post1"))
    with pytest.raises(StartupError, match="one flat object"):
        startup(PROFILE, adaptive_params(path, 3, version="0.5.12"))
    assert startup(PROFILE, adaptive_params(path, 3, version="0.5.13")).adaptive is not None
    # The CLI: the default release refuses them before a boot (argparse's exit 2).
    problem = check_args(["--profile", "bench-schedule", "--speculative-algorithm", "EAGLE3",
                          "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                          "--speculative-num-draft-tokens", "4", "--speculative-adaptive",
                          "--speculative-adaptive-config", path])
    assert problem is not None and "unrecognized arguments" in problem
    assert check_args(["--profile", "bench-schedule", "--speculative-algorithm", "EAGLE3",
                       "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                       "--speculative-num-draft-tokens", "4", "--speculative-adaptive",
                       "--speculative-adaptive-config", path, "--sglang-version",
                       "0.5.13"]) is None


def test_the_steps_must_be_a_candidate(tmp_path: Path) -> None:
    path = write(tmp_path, {"1": {"candidate_steps": [8]}, "16": {"candidate_steps": [3]}})
    with pytest.raises(StartupError, match=r"--speculative-num-steps=5 is not in the adaptive "
                                           r"config candidate_steps \[3, 8\]"):
        startup(PROFILE, adaptive_params(path, 5))


def test_topk_above_one_falls_back_to_the_static_server_with_sglangs_warning(
        tmp_path: Path) -> None:
    path = write(tmp_path, {"1": {"candidate_steps": [8]}, "16": {"candidate_steps": [3]}})
    params = {**adaptive_params(path, 3), "speculative_eagle_topk": 2,
              "speculative_num_draft_tokens": 6}
    facts = startup(PROFILE, params)
    assert facts.adaptive is None and facts.topk == 2 and facts.draft_tokens == 6
    assert any("speculative_adaptive disabled: speculative_eagle_topk=2 (only topk=1 is "
               "supported). Falling back to static" in w for w in facts.warnings)


def test_buffers_and_kv_are_sized_for_the_largest_candidate(tmp_path: Path) -> None:
    path = write(tmp_path, {"1": {"candidate_steps": [10]}, "16": {"candidate_steps": [3]}})
    facts = startup(PROFILE, adaptive_params(path, 3))
    static10, static3 = startup(PROFILE, chain(10)), startup(PROFILE, chain(3))
    assert facts.max_total_num_tokens == static10.max_total_num_tokens
    assert facts.max_total_num_tokens < static3.max_total_num_tokens
    # Graphs per candidate, each for the graph sizes that route to it: steps 10 for 1..14,
    # steps 3 for 16..64 (SGLang's `cuda_graph_bs_for_step`).
    m = PROFILE.memory
    assert facts.headroom_need_bytes == m.headroom_fixed_bytes + \
        m.headroom_bytes_per_graph_token * (14 * 11 + 64 * 4)
    assert facts.shape(1) == (10, 11, True) and facts.shape(48) == (3, 4, True)


def test_each_level_runs_its_slots_steps(tmp_path: Path) -> None:
    """Where memory does not bind, the schedule at a level is the static server with that
    level's steps; a slot of 0 steps runs without drafting."""
    path = write(tmp_path, {"1": {"candidate_steps": [10]}, "4": {"candidate_steps": [0]},
                            "16": {"candidate_steps": [4]}})
    params = adaptive_params(path, 4)
    for c, steps in ((1, 10), (16, 4), (48, 4)):
        got = predict(PROFILE, params, c, WORK).output_tok_s
        want = predict(PROFILE, chain(steps), c, WORK).output_tok_s
        assert got == pytest.approx(want, rel=1e-9), c
    at4 = predict(PROFILE, params, 4, WORK)
    assert at4.accept_length == 1.0
    assert at4.output_tok_s < predict(PROFILE, chain(4), 4, WORK).output_tok_s


def test_the_simulator_refuses_a_slot_it_cannot_run(tmp_path: Path) -> None:
    path = write(tmp_path, {"1": {"candidate_steps": [1, 3, 7]}})
    with pytest.raises(StartupError, match="one candidate per slot"):
        startup(PROFILE, adaptive_params(path, 3))


def test_the_real_time_scheduler_drafts_the_steps_of_the_batchs_slot(tmp_path: Path) -> None:
    """One request alone runs slot 1 (2 steps here): no verify step accepts more than 2 drafts,
    though the buffers (and the histogram) are sized for 9."""
    import asyncio

    from specdecode_tune.sim.scheduler import Scheduler

    path = write(tmp_path, {"1": {"candidate_steps": [2]}, "8": {"candidate_steps": [9]}})
    facts = startup(PROFILE, adaptive_params(path, 2))

    async def run() -> list[int]:
        sched = Scheduler(PROFILE, facts, seed=1, speed_factor=1.0, noise_seed=1)
        req = sched.submit(16, 200, 0.0, True)
        sched.waiting.remove(req)
        sched.running.append(req)
        for _ in range(60):
            sched._decode([req])
        return req.histogram

    hist = asyncio.run(run())
    assert len(hist) == 10 and sum(hist[3:]) == 0 and hist[2] > 0
