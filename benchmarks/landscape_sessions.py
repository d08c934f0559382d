"""A recorded table's boots by the session that booted them, scored three ways.

The replay (`landscapes.py`) scores a point by its repeats' mean tok/s over the mean of every
boot of the baseline: right when one machine booted them all. A table recorded over several
device sessions gets a machine a session, and two H100s of one kind need not run at one speed.
Here each boot is scored twice, with the replay's objective (`landscapes.score`):

- **own**: over the baseline its own session booted (the mean of them, where it booted more
  than one); none where that session booted no baseline;
- **table**: over the table's mean baseline, as the replay scores it.

and, for each point booted in two or more sessions, the spread of its boots' scores (the largest
minus the smallest, log units) under each. Where the own-baseline spread is the smaller, the
sessions' machines differ and the table's ranking carries which session booted which point;
where it is not, two boots of one point differ by more than their machines do. Every two boots
of one point are then split by whether one session booted both (`pair_gaps`): one machine's
noise against a machine's way with the point on top of it (vLLM's H100 table has no pair in
one session, so it cannot split the two; llama.cpp's H200 table 1.076x in one, 1.085x across).

The baseline is one boot a session, as noisy as any: last, the sessions' machines are fitted
from every point two sessions share (`machine_fit`: per level, log tok/s = the point's effect +
its session's, least squares), each point scored with them taken out (`calibrated_scores`), and
a leave-one-out check says whether the fit predicts a held-out boot better than the point's
other boots do (`leave_one_out`). On vLLM's H100 table (2026-12-08) it did by 3% (rms 0.257
against 0.265 log, per level), on SGLang's not at all (0.097 against 0.091): the sessions'
machines differed (0.77-1.31x), but not by one factor a machine, and the replay keeps the
table's mean.

    python benchmarks/landscape_sessions.py benchmarks/data/vllm-gpu-h100.parquet

A session is the recorder's (one per `record_landscape.py` run, its `sessions` metadata): a row
belongs to the last session that started before its boot (`started_at`). Sessions carry no
machine id before 2026-12-07's fourth vLLM session (`machine.boot_id` after), so a restart on
the same warm machine counts as a session of its own here.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from landscapes import compiled_at_boot, read_meta, scored, session_index

from specdecode_tune.config.experiment import experiment_from_dict
from specdecode_tune.space import STEPS


@dataclass(frozen=True)
class SessionBoot:
    session: int             # the recorder's session (1 = the table's first; 0: none said)
    point: dict[str, Any]
    repeat: int
    compiled: bool | None    # the boot compiled the engine's graphs (None: not recorded)
    kv_tokens: int | None
    tok_s: dict[int, float]
    own: float | None = None     # score over its own session's baseline
    table: float | None = None   # score over the table's mean baseline


def _mean(boots: Sequence[Mapping[int, float]]) -> dict[int, float]:
    levels = set.intersection(*(set(b) for b in boots)) if boots else set()
    return {c: statistics.fmean(b[c] for b in boots) for c in sorted(levels)}


def _weights(meta: Mapping[str, Any]) -> dict[int, float]:
    """The objective's level weights of the experiment the table recorded."""
    return experiment_from_dict(meta["experiment"], where="the table's metadata"
                                ).level_weights()


def _pid(point: Mapping[str, Any]) -> str:
    return json.dumps(dict(point), sort_keys=True)


def _speculative(point: Mapping[str, Any]) -> bool:
    return int(point.get(STEPS, 0)) > 0


