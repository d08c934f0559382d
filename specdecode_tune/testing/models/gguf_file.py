"""The cycle model as a GGUF file for llama.cpp (`gguf` package, imported lazily).

The vocabulary is a vocabulary-only GGUF that llama.cpp ships (`scripts/build_llama_server.sh`
copies one next to the binary); the cycle uses ordinary word pieces of it. The spec is
recorded in the file's metadata (`specdecode_tune.cycle_spec`), read back by `read_gguf_spec`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from .spec import CycleModelSpec, cycle_weights, make_spec


def _read_vocab(vocab_gguf: Path) -> dict[str, Any]:
    import gguf

    reader = gguf.GGUFReader(str(vocab_gguf))
    fields = {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    if "tokenizer.ggml.tokens" not in fields:
        raise ValueError(f"{vocab_gguf}: no tokenizer.ggml.tokens: not a vocabulary GGUF")
    return fields


def pick_cycle_gguf(tokens: Sequence[str], types: Sequence[int], n: int, seed: int) -> list[int]:
    """`n` distinct ordinary word pieces ("▁word", letters only, 3+ letters) of a SentencePiece
    or BPE vocabulary, in a seeded order."""
    normal = 1   # gguf.TokenType.NORMAL
    ok = []
    for i, (piece, typ) in enumerate(zip(tokens, types)):
        word = piece[1:] if piece[:1] in ("\u2581", "\u0120") else None
        if typ == normal and word and len(word) >= 3 and word.isascii() and word.isalpha() \
                and word.islower():
            ok.append(i)
    if len(ok) < n:
        raise ValueError(f"the vocabulary has only {len(ok)} word tokens, cycle={n} asked")
    rng = np.random.default_rng(seed + 1)
    return [int(t) for t in rng.choice(ok, size=n, replace=False)]


def write_gguf(out: Path, *, vocab_gguf: Path, cycle: int = 32, noise: float = 0.0,
               dim: int = 256, layers: int = 2, heads: int = 4, kv_heads: int | None = None,
               ffn: int | None = None, seed: int = 0, context_length: int = 4096,
               dtype: str = "f16") -> CycleModelSpec:
    """Write a cycling llama model as GGUF at `out` (atomically); returns its spec."""
    import gguf

    if dtype not in ("f16", "f32"):
        raise ValueError(f"dtype must be f16 or f32, got {dtype=}")
    vocab = _read_vocab(vocab_gguf)
    tokens = [str(t) for t in vocab["tokenizer.ggml.tokens"]]
    types = [int(t) for t in vocab.get("tokenizer.ggml.token_type", [1] * len(tokens))]
    spec = make_spec(len(tokens), pick_cycle_gguf(tokens, types, cycle, seed), dim=dim,
                     layers=layers, heads=heads, kv_heads=kv_heads, ffn=ffn, noise=noise,
                     seed=seed, context_length=context_length)
    weights = cycle_weights(spec)

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=out.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, "llama")
        w.add_name(f"cycle-llama-c{cycle}-n{noise:g}")
        w.add_context_length(spec.context_length)
        w.add_embedding_length(spec.dim)
        w.add_block_count(spec.layers)
        w.add_feed_forward_length(spec.ffn)
        w.add_head_count(spec.heads)
        w.add_head_count_kv(spec.kv_heads)
        w.add_layer_norm_rms_eps(spec.rms_eps)
        w.add_rope_dimension_count(spec.head_dim)
        w.add_rope_freq_base(spec.rope_theta)
        w.add_vocab_size(spec.vocab_size)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16"
                        else gguf.LlamaFileType.ALL_F32)
        _add_tokenizer(w, vocab)
        w.add_string("specdecode_tune.cycle_spec", json.dumps(asdict(spec)))
        for name, arr in weights.items():
            # 1-D tensors (norms) stay F32, as llama.cpp's converter writes them.
            w.add_tensor(name, arr.astype(np.float16) if dtype == "f16" and arr.ndim == 2
                         else arr)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.chmod(tmp, 0o644)   # mkstemp makes it private; a model file is for reading
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return spec


def _add_tokenizer(w: Any, vocab: dict[str, Any]) -> None:
    w.add_tokenizer_model(str(vocab.get("tokenizer.ggml.model", "llama")))
    if "tokenizer.ggml.pre" in vocab:
        w.add_tokenizer_pre(str(vocab["tokenizer.ggml.pre"]))
    w.add_token_list([str(t) for t in vocab["tokenizer.ggml.tokens"]])
    if "tokenizer.ggml.scores" in vocab:
        w.add_token_scores([float(s) for s in vocab["tokenizer.ggml.scores"]])
    if "tokenizer.ggml.token_type" in vocab:
        w.add_token_types([int(t) for t in vocab["tokenizer.ggml.token_type"]])
    if "tokenizer.ggml.merges" in vocab:
        w.add_token_merges([str(m) for m in vocab["tokenizer.ggml.merges"]])
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id),
                     ("unknown_token_id", w.add_unk_token_id),
                     ("padding_token_id", w.add_pad_token_id)):
        if f"tokenizer.ggml.{key}" in vocab:
            add(int(vocab[f"tokenizer.ggml.{key}"]))
    for key, add in (("add_bos_token", w.add_add_bos_token),
                     ("add_eos_token", w.add_add_eos_token)):
        if f"tokenizer.ggml.{key}" in vocab:
            add(bool(vocab[f"tokenizer.ggml.{key}"]))


def read_gguf_spec(path: Path) -> CycleModelSpec:
    """The spec a GGUF written by `write_gguf` records in its metadata."""
    import gguf

    field = gguf.GGUFReader(str(path)).fields.get("specdecode_tune.cycle_spec")
    if field is None:
        raise ValueError(f"{path}: not a model written by specdecode_tune.testing.models")
    data = json.loads(field.contents())
    data["cycle_tokens"] = tuple(data["cycle_tokens"])
    return CycleModelSpec(**data)

