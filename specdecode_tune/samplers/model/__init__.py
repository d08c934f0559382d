"""Model-guided sampler: fit the physics of speculative decoding from the trials, boot only where
the fitted model says it pays.

Every boot of a 100B+ model costs minutes, but the trials measure far more than their score.
One trial at steps = s measures the acceptance at draft positions 1..s (the servers' per-position
histogram); its levels measure the step time at several batch sizes; its server facts measure the
KV budget. `ModelGuidedSampler` fits a small physical model to those measurements (what the
search records of them: `samplers.observations`) and proposes the configuration with the largest
expected improvement of the search's score; where the model cannot be trusted it hands the
trial to its base sampler (TPE by default). One module per part:

- `trials`: the measured trials and the baseline, as the model reads them;
- `candidates`: every configuration the model can name;
- `acceptance`: per-position acceptance and the sibling share of trees -> tokens per verify step;
- `kv`: the KV budget and the running limit;
- `steptime`: the time of one decode iteration;
- `oom`: the out-of-memory boundary (and running points counted as refused);
- `fit`: the three together, the predicted score and what a refused boot rules out;
- `contexts`: parameters the model has no term for, one fit per combination of their values;
- `improvement`: expected improvement per context, and the reference it improves on;
- `anchor`: the cold start, before any speculative boot has run;
- `sampler`: the hand-over rules, the decision and the Optuna hooks.
"""

from __future__ import annotations

from ..observations import (
    BASELINE_ATTR,
    MEASURED_ATTR,
    NOISE_BAND_ATTR,
    Baseline,
    LevelObs,
    Measured,
    baseline_attr,
    measured_attr,
)
from .acceptance import (
    COUNT_CAP,
    H_GRID,
    PRIOR_SHRINK,
    PRIOR_WEIGHT,
    AcceptanceFit,
    accept_length,
    fit_acceptance,
    tree_widths,
)
from .candidates import FLOAT_GRID, Candidates, enumerate_space, point_key
from .fit import Fit, fit_model, predict_levels, ruled_out, score_draws
from .kv import KVFit, fit_kv
from .sampler import DECISION_ATTR, ModelGuidedSampler
from .steptime import N_FEATURES, ROUTES, TILES, StepFit, StepRows, fit_step, step_features
from .trials import TrialObs, failure_kind, parse_baseline, parse_measured, scoring_baseline

__all__ = [
    "BASELINE_ATTR",
    "COUNT_CAP",
    "DECISION_ATTR",
    "FLOAT_GRID",
    "H_GRID",
    "MEASURED_ATTR",
    "NOISE_BAND_ATTR",
    "N_FEATURES",
    "PRIOR_SHRINK",
    "PRIOR_WEIGHT",
    "ROUTES",
    "TILES",
    "AcceptanceFit",
    "Baseline",
    "Candidates",
    "Fit",
    "KVFit",
    "LevelObs",
    "Measured",
    "ModelGuidedSampler",
    "StepFit",
    "StepRows",
    "TrialObs",
    "accept_length",
    "baseline_attr",
    "enumerate_space",
    "failure_kind",
    "fit_acceptance",
    "fit_kv",
    "fit_model",
    "fit_step",
    "measured_attr",
    "parse_baseline",
    "parse_measured",
    "point_key",
    "predict_levels",
    "ruled_out",
    "score_draws",
    "scoring_baseline",
    "step_features",
    "tree_widths",
]
