"""specdecode_tune: find the best speculative-decoding settings for an LLM server.

The flow is one-way: config -> search -> trial -> (backends, server, load, telemetry) -> results
-> report. The simulator (`specdecode_tune.sim`) is a separate server process that a trial boots
exactly as it boots SGLang; no module of the tuner imports it except the search-efficiency
benchmark, which calls its `predict` directly.
"""

__version__ = "0.1.0"
