"""The engines' schedule formats (each in its backend), each checked against the engine's own rules
as its source defines them (docs/schedule.md names the files and functions): SGLang's adaptive
config (the simulator's copy of `_load_adaptive_config` and `AdaptiveStepRouter`), vLLM's
`num_speculative_tokens_per_batch_size` (`vllm/v1/spec_decode/dynamic/utils.py`'s checks) and
TensorRT-LLM's `draft_len_schedule` (`llm_args.py` `validate_draft_len_schedule_and_sort`,
`_torch/speculative/utils.py` `get_draft_len_for_batch_size`). Each format must route every
batch size to the steps the schedule meant."""

from __future__ import annotations

import ast
import bisect
from pathlib import Path

import pytest

import specdecode_tune
from specdecode_tune.backends import (
    BACKENDS,
    ScheduleAsk,
    schedule_files,
    sglang_schedule,
    trtllm,
    vllm,
)
from specdecode_tune.backends.schedule import NOTHING
from specdecode_tune.config import BackendConfig
from specdecode_tune.sim import adaptive
from specdecode_tune.space import STEPS, resolve

SLOTS = [
    [(1, 8), (4, 6), (11, 3), (40, 0)],
    [(1, 5)],
    [(1, 0), (16, 2)],
    [(1, 4), (2, 4), (3, 1)],
]


def intended(slots: list[tuple[int, int]], batch: int) -> int:
    starts = [s for s, _ in slots]
    return slots[bisect.bisect_right(starts, batch) - 1][1]


def vllm_check(ranges: list[list[int]], num_speculative_tokens: int) -> None:
    """vLLM's rules for the list (`dynamic/utils.py` `validate_and_normalize_dynamic_sd_schedule`,
    commit 14b450ca): 3-item entries, positive ranges with start <= end, sorted and not
    overlapping, the first starting at 1, K >= 0; `build_dynamic_sd_schedule_lookup` clamps K
    to num_speculative_tokens, so a larger K is not what the server runs."""
    assert all(isinstance(e, list) and len(e) == 3 for e in ranges)
    assert ranges[0][0] == 1
    for (_s0, e0, _), (s1, _, _) in zip(ranges, ranges[1:], strict=False):
        assert s1 > e0, "ranges overlap or are not sorted"
    for start, end, k in ranges:
        assert start <= end and k >= 0 and k <= num_speculative_tokens


def trtllm_check(schedule: dict[int, int], max_draft_len: int) -> None:
    """TensorRT-LLM's validator (llm_args.py validate_draft_len_schedule_and_sort)."""
    for bs, d in schedule.items():
        assert bs >= 1 and d >= 0
    assert 1 in schedule, "draft_len_schedule must include batch_size=1"
    assert schedule[1] == max_draft_len, "draft_len_schedule[1] must equal max_draft_len"
    assert all(d <= max_draft_len for d in schedule.values())


@pytest.mark.parametrize("slots", SLOTS)
def test_sglang_reads_the_schedule_as_meant(slots: list[tuple[int, int]]) -> None:
    content = sglang_schedule.adaptive_config(slots)
    parsed = adaptive.parse_config(content)       # SGLang's loader (a copy), its errors
    assert all(len(c) == 1 for _, c in parsed)    # one candidate: the EMA never moves it
    # No CUDA-graph padding (batch sizes above the captured ones) routes by the keys alone.
    sched = adaptive.Schedule(slots=tuple((k, c[0]) for k, c in parsed), cuda_graph_bs=())
    for batch in range(1, 80):
        assert sched.steps_for_batch(batch) == intended(slots, batch), batch


@pytest.mark.parametrize("slots", SLOTS)
def test_vllm_reads_the_schedule_as_meant(slots: list[tuple[int, int]]) -> None:
    ranges = vllm.per_batch_size_ranges(slots)
    top = max(k for _, k in slots)
    vllm_check(ranges, top)
    for batch in range(1, 80):
        assert vllm.k_for_batch(ranges, batch) == intended(slots, batch), batch


