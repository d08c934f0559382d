"""The project's own Optuna samplers (each one concept, one module).

- `PlateauEscapeSampler` (`plateau.py`): wraps a base sampler and probes far beyond a plateau
  once, to tell a peak from a shelf.
"""

from __future__ import annotations

from .plateau import (
    EVENTS_ATTR,
    JUMP_OUTCOME_ATTR,
    JUMP_REASON_ATTR,
    NOISE_BAND_ATTR,
    OUTCOMES,
    PlateauEscapeSampler,
)

__all__ = [
    "EVENTS_ATTR",
    "JUMP_OUTCOME_ATTR",
    "JUMP_REASON_ATTR",
    "NOISE_BAND_ATTR",
    "OUTCOMES",
    "PlateauEscapeSampler",
]
