"""The one factory of the search's Optuna samplers, by the name `search.sampler` or `--sampler`
gives (`config.SAMPLERS`): `hybrid` (the default: the plateau probe, else the model where its
fit is good, else TPE; `samplers.hybrid`), `tpe`, `random`, `nsga2` (Optuna's), `plateau`
(plateau escape over TPE) and `model` (model-guided over TPE). The search-efficiency benchmark
builds its samplers here too, so that it measures the ones a search runs. Under `[objective]
kind = "schedule"` the project's samplers aim at every level's best (`per_level`: the model by
the expected improvement of any level's best, the plateau probe on each level's own score).

TPE starts with min(6, max_trials) random trials; NSGA-II's population is max_trials / 2,
clamped to [4, 20]. Every sampler is seeded with the run's seed, and pickles (Ray Tune saves
the searcher holding it at every checkpoint; `samplers.nsga2` says why NSGA-II needed help).
"""

from __future__ import annotations

import functools
from typing import Any

from ..backends import known_refusal
from ..config import SAMPLERS, Experiment
from ..errors import ConfigError


def make_sampler(name: str, exp: Experiment, seed: int) -> Any:
    import optuna

    # Constraint-aware: a config the server refused counts as infeasible, not as a bad score.
    tpe = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(6, exp.search.max_trials))
    if name == "tpe":
        return tpe
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "nsga2":
        from ..samplers.nsga2 import NSGAIISampler  # Optuna's, made to pickle
        return NSGAIISampler(seed=seed, population_size=max(
            4, min(20, exp.search.max_trials // 2)))
    if name == "plateau":
        from ..samplers import PlateauEscapeSampler
        return PlateauEscapeSampler(tpe, noise_band=exp.search.noise_band, seed=seed,
                                    per_level=exp.objective.kind == "schedule")
    # Points the servers' release is known to crash on are no candidates of the model (the
    # search's gate skips them from any sampler too).
    refuses = functools.partial(known_refusal, exp.backend)
    if name == "hybrid":
        from ..samplers import HybridSampler
        return HybridSampler(tpe, space=exp.space, fixed=exp.backend.flags,
                             noise_band=exp.search.noise_band, seed=seed,
                             per_level=exp.objective.kind == "schedule", refuses=refuses)
    if name == "model":
        from ..samplers import ModelGuidedSampler
        return ModelGuidedSampler(tpe, space=exp.space, fixed=exp.backend.flags, seed=seed,
                                  per_level=exp.objective.kind == "schedule", refuses=refuses)
    raise ConfigError(f"--sampler {name!r}: must be one of {', '.join(SAMPLERS)}")
