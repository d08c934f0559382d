"""specdecode_tune: find the best speculative-decoding settings for an LLM server.

The flow is one-way: config -> search -> trial -> (backends, server, load, telemetry) -> results
-> report. The simulator (`specdecode_tune.sim`) is a separate server process that a trial boots
exactly as it boots SGLang. Only the sim backend (which reads its profile before anything
starts) and the search-efficiency benchmark (which calls its `predict`) import it; the search's
pre-flight runs its command line (`--check-args`), and no sampler imports it.

This module is the package's face, for use from Python:

    load_experiment(path) -> Experiment     read and check an experiment file (ConfigError)
    run_search(path, *args) -> int          a search, as `specdecode-search --experiment path`
    run_trial(exp, sampled, ctx) -> TrialResult   one server boot, measured
    write_report(run_dir) -> ReportOutput   the report of a run dir (RunDirError)

and the errors of `errors` (SpecTuneError and its subclasses). The four functions are imported
on first use (PEP 562), so `import specdecode_tune` loads neither Ray nor pyarrow, and a module
of the package importing `specdecode_tune.<anything>` cannot run into a cycle through here.
`__version__` is the installed distribution's version (pyproject.toml's), read on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    ConfigError,
    RunDirError,
    RunInUse,
    ServerStartError,
    SpecTuneError,
)

if TYPE_CHECKING:
    from .config import load_experiment
    from .report import write_report
    from .search import run_search
    from .trial import run_trial

_LAZY = {
    "load_experiment": "config",
    "run_search": "search",
    "run_trial": "trial",
    "write_report": "report",
}

__all__ = [
    "ConfigError", "RunDirError", "RunInUse", "ServerStartError", "SpecTuneError",
    "__version__", "load_experiment", "run_search", "run_trial", "write_report",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    elif name == "__version__":
        value = _version()
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value   # found once; later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _version() -> str:
    """The installed version; in a source tree that is not installed, pyproject.toml's."""
    from importlib import metadata

    try:
        return metadata.version("specdecode_tune")
    except metadata.PackageNotFoundError:
        pass
    import tomllib
    from pathlib import Path

    try:
        project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
        return str(project["project"]["version"])
    except (OSError, ValueError, KeyError):
        return "0+unknown"
