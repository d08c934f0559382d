"""GPU telemetry of one trial: NVML samples of exactly the trial's GPUs, and a verdict per level.

A trial's server runs on the GPUs that `CUDA_VISIBLE_DEVICES` names; NVML ignores that variable
and always sees every GPU of the machine (or of the container). `gpu_handles` maps the variable
to NVML handles by UUID, and `TelemetrySampler` samples those handles in a background thread:

    sampler = TelemetrySampler(env.get("CUDA_VISIBLE_DEVICES"), own_pids=lambda: server_pids(pid))
    with sampler:                      # start() ... stop()
        ...one level...
        level = sampler.cut()          # LevelTelemetry of the samples since the last cut
        summary = merge_level(summary, level)

Per sample and GPU: memory used/total, GPU and memory utilisation, SM and memory clocks, the
clock-event ("throttle") reasons, temperature, power, and the compute processes on the GPU that
are not the trial's own. A level is *suspect* (kept out of the report's verdicts) when, during
it, a GPU throttled for a reason other than idle power saving, a foreign process used one of the
trial's GPUs, or the SM clock fell more than `SuspectRules.clock_drop_frac` below the level's
median after warm-up. `summarize` is the pure function that applies these rules.

How `CUDA_VISIBLE_DEVICES` entries are mapped (CUDA's own rules, as far as NVML can follow them):

- unset: every GPU; empty: none (that is what CUDA does, and what Ray sets for a GPU-less actor).
- an integer: the position in CUDA's enumeration. With `CUDA_DEVICE_ORDER=PCI_BUS_ID` that is
  the PCI bus order, which is what we use. CUDA's default, FASTEST_FIRST, orders by a speed
  heuristic that NVML cannot reproduce; it agrees with PCI bus order when every GPU is the same
  model (ties are broken by bus id), so we use PCI bus order then too, and log once when the
  models differ: set `CUDA_DEVICE_ORDER=PCI_BUS_ID` or use UUIDs on such machines.
  An index of a GPU in MIG mode maps to the physical GPU.
- `GPU-<uuid>` or a unique prefix of it; `MIG-<uuid>` or a unique prefix (R470+ drivers);
  the older `MIG-GPU-<uuid>/<gpu instance>/<compute instance>`.
- CUDA stops at the first entry that names no device ("0,7,1" on a 2-GPU machine is "0"); so do
  we, and we log the bad entry once. A device named twice is sampled once.

Foreign processes. NVML reports process ids; the trial's own are `own_pids()` (the server's
session, see `server_pids`) and this process. In a container with its own PID namespace, older
drivers report host pids, which match nothing here: a pid that is not in this PID namespace is
then "unattributed" (a caveat in the note, not a flag), unless the namespace is the host's or one
of the trial's own pids was seen in NVML's list (the driver translates pids), in which case it is
a foreign process of another container.

Never a crash: without nvidia-ml-py, without a driver or without GPUs the sampler records nothing
and logs "no GPU telemetry: <why>" once per process and reason; an NVML error during sampling
leaves that field empty (None) and is logged once; no exception leaves the sampler thread.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from .records import LevelSummary

log = logging.getLogger(__name__)

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

_MIB = 1024 * 1024
_NVML_CLOCK_SM = 1
_NVML_CLOCK_MEM = 2
_NVML_TEMPERATURE_GPU = 0
_PID_NS_INIT_INO = 0xEFFFFFFC   # PROC_PID_INIT_INO: the inode of the host's PID namespace


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


# ---------------------------------------------------------------------------------------------
# Values


@dataclass(frozen=True, slots=True)
class GpuRef:
    """One GPU of the trial, as CUDA numbers it and as NVML reaches it."""

    cuda_index: int          # position in the trial's CUDA device list (what the server calls it)
    entry: str               # the CUDA_VISIBLE_DEVICES entry that named it ("" when unset)
    uuid: str                # GPU-... or MIG-...
    nvml_index: int          # NVML index of the physical GPU
    pci_bus_id: str
    name: str
    handle: Any = field(repr=False, compare=False)          # the device (or MIG device) handle
    parent: Any = field(default=None, repr=False, compare=False)  # physical GPU of a MIG device


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A compute process on one of the trial's GPUs that is not the trial's own."""

    pid: int
    name: str
    used_mib: float | None   # None where NVML cannot tell (e.g. without permission)
    gpu: int                 # cuda index of the GPU it was seen on
    attributed: bool = True  # False: its pid is not in this PID namespace (see module doc)


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


