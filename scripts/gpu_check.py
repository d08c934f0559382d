#!/usr/bin/env python3
"""Check GPU telemetry and pinning on a real NVIDIA machine (no Ray, no network needed).

    python3 scripts/gpu_check.py                          # the trial = CUDA_VISIBLE_DEVICES
    CUDA_VISIBLE_DEVICES=1 python3 scripts/gpu_check.py   # a trial pinned to GPU 1
    python3 scripts/gpu_check.py --json out.json --run-dir /tmp/run

What it checks, each printed as PASS / FAIL / SKIP:

1. nvml      NVML starts and sees GPUs (else: SKIP everything, exit 77).
2. mapping   for several CUDA_VISIBLE_DEVICES forms (the trial's, unset, single indices, reversed
             indices, full UUIDs, UUID prefixes, a bad entry) and both CUDA_DEVICE_ORDER values,
             `telemetry.gpu_handles` gives the same GPUs, in the same order, as CUDA itself does
             in a child process (cuDeviceGetUuid through libcuda: no framework needed).
3. sampling  the sampler reads exactly the trial's GPUs, and says which fields NVML left empty.
4. foreign   a child process that allocates GPU memory (torch, else cupy, else plain libcuda)
             on one of the trial's GPUs is flagged as foreign, with its pid; the child also runs
             matrix products where it can, so the clocks and clock events under load are shown.
5. own       the same child, declared as the trial's own, is not flagged.
6. outside   a child on a GPU that is not the trial's is not seen (when there is such a GPU).

Exit status: 0 when nothing failed, 1 when a check failed, 77 when no GPU could be reached.
Run from the repository root (the package need not be installed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from specdecode_tune import procfs, telemetry  # noqa: E402 (after sys.path: runs from a checkout)

# Prints, as JSON, the UUIDs of the devices CUDA shows this process, in CUDA's order.
CUDA_UUIDS = r"""
import ctypes, json
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as e:
    print(json.dumps({"error": f"libcuda: {e}"})); raise SystemExit
rc = cuda.cuInit(0)
if rc == 100:                                   # CUDA_ERROR_NO_DEVICE
    print(json.dumps({"uuids": []})); raise SystemExit
if rc != 0:
    print(json.dumps({"error": f"cuInit returned {rc}"})); raise SystemExit
n = ctypes.c_int()
cuda.cuDeviceGetCount(ctypes.byref(n))
get_uuid = getattr(cuda, "cuDeviceGetUuid_v2", None) or cuda.cuDeviceGetUuid
out = []
for i in range(n.value):
    dev = ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(dev), i)
    buf = (ctypes.c_ubyte * 16)()
    get_uuid(buf, dev)
    h = bytes(buf).hex()
    out.append(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
print(json.dumps({"uuids": out}))
"""

# A foreign GPU process: allocates MIB MiB on its (only) visible GPU, then runs matrix products
# (LOAD=1) or sleeps until SECONDS have passed. Prints "ready <how> <pid>" once it holds memory.
FOREIGN = r"""
import ctypes, os, sys, time
mib, seconds, load = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"
how, step = None, None
try:
    import torch
    if torch.cuda.is_available():
        keep = torch.empty(mib << 20, dtype=torch.uint8, device="cuda")
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        def step():
            a @ a
            torch.cuda.synchronize()
        how = "torch"
except ImportError:
    pass
if how is None:
    try:
        import cupy
        keep = cupy.empty(mib << 20, dtype=cupy.uint8)
        a = cupy.random.rand(4096, 4096, dtype=cupy.float32)
        def step():
            a @ a
            cupy.cuda.runtime.deviceSynchronize()
        how = "cupy"
    except ImportError:
        pass
if how is None:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
        ok = (cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
              and cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
              and cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib << 20)) == 0)
        how = "libcuda" if ok else None
    except OSError:
        pass
if how is None:
    print("none", flush=True)
    raise SystemExit(3)
print(f"ready {how} {os.getpid()}", flush=True)
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    if load and step is not None:
        step()
    else:
        time.sleep(0.05)
