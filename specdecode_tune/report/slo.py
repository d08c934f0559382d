"""Goodput and saturation in the report: the levels table, and good requests per level.

For each configuration shown (the baseline, the best, the runner-up), per closed-loop level:
tok/s, the fraction of the window's requests that met every latency target with its 95%
interval over the repeats (`stats.fraction_interval`), good requests/s, and whether the
level was saturated (GuideLLM's test, `load.saturation.saturation`) in any of its measurements, in
which case its tok/s is what an over-full queue gave, not the server's capacity.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from ..objective import goodput_s
from ..stats import fraction_interval
from . import render as r
from .figures import Figure, canvas, palette, to_png
from .rundata import Config, RunData


def _shown(data: RunData) -> list[tuple[str, Config]]:
    out: list[tuple[str, Config]] = []
    if data.baseline is not None:
        out.append(("baseline", data.baseline))
    for i, cf in enumerate(data.configs[:2]):
        out.append(("best" if i == 0 else "runner-up", cf))
    return out


def has_goodput(data: RunData) -> bool:
    return any(s.slo_good is not None for t in data.trials for s in t.levels.values())


def level_rows(data: RunData, cf: Config, c: int) -> tuple[str, ...] | None:
    levels = [t.levels[c] for t in cf.trials if c in t.levels]
    if not levels:
        return None
    tok = statistics.median(s.output_tok_s for s in levels)
    counts = [(s.slo_good, s.slo_total) for s in levels
              if s.slo_good is not None and s.slo_total is not None]
    ci = fraction_interval(counts)
    good = [g for s in levels for g in [goodput_s(s)] if g is not None]
    sat = sum(1 for s in levels if s.saturated)
    return (f"C={c}", f"{tok:.1f}",
            f"{ci[0]:.0%} [{ci[1]:.0%}, {ci[2]:.0%}]" if ci else "-",
            f"{statistics.median(good):.2f}" if good else "-",
            f"yes ({sat}/{len(levels)})" if sat else "no")


def blocks(data: RunData) -> list[r.Block]:
    """The levels table with goodput and saturation, and the definitions."""
    shown = _shown(data)
    if not shown:
        return []
    out: list[r.Block] = [r.Heading(2, "Levels: goodput and saturation")]
    exp = data.experiment
    if exp is not None and exp.objective.kind == "goodput":
        o = exp.objective
        targets = ", ".join(t for t in (
            f"TTFT <= {o.ttft_ms:g} ms" if o.ttft_ms is not None else "",
            f"TPOT <= {o.tpot_ms:g} ms" if o.tpot_ms is not None else "",
            f"p{o.percentile:g} of its chunk gaps <= {o.itl_ms:g} ms"
            if o.itl_ms is not None else "") if t)
        out.append(r.Para(
            f"Objective: goodput. A request is good when it met every target ({targets}); a "
            f"level's score is log(good requests/s / the baseline's), weighted over levels as "
            f"the tok/s score is (both floored at half a request per window). The fraction "
            f"good is shown with its 95% interval (Student's t over repeats; Wilson's for one "
            f"measurement)."))
    out.append(r.Para(
        "Saturated: GuideLLM's over-saturation test (TTFT and the requests still waiting for "
        "a first token both rising over the level, each slope's 95% margin of error under "
        "2x the slope, at least half the TTFTs over 2.5 s). A saturated level's tok/s is what "
        "a growing queue gave: not the server's capacity."))
    for name, cf in shown:
        rows = tuple(row for c in data.levels for row in [level_rows(data, cf, c)]
                     if row is not None)
        if not rows:
            continue
        out.append(r.Para(f"{name}: `{data.label(cf.params)}` ({cf.n} measurement(s))"))
        out.append(r.Table(("level", "tok/s", "fraction good [95% CI]", "good req/s",
                            "saturated"), rows))
    return out


def goodput_figure(data: RunData) -> Figure | None:
    """The fraction of requests meeting every target per level, with 95% intervals."""
    if not has_goodput(data):
        return None
    shown = _shown(data)
    fig, ax = canvas()
    colors = palette(len(shown))
    drawn = False
    for k, (name, cf) in enumerate(shown):
        xs, ys, lo, hi, sat_x, sat_y = [], [], [], [], [], []
        for c in data.levels:
            counts = [(t.levels[c].slo_good, t.levels[c].slo_total) for t in cf.trials
                      if c in t.levels and t.levels[c].slo_good is not None]
            ci = fraction_interval(counts)   # type: ignore[arg-type]
            if ci is None:
                continue
            xs.append(c)
            ys.append(ci[0])
            lo.append(ci[0] - ci[1])
            hi.append(ci[2] - ci[0])
            if any(t.levels[c].saturated for t in cf.trials if c in t.levels):
                sat_x.append(c)
                sat_y.append(ci[0])
        if not xs:
            continue
        drawn = True
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, color=colors[k],
                    label=f"{name}: {data.label(cf.params)}")
        if sat_x:
            ax.scatter(sat_x, sat_y, s=160, facecolors="none", edgecolors="red", zorder=5)
    if not drawn:
        return None
    ax.scatter([], [], s=160, facecolors="none", edgecolors="red", label="saturated level")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(data.levels), [str(c) for c in data.levels])
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("fraction of requests meeting every target")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return Figure("goodput.png", "Goodput per level",
                  "Fraction of each level's requests that met every latency target, with 95% "
                  "intervals over the repeats; red rings: saturated levels (GuideLLM's test).",
                  to_png(fig))


def figures(data: RunData) -> Sequence[Figure]:
    fig = goodput_figure(data)
    return [fig] if fig is not None else []
