"""The performance model against the seed figures, the start-up rules, and its own invariants."""

from __future__ import annotations

import csv
import dataclasses
import itertools
import math
import time
from pathlib import Path

import pytest

from specdecode_tune.backends import get_backend
from specdecode_tune.server.failures import classify_failure
from specdecode_tune.sim.boot import draft_candidates
from specdecode_tune.sim.model import (
    StartupError,
    Workload,
    accept_moments,
    expected_steps,
    normalize_params,
    predict,
    startup,
    step_time,
    tree_acceptance,
)
from specdecode_tune.sim.profile import load_profile
from specdecode_tune.space import max_draft_tokens

SEED = Path(__file__).resolve().parent.parent.parent / "data" / "seed_measurements.csv"
PROFILE = load_profile("seed-qwen35-122b")
WORKLOAD = Workload.calibration(PROFILE)


def spec(steps: int, topk: int = 1, draft: int | None = None, **extra: object) -> dict[str, object]:
    # The seed's model is a hybrid: SGLang 0.5.10 speculates on it only without radix cache.
    return {"speculative_algorithm": "EAGLE3", "speculative_num_steps": steps,
            "speculative_eagle_topk": topk,
            "speculative_num_draft_tokens": steps + 1 if draft is None else draft,
            "disable_radix_cache": True, **extra}


def seed_rows(metric: str) -> list[tuple[int | None, int, float]]:
    with SEED.open() as f:
        rows = [r for r in csv.reader(f) if r and not r[0].startswith("#")]
    return [(int(r[1]) if r[1] else None, int(r[2]), float(r[3])) for r in rows if r[0] == metric]


def tok_s(steps: int, concurrency: int) -> float:
    return predict(PROFILE, spec(steps), concurrency, WORKLOAD).output_tok_s


# ----------------------------------------------------------------------------- seed figures


def test_seed_copy_has_every_row() -> None:
    assert len(seed_rows("output_tok_s")) == 11
    assert len(seed_rows("max_running_requests")) == 5
    assert len(seed_rows("max_total_num_tokens")) == 3


@pytest.mark.parametrize(("concurrency", "steps", "value"), seed_rows("output_tok_s"))
def test_throughput_rows(concurrency: int, steps: int, value: float) -> None:
    rel = 0.10 if concurrency == 1 else 0.20
    assert tok_s(steps, concurrency) == pytest.approx(value, rel=rel)


def test_four_to_five_steps_gains_under_three_percent_at_c1() -> None:
    gain = tok_s(5, 1) / tok_s(4, 1) - 1
    assert 0 <= gain < 0.03


@pytest.mark.parametrize("concurrency", [16, 32])
def test_five_steps_at_least_15_percent_below_four_at_high_concurrency(concurrency: int) -> None:
    assert tok_s(5, concurrency) <= 0.85 * tok_s(4, concurrency)


def test_three_steps_at_or_above_four_at_c64() -> None:
    assert tok_s(3, 64) >= tok_s(4, 64)


@pytest.mark.parametrize(("_", "steps", "value"), seed_rows("max_total_num_tokens"))
def test_max_total_num_tokens_rows(_: None, steps: int, value: float) -> None:
    assert startup(PROFILE, spec(steps)).max_total_num_tokens == pytest.approx(value, rel=0.10)


@pytest.mark.parametrize(("_", "steps", "value"),
                         [r for r in seed_rows("max_running_requests") if r[1] <= 3])
def test_measured_running_limits(_: None, steps: int, value: float) -> None:
    assert abs(startup(PROFILE, spec(steps)).max_running_requests - value) <= 2


def test_running_limit_keeps_falling_with_steps() -> None:
    limits = [startup(PROFILE, spec(s)).max_running_requests for s in range(1, 7)]
    assert all(a > b for a, b in itertools.pairwise(limits)), limits


def test_steps_10_at_default_fraction_has_no_kv_budget() -> None:
    p = predict(PROFILE, spec(10), 1, WORKLOAD)
    assert not p.feasible
    assert "Not enough memory" in p.reason and "increase --mem-fraction-static" in p.reason
    # nothing special about 10: the KV budget runs out between 6 and 7 steps
    assert predict(PROFILE, spec(6), 1, WORKLOAD).feasible
    assert not predict(PROFILE, spec(7), 1, WORKLOAD).feasible