"""


@dataclasses.dataclass
class Check:
    name: str
    ok: bool | None              # None: skipped
    detail: str

    def line(self) -> str:
        word = {True: "PASS", False: "FAIL", None: "SKIP"}[self.ok]
        return f"{word:4}  {self.name:9} {self.detail}"


def child_env(cvd: str | None, order: str | None) -> dict[str, str]:
    env = dict(os.environ)
    for name, value in (("CUDA_VISIBLE_DEVICES", cvd), ("CUDA_DEVICE_ORDER", order)):
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def cuda_uuids(cvd: str | None, order: str | None) -> list[str] | str:
    """What CUDA shows a process with this environment, or an error text."""
    try:
        out = subprocess.run([sys.executable, "-c", CUDA_UUIDS], env=child_env(cvd, order),
                             capture_output=True, text=True, timeout=60, check=False)
        answer = json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as e:
        return f"child failed: {e!r}"
    return answer.get("uuids", answer.get("error", "?"))


def forms(trial: str | None, uuids: list[str]) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES values worth comparing on a machine with these GPUs (bus order)."""
    n = len(uuids)
    out: list[str | None] = [trial, None, ""]
    out += [str(i) for i in range(n)]
    out.append(",".join(str(i) for i in reversed(range(n))))
    out.append(",".join(reversed(uuids)))
    out.append(",".join(u[:12] for u in uuids))            # "GPU-xxxxxxxx" prefixes
    out.append(f"0,{n + 5},{n - 1}")                        # a bad entry ends the list
    seen: list[str | None] = []
    for f in out:
        if f not in seen:
            seen.append(f)
    return seen


def check_mapping(nvml: Any, trial: str | None, bus_order: list[str]) -> Check:
    rows, bad = [], 0
    for order in (None, "PCI_BUS_ID"):
        for cvd in forms(trial, bus_order):
            mine = [r.uuid for r in telemetry.gpu_handles(cvd, nvml, device_order=order or "")]
            cuda = cuda_uuids(cvd, order)
            same = mine == cuda
            bad += not same
            rows.append(f"    CUDA_DEVICE_ORDER={order or '(unset)':11} CUDA_VISIBLE_DEVICES="
                        f"{'(unset)' if cvd is None else repr(cvd):50} "
                        f"{'same' if same else 'DIFFERENT'}: {[u[:12] for u in mine]}"
                        + ("" if same else f" vs CUDA {cuda}"))
    detail = f"{len(rows) - bad}/{len(rows)} forms agree with CUDA\n" + "\n".join(rows)
    return Check("mapping", bad == 0, detail)


def describe(level: telemetry.LevelTelemetry) -> str:
    if not level.available:
        return f"no telemetry: {level.why}"
    by_gpu: dict[int, list[telemetry.GpuSample]] = {}
    for s in level.samples:
        by_gpu.setdefault(s.gpu, []).append(s)
    head = (f"{len(level.samples)} samples over {level.duration_s:.1f} s; SM clock min "
            f"{level.sm_clock_min_mhz} / median {level.sm_clock_median_mhz} MHz (busy samples); "
            f"throttle s {dict(level.throttle_s)}; suspect={level.suspect}")
    lines = [head]
    for gpu, samples in sorted(by_gpu.items()):
        def span(name: str, samples: list[telemetry.GpuSample] = samples) -> str:
            values = [getattr(s, name) for s in samples if getattr(s, name) is not None]
            return f"{min(values):.0f}-{max(values):.0f}" if values else "n/a"
        events = sorted({e for s in samples for e in s.clock_events})
        lines.append(f"    GPU {gpu} {samples[0].uuid[:12]}: mem {span('mem_used_mib')} of "
                     f"{span('mem_total_mib')} MiB, util {span('util_gpu')}%, mem util "
                     f"{span('util_mem')}%, SM {span('sm_clock_mhz')} MHz, mem clock "
                     f"{span('mem_clock_mhz')} MHz, {span('temperature_c')} C, "
                     f"{span('power_w')} W, clock events {events or '-'}")
    for r in level.reasons + level.caveats:
        lines.append(f"    - {r}")
    return "\n".join(lines)


