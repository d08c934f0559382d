"""Plateau verdicts in words, from the measured data.

For each ordinal parameter (steps first) the curve is built from the best configuration at each
value of that parameter (best robust score among usable trials), so that a curve "against
steps" compares like with like when mem_fraction_static or topk also vary. On that curve, in log
units (score, or log tok/s per concurrency level), with the noise band:

- the *best* value and its *plateau*: the run of adjacent measured values whose figure is within
  the band of the best;
- *beyond* the plateau (the next larger value measured): worse by more than the band, so the
  plateau (or the lone best) is a *peak*; nothing measured there, so it is an *edge*: not known
  whether larger values climb;
- an *escaped* plateau: a flat run (adjacent steps within the band) below the best, left behind
  by a value better than the run by more than the band: "escaped at steps=10, by +N%";
- *probes*: values further beyond (the plateau sampler's jumps are marked as such: "(plateau
  jump)" for a probe of the score's plateau, "(plateau jump at C=1)" for one of C=1's own
  plateau, which the sampler makes under a schedule objective; that level's line marks it too).

Every step is also listed with its per-level differences, each marked "within noise" when it
is inside that level's band, so a reader sees which differences are real.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..objective import pct
from ..space import DRAFT, SHORT_NAMES, STEPS, TOPK
from .curves import Shape, curve, on_curve, shape
from .rundata import Config, RunData
from .words import band_pct, fmt_value, shorten


@dataclass(frozen=True)
class Step:
    """One step between adjacent measured values of an axis."""

    a: Any
    b: Any
    score: float                         # log difference b - a
    score_within: bool
    levels: dict[int, tuple[float, bool]]  # level -> (log difference, within its band)
    jump: bool                           # b was proposed by the plateau sampler as a jump
    jump_level: int | None = None        # ... as a probe of that level's own plateau


@dataclass(frozen=True)
class AxisVerdict:
    """What the data says about one parameter."""

    axis: str
    scope: dict[str, Any]                # settings the curve holds fixed (topk for steps)
    values: tuple[Any, ...]
    configs: tuple[Config, ...]          # the best config at each value
    kind: str                            # peak | plateau_peak | edge | plateau_edge | single
    escaped: bool                        # a plateau below the best was escaped
    best_value: Any
    plateau: tuple[Any, Any]             # (lowest, highest) value of the best's plateau
    beyond_value: Any | None             # first value measured above the plateau
    beyond_delta: float | None           # its score minus the best's (log units)
    escaped_from: tuple[Any, Any] | None
    escape_delta: float | None           # best's score minus the escaped run's top (log)
    probes: tuple[tuple[Any, float, bool], ...]   # (value, score delta vs best, was a jump)
    infeasible: tuple[tuple[Any, str], ...]       # (value, reason) of refused configs
    headline: str                        # the verdict in words, with every caveat
    summary: str                         # the same, caveats named only (for the summary)
    per_level: tuple[str, ...]
    steps: tuple[Step, ...]


def _name(axis: str) -> str:
    return SHORT_NAMES.get(axis, axis)


def jump_tag(cf: Config) -> str:
    """' (plateau jump)', ' (plateau jump at C=1)' for a probe of one level's own plateau, or
    '' where the plateau sampler did not propose this config."""
    if not cf.jump:
        return ""
    level = cf.jump_level
    return " (plateau jump)" if level is None else f" (plateau jump at C={level})"


def _diff(a: Config, b: Config, c: int) -> float | None:
    ta, tb = a.tok_s(c), b.tok_s(c)
    if ta is None or tb is None or ta <= 0 or tb <= 0:
        return None
    return math.log(tb / ta)


def level_diffs(a: Config, b: Config, data: RunData) -> str:
    """'+1.8% at C=1, within noise (±2.5%); -29.9% at C=16' for b against a."""
    parts = []
    for c in data.levels:
        d = _diff(a, b, c)
        if d is None:
            continue
        band = data.level_bands.get(c, data.band)
        within = f", within noise ({band_pct(band)})" if abs(d) <= band else ""
        parts.append(f"{pct(d)} at C={c}{within}")
    return "; ".join(parts)


def score_diff(a: Config, b: Config, data: RunData) -> str:
    d = b.robust.median - a.robust.median
    within = f", within noise ({band_pct(data.band)})" if abs(d) <= data.band else ""
    return f"score {pct(d)}{within}"


def _infeasible(data: RunData, axis: str, measured: Sequence[Any],
                where: dict[str, Any] | None = None) -> list[tuple[Any, str, str]]:
    """(value, reason, the refused settings) for each value of the axis that the server
    refused and that has no usable measurement: the holes in the curve, and why."""
    out: dict[Any, tuple[str, str]] = {}
    for t in data.trials:
        if t.status in ("infeasible", "pruned") and t.params.get(axis) is not None \
                and t.params[axis] not in measured and on_curve(t.params, axis) \
                and all(t.params.get(k) == w for k, w in (where or {}).items()):
            out.setdefault(t.params[axis], (t.reason or t.status, data.label(t.params)))
    return sorted(((v, r, lab) for v, (r, lab) in out.items()), key=lambda x: x[0])


def axis_verdict(data: RunData, axis: str) -> AxisVerdict | None:
    """The verdict on one axis, or None when no feasible configuration has it.

    Steps are judged among configs with the recommended config's topk when topk varies: a
    chain and a tree at neighbouring steps differ in more than steps."""
    where: dict[str, Any] = {}
    if axis == STEPS and TOPK in data.axes and data.best is not None:
        where = {TOPK: data.best.param(TOPK)}
    pts = curve(data, axis, where=where)
    if not pts:
        return None
    values = tuple(v for v, _ in pts)
    cfs = tuple(cf for _, cf in pts)
    ys = tuple(cf.robust.median for cf in cfs)
    cv = _Curve(data, axis, values, cfs, ys, shape(ys, data.band))
    sh, k = cv.sh, cv.sh.best
    infeasible = _infeasible(data, axis, values, where)

    parts: list[str] = []
    escaped_from = escape_delta = None
    if sh.escaped is not None:
        i, j = sh.escaped
        escaped_from, escape_delta = (values[i], values[j]), ys[k] - ys[j]
        parts.append(cv.escape(i, j))
    kind, beyond_value, beyond_delta, words = _shape_words(cv)
    parts += words
    probes, words = _probes(cv, beyond_value, beyond_delta)
    parts += words
    top = values[-1]
    refused = [x for x in infeasible
               if isinstance(x[0], (int, float)) and isinstance(top, (int, float)) and x[0] > top]
    if refused:
        # A refusal is a fact about those settings (e.g. that mem fraction), not the value.
        parts.append("refused by the server: " + ", ".join(
            f"{cv.name}={fmt_value(v)} ({shorten(r.split(':')[0], 40)}, {lab})"
            for v, r, lab in refused))
    headline, short = _caveats(parts, _mixed(data, axis, values, cfs), where)

    steps = tuple(_step(data, values, cfs, i, i + 1) for i in range(len(values) - 1))
    return AxisVerdict(
        axis=axis, scope=where, values=values, configs=cfs, kind=kind,
        escaped=sh.escaped is not None,
        best_value=values[k], plateau=(values[sh.lo], values[sh.hi]),
        beyond_value=beyond_value, beyond_delta=beyond_delta, escaped_from=escaped_from,
        escape_delta=escape_delta, probes=tuple(probes),
        infeasible=tuple((v, r) for v, r, _ in infeasible),
        headline=headline, summary=short,
        per_level=tuple(_per_level(data, axis, values, cfs, [x[0] for x in refused])),
        steps=steps)


@dataclass(frozen=True)
class _Curve:
    """One axis's curve as its verdict words it: the values, the best config at each, their
    scores (log units) and the curve's shape."""

    data: RunData
    axis: str
    values: tuple[Any, ...]
    cfs: tuple[Config, ...]
    ys: tuple[float, ...]
    sh: Shape

    @property
    def name(self) -> str:
        return _name(self.axis)

    def at(self, i: int) -> str:
        return f"{self.name}={fmt_value(self.values[i])}"

    def step(self, i: int, j: int) -> str:
        """'steps 4 -> 5 (plateau jump): <per level>; score ...': value j against value i (the
        tag when the plateau sampler proposed j as a far probe)."""
        a, b = self.cfs[i], self.cfs[j]
        return (f"{self.name} {fmt_value(self.values[i])} -> {fmt_value(self.values[j])}"
                f"{jump_tag(b)}: {level_diffs(a, b, self.data)}; "
                f"{score_diff(a, b, self.data)}")

    def against_best(self, i: int) -> str:
        """'probe at steps=10 (plateau jump): <per level>; score ... vs steps=5'."""
        best, cf = self.cfs[self.sh.best], self.cfs[i]
        word = "probe at " if cf.jump else ""
        return (f"{word}{self.at(i)}{jump_tag(cf)}: {level_diffs(best, cf, self.data)}; "
                f"{score_diff(best, cf, self.data)} vs {self.at(self.sh.best)}")

    def escape(self, i: int, j: int) -> str:
        """The escaped flat run i..j, the step onto its top and the best's gain over it."""
        k, v, cfs = self.sh.best, self.values, self.cfs
        return (f"the plateau at {self.name}={fmt_value(v[i])}..{fmt_value(v[j])} "
                f"({fmt_value(v[j - 1])} -> {fmt_value(v[j])}: "
                f"{score_diff(cfs[j - 1], cfs[j], self.data)}) was escaped at {self.at(k)}"
                f"{jump_tag(cfs[k])}: score {pct(self.ys[k] - self.ys[j])} over "
                f"{self.at(j)} ({level_diffs(cfs[j], cfs[k], self.data)})")