def test_steps_10_with_more_memory_boots_but_does_not_climb_past_the_plateau() -> None:
    ten = predict(PROFILE, spec(10, mem_fraction_static=0.92), 1, WORKLOAD)
    assert ten.feasible
    assert ten.output_tok_s < tok_s(4, 1)


# ----------------------------------------------------------------------------- start-up rules


def test_partial_speculative_numbers_are_invalid() -> None:
    for params in ({"speculative_num_steps": 3},
                   {"speculative_num_steps": 3, "speculative_eagle_topk": 1},
                   {"speculative_num_draft_tokens": 4}):
        with pytest.raises(StartupError) as e:
            startup(PROFILE, {"speculative_algorithm": "EAGLE3", "disable_radix_cache": True,
                              **params})
        assert e.value.kind == "invalid_args" and e.value.exit_code == 2
        assert "set together" in e.value.message


RADIX_REFUSAL = (
    "ValueError: Speculative decoding for Qwen3_5MoeForConditionalGeneration is not compatible "
    "with radix cache when using --mamba-scheduler-strategy no_buffer.To use radix cache with "
    "speculative decoding, please use --mamba-scheduler-strategy extra_buffer and set "
    "SGLANG_ENABLE_SPEC_V2=1.")


def test_the_hybrid_seed_model_refuses_speculation_with_radix_cache_as_sglang_does() -> None:
    # SGLang 0.5.10.post1's _handle_mamba_radix_cache, word for word, for every speculative
    # point (the same message: a property of the experiment, not of the point), raised from
    # its argument checks: a traceback and exit 1, before anything loads.
    assert PROFILE.architecture == "Qwen3_5MoeForConditionalGeneration"
    messages = set()
    for params in (spec(4), spec(3, 4, 16), {"speculative_algorithm": "EAGLE3"}):
        params = {k: v for k, v in params.items() if k != "disable_radix_cache"}
        with pytest.raises(StartupError) as e:
            normalize_params(PROFILE, params)
        assert e.value.kind == "invalid_args" and e.value.exit_code == 1
        messages.add(e.value.message)
        text = e.value.log_text()
        assert text.startswith("Traceback (most recent call last):")
        assert 'File "sglang/srt/server_args.py", line 2206, in _handle_mamba_radix_cache' in text
        assert text.endswith(RADIX_REFUSAL)
    assert messages == {RADIX_REFUSAL}
    # The server classifier reads it as SGLang's argument check, with SGLang's line.
    assert classify_failure(1, e.value.log_text(), get_backend("sim")) == (
        "invalid_args", RADIX_REFUSAL)
    # No speculation keeps radix cache; --disable-radix-cache makes every point parse.
    assert startup(PROFILE, {}).params["disable_radix_cache"] is False
    assert startup(PROFILE, spec(3, 4, 16, cuda_graph_max_bs=8)).draft_tokens == 16
    # A model SGLang does not treat as hybrid speculates with radix cache on.
    llama = dataclasses.replace(PROFILE, architecture="LlamaForCausalLM")
    assert startup(llama, {**spec(4), "disable_radix_cache": False}).speculative


