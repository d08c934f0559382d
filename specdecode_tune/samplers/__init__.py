"""The project's own Optuna samplers, and what the search tells them.

- `observations`: what a trial measured and the baseline, typed, with the one codec to and from
  the Optuna study's attrs (the contract between the search and the samplers);
- `planned`: the base both samplers share (planned trials over a base sampler; the one place
  that touches Optuna's storage internals);
- `history`: what the study's trials say (feasible trials, the incumbent, the space seen);
- `plateau/`: `PlateauEscapeSampler`, which probes far beyond a plateau once, to tell a peak
  from a shelf;
- `model/`: `ModelGuidedSampler`, which fits the physics of speculative decoding from the
  trials and proposes by expected improvement;
- `hybrid`: `HybridSampler`, the default: the plateau probe, else the model where its fit is
  good, else TPE.
"""

from __future__ import annotations

from .hybrid import HybridSampler
from .model import DECISION_ATTR, ModelGuidedSampler
from .observations import (
    BASELINE_ATTR,
    MEASURED_ATTR,
    NOISE_BAND_ATTR,
    Baseline,
    LevelObs,
    Measured,
    baseline_attr,
    measured_attr,
)
from .planned import PlannedSampler
from .plateau import (
    EVENTS_ATTR,
    JUMP_OUTCOME_ATTR,
    JUMP_REASON_ATTR,
    OUTCOMES,
    PlateauEscapeSampler,
)

__all__ = [
    "BASELINE_ATTR",
    "DECISION_ATTR",
    "EVENTS_ATTR",
    "JUMP_OUTCOME_ATTR",
    "JUMP_REASON_ATTR",
    "MEASURED_ATTR",
    "NOISE_BAND_ATTR",
    "OUTCOMES",
    "Baseline",
    "LevelObs",
    "HybridSampler",
    "Measured",
    "ModelGuidedSampler",
    "PlannedSampler",
    "PlateauEscapeSampler",
    "baseline_attr",
    "measured_attr",
]