def _shape_words(cv: _Curve) -> tuple[str, Any | None, float | None, list[str]]:
    """The curve's kind (single, peak, edge, plateau_peak, plateau_edge), the first value
    measured beyond the best or its plateau with its score against the best's, and the
    sentences that say so."""
    sh, k, n = cv.sh, cv.sh.best, len(cv.values)
    above = sh.above(n)
    if n == 1:
        return "single", None, None, [
            f"only {cv.at(0)} was measured (feasible, not suspect): no curve to judge"]
    if sh.lo == sh.hi:
        if above is not None:
            return "peak", cv.values[above], cv.ys[above] - cv.ys[k], [
                f"{cv.step(k, above)}: {cv.at(k)} is the peak"]
        lead = ""
        # After an escape the step onto the best was just described.
        if k > 0 and (sh.escaped is None or sh.escaped[1] != k - 1):
            lead = f"{cv.step(k - 1, k)}; "
        return "edge", None, None, [
            f"{lead}{cv.at(k)} is the best and the largest value measured: not known whether "
            f"larger values climb"]
    lo, hi = sh.lo, sh.hi
    parts = [f"{cv.step(hi - 1, hi)}: a plateau at "
             f"{cv.name}={fmt_value(cv.values[lo])}..{fmt_value(cv.values[hi])} "
             f"(best {cv.at(k)})"]
    if above is not None:
        parts.append(f"{cv.against_best(above)}: the plateau is a peak")
        return "plateau_peak", cv.values[above], cv.ys[above] - cv.ys[k], parts
    parts.append(f"nothing measured beyond {cv.at(hi)}: not known whether the plateau "
                 f"is a peak")
    return "plateau_edge", None, None, parts


