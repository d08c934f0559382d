#!/usr/bin/env bash
# Build llama-server with CUDA (sm_90) from the trimmed source tarball into
# $SPECDECODE_CACHE/llama.cpp-cuda/bin, with the vocabulary GGUF beside it.
set -euo pipefail
TGZ="$1"
OUT="${SPECDECODE_CACHE:?}/llama.cpp-cuda/bin"
[[ -x "$OUT/llama-server" ]] && { echo "cached: $OUT/llama-server"; exit 0; }
S=/tmp/llsrc && rm -rf "$S" && mkdir -p "$S" && tar -xzf "$TGZ" -C "$S"
# An older trimmed tarball dropped app/, which CMakeLists.txt adds unconditionally.
[[ -d "$S/llama.cpp/app" ]] || { mkdir -p "$S/llama.cpp/app" && : > "$S/llama.cpp/app/CMakeLists.txt"; }
cmake -G Ninja -S "$S/llama.cpp" -B "$S/build" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF
t0=$(date +%s)
cmake --build "$S/build" --target llama-server -j"$(nproc)"
mkdir -p "$OUT"
cp "$S/build/bin/llama-server" "$OUT/"
cp "$S/llama.cpp/models/ggml-vocab-llama-spm.gguf" "$OUT/vocab.gguf"
echo "built in $(( $(date +%s) - t0 ))s: $OUT/llama-server"
