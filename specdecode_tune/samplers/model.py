"""Model-guided sampler: fit the physics of speculative decoding from the trials, boot only where
the fitted model says it pays.

Every boot of a 100B+ model costs minutes, but the trials measure far more than their score.
One trial at steps = s measures the acceptance at draft positions 1..s (the servers' per-position
histogram); its levels measure the step time at several batch sizes; its server facts measure the
KV budget. `ModelGuidedSampler` fits a small physical model to those measurements and proposes
the configuration with the largest expected improvement (EI) of the search's score. Where the
model cannot be trusted it hands the trial to its base sampler (TPE by default):

- thin data: fewer than `min_trials` finished trials, or no feasible speculative trial with
  measurements yet (nothing to fit);
- poor fit: the model's in-sample error on the measured tokens/s (all levels of all feasible
  speculative trials, predicted from the fitted acceptance, KV and step-time parts together) is
  above `max_residual` (or 1.5 noise bands, when the measured band is wider), i.e. the server
  behaves in a way the model cannot express; the base sampler then searches it as a black box;
- nothing left: every configuration the model can name was measured or is running.

The model (fitted anew before each trial; nothing but measurements goes in):

- acceptance: p_i = P(draft position i accepted | all before it), from every trial's histograms
  (`hist[j]` = verify steps that accepted exactly j drafts; each window counts as at most
  COUNT_CAP steps, since one window's steps are not independent draws). Trees (topk > 1): each
  extra candidate at a depth catches a share h of the remaining misses,
  q_i(w) = 1 - (1 - p_i)(1 - h)^(w - 1). For each h of a grid, a measured tree's widths are the
  ones that explain its histogram best (a small dynamic programme) and p is the maximum
  likelihood of all trials; the profile likelihood is h's posterior, and p given h a Beta per
  position. Positions no trial reached keep a uniform prior, so the model is honestly unsure what
  steps = 10 would accept until a trial goes that deep. An unmeasured tree puts its candidates
  greedily where they add the most expected tokens. Tokens per verify step:
  L = 1 + sum_i prod_{j<=i} q_j. A server without histograms: a constant p per chain trial from
  its acceptance length.
- KV budget: max_total_num_tokens = a * mem_fraction_static - b - c * draft_tokens (static pool
  minus weights minus per-draft-token buffers), a Gaussian posterior with broad priors on a, c >= 0;
  running limit = floor(KV / r) (r = tokens reserved per request, from the facts; a constant cap
  where the limit does not follow the KV). A KV budget below r is a refused boot. A refused boot
  also marks, by monotonicity, its neighbourhood: out of memory at (mem, n) => at every higher
  mem and n; not enough KV memory at (mem, n) => at every lower mem and higher n.
- step time, from every level: t = R * L / tok_s with R = min(concurrency, running limit), and
  t = t0 + t_moe (1 - (1 - f)^m) + t_tok ceil(m / T) T + [t_spec + t_draft s + t_dtok s R k]
      + t_pf R L,    m = R * n tokens verified,
  (fixed cost; expert streaming that saturates as more tokens touch more experts; per verified
  token, padded to a tile of T tokens; draft steps and drafted tokens; prefill amortized over the
  tokens a request produces). The coefficients are non-negative least squares on relative errors
  with a weak ridge prior; f and T are chosen on a grid by BIC; draws come from the Laplace
  posterior.
- score: the search's own, sum_c w_c log(tok_s_c / baseline_c) / sum_c w_c, from the baseline the
  search measured first.

EI is averaged over joint posterior draws (acceptance, sibling share, KV line, step-time
coefficients), with infeasible draws counting as no improvement, over every valid configuration
of the space (SGLang's rules through `space.resolve` / `space.invalid_reason`), excluding those
measured or running.

Contract with the search (JSON-compatible, keys of per-level maps are str(concurrency)):

    study.user_attrs["baseline"] = {
        "levels": {"1": {"output_tok_s": 89.9}, "16": {...}, ...},   # the no-spec baseline
        "weights": {"1": 1.0, "16": 1.0, ...},                       # the objective's weights
        "facts": {"max_total_num_tokens": 455357, "max_running_requests": 26},
        "request_tokens": 512,          # optional: input + output tokens of one request
    }
    trial.user_attrs["measured"] = {
        "status": "ok" | "infeasible" | "failed" | "pruned",
        "reason": "...",                # the server's refusal, for infeasible boots
        "params": {...},                # the resolved server settings (space.resolve)
        "facts": {"max_total_num_tokens": int | None, "max_running_requests": int | None},
        "levels": {"16": {"output_tok_s": 1903.0, "accept_length": 4.86,
                          "accept_histogram": [3, 1, 0, 2, 120]}, ...},
    }

`baseline_attr` and `measured_attr` build them from the search's records. A trial without
"measured" (e.g. a repeat answered from data) is used only as a point not to propose again.

The sampler keeps nothing between trials but its settings (the study holds the data), so it
pickles with the searcher and a fresh instance over a resumed study carries on. Its only
randomness is the posterior draws, seeded by (seed, trial number), and the base sampler's.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

import numpy as np
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.samplers import BaseSampler, TPESampler
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState
from scipy.optimize import nnls

from ..objective import RATIO_FLOOR
from ..space import (
    DRAFT,
    MEM,
    STEPS,
    TOPK,
    ParamSpec,
    invalid_reason,
    is_baseline,
    resolve,
)

MEASURED_ATTR = "measured"          # trial user attr: what the trial measured (see above)
BASELINE_ATTR = "baseline"          # study user attr: the no-speculation baseline and weights
DECISION_ATTR = "model_guided"      # trial user attr: who proposed the trial, and why
NOISE_BAND_ATTR = "noise_band"      # study user attr written by the search (measured band)
_PLAN_KEY = "model_guided:plan"     # trial system attr: the proposed point

H_GRID = np.linspace(0.0, 0.95, 39)            # sibling-hit share candidates
TILES = (1, 4, 8, 16, 32, 64, 128)             # verify padding tiles tried
ROUTES = (None, 0.01, 0.03, 0.1, 0.3)          # expert route fractions tried (None: no MoE term)
COUNT_CAP = 400                                # verify steps one level counts as, at most
FLOAT_GRID = 17                                # points of a continuous float axis
N_FEATURES = 7


# ---------------------------------------------------------------------------------- contract


def _level_entry(level: Any) -> tuple[int, dict[str, Any]] | None:
    get = level.get if isinstance(level, Mapping) else lambda k, d=None: getattr(level, k, d)
    if get("mode", "closed") != "closed" or get("suspect", False):
        return None
    hist = get("accept_histogram", ()) or ()
    accept = get("accept_length", None)
    return int(get("concurrency")), {
        "output_tok_s": float(get("output_tok_s")),
        "accept_length": None if accept is None else float(accept),
        "accept_histogram": [int(x) for x in hist],
    }


def _facts_entry(facts: Any) -> dict[str, int | None]:
    if facts is None:
        return {"max_total_num_tokens": None, "max_running_requests": None}
    get = facts.get if isinstance(facts, Mapping) else lambda k, d=None: getattr(facts, k, d)
    kv, limit = get("max_total_num_tokens", None), get("max_running_requests", None)
    return {"max_total_num_tokens": None if kv is None else int(kv),
            "max_running_requests": None if limit is None else int(limit)}


def measured_attr(*, status: str, params: Mapping[str, Any], facts: Any = None,
                  levels: Iterable[Any] = (), reason: str = "") -> dict[str, Any]:
    """The trial user attr "measured": from a TrialResult's parts (LevelSummary and ServerFacts
    objects, or mappings with the same field names). Suspect and open-loop levels are left out."""
    entries = [e for e in (_level_entry(s) for s in levels) if e is not None]
    return {
        "status": status,
        "reason": reason,
        "params": {k: v for k, v in params.items() if isinstance(v, (int, float, str, bool))
                   or v is None},
        "facts": _facts_entry(facts),
        "levels": {str(c): e for c, e in entries},
    }


def baseline_attr(*, levels: Iterable[Any], weights: Mapping[int, float], facts: Any = None,
                  request_tokens: float | None = None) -> dict[str, Any]:
    """The study user attr "baseline": the no-speculation levels, the objective's weights per
    level, the baseline server's facts, and optionally the KV tokens one request holds."""
    entries = [e for e in (_level_entry(s) for s in levels) if e is not None]
    return {
        "levels": {str(c): {"output_tok_s": e["output_tok_s"]} for c, e in entries},
        "weights": {str(int(c)): float(w) for c, w in weights.items()},
        "facts": _facts_entry(facts),
        "request_tokens": None if request_tokens is None else float(request_tokens),
    }


