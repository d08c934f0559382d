"""The schedule's validation: what one boot of the emitted schedule measured, level by level.

Per-level best configs are each measured on a server of their own; one server running a
schedule is another server (buffers and KV pool of the largest steps, graphs per candidate,
batches that cross a key). The search boots it once after the search (`search/validate.py`,
trial id "schedule") and, where the static best is a chain, the same mode with that config's
steps everywhere ("schedule-same"): the cost of the mode itself. Each level of the schedule
trial is set against

- the best static config (the recommendation) at that level;
- the best config measured for that level alone (what the per-level figures expected);
- its own tier's static config: the static chain with the steps the schedule runs there;

each as a noise verdict with the level's band. A threshold collapse is a loss from switching (a
batch crossing a key, a KV pool sized for the largest steps), beyond what the mode itself
costs. Where schedule-same measured the level, the schedule is judged against its tier as the
mode would run it: the tier's tok/s times the mode's cost there (schedule-same over the static
server), so where the schedule runs the static best's steps this is schedule against
schedule-same. Below it beyond noise is a collapse; below the static tier but not below that is
the mode's own cost. Where no schedule-same was measured (a tree static best, or a failed
boot), a schedule below its static tier beyond noise is a collapse.

The schedule is recommended only where it beats the static config beyond noise at some level
and loses beyond noise at none; otherwise the report recommends the static config and says why,
with what was measured, not what the per-level figures expected.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from ..objective import compare
from ..space import STEPS, TOPK
from . import render as r
from .rundata import SAME_ID, SCHEDULE_ID, Config, RunData, Trial


@dataclass(frozen=True)
class LevelCheck:
    c: int
    steps: int                          # what the schedule runs at this level's batch
    tok_s: float                        # the schedule trial
    static_tok_s: float | None          # the best static config
    vs_static: str                      # better / within noise / worse / n/a
    alone: Config | None                # the best config measured at this level alone
    alone_tok_s: float | None
    vs_alone: str
    tier: Config | None                 # the static chain with `steps`
    tier_tok_s: float | None
    vs_tier: str
    same_tok_s: float | None            # the mode with the static steps everywhere
    mode_cost: str                      # schedule-same against the static server
    band: float
    # The tier as the mode would run it: tier_tok_s x same_tok_s / static_tok_s; None where
    # schedule-same did not measure this level.
    tier_mode_tok_s: float | None = None
    vs_tier_mode: str = "n/a"

    @property
    def collapse(self) -> bool:
        """Lost by switching: below the tier in the mode beyond noise where schedule-same
        measured this level, else below the static tier beyond noise."""
        if self.tier_mode_tok_s is not None:
            return self.vs_tier_mode == "worse"
        return self.vs_tier == "worse"

    @property
    def mode_explains(self) -> bool:
        """Below the static tier beyond noise, but not below it in the mode: the loss is the
        mode's own cost."""
        return self.vs_tier == "worse" and self.tier_mode_tok_s is not None \
            and not self.collapse


@dataclass(frozen=True)
class Validation:
    trial: Trial
    same: Trial | None
    checks: tuple[LevelCheck, ...]
    recommended: bool
    why: str                            # one sentence: what is recommended and why


def _verdict(a: float | None, b: float | None, band: float) -> str:
    if a is None or b is None or a <= 0 or b <= 0:
        return "n/a"
    return compare(math.log(a), math.log(b), band)


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "-"
    return f"{(a / b - 1) * 100:+.1f}%"


def _in_mode(tier: float | None, same: float | None, static: float | None) -> float | None:
    """The tier's tok/s as the per-batch-size mode would run it: scaled by the mode's measured
    cost at the level (schedule-same over the static server); None where one is missing."""
    if tier is None or same is None or static is None or min(tier, same, static) <= 0:
        return None
    return tier * same / static


def steps_at(slots: tuple[tuple[int, int], ...], batch: int) -> int:
    starts = [s for s, _ in slots]
    return slots[max(0, bisect.bisect_right(starts, batch) - 1)][1]