def session_boots(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any],
                  weights: Mapping[int, float] | None = None) -> list[SessionBoot]:
    """Every measured boot of the table, in the order booted, scored both ways (with the
    table's own objective weights unless given)."""
    weights = _weights(meta) if weights is None else weights
    starts = sorted(dt.datetime.fromisoformat(s["started_utc"]).timestamp()
                    for s in meta.get("sessions", []) if s.get("started_utc"))
    by_boot: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: r.get("started_at") or 0.0):
        if r.get("status") == "ok" and r.get("output_tok_s"):
            by_boot.setdefault((r["point"], int(r["repeat"])), []).append(r)
    boots = []
    for (pid, repeat), rs in by_boot.items():
        i = session_index(rs[0].get("started_at"), starts)
        boots.append(SessionBoot(0 if i is None else i + 1, json.loads(pid), repeat,
                                 compiled_at_boot(rs[0]), rs[0].get("max_total_num_tokens"),
                                 {int(r["concurrency"]): float(r["output_tok_s"]) for r in rs}))
    bases: dict[int, list[dict[int, float]]] = {}
    for b in boots:
        if not _speculative(b.point):
            bases.setdefault(b.session, []).append(b.tok_s)
    table_base = _mean([t for ts in bases.values() for t in ts])
    return [dataclasses.replace(b, own=scored(b.tok_s, _mean(bases.get(b.session, [])), weights),
                                table=scored(b.tok_s, table_base, weights)) for b in boots]


@dataclass(frozen=True)
class Spread:
    point: dict[str, Any]
    sessions: tuple[int, ...]
    own: float | None     # largest minus smallest own score (None: a session had no baseline)
    table: float


def _width(xs: Sequence[float | None]) -> float | None:
    known = [x for x in xs if x is not None]
    return max(known) - min(known) if known and len(known) == len(xs) else None


def _scored_by_point(boots: Sequence[SessionBoot]) -> dict[str, list[SessionBoot]]:
    """The speculative boots with a table score, by point."""
    out: dict[str, list[SessionBoot]] = {}
    for b in boots:
        if _speculative(b.point) and b.table is not None:
            out.setdefault(_pid(b.point), []).append(b)
    return out


def _sessions_by_point(boots: Sequence[SessionBoot]) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for b in boots:
        out.setdefault(_pid(b.point), set()).add(b.session)
    return out


def spreads(boots: Sequence[SessionBoot]) -> list[Spread]:
    """For each speculative point booted in two or more sessions, its boots' score spread."""
    return [Spread(bs[0].point, tuple(b.session for b in bs), _width([b.own for b in bs]),
                   _width([b.table for b in bs]) or 0.0)
            for bs in _scored_by_point(boots).values() if len({b.session for b in bs}) >= 2]


def pair_gaps(boots: Sequence[SessionBoot]) -> tuple[list[float], list[float]]:
    """Every two boots of one speculative point: the gap between their scores (log units),
    (those in one session, those across two). One session's pairs are one machine's boot-to-
    boot noise; across sessions a machine's way with the point comes on top of it."""
    same: list[float] = []
    cross: list[float] = []
    for bs in _scored_by_point(boots).values():
        for i, a in enumerate(bs):
            for b in bs[i + 1:]:
                assert a.table is not None and b.table is not None
                (same if a.session == b.session else cross).append(abs(a.table - b.table))
    return same, cross


@dataclass(frozen=True)
class MachineFit:
    """Per level, log tok/s = the point's effect + its session's (least squares over every
    measured boot): the sessions' machines fitted from every point two sessions share, not
    from the baseline alone. A tiny ridge on the session effects pins what the boots cannot
    (a session that shares no point with the others is taken as the average machine)."""

    sessions: dict[int, dict[int, float]]      # session -> level -> effect (log)
    points: dict[str, dict[int, float]]        # point id -> level -> effect (log)


RIDGE = 1e-3


