"""Experiment files: TOML under `experiments/`, loaded into frozen dataclasses and validated.

An experiment says which server to boot and how (backend), what to search (space), what load to
measure it under (workload, measure), what "better" means (objective), how many trials to spend
(search) and, for a local cluster, how many logical GPUs to declare (cluster).

Every validation error is a `ConfigError` whose message is one line naming the file, the key,
the bad value and what is allowed. Nothing is started and nothing is written before an
experiment has loaded cleanly.

    reader.py      the TOML reader: a file to a dict, typed reads of one table
    backend.py     [backend]            BackendConfig
    parameters.py  [space]              the searched ParamSpecs and their bounds
    workload.py    [workload]           WorkloadSpec (validates itself, also when built in code)
    promptfile.py  workload.path        a JSONL prompt file read and checked line by line
    measure.py     [measure] [objective] MeasureConfig, ObjectiveConfig
    trials.py      [search] [cluster]   SearchConfig, ClusterConfig
    experiment.py  Experiment, load_experiment, experiment_from_dict
    cliargs.py     the two commands' flags, each value checked as the experiment's are

Each table's class reads and checks its own table (`from_table`); `experiment_from_dict` reads
them in order and checks what spans tables.
"""

from ..errors import ConfigError
from ..space import SPEC_PARAMS
from .backend import APIS, BACKEND_KINDS, BackendConfig
from .experiment import Experiment, experiment_from_dict, load_experiment
from .measure import OBJECTIVE_KINDS, PARETO_METRICS, MeasureConfig, ObjectiveConfig
from .trials import SAMPLERS, ClusterConfig, SearchConfig
from .workload import WORKLOAD_KINDS, Length, WorkloadSpec

__all__ = [
    "APIS", "BACKEND_KINDS", "OBJECTIVE_KINDS", "PARETO_METRICS", "SAMPLERS", "SPEC_PARAMS",
    "WORKLOAD_KINDS", "BackendConfig", "ClusterConfig", "ConfigError", "Experiment", "Length",
    "MeasureConfig", "ObjectiveConfig", "SearchConfig", "WorkloadSpec", "experiment_from_dict",
    "load_experiment",
]
