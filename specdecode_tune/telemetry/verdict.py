"""The verdict on one level: what the trial's GPUs did during it, and whether that makes the level
suspect.

A level is *suspect* (kept out of the report's verdicts) when, during it, a GPU throttled for a
reason other than idle power saving, a foreign process used one of the trial's GPUs, or the SM
clock fell more than `SuspectRules.clock_drop_frac` below the level's median after warm-up.
`summarize` is the pure function that applies these rules to a window of samples;
`merge_level` folds its verdict into the level's `LevelSummary`.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..records import LevelSummary
from .samples import IDLE_REASON, SETTING_REASONS, GpuProcess, GpuSample


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
    busy = [(s, s.sm_clock_mhz) for s in samples
            if s.sm_clock_mhz is not None and IDLE_REASON not in s.clock_events]
    clocks = [mhz for s, mhz in busy if s.t_s >= rules.warmup_s] or [mhz for _, mhz in busy]
    clock_min = min(clocks) if clocks else None
    clock_median = float(statistics.median(clocks)) if clocks else None
    for gpu in sorted({s.gpu for s, _ in busy}):
        mine = [(s, mhz) for s, mhz in busy if s.gpu == gpu and s.t_s >= rules.warmup_s]
        if len(mine) < 3:
            continue
        median = statistics.median(mhz for _, mhz in mine)
        low = [(s, mhz) for s, mhz in mine if mhz < (1.0 - rules.clock_drop_frac) * median]
        low_s = sum(s.dt_s for s, _ in low)
        if low and low_s >= rules.min_drop_s:
            lowest = min(mhz for _, mhz in low)
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
