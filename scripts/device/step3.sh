#!/usr/bin/env bash
# Call 3 (carry .dev3): pyarrow, then the GPU checks and a real search on the GPU pair.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .dev3/*.whl
export PYTHONPATH="/tmp/site:$PWD" SPECDECODE_CACHE=/tmp/sdc PYTHONUNBUFFERED=1
for i in $(seq 1 90); do [[ -x $SPECDECODE_CACHE/llama.cpp-cuda/bin/llama-server ]] && break; sleep 5; done
tail -2 /tmp/build.log
M=$SPECDECODE_CACHE/models/cycle-llama-d2048-l16-c32-n2.3.gguf
[[ -s $M ]] || python3 -m specdecode_tune.testing.models gguf --out "$M" --cycle 32 --noise 2.3 \
  --dim 2048 --layers 16 --dtype f16 --vocab-gguf $SPECDECODE_CACHE/llama.cpp-cuda/bin/vocab.gguf
python3 scripts/gpu_check.py --json "$OUT/gpu_check.json" > "$OUT/gpu_check.txt" 2>&1; echo "gpu_check rc=$?"
python3 -m specdecode_tune.search --experiment experiments/llamacpp-gpu.toml --storage /tmp/runs \
  ${SEARCH_ARGS:-} 2>&1 | tee "$OUT/search.txt"
python3 scripts/device/dump_run.py /tmp/runs/llamacpp-gpu "$OUT/run.json"
cp /tmp/runs/llamacpp-gpu/report/report.md "$OUT/" 2>/dev/null || true
