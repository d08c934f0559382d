"""The trials in the report: how many, how they ended, and what measuring them took.

`counts` and `measure_seconds` close the summary (and the search's last lines); `blocks` is the
report's "Trials" section: every usable configuration best first, the suspect trials (left out
of every figure of merit) and the infeasible, failed and pruned ones with their reasons.
"""

from __future__ import annotations

from ..records import COMPILED_GRAPHS, LOADED_GRAPHS
from ..space import MEM
from . import render as r
from .rundata import SCHEDULE_IDS, Config, RunData, Trial
from .words import fmt_tok


def counts(data: RunData) -> str:
    """'12 trials (9 ok, 1 infeasible, 1 failed, 1 pruned; 1 suspect; 3 re-measurements), 5
    usable configurations': the speculative trials by outcome."""
    spec = [t for t in data.trials if not t.baseline]
    by = {s: sum(1 for t in spec if t.status == s) for s in ("ok", "infeasible", "failed",
                                                            "pruned")}
    suspect = sum(1 for t in spec if t.status == "ok" and t.suspect)
    repeats = sum(1 for t in spec if t.repeat > 0)
    return (f"{len(spec)} trials ({by['ok']} ok, {by['infeasible']} infeasible, "
            f"{by['failed']} failed, {by['pruned']} pruned; {suspect} suspect; {repeats} "
            f"re-measurements), {len(data.configs)} usable configurations")


def measure_seconds(data: RunData) -> str:
    """'measuring took 412 s over 11 boots (37 s a boot)': the levels' own seconds (warm-ups
    included; boots and the pauses between levels not), where the tables record them."""
    per = [sum(s.level_s for s in t.levels.values() if s.level_s is not None)
           for t in data.trials if any(s.level_s is not None for s in t.levels.values())]
    if not per:
        return ""
    return (f"measuring took {sum(per):.0f} s over {len(per)} boot(s) "
            f"({sum(per) / len(per):.0f} s a boot)")


def _plateau_why(cf: Config) -> str:
    """Why the plateau question booted this configuration: its jump, or a jump's bracket."""
    if cf.jump_reason:
        return f"jump: {cf.jump_reason}"
    return cf.bracket_reason or ""


# Boots of one configuration whose KV pools differ by more than this share are named.
KV_MOVE = 0.01


def kv_moves(data: RunData) -> str:
    """One paragraph naming the configurations whose KV pool (the server's own figure, in
    tokens) differed between their boots; '' where none did. The engine sizes its pool at
    each boot from what it measures then (vLLM 0.26.0 on an H100 gave 44,432 and 49,184 tokens
    to boots of one config, 2026-12-07), and the levels where the pool binds move with it.
    Where the boots' logs say whether their graphs were compiled at boot or loaded from the
    engine's compile cache (records.COMPILED_GRAPHS), each boot says which, and the paragraph
    says where every compiling boot got a smaller pool than every loading one; then the
    configurations only such boots measured (`compiled_only_configs`)."""
    pools: dict[str, list[tuple[Trial, int]]] = {}
    for t, kv in _pooled(data):
        pools.setdefault(t.config_key, []).append((t, kv))
    parts = []
    split = []
    for cf in data.configs:
        seen = pools.get(cf.key, [])
        move = max(k for _, k in seen) / min(k for _, k in seen) - 1 if seen else 0.0
        if move > KV_MOVE:
            parts.append(f"{data.label(cf.params)}: " + ", ".join(
                f"{k:,} ({t.trial_id}{_GRAPHS_SAID.get(_graphs(t), '')})" for t, k in seen)
                + f", {move:+.1%}")
            split.append(_compile_split(seen))
    said = ""
    if parts:
        said = ("The server's KV pool differed between boots of one configuration (the engine "
                "sizes it at each boot from what it measures then; the levels where the pool "
                "binds move with it): " + "; ".join(parts) + ".")
        if all(split):
            said += (" Each boot that compiled its graphs got a smaller pool than each that "
                     "loaded them from the engine's compile cache.")
    short = compiled_only_configs(data)
    return f"{said} {short}".strip()