def validate(data: RunData, slots: tuple[tuple[int, int], ...]) -> Validation | None:
    """The validation of the schedule `slots`, or None when no validation trial ran."""
    trial = data.schedule_trial(SCHEDULE_ID)
    if trial is None:
        return None
    best = data.best
    same = data.schedule_trial(SAME_ID)
    pool = list(data.configs) + ([data.baseline] if data.baseline is not None else [])
    chains = [cf for cf in pool if cf.param(TOPK) in (None, 1)]
    limit = trial.facts.max_running_requests
    checks = []
    for c in data.levels:
        lv = trial.levels.get(c)
        if lv is None:
            continue
        band = data.level_bands.get(c, data.band)
        steps = steps_at(slots, min(c, limit) if limit else c) if slots else 0
        static = best.tok_s(c) if best is not None else None
        measured = [cf for cf in pool if cf.tok_s(c) is not None]
        alone = max(measured, key=lambda cf: cf.tok_s(c) or 0.0) if measured else None
        tiers = [cf for cf in chains if int(cf.param(STEPS) or 0) == steps
                 and cf.tok_s(c) is not None]
        tier = max(tiers, key=lambda cf: cf.tok_s(c) or 0.0) if tiers else None
        same_lv = same.levels.get(c) if same is not None and same.status == "ok" else None
        tier_tok = tier.tok_s(c) if tier else None
        tier_mode = _in_mode(tier_tok, same_lv.output_tok_s if same_lv else None, static)
        checks.append(LevelCheck(
            c=c, steps=steps, tok_s=lv.output_tok_s, static_tok_s=static,
            vs_static=_verdict(lv.output_tok_s, static, band),
            alone=alone, alone_tok_s=alone.tok_s(c) if alone else None,
            vs_alone=_verdict(lv.output_tok_s, alone.tok_s(c) if alone else None, band),
            tier=tier, tier_tok_s=tier_tok,
            vs_tier=_verdict(lv.output_tok_s, tier_tok, band),
            same_tok_s=same_lv.output_tok_s if same_lv else None,
            mode_cost=_verdict(same_lv.output_tok_s if same_lv else None, static, band),
            band=band, tier_mode_tok_s=tier_mode,
            vs_tier_mode=_verdict(lv.output_tok_s, tier_mode, band)))
    recommended, why = _decide(trial, checks, data)
    return Validation(trial=trial, same=same, checks=tuple(checks), recommended=recommended,
                      why=why)


def _decide(trial: Trial, checks: list[LevelCheck], data: RunData) -> tuple[bool, str]:
    static = data.label(data.best.params) if data.best is not None else "the static config"
    if trial.status != "ok" or trial.suspect:
        what = trial.reason or trial.suspect_why or trial.status
        return False, (f"The schedule's validation trial is {trial.status}"
                       f"{' (suspect)' if trial.suspect else ''}: {what}. Recommended: the "
                       f"static config {static}.")
    wins = [k.c for k in checks if k.vs_static == "better"]
    losses = [k.c for k in checks if k.vs_static == "worse"]
    missing = [c for c in data.levels if c not in {k.c for k in checks}]
    if missing:
        return False, (f"The validation trial has no measurement at "
                       f"{', '.join(f'C={c}' for c in missing)}. Recommended: the static "
                       f"config {static}.")
    if wins and not losses:
        return True, (f"The schedule, measured on one server, beats the static config beyond "
                      f"noise at {', '.join(f'C={c}' for c in wins)} and is within noise or "
                      f"better everywhere else. Recommended: the schedule.")
    expected = [k.c for k in checks if _verdict(k.alone_tok_s, k.static_tok_s, k.band)
                == "better" and k.vs_static != "better"]
    parts = []
    if losses:
        parts.append(f"it falls below the static config beyond noise at "
                     f"{', '.join(f'C={c}' for c in losses)}")
    if not wins:
        parts.append("it beats the static config beyond noise at no level")
    if expected:
        parts.append(f"the per-level figures expected a gain at "
                     f"{', '.join(f'C={c}' for c in expected)} that the schedule's own boot "
                     f"did not measure; the measurement counts")
    return False, ("The schedule is not recommended: " + "; ".join(parts)
                   + f". Recommended: the static config {static}.")


def table(data: RunData, v: Validation) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """The per-level table: (header, rows)."""
    head = ("level", "schedule steps", "schedule tok/s", "static best tok/s", "vs static",
            "best for this level alone", "vs alone", "tier (same steps, static)",
            "vs tier (static; in the mode where measured)",
            "mode cost (same steps everywhere vs static)")
    rows = []
    for k in v.checks:
        alone = "-" if k.alone is None else \
            f"{data.label(k.alone.params)}: {k.alone_tok_s:.1f}"
        tier = "-" if k.tier is None else f"{k.tier_tok_s:.1f}"
        cost = "-" if k.same_tok_s is None else \
            f"{k.same_tok_s:.1f} ({_ratio(k.same_tok_s, k.static_tok_s)}, {k.mode_cost})"
        rows.append((f"C={k.c}", "no speculation" if k.steps == 0 else str(k.steps),
                     f"{k.tok_s:.1f}",
                     "-" if k.static_tok_s is None else f"{k.static_tok_s:.1f}",
                     f"{_ratio(k.tok_s, k.static_tok_s)} ({k.vs_static})", alone,
                     f"{_ratio(k.tok_s, k.alone_tok_s)} ({k.vs_alone})", tier,
                     _vs_tier(k), cost))
    return head, tuple(rows)