def test_ngram_is_an_algorithm_with_sglangs_defaults_and_no_draft_model() -> None:
    # SGLang 0.5.10: NGRAM takes topk from --speculative-ngram-max-bfs-breadth (10), draft
    # tokens 12 unless given, the 48 cap; no draft model (no draft weights, KV or passes), and
    # no EAGLE draft-pool limit. (SGLang refuses it off CUDA; the sim stands in for CUDA.)
    ngram = {"speculative_algorithm": "NGRAM", "disable_radix_cache": True}
    args, warnings = normalize_params(PROFILE, ngram)
    assert (args["speculative_num_steps"], args["speculative_eagle_topk"],
            args["speculative_num_draft_tokens"]) == (None, 10, 12)
    assert args["max_running_requests"] == 48
    assert any("set to 12 by default for ngram" in w for w in warnings)
    args, _ = normalize_params(PROFILE, {**ngram, "speculative_ngram_max_bfs_breadth": 4,
                                         "speculative_num_draft_tokens": 5,
                                         "speculative_eagle_topk": 2})
    assert (args["speculative_eagle_topk"], args["speculative_num_draft_tokens"]) == (4, 5)
    f = startup(PROFILE, {**ngram, "speculative_num_draft_tokens": 5})
    eagle = startup(PROFILE, spec(4, 4, 5))
    assert f.speculative and not f.draft_model and eagle.draft_model
    assert f.max_total_num_tokens > eagle.max_total_num_tokens       # no draft weights or KV
    assert step_time(PROFILE, f, 8) < step_time(PROFILE, eagle, 8)    # no draft passes
    # NEXTN runs as EAGLE, as in SGLang.
    assert startup(PROFILE, {**spec(3), "speculative_algorithm": "NEXTN"}).params[
        "speculative_algorithm"] == "EAGLE"


def test_no_numbers_means_the_servers_own_choice() -> None:
    f = startup(PROFILE, {"speculative_algorithm": "EAGLE3", "disable_radix_cache": True})
    d = PROFILE.defaults
    assert (f.num_steps, f.topk, f.draft_tokens) == (
        d.speculative_num_steps, d.speculative_eagle_topk, d.speculative_num_draft_tokens)


def test_topk_one_forces_draft_tokens_to_steps_plus_one_with_a_warning() -> None:
    f = startup(PROFILE, spec(3, 1, 8, max_running_requests=64))
    assert f.draft_tokens == 4 and f.params["speculative_num_draft_tokens"] == 4
    assert len(f.warnings) == 1 and "adjusted" in f.warnings[0]
    assert startup(PROFILE, spec(3, 1, 4, max_running_requests=64)).warnings == ()


def test_more_draft_tokens_than_the_tree_holds_fails_at_boot_as_sglang_does() -> None:
    # SGLang's pool: topk + (steps - 1) * topk^2 candidates (2 + 4 = 6 here), of which it keeps
    # draft - 1. Its argument checks take any count (normalize_params passes); the draft CUDA
    # graph capture fails, after the memory checks.
    normalize_params(PROFILE, spec(2, 2, 8, cuda_graph_max_bs=16))
    with pytest.raises(StartupError) as e:
        startup(PROFILE, spec(2, 2, 8, cuda_graph_max_bs=16))
    assert e.value.kind == "crashed" and e.value.exit_code == 1
    assert e.value.message.startswith(
        "Exception: Capture cuda graph failed: selected index k out of range\nPossible solutions")
    # 7 draft tokens fill the pool: more than the old `steps * topk + 1` (5) rule allowed.
    f = startup(PROFILE, spec(2, 2, 7))
    assert f.draft_tokens == 7 and f.tree_widths == (2, 4)
    assert draft_candidates(2, 2) == 6 and draft_candidates(3, 4) == 36
    assert draft_candidates(4, 1) == 4


def test_a_tree_narrower_than_deep_crashes_the_boot_of_sglang_0_5_16_on() -> None:
    # SGLang 0.5.17 on an H100 (2026-12-06): steps 8 / topk 2 / 8 draft tokens crashed in the
    # draft-extend CUDA graph capture (as wide as the draft tokens from 0.5.16); steps 6 with 8
    # booted. The argument checks pass it; 0.5.10.post1, the default release, boots it.
    point = spec(8, 2, 8, cuda_graph_max_bs=16, mem_fraction_static=0.9)
    normalize_params(PROFILE, {**point, "sglang_version": "0.5.17"})
    with pytest.raises(StartupError) as e:
        startup(PROFILE, {**point, "sglang_version": "0.5.17"})
    assert e.value.kind == "crashed" and e.value.message == (
        "RuntimeError: The expanded size of the tensor (8) must match the existing size (9) at "
        "non-singleton dimension 1.  Target sizes: [1, 8].  Tensor sizes: [9]")
    for steps, draft, version in ((6, 8, "0.5.17"), (8, 9, "0.5.16")):
        ok = spec(steps, 2, draft, cuda_graph_max_bs=16, mem_fraction_static=0.9)
        assert startup(PROFILE, {**ok, "sglang_version": version}).draft_tokens == draft
    assert startup(PROFILE, point).draft_tokens == 8
    assert startup(PROFILE, {**point, "sglang_version": "0.5.14"}).draft_tokens == 8


