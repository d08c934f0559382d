"""The experiment: one frozen `Experiment`, and how a TOML file (or its parsed dict) becomes one.

`load_experiment(path)` reads the file (`reader.read_toml`) and hands its dict to
`experiment_from_dict`, which reads each table with its class's `from_table`, in the file's
order of dependence: `[backend]`, `[space]`, `[workload]`, `[measure]`, then `[objective]`
(weights and metrics name measured levels) and `[search]` (enqueued points lie in the space),
then `[cluster]`. Last, the space must hold at least one valid configuration. The first problem
found is raised as a one-line `ConfigError`; nothing is started or written before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..space import ParamSpec, first_valid_point
from .backend import BackendConfig
from .measure import MeasureConfig, ObjectiveConfig
from .parameters import space_from_table
from .reader import Table, read_toml
from .trials import ClusterConfig, SearchConfig
from .workload import WorkloadSpec


@dataclass(frozen=True)
class Experiment:
    name: str
    backend: BackendConfig
    space: tuple[ParamSpec, ...]
    workload: WorkloadSpec
    measure: MeasureConfig
    objective: ObjectiveConfig
    search: SearchConfig
    cluster: ClusterConfig
    description: str = ""
    source: str = ""                  # the file it was loaded from

    def param(self, name: str) -> ParamSpec | None:
        return next((p for p in self.space if p.name == name), None)

    def level_weights(self) -> dict[int, float]:
        """Objective weight per concurrency level; levels not named get weight 0 if any is
        named, else all levels weigh the same."""
        if not self.objective.weights:
            return {c: 1.0 for c in self.measure.concurrency}
        return {c: self.objective.weights.get(c, 0.0) for c in self.measure.concurrency}


def load_experiment(path: str | Path) -> Experiment:
    """Read and validate an experiment file; raises ConfigError with one line on bad input."""
    data = read_toml(path)
    return experiment_from_dict(data, where=str(path), base_dir=Path(path).parent)


def experiment_from_dict(data: Mapping[str, Any], *, where: str = "<experiment>",
                         base_dir: Path | None = None) -> Experiment:
    """Validate a parsed experiment; `where` starts every error, `base_dir` finds relative
    paths (the experiment file's folder)."""
    top = Table(dict(data), "", where)
    name = top.get("name", str)
    if not name or any(c in name for c in "/\\\0") or name.startswith("."):
        raise top.fail("name", name, "must be a non-empty name without slashes")
    description = top.get("description", str, "")
    backend = BackendConfig.from_table(top.sub("backend", required=True), base_dir)
    space = space_from_table(top.sub("space", required=True))
    workload = WorkloadSpec.from_table(top.sub("workload"), base_dir,
                                      model_path=backend.model_path)
    measure = MeasureConfig.from_table(top.sub("measure"))
    objective = ObjectiveConfig.from_table(top.sub("objective"), measure)
    search = SearchConfig.from_table(top.sub("search"), space)
    cluster = ClusterConfig.from_table(top.sub("cluster"))
    top.done()
    if first_valid_point(space, backend.flags) is None:
        raise ConfigError(f"{where}: the search space allows no valid configuration "
                          f"(speculative_num_draft_tokens must be <= 1 + topk + (steps - 1) * "
                          f"topk^2 and >= 2 for some steps/topk in the space)")
    return Experiment(name=name, backend=backend, space=space, workload=workload,
                      measure=measure, objective=objective, search=search, cluster=cluster,
                      description=description, source=where)