def machine_fit(boots: Sequence[SessionBoot]) -> MachineFit:
    pids = sorted({_pid(b.point) for b in boots})
    sess = sorted({b.session for b in boots})
    col = {p: i for i, p in enumerate(pids)} | {s: len(pids) + j for j, s in enumerate(sess)}
    out_s: dict[int, dict[int, float]] = {s: {} for s in sess}
    out_p: dict[str, dict[int, float]] = {p: {} for p in pids}
    for c in sorted({c for b in boots for c in b.tok_s}):
        rows = [b for b in boots if b.tok_s.get(c, 0) > 0]
        x = np.zeros((len(rows) + len(sess), len(pids) + len(sess)))
        y = np.zeros(len(rows) + len(sess))
        for i, b in enumerate(rows):
            x[i, col[_pid(b.point)]] = 1.0
            x[i, col[b.session]] = 1.0
            y[i] = math.log(b.tok_s[c])
        for j in range(len(sess)):
            x[len(rows) + j, len(pids) + j] = math.sqrt(RIDGE)
        beta = np.linalg.lstsq(x, y, rcond=None)[0]
        seen = {_pid(b.point) for b in rows}
        for i, p in enumerate(pids):
            if p in seen:
                out_p[p][c] = float(beta[i])
        for j, s in enumerate(sess):
            out_s[s][c] = float(beta[len(pids) + j])
    return MachineFit(out_s, out_p)


def unlinked(boots: Sequence[SessionBoot]) -> set[int]:
    """The sessions that booted no point another session booted too."""
    shared = {s for ss in _sessions_by_point(boots).values() if len(ss) > 1 for s in ss}
    return {b.session for b in boots} - shared


def calibrated_scores(fit: MachineFit, weights: Mapping[int, float]) -> dict[str, float]:
    """Each point's score with the machines taken out: its effects over the baseline's, the
    objective (`landscapes.scored`) over the levels; points missing a weighted level left
    out."""
    effects = {p: {c: math.exp(v) for c, v in e.items()} for p, e in fit.points.items()}
    base = next((e for p, e in effects.items() if not _speculative(json.loads(p))), None)
    if base is None:
        return {}
    return {p: v for p, e in effects.items() if _speculative(json.loads(p))
            and (v := scored(e, base, weights)) is not None}


def leave_one_out(boots: Sequence[SessionBoot]) -> tuple[int, float, float] | None:
    """Does fitting the machines predict a boot better than not? Each boot of a point booted
    in two or more sessions, held out at each level: predicted by the mean log tok/s of the
    point's other boots (the table's view), and by the fit of the others (the point's effect
    plus the held-out boot's session's). (boot-levels, rms error of each), None where no point
    was booted in two sessions."""
    sessions_of = _sessions_by_point(boots)
    plain: list[float] = []
    fitted: list[float] = []
    for i, b in enumerate(boots):
        if len(sessions_of[_pid(b.point)]) < 2:
            continue
        rest = [o for j, o in enumerate(boots) if j != i]
        fit = machine_fit(rest)
        for c, v in b.tok_s.items():
            others = [math.log(o.tok_s[c]) for o in rest
                      if _pid(o.point) == _pid(b.point) and o.tok_s.get(c, 0) > 0]
            point_e = fit.points.get(_pid(b.point), {}).get(c)
            if not others or point_e is None or v <= 0:
                continue
            plain.append(math.log(v) - statistics.fmean(others))
            fitted.append(math.log(v) - point_e - fit.sessions.get(b.session, {}).get(c, 0.0))
    if not plain:
        return None
    rms = [math.sqrt(statistics.fmean(e * e for e in errs)) for errs in (plain, fitted)]
    return len(plain), rms[0], rms[1]


def _short(point: Mapping[str, Any]) -> str:
    """steps first, then the other axes: "num_steps=4 mem_fraction_static=0.0125"."""
    return " ".join(f"{k.replace('speculative_', '')}={v}"
                    for k, v in sorted(point.items(), key=lambda kv: (kv[0] != STEPS, kv[0])))


def _x(v: float | None) -> str:
    return "-" if v is None else f"{math.exp(v):.3f}x"


