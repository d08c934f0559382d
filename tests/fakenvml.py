"""A fake NVML with pynvml's names, for telemetry tests on machines without a GPU.

Build one with `FakeNvml([FakeGpu(...), ...])` and pass it as `nvml=`. Each FakeGpu is its own
handle; tests change its fields (clocks, reasons, processes) while a sampler runs. `fail` maps a
function name to an exception class that the function then raises; `init_error` makes nvmlInit
raise; `delay_s` slows every sampling call (a hanging GPU).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

MIB = 1024 * 1024


# pynvml's exception names (NVMLError_<Name>), so that telemetry can tell them apart.
class NVMLError(Exception):
    def __init__(self, value: int = 999) -> None:
        super().__init__(value)
        self.value = value


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(12)


class NVMLError_DriverNotLoaded(NVMLError):
    def __init__(self) -> None:
        super().__init__(9)


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(3)


class NVMLError_NotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(6)


class NVMLError_GpuIsLost(NVMLError):
    def __init__(self) -> None:
        super().__init__(15)


class NVMLError_FunctionNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(13)


@dataclass(eq=False)
class FakeGpu:
    uuid: str
    bus_id: str
    name: str = "NVIDIA H200"
    mem_total: int = 143_771 * MIB
    mem_used: int = 1_000 * MIB
    util_gpu: int = 90
    util_mem: int = 60
    sm_clock: int = 1980
    mem_clock: int = 3201
    reasons: int = 0
    temperature: int = 45
    power_mw: int = 400_000
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes)
    mig: list[FakeGpu] | None = None      # MIG devices (None: MIG mode off)
    gi: int = 0
    ci: int = 0
    parent: FakeGpu | None = None


class FakeNvml:
    """The subset of pynvml that specdecode_tune.telemetry calls."""

    NVMLError = NVMLError
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, gpus: list[FakeGpu], *, init_error: type[Exception] | None = None,
                 nvml_order: list[int] | None = None) -> None:
        self.gpus = gpus
        # NVML's enumeration order (default: as given); the sampler must sort by bus id anyway.
        self.order = nvml_order if nvml_order is not None else list(range(len(gpus)))
        self.init_error = init_error
        self.fail: dict[str, type[Exception]] = {}
        self.calls: dict[str, int] = {}
        self.initialised = 0
        self.delay_s = 0.0                   # every sampling call takes this long
        self.lock = threading.Lock()
        for gpu in gpus:
            for child in gpu.mig or ():
                child.parent = gpu

    def _enter(self, name: str) -> None:
        with self.lock:
            self.calls[name] = self.calls.get(name, 0) + 1
        if name in self.fail:
            raise self.fail[name]()

    # -- library

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise self.init_error()
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._enter("nvmlDeviceGetHandleByIndex")
        return self.gpus[self.order[index]]

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        self._enter("nvmlDeviceGetUUID")
        return h.uuid

    def nvmlDeviceGetName(self, h: FakeGpu) -> bytes:
        self._enter("nvmlDeviceGetName")
        return h.name.encode()               # old bindings return bytes

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> SimpleNamespace:
        self._enter("nvmlDeviceGetPciInfo")
        return SimpleNamespace(busId=h.bus_id)

    # -- MIG

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> tuple[int, int]:
        self._enter("nvmlDeviceGetMigMode")
        if h.parent is not None:
            raise NVMLError_NotSupported()
        return (1, 1) if h.mig is not None else (0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount")
        return 7 if h.mig is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeGpu, index: int) -> FakeGpu:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex")
        if h.mig is None or index >= len(h.mig):
            raise NVMLError_NotFound()
        return h.mig[index]

    def nvmlDeviceGetGpuInstanceId(self, h: FakeGpu) -> int:
        return h.gi

    def nvmlDeviceGetComputeInstanceId(self, h: FakeGpu) -> int:
        return h.ci

    # -- sampling

    def _sampling(self, name: str, h: FakeGpu) -> None:
        self._enter(name)
        if self.delay_s:
            time.sleep(self.delay_s)

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> SimpleNamespace:
        self._sampling("nvmlDeviceGetMemoryInfo", h)
        return SimpleNamespace(total=h.mem_total, used=h.mem_used, free=h.mem_total - h.mem_used)

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> SimpleNamespace:
        self._sampling("nvmlDeviceGetUtilizationRates", h)
        if h.parent is not None:
            raise NVMLError_NotSupported()
        return SimpleNamespace(gpu=h.util_gpu, memory=h.util_mem)

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, kind: int) -> int:
        self._sampling("nvmlDeviceGetClockInfo", h)
        if h.parent is not None:
            raise NVMLError_NotSupported()
        return h.sm_clock if kind == self.NVML_CLOCK_SM else h.mem_clock

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        self._sampling("nvmlDeviceGetCurrentClocksEventReasons", h)
        if h.parent is not None:
            raise NVMLError_NotSupported()
        return h.reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeGpu) -> int:
        self._sampling("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return h.reasons

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        self._sampling("nvmlDeviceGetTemperature", h)
        return h.temperature

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        self._sampling("nvmlDeviceGetPowerUsage", h)
        return h.power_mw

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[SimpleNamespace]:
        self._sampling("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in h.processes]

    def nvmlSystemGetProcessName(self, pid: int) -> bytes:
        self._enter("nvmlSystemGetProcessName")
        return b"/usr/bin/other"


def pair(**kw: Any) -> tuple[FakeNvml, FakeGpu, FakeGpu, FakeGpu, FakeGpu]:
    """A 4-GPU machine (NVML enumerates it out of bus order) and its GPUs in bus order."""
    gpus = [FakeGpu(uuid=f"GPU-{i}{i}{i}{i}aaaa-0000-1111-2222-33334444555{i}",
                    bus_id=f"00000000:{0x18 + 0x20 * i:02X}:00.0", **kw) for i in range(4)]
    nvml = FakeNvml(gpus, nvml_order=[2, 0, 3, 1])
    return (nvml, *gpus)
