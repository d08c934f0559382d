"""specdecode_tune: find the best speculative-decoding settings for an LLM server.

The flow is one-way: config -> search -> trial -> (backends, server, load, telemetry) -> results
-> report. The simulator (`specdecode_tune.sim`) is a separate server process that a trial boots
exactly as it boots SGLang. Only the search's pre-flight (which checks the simulator's
arguments with its own parser before anything starts) and the search-efficiency benchmark
(which calls its `predict`) import it; no sampler does.
"""

__version__ = "0.1.0"