@pytest.mark.parametrize("slots", [s for s in SLOTS if s[0][1] == max(k for _, k in s)])
def test_trtllm_reads_the_schedule_as_meant(slots: list[tuple[int, int]]) -> None:
    top_batch = 48
    schedule, why = trtllm.draft_len_schedule(slots, top_batch)
    assert schedule is not None and why == ""
    trtllm_check(schedule, max(k for _, k in slots))
    for batch in range(1, top_batch + 1):
        assert trtllm.draft_len_for_batch(schedule, batch) == intended(slots, batch), batch
    # Past the last key TensorRT-LLM drafts nothing (min_draft_len, 0 by default).
    assert trtllm.draft_len_for_batch(schedule, top_batch + 1) == 0


def test_trtllm_cannot_express_a_schedule_that_drafts_more_above_batch_one() -> None:
    schedule, why = trtllm.draft_len_schedule([(1, 0), (16, 2)], 48)
    assert schedule is None and "draft_len_schedule[1] must equal max_draft_len" in why


def test_a_schedule_must_start_at_one() -> None:
    with pytest.raises(ValueError, match="starts at batch size 1"):
        sglang_schedule.adaptive_config([(4, 3)])


def test_each_level_keeps_the_batches_just_below_it_in_its_own_slot() -> None:
    """A closed-loop level at C runs batches a little below C most of the time (a finished
    request's replacement still in prefill). Slots keyed at the levels themselves sent those
    dips to the level below (C=16's batches of 14 ran C=4's steps); a batch between two levels
    takes the steps of the nearer one in log scale."""
    from types import SimpleNamespace

    from specdecode_tune.report.recommend import schedule_slots

    def chain(*steps_at: tuple[int, int]) -> tuple:
        return tuple(SimpleNamespace(c=c, steps=s) for c, s in steps_at)

    slots, note = schedule_slots(chain((1, 12), (4, 8), (16, 5), (64, 4)), None)
    assert slots == [(1, 12), (2, 8), (8, 5), (32, 4)] and note == ""
    conf = sglang_schedule.adaptive_config(slots)
    keys = sorted(int(k) for k in conf)
    for batch, steps in ((1, 12), (3, 8), (4, 8), (14, 5), (15, 5), (16, 5), (40, 4), (64, 4)):
        key = keys[bisect.bisect_right(keys, batch) - 1]      # SGLang: the largest key <= batch
        assert conf[str(key)]["candidate_steps"] == [steps], batch
    # Running batches, not concurrency: with a running limit of 11, C=16 and C=64 both run 11.
    slots, note = schedule_slots(chain((1, 12), (4, 8), (16, 5), (64, 4)), 11)
    assert slots == [(1, 12), (2, 8), (7, 4)] and "C=64" in note


# ---------------------------------------------------------------------------------------------
# The seam: each engine's backend writes its own file; the report renders what they return.

ASK = ScheduleAsk(slots=((1, 5), (4, 3)), params=resolve({STEPS: 5}, {}), top_steps=5,
                  running_limit=11)


def cfg(kind: str, **kw: object) -> BackendConfig:
    base: dict[str, object] = {"kind": kind, "model_path": "Qwen/Qwen3.5-122B-A10B",
                               "draft_model_path": "/models/eagle3",
                               "speculative_algorithm": "EAGLE3", "tp_size": 2}
    base.update(kw)
    return BackendConfig(**base)  # type: ignore[arg-type]


def test_every_format_once_in_the_reports_order_for_an_experiment_of_any_engine() -> None:
    for exp in (None, *(cfg(kind) for kind in BACKENDS)):
        files = schedule_files(exp, ASK)
        assert [f.engine for f in files] == ["sglang", "vllm", "trtllm"], exp
        assert [f.file_name for f in files] == ["sglang-adaptive-config.json",
                                                "vllm-speculative-config.json",
                                                "trtllm-draft-len-schedule.json"]
        assert all(f.content is not None and f.file_name in f.about for f in files)
        # No schedule: every format says so, none writes a file.
        assert [(f.content, f.about) for f in schedule_files(exp, None)] == [
            (None, NOTHING)] * 3