@dataclass(frozen=True, slots=True)
class SuspectRules:
    """When a level's telemetry makes it suspect.

    Power capping (SwPowerCap) flags by default. Seen on an H200 pair (driver 580.159): a
    sustained bf16 8192^3 matrix product held SwPowerCap at about 690 W of the 700 W limit, with
    the SM clock at 1320-1575 MHz instead of 1980. A compute-bound level can thus be flagged by
    its own load; `SuspectRules(ignore_reasons=SETTING_REASONS | {"SwPowerCap"})` stops that.
    """

    warmup_s: float = 0.0          # the clock-drop rule ignores this start of each window
    clock_drop_frac: float = 0.10  # SM clock below (1 - this) * the window's median ...
    min_drop_s: float = 1.0        # ... for at least this long (one stray sample is not a drop)
    min_throttle_s: float = 0.0    # a throttle reason counts when active longer than this
    ignore_reasons: frozenset[str] = SETTING_REASONS  # recorded but never flag (IDLE_REASON too)

    def __post_init__(self) -> None:
        if not 0.0 < self.clock_drop_frac < 1.0:
            raise ValueError(f"clock_drop_frac must be in (0, 1), got {self.clock_drop_frac=}")
        for name in ("warmup_s", "min_drop_s", "min_throttle_s"):
            value = getattr(self, name)
            if not value >= 0.0:
                raise ValueError(f"{name} must be >= 0, got {name}={value!r}")


@dataclass(frozen=True, slots=True)
class LevelTelemetry:
    """What the GPUs did during one level, and whether that makes the level suspect."""

    available: bool                          # False: no telemetry (see `why`)
    gpus: tuple[str, ...] = ()               # UUIDs sampled, in cuda order
    samples: tuple[GpuSample, ...] = ()
    duration_s: float = 0.0
    sm_clock_min_mhz: int | None = None      # over busy samples (not GpuIdle), all GPUs
    sm_clock_median_mhz: float | None = None
    throttle_s: Mapping[str, float] = field(default_factory=dict)  # reason -> s (not GpuIdle)
    foreign: tuple[GpuProcess, ...] = ()     # distinct (gpu, pid), largest memory seen
    suspect: bool = False
    reasons: tuple[str, ...] = ()            # why suspect
    caveats: tuple[str, ...] = ()            # worth saying, but not a flag
    why: str = ""                            # why not available

    @property
    def note(self) -> str:
        """The text that goes into LevelSummary.note."""
        return "; ".join(self.reasons + self.caveats)

    @classmethod
    def unavailable(cls, why: str) -> LevelTelemetry:
        return cls(available=False, why=why)


def merge_level(summary: LevelSummary, level: LevelTelemetry) -> LevelSummary:
    """The level summary with the telemetry's verdict: suspect if either is, notes joined."""
    note = "; ".join(part for part in (summary.note, level.note) if part)
    return dataclasses.replace(summary, suspect=summary.suspect or level.suspect, note=note)


# ---------------------------------------------------------------------------------------------
# Logging once

_logged: set[str] = set()
_logged_lock = threading.Lock()


def _log_once(level: int, key: str, msg: str, *args: Any) -> None:
    with _logged_lock:
        if key in _logged:
            return
        _logged.add(key)
    log.log(level, msg, *args)


