"""Test tooling that tests, benchmarks and scripts share; the search never imports it.

- `models`: tiny llama models whose greedy output cycles, written as GGUF (llama.cpp) or as
  an HF directory (vLLM): `python -m specdecode_tune.testing.models gguf|hf ...`;
- `eagle3`: a small Llama target and a trained EAGLE-3 draft head for it, made from ShareGPT,
  with an acceptance report: `python -m specdecode_tune.testing.eagle3 --out DIR
  [--preset gpu|toy]` (docs/eagle3-models.md);
- `streamserver`: a tiny SSE stream server for the load generator's tests and benchmark;
- `processes`: the processes a tagged test or benchmark started, and ending them by PID.

It ships in the package because the benchmarks and `scripts/make_engine_models.sh` (which runs
the model tool with the vLLM venv's python) need it outside pytest. Helpers that only the
tests use (a fake NVML, a stand-in server for the lifecycle tests, the simulator as a
subprocess) stay in `tests/`.
"""
