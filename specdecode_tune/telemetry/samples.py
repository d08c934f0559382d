"""What one reading of one GPU holds: `GpuSample`, the foreign processes it saw (`GpuProcess`),
and the clock-event ("throttle") reasons, decoded from NVML's bit mask.

Per sample and GPU: memory used/total, GPU and memory utilisation, SM and memory clocks, the
clock-event reasons, temperature, power, and the compute processes on the GPU that are not the
trial's own. A field is None where NVML does not support or refused the query. These are the
rows of the telemetry table (`results.write_telemetry`).
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024   # NVML reports bytes; samples hold MiB

# Clock-event reason bits (nvmlClocksEventReason* / nvmlClocksThrottleReason*). Kept here rather
# than read from the module so that a fake NVML needs no constants, and old bindings decode too.
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "GpuIdle"),
    (0x002, "ApplicationsClocksSetting"),
    (0x004, "SwPowerCap"),
    (0x008, "HwSlowdown"),
    (0x010, "SyncBoost"),
    (0x020, "SwThermalSlowdown"),
    (0x040, "HwThermalSlowdown"),
    (0x080, "HwPowerBrakeSlowdown"),
    (0x100, "DisplayClockSetting"),
    (0x200, "BoardLimit"),
    (0x400, "Reliability"),
)
IDLE_REASON = "GpuIdle"
# Fixed clock settings, not events during a level: recorded, but they do not flag a level.
SETTING_REASONS = frozenset({"ApplicationsClocksSetting", "DisplayClockSetting"})


def decode_clock_events(mask: int) -> tuple[str, ...]:
    """Names of the set bits of a clock-event reasons mask; unknown bits as "0x..."."""
    names = [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]
    known = 0
    for bit, _ in CLOCK_EVENT_REASONS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"0x{bit:x}")
            rest &= ~bit
        bit <<= 1
    return tuple(names)


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A compute process on one of the trial's GPUs that is not the trial's own."""

    pid: int
    name: str
    used_mib: float | None   # None where NVML cannot tell (e.g. without permission)
    gpu: int                 # cuda index of the GPU it was seen on
    attributed: bool = True  # False: its pid is not in this PID namespace (see `ownership`)


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU. None where NVML does not support or refused the query."""

    gpu: int                 # cuda index
    uuid: str
    t_s: float               # seconds since the window (level) started
    dt_s: float              # seconds this sample stands for (since the previous one)
    wall: float              # time.time() of the reading
    mem_used_mib: float | None
    mem_total_mib: float | None
    util_gpu: int | None     # percent of time a kernel ran
    util_mem: int | None     # percent of time device memory was read or written
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    clock_events_mask: int | None
    clock_events: tuple[str, ...]
    temperature_c: int | None
    power_w: float | None
    foreign: tuple[GpuProcess, ...] = ()
