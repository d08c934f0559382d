#!/usr/bin/env bash
# Fill .dev1/.dev2/.dev3 (see README.md here) with what the GPU machine lacks.
set -euo pipefail
cd "$(dirname "$0")/../.."
W="$(mktemp -d)"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
python3 -m pip download -q "${plat[@]}" -d "$W" 'ray[tune]==2.60.0' optuna==5.0.0 aiohttp nvidia-ml-py pyarrow gguf
python3 -m pip download -q --no-binary :all: --no-deps -d "$W" llama-cpp-python==0.3.36
mkdir -p .dev1 .dev2 .dev3
split -b 45000000 "$W"/ray-2.60.0-*.whl .dev1/ray.part-
mv .dev1/ray.part-ab .dev2/
for f in "$W"/*.whl; do
  case "$(basename "$f")" in ray-*|numpy-*) ;; pyarrow-*) cp "$f" .dev3/ ;; pandas-*) cp "$f" .dev2/ ;; *) cp "$f" .dev1/ ;; esac
done
tar -xzf "$W"/llama_cpp_python-0.3.36.tar.gz -C "$W"
src="$W/llama_cpp_python-0.3.36/vendor/llama.cpp"
rm -rf "$src"/{docs,tests,benches,examples,media,pocs,ci,gguf-py,conversion,skills,requirements,.devops,.github}
find "$src/models" -type f ! -name 'ggml-vocab-llama-spm.gguf' -delete
tar -czf .dev2/llama-src.tgz -C "$src/.." llama.cpp
rm -rf "$W"
du -sh .dev1 .dev2 .dev3