def _probes(cv: _Curve, beyond_value: Any | None, beyond_delta: float | None
            ) -> tuple[list[tuple[Any, float, bool]], list[str]]:
    """(value, score delta vs the best, was a jump) of the values measured beyond the plateau
    (the first one, then every sampler jump and the farthest value), and the sentences on the
    ones further out."""
    n = len(cv.values)
    above = cv.sh.above(n)
    if above is None:
        return [], []
    probes: list[tuple[Any, float, bool]] = []
    if beyond_value is not None and beyond_delta is not None:   # set together
        probes.append((beyond_value, beyond_delta, cv.cfs[above].jump))
    # Values further out: every sampler jump, and the farthest value measured.
    far = [i for i in range(above + 1, n) if cv.cfs[i].jump or i == n - 1]
    parts = []
    for i in far:
        probes.append((cv.values[i], cv.ys[i] - cv.ys[cv.sh.best], cv.cfs[i].jump))
        parts.append(cv.against_best(i))
    return probes, parts


def _caveats(parts: Sequence[str], mixed: str, where: dict[str, Any]) -> tuple[str, str]:
    """(headline, summary): the sentences with every caveat, and with the caveats named only;
    both scoped to `where` (the settings the curve holds fixed) where it holds any."""
    parts = list(parts)
    short = "; ".join(parts)
    if mixed:
        parts.append(f"caution: the curve's configs also differ in {mixed}")
        short += f"; caution: the curve's configs also differ in " \
                 f"{', '.join(m.split(' (')[0] for m in mixed.split('; '))}"
    if where:
        scope = "among " + " ".join(f"{_name(k)}={fmt_value(w)}" for k, w in where.items()) \
            + " configs: "
        parts[0] = scope + parts[0]
        short = scope + short
    return "; ".join(parts), short


