"""The test-model tool's command line (`python -m specdecode_tune.testing.models`): write a
cycle model as a GGUF file or as an HF directory.

    python -m specdecode_tune.testing.models gguf --out m.gguf --cycle 32 --noise 0.0 --dim 256
    $VLLM_PY -m specdecode_tune.testing.models hf --out m-hf --cycle 32 --noise 0.0 --dim 256
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ... import enginecache
from .gguf_file import write_gguf
from .hf_dir import write_hf

DESCRIPTION = "Tiny llama-architecture test models whose greedy output cycles, made locally."


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdecode_tune.testing.models",
                                 description=DESCRIPTION)
    sub = ap.add_subparsers(dest="format", required=True)
    for name in ("gguf", "hf"):
        p = sub.add_parser(name, help=f"write a {name.upper()} model")
        p.add_argument("--out", required=True, type=Path, help="file (gguf) or directory (hf)")
        p.add_argument("--cycle", type=int, default=32, help="cycle length in tokens (32)")
        p.add_argument("--noise", type=float, default=0.0,
                       help="noise on attention-output/FFN-down weights; 0 = accept all (0)")
        p.add_argument("--dim", type=int, default=256)
        p.add_argument("--layers", type=int, default=2)
        p.add_argument("--heads", type=int, default=4)
        p.add_argument("--kv-heads", type=int, default=None)
        p.add_argument("--ffn", type=int, default=None, help="FFN width (2 * dim)")
        p.add_argument("--ctx", type=int, default=4096, help="context length (4096)")
        p.add_argument("--seed", type=int, default=0)
        if name == "gguf":
            p.add_argument("--vocab-gguf", type=Path, default=None,
                           help=f"vocabulary-only GGUF (default {enginecache.vocab_gguf_path()})")
            p.add_argument("--dtype", choices=("f16", "f32"), default="f16")
        else:
            p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"),
                           default="bfloat16")
    args = ap.parse_args(argv)
    common: dict[str, Any] = {
        "cycle": args.cycle, "noise": args.noise, "dim": args.dim, "layers": args.layers,
        "heads": args.heads, "kv_heads": args.kv_heads, "ffn": args.ffn, "seed": args.seed,
        "context_length": args.ctx, "dtype": args.dtype}
    try:
        if args.format == "gguf":
            vocab = args.vocab_gguf or enginecache.vocab_gguf_path()
            if not vocab.is_file():
                print(f"testmodels: no vocabulary GGUF at {vocab} (run "
                      f"scripts/build_llama_server.sh, or pass --vocab-gguf)", file=sys.stderr)
                return 2
            spec = write_gguf(args.out, vocab_gguf=vocab, **common)
        else:
            spec = write_hf(args.out, **common)
    except ValueError as e:
        print(f"testmodels: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"testmodels: {args.format} needs a package that is not installed: {e.name} "
              f"(gguf: pip install gguf; hf: use the vLLM venv's python)", file=sys.stderr)
        return 2
    n_params = spec.n_params
    print(f"{args.out}: {args.format} llama, vocab {spec.vocab_size}, dim {spec.dim}, "
          f"{spec.layers} layers, {n_params / 1e6:.1f}M params, cycle {len(spec.cycle_tokens)}, "
          f"noise {spec.noise:g}")
    return 0
