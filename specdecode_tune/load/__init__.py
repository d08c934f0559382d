"""The load generator: streamed requests at a fixed concurrency or request rate, measured per level.

Its modules build on each other in this order:

    workload     which prompts a level sends (`Prompt`, `make_prompts`, `iter_prompts`)
    sse          `SSEParser`: one incremental Server-Sent-Events parser for every server
    plan         `LevelPlan`: a closed loop at a concurrency, or an open loop at a rate
    stats        `summarize`: records -> `LevelSummary`; `level_failure`; pure
    rounds       a level measured in whole rounds until known (batches, MSER, the stop); pure
    protocols    `Api`: each API's request body and the interpreter of each streamed event;
                 the OpenAI completions and chat format here, an engine's own API (SGLang's
                 /generate) and its stream fields in its backend (`backends.streamformat`)
    tally        request states -> `RequestRecord`s, and the tokens that arrived in the window
    client       `stream_request`: one streamed request, the per-chunk loop (aiohttp)
    scheduler    `run_level`: the closed or open loop of one level, cut at the window end or
                 when `rounds` says the level is known
    measurement  `measure`: the trial's entry: one session, a warm-up, then each plan in order

This facade imports nothing until a name is first used (PEP 562), so that the workload
(`specdecode_tune.load.workload`) imports without aiohttp: the vLLM venv, which has no
aiohttp, imports it from the source tree for a test tokenizer's training text. Import any
name from here; `from specdecode_tune.load.<module> import ...` works as well. No module is
named like a name the facade hands on: importing a submodule sets the package's attribute of
the module's name, which would hide the name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .client import stream_request
    from .measurement import measure, warm_up
    from .plan import LevelPlan
    from .protocols import (
        API_KINDS,
        Api,
        error_message,
        interpret_chat,
        interpret_completions,
        openai_interpreter,
    )
    from .scheduler import run_level
    from .sse import SSEError, SSEParser
    from .stats import DRIFT_LIMIT, gap_drift, level_failure, summarize
    from .tally import RequestState, tally_level
    from .workload import Prompt, iter_prompts, make_prompts

# The modules in the order they build on each other: a name is served by the first that has
# it, so asking for one imports the modules before its own, and aiohttp only with `client`.
_MODULES = ("workload", "sse", "plan", "stats", "protocols", "tally", "client", "scheduler",
            "measurement")

__all__ = [
    "API_KINDS", "DRIFT_LIMIT", "Api", "LevelPlan", "Prompt", "RequestState", "SSEError",
    "SSEParser", "error_message", "gap_drift", "interpret_chat", "interpret_completions",
    "iter_prompts", "level_failure", "make_prompts", "measure", "openai_interpreter",
    "run_level", "stream_request", "summarize", "tally_level", "warm_up",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        for module in _MODULES:
            home = importlib.import_module(f".{module}", __name__)
            if hasattr(home, name):
                value = getattr(home, name)
                globals()[name] = value   # found once; later reads skip this function
                return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
