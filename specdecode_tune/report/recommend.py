"""The recommendation: the best static config, its launch command, and a per-level schedule.

The best static config is the configuration with the highest robust score (median - spread of
its repeats' scores, the spread 1.4826 * MAD shrunk towards the noise band: objective.Robust;
suspect trials left out). The schedule picks, for each measured
concurrency level, the measured configuration with the highest median tok/s at that level
(feasible, not suspect; the no-speculation baseline counts: it wins where drafting costs more
than it returns). Servers can switch only the number of draft steps at run time, so the
schedule is emitted for chains (topk = 1), in every engine's format that has one: each
engine's backend writes its own file and says the command that boots it, or why it cannot
(`backends.schedule_files`: SGLang's adaptive config, vLLM's per-batch-size K, TensorRT-LLM's
draft-length schedule; their sources are cited in the backends). The report renders what they
return and names no engine.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ..backends import ScheduleAsk, ScheduleFile, get_backend, schedule_files, schedule_refusal
from ..config import Experiment
from ..objective import compare, pct
from ..space import DRAFT, SHORT_NAMES, STEPS, TOPK
from .rundata import Config, RunData
from .words import band_pct, describe, pct_gain


@dataclass(frozen=True)
class LevelRow:
    """The recommended config at one level against the baseline."""

    c: int
    tok_s: float | None
    lo: float | None
    hi: float | None
    n: int
    base: float | None
    accept: float | None
    # How well the figures are known (the worst of the repeats: the 95% interval's relative
    # half-width over whole rounds; None for fixed windows) and the seconds a level took
    # (median over the repeats, warm-up included); why the acceptance is missing, where it is.
    precision: float | None = None
    level_s: float | None = None
    accept_why: str | None = None

    @property
    def speedup(self) -> float | None:
        if self.tok_s is None or not self.base:
            return None
        return self.tok_s / self.base


@dataclass(frozen=True)
class Recommendation:
    config: Config | None
    command: str | None
    command_note: str                 # why there is no command, when there is none
    rows: tuple[LevelRow, ...]
    vs_baseline: str                  # compare() of its score against 0: better / within / worse
    runner_up: Config | None
    runner_delta: float | None        # runner-up median minus best median (log)
    runner_within: bool


def launch_command(exp: Experiment | None, params: dict[str, Any], why_no_exp: str
                   ) -> tuple[str | None, str]:
    """(the backend's launch command, '') or (None, why there is none)."""
    if exp is None:
        return None, (f"no launch command: {why_no_exp or 'no experiment'}, so the backend "
                      f"kind and its fixed flags are unknown")
    try:
        backend = get_backend(exp.backend.kind)
    except ValueError as e:
        return None, f"no launch command: {e}"
    return backend.launch_command(exp.backend, params), ""


def recommend(data: RunData) -> Recommendation:
    best = data.best
    if best is None:
        return Recommendation(None, None, "no feasible configuration was measured", (),
                              "n/a", None, None, False)
    cmd, note = launch_command(data.experiment, best.params, data.experiment_note)
    rows = []
    for c in data.levels:
        rng = best.tok_s_range(c)
        rows.append(LevelRow(c=c, tok_s=best.tok_s(c), lo=rng[0] if rng else None,
                             hi=rng[1] if rng else None, n=len(best.values(c)),
                             base=data.base_tok_s(c), accept=best.accept(c),
                             precision=best.precision(c), level_s=best.level_s(c),
                             accept_why=best.accept_why(c)))
    runner = data.configs[1] if len(data.configs) > 1 else None
    delta = runner.robust.median - best.robust.median if runner is not None else None
    return Recommendation(
        config=best, command=cmd, command_note=note, rows=tuple(rows),
        vs_baseline=compare(best.robust.median, 0.0, data.band) if data.baseline else "n/a",
        runner_up=runner, runner_delta=delta,
        runner_within=delta is not None and abs(delta) <= data.band)


# ---------------------------------------------------------------------------------------------
# Per-level schedule


@dataclass(frozen=True)
class Entry:
    """The best measured config at one concurrency level."""

    c: int
    config: Config
    tok_s: float
    static_tok_s: float | None       # the recommended static config at this level
    within_noise: bool = False       # beats the static config by no more than the level's band
    kept_static: bool = False        # emitted as the static config because of that

    @property
    def steps(self) -> int:
        return int(self.config.param(STEPS) or 0)

    @property
    def gain(self) -> float | None:
        if not self.static_tok_s:
            return None
        return self.tok_s / self.static_tok_s


@dataclass(frozen=True)
class Schedule:
    entries: tuple[Entry, ...]       # any measured config (topk may vary)
    chain: tuple[Entry, ...]         # chains only (topk = 1, or no speculation): the files
    files: tuple[ScheduleFile, ...]  # every engine's file (its JSON, its command), in order
    notes: tuple[str, ...]
    # What the engines were asked to write (slots, the schedule server's settings); None
    # where there is no schedule.
    ask: ScheduleAsk | None = None
    # Why no schedule is offered although levels were measured: the best one loses to the
    # static config beyond noise at some level (`losing_levels`); then nothing is emitted.
    withheld: str | None = None

    @property
    def slots(self) -> tuple[tuple[int, int], ...]:
        """(running batch where it starts, steps); () where there is no schedule."""
        return self.ask.slots if self.ask is not None else ()

    @property
    def params(self) -> dict[str, Any] | None:
        """The schedule server's settings but the file (None: no schedule)."""
        return dict(self.ask.params) if self.ask is not None else None

    def file(self, engine: str) -> ScheduleFile | None:
        """The file of that engine (`ScheduleFile.engine`), where one was written."""
        return next((f for f in self.files if f.engine == engine), None)


def _best_at(data: RunData, c: int, *, chain_only: bool) -> Config | None:
    pool = list(data.configs) + ([data.baseline] if data.baseline is not None else [])
    if chain_only:
        pool = [cf for cf in pool if cf.param(TOPK) in (None, 1)]
    pool = [cf for cf in pool if cf.tok_s(c) is not None]
    if not pool:
        return None
    # Highest median tok/s; ties to fewer steps (cheaper), then the better score.
    return max(pool, key=lambda cf: (cf.tok_s(c), -(cf.param(STEPS) or 0),
                                     cf.robust.median))


def schedule(data: RunData) -> Schedule:
    """The per-level schedule: the best measured config at each level, the chain emitted
    (topk = 1, keeping the static config where a level's winner beats it only within noise),
    each engine's file and the notes on it; withheld where the chain loses to the static config
    beyond noise at some level."""
    best = data.best
    all_e, raw_chain = _entries(data, chain_only=False), _entries(data, chain_only=True)
    # A level whose winner beats the static config only within noise keeps the static config
    # in what is emitted: switching settings for a difference the repeats cannot tell from
    # noise is the trap the report exists to avoid.
    static_chain = best is not None and best.param(TOPK) in (None, 1)
    chain = tuple(_keep_static(e, best, static_chain) for e in raw_chain)
    losing = losing_levels(data, chain)
    if losing:
        why = withheld_line(data, best, losing)
        return Schedule(all_e, chain, (), (why,), withheld=why)
    notes = _choice_notes(best, static_chain, all_e, raw_chain, chain)
    exp_cfg = data.experiment.backend if data.experiment is not None else None
    if not chain or all(e.steps == 0 for e in chain):
        notes.append("No level is best with speculation: no schedule to emit.")
        return Schedule(all_e, chain, tuple(schedule_files(exp_cfg, None)), tuple(notes))
    if uniform_steps(best, chain):
        # A file of one step count at every batch size runs the static config through the
        # engine's per-batch-size mode: nothing gained, the mode's own cost paid (vLLM 0.26.0's
        # needs piecewise CUDA graphs; the readings' schedule under them served 0.61x the
        # no-speculation baseline at C=1 on the H100, docs/gpu-runs.md).
        notes.append("No schedule file is written: it would run the static config's steps at "
                     "every batch size, through a per-batch-size mode that only adds its own "
                     "cost. Run the static config.")
        return Schedule(all_e, chain, tuple(schedule_files(exp_cfg, None)), tuple(notes))
    return _emitted(data, all_e, chain, notes)


def uniform_steps(best: Config | None, chain: tuple[Entry, ...]) -> int:
    """The static config's steps where the chain runs them at every level (a chain static
    config: "nothing to switch"); else 0."""
    steps = int(best.param(STEPS) or 0) if best is not None and best.param(TOPK) in (None, 1) \
        else 0
    return steps if steps > 0 and chain and all(e.steps == steps for e in chain) else 0


def _entries(data: RunData, *, chain_only: bool) -> tuple[Entry, ...]:
    """The best measured config at each level (chains only, or any), against the static
    config there."""
    best = data.best
    out = []
    for c in data.levels:
        cf = _best_at(data, c, chain_only=chain_only)
        if cf is None:
            continue
        tok = cf.tok_s(c)
        if tok is None:   # not reached: _best_at keeps only the configs measured at c
            continue
        static = best.tok_s(c) if best is not None else None
        within = static is not None and static != 0 and cf is not best and \
            math.log(tok / static) <= data.level_bands.get(c, data.band)
        out.append(Entry(c=c, config=cf, tok_s=tok, static_tok_s=static,
                         within_noise=within))
    return tuple(out)


def _keep_static(e: Entry, best: Config | None, static_chain: bool) -> Entry:
    """`e`, or the static config in its place where `e` beats it only within noise
    (then the static config was measured at e.c: static_tok_s is its tok/s there)."""
    if best is None or not static_chain or not e.within_noise or e.static_tok_s is None:
        return e
    return Entry(c=e.c, config=best, tok_s=e.static_tok_s, static_tok_s=e.static_tok_s,
                 kept_static=True)


def _choice_notes(best: Config | None, static_chain: bool, all_e: tuple[Entry, ...],
                  raw_chain: tuple[Entry, ...], chain: tuple[Entry, ...]) -> list[str]:
    """What the chain kept of the static config, and where it is not the levels' winners."""
    notes: list[str] = []
    kept = [e for e in chain if e.kept_static]
    if kept:
        notes.append("At " + ", ".join(f"C={e.c}" for e in kept) + " the fastest measured "
                     "config beats the recommended static config only within noise: the "
                     "emitted schedule keeps the static config's steps there.")
    if chain and static_chain and all(e.config is best for e in chain):
        notes.append("The schedule equals the static config: no level gains beyond noise "
                     "from switching steps.")
    if [e.config.key for e in all_e] != [e.config.key for e in raw_chain]:
        notes.append("Some levels are best with topk > 1; servers switch only a chain's "
                     "steps at run time (SGLang's adaptive mode takes topk = 1 only), so the "
                     "schedule uses the best chain (topk = 1) at each level.")
    return notes


def _emitted(data: RunData, all_e: tuple[Entry, ...], chain: tuple[Entry, ...],
             notes: list[str]) -> Schedule:
    """The schedule of a chain with speculation at some level: its slots, the schedule
    server's settings and each engine's file, with the notes on what one server changes."""
    best = data.best
    base = best.params if best is not None else chain[0].config.params
    differ = _differing(chain, exclude=(STEPS, TOPK, DRAFT))
    if differ:
        notes.append(f"The per-level best configs also differ in {', '.join(differ)}; a "
                     f"runtime schedule changes only the steps, so the server keeps the "
                     f"recommended config's other settings ({data.label(base)}).")
    top = max(e.steps for e in chain)
    top_cf = next(e.config for e in chain if e.steps == top)
    mrr = top_cf.fact("max_running_requests")
    notes.append(
        f"Each level was measured on its own boot. One server running the schedule sizes its "
        f"draft buffers for the largest steps ({top}), so its KV budget is that of steps={top}"
        + (f" (max_running_requests {mrr:.0f} measured there)" if mrr else "")
        + ": measure the schedule once before relying on the per-level figures.")

    slots, merged = schedule_slots(chain, int(mrr) if mrr else None)
    if merged:
        notes.append(merged)
    exp = data.experiment
    first = next(e.steps for e in chain if e.steps > 0)
    ask = ScheduleAsk(slots=tuple(slots),
                      params={**base, STEPS: first, TOPK: 1, DRAFT: first + 1},
                      top_steps=top, running_limit=int(mrr) if mrr else None)
    files = schedule_files(exp.backend if exp is not None else None, ask)
    notes.extend(f.why for f in files if f.why)
    if exp is not None:
        # Where the experiment's engine and release boot no schedule from a file, its
        # backend's one line on why not.
        why = schedule_refusal(exp.backend)
        if why:
            notes.append(why)
    return Schedule(all_e, chain, tuple(files), tuple(notes), ask=ask)


def losing_levels(data: RunData, chain: tuple[Entry, ...]) -> list[Entry]:
    """The levels where the schedule's entry is slower than the static config beyond that
    level's noise band: a schedule switches only a chain's steps, so where the static config
    is a tree (topk > 1) every chain may lose to it at some level."""
    return [e for e in chain if e.gain is not None and e.gain > 0
            and -math.log(e.gain) > data.level_bands.get(e.c, data.band)]


def withheld_line(data: RunData, best: Config | None, losing: list[Entry]) -> str:
    """One line: why no per-level schedule is offered (the closing lines and the report)."""
    static = "the static config" if best is None else \
        f"the static config ({data.label(best.params)})"
    where = ", ".join(f"C={e.c} {pct_gain(e.gain or 1.0)}" for e in losing)
    return (f"No per-level schedule offered: the best one servers can switch (a chain, "
            f"topk = 1, per level) is slower than {static} beyond noise at {where}; "
            f"recommended: the static config")


def schedule_slots(chain: tuple[Entry, ...], limit: int | None
                   ) -> tuple[list[tuple[int, int]], str]:
    """(slots, a note where levels merged). The engines route by the batch the server runs, not
    by the clients' concurrency: a level's running batch is min(C, the schedule server's
    running limit). A batch between two measured levels' batches takes the steps of the one
    nearer in log scale (ceil(sqrt(lower * upper)) starts the upper slot; the first slot
    starts at 1): a closed-loop level at C runs batches a little below C most of the time (a
    finished request's replacement in prefill), and a slot keyed at C itself sent those to the
    level below (a schedule keyed 1/4/16/64 ran C=16's dips to 14 with C=4's deeper steps:
    -3.4% at C=16 in the simulator, 2026-12-04). Levels whose running batch is the same share
    one slot: the higher level's steps, said in the note."""
    slots: list[tuple[int, int]] = []
    merged: list[str] = []
    prev = 0
    for e in chain:
        batch = min(e.c, limit) if limit else e.c
        if slots and batch <= prev:
            merged.append(f"C={e.c}")
            slots[-1] = (slots[-1][0], e.steps)
            continue
        start = 1 if not slots else max(prev + 1, math.ceil(math.sqrt(prev * batch) - 1e-9))
        slots.append((start, e.steps))
        prev = batch
    note = (f"{', '.join(merged)} run(s) the same batch as the level below "
            f"(the running limit {limit}): one slot, the higher level's steps."
            if merged else "")
    return slots, note


def _differing(entries: tuple[Entry, ...], exclude: tuple[str, ...]) -> list[str]:
    spec = [e.config.params for e in entries if e.steps > 0]
    keys = sorted({k for p in spec for k in p} - set(exclude))
    return [SHORT_NAMES.get(k, k) for k in keys if len({json.dumps(p.get(k)) for p in spec}) > 1]


def schedule_json(content: dict[str, Any]) -> str:
    """One top-level key a line: short enough to read, exact JSON to paste."""
    items = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in content.items()]
    return "{\n" + ",\n".join(items) + "\n}"