def test_the_command_is_the_experiments_own_engine_where_it_boots_the_file() -> None:
    by = {f.engine: f for f in schedule_files(cfg("sim", engine_version="0.5.13"), ASK)}
    # The simulator's experiment: SGLang's format written by the simulator's backend, whose
    # command is SGLang's launch command for the file (the simulator stands in for SGLang).
    sglang_cmd = by["sglang"].command
    assert sglang_cmd is not None and sglang_cmd.startswith("python -m sglang.launch_server")
    assert "--speculative-adaptive-config sglang-adaptive-config.json" in sglang_cmd
    assert "--speculative-num-steps 5" in sglang_cmd
    # Another engine's: vLLM's model and tensor parallelism with the JSON, K the largest.
    vllm_cmd = by["vllm"].command
    assert vllm_cmd is not None and vllm_cmd.startswith(
        "vllm serve Qwen/Qwen3.5-122B-A10B --tensor-parallel-size 2 --speculative-config")
    assert by["vllm"].content is not None and by["vllm"].content[
        "num_speculative_tokens_per_batch_size"] == [[1, 3, 5], [4, 4, 3]]
    assert "mem_fraction_static has no exact vLLM equivalent" in by["vllm"].about
    assert by["trtllm"].command is None
    assert by["trtllm"].content == {"draft_len_schedule": {1: 5, 3: 5, 11: 3}}
    # A release that does not read the file: no command (the report says why, from
    # schedule_params); a vLLM experiment: no SGLang command, its own vLLM one.
    assert schedule_files(cfg("sim"), ASK)[0].command is None
    vllm_own = schedule_files(cfg("vllm"), ASK)
    assert vllm_own[0].command is None and vllm_own[1].command is not None
    assert "no exact vLLM equivalent" not in vllm_own[1].about
    # No experiment: the formats alone.
    assert all(f.command is None for f in schedule_files(None, ASK))


def test_every_printed_command_names_the_paths_the_server_was_given(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Found on the first real SGLang search (2026-12-07): the report's vLLM line read
    `vllm serve '${SPECDECODE_CACHE}/eagle3-models/target'`, quoted by shlex, which no shell
    expands, while SGLang's line beside it had the path the server was given."""
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    paths = {"model_path": "${SPECDECODE_CACHE}/m/target",
             "draft_model_path": "${SPECDECODE_CACHE}/m/eagle3"}
    for kind in BACKENDS:
        for f in schedule_files(cfg(kind, **paths), ASK):
            text = f"{f.command or ''} {f.content or ''}"
            assert "SPECDECODE_CACHE" not in text, (kind, f.engine, text)
            if f.engine == "vllm":
                assert f.command is not None and f"vllm serve {tmp_path}/m/target" in f.command
                assert f.content is not None and f.content["model"] == f"{tmp_path}/m/eagle3"
    own = BACKENDS["vllm"].launch_command(cfg("vllm", **paths), {STEPS: 3})
    assert own.startswith(f"vllm serve {tmp_path}/m/target") and "SPECDECODE" not in own


def test_trtllm_that_cannot_express_it_says_why_and_writes_nothing() -> None:
    ask = ScheduleAsk(slots=((1, 0), (16, 2)), params=resolve({STEPS: 2}, {}), top_steps=2)
    trt = schedule_files(None, ask)[2]
    assert trt.content is None and "draft_len_schedule[1] must equal max_draft_len" in trt.why
    assert "TensorRT-LLM needs batch 1 to draft the most" in trt.about


def test_no_engine_is_named_outside_backends() -> None:
    """The layout drawn from the imports: only backends/ imports an engine's module; the
    report, the search and the trial reach the engines through the registry and the
    protocol."""
    engines = {"sglang", "vllm", "llamacpp", "trtllm", "sim", "sglang_argcheck", "sglang_logs",
               "sglang_python", "sglang_releases", "sglang_schedule", "sglang_wire"}
    package = Path(specdecode_tune.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        if (package / "backends") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [f"{node.module}.{a.name}" for a in node.names]
                mods = [node.module] + names
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            else:
                continue
            for mod in mods:
                parts = mod.split(".")
                if "backends" in parts and parts[parts.index("backends") + 1:][:1] and \
                        parts[parts.index("backends") + 1] in engines:
                    found.append(f"{path.relative_to(package)}: {mod}")
    assert found == []
