"""A tiny SSE stream server that speaks SGLang's `/generate` and OpenAI's completions and chat
streams, for the load generator's tests and benchmark.

`app` is the server (what it streams, its knobs, its failure modes, its `/stats`), `control`
runs it as a subprocess and calls its control endpoints, `cli` is its command line
(`python -m specdecode_tune.testing.streamserver --port P ...`).
"""

from .app import FAIL_MODES, Stats, StreamConfig, make_app
from .control import reset, start_subprocess, stats, stop_subprocess

__all__ = ["FAIL_MODES", "Stats", "StreamConfig", "make_app", "reset", "start_subprocess",
           "stats", "stop_subprocess"]
