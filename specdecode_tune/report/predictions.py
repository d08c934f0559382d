"""Predicted against measured: what the sampler's model said of each config before its boot.

The default sampler (`samplers.HybridSampler`) proposes by a model fitted to what the trials
measured; the search records, at proposal time, what that model predicts for the point it is
about to boot (the trials table's `predicted` column: tok/s per level, acceptance length, the
score, the share of posterior draws in which the server accepts the boot). Nothing measured
after the proposal goes into it. This module puts each config's first measurement beside that
prediction, and the median error, so the claim "the model knows" can be checked from the run.

The error of one level is predicted / measured - 1 (tok/s); the median is over every level of
every config with a prediction that was measured. A config the model predicted refused but that
ran (or the reverse) is listed with its p_feasible.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import store
from . import render as r
from .rundata import RunData, Trial


@dataclass(frozen=True)
class Row:
    trial: Trial
    predicted: dict[str, Any] | None
    errors: dict[int, float]          # per level: predicted / measured - 1

    def predicted_tok_s(self, c: int) -> float | None:
        tok = (self.predicted or {}).get("tok_s") or {}
        v = tok.get(str(c))
        return float(v) if isinstance(v, (int, float)) else None


def _predictions(run_dir: str) -> dict[str, dict[str, Any]]:
    """trial id -> its recorded prediction (the trials table's `predicted` column)."""
    table = store.read_table(run_dir, "trials")
    if "predicted" not in table.column_names:
        return {}
    out = {}
    for row in table.select(["trial_id", "predicted"]).to_pylist():
        raw = row["predicted"]
        if not raw:
            continue
        try:
            pred = json.loads(raw)
        except ValueError:
            continue
        if isinstance(pred, dict):
            out[row["trial_id"]] = pred
    return out


def rows(data: RunData, predictions: Mapping[str, dict[str, Any]] | None = None) -> list[Row]:
    """Each config's first boot (not the baseline), in the order they finished."""
    preds = _predictions(data.run_dir) if predictions is None else predictions
    out = []
    seen: set[str] = set()
    for t in sorted(data.trials, key=lambda t: t.order):
        if t.baseline or t.config_key in seen:
            continue
        seen.add(t.config_key)
        pred = preds.get(t.trial_id)
        row = Row(t, pred, {})
        errors = {}
        for c, lv in t.levels.items():
            p = row.predicted_tok_s(c)
            if p is not None and lv.output_tok_s and lv.output_tok_s > 0 and t.status == "ok":
                errors[c] = p / lv.output_tok_s - 1.0
        out.append(Row(t, pred, errors))
    return out


def median_error(rs: list[Row]) -> float | None:
    """The median |predicted / measured - 1| over every predicted and measured level."""
    errs = [abs(e) for row in rs for e in row.errors.values()]
    return statistics.median(errs) if errs else None


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _accept(t: Trial) -> float | None:
    vals = [lv.accept_length for lv in t.levels.values() if lv.accept_length is not None]
    return statistics.fmean(vals) if vals else None


def blocks(data: RunData) -> list[r.Block]:
    rs = rows(data)
    out: list[r.Block] = [r.Heading(2, "Predicted before the boot, against measured")]
    predicted = [row for row in rs if row.predicted is not None]
    if not predicted:
        out.append(r.Para("No trial carries a prediction (the sampler has no model, or no "
                          "fit existed before any boot)."))
        return out
    med = median_error(rs)
    out.append(r.Para(
        f"For each configuration's first boot: what the sampler's model, fitted to the trials "
        f"finished before it was proposed, predicted (tok/s per level, acceptance length, "
        f"the share of posterior draws in which the server accepts the boot), beside what was "
        f"measured. {len(predicted)} of {len(rs)} configurations had a prediction; median "
        f"error of tok/s over their measured levels: "
        f"{'-' if med is None else f'{med:.1%}'}."))
    head = ("trial", "config", "status", "p(boots)") + tuple(
        f"C={c} tok/s predicted / measured (error)" for c in data.levels) + (
        "accept predicted / measured",)
    table = []
    for row in rs:
        t, pred = row.trial, row.predicted or {}
        cells = []
        for c in data.levels:
            lv = t.levels.get(c)
            p = row.predicted_tok_s(c)
            m = lv.output_tok_s if lv is not None else None
            cells.append(f"{'-' if p is None else f'{p:.1f}'} / "
                         f"{'-' if m is None else f'{m:.1f}'} ({_pct(row.errors.get(c))})")
        pa, ma = pred.get("accept_length"), _accept(t)
        pf = pred.get("p_feasible")
        table.append((t.trial_id, data.label(t.params), t.status,
                      "-" if not isinstance(pf, (int, float)) else f"{pf:.0%}", *cells,
                      f"{'-' if pa is None else f'{pa:.2f}'} / "
                      f"{'-' if ma is None else f'{ma:.2f}'}"))
    out.append(r.Table(head, tuple(table)))
    return out
