"""CUDA_VISIBLE_DEVICES -> NVML handles: exactly the GPUs a trial's server runs on.

A trial's server runs on the GPUs that `CUDA_VISIBLE_DEVICES` names; NVML ignores that variable
and always sees every GPU of the machine (or of the container). `gpu_handles` maps the variable
to NVML handles by UUID, following CUDA's own rules as far as NVML can:

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
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .nvml import error_types, load_nvml, log_once, text


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
class _Physical:
    """A physical GPU as NVML lists it."""

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
    errors = error_types(nvml) or (Exception,)
    out = []
    for i in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        uuid = text(nvml.nvmlDeviceGetUUID(handle))
        try:
            bus = text(nvml.nvmlDeviceGetPciInfo(handle).busId)
        except errors:
            bus = ""
        try:
            name = text(nvml.nvmlDeviceGetName(handle))
        except errors:
            name = "?"
        out.append(_Physical(i, handle, uuid, bus, name))
    return sorted(out, key=lambda g: _bus_key(g.pci_bus_id, g.nvml_index))


def machine_gpu_uuids() -> list[str]:
    """Every GPU of this machine (or container) by UUID, as NVML sees them, in PCI bus order:
    what says which machine measured a figure. [] without nvidia-ml-py, a driver or a GPU."""
    try:
        nvml = load_nvml()
    except ImportError:
        return []
    errors = error_types(nvml) + (OSError,)
    try:
        nvml.nvmlInit()
    except errors:
        return []
    try:
        return [g.uuid for g in _physical_gpus(nvml)]
    except errors:
        return []
    finally:
        try:
            nvml.nvmlShutdown()
        except errors as e:
            log_once(logging.DEBUG, "shutdown", "NVML: nvmlShutdown failed: %r", e)


def _mig_devices(nvml: Any, gpu: _Physical) -> list[tuple[Any, str]]:
    """(handle, uuid) of the MIG devices of a GPU in MIG mode; [] otherwise."""
    errors = error_types(nvml) or (Exception,)
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
            out.append((handle, text(nvml.nvmlDeviceGetUUID(handle))))
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
        errors = error_types(nvml) or (Exception,)
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
    entries: list[tuple[str, int | None]]   # (entry, its index when every GPU is meant)
    if cuda_visible_devices is None:
        entries = [("", i) for i in range(len(gpus))]
    else:
        entries = [(e.strip(), None) for e in cuda_visible_devices.split(",")] \
            if cuda_visible_devices.strip() else []
    order = device_order if device_order is not None else os.environ.get("CUDA_DEVICE_ORDER")
    if (order or "FASTEST_FIRST") != "PCI_BUS_ID" and len({g.name for g in gpus}) > 1 \
            and any(e.isascii() and e.isdigit() for e, _ in entries if e):
        log_once(logging.WARNING, f"order:{sorted({g.name for g in gpus})}",
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
            log_once(logging.WARNING, f"entry:{cuda_visible_devices}",
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