def schedule_line(data: RunData, s: Schedule) -> str:
    """'C=1 steps=5, C=16 steps=4, C=64 no speculation' (the chain schedule); where it runs the
    static config's steps at every level, that said in so many words (a list of the same steps
    per level read like advice to switch)."""
    steps = uniform_steps(data.best, s.chain)
    if steps:
        return f"steps={steps} at every level, the static config's own: nothing to switch"
    parts = []
    for e in s.chain or s.entries:
        what = "no speculation" if e.steps == 0 else describe(e.config.params,
                                                              only=(STEPS,))
        gain = f" ({pct_gain(e.gain)} vs static)" if e.gain and abs(e.gain - 1) > 1e-9 else ""
        parts.append(f"C={e.c} {what}{gain}")
    return ", ".join(parts)


def runner_up_line(data: RunData, r: Recommendation) -> str | None:
    if r.runner_up is None or r.runner_delta is None:
        return None
    verdict = "within noise" if r.runner_within else "worse beyond noise"
    # How many boots back it; once, and beyond noise, why no second (the searcher's rule).
    once = "" if r.runner_up.n != 1 else (
        ", measured once" if r.runner_within else
        ", measured once (the search re-measures a runner-up only within the noise band of "
        "the best)")
    return (f"runner-up {data.label(r.runner_up.params)}{once}: score {pct(r.runner_delta)} vs "
            f"the best, {verdict} ({band_pct(data.band)})")


__all__ = [
    "Entry",
    "LevelRow",
    "Recommendation",
    "Schedule",
    "launch_command",
    "losing_levels",
    "recommend",
    "runner_up_line",
    "schedule",
    "schedule_json",
    "schedule_line",
]