# ---------------------------------------------------------------------------------- observations


@dataclass(frozen=True)
class LevelObs:
    concurrency: int
    tok_s: float
    accept_length: float | None
    histogram: tuple[int, ...]


@dataclass(frozen=True)
class TrialObs:
    """One measured trial, as the model sees it."""

    steps: int
    topk: int
    draft: int
    mem: float | None
    feasible: bool
    failure: str | None            # "oom" | "kv" | "other" for refused boots
    kv: int | None
    limit: int | None
    levels: tuple[LevelObs, ...]

    @property
    def key(self) -> tuple:
        return _key(self.steps, self.topk, self.draft, self.mem)


@dataclass(frozen=True)
class BaselineObs:
    tok_s: dict[int, float]
    weights: dict[int, float]
    kv: int | None
    limit: int | None
    request_tokens: float | None


def _key(steps: int, topk: int, draft: int, mem: float | None) -> tuple:
    return (int(steps), int(topk), int(draft), None if mem is None else round(float(mem), 6))


def _failure_kind(reason: str) -> str:
    text = reason.lower()
    if "out of memory" in text or "outofmemory" in text or text.startswith("oom"):
        return "oom"
    if "not enough memory" in text or text.startswith("kv_memory"):
        return "kv"
    return "other"


def _as_mapping(value: Any) -> Mapping[str, Any] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, Mapping) else None


def parse_measured(value: Any, fallback_params: Mapping[str, Any]) -> TrialObs | None:
    """A TrialObs from the "measured" attr; None for the baseline or an unusable attr."""
    m = _as_mapping(value)
    if m is None:
        return None
    params = m.get("params") or fallback_params
    if is_baseline(params):
        return None
    try:
        steps, topk = int(params[STEPS]), int(params.get(TOPK, 1))
        draft = int(params.get(DRAFT, steps + 1))
    except (KeyError, TypeError, ValueError):
        return None
    mem = params.get(MEM)
    status = str(m.get("status", "ok"))
    facts = _as_mapping(m.get("facts")) or {}
    levels = []
    for c, e in (_as_mapping(m.get("levels")) or {}).items():
        e = _as_mapping(e)
        if e is None or e.get("output_tok_s") is None:
            continue
        hist = tuple(int(x) for x in (e.get("accept_histogram") or ()))
        accept = e.get("accept_length")
        levels.append(LevelObs(int(c), float(e["output_tok_s"]),
                               None if accept is None else float(accept), hist))
    feasible = status == "ok"
    return TrialObs(
        steps=steps, topk=topk, draft=draft, mem=None if mem is None else float(mem),
        feasible=feasible,
        failure=None if feasible or status != "infeasible"
        else _failure_kind(str(m.get("reason", ""))),
        kv=facts.get("max_total_num_tokens"), limit=facts.get("max_running_requests"),
        levels=tuple(sorted(levels, key=lambda lv: lv.concurrency)),
    )


