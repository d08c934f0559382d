#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the source bundled in the PyPI sdist of
# llama-cpp-python (vendor/llama.cpp), into a cache folder outside the repository.
#
# Why the sdist: no model hub or git host is reachable from CI, but the package registry is, and
# this sdist carries a pinned llama.cpp tree (plus vocabulary-only GGUF files under models/).
#
# Output (printed as the last line of stdout):
#   ${SPECDECODE_CACHE:-$HOME/.cache/specdecode_tune}/llama.cpp-<ver>/bin/llama-server
# Alongside it: bin/vocab.gguf, a vocabulary-only GGUF that specdecode_tune.testing.models uses.
# A second run finds the binary and exits at once.
#
# Options (environment):
#   SPECDECODE_CACHE   cache root (default $HOME/.cache/specdecode_tune)
#   LLAMA_CPP_PY_VERSION  sdist version (default 0.3.36)
#   JOBS               build parallelism (default: nproc)
set -euo pipefail

VERSION="${LLAMA_CPP_PY_VERSION:-0.3.36}"
CACHE="${SPECDECODE_CACHE:-$HOME/.cache/specdecode_tune}"
PREFIX="$CACHE/llama.cpp-$VERSION"
BIN="$PREFIX/bin/llama-server"
VOCAB="$PREFIX/bin/vocab.gguf"
JOBS="${JOBS:-$(nproc)}"
# Vocabulary files llama.cpp ships, most useful first (SentencePiece llama first: a llama model).
VOCAB_CANDIDATES=(ggml-vocab-llama-spm.gguf ggml-vocab-llama-bpe.gguf ggml-vocab-gpt-2.gguf)

if [[ -x "$BIN" && -s "$VOCAB" ]]; then
    echo "$BIN"
    exit 0
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/llama-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

echo "build_llama_server: downloading llama-cpp-python==$VERSION sdist" >&2
python3 -m pip download --no-binary :all: --no-deps \
    --dest "$WORK/dl" "llama-cpp-python==$VERSION" >&2
SDIST="$(find "$WORK/dl" -maxdepth 1 -name 'llama*cpp*python-*.tar.gz' | head -n1)"
if [[ -z "$SDIST" ]]; then
    echo "build_llama_server: no sdist downloaded into $WORK/dl" >&2
    exit 1
fi
tar -xzf "$SDIST" -C "$WORK"
SRC="$(find "$WORK" -mindepth 3 -maxdepth 3 -type d -path '*/vendor/llama.cpp' | head -n1)"
if [[ -z "$SRC" || ! -f "$SRC/CMakeLists.txt" ]]; then
    echo "build_llama_server: vendor/llama.cpp not found in $SDIST" >&2
    exit 1
fi

echo "build_llama_server: configuring $SRC" >&2
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
# LLAMA_USE_PREBUILT_UI=OFF: the default downloads a web UI at configure time (no network here).
# No curl/OpenSSL: models are local files; the flags differ between llama.cpp versions and
# unknown ones are only warned about by CMake.
cmake -S "$SRC" -B "$WORK/build" "${GEN[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_LLGUIDANCE=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON \
    -DGGML_NATIVE=ON -DGGML_CCACHE=OFF >&2

echo "build_llama_server: building llama-server with $JOBS jobs" >&2
cmake --build "$WORK/build" --config Release --target llama-server -j "$JOBS" >&2

BUILT="$(find "$WORK/build" -type f -name llama-server -perm -u+x | head -n1)"
if [[ -z "$BUILT" ]]; then
    echo "build_llama_server: the build produced no llama-server binary" >&2
    exit 1
fi

# Stage, then rename: a concurrent or interrupted run never leaves a half-written binary at $BIN.
mkdir -p "$PREFIX/bin"
install -m 0755 "$BUILT" "$BIN.tmp.$$"
for name in "${VOCAB_CANDIDATES[@]}"; do
    if [[ -s "$SRC/models/$name" ]]; then
        cp "$SRC/models/$name" "$VOCAB.tmp.$$"
        mv -f "$VOCAB.tmp.$$" "$VOCAB"
        echo "$name" > "$PREFIX/bin/vocab.source"
        break
    fi
done
if [[ ! -s "$VOCAB" ]]; then
    echo "build_llama_server: none of ${VOCAB_CANDIDATES[*]} in $SRC/models" >&2
    rm -f "$BIN.tmp.$$"
    exit 1
fi
mv -f "$BIN.tmp.$$" "$BIN"
"$BIN" --version >&2 || true
echo "$BIN"
