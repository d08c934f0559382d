"""The steps of the GPU route (scripts/device/gpu_search.py, its entry point and call flow).

Standard library only: the machine's python3 runs them before any wheel is installed.

    base      the work folder (Work), the lines (say), the background jobs' states, the GPUs
    staging   1. the carried parts, in two lanes (the payload, the trained models)
    install   3. the llama.cpp build, 4. the wheels' install (the project's, an engine's)
    planning  2. the plan: the experiment as it will run, validated
    models    the EAGLE-3 test models: trained, or carried in; --models-back brings them back
    results   6. the results in work/results, the status, what a call brings back in $OUT
    pipeline  5. the background pipeline (gpu_search.py --pipeline) and its steps

Each imports only modules listed above it (all import base; models: staging; planning:
install; results: install, models; pipeline: install, models, planning, results), never one
below. A function or setting of another module is reached
through that module (staging.stage, staging.PAYLOAD_DIRS, base.gpus_here), so that a test that
replaces it there replaces it for every caller; only base's Work, say, refuse and plain
constants (REPO, the result files' names) and staging's lanes are imported by name.
"""
