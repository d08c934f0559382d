"""GPU telemetry of one trial: NVML samples of exactly the trial's GPUs, and a verdict per level.

    sampler = TelemetrySampler(env.get("CUDA_VISIBLE_DEVICES"), own_pids=lambda: server_pids(pid))
    with sampler:                      # start() ... stop()
        ...one level...
        level = sampler.cut()          # LevelTelemetry of the samples since the last cut
        summary = merge_level(summary, level)

A level is *suspect* (kept out of the report's verdicts) when, during it, a GPU throttled for a
reason other than idle power saving, a foreign process used one of the trial's GPUs, or the SM
clock fell more than `SuspectRules.clock_drop_frac` below the level's median after warm-up.
Telemetry never fails a trial: without nvidia-ml-py, a driver or GPUs it records nothing and
says why once.

The modules, in the order they build on each other:

- `nvml`: importing pynvml, its errors and strings, logging a problem once.
- `samples`: `GpuSample`, `GpuProcess`, the clock-event reasons.
- `devices`: `CUDA_VISIBLE_DEVICES` -> NVML handles (`gpu_handles`, `GpuRef`), CUDA's rules.
- `ownership`: the server's pids (`server_pids`), and which GPU processes are foreign.
- `verdict`: `SuspectRules`, `LevelTelemetry`, `summarize`, `merge_level`.
- `sampler`: `TelemetrySampler`, the thread that samples and cuts windows.

This package reads /proc only through `specdecode_tune.procfs`.
"""

from .devices import GpuRef, gpu_handles, machine_gpu_uuids
from .nvml import _logged as _logged  # tests clear it: every message may be logged again
from .ownership import server_pids
from .sampler import TelemetrySampler
from .samples import (
    CLOCK_EVENT_REASONS,
    IDLE_REASON,
    SETTING_REASONS,
    GpuProcess,
    GpuSample,
    decode_clock_events,
)
from .verdict import LevelTelemetry, SuspectRules, merge_level, summarize

__all__ = [
    "CLOCK_EVENT_REASONS",
    "IDLE_REASON",
    "SETTING_REASONS",
    "GpuProcess",
    "GpuRef",
    "GpuSample",
    "LevelTelemetry",
    "SuspectRules",
    "TelemetrySampler",
    "decode_clock_events",
    "gpu_handles",
    "machine_gpu_uuids",
    "merge_level",
    "server_pids",
    "summarize",
]
