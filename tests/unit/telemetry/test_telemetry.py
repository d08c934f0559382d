"""telemetry: CUDA_VISIBLE_DEVICES -> NVML handles, the suspect rules, the sampler thread, the
no-GPU path and the telemetry table, all against a fake NVML (tests/fakenvml.py)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from specdecode_tune import store, telemetry
from specdecode_tune.records import LevelSummary
from specdecode_tune.telemetry import (
    GpuProcess,
    GpuSample,
    LevelTelemetry,
    SuspectRules,
    TelemetrySampler,
    decode_clock_events,
    gpu_handles,
    merge_level,
    server_pids,
    summarize,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
from fakenvml import MIB, FakeGpu, FakeNvml, pair

IDLE, POWER_CAP, HW_SLOWDOWN, SYNC_BOOST, SW_THERMAL, APP_CLOCKS = 0x1, 0x4, 0x8, 0x10, 0x20, 0x2


@pytest.fixture(autouse=True)
def fresh_log_once() -> Iterator[None]:
    telemetry._logged.clear()
    yield
    telemetry._logged.clear()


@pytest.fixture
def host_pid_ns(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML's pids are this namespace's (as on a host, or a driver that translates them)."""
    monkeypatch.setattr(telemetry.sampler, "in_host_pid_namespace", lambda: True)


