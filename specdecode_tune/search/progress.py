"""Live progress of a search on stdout: a line when a trial starts, one per finished level, one
per finished trial with the incumbent.

`Progress` is the Tune callback that prints them; `describe` is the short form of a point
(`steps=4 topk=1 draft=5 mem=0.8`), `short_reason` a failure's reason cut to one live line
(`REASON_CHARS`; the trials table and the report keep it whole), `say` the one way the search
prints a line.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ray.tune import Callback

from ..config import Experiment
from ..objective import pct
from ..space import SHORT_NAMES
from .searcher import BRACKET_KEY, JUMP_KEY, PLATEAU_ANSWER_KEY, REPEAT_KEY

REASON_CHARS = 100      # a reason on a live line; the table and the report keep it whole


def say(line: str) -> None:
    print(line, flush=True)


class Progress(Callback):
    """A Tune callback printing live progress to stdout."""

    def __init__(self, exp: Experiment, total: int) -> None:
        self.exp = exp
        self.total = total
        self.done = 0
        self.best: tuple[float, str] | None = None
        self.t0 = time.monotonic()

    def _label(self, trial: Any) -> str:
        return describe(trial.config)

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        jump = trial.config.get(JUMP_KEY)
        rep = trial.config.get(REPEAT_KEY, 0)
        extra = f"  [re-measure #{rep + 1}]" if rep else ""
        extra += f"  [plateau jump: {jump}]" if jump else ""
        bracket = trial.config.get(BRACKET_KEY)
        extra += f"  [plateau {bracket}]" if bracket else ""
        say(f"  start  {trial.trial_id}  {self._label(trial)}{extra}")
        try:
            answered = json.loads(trial.config.get(PLATEAU_ANSWER_KEY) or "[]")
        except (TypeError, ValueError):
            answered = []
        for sentence in answered:
            say(f"         [plateau, answered by the model without a boot: {sentence}]")

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                        **info: Any) -> None:
        if "level" in result and "feasible" not in result:
            acc = result.get("level_accept")
            acc_s = f", accept {acc:.2f}" if acc is not None else ""
            err = result.get("level_errors") or 0
            err_s = f", {err} errors" if err else ""
            prec = result.get("level_precision")
            prec_s = f" +-{prec:.1%}" if prec is not None else ""
            took = result.get("level_s")
            took_s = f", {took:.1f} s" if took is not None else ""
            say(f"  level  {trial.trial_id}  C={result['level']:<3d} "
                f"{result['level_tok_s']:8.1f} tok/s{prec_s}{acc_s}{err_s}{took_s}")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.done += 1
        r = trial.last_result or {}
        label = self._label(trial)
        if r.get("feasible") and "score" in r:
            score = float(r["score"])
            if self.best is None or score > self.best[0]:
                self.best = (score, label)
            what = f"score {score:+.3f} ({pct(score)} vs baseline)"
        elif r.get("feasible"):
            what = "done"
        else:
            what = f"{r.get('status', 'failed')}: {short_reason(r.get('reason', ''))}"
        inc = (f" | best {pct(self.best[0])}: {self.best[1]}" if self.best else "")
        say(f"trial {self.done:>3}  {trial.trial_id}  {label}  -> {what}{inc}  "
            f"[{time.monotonic() - self.t0:.0f}s]")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        say(f"trial {trial.trial_id} raised an error (see its log in Tune's dir)")


def short_reason(reason: str, limit: int = REASON_CHARS) -> str:
    """A reason short enough for one live line: its first line, cut at a word boundary with
    an ellipsis where it is longer than `limit`."""
    text = " ".join((reason or "").strip().splitlines()[:1][0].split()) if reason else ""
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    space = cut.rfind(" ")
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:.(") + "…"


def describe(params: dict[str, Any], fixed: dict[str, Any] | None = None) -> str:
    """Short form of a point: the speculative triple first, then the rest; settings equal to
    the experiment's fixed flags are left out."""
    order = {k: i for i, k in enumerate(SHORT_NAMES)}
    parts = []
    for k in sorted(params, key=lambda k: (order.get(k, len(order)), k)):
        v = params[k]
        if k.startswith("_") or (fixed and k in fixed and fixed[k] == v):
            continue
        if k == "speculative_num_steps" and v == 0:
            return "no speculation (baseline)"
        v = f"{v:.3g}" if isinstance(v, float) else v
        parts.append(f"{SHORT_NAMES.get(k, k)}={v}")
    return " ".join(parts) or "baseline"