def _s(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _nvml_error_types(nvml: Any) -> tuple[type[BaseException], ...]:
    base = getattr(nvml, "NVMLError", None)
    return (base,) if isinstance(base, type) and issubclass(base, BaseException) else ()


def _error_name(exc: BaseException) -> str:
    return type(exc).__name__.removeprefix("NVMLError_")


# ---------------------------------------------------------------------------------------------
# CUDA_VISIBLE_DEVICES -> NVML handles


@dataclass(frozen=True, slots=True)
class _Physical:
    nvml_index: int
    handle: Any
    uuid: str
    pci_bus_id: str
    name: str


def _bus_key(bus_id: str, fallback: int) -> tuple[int, ...]:
    # "00000000:3B:00.0" or the legacy "0000:3b:00.0": compare as numbers, not strings.
    try:
        domain, bus, rest = bus_id.split(":")
        device, function = rest.split(".")
        return (int(domain, 16), int(bus, 16), int(device, 16), int(function, 16))
    except ValueError:
        return (1 << 32, fallback)


def _physical_gpus(nvml: Any) -> list[_Physical]:
    """Every GPU NVML sees, in PCI bus order."""
    errors = _nvml_error_types(nvml) or (Exception,)
    out = []
    for i in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        uuid = _s(nvml.nvmlDeviceGetUUID(handle))
        try:
            bus = _s(nvml.nvmlDeviceGetPciInfo(handle).busId)
        except errors:
            bus = ""
        try:
            name = _s(nvml.nvmlDeviceGetName(handle))
        except errors:
            name = "?"
        out.append(_Physical(i, handle, uuid, bus, name))
    return sorted(out, key=lambda g: _bus_key(g.pci_bus_id, g.nvml_index))


def _mig_devices(nvml: Any, gpu: _Physical) -> list[tuple[Any, str]]:
    """(handle, uuid) of the MIG devices of a GPU in MIG mode; [] otherwise."""
    errors = _nvml_error_types(nvml) or (Exception,)
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(gpu.handle)
        if not current:
            return []
        count = int(nvml.nvmlDeviceGetMaxMigDeviceCount(gpu.handle))
    except (errors + (AttributeError,)):
        return []
    out = []
    for j in range(count):
        try:
            handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, j)
            out.append((handle, _s(nvml.nvmlDeviceGetUUID(handle))))
        except errors:
            continue                      # an empty slot: NotFound
    return out


def _unique(entry: str, candidates: Iterable[tuple[str, Any]]) -> Any | None:
    """The one candidate whose uuid starts with `entry` (case-insensitive), else None."""
    hits = [c for uuid, c in candidates if uuid.lower().startswith(entry.lower())]
    return hits[0] if len(hits) == 1 else None


def _resolve_entry(nvml: Any, entry: str, gpus: Sequence[_Physical]
                   ) -> tuple[_Physical, Any, str] | None:
    """(physical GPU, handle to sample, uuid) for one entry, or None if it names nothing."""
    if entry.startswith("MIG-GPU-"):
        # Legacy form: MIG-GPU-<gpu uuid>/<gpu instance id>/<compute instance id>.
        parts = entry[len("MIG-"):].split("/")
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
            return None
        gpu = _unique(parts[0], ((g.uuid, g) for g in gpus))
        if gpu is None or gpu.uuid.lower() != parts[0].lower():
            return None
        errors = _nvml_error_types(nvml) or (Exception,)
        for handle, uuid in _mig_devices(nvml, gpu):
            try:
                gi = int(nvml.nvmlDeviceGetGpuInstanceId(handle))
                ci = int(nvml.nvmlDeviceGetComputeInstanceId(handle))
            except errors:
                continue
            if (gi, ci) == (int(parts[1]), int(parts[2])):
                return gpu, handle, uuid
        return None
    if entry.startswith("MIG-"):
        migs = [(uuid, (gpu, handle, uuid)) for gpu in gpus
                for handle, uuid in _mig_devices(nvml, gpu)]
        return _unique(entry, migs)
    if entry.startswith("GPU-"):
        gpu = _unique(entry, ((g.uuid, g) for g in gpus))
        return None if gpu is None else (gpu, gpu.handle, gpu.uuid)
    if entry.isascii() and entry.isdigit():
        index = int(entry)
        if index < len(gpus):
            gpu = gpus[index]
            return gpu, gpu.handle, gpu.uuid
    return None


