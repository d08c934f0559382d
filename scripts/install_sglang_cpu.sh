#!/usr/bin/env bash
# Install SGLang into a virtual environment outside the repository, for the contract tests that
# run SGLang's own argument parsing (`prepare_server_args` + `check_server_args`, with
# `--device cpu` appended) on the argv the backend builds. Reused when present.
#
# Output (last line of stdout): the venv's python, e.g.
#   ${SPECDECODE_CACHE:-$HOME/.cache/specdecode_tune}/sglang-venv/bin/python
#
# Not a serving install: SGLang is installed with --no-deps (its requirements pin CUDA-only
# wheels: sglang-kernel, flashinfer, cuda-python, torch 2.9.1), plus torch and only what
# importing `sglang.srt.server_args` and parsing needs. The list was found by trial (issue 16,
# docs/engines-sglang.md):
# - import of sglang.srt.server_args: tqdm pybase64 requests IPython pydantic aiohttp
#   safetensors orjson packaging starlette openai partial_json_parser huggingface_hub
#   transformers pyzmq dill sentencepiece;
# - prepare_server_args (lazy imports while building the model config): compressed-tensors gguf;
# - torchvision: `sglang.srt.utils.common` imports `torchvision.io` at module level, and PyPI's
#   torchvision fails beside the CPU torch 2.13.0 build; torch 2.14.1 + torchvision 0.29.1 (the
#   CUDA build, ~5.5 GB in the venv, runs on the CPU) are on this kind of machine's local
#   index, so pip takes them without a download;
# - transformers 5.24.0 works although SGLang pins 5.3.0 (5.3.0 is not on the local index).
# The versions are the ones checked.
#
# Options (environment):
#   SPECDECODE_CACHE   cache root (default $HOME/.cache/specdecode_tune)
#   SGLANG_SPEC        requirement (default "sglang==0.5.10.post1")
set -euo pipefail

CACHE="${SPECDECODE_CACHE:-$HOME/.cache/specdecode_tune}"
VENV="$CACHE/sglang-venv"
PY="$VENV/bin/python"
SPEC="${SGLANG_SPEC:-sglang==0.5.10.post1}"
STAMP="$VENV/.specdecode-installed"

TORCH=(torch==2.14.1 torchvision==0.29.1)
DEPS=(
    tqdm==4.70.1 pybase64==1.5.1 requests==2.34.2 ipython==9.18.1 pydantic==2.14.4
    aiohttp==3.14.5 safetensors==0.8.0 orjson==3.13.0 packaging==26.4 starlette==1.10.0
    openai==3.57.0 partial-json-parser==0.2.1.1.post7 huggingface-hub==2.4.0
    transformers==5.24.0 pyzmq==27.3.0 dill==0.4.1 sentencepiece==0.2.3
    compressed-tensors==0.20.1 gguf==0.19.0
)

check() {
    "$PY" -c 'import sglang.srt.server_args, compressed_tensors, gguf, torchvision.io' \
        >/dev/null 2>&1
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
    echo "install_sglang_cpu: creating $VENV" >&2
    python3 -m venv "$VENV"
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
# Left out of pip's output: its "Location ... is ignored" lines about this machine's local index,
# and its list of SGLang's requirements that --no-deps leaves unmet (expected, ~50 lines).
NOISE='^WARNING: Location|^ERROR: pip.s dependency resolver|^sglang [^ ]+ requires '
quiet() { "$@" 2> >(grep -Ev "$NOISE" >&2 || true) >&2; }
t0=$SECONDS
echo "install_sglang_cpu: installing ${TORCH[*]}" >&2
quiet "$PY" -m pip install --quiet "${TORCH[@]}"
echo "install_sglang_cpu: installing $SPEC (--no-deps) and its parser's imports" >&2
quiet "$PY" -m pip install --quiet --no-deps "$SPEC"
quiet "$PY" -m pip install --quiet "${DEPS[@]}" "${TORCH[@]}"
if ! check; then
    echo "install_sglang_cpu: sglang.srt.server_args does not import in $VENV; last error:" >&2
    "$PY" -c 'import sglang.srt.server_args, compressed_tensors, gguf' 2>&1 | tail -5 >&2 || true
    exit 1
fi
"$PY" -c 'import importlib.metadata as m; print("install_sglang_cpu: sglang", m.version("sglang"), "torch", m.version("torch"), "transformers", m.version("transformers"))' >&2
echo "install_sglang_cpu: done in $(( SECONDS - t0 ))s" >&2
state > "$STAMP"
echo "$PY"
