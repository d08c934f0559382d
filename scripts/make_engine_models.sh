#!/usr/bin/env bash
# Write the test models that experiments/llamacpp-cpu.toml and experiments/vllm-cpu.toml name,
# into ${SPECDECODE_CACHE:-~/.cache/specdecode_tune}/models/. Each is skipped when present.
#
#   cycle-llama-d512-l4-c32-n3.75.gguf   llama.cpp: 43M params, greedy output cycles every 32
#                                         tokens; noise 3.75 -> n-gram acceptance ~0.8-0.9
#   cycle-llama-hf-d256-l2-c32-n4        vLLM: 1.6M params (word-level vocabulary of 525),
#                                         noise 4 -> n-gram acceptance ~0.9
#
# Needs: the vocabulary GGUF from scripts/build_llama_server.sh and `gguf` in this python (for
# the GGUF model); the vLLM venv from scripts/install_vllm_cpu.sh (for the HF model). A model
# whose prerequisite is missing is skipped with a message; pass "gguf" or "hf" to make only one.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${SPECDECODE_CACHE:-$HOME/.cache/specdecode_tune}"
MODELS="$CACHE/models"
PY="${PYTHON:-python3}"
VLLM_PY="$CACHE/vllm-venv/bin/python"
WHAT="${1:-all}"
mkdir -p "$MODELS"

if [[ "$WHAT" == all || "$WHAT" == gguf ]]; then
    out="$MODELS/cycle-llama-d512-l4-c32-n3.75.gguf"
    if [[ -s "$out" ]]; then
        echo "$out"
    else
        "$PY" -m specdecode_tune.testing.models gguf --out "$out" --cycle 32 --noise 3.75 \
            --dim 512 --layers 4 >&2
        echo "$out"
    fi
fi
if [[ "$WHAT" == all || "$WHAT" == hf ]]; then
    out="$MODELS/cycle-llama-hf-d256-l2-c32-n4"
    if [[ -s "$out/config.json" ]]; then
        echo "$out"
    elif [[ -x "$VLLM_PY" ]]; then
        # The venv does not have this project installed: run the tool from the source tree.
        PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$VLLM_PY" -m specdecode_tune.testing.models \
            hf --out "$out" --cycle 32 --noise 4 --dim 256 --layers 2 >&2
        echo "$out"
    else
        echo "make_engine_models: no vLLM venv at $VLLM_PY; HF model skipped" >&2
    fi
fi
