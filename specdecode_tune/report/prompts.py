"""Per-request acceptance in the report: its spread per configuration, as a histogram.

A request's acceptance length is its completion tokens over its verify steps (SGLang's
`spec_verify_ct`, which the simulator imitates); only requests that completed in their
level's window without error count, at every level, over every usable measurement of a
configuration. Servers that give no per-request verify count (vLLM, llama.cpp: their counters
are per server) have no spread to show; the report says so. The request rows keep each
prompt's id, so the spread can be read back per prompt (`prompt_spread`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from .. import store
from ..stats import percentile
from . import render as r
from .figures import Figure, canvas, palette, to_png
from .rundata import Config, RunData

MAX_CONFIGS = 4


def request_acceptance(data: RunData) -> dict[str, list[float]]:
    """Per config key: the acceptance length of each usable request (completed, in window)."""
    try:
        tables = store.read_tables(data.run_dir)
    except (OSError, ValueError):
        return {}
    usable = {t.trial_id: t.config_key for t in data.trials if t.usable or
              (t.baseline and t.status == "ok")}
    cols = tables.requests.select(["trial_id", "output_tokens", "verify_ct", "in_window",
                                   "error"]).to_pydict()
    out: dict[str, list[float]] = {}
    for tid, out_tok, vct, inwin, err in zip(cols["trial_id"], cols["output_tokens"],
                                             cols["verify_ct"], cols["in_window"],
                                             cols["error"]):
        key = usable.get(tid)
        if key is None or not inwin or err is not None or not vct:
            continue
        out.setdefault(key, []).append(out_tok / vct)
    return out


def _configs(data: RunData) -> list[Config]:
    return list(data.configs[:MAX_CONFIGS])


def spread_figure(data: RunData, acc: dict[str, list[float]] | None = None) -> Figure | None:
    acc = request_acceptance(data) if acc is None else acc
    shown = [(cf, acc[cf.key]) for cf in _configs(data) if len(acc.get(cf.key, ())) >= 2]
    if not shown:
        return None
    lo = min(min(v) for _, v in shown)
    hi = max(max(v) for _, v in shown)
    bins = [lo + (hi - lo) * i / 24 for i in range(25)] if hi > lo else 10
    fig, axes = canvas(7.5, 1.6 + 1.3 * len(shown), rows=len(shown))
    axes = list(axes) if len(shown) > 1 else [axes]
    colors = palette(len(shown))
    for ax, (cf, values), color in zip(axes, shown, colors):
        ax.hist(values, bins=bins, color=color, alpha=0.8)
        med = statistics.median(values)
        ax.axvline(med, color="black", linestyle="--", linewidth=1)
        ax.set_ylabel("requests")
        ax.set_title(f"{data.label(cf.params)}: n={len(values)}, median {med:.2f}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("acceptance length of a request (completion tokens / verify steps)")
    return Figure("accept_spread.png", "Per-request acceptance, per config",
                  "Histogram of each request's acceptance length, per configuration (best "
                  "first; every level and usable measurement); dashed: the median.",
                  to_png(fig))


def blocks(data: RunData, acc: dict[str, list[float]] | None = None) -> list[r.Block]:
    acc = request_acceptance(data) if acc is None else acc
    out: list[r.Block] = [r.Heading(2, "Per-request acceptance")]
    rows = []
    for cf in _configs(data):
        v = acc.get(cf.key, [])
        if not v:
            continue
        p10, p50, p90 = (percentile(v, q) or 0.0 for q in (10, 50, 90))
        rows.append((f"`{data.label(cf.params)}`", str(len(v)), f"{p10:.2f}", f"{p50:.2f}",
                     f"{p90:.2f}", f"{p90 / max(p10, 1e-9):.2f}x"))
    if not rows:
        out.append(r.Para("No per-request acceptance: the server gives no verify count per "
                          "request (its acceptance is per level, from its counters)."))
        return out
    out.append(r.Para("Acceptance length per request (completion tokens / verify steps) over "
                      "every level and usable measurement of each configuration: its spread "
                      "says how much the prompts differ for the draft."))
    out.append(r.Table(("config", "requests", "p10", "median", "p90", "p90 / p10"),
                       tuple(rows)))
    return out


def prompt_spread(data: RunData) -> dict[str, list[float]]:
    """Per prompt id (over every usable speculative trial): each request's acceptance."""
    try:
        tables = store.read_tables(data.run_dir)
    except (OSError, ValueError):
        return {}
    usable = {t.trial_id for t in data.trials if t.usable and not t.baseline}
    cols = tables.requests.select(["trial_id", "prompt_id", "output_tokens", "verify_ct",
                                   "in_window", "error"]).to_pydict()
    out: dict[str, list[float]] = {}
    for tid, pid, out_tok, vct, inwin, err in zip(*cols.values()):
        if tid in usable and pid is not None and inwin and err is None and vct:
            out.setdefault(pid, []).append(out_tok / vct)
    return out


def figures(data: RunData, acc: dict[str, list[float]] | None = None) -> Sequence[Figure]:
    fig = spread_figure(data, acc)
    return [fig] if fig is not None else []
