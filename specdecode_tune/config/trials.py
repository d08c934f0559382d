"""The experiment's `[search]` and `[cluster]` tables: how a search spends its trials, on what.

`[search]` names the sampler, the trial budget and its parallelism, the repeats that settle the
incumbent, and points to measure first (`enqueue`, each checked against the searched space).
`[cluster]` declares logical GPUs and CPUs when the search starts a local Ray cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..space import ParamSpec
from .reader import Table

# The default, `hybrid`, is the one that reaches the optimum in the fewest boots on the search
# benchmark (benchmarks/search_efficiency.py): the plateau probe, else the fitted model, else TPE
# (specdecode_tune/samplers/hybrid.py says why). The others stay selectable.
SAMPLERS = ("hybrid", "plateau", "tpe", "nsga2", "random", "model")
DEFAULT_SAMPLER = "hybrid"
# The samplers seed numpy's legacy generator, which takes [0, 2**32 - 1] only.
SEED_MAX = 2**32 - 1
SEED_ALLOWED = f"an integer in [0, {SEED_MAX}] (numpy's seed range)"


@dataclass(frozen=True)
class SearchConfig:
    sampler: str = DEFAULT_SAMPLER
    max_trials: int = 20
    max_concurrent: int = 2
    gpus_per_trial: int = 2
    cpus_per_trial: float = 1.0
    repeats: int = 3                  # the final incumbent's boots, at most: min(2, repeats),
                                      # more while another config is within the band of it
    remeasure_top: int = 2            # runners-up re-measured (to 2) while within the band
    noise_band: float = 0.025         # relative; used until repeats measure one
    seed: int = 0
    baseline: bool = True             # measure no-speculation first
    enqueue: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_table(cls, t: Table, space: tuple[ParamSpec, ...]) -> SearchConfig:
        """Read and check `[search]`; enqueued points must lie in `space`."""
        enqueue = t.get("enqueue", list, [])
        for point in enqueue:
            _check_point(t, point, space)
        noise = t.get("noise_band", (int, float), 0.025)
        seed = t.get("seed", int, 0)
        if not 0 <= seed <= SEED_MAX:
            raise t.fail("seed", seed, f"must be {SEED_ALLOWED}")
        if not 0 <= noise <= 1:
            raise t.fail("noise_band", noise, "must be a probability-like fraction in [0, 1]")
        cfg = cls(
            sampler=t.choice("sampler", SAMPLERS, DEFAULT_SAMPLER),
            max_trials=t.positive("max_trials", int, 20),
            max_concurrent=t.positive("max_concurrent", int, 2),
            gpus_per_trial=t.positive("gpus_per_trial", int, 2, zero_ok=True),
            cpus_per_trial=float(t.positive("cpus_per_trial", (int, float), 1.0)),
            repeats=t.positive("repeats", int, 3),
            remeasure_top=t.positive("remeasure_top", int, 2, zero_ok=True),
            noise_band=float(noise),
            seed=seed,
            baseline=t.get("baseline", bool, True),
            enqueue=tuple(dict(p) for p in enqueue),
        )
        t.done()
        return cfg


def _check_point(t: Table, point: Any, space: tuple[ParamSpec, ...]) -> None:
    if not isinstance(point, dict) or not point:
        raise t.fail("enqueue", point, "each enqueued point is a table of parameter values")
    for k, v in point.items():
        spec = next((p for p in space if p.name == k), None)
        if spec is None:
            names = ", ".join(sorted(p.name for p in space))
            raise t.fail("enqueue", point, f"{k!r} is not a searched parameter ({names})")
        problem = spec.problem(v)
        if problem is not None:
            raise t.fail("enqueue", point, f"{k} = {v!r} is outside its search range: {k} "
                                           f"{problem}")


@dataclass(frozen=True)
class ClusterConfig:
    num_gpus: int | None = None       # logical GPUs declared when starting a local cluster
    num_cpus: int | None = None

    @classmethod
    def from_table(cls, t: Table) -> ClusterConfig:
        """Read and check `[cluster]`."""
        cfg = cls(num_gpus=t.positive("num_gpus", int, None, zero_ok=True),
                  num_cpus=t.positive("num_cpus", int, None))
        t.done()
        return cfg
