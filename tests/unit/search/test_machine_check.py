"""A run resumed on another machine: the baseline measured there once more, and the search goes
on only where that machine serves it at the run's speed (search/baseline.py `check_machine`).

The figures are two real baselines of the same SGLang EAGLE-3 experiment on two H100
machines (docs/gpu-runs.md): 844.4 / 8,740.4 / 15,968.2 tok/s at C=1/16/64 on 2026-12-06, and
511.5 / 4,970.2 / 9,081.2 on 2026-12-07, where every point ran 30-44% slower and the points
came in another order."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakenvml import FakeGpu, FakeNvml

from specdecode_tune import telemetry
from specdecode_tune.config import load_experiment
from specdecode_tune.errors import SearchStopped
from specdecode_tune.records import LevelSummary, TrialResult
from specdecode_tune.search import baseline as bl
from specdecode_tune.search.preflight import RunPlan
from specdecode_tune.store import write_level, write_telemetry, write_trial
from specdecode_tune.telemetry import GpuSample

DATA = Path(__file__).resolve().parents[2] / "data"
THERE = "GPU-c128a0fb-5d25-0cb6-106d-017522ff2b11"
HERE = "GPU-07a1642b-0000-1111-2222-333344445555"
RUN_BEGAN = {1: 844.4, 16: 8740.4, 64: 15968.2}
SLOWER = {1: 511.5, 16: 4970.2, 64: 9081.2}


def level(c: int, tok: float) -> LevelSummary:
    return LevelSummary(
        concurrency=c, mode="closed", rate=None, duration_s=30.0, requests=100, errors=0,
        output_tokens=int(tok * 30), output_tok_s=tok, requests_s=1.0,
        ttft_p50=None, ttft_p90=None, ttft_p99=None, tpot_p50=None, tpot_p90=None,
        tpot_p99=None, itl_p50=None, itl_p90=None, itl_p99=None, e2e_p50=None, e2e_p90=None,
        e2e_p99=None, accept_length=None)


def levels(tok: dict[int, float]) -> list[LevelSummary]:
    return [level(c, t) for c, t in tok.items()]


def sample(uuid: str) -> GpuSample:
    return GpuSample(gpu=0, uuid=uuid, t_s=0.1, dt_s=0.5, wall=1.0, mem_used_mib=1.0,
                     mem_total_mib=2.0, util_gpu=30, util_mem=2, sm_clock_mhz=1980,
                     mem_clock_mhz=2619, clock_events_mask=0, clock_events=(),
                     temperature_c=36, power_w=120.0)


def plan_with_baseline(tmp_path: Path, *, sampled_on: str | None) -> RunPlan:
    exp = load_experiment(DATA / "sim-small.toml")
    run_dir = tmp_path / "run"
    measured = levels({c: RUN_BEGAN[c] for c in exp.measure.concurrency if c in RUN_BEGAN})
    write_trial(str(run_dir), TrialResult(trial_id=bl.BASELINE_ID, params={}, status="ok",
                                          levels=tuple(measured)),
                extra={"score": 0.0, "sampler": "baseline"})
    for lv in measured:
        write_level(str(run_dir), bl.BASELINE_ID, lv, [], params={}, repeat=0)
        if sampled_on:
            write_telemetry(str(run_dir), bl.BASELINE_ID, f"c{lv.concurrency}",
                            [sample(sampled_on)])
    return RunPlan(exp=exp, run_dir=str(run_dir), local_dir=tmp_path / "local",
                   storage=str(tmp_path), name="run", is_uri=False)


class Boots:
    """The check's baseline boot, as the Ray task would answer it; counts the boots."""

    def __init__(self, tok: dict[int, float], status: str = "ok") -> None:
        self.tok, self.status, self.where = tok, status, []  # type: list[tuple[str, str]]

    def __call__(self, run_dir: str, local_dir: str) -> TrialResult:
        self.where.append((run_dir, local_dir))
        return TrialResult(trial_id=bl.BASELINE_ID, params={}, status=self.status,
                           reason="" if self.status == "ok" else "the server refused",
                           levels=tuple(levels(self.tok)) if self.status == "ok" else ())


def concurrency_of(plan: RunPlan) -> list[int]:
    return [c for c in plan.exp.measure.concurrency if c in RUN_BEGAN]


def test_the_same_machine_boots_nothing(tmp_path: Path) -> None:
    plan = plan_with_baseline(tmp_path, sampled_on=THERE)
    boots = Boots(SLOWER)
    bl.check_machine(plan, bl.existing_baseline(plan.run_dir) or [],
                     gpus_here=lambda: [HERE, THERE], measure=boots)
    assert boots.where == []


