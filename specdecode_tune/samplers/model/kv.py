"""KV budget: how many tokens of KV cache a configuration gets, and how many requests run.

max_total_num_tokens = a * mem_fraction_static - b - c * draft_tokens (static pool minus weights
minus per-draft-token buffers), a Gaussian posterior with broad priors on a, c >= 0, from the
servers' facts; running limit = floor(KV / r) (r = tokens reserved per request, from the facts; a
constant cap where the limit does not follow the KV). A KV budget below r is a refused boot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..observations import Baseline
from .trials import TrialObs


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


def fit_kv(obs: Sequence[TrialObs], base: Baseline) -> KVFit:
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