def report(path: str, say: Any = print) -> int:
    meta = read_meta(path)        # ValueError: not a table the recorder wrote
    weights = _weights(meta)
    boots = session_boots(pq.read_table(path).to_pylist(), meta, weights)
    say(f"{path}: {len(boots)} measured boots in {len({b.session for b in boots})} "
        f"session(s); scores: the objective over the session's own baseline, and over the "
        f"table's mean baseline (the replay's)")
    say(f"{'session':>7}  {'point':<34} {'rep':>3} {'compiled':>8} {'KV tokens':>10}  "
        f"{'tok/s per level':<28} {'own':>7} {'table':>7}")
    for b in boots:
        levels = " / ".join(f"{b.tok_s[c]:,.0f}" for c in sorted(b.tok_s))
        comp = "-" if b.compiled is None else ("yes" if b.compiled else "no")
        say(f"{b.session:>7}  {_short(b.point):<34} {b.repeat + 1:>3} {comp:>8} "
            f"{b.kv_tokens if b.kv_tokens is not None else '-':>10}  {levels:<28} "
            f"{_x(b.own):>7} {_x(b.table):>7}")
    sp = spreads(boots)
    if not sp:
        say("no point was booted in two sessions: nothing to compare")
        return 0
    say("points booted in two or more sessions (spread: largest over smallest boot score):")
    for s in sp:
        say(f"  {_short(s.point):<34} sessions {','.join(map(str, s.sessions)):<6} own "
            f"{_x(s.own):>7}  table {_x(s.table):>7}")
    both = [s for s in sp if s.own is not None]
    if both:
        say(f"median spread over the {len(both)} point(s) with a baseline in each session: "
            f"own {_x(statistics.median(s.own for s in both if s.own is not None))}, table "
            f"{_x(statistics.median(s.table for s in both))}")
    same, cross = pair_gaps(boots)
    say("two boots of one point, the gap between their scores (median): "
        + (f"in one session {_x(statistics.median(same))} over {len(same)} pair(s)" if same
           else "no point was booted twice in one session, so the table cannot tell a "
                "machine's way with a point from a boot's noise")
        + (f"; across sessions {_x(statistics.median(cross))} over {len(cross)}" if cross
           else ""))
    machines(boots, weights, say)
    return 0


def machines(boots: Sequence[SessionBoot], weights: Mapping[int, float], say: Any = print
             ) -> None:
    """The third scoring: the sessions' machines fitted from every shared point
    (`machine_fit`), and whether that predicts a boot better than the table's mean does."""
    fit = machine_fit(boots)
    say("the sessions' machines, fitted (log tok/s = point + session, per level; the shared "
        "points link the sessions): each session's speed per level over the average machine")
    alone = unlinked(boots)
    for s, eff in fit.sessions.items():
        say(f"  session {s}: " + ", ".join(f"C={c} {math.exp(e):.2f}x"
                                           for c, e in sorted(eff.items()))
            + ("  (shares no point with another session: its machine is not known, taken "
               "as the average)" if s in alone else ""))
    cal = sorted(calibrated_scores(fit, weights).items(), key=lambda kv: -kv[1])
    if cal:
        say("scores with the machines taken out (calibrated), best first: " + "; ".join(
            f"{_short(json.loads(p))} {math.exp(v):.3f}x" for p, v in cal))
    loo = leave_one_out(boots)
    if loo is not None:
        n, plain, fitted = loo
        say(f"leave one out, over {n} boot-levels of the points booted in two or more "
            f"sessions: rms error of log tok/s {plain:.3f} predicted by the point's other "
            f"boots, {fitted:.3f} with the machines fitted ({abs(1 - fitted / plain):.0%} "
            f"{'less' if fitted <= plain else 'more'})")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("table", help="a Parquet table record_landscape.py wrote")
    args = ap.parse_args(argv)
    if not Path(args.table).is_file():
        print(f"landscape_sessions: {args.table}: no such file", file=sys.stderr)
        return 2
    try:
        return report(args.table)
    except ValueError as e:
        print(f"landscape_sessions: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