def unused_pid() -> int:
    """A pid no process here can have (above the kernel's pid_max): /proc never names it."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read()) + 7
    except OSError:
        return 4_194_304 + 7


@pytest.fixture
def container_pid_ns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(telemetry.sampler, "in_host_pid_namespace", lambda: False)


@pytest.fixture
def escaped() -> Iterator[list[BaseException]]:
    """Exceptions that left any thread (threading.excepthook)."""
    seen: list[BaseException] = []
    old = threading.excepthook
    threading.excepthook = lambda args: seen.append(args.exc_value)
    yield seen
    threading.excepthook = old


# ---------------------------------------------------------------------------------------------
# CUDA_VISIBLE_DEVICES -> handles


def uuids(refs: list[telemetry.GpuRef]) -> list[str]:
    return [r.uuid for r in refs]


def test_unset_means_every_gpu_in_pci_bus_order() -> None:
    nvml, g0, g1, g2, g3 = pair()                 # NVML enumerates them as 2, 0, 3, 1
    refs = gpu_handles(None, nvml)
    assert uuids(refs) == [g0.uuid, g1.uuid, g2.uuid, g3.uuid]
    assert [r.cuda_index for r in refs] == [0, 1, 2, 3]
    assert [r.nvml_index for r in refs] == [1, 3, 0, 2]
    assert refs[0].handle is g0 and refs[0].parent is None
    assert refs[0].name == "NVIDIA H200" and refs[0].pci_bus_id == "00000000:18:00.0"


@pytest.mark.parametrize("env", ["", "  "])
def test_empty_means_no_gpu(env: str) -> None:
    nvml, *_ = pair()
    assert gpu_handles(env, nvml) == []


def test_indices_follow_cuda_order_not_nvml_order() -> None:
    nvml, g0, _, g2, _ = pair()
    refs = gpu_handles("2,0", nvml)
    assert uuids(refs) == [g2.uuid, g0.uuid]
    assert [(r.cuda_index, r.entry) for r in refs] == [(0, "2"), (1, "0")]


def test_bus_ids_compare_as_numbers() -> None:
    gpus = [FakeGpu(uuid="GPU-b", bus_id="0000:9a:00.0"), FakeGpu(uuid="GPU-a",
                                                                  bus_id="00000000:1B:00.0")]
    assert uuids(gpu_handles(None, FakeNvml(gpus))) == ["GPU-a", "GPU-b"]


def test_full_uuids_and_unique_prefixes() -> None:
    nvml, g0, g1, g2, g3 = pair()
    assert uuids(gpu_handles(f"{g3.uuid},{g1.uuid}", nvml)) == [g3.uuid, g1.uuid]
    assert uuids(gpu_handles(" GPU-2222 , GPU-0000AAAA", nvml)) == [g2.uuid, g0.uuid]
    assert uuids(gpu_handles(f"{g1.uuid.upper()},0", nvml)) == [g1.uuid, g0.uuid]


def test_indices_and_uuids_mix() -> None:
    nvml, _, g1, _, g3 = pair()
    assert uuids(gpu_handles(f"3,{g1.uuid}", nvml)) == [g3.uuid, g1.uuid]


@pytest.mark.parametrize("env, expect", [
    ("0,7,1", [0]),            # CUDA stops at the first bad entry
    ("7,0", []),
    ("-1", []),
    ("abc,0", []),
    ("1,GPU-,0", [1]),         # an ambiguous prefix names no device
    ("1,GPU-ffff,0", [1]),     # a prefix that matches nothing
    ("1,,0", [1]),
    ("0,MIG-nope", [0]),
])
def test_bad_entries_end_the_list_like_cuda(env: str, expect: list[int],
                                            caplog: pytest.LogCaptureFixture) -> None:
    nvml, *gpus = pair()
    with caplog.at_level(logging.WARNING, logger="specdecode_tune.telemetry"):
        refs = gpu_handles(env, nvml)
        gpu_handles(env, nvml)
    assert uuids(refs) == [gpus[i].uuid for i in expect]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "names no GPU" in warnings[0], warnings


def test_a_device_named_twice_is_sampled_once() -> None:
    nvml, g0, g1, *_ = pair()
    refs = gpu_handles(f"1,{g1.uuid},0", nvml)
    assert uuids(refs) == [g1.uuid, g0.uuid]
    assert [r.cuda_index for r in refs] == [0, 1]


def mig_machine() -> tuple[FakeNvml, FakeGpu, FakeGpu, list[FakeGpu]]:
    migs = [FakeGpu(uuid=f"MIG-{c}{c}{c}{c}0000-aaaa-bbbb-cccc-dddddddddddd", bus_id="",
                    gi=gi, ci=0) for c, gi in (("7", 1), ("8", 2))]
    plain = FakeGpu(uuid="GPU-00000000-0000-0000-0000-000000000000", bus_id="00000000:18:00.0")
    parted = FakeGpu(uuid="GPU-11111111-1111-1111-1111-111111111111",
                     bus_id="00000000:38:00.0", mig=migs)
    return FakeNvml([plain, parted]), plain, parted, migs


def test_mig_uuids_map_to_the_mig_device_with_its_gpu_as_parent() -> None:
    nvml, _, parted, migs = mig_machine()
    refs = gpu_handles("MIG-8888,MIG-77770000-aaaa-bbbb-cccc-dddddddddddd", nvml)
    assert uuids(refs) == [migs[1].uuid, migs[0].uuid]
    assert refs[0].handle is migs[1] and refs[0].parent is parted
    assert refs[0].nvml_index == 1 and refs[0].pci_bus_id == parted.bus_id


def test_legacy_mig_form_and_indices_of_mig_gpus() -> None:
    nvml, _, parted, migs = mig_machine()
    refs = gpu_handles(f"MIG-{parted.uuid}/2/0", nvml)
    assert uuids(refs) == [migs[1].uuid] and refs[0].parent is parted
    assert gpu_handles(f"MIG-{parted.uuid}/3/0", nvml) == []
    # An index names the physical GPU (CUDA then picks one of its MIG devices).
    refs = gpu_handles("1", nvml)
    assert uuids(refs) == [parted.uuid] and refs[0].parent is None


def test_mixed_models_with_fastest_first_warn_once(caplog: pytest.LogCaptureFixture) -> None:
    gpus = [FakeGpu(uuid="GPU-a", bus_id="00000000:18:00.0", name="NVIDIA H200"),
            FakeGpu(uuid="GPU-b", bus_id="00000000:38:00.0", name="NVIDIA L4")]
    nvml = FakeNvml(gpus)
    with caplog.at_level(logging.WARNING, logger="specdecode_tune.telemetry"):
        assert uuids(gpu_handles("1", nvml, device_order="PCI_BUS_ID")) == ["GPU-b"]
        assert not caplog.records
        assert uuids(gpu_handles("1", nvml, device_order="FASTEST_FIRST")) == ["GPU-b"]
        gpu_handles("0", nvml, device_order="")
        gpu_handles("GPU-a", nvml, device_order="FASTEST_FIRST")   # UUIDs: no ordering doubt
    assert len(caplog.records) == 1
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in caplog.records[0].getMessage()


# ---------------------------------------------------------------------------------------------
# The suspect rules


def sample(gpu: int = 0, t: float = 0.0, *, clock: int | None = 1980, mask: int = 0,
           dt: float = 0.5, foreign: tuple[GpuProcess, ...] = ()) -> GpuSample:
    return GpuSample(gpu=gpu, uuid=f"GPU-{gpu}", t_s=t, dt_s=dt, wall=1000.0 + t,
                     mem_used_mib=1000.0, mem_total_mib=143771.0, util_gpu=90, util_mem=50,
                     sm_clock_mhz=clock, mem_clock_mhz=3201, clock_events_mask=mask,
                     clock_events=decode_clock_events(mask), temperature_c=50, power_w=500.0,
                     foreign=foreign)


def level(clocks: dict[int, list[int]], masks: dict[int, list[int]] | None = None
          ) -> list[GpuSample]:
    """Samples every 0.5 s per GPU, from per-GPU clock lists (and clock-event masks)."""
    masks = masks or {}
    return [sample(g, 0.5 * i, clock=c, mask=masks.get(g, [0] * len(cs))[i])
            for g, cs in clocks.items() for i, c in enumerate(cs)]


def test_decode_clock_events() -> None:
    assert decode_clock_events(0) == ()
    assert decode_clock_events(0x1 | 0x4 | 0x40) == ("GpuIdle", "SwPowerCap", "HwThermalSlowdown")
    assert decode_clock_events(0x1000 | 0x8) == ("HwSlowdown", "0x1000")


def test_a_clean_level_is_not_suspect() -> None:
    t = summarize(level({0: [1980, 1965, 1980, 1980], 1: [1980, 1980, 1950, 1980]}), ["a", "b"])
    assert t.available and not t.suspect and t.reasons == () and t.note == ""
    assert t.sm_clock_min_mhz == 1950 and t.sm_clock_median_mhz == 1980.0
    assert t.throttle_s == {} and t.foreign == () and t.duration_s == 2.0
    assert t.gpus == ("a", "b") and len(t.samples) == 8


def test_idle_power_saving_is_not_throttling() -> None:
    # The GPU idles (low clocks, GpuIdle) at the start: neither throttle time nor a clock drop.
    clocks = {0: [345, 345, 345, 1980, 1980, 1980, 1980]}
    t = summarize(level(clocks, {0: [IDLE] * 3 + [0] * 4}), ["a"])
    assert not t.suspect, t.reasons
    assert t.throttle_s == {} and t.sm_clock_min_mhz == 1980


@pytest.mark.parametrize("mask, name", [(POWER_CAP, "SwPowerCap"), (HW_SLOWDOWN, "HwSlowdown"),
                                        (SYNC_BOOST, "SyncBoost"),
                                        (SW_THERMAL, "SwThermalSlowdown"),
                                        (0x40, "HwThermalSlowdown"),
                                        (0x80, "HwPowerBrakeSlowdown")])
def test_throttling_that_is_not_idle_makes_a_level_suspect(mask: int, name: str) -> None:
    t = summarize(level({0: [1980] * 6, 1: [1980] * 6},
                        {0: [0, mask, mask | IDLE, 0, 0, 0], 1: [0, mask, 0, 0, 0, 0]}),
                  ["a", "b"])
    assert t.suspect
    # Both GPUs throttled at t=0.5: that half second counts once.
    assert t.throttle_s == {name: 1.0}
    assert t.reasons == (f"GPU clock throttling: {name} 1.0 s",)
    assert t.note == t.reasons[0]


def test_clock_settings_are_recorded_but_do_not_flag() -> None:
    t = summarize(level({0: [1755] * 4}, {0: [APP_CLOCKS] * 4}), ["a"])
    assert not t.suspect and t.throttle_s == {"ApplicationsClocksSetting": 2.0}


def test_min_throttle_s_ignores_blips() -> None:
    samples = level({0: [1980] * 4}, {0: [0, POWER_CAP, 0, 0]})
    assert summarize(samples, ["a"]).suspect
    assert not summarize(samples, ["a"], SuspectRules(min_throttle_s=0.5)).suspect


def test_a_clock_drop_after_warm_up_makes_a_level_suspect() -> None:
    clocks = {0: [1980] * 10, 1: [1980] * 4 + [1500, 1500, 1500] + [1980] * 3}
    t = summarize(level(clocks), ["a", "b"], SuspectRules(warmup_s=1.0))
    assert t.suspect
    assert t.reasons == (
        "GPU 1: SM clock fell to 1500 MHz (24% below the level's median 1980 MHz) for 1.5 s",)
    assert t.sm_clock_min_mhz == 1500


def test_clock_drops_that_do_not_count() -> None:
    rules = SuspectRules(warmup_s=1.0, min_drop_s=1.0)
    # During warm-up only.
    assert not summarize(level({0: [1200, 1500, 1980, 1980, 1980, 1980]}), ["a"], rules).suspect
    # One sample (0.5 s < min_drop_s).
    assert not summarize(level({0: [1980, 1980, 1980, 1500, 1980, 1980]}), ["a"], rules).suspect
    # Within 10 % of the median.
    assert not summarize(level({0: [1980] * 3 + [1800] * 3 + [1980] * 3}), ["a"], rules).suspect
    # While the GPU idles.
    assert not summarize(level({0: [1980] * 3 + [400] * 3 + [1980] * 3},
                               {0: [0] * 3 + [IDLE] * 3 + [0] * 3}), ["a"], rules).suspect
    # Too few samples to judge.
    assert not summarize(level({0: [1980, 900]}), ["a"], SuspectRules()).suspect


def test_foreign_processes_make_a_level_suspect() -> None:
    other = GpuProcess(pid=4242, name="python", used_mib=512.0, gpu=1)
    smaller = GpuProcess(pid=4242, name="python", used_mib=100.0, gpu=1)
    samples = [sample(0, 0.0), sample(1, 0.0, foreign=(smaller,)), sample(1, 0.5, foreign=(other,))]
    t = summarize(samples, ["a", "b"])
    assert t.suspect and t.foreign == (other,)
    assert t.reasons == ("foreign GPU process: pid 4242 python on GPU 1, 512 MiB",)


def test_unattributed_processes_are_a_caveat_not_a_flag() -> None:
    ghost = GpuProcess(pid=987654, name="?", used_mib=None, gpu=0, attributed=False)
    t = summarize([sample(0, 0.0, foreign=(ghost,))], ["a"])
    assert not t.suspect and t.foreign == (ghost,)
    assert "could not be attributed" in t.note and "pid 987654 ? on GPU 0" in t.note


def test_no_samples_is_not_suspect() -> None:
    t = summarize([], ["a"])
    assert t.available and not t.suspect and t.caveats


def test_rules_validate_themselves() -> None:
    with pytest.raises(ValueError, match="clock_drop_frac"):
        SuspectRules(clock_drop_frac=1.5)
    with pytest.raises(ValueError, match="min_drop_s=-1"):
        SuspectRules(min_drop_s=-1)
    with pytest.raises(ValueError, match="interval_s"):
        TelemetrySampler(None, interval_s=0)


def summary(**kw: object) -> LevelSummary:
    values: dict[str, object] = {
        "concurrency": 8, "mode": "closed", "rate": None, "duration_s": 30.0, "requests": 10,
        "errors": 0, "output_tokens": 100, "output_tok_s": 3.3, "requests_s": 0.3,
        "accept_length": None,
        **{f"{m}_{p}": None for m in ("ttft", "tpot", "itl", "e2e") for p in ("p50", "p90", "p99")},
    }
    values.update(kw)
    return LevelSummary(**values)  # type: ignore[arg-type]


def test_merge_level() -> None:
    flagged = summarize(level({0: [1980] * 3}, {0: [0, HW_SLOWDOWN, 0]}), ["a"])
    merged = merge_level(summary(note="concurrency 8 > running limit 4: queueing"), flagged)
    assert merged.suspect
    assert merged.note == "concurrency 8 > running limit 4: queueing; GPU clock throttling: " \
                          "HwSlowdown 0.5 s"
    clean = merge_level(summary(), summarize(level({0: [1980] * 3}), ["a"]))
    assert not clean.suspect and clean.note == ""
    kept = merge_level(summary(suspect=True, note="x"), LevelTelemetry.unavailable("no NVML"))
    assert kept.suspect and kept.note == "x"


# ---------------------------------------------------------------------------------------------
# The sampler


def wait_for(cond: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.005)


def n_calls(nvml: FakeNvml, name: str = "nvmlDeviceGetMemoryInfo") -> int:
    return nvml.calls.get(name, 0)


def test_samples_exactly_the_trials_gpus(host_pid_ns: None, escaped: list[BaseException]) -> None:
    nvml, _, g1, g2, _ = pair()
    g1.sm_clock, g2.mem_used, g2.reasons = 1950, 2048 * MIB, IDLE
    with TelemetrySampler("2,1", interval_s=0.01, nvml=nvml) as s:
        assert s.available and s.why == ""
        assert [g.uuid for g in s.gpus] == [g2.uuid, g1.uuid]
        wait_for(lambda: n_calls(nvml) >= 10)
        t = s.cut()
    assert nvml.initialised == 0                    # shut down again
    assert t.available and not t.suspect, t.reasons
    assert t.gpus == (g2.uuid, g1.uuid)
    assert {x.uuid for x in t.samples} == {g2.uuid, g1.uuid}
    first = next(x for x in t.samples if x.gpu == 0)
    assert first.mem_used_mib == 2048.0 and first.mem_total_mib == 143771.0
    assert first.clock_events == ("GpuIdle",) and first.clock_events_mask == IDLE
    assert first.util_gpu == 90 and first.util_mem == 60 and first.temperature_c == 45
    assert first.power_w == 400.0 and first.mem_clock_mhz == 3201
    assert t.sm_clock_min_mhz == 1950                # GPU 0 idles: only GPU 1 counts
    assert escaped == []


def test_cut_starts_a_new_window(host_pid_ns: None) -> None:
    nvml, g0, *_ = pair()
    with TelemetrySampler("0", interval_s=0.01, nvml=nvml) as s:
        wait_for(lambda: n_calls(nvml) >= 5)
        g0.reasons = POWER_CAP
        wait_for(lambda: n_calls(nvml) >= 10)
        g0.reasons = 0
        first = s.cut()
        mark = n_calls(nvml)
        wait_for(lambda: n_calls(nvml) >= mark + 5)
        second = s.cut()
        mark = n_calls(nvml)
        wait_for(lambda: n_calls(nvml) >= mark + 3)
    assert first.suspect and "SwPowerCap" in first.throttle_s
    tail = [x for x in second.samples if x.clock_events]
    # At most the tick that straddled the cut still saw the power cap.
    assert len(tail) <= 1 and not set(second.samples) & set(first.samples)
    assert all(0.0 <= x.t_s < 5.0 for x in second.samples)
    assert min(x.t_s for x in second.samples) < 0.05


def test_foreign_process_is_flagged_and_the_servers_are_not(host_pid_ns: None) -> None:
    nvml, g0, g1, *_ = pair()
    server, child, stranger = 7001, 7002, unused_pid()
    asked: list[int] = []

    def own() -> set[int]:
        asked.append(1)
        return {server, child}

    g0.processes = [(server, 40_000 * MIB)]
    g1.processes = [(child, 40_000 * MIB)]
    with TelemetrySampler("0,1", interval_s=0.01, nvml=nvml, own_pids=own) as s:
        wait_for(lambda: n_calls(nvml) >= 10)
        calm = s.cut()
        calls_before = len(asked)
        g1.processes.append((stranger, 512 * MIB))
        mark = n_calls(nvml)
        wait_for(lambda: n_calls(nvml) >= mark + 10)
        busy = s.cut()
    assert not calm.suspect and calm.foreign == ()
    assert calls_before == 1                          # own_pids: only when an unknown pid shows
    assert busy.suspect
    assert [(p.pid, p.gpu, p.used_mib, p.attributed) for p in busy.foreign] == \
        [(stranger, 1, 512.0, True)]
    assert busy.foreign[0].name == "other"            # not in /proc here: NVML's name
    assert busy.reasons == (f"foreign GPU process: pid {stranger} other on GPU 1, 512 MiB",)


def test_a_visible_foreign_process_is_named_from_proc(host_pid_ns: None) -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        wait_for(lambda: Path(f"/proc/{proc.pid}/comm").read_text().strip() == "sleep")
        nvml, g0, *_ = pair()
        g0.processes = [(proc.pid, None)]
        with TelemetrySampler("0", interval_s=0.01, nvml=nvml) as s:
            wait_for(lambda: n_calls(nvml) >= 3)
            t = s.cut()
    finally:
        proc.kill()
        proc.wait()
    assert t.suspect and [(p.pid, p.name, p.used_mib) for p in t.foreign] == \
        [(proc.pid, "sleep", None)]


def test_pids_from_another_namespace_are_not_flagged_until_ours_show(
        container_pid_ns: None) -> None:
    nvml, g0, *_ = pair()
    server, host_pid = 7001, 123456
    g0.processes = [(host_pid, 100 * MIB)]
    with TelemetrySampler("0", interval_s=0.01, nvml=nvml, own_pids=lambda: {server}) as s:
        wait_for(lambda: n_calls(nvml) >= 5)
        before = s.cut()
        g0.processes.append((server, 1000 * MIB))     # the driver translates pids after all
        mark = n_calls(nvml)
        wait_for(lambda: n_calls(nvml) >= mark + 5)
        after = s.cut()
    assert not before.suspect and before.foreign[0].attributed is False
    assert "could not be attributed" in before.note
    assert after.suspect and [p.pid for p in after.foreign if p.attributed] == [host_pid]


def test_stop_is_prompt_even_with_a_long_interval() -> None:
    nvml, *_ = pair()
    s = TelemetrySampler(None, interval_s=30.0, nvml=nvml).start()
    time.sleep(0.05)
    t0 = time.monotonic()
    level = s.stop()
    assert time.monotonic() - t0 < 1.0
    assert level.available and len(level.samples) == 4   # the first tick, one per GPU
    assert s.stop().available                             # twice is fine


def test_stop_does_not_hang_on_a_hanging_gpu(caplog: pytest.LogCaptureFixture) -> None:
    nvml, *_ = pair()
    s = TelemetrySampler("0", interval_s=0.01, nvml=nvml).start()
    nvml.delay_s = 10.0
    time.sleep(0.1)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="specdecode_tune.telemetry"):
        s.stop()
    assert time.monotonic() - t0 < 3.0
    assert "did not stop" in caplog.text
    nvml.delay_s = 0.0


def test_no_exception_leaves_the_thread(host_pid_ns: None, escaped: list[BaseException],
                                        caplog: pytest.LogCaptureFixture) -> None:
    nvml, g0, *_ = pair()
    g0.processes = [(7001, MIB)]

    def broken_own() -> set[int]:
        raise RuntimeError("own_pids bug")

    with caplog.at_level(logging.WARNING, logger="specdecode_tune.telemetry"), \
            TelemetrySampler("0", interval_s=0.01, nvml=nvml, own_pids=broken_own) as s:
        wait_for(lambda: n_calls(nvml) >= 3)
        nvml.fail["nvmlDeviceGetPowerUsage"] = nvml.NVMLError_GpuIsLost  # one field fails
        mark = n_calls(nvml)
        wait_for(lambda: n_calls(nvml) >= mark + 3)
        nvml.fail["nvmlDeviceGetMemoryInfo"] = ZeroDivisionError         # not even NVML's
        mark = n_calls(nvml)
        wait_for(lambda: n_calls(nvml) >= mark + 5)
        del nvml.fail["nvmlDeviceGetMemoryInfo"]
        mark = n_calls(nvml)
        wait_for(lambda: n_calls(nvml) >= mark + 3)      # and it goes on sampling
        t = s.cut()
    assert escaped == []
    assert t.samples[-1].power_w is None and t.samples[0].power_w == 400.0
    assert t.samples[-1].mem_used_mib is not None
    text = caplog.text
    assert text.count("own_pids() failed") == 1
    assert text.count("power failed") == 1 and text.count("a sample failed") == 1


def test_not_supported_fields_are_none_and_quiet(caplog: pytest.LogCaptureFixture) -> None:
    nvml, _, parted, migs = mig_machine()
    with caplog.at_level(logging.WARNING, logger="specdecode_tune.telemetry"), \
            TelemetrySampler(migs[0].uuid, interval_s=0.01, nvml=nvml) as s:
        wait_for(lambda: n_calls(nvml) >= 3)
        t = s.cut()
    x = t.samples[0]
    assert x.uuid == migs[0].uuid and x.util_gpu is None       # not on a MIG device
    assert x.sm_clock_mhz == parted.sm_clock                    # read from the parent GPU
    assert not caplog.records


def test_old_driver_falls_back_to_the_throttle_reasons_name() -> None:
    nvml, g0, *_ = pair()
    g0.reasons = HW_SLOWDOWN
    nvml.fail["nvmlDeviceGetCurrentClocksEventReasons"] = nvml.NVMLError_FunctionNotFound
    with TelemetrySampler("0", interval_s=0.01, nvml=nvml) as s:
        wait_for(lambda: n_calls(nvml) >= 3)
        t = s.cut()
    assert t.suspect and t.samples[-1].clock_events == ("HwSlowdown",)
    assert n_calls(nvml, "nvmlDeviceGetCurrentClocksEventReasons") == 1


# ---------------------------------------------------------------------------------------------
# No GPU: nothing recorded, said once, never raised


@pytest.mark.parametrize("make, gpu_env, why", [
    (lambda: FakeNvml([], init_error=None), None, "NVML sees no GPU"),
    (lambda: pair()[0], "7", "no GPU of CUDA_VISIBLE_DEVICES='7' is known to NVML"),
    (lambda: pair()[0], "", "CUDA_VISIBLE_DEVICES is empty: the trial has no GPU"),
])
def test_no_gpu(make: object, gpu_env: str | None, why: str,
                caplog: pytest.LogCaptureFixture) -> None:
    nvml = make()  # type: ignore[operator]
    with caplog.at_level(logging.INFO, logger="specdecode_tune.telemetry"):
        for _ in range(2):
            with TelemetrySampler(gpu_env, interval_s=0.01, nvml=nvml) as s:
                assert not s.available and s.why == why
                assert s.cut() == LevelTelemetry.unavailable(why)
    assert [r.getMessage() for r in caplog.records
            if r.getMessage().startswith("no GPU telemetry")] == [f"no GPU telemetry: {why}"]
    assert nvml.initialised == 0


@pytest.mark.parametrize("error, name", [("NVMLError_LibraryNotFound", "LibraryNotFound"),
                                         ("NVMLError_DriverNotLoaded", "DriverNotLoaded")])
def test_no_driver(error: str, name: str, caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml([], init_error=getattr(FakeNvml, error))
    with caplog.at_level(logging.INFO, logger="specdecode_tune.telemetry"):
        s = TelemetrySampler(None, nvml=nvml).start()
        level = s.stop()
    assert not level.available and level.why.startswith(f"NVML could not start: {name}")
    assert level.samples == () and not level.suspect and level.note == ""
    assert caplog.records[0].getMessage() == f"no GPU telemetry: {level.why}"


def test_without_nvidia_ml_py(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> None:
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(telemetry.sampler, "load_nvml", missing)
    s = TelemetrySampler(None).start()
    assert not s.available and s.why.startswith("nvidia-ml-py is not installed")
    assert not s.stop().available


def test_the_real_pynvml_on_this_machine_never_raises() -> None:
    pytest.importorskip("pynvml")
    with TelemetrySampler(os.environ.get("CUDA_VISIBLE_DEVICES"), interval_s=0.05) as s:
        time.sleep(0.1)
        level = s.cut()
    if not s.available:                      # CI: no driver
        assert level == LevelTelemetry.unavailable(s.why) and s.why


def test_listing_errors_mean_no_telemetry() -> None:
    nvml, *_ = pair()
    nvml.fail["nvmlDeviceGetUUID"] = nvml.NVMLError_GpuIsLost
    s = TelemetrySampler(None, nvml=nvml).start()
    assert not s.available and "GpuIsLost" in s.why and nvml.initialised == 0


# ---------------------------------------------------------------------------------------------
# server_pids


def test_server_pids_is_the_servers_session() -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"], start_new_session=True)
    try:
        wait_for(lambda: len(server_pids(proc.pid)) >= 3)
        pids = server_pids(proc.pid)
        assert proc.pid in pids and os.getpid() not in pids and len(pids) == 3
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# ---------------------------------------------------------------------------------------------
# The telemetry table


def test_telemetry_table_round_trip(tmp_path: Path) -> None:
    other = GpuProcess(pid=4242, name="python", used_mib=512.0, gpu=1)
    samples = [sample(0, 0.0), sample(1, 0.0, mask=IDLE | POWER_CAP, foreign=(other,)),
               sample(0, 0.5, clock=None)]
    path = store.write_telemetry(tmp_path, "t1", "c8", samples)
    assert path is not None and path.endswith("tables/telemetry/t1-c8.parquet")
    store.write_telemetry(tmp_path, "t0", "r2.5", [sample(0, 0.0)])
    table = store.read_table(tmp_path, "telemetry")
    assert table.schema.equals(store.TELEMETRY_SCHEMA)
    rows = table.to_pylist()
    assert [(r["trial_id"], r["level"], r["t_s"], r["gpu"]) for r in rows] == \
        [("t0", "r2.5", 0.0, 0), ("t1", "c8", 0.0, 0), ("t1", "c8", 0.0, 1), ("t1", "c8", 0.5, 0)]
    assert rows[2]["clock_events"] == ["GpuIdle", "SwPowerCap"]
    assert rows[2]["foreign"] == [{"pid": 4242, "name": "python", "used_mib": 512.0}]
    assert rows[3]["sm_clock_mhz"] is None and rows[3]["foreign"] == []
    assert rows[1]["timestamp"].timestamp() == pytest.approx(1000.0)


def test_telemetry_rewrite_replaces_and_empty_writes_nothing(tmp_path: Path) -> None:
    store.write_telemetry(tmp_path, "t1", "c8", [sample(0, 0.0), sample(0, 0.5)])
    store.write_telemetry(tmp_path, "t1", "c8", [sample(0, 0.0)])
    assert store.read_table(tmp_path, "telemetry").num_rows == 1
    assert store.write_telemetry(tmp_path, "t2", "c8", []) is None
    assert not (tmp_path / "tables" / "telemetry" / "t2-c8.parquet").exists()
    assert store.read_table(tmp_path / "nothing", "telemetry").num_rows == 0
    with pytest.raises(ValueError, match="level_tag"):
        store.write_telemetry(tmp_path, "t1", "../c8", [sample()])
