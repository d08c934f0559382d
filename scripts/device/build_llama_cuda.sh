#!/usr/bin/env bash
# Build llama-server with CUDA from the trimmed llama.cpp source tarball (made by
# pack_payload.py) into $SPECDECODE_CACHE/llama.cpp-cuda/bin, with the vocabulary GGUF beside it.
# gpu_search.py starts it in the background (~5 min on the 16-core H200 machine); a second run
# finds the binary and exits at once.
#
#   CUDA_ARCHITECTURES  the GPUs' compute capability without the dot (default: what nvidia-smi
#                       reports for GPU 0, e.g. 90 on an H100/H200; 90 if nvidia-smi can't say)
#   JOBS                build parallelism (default: nproc)
set -euo pipefail
TGZ="$1"
DEST="${SPECDECODE_CACHE:?}/llama.cpp-cuda/bin"
[[ -x "$DEST/llama-server" ]] && { echo "cached: $DEST/llama-server"; exit 0; }
ARCH="${CUDA_ARCHITECTURES:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null \
    | head -n1 | tr -d '. ')}"
ARCH="${ARCH:-90}"
S="$(mktemp -d "${TMPDIR:-/tmp}/llama-cuda.XXXXXX")"
trap 'rm -rf "$S"' EXIT
tar -xzf "$TGZ" -C "$S"
# An older trimmed tarball dropped app/, which CMakeLists.txt adds unconditionally.
[[ -d "$S/llama.cpp/app" ]] || { mkdir -p "$S/llama.cpp/app" && : > "$S/llama.cpp/app/CMakeLists.txt"; }
echo "build_llama_cuda: CUDA architectures $ARCH, $(nproc) cores"
t0=$(date +%s)
cmake -G Ninja -S "$S/llama.cpp" -B "$S/build" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_CCACHE=OFF
cmake --build "$S/build" --target llama-server -j"${JOBS:-$(nproc)}"
mkdir -p "$DEST"
# Stage, then rename: an interrupted run never leaves a half-written binary.
install -m 0755 "$S/build/bin/llama-server" "$DEST/llama-server.tmp"
cp "$S/llama.cpp/models/ggml-vocab-llama-spm.gguf" "$DEST/vocab.gguf"
mv -f "$DEST/llama-server.tmp" "$DEST/llama-server"
echo "built in $(( $(date +%s) - t0 ))s: $DEST/llama-server"
