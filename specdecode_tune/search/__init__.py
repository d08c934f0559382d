"""The search: Ray Tune runs the trials on their GPUs, Optuna proposes the points, and this
package decides everything between (`python -m specdecode_tune.search`, `specdecode-search`).

Its modules, in the order a run meets them:

- `cli`: the command: its arguments, the run from pre-flight to exit status;
- `preflight`: what is checked before anything starts or is written (`plan_run` -> `RunPlan`);
- `changes`: an existing run dir's experiment against the one given: refused where the run's
  results would not hold for it, else what the run keeps and what applies, said;
- `leftovers`: what a killed driver of the same run left, found and ended by PID;
- `ray_cluster`: a local Ray cluster started, or one joined; its GPUs; the dashboard's line
  (the one module that uses a private helper of Ray);
- `baseline`: the no-speculation baseline, measured first or reused;
- `tuner`: the Tuner, new or restored, and the run dir it lives in;
- `sampler_factory`: `make_sampler`, the one factory of the samplers by name;
- `searcher`: Optuna under Tune: constraints for refused configs, re-measurements, the stop
  rule (the one module that touches Ray Tune's and OptunaSearch's internals); with its parts
  `proposals` (the space that records what proposed each point) and `failures` (the failure
  streak that stops a search);
- `trainable`: one trial on its GPUs: checkpoints per level, the score, the final result;
- `progress`: the live lines; `summary`: the closing lines.

The flow is one-way: cli -> preflight, then tuner -> searcher / sampler_factory / trainable
-> trial. The names below are this package's face, imported on first use (PEP 562), so that
`import specdecode_tune.search.sampler_factory` (the benchmark) loads no Ray.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .baseline import BASELINE_ID, run_baseline
    from .cli import DEFAULT_EXPERIMENT, main, parse_args, run_search
    from .preflight import RunPlan, plan_run
    from .progress import REASON_CHARS, Progress, describe, say, short_reason
    from .sampler_factory import make_sampler
    from .searcher import INFEASIBLE_SCORE, ProposalSpace
    from .summary import print_summary, stopped_early, trial_counts
    from .trainable import score_of

# name -> (module, its name there)
_LAZY = {
    "main": ("cli", "main"),
    "run_search": ("cli", "run_search"),
    "parse_args": ("cli", "parse_args"),
    "DEFAULT_EXPERIMENT": ("cli", "DEFAULT_EXPERIMENT"),
    "plan_run": ("preflight", "plan_run"),
    "RunPlan": ("preflight", "RunPlan"),
    "BASELINE_ID": ("baseline", "BASELINE_ID"),
    "run_baseline": ("baseline", "run_baseline"),
    "make_sampler": ("sampler_factory", "make_sampler"),
    "INFEASIBLE_SCORE": ("searcher", "INFEASIBLE_SCORE"),
    "ProposalSpace": ("searcher", "ProposalSpace"),
    "score_of": ("trainable", "score_of"),
    "Progress": ("progress", "Progress"),
    "REASON_CHARS": ("progress", "REASON_CHARS"),
    "describe": ("progress", "describe"),
    "short_reason": ("progress", "short_reason"),
    "say": ("progress", "say"),
    "print_summary": ("summary", "print_summary"),
    "stopped_early": ("summary", "stopped_early"),
    "trial_counts": ("summary", "trial_counts"),
}

__all__ = [
    "BASELINE_ID", "DEFAULT_EXPERIMENT", "INFEASIBLE_SCORE", "REASON_CHARS", "Progress",
    "ProposalSpace", "RunPlan", "describe", "main", "make_sampler", "parse_args", "plan_run",
    "print_summary", "run_baseline", "run_search", "say", "score_of", "short_reason",
    "stopped_early", "trial_counts",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = getattr(importlib.import_module(f".{module}", __name__), attr)
    globals()[name] = value   # found once; later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
