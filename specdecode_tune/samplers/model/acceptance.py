"""Acceptance: how many drafted tokens a verify step accepts, from the servers' histograms.

p_i = P(draft position i accepted | all before it), from every trial's histograms (`hist[j]` =
verify steps that accepted exactly j drafts; each window counts as at most COUNT_CAP steps,
since one window's steps are not independent draws). Trees (topk > 1): each extra candidate at a
depth catches a share h of the remaining misses, q_i(w) = 1 - (1 - p_i)(1 - h)^(w - 1). For each
h of a grid, a measured tree's widths are the ones that explain its histogram best (a small
dynamic programme) and p is the maximum likelihood of all trials; the profile likelihood is h's
posterior, and p given h a Beta per position over an exchangeable prior: a position no trial
reached is expected to accept about as the measured ones do, a little less (`PRIOR_SHRINK`),
with a spread wide enough (`PRIOR_WEIGHT` pseudo-steps) that the model is unsure what
steps = 10 would accept until a trial goes that deep, yet does not expect every unmeasured
position to be a coin flip (a uniform prior made it crawl one step deeper per boot). An
unmeasured tree puts its candidates greedily where they add the most expected tokens. Tokens per
verify step: L = 1 + sum_i prod_{j<=i} q_j. A server without histograms: a constant p per chain
trial from its acceptance length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .trials import TrialObs

H_GRID = np.linspace(0.0, 0.95, 39)            # sibling-hit share candidates
COUNT_CAP = 400                                # verify steps one level counts as, at most
# Pseudo-steps of the prior of a position: a position no trial reached is expected to accept
# about as the measured ones do (EAGLE's and n-gram drafts' conditional acceptance changes
# slowly with depth), with a spread wide enough for a cliff (a hard token) to be a surprise the
# first boot that reaches it measures, not a certainty the model rules out.
PRIOR_WEIGHT = 4.0
# ... and its mean is drawn part of the way to 0.5: deeper positions accept less, as a rule
# (a draft's errors compound), so the prior leans that way without knowing by how much.
PRIOR_SHRINK = 0.3


def tree_widths(p: Sequence[float] | np.ndarray, h: float, steps: int, topk: int,
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

    def mean_length(self, steps: int, topk: int, draft: int) -> float:
        """The mean model's acceptance length (tokens per verify step) of one configuration."""
        widths = tree_widths(self.p_mean, self.h_mean, steps, topk, draft - 1)[-1]
        return float(accept_length(self.p_mean[None, :], np.array([self.h_mean]), widths)[0])

    def _beta(self) -> tuple[np.ndarray, np.ndarray]:
        """Beta posteriors per (h, position): the measured counts over an exchangeable prior
        (`PRIOR_WEIGHT` pseudo-steps at the measured positions' mean acceptance)."""
        a0, b0 = self._prior()
        return a0 + self.p_grid * self.n_grid, b0 + (1.0 - self.p_grid) * self.n_grid

    def _prior(self) -> tuple[np.ndarray, np.ndarray]:
        """Per h of the grid, the Beta prior of every position: mean = the count-weighted mean
        acceptance of the measured positions, drawn PRIOR_SHRINK of the way to 0.5 (clipped
        to [0.05, 0.95]), weight PRIOR_WEIGHT; uniform (Beta(1, 1)) before any position is
        measured."""
        n = self.n_grid.sum(axis=1)
        m = np.where(n > 0, (self.p_grid * self.n_grid).sum(axis=1) / np.maximum(n, 1e-12), 0.5)
        m = (1.0 - PRIOR_SHRINK) * m + PRIOR_SHRINK * 0.5
        m = np.clip(m, 0.05, 0.95)
        w = np.where(n > 0, PRIOR_WEIGHT, 2.0)
        return (w * m)[:, None], (w * (1.0 - m))[:, None]

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