def test_a_run_without_gpu_telemetry_has_nothing_to_compare(tmp_path: Path) -> None:
    plan = plan_with_baseline(tmp_path, sampled_on=None)
    assert bl.baseline_gpus(plan.run_dir) == []

    def never() -> list[str]:
        raise AssertionError("asked which GPUs are here though nothing says where it ran")

    bl.check_machine(plan, [], gpus_here=never, measure=Boots(SLOWER))


def test_another_machine_as_fast_goes_on_and_says_so(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    plan = plan_with_baseline(tmp_path, sampled_on=THERE)
    found = bl.existing_baseline(plan.run_dir) or []
    near = {c: t * f for (c, t), f in zip(RUN_BEGAN.items(), (1.02, 0.99, 0.985), strict=True)}
    boots = Boots(near)
    bl.check_machine(plan, found, gpus_here=lambda: [HERE], measure=boots)
    out = capsys.readouterr().out
    assert len(boots.where) == 1
    check_run, check_local = boots.where[0]
    assert check_run.startswith(f"{plan.run_dir}/{bl.CHECK_DIR}/")       # beside, not in
    assert check_local.startswith(str(plan.local_dir / bl.CHECK_DIR))    # its own logs
    assert "which this machine does not have" in out and "going on" in out


def test_a_slower_machine_stops_the_resumed_search_in_one_line(tmp_path: Path) -> None:
    plan = plan_with_baseline(tmp_path, sampled_on=THERE)
    found = bl.existing_baseline(plan.run_dir) or []
    with pytest.raises(SearchStopped) as e:
        bl.check_machine(plan, found, gpus_here=lambda: [HERE], measure=Boots(SLOWER))
    line = str(e.value)
    assert "\n" not in line
    expect = {c: f"C={c} {SLOWER[c] / RUN_BEGAN[c] - 1:+.1%}" for c in concurrency_of(plan)}
    assert all(part in line for part in expect.values()), (expect, line)
    assert "GPU-c128a0f" in line and "--fresh" in line and "noise band" in line


def test_a_failed_check_boot_stops_it_too(tmp_path: Path) -> None:
    plan = plan_with_baseline(tmp_path, sampled_on=THERE)
    with pytest.raises(SearchStopped, match="on this machine failed.*the server refused"):
        bl.check_machine(plan, bl.existing_baseline(plan.run_dir) or [],
                         gpus_here=lambda: [HERE], measure=Boots(SLOWER, status="failed"))


def test_no_gpu_where_trials_run_now_is_said_not_guessed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = plan_with_baseline(tmp_path, sampled_on=THERE)
    boots = Boots(SLOWER)
    bl.check_machine(plan, [], gpus_here=lambda: [], measure=boots)
    assert boots.where == [] and "not known" in capsys.readouterr().out


def test_the_verdict_is_the_shift_every_score_measured_here_would_take() -> None:
    weights = {1: 1.0, 16: 1.0, 64: 1.0}
    old = levels(RUN_BEGAN)
    # One level 4.6% off and the others on: the score's scale moves 1.5%, inside +-3%
    # (the same machine's baseline moved 1.1-4.6% per level between sessions).
    assert bl.machine_verdict(old, levels({1: 844.4 * 1.046, 16: 8740.4, 64: 15968.2}),
                              weights, 0.03, "GPU-c128a0fb") is None
    line = bl.machine_verdict(old, levels(SLOWER), weights, 0.03, "GPU-c128a0fb")
    assert line is not None and "-41.9% on the score's scale" in line
    assert "C=1 -39.4%, C=16 -43.1%, C=64 -43.1%" in line


def test_the_machines_gpus_come_from_nvml_and_none_without_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([FakeGpu(uuid=HERE, bus_id="00000000:19:00.0"),
                     FakeGpu(uuid=THERE, bus_id="00000000:08:00.0")])
    monkeypatch.setattr(telemetry.devices, "load_nvml", lambda: fake)
    assert telemetry.machine_gpu_uuids() == [THERE, HERE]        # PCI bus order
    monkeypatch.setattr(telemetry.devices, "load_nvml",
                        lambda: FakeNvml([], init_error=fake.NVMLError_DriverNotLoaded))
    assert telemetry.machine_gpu_uuids() == []

    def missing() -> None:
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(telemetry.devices, "load_nvml", missing)
    assert telemetry.machine_gpu_uuids() == []