def test_the_simulator_and_the_space_agree_on_the_draft_limit() -> None:
    # The space (what the search boots) and the simulator (what SGLang boots) hold the same
    # limit, each written from SGLang's code; the contract tests check the space against it.
    for steps in range(1, 13):
        for topk in (1, 2, 4, 8):
            assert draft_candidates(steps, topk) + 1 == max_draft_tokens(steps, topk)


def test_nodes_past_topk_per_depth_add_cost_not_acceptance() -> None:
    # Past steps * topk nodes every depth has topk alternatives under the accepted node; the
    # rest hang off other branches: wider deeper depths, the same acceptance, more verify work.
    p, hit = PROFILE.acceptance.greedy, PROFILE.acceptance.sibling_hit
    q5, w5 = tree_acceptance(p, hit, 2, 2, 4)
    q7, w7 = tree_acceptance(p, hit, 2, 2, 6)
    assert w5 == (2, 2) and w7 == (2, 4) and q5 == q7
    q, w = tree_acceptance(p, hit, 3, 4, 35)
    assert w == (4, 16, 15) and sum(w) == 35
    small, big = startup(PROFILE, spec(2, 2, 5)), startup(PROFILE, spec(2, 2, 7))
    assert step_time(PROFILE, big, 8) > step_time(PROFILE, small, 8)


@pytest.mark.parametrize(
    "params",
    [{"speculative_algorithm": "MEDUSA"}, {"mem_fraction_static": 1.2}, {"mem_fraction_static": 0},
     {"tp_size": 0}, {"cuda_graph_max_bs": 0}, {"max_running_requests": 0}, spec(3, 0, 4),
     {"speculative_algorithm": "EAGLE", "speculative_num_steps": -1, "disable_radix_cache": True},
     {"tp_size": True}],
)
def test_bad_values_are_invalid_args(params: dict[str, object]) -> None:
    with pytest.raises(StartupError) as e:
        startup(PROFILE, params)
    assert e.value.kind == "invalid_args"


def test_plain_decoding_without_algorithm_or_with_zero_steps() -> None:
    for params in ({}, {"speculative_algorithm": None}, spec(0, 1, 1),
                   {"speculative_num_steps": 3}):
        f = startup(PROFILE, params)
        assert not f.speculative and f.draft_tokens == 1 and f.accept_greedy == ()
        assert f.params["speculative_algorithm"] is None
    base = predict(PROFILE, {}, 1, WORKLOAD)
    assert base.accept_length == 1.0 and base.output_tok_s < tok_s(1, 1)
    # no draft weights, no draft KV, one token per request: more KV and a higher limit
    assert startup(PROFILE, {}).max_total_num_tokens > \
        startup(PROFILE, spec(1)).max_total_num_tokens


def test_not_enough_memory_for_weights_or_kv() -> None:
    for params in ({"mem_fraction_static": 0.5}, {"tp_size": 1}, spec(10)):
        with pytest.raises(StartupError) as e:
            startup(PROFILE, params)
        assert e.value.kind == "kv_memory" and e.value.exit_code == 1
        assert "Not enough memory" in e.value.message


def test_too_high_fraction_is_oom_and_less_graph_memory_cures_it() -> None:
    with pytest.raises(StartupError) as e:
        startup(PROFILE, spec(5, mem_fraction_static=0.95))
    assert e.value.kind == "oom" and "CUDA out of memory" in e.value.message
    startup(PROFILE, spec(5, mem_fraction_static=0.95, cuda_graph_max_bs=16))