def gpu_handles(cuda_visible_devices: str | None, nvml: Any, *,
                device_order: str | None = None) -> list[GpuRef]:
    """The GPUs a process with this CUDA_VISIBLE_DEVICES sees, as NVML handles (see the module
    doc for the rules). `nvml` is an initialised pynvml module (or a fake with its names);
    `device_order` defaults to the CUDA_DEVICE_ORDER environment variable. NVML errors from
    enumerating the GPUs propagate (the sampler turns them into "no telemetry")."""
    gpus = _physical_gpus(nvml)
    if cuda_visible_devices is None:
        entries = [("", i) for i in range(len(gpus))]
    else:
        entries = [(e.strip(), None) for e in cuda_visible_devices.split(",")] \
            if cuda_visible_devices.strip() else []
    order = device_order if device_order is not None else os.environ.get("CUDA_DEVICE_ORDER")
    if (order or "FASTEST_FIRST") != "PCI_BUS_ID" and len({g.name for g in gpus}) > 1 \
            and any(e.isascii() and e.isdigit() for e, _ in entries if e):
        _log_once(logging.WARNING, f"order:{sorted({g.name for g in gpus})}",
                  "GPU telemetry: GPUs of different models and CUDA_DEVICE_ORDER=%s: "
                  "CUDA_VISIBLE_DEVICES indices are mapped in PCI bus order, which may not be "
                  "CUDA's; set CUDA_DEVICE_ORDER=PCI_BUS_ID or give UUIDs",
                  order or "FASTEST_FIRST (default)")
    refs: list[GpuRef] = []
    seen: set[str] = set()
    for entry, index in entries:
        found = (gpus[index], gpus[index].handle, gpus[index].uuid) if index is not None \
            else _resolve_entry(nvml, entry, gpus)
        if found is None:
            _log_once(logging.WARNING, f"entry:{cuda_visible_devices}",
                      "CUDA_VISIBLE_DEVICES=%r: entry %r names no GPU of the %d that NVML sees; "
                      "like CUDA, using only the entries before it", cuda_visible_devices,
                      entry, len(gpus))
            break
        gpu, handle, uuid = found
        if uuid in seen:
            continue
        seen.add(uuid)
        refs.append(GpuRef(cuda_index=len(refs), entry=entry, uuid=uuid,
                           nvml_index=gpu.nvml_index, pci_bus_id=gpu.pci_bus_id, name=gpu.name,
                           handle=handle, parent=None if handle is gpu.handle else gpu.handle))
    return refs


# ---------------------------------------------------------------------------------------------
# Process ids


def _proc_stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    return text.rsplit(")", 1)[-1].split()   # after "pid (comm)": state ppid pgrp session ...


def server_pids(root_pid: int) -> set[int]:
    """The pids of a server started in its own session (`start_new_session=True`): every
    process whose session or process group is `root_pid`, and their descendants. Empty where
    /proc cannot be read."""
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return set()
    parent: dict[int, int] = {}
    out = {root_pid}
    for pid in pids:
        fields = _proc_stat_fields(pid)
        if fields is None or len(fields) < 4:
            continue
        ppid, pgrp, session = int(fields[1]), int(fields[2]), int(fields[3])
        parent[pid] = ppid
        if root_pid in (pgrp, session):
            out.add(pid)
    changed = True
    while changed:                     # descendants that left the session (setsid)
        changed = False
        for pid, ppid in parent.items():
            if ppid in out and pid not in out:
                out.add(pid)
                changed = True
    return out


def _pid_visible(pid: int) -> bool:
    return pid > 0 and os.path.exists(f"/proc/{pid}")


def _host_pid_namespace() -> bool:
    """True when this process lives in the host's PID namespace (NVML's pids are ours)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino == _PID_NS_INIT_INO
    except OSError:
        return False


def _process_name(pid: int, nvml: Any, *, local: bool) -> str:
    """The process's name: from /proc where the pid is ours, else as NVML tells it."""
    if local:
        try:
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
            if name:
                return name
        except OSError:
            pass
    try:
        return os.path.basename(_s(nvml.nvmlSystemGetProcessName(pid))) or "?"
    except Exception:  # noqa: BLE001 - a name is only decoration; NVML (or a fake) may refuse
        return "?"


# ---------------------------------------------------------------------------------------------
# The verdict


def _window_s(samples: Sequence[GpuSample]) -> float:
    ticks: dict[float, float] = {}
    for s in samples:
        ticks[s.wall] = max(ticks.get(s.wall, 0.0), s.dt_s)
    return sum(ticks.values())


