"""Expected improvement over the fitted model's joint posterior draws, per context's candidates.

Each context the model is fitted in (`contexts`) is an `Option`: its fit, its candidates, its
observations, which candidates are free (neither measured nor running) and the posterior draws
of every candidate's tok/s per level and score (-inf where a draw says the server refuses the
boot). `pick` chooses an option's candidate: the largest EI, infeasible draws counting as no
improvement, ties to the higher mean score; once a refusal for memory has measured the
boundary, only points that boot in at least `SAFE_P` of the draws (while any remain); while a
running boot bets on that boundary (the measured version space is unsure of it), only points
every line of the version space boots (`sure_points`, while any remain). EI is
over the model's own mean of the best measured configuration (`reference`), not the best
measured value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from .candidates import Candidates
from .fit import Fit
from .trials import TrialObs

# Once a refusal has measured a boundary, a point is proposed only where at least this share
# of the posterior draws boots it (the KV gate of the search applies the same share).
SAFE_P = 0.5


class Option(NamedTuple):
    """One context's fit and its candidates' posterior draws."""

    ctx: dict[str, Any]
    fit: Fit
    cands: Candidates
    obs: list[TrialObs]
    free: np.ndarray                    # (N,) neither measured nor running
    levels: dict[int, np.ndarray]       # log tok/s per level, (draws, N)
    scores: np.ndarray                  # (draws, N), -inf where refused
    # While a running trial bets on the out-of-memory boundary: (N,) whether every line of the
    # boundary's version space boots the candidate (None: no such bet running).
    sure: np.ndarray | None = None
    # Per draw, the best score the points other trials are measuring now reach (None: none
    # runs): the expected gain beyond the band (the stop rule's) is over max(the reference,
    # that), draw by draw. The proposal's own EI is not: it keeps its pessimistic view.
    believed: np.ndarray | None = None


class Pick(NamedTuple):
    """An option's best candidate: its EI, its mean score, where it is, the per-level note."""

    ei: float
    mean: float
    at: int                             # its index in the candidates
    option: Option
    level_note: str


def best_reference(options: Sequence[Option]) -> float | None:
    """The reference: the best of the model's means of measured configurations, over every
    context's own fit (`reference`); None where no option has one."""
    refs = [r for o in options
            if (r := reference(o.scores, np.isfinite(o.scores), o.cands, o.obs)) is not None]
    return max(refs) if refs else None


def pick(option: Option, best_score: float, band: float | None, per_level: bool,
         sure_only: bool = False) -> tuple[Pick, float]:
    """(The option's free candidate of largest EI over `best_score`, ties to the higher mean
    score; the largest expected gain beyond `band` over its free points, 0 without a band).
    `per_level`: EI of any level's best measured tok/s instead (`level_ei`). `sure_only`: only
    free points every boundary line boots (`sure_points`); an option without one picks at
    -inf."""
    fit, obs, free, levels, scores = option.fit, option.obs, option.free, option.levels, \
        option.scores
    feasible = np.isfinite(scores)
    gain = np.where(feasible, np.maximum(scores - best_score, 0.0), 0.0)
    ei = gain.mean(axis=0)
    beyond = 0.0
    if band is not None and free.any():
        # The stop rule's question (is any free point worth a boot?) is asked beside running
        # boots too: a point's gain counts over what they reach in the same draw (`believed`),
        # so a neighbour that gains only where a running boot fails is worth no boot.
        ref = best_score if option.believed is None else \
            np.maximum(best_score, option.believed)[:, None]
        over = np.where(feasible, np.maximum(scores - ref - band, 0.0), 0.0).mean(axis=0)
        beyond = float(over[free].max())
    level_note = ""
    if per_level:
        ei, level_note = level_ei(levels, feasible, obs, fit.base)
    # Infeasible draws count as a very bad score in the tie-break, not as no information.
    mean = np.where(feasible, scores, -10.0).mean(axis=0)
    if any(not o.feasible and o.failure in ("oom", "kv") for o in obs):
        # A refusal measured the boundary once: from here on, points the server more likely
        # refuses than boots are not proposed (while others remain).
        likely = feasible.mean(axis=0) >= SAFE_P
        if (free & likely).any():
            free = free & likely
    excluded = False
    if sure_only:
        # Another trial is booting a point the boundary may refuse: this slot does not bet on
        # the same boundary before that boot answers (`sure_points`).
        sure = free if option.sure is None else free & option.sure
        if sure.any():
            free = sure
        else:
            excluded = True
    order = np.lexsort((-mean, -ei))          # EI first, then the mean score
    order = order[free[order]]
    i = int(order[0])
    if excluded:
        return Pick(-math.inf, -math.inf, i, option, level_note), beyond
    return Pick(float(ei[i]), float(mean[i]), i, option, level_note), beyond


def sure_points(options: Sequence[Option]) -> bool:
    """Whether proposals keep to points every line of the out-of-memory boundary's version
    space boots: while a running trial bets on the boundary (an option's `sure` is set) and
    some option has such a free point. The boundary's posterior before a refusal rests on the
    prior over its slope and intercept; a second bet placed before the first answers doubles
    that prior's risk (both refused where the truth sits at the prior's edge), where the first
    boot's answer costs one boot's wait."""
    return any((o.free & o.sure).any() for o in options if o.sure is not None)


def level_ei(levels: Mapping[int, np.ndarray], feasible: np.ndarray, obs: Sequence[Any],
             base: Any) -> tuple[np.ndarray, str]:
    """(EI per candidate of the best measured log tok/s at any level: the largest over levels,
    a note naming the levels' bests). Each level's best counts the baseline and every feasible
    trial measured there."""
    eis = []
    for c, draws in levels.items():
        seen = [lv.tok_s for o in obs if o.feasible for lv in o.levels
                if lv.concurrency == c and lv.tok_s > 0]
        if base.tok_s.get(c):
            seen.append(base.tok_s[c])
        best = math.log(max(seen)) if seen else -math.inf
        gain = np.where(feasible, np.maximum(draws - best, 0.0), 0.0) if seen else \
            np.where(feasible, 1.0, 0.0)
        eis.append(gain.mean(axis=0))
    ei = np.max(np.stack(eis), axis=0) if eis else np.zeros(feasible.shape[1])
    return ei, "any level's best (log tok/s)"


def reference(scores: np.ndarray, feasible: np.ndarray, cands: Candidates,
              obs: Sequence[TrialObs]) -> float | None:
    """The score EI improves on: the best posterior mean among the measured configurations
    (the plug-in reference for noisy observations), not the best measured value. The best of
    several noisy measurements is biased upwards (the winner's curse: on a server whose boots
    vary by 4% the incumbent is the luckiest boot), so against it every prediction, which
    averages over boots, looks like no improvement and the search stops on a lucky draw. None
    where no measured configuration is a candidate."""
    index = {k: i for i, k in enumerate(cands.keys)}
    measured = sorted({index[o.key] for o in obs if o.feasible and o.key in index})
    if not measured:
        return None
    ok = feasible[:, measured]
    if not ok.any():
        return None
    sums = np.where(ok, scores[:, measured], 0.0).sum(axis=0)
    counts = ok.sum(axis=0)
    means = np.where(counts > 0, sums / np.maximum(counts, 1), -np.inf)
    return float(np.max(means))