def _mixed(data: RunData, axis: str, values: Sequence[Any], cfs: Sequence[Config]) -> str:
    """'mem (0.92 at steps=3, 0.88 at steps=4..5)' when the best config at each value differs
    in another varying setting: part of a difference along the curve may come from it."""
    out = []
    name = _name(axis)
    for other in data.axes:
        if other == axis or (other == DRAFT and axis != DRAFT):
            continue
        seq = [cf.param(other) for cf in cfs]
        if len({fmt_value(v) for v in seq}) <= 1:
            continue
        runs: list[tuple[Any, Any, Any]] = []      # (setting, first value, last value)
        for v, x in zip(values, seq):
            if runs and fmt_value(runs[-1][0]) == fmt_value(x):
                runs[-1] = (runs[-1][0], runs[-1][1], v)
            else:
                runs.append((x, v, v))
        where = ", ".join(
            f"{fmt_value(x)} at {name}={fmt_value(a)}"
            + (f"..{fmt_value(b)}" if b != a else "") for x, a, b in runs)
        out.append(f"{_name(other)} ({where})")
    return "; ".join(out)


def _step(data: RunData, values: Sequence[Any], cfs: Sequence[Config], i: int, j: int) -> Step:
    d = cfs[j].robust.median - cfs[i].robust.median
    levels = {}
    for c in data.levels:
        x = _diff(cfs[i], cfs[j], c)
        if x is not None:
            levels[c] = (x, abs(x) <= data.level_bands.get(c, data.band))
    return Step(a=values[i], b=values[j], score=d, score_within=abs(d) <= data.band,
                levels=levels, jump=cfs[j].jump, jump_level=cfs[j].jump_level)


def _per_level(data: RunData, axis: str, values: Sequence[Any], cfs: Sequence[Config],
               refused: Sequence[Any] = ()) -> list[str]:
    """One sentence per concurrency level: where that level's curve peaks or plateaus, with the
    plateau sampler's probes of that level's own plateau marked."""
    name = _name(axis)
    out = []
    for c in data.levels:
        measured = [(i, tok) for i, cf in enumerate(cfs) for tok in [cf.tok_s(c)]
                    if tok is not None and tok > 0]
        if len(measured) < 2:
            continue
        idx = [i for i, _ in measured]
        vs = [values[i] for i in idx]
        ys = [math.log(tok) for _, tok in measured]
        band = data.level_bands.get(c, data.band)
        sh = shape(ys, band)
        k = sh.best
        # This level's own probes (jumps found on its plateau), marked.
        own = [jump_tag(cfs[i]) if cfs[i].jump_level == c else "" for i in idx]
        mentioned = {k}
        best_txt = f"{name}={fmt_value(vs[k])}{own[k]} ({cfs[idx[k]].tok_s(c):.0f} tok/s)"
        if sh.lo == sh.hi:
            s = f"C={c}: best at {best_txt}"
        else:
            s = (f"C={c}: plateau at {name}={fmt_value(vs[sh.lo])}..{fmt_value(vs[sh.hi])} "
                 f"(within {band_pct(band)}), best at {best_txt}")
        if sh.escaped is not None:
            i, j = sh.escaped
            s += (f"; the plateau at {name}={fmt_value(vs[i])}..{fmt_value(vs[j])} was "
                  f"escaped by {pct(ys[k] - ys[j])}")
        above = sh.above(len(ys))
        if above is not None:
            mentioned.add(above)
            s += (f"; {name}={fmt_value(vs[above])}{own[above]}: {pct(ys[above] - ys[k])}: "
                  f"{'the plateau is' if sh.lo != sh.hi else 'it is'} a peak")
            if len(ys) - 1 > above:
                mentioned.add(len(ys) - 1)
                s += f"; {name}={fmt_value(vs[-1])}{own[-1]}: {pct(ys[-1] - ys[k])}"
        else:
            s += "; nothing larger measured"
            if refused:
                s += f" ({name}={', '.join(fmt_value(v) for v in refused)} refused)"
        for i in range(len(ys)):
            if i not in mentioned and own[i]:
                s += f"; probe at {name}={fmt_value(vs[i])}{own[i]}: {pct(ys[i] - ys[k])}"
        out.append(s)
    return out


def verdicts(data: RunData) -> list[AxisVerdict]:
    """A verdict for each ordinal parameter that varies, steps first."""
    out = []
    for axis in data.axes:
        v = axis_verdict(data, axis)
        if v is not None:
            out.append(v)
    return out