def summarize(samples: Sequence[GpuSample], gpus: Sequence[str],
              rules: SuspectRules = SuspectRules()) -> LevelTelemetry:
    """The verdict on one window of samples (every GPU's samples of one level).

    Throttle seconds per reason count the time during which any of the trial's GPUs had that
    reason (samples taken together count once). Clock min/median are over busy samples (not
    GpuIdle) of all GPUs; the clock drop is judged per GPU against that GPU's own median."""
    if not samples:
        return LevelTelemetry(available=True, gpus=tuple(gpus),
                              caveats=("no GPU samples during the level",))
    reasons: list[str] = []
    caveats: list[str] = []

    # Throttling: union over GPUs per tick (samples of one tick share `wall`).
    per_tick: dict[float, tuple[float, set[str]]] = {}
    for s in samples:
        dt, names = per_tick.get(s.wall, (0.0, set()))
        per_tick[s.wall] = (max(dt, s.dt_s), names | set(s.clock_events))
    throttle: dict[str, float] = {}
    for dt, names in per_tick.values():
        for name in names - {IDLE_REASON}:
            throttle[name] = throttle.get(name, 0.0) + dt
    throttle = {k: round(v, 3) for k, v in sorted(throttle.items())}
    bad = {k: v for k, v in throttle.items()
           if k not in rules.ignore_reasons and k != IDLE_REASON and v > rules.min_throttle_s}
    if bad:
        reasons.append("GPU clock throttling: " + ", ".join(f"{k} {v:.1f} s"
                                                            for k, v in bad.items()))

    # Clocks: busy samples after warm-up only; an idle GPU lowers its clocks on purpose.
    busy = [s for s in samples if s.sm_clock_mhz is not None and IDLE_REASON not in s.clock_events]
    clocks = [s.sm_clock_mhz for s in busy if s.t_s >= rules.warmup_s] \
        or [s.sm_clock_mhz for s in busy]
    clock_min = min(clocks) if clocks else None
    clock_median = float(statistics.median(clocks)) if clocks else None
    for gpu in sorted({s.gpu for s in busy}):
        mine = [s for s in busy if s.gpu == gpu and s.t_s >= rules.warmup_s]
        if len(mine) < 3:
            continue
        median = statistics.median(s.sm_clock_mhz for s in mine)
        low = [s for s in mine if s.sm_clock_mhz < (1.0 - rules.clock_drop_frac) * median]
        low_s = sum(s.dt_s for s in low)
        if low and low_s >= rules.min_drop_s:
            lowest = min(s.sm_clock_mhz for s in low)
            reasons.append(f"GPU {gpu}: SM clock fell to {lowest} MHz "
                           f"({100.0 * (1.0 - lowest / median):.0f}% below the level's median "
                           f"{median:.0f} MHz) for {low_s:.1f} s")

    # Foreign processes: one entry per (gpu, pid), with the most memory seen.
    seen: dict[tuple[int, int, bool], GpuProcess] = {}
    for s in samples:
        for p in s.foreign:
            key = (p.gpu, p.pid, p.attributed)
            old = seen.get(key)
            if old is None or (p.used_mib or 0.0) > (old.used_mib or 0.0):
                seen[key] = p
    foreign = tuple(sorted(seen.values(), key=lambda p: (p.gpu, p.pid)))
    attributed = [p for p in foreign if p.attributed]
    if attributed:
        reasons.append("foreign GPU process" + ("es" if len(attributed) > 1 else "") + ": "
                       + ", ".join(_describe(p) for p in attributed[:4])
                       + (f" and {len(attributed) - 4} more" if len(attributed) > 4 else ""))
    unattributed = [p for p in foreign if not p.attributed]
    if unattributed:
        caveats.append(f"{len(unattributed)} GPU process(es) from another PID namespace could "
                       f"not be attributed (container without the host's pids?): "
                       + ", ".join(_describe(p) for p in unattributed[:4]))

    return LevelTelemetry(
        available=True, gpus=tuple(gpus), samples=tuple(samples),
        duration_s=round(_window_s(samples), 3), sm_clock_min_mhz=clock_min,
        sm_clock_median_mhz=clock_median, throttle_s=throttle, foreign=foreign,
        suspect=bool(reasons), reasons=tuple(reasons), caveats=tuple(caveats))