def test_smaller_graph_batch_frees_kv_and_makes_steps_10_fit() -> None:
    small_graphs = startup(PROFILE, spec(3, cuda_graph_max_bs=16))
    assert small_graphs.max_total_num_tokens > startup(PROFILE, spec(3)).max_total_num_tokens
    assert predict(PROFILE, spec(10, cuda_graph_max_bs=16), 1, WORKLOAD).feasible


def test_max_running_requests_flag_caps_the_derived_limit() -> None:
    assert startup(PROFILE, spec(1, max_running_requests=4)).max_running_requests == 4
    assert startup(PROFILE, spec(1, max_running_requests=1000)).max_running_requests == 26


def test_speculation_without_the_flag_caps_running_at_48_as_sglang_does() -> None:
    # _handle_speculative_decoding: max_running_requests unset -> 48, with its warning; the
    # server args then say 48 and the scheduler runs min(48, what memory allows).
    big = dataclasses.replace(PROFILE, memory=dataclasses.replace(
        PROFILE.memory, request_reserve_tokens=1000))
    f = startup(big, spec(1))
    assert f.params["max_running_requests"] == 48 and f.max_running_requests == 48
    assert f.memory_running_limit > 48
    assert f.warnings == ("Max running requests is reset to 48 for speculative decoding. You "
                          "can override this by explicitly setting --max-running-requests.",)
    assert startup(big, spec(1, max_running_requests=64)).max_running_requests == 64
    # The seed's memory allows fewer: the flag says 48, the effective limit is memory's.
    seed = startup(PROFILE, spec(4))
    assert (seed.params["max_running_requests"], seed.max_running_requests) == (48, 12)
    # No speculation, no flag: nothing set, memory decides.
    plain = startup(big, {})
    assert plain.params["max_running_requests"] is None
    assert plain.max_running_requests == plain.memory_running_limit > 48


# ----------------------------------------------------------------------------- model invariants


def test_chain_acceptance_is_the_product_of_conditionals() -> None:
    probs = (0.9, 0.8, 0.5)
    q, widths = tree_acceptance(probs, 0.35, 3, 1, 3)
    assert q == probs and widths == (1, 1, 1)
    mean, second = accept_moments(q)
    assert mean == pytest.approx(1 + 0.9 + 0.72 + 0.36)
    # X = 1 + A: P(A=0)=.1, P(A=1)=.18, P(A=2)=.36, P(A=3)=.36
    assert second == pytest.approx(0.1 * 1 + 0.18 * 4 + 0.36 * 9 + 0.36 * 16)


def test_tree_acceptance_grows_with_draft_tokens_and_stays_bounded() -> None:
    for steps, topk in ((3, 2), (5, 4), (6, 8)):
        means = []
        for draft in range(2, steps * topk + 2):
            q, widths = tree_acceptance(PROFILE.acceptance.greedy, PROFILE.acceptance.sibling_hit,
                                        steps, topk, draft - 1)
            assert sum(widths) == draft - 1 and max(widths) <= topk and len(widths) <= steps
            assert all(0 <= x <= 1 for x in q)
            assert all(x >= PROFILE.acceptance.greedy[i] - 1e-12 for i, x in enumerate(q))
            means.append(accept_moments(q)[0])
        assert all(b >= a - 1e-12 for a, b in itertools.pairwise(means))
        assert means[-1] <= steps + 1


def test_sampled_acceptance_is_lower_than_greedy() -> None:
    greedy = predict(PROFILE, spec(4), 1, WORKLOAD)
    sampled = predict(PROFILE, spec(4), 1, Workload(WORKLOAD.input_len, WORKLOAD.output_len, 0.7))
    assert sampled.accept_length < greedy.accept_length
    assert sampled.output_tok_s < greedy.output_tok_s


def test_expected_steps_is_exact_for_deterministic_tokens() -> None:
    assert expected_steps(100, 1.0, 1.0) == pytest.approx(100)
    assert expected_steps(0, 3.0, 10.0) == 0.0