def parse_baseline(value: Any) -> BaselineObs | None:
    m = _as_mapping(value)
    if m is None:
        return None
    tok_s = {int(c): float(e["output_tok_s"])
             for c, e in (_as_mapping(m.get("levels")) or {}).items()
             if _as_mapping(e) and e.get("output_tok_s")}
    if not tok_s:
        return None
    weights = {int(c): float(w) for c, w in (_as_mapping(m.get("weights")) or {}).items()}
    weights = {c: w for c, w in weights.items() if w > 0} or {c: 1.0 for c in tok_s}
    if any(c not in tok_s for c in weights):
        return None       # a weighted level the baseline did not measure: no score to predict
    facts = _as_mapping(m.get("facts")) or {}
    req = m.get("request_tokens")
    return BaselineObs(tok_s=tok_s, weights=weights, kv=facts.get("max_total_num_tokens"),
                       limit=facts.get("max_running_requests"),
                       request_tokens=None if req is None else float(req))


# ---------------------------------------------------------------------------------- acceptance


def tree_widths(p: Sequence[float], h: float, steps: int, topk: int,
                max_nodes: int) -> list[tuple[int, ...]]:
    """Draft nodes per depth after adding 1..max_nodes nodes greedily (index j: j + 1 nodes).

    Each node goes where it adds the most expected accepted tokens: one more candidate at an
    existing depth (at most `topk`), or the next depth. With topk = 1 this is the chain."""
    depth_max = max(0, min(steps, max_nodes, len(p)))
    widths = [0] * depth_max
    q = [0.0] * depth_max
    out: list[tuple[int, ...]] = []

    def q_of(i: int, w: int) -> float:
        return 0.0 if w == 0 else 1.0 - (1.0 - p[i]) * (1.0 - h) ** (w - 1)

    for _ in range(max_nodes):
        best, best_gain = -1, -1.0
        prefix = 1.0
        for i in range(depth_max):
            if widths[i] < topk and (i == 0 or widths[i - 1] > 0):
                tail, c = 0.0, 1.0
                for j in range(i + 1, depth_max):
                    c *= q[j]
                    if c == 0.0:
                        break
                    tail += c
                gain = prefix * (q_of(i, widths[i] + 1) - q[i]) * (1.0 + tail)
                if gain > best_gain + 1e-15:
                    best, best_gain = i, gain
            prefix *= q[i]
            if prefix == 0.0 and widths[i] == 0:
                break
        if best >= 0:
            widths[best] += 1
            q[best] = q_of(best, widths[best])
        out.append(tuple(w for w in widths if w > 0))
    return out


def accept_length(p: np.ndarray, h: np.ndarray, widths: Sequence[int]) -> np.ndarray:
    """Expected tokens per verify step for draws p (M, D) and h (M,) of a tree of `widths`."""
    d = len(widths)
    if d == 0:
        return np.ones(p.shape[0])
    w = np.asarray(widths, dtype=float)
    q = 1.0 - (1.0 - p[:, :d]) * (1.0 - h[:, None]) ** (w - 1.0)
    return 1.0 + np.cumprod(q, axis=1).sum(axis=1)


