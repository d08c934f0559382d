"""The sampler thread: NVML samples of exactly the trial's GPUs, cut into one window per level.

    sampler = TelemetrySampler(env.get("CUDA_VISIBLE_DEVICES"), own_pids=lambda: server_pids(pid))
    with sampler:                      # start() ... stop()
        ...one level...
        level = sampler.cut()          # LevelTelemetry of the samples since the last cut
        summary = merge_level(summary, level)

Never a crash: without nvidia-ml-py, without a driver or without GPUs the sampler records nothing
and logs "no GPU telemetry: <why>" once per process and reason; an NVML error during sampling
leaves that field empty (None) and is logged once; no exception leaves the sampler thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Self

from ..procfs import in_host_pid_namespace
from .devices import GpuRef, gpu_handles
from .nvml import error_name, error_types, load_nvml, log, log_once
from .ownership import foreign_processes
from .samples import MIB, GpuProcess, GpuSample, decode_clock_events
from .verdict import LevelTelemetry, SuspectRules, summarize

_NVML_CLOCK_SM = 1
_NVML_CLOCK_MEM = 2
_NVML_TEMPERATURE_GPU = 0


class TelemetrySampler:
    """Samples the GPUs of `gpu_env` (a CUDA_VISIBLE_DEVICES value; None = unset) every
    `interval_s` in a daemon thread, from `start()` to `stop()` (or as a context manager).

    `cut()` returns the verdict on the samples since the last cut (or the start) and begins the
    next window; `stop()` returns the verdict on the last window. `own_pids()` returns the
    trial's server pids (called again only when an unknown pid appears). `nvml` is the pynvml
    module or a fake with its function names; None imports pynvml. Without telemetry every
    verdict is `LevelTelemetry.unavailable(why)`; `available` and `why` say so after start().
    """

    def __init__(self, gpu_env: str | None, *, interval_s: float = 0.5,
                 own_pids: Callable[[], set[int]] | None = None, nvml: Any = None,
                 rules: SuspectRules = SuspectRules(),  # noqa: B008 - frozen, so shareable
                 ) -> None:
        if not interval_s > 0.0:
            raise ValueError(f"interval_s must be > 0, got {interval_s=}")
        self.gpu_env = gpu_env
        self.interval_s = float(interval_s)
        self.rules = rules
        self._own_pids = own_pids
        self._nvml = nvml
        self.gpus: list[GpuRef] = []
        self.available = False
        self.why = "not started"
        self._errors: tuple[type[BaseException], ...] = ()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._window: list[GpuSample] = []
        self._window_start = 0.0
        self._last_tick: float | None = None
        self._own: set[int] = set()
        self._events_fn: Callable[[Any], int] | None = None
        self._same_pid_ns = False
        self._initialised = False
        self._started = False

    # -- lifecycle

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> TelemetrySampler:
        """Open NVML, map the GPUs, take a first sample and start the thread. Never raises for
        a missing library, driver or GPU: then `available` is False and `why` says why."""
        if self._started:
            raise RuntimeError("TelemetrySampler.start() called twice")
        self._started = True
        why = self._open()
        if why is not None:
            self.why = why
            log_once(logging.INFO, f"none:{why}", "no GPU telemetry: %s", why)
            return self
        self.available, self.why = True, ""
        self._events_fn = self._clock_events_function()
        self._same_pid_ns = in_host_pid_namespace()
        self._window_start = time.perf_counter()
        self._tick_safely()
        self._thread = threading.Thread(target=self._run, name="gpu-telemetry", daemon=True)
        self._thread.start()
        return self

    def _open(self) -> str | None:
        """None when sampling can start, else why not."""
        nvml = self._nvml
        if nvml is None:
            try:
                nvml = self._nvml = load_nvml()
            except ImportError as e:
                return f"nvidia-ml-py is not installed ({e})"
        if self.gpu_env is not None and not self.gpu_env.strip():
            return "CUDA_VISIBLE_DEVICES is empty: the trial has no GPU"
        self._errors = error_types(nvml)
        try:
            nvml.nvmlInit()
        except self._errors + (OSError,) as e:
            return f"NVML could not start: {error_name(e)} ({e})"
        except Exception as e:  # noqa: BLE001 - telemetry must never fail a trial
            log.exception("GPU telemetry: unexpected error starting NVML")
            return f"NVML could not start: {e!r}"
        self._initialised = True
        why: str | None
        try:
            if int(nvml.nvmlDeviceGetCount()) == 0:
                why = "NVML sees no GPU"
            else:
                self.gpus = gpu_handles(self.gpu_env, nvml)
                why = None if self.gpus else \
                    f"no GPU of CUDA_VISIBLE_DEVICES={self.gpu_env!r} is known to NVML"
        except self._errors as e:
            why = f"NVML could not list the GPUs: {error_name(e)} ({e})"
        except Exception as e:  # noqa: BLE001 - telemetry must never fail a trial
            log.exception("GPU telemetry: unexpected error listing the GPUs")
            why = f"NVML could not list the GPUs: {e!r}"
        if why is not None:
            self._shutdown()
        return why

    def _clock_events_function(self) -> Callable[[Any], int]:
        """nvmlDeviceGetCurrentClocksEventReasons (R535+), else its older name."""
        nvml = self._nvml
        fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if fn is not None:
            ref = self.gpus[0]
            try:
                fn(ref.parent if ref.parent is not None else ref.handle)
            except self._errors as e:
                if error_name(e) == "FunctionNotFound":     # new bindings, old driver
                    fn = None
        return fn or nvml.nvmlDeviceGetCurrentClocksThrottleReasons

    def _shutdown(self) -> None:
        if self._initialised:
            self._initialised = False
            try:
                self._nvml.nvmlShutdown()
            except Exception as e:  # noqa: BLE001 - nothing to do about it but say so
                log.debug("GPU telemetry: nvmlShutdown failed: %r", e)

    def stop(self) -> LevelTelemetry:
        """Stop the thread (promptly: it waits on an event) and close NVML. Returns the verdict
        on the samples since the last cut. Safe to call twice or without start()."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(timeout=max(2.0, 4 * self.interval_s))
            if thread.is_alive():
                # An NVML call hangs (a GPU falling off the bus): leave the daemon thread and
                # NVML as they are rather than hang the trial.
                log.warning("GPU telemetry: the sampler thread did not stop within %.1f s",
                            max(2.0, 4 * self.interval_s))
                self._initialised = False
        level = self.cut()
        self._shutdown()
        return level

    # -- windows

    def cut(self) -> LevelTelemetry:
        """The verdict on the samples since the last cut; the next window starts now."""
        if not self.available:
            return LevelTelemetry.unavailable(self.why)
        with self._lock:
            samples, self._window = self._window, []
            self._window_start = time.perf_counter()
        try:
            return summarize(samples, [g.uuid for g in self.gpus], self.rules)
        except Exception as e:  # noqa: BLE001 - a bug here must not cost a measured level
            log.exception("GPU telemetry: could not summarize a level")
            return LevelTelemetry(available=True, gpus=tuple(g.uuid for g in self.gpus),
                                  samples=tuple(samples), caveats=(f"telemetry error: {e!r}",))

    # -- the thread

    def _run(self) -> None:
        next_at = time.perf_counter() + self.interval_s
        while not self._stop.wait(max(0.0, next_at - time.perf_counter())):
            self._tick_safely()
            next_at += self.interval_s
            now = time.perf_counter()
            if next_at < now:            # fell behind (slow NVML): skip, do not burst
                next_at = now + self.interval_s

    def _tick_safely(self) -> None:
        try:
            self._tick()
        except Exception as e:  # noqa: BLE001 - no exception may leave the sampler thread
            log_once(logging.WARNING, f"tick:{type(e).__name__}",
                      "GPU telemetry: a sample failed (%r); sampling goes on", e)

    def _tick(self) -> None:
        now = time.perf_counter()
        wall = time.time()
        dt = self.interval_s if self._last_tick is None else min(now - self._last_tick,
                                                                 3 * self.interval_s)
        self._last_tick = now
        procs = self._foreign_processes()
        readings = [self._sample(ref, dt, wall, procs.get(ref.cuda_index, ()))
                    for ref in self.gpus]
        with self._lock:
            # Relative to the window the samples land in: a cut during this tick starts at 0.
            t_s = round(max(0.0, now - self._window_start), 4)
            self._window.extend(GpuSample(t_s=t_s, **r) for r in readings)

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args), or None on an NVML error (logged once per query and error)."""
        try:
            return fn(*args)
        except self._errors as e:
            if error_name(e) not in ("NotSupported", "NoPermission"):
                log_once(logging.WARNING, f"call:{what}:{error_name(e)}",
                          "GPU telemetry: %s failed: %s; recorded as empty", what, e)
            return None

    def _sample(self, ref: GpuRef, dt: float, wall: float,
                foreign: tuple[GpuProcess, ...]) -> dict[str, Any]:
        """One GPU's reading: GpuSample's fields but t_s."""
        nvml = self._nvml
        whole = ref.parent if ref.parent is not None else ref.handle   # clocks live on the GPU
        mem = self._call("memory", nvml.nvmlDeviceGetMemoryInfo, ref.handle)
        util = self._call("utilization", nvml.nvmlDeviceGetUtilizationRates, ref.handle)
        assert self._events_fn is not None       # set by start() before the first sample
        mask = self._call("clock events", self._events_fn, whole)
        power = self._call("power", nvml.nvmlDeviceGetPowerUsage, whole)
        sm = self._call("SM clock", nvml.nvmlDeviceGetClockInfo, whole,
                        getattr(nvml, "NVML_CLOCK_SM", _NVML_CLOCK_SM))
        memclock = self._call("memory clock", nvml.nvmlDeviceGetClockInfo, whole,
                              getattr(nvml, "NVML_CLOCK_MEM", _NVML_CLOCK_MEM))
        temperature = self._call("temperature", nvml.nvmlDeviceGetTemperature, whole,
                                 getattr(nvml, "NVML_TEMPERATURE_GPU", _NVML_TEMPERATURE_GPU))
        return {
            "gpu": ref.cuda_index, "uuid": ref.uuid, "dt_s": round(dt, 4), "wall": wall,
            "mem_used_mib": None if mem is None else mem.used / MIB,
            "mem_total_mib": None if mem is None else mem.total / MIB,
            "util_gpu": None if util is None else int(util.gpu),
            "util_mem": None if util is None else int(util.memory),
            "sm_clock_mhz": None if sm is None else int(sm),
            "mem_clock_mhz": None if memclock is None else int(memclock),
            "clock_events_mask": None if mask is None else int(mask),
            "clock_events": () if mask is None else decode_clock_events(int(mask)),
            "temperature_c": None if temperature is None else int(temperature),
            "power_w": None if power is None else power / 1000.0,
            "foreign": foreign,
        }

    def _foreign_processes(self) -> dict[int, tuple[GpuProcess, ...]]:
        nvml = self._nvml
        listed: dict[int, list[Any]] = {}
        for ref in self.gpus:
            procs = self._call("compute processes", nvml.nvmlDeviceGetComputeRunningProcesses,
                               ref.handle)
            listed[ref.cuda_index] = list(procs or ())
        pids = {int(p.pid) for procs in listed.values() for p in procs}
        own = self._own | {os.getpid()}
        if pids - own and self._own_pids is not None:
            try:
                self._own = set(self._own_pids())
            except Exception as e:  # noqa: BLE001 - a callback bug must not stop sampling
                log_once(logging.WARNING, "own_pids", "GPU telemetry: own_pids() failed: %r", e)
            own = self._own | {os.getpid()}
        if pids & own:
            self._same_pid_ns = True       # the driver reports pids as this namespace sees them
        return foreign_processes(listed, own, same_pid_ns=self._same_pid_ns, nvml=nvml)
