#!/usr/bin/env bash
# Call 1 (carry .dev2): stage the wheels, start the CUDA build of llama-server in the background.
set -euo pipefail
mkdir -p /tmp/w && cp .dev2/* /tmp/w/
export SPECDECODE_CACHE=/tmp/sdc
setsid nohup bash scripts/device/build_llama_cuda.sh /tmp/w/llama-src.tgz >/tmp/build.log 2>&1 </dev/null &
nvidia-smi -L
python3 -c 'import sys; print(sys.version)'
python3 -m pip list 2>/dev/null | grep -iE '^(ray|optuna|pyarrow|pandas|aiohttp|nvidia-ml-py|gguf|numpy|pyyaml|torch) ' || true