def _depth_counts(hist: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(accepted, at risk) per draft position from an exactly-j-accepted histogram, capped at
    COUNT_CAP verify steps: positions of one window are not independent draws."""
    h = np.asarray(hist, dtype=float)
    total = h.sum()
    if len(h) < 2 or total <= 0:
        return np.zeros(0), np.zeros(0)
    at_least = np.cumsum(h[::-1])[::-1]         # at_least[j] = steps with >= j accepted
    acc, risk = at_least[1:], at_least[:-1]
    scale = min(1.0, COUNT_CAP / total)
    return acc * scale, risk * scale


def _constant_p(length: float, depth: int) -> float:
    """The constant conditional acceptance whose chain of `depth` gives `length` tokens."""
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        value = 1.0 + sum(mid ** i for i in range(1, depth + 1))
        lo, hi = (mid, hi) if value < length else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class AcceptanceFit:
    """The joint posterior of (p_1..p_D, h): h on H_GRID, and p given h as independent Betas."""

    p_grid: np.ndarray              # (G, D) p's estimate given each h of the grid
    n_grid: np.ndarray              # (G, D) effective verify steps behind it
    h_post: np.ndarray              # (G,) posterior weights of H_GRID
    measured_depth: int             # positions 1..measured_depth have data

    @property
    def h_mean(self) -> float:
        return float(np.dot(H_GRID, self.h_post))

    @property
    def p_mean(self) -> np.ndarray:
        alpha, beta = self._beta()
        return (self.h_post[:, None] * alpha / (alpha + beta)).sum(axis=0)

    def _beta(self) -> tuple[np.ndarray, np.ndarray]:
        return 1.0 + self.p_grid * self.n_grid, 1.0 + (1.0 - self.p_grid) * self.n_grid

    def draws(self, rng: np.random.Generator, m: int) -> tuple[np.ndarray, np.ndarray]:
        j = rng.choice(len(H_GRID), size=m, p=self.h_post)
        alpha, beta = self._beta()
        return rng.beta(alpha[j], beta[j]), H_GRID[j]


def _ml_p(acc: np.ndarray, risk: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Per depth, the p maximising sum acc log q + (risk - acc) log(1 - q) with
    1 - q = (1 - p) g (g = (1 - h)^(w - 1): the misses the siblings do not catch).
    acc, risk: (T, D) per trial; g: (..., T, D); returns (..., D)."""
    miss = (risk - acc).sum(axis=0)
    shape = g.shape[:-2] + g.shape[-1:]
    lo, hi = np.full(shape, 1e-4), np.full(shape, 1.0 - 1e-4)
    for _ in range(30):     # the derivative falls with p: bisection
        p = (lo + hi) / 2
        q = 1.0 - (1.0 - p[..., None, :]) * g
        grad = (acc * g / np.maximum(q, 1e-12)).sum(axis=-2) - miss / (1.0 - p)
        up = grad > 0
        lo, hi = np.where(up, p, lo), np.where(up, hi, p)
    return np.where(risk.sum(axis=0) > 0, (lo + hi) / 2, 0.5)


def _loglik(acc: np.ndarray, risk: np.ndarray, g: np.ndarray, p: np.ndarray) -> np.ndarray:
    miss_p = np.clip((1.0 - p[..., None, :]) * g, 1e-12, 1.0 - 1e-12)
    return (acc * np.log1p(-miss_p) + (risk - acc) * np.log(miss_p)).sum(axis=(-2, -1))


def _implied_widths(acc: np.ndarray, risk: np.ndarray, p: np.ndarray, topk: int,
                    nodes: int) -> np.ndarray | None:
    """For each h of the grid, the widths (1..topk per depth, `nodes` in all) over the depths
    one tree trial reached that explain its histogram best, given p (G, D): a small dynamic
    programme over depths. None when no such allocation exists."""
    reached = np.nonzero(acc > 0)[0]
    d = int(reached[-1]) + 2 if len(reached) else 1      # last depth tried: one past the last hit
    d = min(d, nodes, int(np.count_nonzero(risk)) or 1)
    if not d <= nodes <= d * topk:
        return None
    g_count = p.shape[0]
    ws = np.arange(1, min(topk, nodes - d + 1) + 1)
    miss = (1.0 - p[:, :d, None]) * (1.0 - H_GRID[:, None, None]) ** (ws - 1.0)
    miss = np.clip(miss, 1e-12, 1.0 - 1e-12)
    ll = acc[:d, None] * np.log1p(-miss) + (risk[:d] - acc[:d])[:, None] * np.log(miss)
    best = np.full((g_count, nodes + 1), -np.inf)
    best[:, 0] = 0.0
    choice = np.zeros((d, g_count, nodes + 1), dtype=int)
    for i in range(d):
        new = np.full_like(best, -np.inf)
        for j, w in enumerate(ws):
            cand = np.full_like(best, -np.inf)
            cand[:, w:] = best[:, :nodes + 1 - w] + ll[:, i, j][:, None]
            better = cand > new
            new = np.where(better, cand, new)
            choice[i] = np.where(better, w, choice[i])
        best = new
    if not np.isfinite(best[:, nodes]).all():
        return None
    widths = np.ones((g_count, p.shape[1]))
    left = np.full(g_count, nodes)
    for i in reversed(range(d)):
        w = choice[i][np.arange(g_count), left]
        widths[:, i] = w
        left = left - w
    return widths


def fit_acceptance(obs: Sequence[TrialObs], depth: int) -> AcceptanceFit:
    """Per-position acceptance and the sibling share from every feasible trial's histograms.

    Chains (one candidate per depth) measure p_i directly; trees measure
    q_i = 1 - (1 - p_i)(1 - h)^(w_i - 1). For each h of the grid, alternately: each tree's
    widths that explain its histogram best, and p's maximum likelihood (three rounds). The
    profile likelihood over the grid (counts capped per window) is h's posterior."""
    rows = []
    for o in obs:
        if not o.feasible:
            continue
        a_t, r_t = np.zeros(depth), np.zeros(depth)
        for lv in o.levels:
            if lv.histogram:
                a, r = _depth_counts(lv.histogram)
            elif lv.accept_length is not None and o.topk == 1 and o.steps > 0:
                # No histogram from this server: a constant p with the measured length.
                n = min(o.steps, depth)
                p = _constant_p(lv.accept_length, n)
                a, r = np.full(n, 20.0 * p), np.full(n, 20.0)
            else:
                continue
            n = min(len(a), depth)
            a_t[:n] += a[:n]
            r_t[:n] += r[:n]
        if r_t.any():
            rows.append((o, a_t, r_t))
    grid = len(H_GRID)
    if not rows:
        return AcceptanceFit(np.full((grid, depth), 0.5), np.zeros((grid, depth)),
                             np.full(grid, 1.0 / grid), 0)
    acc = np.array([a for _, a, _ in rows])
    risk = np.array([r for _, _, r in rows])
    widths = np.ones((grid, *acc.shape))
    trees = [i for i, (o, _, _) in enumerate(rows) if o.topk > 1]
    g = np.ones_like(widths)
    p_grid = _ml_p(acc, risk, g)
    for _ in range(3 if trees else 1):
        for i in trees:
            o = rows[i][0]
            w = _implied_widths(acc[i], risk[i], p_grid, o.topk, o.draft - 1)
            if w is None:       # the histogram fits no tree of this size: read it as a chain
                w = np.ones((grid, depth))
            widths[:, i] = w
        g = (1.0 - H_GRID[:, None, None]) ** (widths - 1.0)
        p_grid = _ml_p(acc, risk, g)
    loglik = _loglik(acc, risk, g, p_grid)
    post = np.exp(loglik - loglik.max())
    h_post = post / post.sum()
    n_grid = (risk[None] * g).sum(axis=1)
    measured = int(np.max(np.nonzero(risk.sum(axis=0))[0]) + 1)
    return AcceptanceFit(p_grid=p_grid, n_grid=n_grid, h_post=h_post, measured_depth=measured)


# ---------------------------------------------------------------------------------- KV budget


@dataclass(frozen=True)
class KVFit:
    """max_total_num_tokens = a * mem - b - c * draft_tokens; running limit = floor(KV / r)."""

    mean: np.ndarray                # (a, b, c) in tokens
    cov: np.ndarray
    reserve: float | None           # tokens reserved per running request
    cap: int | None                 # a running limit that does not follow the KV budget
    points: int

    def draws(self, rng: np.random.Generator, m: int) -> np.ndarray:
        theta = rng.multivariate_normal(self.mean, self.cov, size=m, method="eigh")
        theta[:, 0] = np.maximum(theta[:, 0], 0.0)
        theta[:, 2] = np.maximum(theta[:, 2], 0.0)
        return theta

    def kv(self, theta: np.ndarray, mem: np.ndarray, n: np.ndarray) -> np.ndarray:
        return theta[..., 0:1] * mem - theta[..., 1:2] - theta[..., 2:3] * n

    def limit(self, kv: np.ndarray) -> np.ndarray:
        """The running limit (inf where the server reported none)."""
        lim = np.floor(np.maximum(kv, 0.0) / self.reserve) if self.reserve else \
            np.full(np.shape(kv), np.inf)
        return np.minimum(lim, self.cap) if self.cap else lim


def fit_kv(obs: Sequence[TrialObs], base: BaselineObs) -> KVFit:
    rows = [(o.mem if o.mem is not None else 1.0, o.draft, float(o.kv))
            for o in obs if o.feasible and o.kv]
    if not rows:
        # A server that reports no KV budget: no memory model, no running limit.
        return KVFit(mean=np.array([0.0, -1e15, 0.0]), cov=np.zeros((3, 3)), reserve=None,
                     cap=None, points=0)
    x = np.array([[m, -1.0, -n] for m, n, _ in rows])
    y = np.array([kv for _, _, kv in rows])
    scale = float(np.mean(y))
    mem_bar = float(np.mean(x[:, 0]))
    # Priors (in units of the mean KV): the pool grows with the fraction by up to tens of times
    # the KV it holds (weights fill the rest); each draft token costs up to a few tenths of it.
    mu0 = np.array([10.0 / mem_bar, 0.0, 0.05])
    sd0 = np.array([10.0 / mem_bar, 1e3, 0.15])
    sigma = 0.003                       # the facts are exact up to rounding
    prec = x.T @ x / sigma**2 + np.diag(1.0 / sd0**2)
    cov = np.linalg.inv(prec)
    mean = cov @ (x.T @ (y / scale) / sigma**2 + mu0 / sd0**2)
    pairs = [(float(o.kv), int(o.limit)) for o in obs if o.feasible and o.kv and o.limit]
    if base.kv and base.limit:
        pairs.append((float(base.kv), int(base.limit)))
    reserve, cap = _reserve(pairs)
    return KVFit(mean=mean * scale, cov=cov * scale**2, reserve=reserve, cap=cap,
                 points=len(rows))


def _reserve(pairs: Sequence[tuple[float, int]]) -> tuple[float | None, int | None]:
    """Tokens per request r with limit = floor(kv / r) for every pair; else a constant cap."""
    if not pairs:
        return None, None
    lo = max(kv / (lim + 1) for kv, lim in pairs)
    hi = min(kv / lim for kv, lim in pairs)
    if lo < hi * (1 + 1e-9):
        return (lo + hi) / 2, None
    # Not proportional: a flag caps the limit where the budget would allow more.
    cap = max(lim for _, lim in pairs)
    under = [(kv, lim) for kv, lim in pairs if lim < cap]
    if under:
        r, _ = _reserve(under)
        return r, cap
    return None, cap


# ---------------------------------------------------------------------------------- step time


def step_features(r: np.ndarray, n: np.ndarray, s: np.ndarray, k: np.ndarray, L: np.ndarray,
                  spec: np.ndarray, tile: int, route: float | None) -> np.ndarray:
    """Features of one decode iteration (see the module docstring), stacked on the last axis."""
    m = r * n
    moe = np.zeros_like(m) if route is None else 1.0 - (1.0 - route) ** m
    padded = np.ceil(m / tile - 1e-9) * tile
    return np.stack([np.ones_like(m), moe, padded, spec, spec * s, spec * s * r * k, r * L],
                    axis=-1)


@dataclass(frozen=True)
class StepFit:
    tile: int
    route: float | None
    mean: np.ndarray
    cov: np.ndarray
    rms: float                      # in-sample relative error of the step time

    def draws(self, rng: np.random.Generator, m: int) -> np.ndarray:
        theta = rng.multivariate_normal(self.mean, self.cov, size=m, method="eigh")
        return np.maximum(theta, 0.0)

    def time(self, theta: np.ndarray, feats: np.ndarray) -> np.ndarray:
        return feats @ theta


@dataclass(frozen=True)
class StepRows:
    r: np.ndarray
    n: np.ndarray
    s: np.ndarray
    k: np.ndarray
    L: np.ndarray
    spec: np.ndarray
    t: np.ndarray


def fit_step(rows: StepRows, typical: np.ndarray, t_ref: float) -> StepFit:
    """NNLS on relative errors with a ridge prior: coefficient j is a priori within about twice
    the single-stream step time at the feature's typical value; tile and route by BIC."""
    n_rows = len(rows.t)
    sd0 = 2.0 * t_ref / np.maximum(typical, 1e-9)
    best: tuple[float, StepFit] | None = None
    for tile, route in product(TILES, ROUTES):
        feats = step_features(rows.r, rows.n, rows.s, rows.k, rows.L, rows.spec, tile, route)
        xs = feats / rows.t[:, None]
        sigma = 0.02
        for _ in range(2):          # sigma from the residuals, then refit with it
            aug = np.vstack([xs, np.diag(sigma / sd0)])
            target = np.concatenate([np.ones(n_rows), np.zeros(N_FEATURES)])
            theta, _ = nnls(aug, target, maxiter=50 * N_FEATURES)
            resid = xs @ theta - 1.0
            rss = float(resid @ resid)
            sigma = max(math.sqrt(rss / max(n_rows - N_FEATURES, 1)), 0.01)
        extra = (tile > 1) + (route is not None)
        bic = n_rows * math.log(max(rss, 1e-12) / n_rows) + 2.0 * extra * math.log(n_rows)
        prec = xs.T @ xs / sigma**2 + np.diag(1.0 / sd0**2)
        fit = StepFit(tile=tile, route=route, mean=theta, cov=np.linalg.inv(prec),
                      rms=math.sqrt(rss / n_rows))
        if best is None or bic < best[0] - 1e-9:
            best = (bic, fit)
    assert best is not None
    return best[1]


# ---------------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Candidates:
    """Every valid point of the space, as arrays; `triple` indexes `triples` (steps, topk, n)."""

    sampled: tuple[dict[str, Any], ...]
    keys: tuple[tuple, ...]
    steps: np.ndarray
    topk: np.ndarray
    draft: np.ndarray
    mem: np.ndarray
    triple: np.ndarray
    triples: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class Fit:
    base: BaselineObs
    accept: AcceptanceFit
    kv: KVFit
    step: StepFit
    infeasible: tuple[tuple[str, int, float | None], ...]   # (kind, draft, mem) refused boots
    rms: float                      # in-sample error of log tok/s, the whole model
    points: int                     # feasible speculative trials used


def _step_rows(obs: Sequence[TrialObs], base: BaselineObs, kv: KVFit,
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


def fit_model(obs: Sequence[TrialObs], base: BaselineObs, cands: Candidates,
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
              points=len(spec))
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
    p, h = fit.accept.draws(rng, draws)
    kv_theta = fit.kv.draws(rng, draws)
    step_theta = fit.step.draws(rng, draws)
    # Acceptance per (draw, triple): widths from the posterior mean model.
    max_nodes = max(n for _, _, n in cands.triples) - 1
    widths_of: dict[tuple[int, int], list[tuple[int, ...]]] = {}
    L_t = np.empty((draws, len(cands.triples)))
    for j, (s, k, n) in enumerate(cands.triples):
        table = widths_of.get((s, k))
        if table is None:
            table = tree_widths(fit.accept.p_mean, fit.accept.h_mean, s, k, max_nodes)
            widths_of[(s, k)] = table
        L_t[:, j] = accept_length(p, h, table[n - 2])
    L = L_t[:, cands.triple]                                   # (draws, N)
    n = cands.draft.astype(float)
    kv = fit.kv.kv(kv_theta, cands.mem[None, :], n[None, :])    # (draws, N)
    limit = fit.kv.limit(kv)
    ok = limit >= 1
    if fit.kv.reserve:
        ok &= kv >= fit.kv.reserve
    ok &= ~ruled_out(fit, cands)[None, :]
    s = cands.steps.astype(float)
    k = cands.topk.astype(float)
    wsum = sum(fit.base.weights.values())
    score = np.zeros_like(L)
    for c, w in fit.base.weights.items():
        r = np.minimum(float(c), limit)
        if fit.base.request_tokens:
            r = np.minimum(r, np.floor(np.maximum(kv, 0) / fit.base.request_tokens))
        ok &= r >= 1
        r = np.maximum(r, 1.0)
        feats = step_features(r, n, s, k, L, np.ones_like(L), fit.step.tile, fit.step.route)
        t = np.einsum("dnf,df->dn", feats, step_theta)
        tok_s = r * L / np.maximum(t, 1e-9)
        score += w * np.log(np.maximum(tok_s / fit.base.tok_s[c], RATIO_FLOOR))
    score /= wsum
    return np.where(ok, score, -np.inf)


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


# ---------------------------------------------------------------------------------- the sampler


class ModelGuidedSampler(BaseSampler):
    """Proposes by expected improvement under a fitted model of speculative decoding.

    Args:
        base_sampler: proposes where the model does not (default `TPESampler(seed=seed)`).
        space: the experiment's searched parameters (`config.Experiment.space`); without it the
            space is read from the trials' distributions (which may not show the whole range
            of a define-by-run parameter).
        fixed: the backend's fixed flags, to resolve points as the trial will.
        min_trials: finished trials before the model may propose (the base sampler's first ones).
        max_residual: in-sample relative error of tok/s above which the model hands over.
        draws: posterior draws for EI.
        seed: seeds the draws (and the default base sampler).
    """

    def __init__(
        self,
        base_sampler: BaseSampler | None = None,
        *,
        space: Sequence[ParamSpec] | None = None,
        fixed: Mapping[str, Any] | None = None,
        min_trials: int = 2,
        max_residual: float = 0.08,
        draws: int = 48,
        seed: int | None = None,
    ) -> None:
        if base_sampler is not None and not isinstance(base_sampler, BaseSampler):
            raise TypeError(
                f"base_sampler must be an optuna BaseSampler, got {type(base_sampler).__name__}")
        if isinstance(min_trials, bool) or not isinstance(min_trials, int) or min_trials < 0:
            raise ValueError(f"min_trials must be an int >= 0, got {min_trials!r}")
        if not (isinstance(max_residual, (int, float)) and math.isfinite(max_residual)
                and max_residual > 0):
            raise ValueError(f"max_residual must be a number > 0, got {max_residual!r}")
        if isinstance(draws, bool) or not isinstance(draws, int) or draws < 8:
            raise ValueError(f"draws must be an int >= 8, got {draws!r}")
        self._base = base_sampler if base_sampler is not None else TPESampler(seed=seed)
        self._space = tuple(space) if space is not None else None
        self._fixed = dict(fixed or {})
        self._min_trials = min_trials
        self._max_residual = float(max_residual)
        self._draws = draws
        self._seed = 0 if seed is None else int(seed)
        self._cache: dict[tuple, Candidates] = {}

    def __str__(self) -> str:
        return f"ModelGuidedSampler({self._base})"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"] = {}        # derived from the space; rebuilt on demand
        return state

    @property
    def base_sampler(self) -> BaseSampler:
        return self._base

    # ------------------------------------------------------------------ Optuna hooks

    def reseed_rng(self) -> None:
        self._base.reseed_rng()

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        if len(study.directions) != 1:
            raise ValueError("ModelGuidedSampler needs a single-objective study (the scalar "
                             f"score), got {len(study.directions)} directions")
        self._base.before_trial(study, trial)
        if "fixed_params" in trial.system_attrs or _PLAN_KEY in trial.system_attrs:
            return      # an enqueued point: someone asked for it
        decision, plan = self.decide(study, trial.number)
        storage = study._storage
        storage.set_trial_user_attr(trial._trial_id, DECISION_ATTR, decision)
        if plan is not None:
            storage.set_trial_system_attr(trial._trial_id, _PLAN_KEY, plan)

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial
                                    ) -> dict[str, BaseDistribution]:
        if _stored_plan(study, trial) is not None:
            return {}
        return self._base.infer_relative_search_space(study, trial)

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if _stored_plan(study, trial) is not None:
            return {}
        return self._base.sample_relative(study, trial, search_space)

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        plan = _stored_plan(study, trial)
        if plan is not None and param_name in plan:
            value = _fit_into(plan[param_name], param_distribution)
            if value is not None:
                return value
        return self._base.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self._base.after_trial(study, trial, state, values)

    # ------------------------------------------------------------------ deciding

    def decide(self, study: Study, number: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """(the decision recorded on the trial, the planned point or None for the base)."""
        trials = study.get_trials(deepcopy=False)
        finished = [t for t in trials if t.state.is_finished()]
        if len(finished) < self._min_trials:
            return _base(f"thin data: {len(finished)} finished trial(s), the model starts "
                         f"after {self._min_trials}"), None
        base = parse_baseline(study.user_attrs.get(BASELINE_ATTR))
        if base is None:
            return _base(f"no baseline in study.user_attrs[{BASELINE_ATTR!r}]"), None
        obs = []
        for t in finished:
            o = parse_measured(t.user_attrs.get(MEASURED_ATTR), t.params)
            if o is not None:
                obs.append(o)
        cands = self._candidates(trials)
        if cands is None:
            return _base("no speculative configuration in the space"), None
        depth = int(cands.steps.max())
        fit = fit_model(obs, base, cands, depth)
        if fit is None:
            return _base("thin data: no feasible speculative trial with measurements"), None
        band = study.user_attrs.get(NOISE_BAND_ATTR)
        limit = self._max_residual
        if isinstance(band, (int, float)) and math.isfinite(band):
            limit = max(limit, 1.5 * float(band))
        if fit.rms > limit:
            return _base(f"poor fit: in-sample error {fit.rms:.1%} of tok/s > {limit:.1%}",
                         fit), None
        taken = set()
        for t in trials:
            if t.number == number or not t.params:
                continue
            taken.add(self._key_of(t.params))
        for o in obs:
            taken.add(o.key)
        free = np.array([k not in taken for k in cands.keys])
        if not free.any():
            return _base("every configuration the model can name was measured", fit), None
        rng = np.random.default_rng([self._seed, number])
        scores = score_draws(fit, cands, rng, self._draws)
        incumbent = _incumbent(study, trials)
        if incumbent is None:
            feasible = np.isfinite(scores)
            incumbent = float(np.max(np.where(feasible, scores, -np.inf).mean(0))) \
                if feasible.any() else 0.0
        feasible = np.isfinite(scores)
        gain = np.where(feasible, np.maximum(scores - incumbent, 0.0), 0.0)
        ei = gain.mean(axis=0)
        # Infeasible draws count as a very bad score in the tie-break, not as no information.
        mean = np.where(feasible, scores, -10.0).mean(axis=0)
        order = np.lexsort((-mean, -ei))          # EI first, then the mean score
        order = order[free[order]]
        best = int(order[0])
        plan = dict(cands.sampled[best])
        plan.update(_others(_incumbent_params(study, trials), known=set(plan)))
        ok = feasible[:, best]
        decision = {
            "by": "model",
            "why": f"expected improvement {ei[best]:+.4f} over {incumbent:+.4f}",
            "predicted_score": float(scores[ok, best].mean()) if ok.any() else None,
            "p_feasible": float(ok.mean()),
            "fit_error": round(fit.rms, 5),
            "tile": fit.step.tile,
            "route": fit.step.route,
            "accept_measured_to": fit.accept.measured_depth,
        }
        return decision, plan

    def _key_of(self, sampled: Mapping[str, Any]) -> tuple:
        params = resolve(sampled, self._fixed)
        if is_baseline(params):
            return ("baseline",)
        return _key(params[STEPS], params[TOPK], params[DRAFT], params.get(MEM))

    # ------------------------------------------------------------------ the space

    def _specs(self, trials: Sequence[FrozenTrial]) -> tuple[ParamSpec, ...]:
        if self._space is not None:
            return self._space
        dists: dict[str, list[BaseDistribution]] = {}
        for t in trials:
            for name, d in t.distributions.items():
                dists.setdefault(name, []).append(d)
        specs = []
        for name, ds in dists.items():
            first = ds[0]
            if isinstance(first, CategoricalDistribution):
                choices = tuple(dict.fromkeys(c for d in ds for c in d.choices))  # type: ignore
                specs.append(ParamSpec(name, "categorical", choices=choices))
            elif isinstance(first, IntDistribution):
                specs.append(ParamSpec(name, "int", low=min(d.low for d in ds),  # type: ignore
                                       high=max(d.high for d in ds),  # type: ignore
                                       step=first.step))
            elif isinstance(first, FloatDistribution):
                specs.append(ParamSpec(name, "float", low=min(d.low for d in ds),  # type: ignore
                                       high=max(d.high for d in ds),  # type: ignore
                                       step=first.step, log=first.log))
        return tuple(specs)

    def _candidates(self, trials: Sequence[FrozenTrial]) -> Candidates | None:
        specs = self._specs(trials)
        sig = (specs, tuple(sorted(self._fixed.items(), key=lambda kv: kv[0])))
        try:
            hash(sig)
        except TypeError:
            sig = (repr(specs), repr(sorted(self._fixed.items())))
        if sig in self._cache:
            return self._cache[sig]
        cands = enumerate_space(specs, self._fixed)
        if cands is not None:
            self._cache = {sig: cands}
        return cands


def _axis_values(spec: ParamSpec) -> list[Any]:
    if spec.type == "float" and not spec.step:
        if spec.log:
            lo, hi = math.log(spec.low), math.log(spec.high)
            return [math.exp(lo + (hi - lo) * i / (FLOAT_GRID - 1)) for i in range(FLOAT_GRID)]
        return spec.grid(FLOAT_GRID)
    return spec.values()


def enumerate_space(specs: Sequence[ParamSpec], fixed: Mapping[str, Any]) -> Candidates | None:
    """Every valid speculative point of the four known axes (others are not enumerated)."""
    by_name = {s.name: s for s in specs}
    names = [n for n in (STEPS, TOPK, MEM) if n in by_name]
    draft_spec = by_name.get(DRAFT)
    seen: dict[tuple, dict[str, Any]] = {}
    for combo in product(*(_axis_values(by_name[n]) for n in names)):
        sampled = dict(zip(names, combo))
        merged = {**fixed, **sampled}
        if is_baseline(merged):
            continue
        steps, topk = int(merged.get(STEPS, 3)), int(merged.get(TOPK, 1))
        drafts: list[Any] = [None]
        if topk > 1 and draft_spec is not None:
            drafts = [d for d in _axis_values(draft_spec) if d <= steps * topk + 1]
        for d in drafts:
            point = dict(sampled)
            if d is not None:
                point[DRAFT] = int(d)
            params = resolve(point, fixed)
            if invalid_reason(params) is not None:
                continue
            key = _key(params[STEPS], params[TOPK], params[DRAFT], params.get(MEM))
            seen.setdefault(key, point)
    if not seen:
        return None
    keys = tuple(seen)
    triples = tuple(sorted({k[:3] for k in keys}))
    index = {t: i for i, t in enumerate(triples)}
    return Candidates(
        sampled=tuple(seen[k] for k in keys),
        keys=keys,
        steps=np.array([k[0] for k in keys]),
        topk=np.array([k[1] for k in keys]),
        draft=np.array([k[2] for k in keys]),
        mem=np.array([1.0 if k[3] is None else k[3] for k in keys]),
        triple=np.array([index[k[:3]] for k in keys]),
        triples=triples,
    )


# ---------------------------------------------------------------------------------- helpers


def _others(incumbent_params: Mapping[str, Any] | None, known: set[str]) -> dict[str, Any]:
    """Parameters the model does not know: the incumbent's values (else the base sampler's)."""
    if not incumbent_params:
        return {}
    return {k: v for k, v in incumbent_params.items()
            if k not in known and k not in (STEPS, TOPK, DRAFT, MEM)}


def _base(why: str, fit: Fit | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"by": "base", "why": why}
    if fit is not None:
        out["fit_error"] = round(fit.rms, 5)
    return out


def _feasible(t: FrozenTrial) -> bool:
    return (t.state == TrialState.COMPLETE and t.value is not None and math.isfinite(t.value)
            and all(c <= 0 for c in t.constraints.values()))


def _incumbent_trial(study: Study, trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    sign = 1.0 if study.direction == StudyDirection.MAXIMIZE else -1.0
    feasible = [t for t in trials if _feasible(t)]
    if not feasible:
        return None
    return max(feasible, key=lambda t: (sign * float(t.value), -t.number))


def _incumbent(study: Study, trials: Sequence[FrozenTrial]) -> float | None:
    t = _incumbent_trial(study, trials)
    return None if t is None else float(t.value)


def _incumbent_params(study: Study, trials: Sequence[FrozenTrial]) -> dict[str, Any] | None:
    t = _incumbent_trial(study, trials)
    return None if t is None else dict(t.params)


def _stored_plan(study: Study, trial: FrozenTrial) -> dict[str, Any] | None:
    return study._storage.get_trial_system_attrs(trial._trial_id).get(_PLAN_KEY)


def _fit_into(value: Any, dist: BaseDistribution) -> Any:
    """`value` in `dist` (clamped, snapped); None when it cannot be."""
    if isinstance(dist, CategoricalDistribution):
        return value if value in dist.choices else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(dist, IntDistribution):
        v = min(max(round(value), dist.low), dist.high)
        return int(dist.low + round((v - dist.low) / dist.step) * dist.step)
    if isinstance(dist, FloatDistribution):
        v = min(max(float(value), dist.low), dist.high)
        if dist.step is not None:
            v = round(min(dist.low + round((v - dist.low) / dist.step) * dist.step, dist.high), 12)
        return float(v)
    return None