def test_concurrency_beyond_the_limit_queues_and_caps_the_batch() -> None:
    p16, p64 = predict(PROFILE, spec(4), 16, WORKLOAD), predict(PROFILE, spec(4), 64, WORKLOAD)
    assert p16.running == p64.running == 12 and p16.queued == 4 and p64.queued == 52
    assert p16.output_tok_s == pytest.approx(p64.output_tok_s)
    below = predict(PROFILE, spec(4), 8, WORKLOAD)
    assert below.queued == 0 and below.running < 8      # replacements miss a step


def test_step_time_grows_with_batch_and_jumps_above_the_graph_batch() -> None:
    f = startup(PROFILE, spec(3, cuda_graph_max_bs=8))
    times = [step_time(PROFILE, f, b) for b in range(1, 17)]
    assert all(b >= a for a, b in itertools.pairwise(times))
    assert times[8] / times[7] > PROFILE.cost.eager_factor * 0.99


def test_verify_tile_makes_a_shelf_at_batch_one() -> None:
    tile = PROFILE.cost.verify_token_tile
    per_token = [step_time(PROFILE, startup(PROFILE, spec(s, cuda_graph_max_bs=8)), 1)
                 for s in range(1, tile + 1)]
    jumps = [b - a for a, b in itertools.pairwise(per_token)]
    # going from `tile` to `tile + 1` verified tokens adds a whole tile of per-token cost
    assert jumps[tile - 2] > jumps[tile - 3] + PROFILE.cost.verify_per_token_s * tile * 0.9


def test_larger_tp_is_faster_per_step() -> None:
    two, four = startup(PROFILE, spec(3)), startup(PROFILE, spec(3, tp_size=4))
    assert step_time(PROFILE, four, 8) < step_time(PROFILE, two, 8)
    assert four.max_total_num_tokens > two.max_total_num_tokens


def test_predict_is_fast() -> None:
    configs = [spec(s, k, min(s * k + 1, d), mem_fraction_static=f)
               for s, k, d, f in itertools.product(range(1, 8), (1, 2, 4, 8), (2, 4, 8, 16),
                                                   (0.8, 0.85, 0.9))]
    predict(PROFILE, configs[0], 1, WORKLOAD)
    t0 = time.perf_counter()
    results = [predict(PROFILE, c, conc, WORKLOAD) for c in configs for conc in (1, 16, 64)]
    per_call = (time.perf_counter() - t0) / len(results)
    assert per_call < 1e-3
    assert any(r.feasible for r in results) and any(not r.feasible for r in results)
    assert all(math.isfinite(r.output_tok_s) for r in results)


def test_a_request_larger_than_the_kv_pool_is_infeasible_not_a_crash() -> None:
    kv = startup(PROFILE, spec(6)).max_total_num_tokens
    p = predict(PROFILE, spec(6), 4, Workload(input_len=1000, output_len=kv))
    assert not p.feasible and "exceeds the KV pool" in p.reason


@pytest.mark.parametrize("profile_name", ["seed-qwen35-122b", "bench-noisy"])
def test_the_logged_memory_brackets_the_out_of_memory_boundary(profile_name: str) -> None:
    """What a boot logs (sim Facts.memory_room, .graph_memory: SGLang's "avail mem" after the
    capture and its "mem usage") brackets how far the memory fraction could rise at the same
    draft count: a boot at mem + room runs out of memory (the room overstates by the warm-up
    passes' share), one at mem + room - graphs boots (the assumption the sampler's boundary
    rests on: the warm-up uses no more than the graphs keep)."""
    from specdecode_tune.sim.arguments import StartupError
    from specdecode_tune.sim.boot import startup
    profile = load_profile(profile_name)
    for draft in (2, 5, 8):
        params = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": draft - 1,
                  "speculative_eagle_topk": 1, "speculative_num_draft_tokens": draft,
                  "mem_fraction_static": 0.86, "tp_size": 2, "disable_radix_cache": True}
        facts = startup(profile, params)
        room, graph = facts.memory_room, facts.graph_memory
        assert graph > 0 and room > 0
        with pytest.raises(StartupError) as e:
            startup(profile, {**params, "mem_fraction_static": 0.86 + room + 1e-4})
        assert e.value.kind == "oom"
        startup(profile, {**params,
                          "mem_fraction_static": 0.86 + max(0.0, room - graph) - 1e-4})