def _describe(p: GpuProcess) -> str:
    mem = f", {p.used_mib:.0f} MiB" if p.used_mib is not None else ""
    return f"pid {p.pid} {p.name} on GPU {p.gpu}{mem}"


# ---------------------------------------------------------------------------------------------
# The sampler


def _load_nvml() -> Any:
    import pynvml  # optional: a machine without GPUs need not have it

    return pynvml


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
                 rules: SuspectRules = SuspectRules()) -> None:
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
            _log_once(logging.INFO, f"none:{why}", "no GPU telemetry: %s", why)
            return self
        self.available, self.why = True, ""
        self._events_fn = self._clock_events_function()
        self._same_pid_ns = _host_pid_namespace()
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
                nvml = self._nvml = _load_nvml()
            except ImportError as e:
                return f"nvidia-ml-py is not installed ({e})"
        if self.gpu_env is not None and not self.gpu_env.strip():
            return "CUDA_VISIBLE_DEVICES is empty: the trial has no GPU"
        self._errors = _nvml_error_types(nvml)
        try:
            nvml.nvmlInit()
        except self._errors + (OSError,) as e:
            return f"NVML could not start: {_error_name(e)} ({e})"
        except Exception as e:   # telemetry must never fail a trial
            log.exception("GPU telemetry: unexpected error starting NVML")
            return f"NVML could not start: {e!r}"
        self._initialised = True
        try:
            if int(nvml.nvmlDeviceGetCount()) == 0:
                why = "NVML sees no GPU"
            else:
                self.gpus = gpu_handles(self.gpu_env, nvml)
                why = None if self.gpus else \
                    f"no GPU of CUDA_VISIBLE_DEVICES={self.gpu_env!r} is known to NVML"
        except self._errors as e:
            why = f"NVML could not list the GPUs: {_error_name(e)} ({e})"
        except Exception as e:
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
                if _error_name(e) == "FunctionNotFound":     # new bindings, old driver
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
        except Exception as e:   # a bug here must not cost a measured level
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
            _log_once(logging.WARNING, f"tick:{type(e).__name__}",
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
            if _error_name(e) not in ("NotSupported", "NoPermission"):
                _log_once(logging.WARNING, f"call:{what}:{_error_name(e)}",
                          "GPU telemetry: %s failed: %s; recorded as empty", what, e)
            return None

    def _sample(self, ref: GpuRef, dt: float, wall: float,
                foreign: tuple[GpuProcess, ...]) -> dict[str, Any]:
        """One GPU's reading: GpuSample's fields but t_s."""
        nvml = self._nvml
        whole = ref.parent if ref.parent is not None else ref.handle   # clocks live on the GPU
        mem = self._call("memory", nvml.nvmlDeviceGetMemoryInfo, ref.handle)
        util = self._call("utilization", nvml.nvmlDeviceGetUtilizationRates, ref.handle)
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
            "mem_used_mib": None if mem is None else mem.used / _MIB,
            "mem_total_mib": None if mem is None else mem.total / _MIB,
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
                _log_once(logging.WARNING, "own_pids", "GPU telemetry: own_pids() failed: %r", e)
            own = self._own | {os.getpid()}
        if pids & own:
            self._same_pid_ns = True       # the driver reports pids as this namespace sees them
        out: dict[int, tuple[GpuProcess, ...]] = {}
        for gpu, procs in listed.items():
            found = []
            for p in procs:
                pid = int(p.pid)
                if pid in own:
                    continue
                used = getattr(p, "usedGpuMemory", None)
                # Without evidence that NVML's pids are this namespace's, a pid that exists
                # here may be a different process (a host pid that collides with ours).
                attributed = self._same_pid_ns
                found.append(GpuProcess(
                    pid=pid, name=_process_name(pid, nvml, local=attributed and
                                                _pid_visible(pid)),
                    used_mib=None if used is None else used / _MIB, gpu=gpu,
                    attributed=attributed))
            out[gpu] = tuple(found)
        return out
