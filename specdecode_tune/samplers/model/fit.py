"""The whole model, fitted from the trials, and what it predicts: tok/s, the score, refusals.

`fit_model` fits the acceptance, KV and step-time parts (`acceptance`, `kv`, `steptime`) anew
from the measurements and measures its in-sample error: the measured tok/s of every level of
every feasible speculative trial, each predicted by the three parts together. The score it
predicts is the search's own, sum_c w_c log(tok_s_c / baseline_c) / sum_c w_c, from the baseline
the search measured first. `score_draws` draws it jointly over the posteriors (acceptance,
sibling share, KV line, step-time coefficients) for every candidate, -inf where a draw says the
server would refuse the boot. A refused boot also marks, by monotonicity, its neighbourhood
(`ruled_out`): out of memory at (mem, n) => at every higher mem and n; not enough KV memory at
(mem, n) => at every lower mem and higher n; and the out-of-memory boundary line fitted to the
refusals and the boots that ran (`oom`) refuses the points above it in each draw.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...objective import RATIO_FLOOR
from ..observations import Baseline
from .acceptance import AcceptanceFit, accept_length, fit_acceptance, tree_widths
from .candidates import Candidates
from .kv import KVFit, fit_kv
from .oom import OOMFit, fit_oom
from .steptime import N_FEATURES, StepFit, StepRows, fit_step, step_features
from .trials import TrialObs


@dataclass(frozen=True)
class Fit:
    base: Baseline
    accept: AcceptanceFit
    kv: KVFit
    step: StepFit
    infeasible: tuple[tuple[str, int, float | None], ...]   # (kind, draft, mem) refused boots
    rms: float                      # in-sample error of log tok/s, the whole model
    points: int                     # feasible speculative trials used
    oom: OOMFit | None = None       # the out-of-memory boundary, once a boot ran out


def _step_rows(obs: Sequence[TrialObs], base: Baseline, kv: KVFit,
               accept: AcceptanceFit) -> StepRows:
    cols: dict[str, list[float]] = {k: [] for k in ("r", "n", "s", "k", "L", "spec", "t")}

    def add(r: float, n: int, s: int, k: int, L: float, spec: float, tok_s: float) -> None:
        if r < 1 or tok_s <= 0:
            return
        for name, v in zip(cols, (r, n, s, k, L, spec, r * L / tok_s)):
            cols[name].append(float(v))

    for c, tok_s in base.tok_s.items():
        add(_running(c, base.limit, base.kv, base.request_tokens), 1, 0, 1, 1.0, 0.0, tok_s)
    for o in obs:
        if not o.feasible:
            continue
        widths = tree_widths(accept.p_mean, accept.h_mean, o.steps, o.topk, o.draft - 1)[-1]
        predicted = float(accept_length(accept.p_mean[None, :], np.array([accept.h_mean]),
                                        widths)[0])
        for lv in o.levels:
            L = lv.accept_length if lv.accept_length else predicted
            add(_running(lv.concurrency, o.limit, o.kv, base.request_tokens), o.draft, o.steps,
                o.topk, L, 1.0, lv.tok_s)
    return StepRows(**{k: np.array(v) for k, v in cols.items()})


def _running(c: int, limit: float | None, kv: float | None,
             request_tokens: float | None) -> float:
    r = float(c)
    if limit:
        r = min(r, limit)
    if kv and request_tokens:
        r = min(r, kv // request_tokens)
    return r


def fit_model(obs: Sequence[TrialObs], base: Baseline, cands: Candidates,
              depth: int) -> Fit | None:
    """The whole model from the trials; None where there is nothing speculative to fit."""
    spec = [o for o in obs if o.feasible and o.levels]
    if not spec:
        return None
    accept = fit_acceptance(obs, depth)
    kv = fit_kv(obs, base)
    rows = _step_rows(obs, base, kv, accept)
    # Typical feature values over the candidates at their levels (scales for the priors).
    r, n, s, k = np.broadcast_arrays(
        np.minimum(np.array(sorted(base.weights), dtype=float), 32.0)[:, None],
        cands.draft[None, :].astype(float), cands.steps[None, :].astype(float),
        cands.topk[None, :].astype(float))
    typ = step_features(r, n, s, k, np.full(r.shape, 3.0), np.ones(r.shape), 1, 0.1)
    typical = np.median(typ.reshape(-1, N_FEATURES), axis=0)
    t_ref = float(np.min(rows.t[rows.spec == 0])) if np.any(rows.spec == 0) else \
        float(np.min(rows.t))
    step = fit_step(rows, typical, t_ref)
    infeasible = tuple((o.failure, o.draft, o.mem) for o in obs
                       if not o.feasible and o.failure in ("oom", "kv"))
    fit = Fit(base=base, accept=accept, kv=kv, step=step, infeasible=infeasible, rms=0.0,
              points=len(spec), oom=fit_oom(obs))
    return dataclasses.replace(fit, rms=_in_sample_rms(fit, spec))


def _in_sample_rms(fit: Fit, spec: Sequence[TrialObs]) -> float:
    """Relative error of log tok/s of the measured levels, each predicted by the whole model."""
    errs = []
    for o in spec:
        pred = predict_levels(fit, o.steps, o.topk, o.draft, o.mem)
        if pred is None:
            errs.extend([1.0] * len(o.levels))      # predicted refused, but it ran
            continue
        for lv in o.levels:
            if lv.concurrency in pred and lv.tok_s > 0:
                errs.append(math.log(max(pred[lv.concurrency], 1e-9) / lv.tok_s))
    return math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else 0.0


def predict_levels(fit: Fit, steps: int, topk: int, draft: int, mem: float | None
                   ) -> dict[int, float] | None:
    """Mean-model tok/s per level of one configuration (None: predicted refused)."""
    m = np.array([1.0 if mem is None else float(mem)])
    kv = fit.kv.kv(fit.kv.mean[None, :], m, np.array([float(draft)]))[0]
    if fit.kv.reserve and kv[0] < fit.kv.reserve:
        return None
    limit = float(fit.kv.limit(kv)[0])
    kv_tokens = float(kv[0])
    widths = tree_widths(fit.accept.p_mean, fit.accept.h_mean, steps, topk, draft - 1)[-1]
    L = float(accept_length(fit.accept.p_mean[None, :], np.array([fit.accept.h_mean]),
                            widths)[0])
    out = {}
    for c in fit.base.tok_s:
        r = _running(c, limit, kv_tokens, fit.base.request_tokens)
        if r < 1:
            return None
        feats = step_features(np.array(r), np.array(float(draft)), np.array(float(steps)),
                              np.array(float(topk)), np.array(L), np.array(1.0),
                              fit.step.tile, fit.step.route)
        t = float(feats @ fit.step.mean)
        out[c] = r * L / t if t > 0 else 0.0
    return out


def score_draws(fit: Fit, cands: Candidates, rng: np.random.Generator, draws: int
                ) -> np.ndarray:
    """Posterior draws of the search's score for every candidate: (draws, N); -inf = refused."""
    return score_of(fit, *level_draws(fit, cands, rng, draws))


