"""The report's figures, drawn with matplotlib's Agg canvas (no display, no pyplot state).

Each function returns a `Figure` value (file name, caption, PNG bytes) or None when the run has
no data for it. Curves "against steps" use the best configuration at each steps value (per topk
when several were tried), the same rule the verdicts use, and say so in their captions.

`canvas`, `palette` and `to_png` are public: the workload's sections (`slo.py`, `prompts.py`)
draw their figures with them, so every figure has the same size, colours and byte-stable PNG.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure as MplFigure
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import blended_transform_factory

from ..space import STEPS, TOPK
from .curves import curve
from .rundata import Config, RunData
from .words import band_pct, describe

DPI = 110
_MARKERS = ("o", "s", "^", "D", "v", "P")
_STYLES = ("-", "--", "-.", ":")


@dataclass(frozen=True)
class Figure:
    name: str       # file name, e.g. "tok_s_vs_steps.png"
    title: str
    caption: str
    png: bytes


def canvas(width: float = 7.5, height: float = 4.5, rows: int = 1) -> tuple[MplFigure, Any]:
    """A figure on its own Agg canvas (no pyplot state) and its axes: one, or `rows` sharing x."""
    fig = MplFigure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 1, sharex=True) if rows > 1 else fig.subplots()
    return fig, axes


def to_png(fig: MplFigure) -> bytes:
    """The figure as PNG bytes."""
    buf = io.BytesIO()
    # No timestamps in the metadata, so the same data gives the same bytes.
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def palette(n: int) -> list[Any]:
    """`n` colours, one a line (a level, a configuration)."""
    # Distinct hues for up to ten levels (a sequential map made neighbours hard to tell apart).
    from matplotlib import colormaps
    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    cmap = colormaps["viridis"]
    return [cmap(0.05 + 0.9 * i / max(1, n - 1)) for i in range(n)]


def _topks(data: RunData) -> list[Any]:
    return sorted({cf.param(TOPK) for cf in data.configs if cf.param(STEPS) is not None},
                  key=lambda v: (v is None, v))


def _series(data: RunData) -> list[tuple[Any, list[tuple[Any, Config]]]]:
    """(topk or None, [(steps, best config)]) per topk when several were tried."""
    topks = _topks(data)
    if len(topks) <= 1:
        return [(None, curve(data, STEPS))]
    return [(k, curve(data, STEPS, where={TOPK: k})) for k in topks]


def _refused(data: RunData) -> list[tuple[Any, str]]:
    out: dict[Any, str] = {}
    for t in data.trials:
        if t.status in ("infeasible", "pruned") and t.params.get(STEPS) is not None:
            out.setdefault(t.params[STEPS], t.reason or t.status)
    return sorted(out.items())


def _mark_refused(ax: Any, refused: Sequence[tuple[Any, str]]) -> None:
    """Infeasible steps values as red x at the bottom of the axes, with the reason."""
    if not refused:
        return
    tr = blended_transform_factory(ax.transData, ax.transAxes)
    for i, (v, reason) in enumerate(refused):
        ax.plot([v], [0.03], marker="x", color="red", markersize=9, mew=2, transform=tr,
                clip_on=False, linestyle="none",
                label="infeasible (refused by the server)" if i == 0 else None)
        short = reason.split(":")[0][:24]
        ax.annotate(short, (v, 0.06), xycoords=tr, fontsize=7, color="red", rotation=90,
                    va="bottom", ha="center")


def _steps_caption(data: RunData, what: str) -> str:
    rule = ("At each steps value the curve uses the best configuration measured there (best "
            "robust score), so that steps are compared like with like")
    varying = [a for a in data.axes if a != STEPS]
    if varying:
        rule += f" while {', '.join(varying)} also vary"
    return f"{what} {rule}."


def tok_s_vs_steps(data: RunData) -> Figure | None:
    series = [(k, pts) for k, pts in _series(data) if pts]
    if not series:
        return None
    fig, ax = canvas(9.0 if len(series) > 1 else 7.5, 4.8)
    colors = dict(zip(data.levels, palette(len(data.levels))))
    for si, (topk, pts) in enumerate(series):
        for c in data.levels:
            # (steps, median tok/s, config, (min, max) tok/s) where measured at c
            keep = [(x, y, cf, r) for x, cf in pts
                    for y, r in [(cf.tok_s(c), cf.tok_s_range(c))]
                    if y is not None and r is not None]
            if not keep:
                continue
            label = f"C={c}" + (f", topk={topk}" if topk is not None else "")
            ax.plot([k[0] for k in keep], [k[1] for k in keep], color=colors[c],
                    linestyle=_STYLES[si % len(_STYLES)], marker=_MARKERS[si % len(_MARKERS)],
                    label=label)
            lo = [k[3][0] for k in keep]
            hi = [k[3][1] for k in keep]
            if any(h > l_ for l_, h in zip(lo, hi)):
                ax.fill_between([k[0] for k in keep], lo, hi, color=colors[c], alpha=0.18,
                                linewidth=0)
            for x, _, cf, _ in keep:
                if cf.jump:
                    ax.plot([x], [cf.tok_s(c)], marker="*", color="black", markersize=11,
                            linestyle="none")
    labelled = False
    for c in data.levels:
        b = data.base_tok_s(c)
        if b:
            ax.axhline(b, color=colors[c], linestyle=(0, (4, 3)), linewidth=1, alpha=0.8,
                       label=None if labelled else "no-speculation baseline (per level)")
            labelled = True
    _mark_refused(ax, _refused(data))
    ax.set_yscale("log")
    ax.set_xlabel("speculative_num_steps")
    ax.set_ylabel("output tokens/s (log scale)")
    ax.set_title("Throughput against steps, per concurrency level")
    ax.grid(True, which="both", alpha=0.3)
    # Outside the axes: with several topks the lines fill the plot.
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return Figure("tok_s_vs_steps.png", "Output tokens/s against speculative_num_steps",
                  _steps_caption(data, "One line per concurrency level (line style per topk "
                                 "when several were tried); shaded: min-max over repeats; "
                                 "dashed horizontal lines: the no-speculation baseline at the "
                                 "same level, in the level's colour; black stars: plateau "
                                 "jumps; red x: infeasible steps values."), to_png(fig))


def accept_vs_steps(data: RunData) -> Figure | None:
    series = [(k, pts) for k, pts in _series(data) if pts]
    if not any(cf.accept(c) is not None for _, pts in series for _, cf in pts
               for c in data.levels):
        return None
    fig, ax = canvas()
    colors = dict(zip(data.levels, palette(len(data.levels))))
    xs_all: set[Any] = set()
    for si, (topk, pts) in enumerate(series):
        for c in data.levels:
            keep = [(v, cf.accept(c)) for v, cf in pts if cf.accept(c) is not None]
            if not keep:
                continue
            xs_all.update(v for v, _ in keep)
            ax.plot([k[0] for k in keep], [k[1] for k in keep], color=colors[c],
                    linestyle=_STYLES[si % len(_STYLES)], marker=_MARKERS[si % len(_MARKERS)],
                    label=f"C={c}" + (f", topk={topk}" if topk is not None else ""))
    xs = sorted(xs_all)
    ax.plot(xs, [x + 1 for x in xs], color="gray", linestyle=":", label="steps + 1 (all "
            "drafts accepted)")
    ax.set_xlabel("speculative_num_steps")
    ax.set_ylabel("acceptance length (tokens per verify)")
    ax.set_title("Acceptance length against steps")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncols=2)
    return Figure("accept_vs_steps.png", "Acceptance length against speculative_num_steps",
                  _steps_caption(data, "Median acceptance length of each level's measurement "
                                 "window; dotted: the ceiling steps + 1."), to_png(fig))


def kv_vs_steps(data: RunData) -> Figure | None:
    ok = [t for t in data.trials if t.status == "ok" and not t.baseline
          and t.params.get(STEPS) is not None]
    if not any(t.facts.max_total_num_tokens or t.facts.max_running_requests for t in ok):
        return None
    fig, (ax1, ax2) = canvas(7.5, 6.0, rows=2)
    series = [(k, pts) for k, pts in _series(data) if pts]
    others = [a for a in data.axes if a not in (STEPS, TOPK, "speculative_num_draft_tokens")]
    for ax, attr, label in ((ax1, "max_total_num_tokens", "max_total_num_tokens (KV tokens)"),
                            (ax2, "max_running_requests", "max_running_requests")):
        pts_all = [(t.params[STEPS], getattr(t.facts, attr)) for t in ok
                   if getattr(t.facts, attr) is not None]
        if pts_all:
            ax.scatter([p[0] for p in pts_all], [p[1] for p in pts_all], color="lightgray",
                       s=18, label="every trial", zorder=1)
        for si, (topk, pts) in enumerate(series):
            keep = [(v, cf.fact(attr), cf) for v, cf in pts if cf.fact(attr) is not None]
            if keep:
                ax.plot([k[0] for k in keep], [k[1] for k in keep],
                        marker=_MARKERS[si % len(_MARKERS)],
                        linestyle=_STYLES[si % len(_STYLES)], zorder=2,
                        label="best config per steps" + (f", topk={topk}" if topk else ""))
                # The KV pool follows mem_fraction_static as much as steps: name it per point.
                if others:
                    for x, y, cf in keep:
                        ax.annotate(describe(cf.params, only=others), (x, y), fontsize=6,
                                    xytext=(4, 4), textcoords="offset points")
        base = data.baseline.fact(attr) if data.baseline is not None else None
        if base:
            ax.axhline(base, color="black", linestyle=(0, (4, 3)), linewidth=1,
                       label="no-speculation baseline")
        if attr == "max_running_requests" and data.levels:
            ax.axhline(max(data.levels), color="red", linestyle=":", linewidth=1,
                       label=f"highest measured concurrency ({max(data.levels)})")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    _mark_refused(ax2, _refused(data))
    ax2.set_xlabel("speculative_num_steps")
    ax1.set_title("KV-cache pressure against steps")
    return Figure("kv_vs_steps.png", "KV-cache pressure against speculative_num_steps",
                  _steps_caption(data, "What the server reported after boot: its KV pool "
                                 "(max_total_num_tokens) and running-request limit; where the "
                                 "limit falls under a level's concurrency, that level "
                                 "queues."), to_png(fig))


def pareto(data: RunData) -> Figure | None:
    if len(data.levels) < 2 or not data.configs:
        return None
    lo_c, hi_c = data.levels[0], data.levels[-1]
    pts = [(cf, x, y) for cf in data.configs
           for x, y in [(cf.tok_s(lo_c), cf.tok_s(hi_c))] if x is not None and y is not None]
    if not pts:
        return None
    front = [p for p in pts if not any(q[1] >= p[1] and q[2] >= p[2] and (q[1], q[2]) !=
                                       (p[1], p[2]) for q in pts)]
    front.sort(key=lambda p: p[1])
    fig, ax = canvas()
    best = data.best
    for cf, x, y in pts:
        on = any(cf is f[0] for f in front)
        xr, yr = cf.tok_s_range(lo_c), cf.tok_s_range(hi_c)
        if xr is None or yr is None:   # not reached: a median implies a range
            continue
        ax.errorbar([x], [y], xerr=[[x - xr[0]], [xr[1] - x]], yerr=[[y - yr[0]], [yr[1] - y]],
                    fmt="o" if on else ".", color="C1" if on else "gray",
                    markersize=7 if on else 5, elinewidth=0.8, capsize=2)
        ax.annotate(describe(cf.params, only=list(data.axes) or None), (x, y),
                    fontsize=6, xytext=(3, 3), textcoords="offset points",
                    color="black" if on else "dimgray")
    ax.plot([p[1] for p in front], [p[2] for p in front], color="C1", linewidth=1.2,
            label="Pareto front")
    if best is not None and best.tok_s(lo_c) and best.tok_s(hi_c):
        ax.plot([best.tok_s(lo_c)], [best.tok_s(hi_c)], marker="o", markersize=14,
                markerfacecolor="none", markeredgecolor="C3", linestyle="none",
                label="recommended (best score)")
    bx, by = data.base_tok_s(lo_c), data.base_tok_s(hi_c)
    if bx and by:
        ax.plot([bx], [by], marker="*", markersize=13, color="black", linestyle="none",
                label="no-speculation baseline")
    ax.margins(0.12)   # room for the labels of the outermost points
    ax.set_xlabel(f"single-stream tokens/s (C={lo_c})")
    ax.set_ylabel(f"aggregate tokens/s (C={hi_c})")
    ax.set_title(f"Pareto front: C={lo_c} against C={hi_c}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return Figure("pareto.png", f"Pareto front of C={lo_c} against C={hi_c} throughput",
                  "Each point is a configuration (median over its repeats, bars min-max), "
                  "labelled with its settings; orange: not beaten at both levels by any "
                  "other configuration.", to_png(fig))


def history(data: RunData) -> Figure | None:
    trials = [t for t in data.trials if not t.baseline]
    if not trials:
        return None
    fig, ax = canvas(7.5, 4.0)
    xs, ys, best_x, best_y = [], [], [], []
    best = -math.inf
    for n, t in enumerate(trials, start=1):
        if t.usable and t.score is not None:   # usable implies a score
            xs.append(n)
            ys.append(t.score)
            best = max(best, t.score)
        if best > -math.inf:
            best_x.append(n)
            best_y.append(best)
    ax.scatter(xs, ys, s=20, color="C0", label="trial score", zorder=2)
    if best_x:
        ax.step(best_x, best_y, where="post", color="C3", label="best so far", zorder=1)
    tr = blended_transform_factory(ax.transData, ax.transAxes)
    marked = {"jump": False, "infeasible": False, "suspect": False, "repeat": False}
    for n, t in enumerate(trials, start=1):
        if t.jump_reason:
            if t.usable:
                ax.plot([n], [t.score], marker="^", markersize=11, color="C2",
                        linestyle="none", zorder=3)
            # The vertical line carries the legend: a refused jump has no score to mark.
            ax.axvline(n, color="C2", linestyle=":", linewidth=1,
                       label=None if marked["jump"] else "plateau jump")
            marked["jump"] = True
        if t.status != "ok":
            ax.plot([n], [0.03], marker="x", color="red", markersize=9, mew=2, transform=tr,
                    clip_on=False, linestyle="none",
                    label=None if marked["infeasible"] else f"{t.status} (no score)")
            marked["infeasible"] = True
        elif t.suspect and t.score is not None:
            # A suspect figure must not set the scale the real ones are read on.
            ax.plot([n], [t.score], marker="o", markerfacecolor="none", color="gray",
                    linestyle="none", scalex=False, scaley=False,
                    label=None if marked["suspect"] else "suspect (ignored)")
            marked["suspect"] = True
        elif t.repeat > 0 and t.usable:
            ax.plot([n], [t.score], marker="o", markersize=9, markerfacecolor="none",
                    color="C0", linestyle="none",
                    label=None if marked["repeat"] else "re-measurement")
            marked["repeat"] = True
    ax.axhline(0.0, color="black", linestyle=(0, (4, 3)), linewidth=1,
               label="no-speculation baseline (score 0)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial (in order of completion)")
    ax.set_ylabel("score (weighted mean log-speedup)")
    ax.set_title("Search history")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return Figure("history.png", "Search history",
                  f"Score of each trial and the best so far; a score of 0 is the baseline and "
                  f"+0.1 is about +10%. Green: the plateau sampler's jumps; red x: trials "
                  f"without a score (infeasible, failed, pruned); hollow grey: suspect "
                  f"trials, left out (and off the scale when far from the rest). Noise band "
                  f"{band_pct(data.band)}.", to_png(fig))


def all_figures(data: RunData) -> list[Figure]:
    """Every figure the data supports, in reading order."""
    out = []
    for fn in (tok_s_vs_steps, accept_vs_steps, kv_vs_steps, pareto, history):
        fig = fn(data)
        if fig is not None:
            out.append(fig)
    return out