def _vs_tier(k: LevelCheck) -> str:
    """The vs-tier cell: against the static tier and, where schedule-same measured the level,
    against the tier in the mode, which decides a collapse there."""
    static = f"{_ratio(k.tok_s, k.tier_tok_s)} ({k.vs_tier}"
    if k.tier_mode_tok_s is None:
        return static + (" (threshold collapse))" if k.collapse else ")")
    why = (": threshold collapse" if k.collapse
           else ": the mode's own cost explains it" if k.mode_explains else "")
    return (f"{static}); vs tier in the mode {k.tier_mode_tok_s:.1f}: "
            f"{_ratio(k.tok_s, k.tier_mode_tok_s)} ({k.vs_tier_mode}{why})")


def _levels(checks: list[LevelCheck]) -> str:
    return ", ".join(f"C={k.c}" for k in checks)


def _collapse_para(checks: tuple[LevelCheck, ...]) -> str:
    """The threshold collapses, and the losses the mode's own cost accounts for; "" where the
    schedule is below its tier at no level."""
    in_mode = [k for k in checks if k.collapse and k.tier_mode_tok_s is not None]
    static = [k for k in checks if k.collapse and k.tier_mode_tok_s is None]
    explained = [k for k in checks if k.mode_explains]
    costs = ", ".join(f"C={k.c} {_ratio(k.same_tok_s, k.static_tok_s)}" for k in explained)
    parts = []
    if in_mode:
        parts.append(f"Threshold collapse at {_levels(in_mode)}: the schedule runs below its "
                     f"tier in the mode (the static server with the same steps, scaled by "
                     f"schedule-same vs the static server) beyond noise, a loss from switching "
                     f"beyond the mode's own cost.")
    if static:
        parts.append(f"Threshold collapse at {_levels(static)}: the schedule runs below the "
                     f"static server with the same steps, beyond noise (no schedule-same "
                     f"measured there to take out the mode's own cost).")
    if explained and parts:
        parts.append(f"At {_levels(explained)} the loss against the static tier is the mode's "
                     f"own cost (schedule-same vs the static server: {costs}).")
    elif explained:
        parts.append(f"The losses are the per-batch-size mode's own cost (schedule-same vs the "
                     f"static server): {costs}; against its tier in the mode the schedule is "
                     f"within noise or better at every level.")
    return " ".join(parts)


def blocks(data: RunData, slots: tuple[tuple[int, int], ...]) -> list[r.Block]:
    """The report's validation section for the schedule `slots`: the trial that booted it, the
    per-level table, any threshold collapse and the verdict; what to do where none ran."""
    out: list[r.Block] = [r.Heading(3, "Validation: the schedule on one server")]
    v = validate(data, slots)
    if v is None:
        return out + [r.Para("No validation trial: the per-level figures above come from a "
                             "boot per config, not from one server running the schedule. "
                             "Run the search with objective.kind = \"schedule\" to boot it "
                             "once; until then the static config is the recommendation.")]
    head, rows = table(data, v)
    t = v.trial
    out.append(r.Para(
        f"Trial `{t.trial_id}` (a row of the trials table, sampler \"schedule\", with its "
        f"levels) booted the emitted schedule once"
        + (f" (running limit {t.facts.max_running_requests})"
           if t.facts.max_running_requests else "")
        + ". Per level: the schedule against the best static config, the best config measured "
          "for that level alone, and its own tier (the static chain with the steps it runs "
          "there); the last column is the mode's own cost, the static config's steps in every "
          "slot against the static server. Where that was measured, the schedule is also set "
          "against its tier in the mode (the tier's tok/s times the mode's cost at the level; "
          "with the static config's steps, schedule against schedule-same): below it beyond "
          "noise is a threshold collapse, a loss from switching; where it was not, below the "
          "static tier beyond noise is. Verdicts use each level's noise band."))
    out.append(r.Table(head, rows))
    collapses = _collapse_para(v.checks)
    if collapses:
        out.append(r.Para(collapses))
    out.append(r.Para(v.why))
    return out


def markdown_table(data: RunData, v: Validation) -> str:
    head, rows = table(data, v)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


__all__ = ["SAME_ID", "SCHEDULE_ID", "LevelCheck", "Validation", "blocks", "markdown_table",
           "table", "validate"]