def score_of(fit: Fit, levels: dict[int, np.ndarray], ok: np.ndarray) -> np.ndarray:
    """The search's score of `level_draws`' output: (draws, N); -inf = refused."""
    wsum = sum(fit.base.weights.values())
    score = np.zeros(ok.shape)
    for c, w in fit.base.weights.items():
        score += w * np.maximum(levels[c] - np.log(fit.base.tok_s[c]), math.log(RATIO_FLOOR))
    score /= wsum
    return np.where(ok, score, -np.inf)


def level_draws(fit: Fit, cands: Candidates, rng: np.random.Generator, draws: int
                ) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """Posterior draws of log tok/s at every level for every candidate ({c: (draws, N)}), and
    where the draw boots at all ((draws, N) bool)."""
    p, h = fit.accept.draws(rng, draws)
    kv_theta = fit.kv.draws(rng, draws)
    step_theta = fit.step.draws(rng, draws)
    # Acceptance per (draw, triple): widths from the posterior mean model.
    max_nodes = max(n for _, _, n in cands.triples) - 1
    widths_of: dict[tuple[int, int], list[tuple[int, ...]]] = {}
    L_t = np.empty((draws, len(cands.triples)))
    for j, (steps, topk, nodes) in enumerate(cands.triples):
        table = widths_of.get((steps, topk))
        if table is None:
            table = tree_widths(fit.accept.p_mean, fit.accept.h_mean, steps, topk, max_nodes)
            widths_of[(steps, topk)] = table
        L_t[:, j] = accept_length(p, h, table[nodes - 2])
    L = L_t[:, cands.triple]                                   # (draws, N)
    n = cands.draft.astype(float)
    kv = fit.kv.kv(kv_theta, cands.mem[None, :], n[None, :])    # (draws, N)
    limit = fit.kv.limit(kv)
    ok = limit >= 1
    if fit.kv.reserve:
        ok &= kv >= fit.kv.reserve
    ok &= ~ruled_out(fit, cands)[None, :]
    if fit.oom is not None:
        alpha, beta = fit.oom.draws(rng, draws)
        ok &= ~fit.oom.refused(alpha, beta, cands.mem, n)
    s = cands.steps.astype(float)
    k = cands.topk.astype(float)
    out: dict[int, np.ndarray] = {}
    for c in fit.base.weights:
        r = np.minimum(float(c), limit)
        if fit.base.request_tokens:
            r = np.minimum(r, np.floor(np.maximum(kv, 0) / fit.base.request_tokens))
        ok &= r >= 1
        r = np.maximum(r, 1.0)
        feats = step_features(r, n, s, k, L, np.ones_like(L), fit.step.tile, fit.step.route)
        t = np.einsum("dnf,df->dn", feats, step_theta)
        out[c] = np.log(np.maximum(r * L / np.maximum(t, 1e-9), 1e-12))
    return out, ok


def ruled_out(fit: Fit, cands: Candidates) -> np.ndarray:
    """Candidates a refused boot rules out by monotonicity in memory fraction and draft tokens."""
    out = np.zeros(len(cands.draft), dtype=bool)
    mem = cands.mem
    for kind, draft, m in fit.infeasible:
        m = 1.0 if m is None else m
        more_draft = cands.draft >= draft
        if kind == "oom":
            out |= more_draft & (mem >= m - 1e-9)
        else:
            out |= more_draft & (mem <= m + 1e-9)
    return out