def compiled_only_configs(data: RunData) -> str:
    """One sentence naming the configurations measured only by boots that compiled their
    graphs, at a memory setting where those boots got a smaller pool than every boot there
    that loaded its graphs; '' where none. vLLM 0.26.0 keys its compile cache by K's class (K 1,
    K 2, K >= 3 at 64 sequences), so a search's first boot of each class compiles, and its pool
    was 41% smaller at 0.0075 on an H100 (2026-12-07): a configuration booted once that way
    was measured with less KV than the others at its memory, which a comparison of pools
    between its own boots cannot show."""
    by_mem: dict[object, list[tuple[Trial, int]]] = {}
    for t, kv in _pooled(data):
        if MEM in t.params and _graphs(t):
            by_mem.setdefault(t.params[MEM], []).append((t, kv))
    named = []
    for mem, seen in by_mem.items():
        if not _compile_split(seen):
            continue
        warm = min(k for t, k in seen if _graphs(t) == "loaded")
        loaded = {t.config_key for t, _ in seen if _graphs(t) == "loaded"}
        for cf in data.configs:
            mine = [(t, k) for t, k in seen if t.config_key == cf.key]
            if mine and cf.key not in loaded:
                named.append(f"{data.label(cf.params)} ("
                             + ", ".join(f"{t.trial_id}: {k:,}" for t, k in mine)
                             + f" tokens, against {warm:,} or more where a boot at {MEM} {mem} "
                               f"loaded its graphs)")
    if not named:
        return ""
    return ("Measured only by boots that compiled their graphs at start, with a smaller pool "
            "than the same memory gives a boot that loads them from the compile cache (where "
            "the pool binds, their figures read low): " + "; ".join(named) + ".")


def _pooled(data: RunData) -> list[tuple[Trial, int]]:
    """The boots whose KV pools are compared, with their pool in tokens: speculative boots that
    measured, not the schedule's validation (its mode sizes the pool otherwise)."""
    return [(t, int(t.facts.max_total_num_tokens)) for t in data.trials
            if t.status == "ok" and t.facts.max_total_num_tokens and not t.baseline
            and t.trial_id not in SCHEDULE_IDS]


_GRAPHS_SAID: dict[str | None, str] = {"compiled": ", compiled at boot",
                                       "loaded": ", graphs from the cache"}


def _graphs(t: Trial) -> str | None:
    """"compiled" (some graph compiled at boot) or "loaded" (all from the engine's compile
    cache) where the boot's log said (records.COMPILED_GRAPHS, LOADED_GRAPHS), else None."""
    for state, key in (("compiled", COMPILED_GRAPHS), ("loaded", LOADED_GRAPHS)):
        n = t.facts.extra.get(key)
        if isinstance(n, (int, float)) and n > 0:
            return state
    return None


def _compile_split(seen: list[tuple[Trial, int]]) -> bool:
    """Whether these boots both compiled and loaded, and every compiling boot's pool is below
    every loading boot's."""
    cold = [k for t, k in seen if _graphs(t) == "compiled"]
    warm = [k for t, k in seen if _graphs(t) == "loaded"]
    return bool(cold and warm) and max(cold) < min(warm)


def blocks(data: RunData) -> list[r.Block]:
    """The trials section: the counts, the configurations best first (with why the plateau
    question booted each), the suspect trials and the ones that measured nothing."""
    out: list[r.Block] = [r.Heading(2, "Trials"), r.Para(counts(data) + ".")]
    out.append(r.Heading(3, "Configurations, best first"))
    if data.configs:
        head = ("#", "config", "n", "score (median)", "median - spread") + tuple(
            f"C={c} tok/s" for c in data.levels) + ("plateau question (why it was booted)",)
        rows = []
        for i, cf in enumerate(data.configs, start=1):
            rows.append((str(i), data.label(cf.params), str(cf.n), f"{cf.robust.median:+.3f}",
                         f"{cf.robust.score:+.3f}")
                        + tuple(fmt_tok(cf.tok_s(c)) for c in data.levels)
                        + (_plateau_why(cf),))
        out.append(r.Table(head, tuple(rows)))
        moved = kv_moves(data)
        if moved:
            out.append(r.Para(moved))
    else:
        out.append(r.Para("None."))
    out.append(r.Heading(3, "Suspect trials (left out of every figure of merit)"))
    sus = [t for t in data.trials if t.status == "ok" and t.suspect]
    out.append(r.Table(("trial", "config", "why"), tuple(
        (t.trial_id, data.label(t.params), t.suspect_why) for t in sus)) if sus
        else r.Para("None."))
    out.append(r.Heading(3, "Infeasible, failed and pruned trials"))
    bad = [t for t in data.trials if t.status != "ok"]
    out.append(r.Table(("trial", "config", "status", "reason"), tuple(
        (t.trial_id, data.label(t.params), t.status, t.reason) for t in bad)) if bad
        else r.Para("None."))
    incomplete = [t for t in data.trials if t.status == "ok" and not t.suspect
                  and t.score is None]
    if incomplete:
        out.append(r.Para("Measured but unscored (a weighted level is missing): "
                          + ", ".join(t.trial_id for t in incomplete) + "."))
    return out
