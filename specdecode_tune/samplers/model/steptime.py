"""Step time: how long one decode iteration takes, from every level of every trial.

t = R * L / tok_s with R = min(concurrency, running limit), and

    t = t0 + t_moe (1 - (1 - f)^m) + t_tok ceil(m / T) T + [t_spec + t_draft s + t_dtok s R k]
        + t_pf R L,    m = R * n tokens verified

(fixed cost; expert streaming that saturates as more tokens touch more experts; per verified
token, padded to a tile of T tokens; draft steps and drafted tokens; prefill amortized over the
tokens a request produces). The coefficients are non-negative least squares on relative errors
with a weak ridge prior; f and T are chosen on a grid by BIC; draws come from the Laplace
posterior truncated to non-negative coefficients (Gibbs along the covariance's eigenvectors):
where the data pin only a combination of coefficients (every speculative boot at one step
count), clipping each coordinate of an untruncated draw at zero would break the combination and
spread the draws' step time far beyond what was measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

import numpy as np
from scipy.optimize import nnls
from scipy.special import ndtr, ndtri

TILES = (1, 4, 8, 16, 32, 64, 128)             # verify padding tiles tried
ROUTES = (None, 0.01, 0.03, 0.1, 0.3)          # expert route fractions tried (None: no MoE term)
N_FEATURES = 7
GIBBS_SWEEPS = 12                              # sweeps of the truncated-posterior sampler


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
        """m draws from N(mean, cov) restricted to theta >= 0: m Gibbs chains, each started at
        the NNLS mean (feasible), moved along each eigenvector of cov in turn by an exact 1-D
        truncated-normal draw (the eigen-directions are independent under the untruncated
        posterior, so each conditional is N(-u.(x - mean), lambda) on the feasible segment)."""
        lam, vecs = np.linalg.eigh(self.cov)
        lam = np.maximum(lam, 0.0)
        mean = np.maximum(self.mean, 0.0)
        x = np.tile(mean, (m, 1))
        for _ in range(GIBBS_SWEEPS):
            for j in range(len(lam)):
                sd = math.sqrt(lam[j])
                if sd <= 0.0:
                    continue
                u = vecs[:, j]
                mu = -(x - mean) @ u                            # conditional mean of the step t
                lo, hi = _segment(x, u)
                t = _truncated_normal(rng, mu, sd, lo, hi)
                x = np.maximum(x + t[:, None] * u[None, :], 0.0)   # rounding only
        return x

    def time(self, theta: np.ndarray, feats: np.ndarray) -> np.ndarray:
        return feats @ theta


def _segment(x: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of x, the steps t with x + t u >= 0 (a segment that contains t = 0)."""
    m = x.shape[0]
    lo = np.full(m, -np.inf)
    hi = np.full(m, np.inf)
    for i in np.flatnonzero(np.abs(u) > 1e-12):
        bound = -x[:, i] / u[i]
        if u[i] > 0:
            lo = np.maximum(lo, bound)
        else:
            hi = np.minimum(hi, bound)
    lo = np.minimum(lo, 0.0)
    hi = np.maximum(hi, 0.0)
    return lo, hi


def _truncated_normal(rng: np.random.Generator, mu: np.ndarray, sd: float, lo: np.ndarray,
                      hi: np.ndarray) -> np.ndarray:
    """One draw per row from N(mu, sd^2) restricted to [lo, hi], by the inverse CDF; a segment
    wholly in the upper tail is mirrored so the CDF is read where it has precision."""
    a = (lo - mu) / sd
    b = (hi - mu) / sd
    flip = a > 0.0
    a2 = np.where(flip, -b, a)
    b2 = np.where(flip, -a, b)
    pa, pb = ndtr(a2), ndtr(b2)
    u = rng.random(len(mu))
    p = pa + u * (pb - pa)
    with np.errstate(over="ignore", invalid="ignore"):
        z = ndtri(p)
    # where the segment's mass is below the CDF's precision, the bound nearer the mean
    near = np.where(np.abs(a2) < np.abs(b2), a2, b2)
    z = np.where(np.isfinite(z) & (pb - pa > 1e-300), z, near)
    z = np.clip(z, a2, b2)
    z = np.where(flip, -z, z)
    return mu + sd * z


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
