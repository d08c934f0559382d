"""KV budget: how many tokens of KV cache a configuration gets, and how many requests run.

max_total_num_tokens = a * mem_fraction_static - b - c * draft_tokens (static pool minus weights
minus per-draft-token buffers), a Gaussian posterior with broad priors on a, c >= 0, from the
servers' facts; running limit = min(cap, floor(KV / r)) (r = tokens reserved per request, from the
facts; cap = a flag's limit where the limit does not follow the KV). A KV budget below r is a
refused boot.

The running limit is a speculative server's: SGLang lowers max_running_requests under
speculation (48 where the flag is unset: `_handle_speculative_decoding`; the simulator the same,
`sim/boot.py`), a cap the baseline does not share, while r is one rule for every boot. So the
cap comes from the speculative boots' own limits only, and the baseline's (KV, limit) helps find
r where it agrees with them (`_running_rule`).
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
    spec = [(float(o.kv), int(o.limit)) for o in obs if o.feasible and o.kv and o.limit]
    reserve, cap = _running_rule(
        spec, (float(base.kv), int(base.limit)) if base.kv and base.limit else None)
    return KVFit(mean=mean * scale, cov=cov * scale**2, reserve=reserve, cap=cap,
                 points=len(rows))


Pair = tuple[float, int]          # (KV budget in tokens, running limit) of one boot


def _running_rule(spec: Sequence[Pair], base: Pair | None) -> tuple[float | None, int | None]:
    """(r, cap) of limit = min(cap, floor(kv / r)) at a speculative point, from the speculative
    boots' (KV, limit) `spec` and the baseline's `base`.

    SGLang's rule (and the simulator's): the memory's limit floor(kv / r), with r the same for
    every boot, under a flag that speculation sets (48 where unset) and the baseline does not
    share. Of the readings the data allow, the first that every boot agrees with: one r and no
    cap (the limits all follow the KV); the speculative boots at their largest limit capped
    there, the other speculative boots and the baseline on one r; then the speculative boots
    alone (the baseline's limit a flag of its own), as `_reserve` reads them.
    """
    if not spec:
        # No speculative boot measured yet: the baseline's limit is all the data say, kept
        # until one is, though a speculative server's may be lower (SGLang's 48).
        return _reserve([base] if base else [])
    top = max(lim for _, lim in spec)
    at = [p for p in spec if p[1] == top]
    under = [p for p in spec if p[1] < top]
    if base is not None:
        both = _interval([*spec, base])
        if both is not None:
            return _mid(both), None
        capped = _interval([*under, base], capped=at, cap=top)
        if capped is not None:
            return _mid(capped), top
    return _reserve(spec)


def _interval(pairs: Sequence[Pair], capped: Sequence[Pair] = (), cap: int | None = None
              ) -> tuple[float, float] | None:
    """The r in (lo, hi] with floor(kv / r) = limit for every pair of `pairs` and
    floor(kv / r) >= cap for every pair of `capped`; None where there is none."""
    if not pairs:
        return None
    lo = max(kv / (lim + 1) for kv, lim in pairs)
    hi = min([kv / lim for kv, lim in pairs] + [kv / cap for kv, _ in capped if cap])
    return (lo, hi) if lo < hi * (1 + 1e-9) else None


def _mid(interval: tuple[float, float]) -> float:
    return (interval[0] + interval[1]) / 2


def _reserve(pairs: Sequence[Pair]) -> tuple[float | None, int | None]:
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