def start_foreign(uuid: str, mib: int, seconds: float, load: bool
                  ) -> tuple[subprocess.Popen[str] | None, str]:
    proc = subprocess.Popen([sys.executable, "-c", FOREIGN, str(mib), str(seconds),
                             "1" if load else "0"], env=child_env(uuid, None),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()        # blocks until the child holds GPU memory
    if not line.startswith("ready"):
        err = proc.stderr.read() if proc.poll() is not None and proc.stderr else ""
        stop(proc)
        return None, f"no CUDA process could be started ({line or 'no output'}) {err[-300:]}"
    return proc, line.split()[1]


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", default=os.environ.get("CUDA_VISIBLE_DEVICES"),
                    help="the trial's CUDA_VISIBLE_DEVICES (default: this process's; unset = "
                         "all GPUs)")
    ap.add_argument("--seconds", type=float, default=6.0, help="seconds per phase")
    ap.add_argument("--interval", type=float, default=0.25, help="sampling interval (s)")
    ap.add_argument("--foreign-gpu", type=int, default=0,
                    help="which of the trial's GPUs gets the foreign process (cuda index)")
    ap.add_argument("--alloc-mib", type=int, default=1024)
    ap.add_argument("--no-load", action="store_true",
                    help="the foreign process only holds memory (no matrix products)")
    ap.add_argument("--json", default=None, help="write the checks and summaries here")
    ap.add_argument("--run-dir", default=None,
                    help="also write the telemetry table (store.write_telemetry) here")
    args = ap.parse_args(argv)

    checks: list[Check] = []
    report: dict[str, Any] = {"devices": args.devices,
                              "cuda_device_order": os.environ.get("CUDA_DEVICE_ORDER")}

    def done(code: int) -> int:
        report["checks"] = [dataclasses.asdict(c) for c in checks]
        report["exit"] = code
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2, default=str))
        return code

    try:
        import pynvml as nvml
        nvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - ImportError, NVMLError...: no GPU to check
        checks.append(Check("nvml", None, f"no NVML: {e!r}"))
        print(checks[-1].line())
        return done(77)
    count = nvml.nvmlDeviceGetCount()
    if count == 0:
        checks.append(Check("nvml", None, "NVML sees no GPU"))
        print(checks[-1].line())
        return done(77)
    everything = telemetry.gpu_handles(None, nvml)
    bus_order = [r.uuid for r in everything]
    driver = nvml.nvmlSystemGetDriverVersion()
    report["driver"] = driver if isinstance(driver, str) else driver.decode()
    report["gpus"] = [{"cuda_index_pci_order": r.cuda_index, "nvml_index": r.nvml_index,
                       "uuid": r.uuid, "pci_bus_id": r.pci_bus_id, "name": r.name}
                      for r in everything]
    report["host_pid_namespace"] = procfs.in_host_pid_namespace()
    checks.append(Check("nvml", True, f"{count} GPU(s), driver {report['driver']}, "
                        f"host PID namespace: {report['host_pid_namespace']}\n" + "\n".join(
                            f"    nvml {r.nvml_index} {r.pci_bus_id} {r.uuid} {r.name}"
                            for r in everything)))
    print(checks[-1].line(), flush=True)

    checks.append(check_mapping(nvml, args.devices, bus_order))
    print(checks[-1].line(), flush=True)

    trial = telemetry.gpu_handles(args.devices, nvml)
    report["trial_gpus"] = [r.uuid for r in trial]
    if not trial:
        checks.append(Check("sampling", None, f"CUDA_VISIBLE_DEVICES={args.devices!r} names "
                            f"no GPU: nothing to sample"))
        print(checks[-1].line())
        return done(1 if any(c.ok is False for c in checks) else 0)

    own: set[int] = set()
    levels: dict[str, telemetry.LevelTelemetry] = {}
    sampler = telemetry.TelemetrySampler(args.devices, interval_s=args.interval,
                                         own_pids=lambda: set(own), nvml=nvml)

    def phase(name: str) -> telemetry.LevelTelemetry:
        sampler.cut()                              # drop what came before (child start-up)
        time.sleep(args.seconds)
        level = levels[name] = sampler.cut()
        print(f"      [{name}] {describe(level)}", flush=True)
        if args.run_dir:
            from specdecode_tune import store
            store.write_telemetry(args.run_dir, "gpu_check", name, level.samples)
        return level

    with sampler:
        base = phase("idle")
        sampled = sorted({s.uuid for s in base.samples})
        empty = sorted(f for f in ("mem_used_mib", "util_gpu", "util_mem", "sm_clock_mhz",
                                   "mem_clock_mhz", "clock_events_mask", "temperature_c",
                                   "power_w")
                       if all(getattr(s, f) is None for s in base.samples))
        checks.append(Check("sampling", sampled == sorted(r.uuid for r in trial)
                            and bool(base.samples),
                            f"sampled {[u[:12] for u in sampled]} for the trial's "
                            f"{[r.uuid[:12] for r in trial]}; fields NVML left empty: "
                            f"{empty or 'none'}"))
        print(checks[-1].line(), flush=True)

        target = trial[min(args.foreign_gpu, len(trial) - 1)]
        child, how = start_foreign(target.uuid, args.alloc_mib, 6 * args.seconds + 60,
                                   not args.no_load)
        if child is None:
            checks.append(Check("foreign", None, how))
            checks.append(Check("own", None, how))
            print(checks[-2].line(), flush=True)
        else:
            try:
                level = phase("foreign")
                hit = [p for p in level.foreign if p.pid == child.pid]
                flagged = bool(hit) and hit[0].attributed and level.suspect
                checks.append(Check("foreign", flagged, (
                    f"pid {child.pid} ({how}, {args.alloc_mib} MiB) on GPU "
                    f"{target.cuda_index} {target.uuid[:12]}: "
                    + (f"flagged: {level.note}" if flagged else
                       f"NOT flagged; seen: {level.foreign}; note: {level.note!r}"))))
                print(checks[-1].line(), flush=True)
                own.add(child.pid)
                level = phase("own")
                still = [p for p in level.foreign if p.pid == child.pid]
                checks.append(Check("own", not still,
                                    f"pid {child.pid} declared own: "
                                    + ("not flagged" if not still else f"still flagged: {still}")))
                print(checks[-1].line(), flush=True)
            finally:
                stop(child)

        outside = [r for r in everything if r.uuid not in {t.uuid for t in trial}]
        if not outside:
            checks.append(Check("outside", None, "every GPU belongs to the trial"))
        else:
            child, how = start_foreign(outside[0].uuid, args.alloc_mib, 2 * args.seconds + 60,
                                       False)
            if child is None:
                checks.append(Check("outside", None, how))
            else:
                try:
                    level = phase("outside")
                    seen = [p for p in level.foreign if p.pid == child.pid]
                    wrong = sorted({s.uuid for s in level.samples} - {t.uuid for t in trial})
                    checks.append(Check("outside", not seen and not wrong, (
                        f"pid {child.pid} on {outside[0].uuid[:12]} (not the trial's): "
                        + ("not seen" if not seen else f"SEEN: {seen}")
                        + (f"; sampled other GPUs {wrong}" if wrong else ""))))
                finally:
                    stop(child)
        print(checks[-1].line(), flush=True)

    report["levels"] = {name: {k: v for k, v in dataclasses.asdict(level).items()
                               if k != "samples"} | {"n_samples": len(level.samples)}
                        for name, level in levels.items()}
    nvml.nvmlShutdown()
    failed = [c.name for c in checks if c.ok is False]
    print(f"\n{'FAILED: ' + ', '.join(failed) if failed else 'all checks passed'} "
          f"({sum(c.ok is True for c in checks)} passed, "
          f"{sum(c.ok is None for c in checks)} skipped)")
    return done(1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
