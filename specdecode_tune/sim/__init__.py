"""The embedded simulator: an SGLang-compatible server whose timing follows a performance model.

`python -m specdecode_tune.sim` serves SGLang's HTTP API in real time (see `__main__`); the model
itself is importable for benchmarks that evaluate many configs without HTTP:

    from specdecode_tune.sim import load_profile, predict, Workload
    p = load_profile("seed-qwen35-122b")
    predict(p, {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 4,
                "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 5},
            concurrency=16, workload=Workload.calibration(p))

Modules: `profile` (coefficients from TOML), `arguments` (SGLang's argument checks), `boot`
(memory and draft tree: a boot's `Facts`), `model` (the performance formulas; re-exports the
other two's names),
`scheduler` (real-time continuous batching), `api` (request/response formats), `metrics`
(Prometheus text), `server` (aiohttp routes).
"""

from __future__ import annotations

from specdecode_tune.sim.model import (
    Facts,
    Prediction,
    StartupError,
    Workload,
    predict,
    startup,
)
from specdecode_tune.sim.profile import DEFAULT_PROFILE, Profile, load_profile

__all__ = [
    "DEFAULT_PROFILE",
    "Facts",
    "Prediction",
    "Profile",
    "StartupError",
    "Workload",
    "load_profile",
    "predict",
    "startup",
]
