#!/usr/bin/env bash
# Another SGLang release's own argument parser beside the one scripts/install_sglang_cpu.sh
# installs (0.5.10.post1): a site of its own, layered on that venv's python (torch and the rest
# of the parser's imports come from there), behind a wrapper that puts only this site first.
# For tests/contract/test_sglang_release.py: the GPU experiments name the release their servers
# run (experiments/sglang-gpu.toml: 0.5.17, whose flag names differ), and SGLang's own parser
# of that release must take every command line the backend builds for them.
#
#   bash scripts/install_sglang_release_cpu.sh 0.5.17
#
# Output (last line of stdout): the wrapper, ${SPECDECODE_CACHE:-~/.cache/specdecode_tune}/
# sglang-0.5.17/python. Reused when present.
#
# Not a serving install: sglang --no-deps plus what importing `sglang.srt.server_args` and
# parsing need on top of the 0.5.10.post1 venv, found by trial (each missing import installed
# in turn) and pinned here per release:
# - 0.5.17 pins transformers 5.12.1: the venv's 5.24 makes the import fail ("'qwen3_asr' is
#   already used by a Transformers config"); 5.12.1 needs tokenizers <= 0.23.0 and
#   huggingface-hub < 2 (the venv has 2.4.0), which needs httpx;
# - msgspec (sglang.kernels), xgrammar and apache-tvm-ffi (sglang.srt.constrained), einops
#   (the MoE runner's deep_gemm module, imported by the argument checks).
set -euo pipefail

RELEASE="${1:?usage: install_sglang_release_cpu.sh RELEASE (e.g. 0.5.17)}"
CACHE="${SPECDECODE_CACHE:-$HOME/.cache/specdecode_tune}"
BASE_PY="$CACHE/sglang-venv/bin/python"
HOME_DIR="$CACHE/sglang-$RELEASE"
SITE="$HOME_DIR/site"
WRAPPER="$HOME_DIR/python"
STAMP="$HOME_DIR/.specdecode-installed"

case "$RELEASE" in
    0.5.17) DEPS=(msgspec==0.23.0 transformers==5.12.1 tokenizers==0.22.2
                  huggingface-hub==1.33.0 httpx==0.29.0 httpcore==1.0.9 h11==0.16.0
                  anyio==4.16.0 xgrammar==0.2.9 apache-tvm-ffi==0.1.11 einops==0.8.2) ;;
    *) echo "install_sglang_release_cpu: no dependency list for SGLang $RELEASE (known: 0.5.17)" >&2
       exit 2 ;;
esac

check() {
    "$WRAPPER" -c 'import importlib.metadata as m, sglang.srt.server_args
assert m.version("sglang") == "'"$RELEASE"'", m.version("sglang")' >/dev/null 2>&1
}

# shellcheck source=scripts/install_stamp.sh
source "$(dirname "${BASH_SOURCE[0]}")/install_stamp.sh"
# The wrapper runs the base venv's python with this site first: both sites are the state.
state() { stamp_state "$BASE_PY" "$SITE" "$CACHE"/sglang-venv/lib/python3*/site-packages; }

[[ -x "$BASE_PY" ]] || { echo "install_sglang_release_cpu: no $BASE_PY: run scripts/install_sglang_cpu.sh first" >&2; exit 1; }
if [[ -x "$WRAPPER" && -d "$SITE" ]] && stamp_reusable "$STAMP" "$(state)" check; then
    echo "$WRAPPER"
    exit 0
fi
t0=$SECONDS
rm -rf "$HOME_DIR"
mkdir -p "$SITE"
export PIP_DISABLE_PIP_VERSION_CHECK=1
NOISE='^WARNING: Location|^ERROR: pip.s dependency resolver|requires |incompatible'
echo "install_sglang_release_cpu: sglang==$RELEASE --no-deps and ${#DEPS[@]} parser imports into $SITE" >&2
"$BASE_PY" -m pip install --quiet --no-deps --target "$SITE" "sglang==$RELEASE" "${DEPS[@]}" \
    2> >(grep -Ev "$NOISE" >&2 || true) >&2
printf '#!/bin/sh\n# SGLang %s for its argument parser only (scripts/install_sglang_release_cpu.sh)\nPYTHONPATH=%q exec %q "$@"\n' \
    "$RELEASE" "$SITE" "$BASE_PY" > "$WRAPPER"
chmod +x "$WRAPPER"
if ! check; then
    echo "install_sglang_release_cpu: sglang.srt.server_args does not import; last error:" >&2
    "$WRAPPER" -c 'import sglang.srt.server_args' 2>&1 | tail -3 >&2 || true
    exit 1
fi
echo "install_sglang_release_cpu: sglang $RELEASE in $(( SECONDS - t0 ))s" >&2
state > "$STAMP"
echo "$WRAPPER"
