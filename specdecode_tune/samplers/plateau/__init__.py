"""Plateau escape: an Optuna sampler that asks "is this plateau a peak?" with one far probe.

People tuning speculative decoding see steps 1..5 climb, then 4 -> 5 gain +1.8% (inside the
noise), and ask: is steps=4 the peak, or would steps=10 climb again? Neither TPE nor a sweep
answers that on purpose. `PlateauEscapeSampler` wraps a base sampler (TPE by default) and, when
an ordinal axis has flattened around the incumbent, spends ONE trial on a far, non-monotonic
jump beyond the plateau with every other parameter at the incumbent's values; the jump's
outcome says whether the plateau is a peak, a shelf with more beyond ("escaped"), or noise.

- `axes`: the watched parameters and their levels;
- `scales`: what a plateau is judged on: the trials' score, or (per-level mode, for a
  per-batch-size schedule) each concurrency level's own log-speedup;
- `geometry`: what a plateau is and where the jump lands;
- `events`: the record of each jump in the study, and its verdict;
- `bracket`: after a jump that came back no better, the middle of the stretch it skipped (the
  default `HybridSampler` boots it; this sampler alone does not);
- `sampler`: when to jump, and the Optuna hooks.

Everything the sampler knows lives in the study, not in the sampler, so it pickles trivially
(Ray Tune pickles the searcher with the sampler), a fresh instance over a resumed study carries
on where the old one stopped, and it is deterministic for a seed (its only randomness is the
base sampler's).
"""

from __future__ import annotations

from ..observations import NOISE_BAND_ATTR
from .axes import MAX_DISCRETE_LEVELS, MAX_LEVELS
from .events import EVENTS_ATTR, JUMP_OUTCOME_ATTR, JUMP_REASON_ATTR, OUTCOMES
from .sampler import DIRECTIONS, PlateauEscapeSampler

__all__ = [
    "DIRECTIONS",
    "EVENTS_ATTR",
    "JUMP_OUTCOME_ATTR",
    "JUMP_REASON_ATTR",
    "MAX_DISCRETE_LEVELS",
    "MAX_LEVELS",
    "NOISE_BAND_ATTR",
    "OUTCOMES",
    "PlateauEscapeSampler",
]
