"""Tiny llama-architecture test models whose greedy output cycles, made locally.

No model hub is reachable from CI, and random weights never repeat themselves, so n-gram
speculation would draft nothing useful on them. These models are built so that it does:

- every token embedding is a random vector of norm sqrt(dim), so RMSNorm leaves it unchanged;
- attention-output and feed-forward-down weights are zero, so the residual stream of a position
  is its own token's embedding, whatever the layers compute;
- the output (lm_head) row of token c[i+1] of a fixed cycle c[0..N-1] is the embedding of c[i]
  (scaled), every other row is zero: greedy decoding then emits c[i+1] after c[i], forever, and
  any prompt token enters the cycle at once (its embedding is closest to some cycle row).

n-gram speculation then accepts every draft once one cycle has been generated. `noise` adds
Gaussian noise to the attention-output and FFN-down weights (standard deviation
noise / sqrt(fan_in)): attention mixes in the context, which sometimes tips the argmax to
another cycle token, a jump the n-gram drafter cannot foresee. Acceptance falls as noise grows;
the output is still deterministic (greedy), so a trial can be repeated exactly.

Two formats:

- GGUF for llama.cpp (`gguf` package), with the vocabulary of a vocabulary-only GGUF that
  llama.cpp ships (`scripts/build_llama_server.sh` copies one next to the binary); the cycle
  uses ordinary word pieces of that vocabulary.
- An HF model directory for vLLM (`transformers` + `torch`, `save_pretrained`), with a
  word-level tokenizer trained locally (`tokenizers`) on the project's random workload text
  plus the cycle's made-up words. Run this with the vLLM venv's python, which has them.

    python -m specdecode_tune.testmodels gguf --out m.gguf --cycle 32 --noise 0.0 --dim 256
    $VLLM_PY -m specdecode_tune.testmodels hf --out m-hf --cycle 32 --noise 0.0 --dim 256

`CycleModelSpec` and `cycle_weights` are pure numpy; the writers import their packages lazily.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

# The top logit (the cycle's next token) is about this large; the others are about
# LOGIT_SCALE / sqrt(dim) * N(0, 1). Large enough for a clear greedy choice, small enough to
# keep bf16/f16 logits exact.
LOGIT_SCALE = 20.0

# llama.cpp / GGUF tensor names -> HF LlamaForCausalLM state-dict names. Shapes are the same
# ([out, in]); GGUF files from llama.cpp's converter have Q and K rows permuted for its RoPE
# layout, which does not matter here: Q and K are random and each format is its own model.
_HF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_HF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


@dataclass(frozen=True)
class CycleModelSpec:
    """The architecture and the cycle of one test model; validates itself."""

    vocab_size: int
    cycle_tokens: tuple[int, ...]
    dim: int = 256
    layers: int = 2
    heads: int = 4
    kv_heads: int = 4
    ffn: int = 512
    noise: float = 0.0
    seed: int = 0
    context_length: int = 4096
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "layers", "heads", "kv_heads", "ffn",
                     "context_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {name}={value!r}")
        if self.dim % self.heads:
            raise ValueError(f"dim must be a multiple of heads, got dim={self.dim}, "
                             f"heads={self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads must be a multiple of kv_heads, got heads={self.heads}, "
                             f"kv_heads={self.kv_heads}")
        if (self.dim // self.heads) % 2:
            raise ValueError(f"the head size dim/heads must be even for RoPE, got "
                             f"{self.dim // self.heads}")
        if len(self.cycle_tokens) < 2:
            raise ValueError(f"cycle_tokens must hold at least 2 tokens, got "
                             f"{self.cycle_tokens!r}")
        if len(set(self.cycle_tokens)) != len(self.cycle_tokens):
            raise ValueError("cycle_tokens must not repeat a token (the cycle would not be "
                             "a function of the last token)")
        bad = [t for t in self.cycle_tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"cycle_tokens must be in [0, {self.vocab_size}), got {bad[:3]}")
        if not (math.isfinite(self.noise) and self.noise >= 0):
            raise ValueError(f"noise must be a finite number >= 0, got noise={self.noise!r}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def n_params(self) -> int:
        d, hd = self.dim, self.head_dim
        per_layer = 2 * d + d * hd * (2 * self.heads + 2 * self.kv_heads) + 3 * d * self.ffn
        return 2 * self.vocab_size * d + d + self.layers * per_layer

    def next_token(self) -> dict[int, int]:
        """The noiseless model's greedy successor of each cycle token."""
        c = self.cycle_tokens
        return {c[i]: c[(i + 1) % len(c)] for i in range(len(c))}


def cycle_weights(spec: CycleModelSpec) -> dict[str, np.ndarray]:
    """All tensors (float32, GGUF names, [out, in] shapes) of the model `spec` describes."""
    rng = np.random.default_rng(spec.seed)
    d, f, hd = spec.dim, spec.ffn, spec.head_dim

    def normal(shape: tuple[int, int], std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    emb = rng.standard_normal((spec.vocab_size, d))
    emb *= math.sqrt(d) / np.linalg.norm(emb, axis=1, keepdims=True)
    emb = emb.astype(np.float32)
    out = np.zeros((spec.vocab_size, d), dtype=np.float32)
    c = spec.cycle_tokens
    for i, tok in enumerate(c):
        # logits[c[i+1]] = (LOGIT_SCALE / d) * emb[c[i]] . emb[c[i]] = LOGIT_SCALE
        out[c[(i + 1) % len(c)]] = emb[tok] * (LOGIT_SCALE / d)

    w: dict[str, np.ndarray] = {"token_embd.weight": emb}
    for i in range(spec.layers):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = np.ones(d, dtype=np.float32)
        w[p + "attn_q.weight"] = normal((spec.heads * hd, d), 1 / math.sqrt(d))
        w[p + "attn_k.weight"] = normal((spec.kv_heads * hd, d), 1 / math.sqrt(d))
        w[p + "attn_v.weight"] = normal((spec.kv_heads * hd, d), 1 / math.sqrt(d))
        # Always drawn, then scaled, so that one seed gives the same Q/K/V/gate/up at any noise.
        w[p + "attn_output.weight"] = normal((d, spec.heads * hd), 1 / math.sqrt(d)) * \
            np.float32(spec.noise)
        w[p + "ffn_norm.weight"] = np.ones(d, dtype=np.float32)
        w[p + "ffn_gate.weight"] = normal((f, d), 1 / math.sqrt(d))
        w[p + "ffn_up.weight"] = normal((f, d), 1 / math.sqrt(d))
        w[p + "ffn_down.weight"] = normal((d, f), 1 / math.sqrt(f)) * np.float32(spec.noise)
    w["output_norm.weight"] = np.ones(d, dtype=np.float32)
    w["output.weight"] = out
    return w


def hf_state_names(name: str) -> str:
    """The HF LlamaForCausalLM name of a GGUF tensor name."""
    if name in _HF_NAMES:
        return _HF_NAMES[name]
    _, layer, rest = name.split(".", 2)
    return f"model.layers.{layer}.{_HF_LAYER_NAMES[rest]}"


def reference_greedy(weights: dict[str, np.ndarray], tokens: Sequence[int], n: int) -> list[int]:
    """The noiseless model's greedy continuation from the last token (no attention needed:
    with zero attention-output and FFN-down weights each position sees only its own token)."""
    emb, out = weights["token_embd.weight"], weights["output.weight"]
    last, result = int(tokens[-1]), []
    for _ in range(n):
        x = emb[last]
        x = x / np.sqrt(np.mean(x * x) + 1e-5)
        last = int(np.argmax(out @ x))
        result.append(last)
    return result


# ---------------------------------------------------------------------------------------------
# GGUF (llama.cpp)


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
    spec = CycleModelSpec(
        vocab_size=len(tokens), cycle_tokens=tuple(pick_cycle_gguf(tokens, types, cycle, seed)),
        dim=dim, layers=layers, heads=heads, kv_heads=kv_heads or heads, ffn=ffn or 2 * dim,
        noise=noise, seed=seed, context_length=context_length)
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
        raise ValueError(f"{path}: not a model written by specdecode_tune.testmodels")
    data = json.loads(field.contents())
    data["cycle_tokens"] = tuple(data["cycle_tokens"])
    return CycleModelSpec(**data)


# ---------------------------------------------------------------------------------------------
# HF (vLLM)

HF_SPECIALS = ("<unk>", "<s>", "</s>")
_SYLLABLES = ("ba", "ko", "ri", "zu", "te", "mal", "dor", "vi", "sen", "qua", "lo", "pex",
              "ni", "gar", "fu", "tho", "ke", "ly", "mo", "ran", "sa", "wen", "xi", "jo")


def made_up_words(n: int, seed: int) -> list[str]:
    """`n` distinct pronounceable non-words (not common English words, so a prompt of common
    words never matches the cycle by chance)."""
    rng = np.random.default_rng(seed + 2)
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < n:
        word = "".join(_SYLLABLES[i] for i in rng.integers(0, len(_SYLLABLES), size=3))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def train_word_tokenizer(extra_words: Sequence[str]) -> Any:
    """A word-level tokenizer (SentencePiece-style "▁" word boundaries) trained on the
    project's random workload text plus `extra_words`; returns a `tokenizers.Tokenizer`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from .workload import WorkloadSpec, make_prompts

    corpus = [p.text for p in make_prompts(WorkloadSpec(kind="random", input_len=256), 64)]
    corpus.append(" ".join(extra_words))
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    trainer = trainers.WordLevelTrainer(special_tokens=list(HF_SPECIALS), min_frequency=1,
                                        vocab_size=1 << 20)
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


def write_hf(out: Path, *, cycle: int = 32, noise: float = 0.0, dim: int = 256,
             layers: int = 2, heads: int = 4, kv_heads: int | None = None,
             ffn: int | None = None, seed: int = 0, context_length: int = 4096,
             dtype: str = "bfloat16") -> CycleModelSpec:
    """Write a cycling llama model as an HF directory at `out` (replaced atomically by rename);
    needs torch, transformers and tokenizers."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if dtype not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"dtype must be bfloat16, float16 or float32, got {dtype=}")
    words = made_up_words(cycle, seed)
    tok = train_word_tokenizer(words)
    ids = [tok.token_to_id("\u2581" + w) for w in words]
    if any(i is None for i in ids):
        raise RuntimeError("the trained tokenizer lacks a cycle word")
    spec = CycleModelSpec(
        vocab_size=tok.get_vocab_size(), cycle_tokens=tuple(ids), dim=dim, layers=layers,
        heads=heads, kv_heads=kv_heads or heads, ffn=ffn or 2 * dim, noise=noise, seed=seed,
        context_length=context_length)
    weights = cycle_weights(spec)
    config = LlamaConfig(
        vocab_size=spec.vocab_size, hidden_size=spec.dim, intermediate_size=spec.ffn,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads, max_position_embeddings=spec.context_length,
        rms_norm_eps=spec.rms_eps, rope_theta=spec.rope_theta, tie_word_embeddings=False,
        bos_token_id=HF_SPECIALS.index("<s>"), eos_token_id=HF_SPECIALS.index("</s>"),
        pad_token_id=None, hidden_act="silu", torch_dtype=dtype)
    torch_dtype = getattr(torch, dtype)
    with torch.device("cpu"):
        model = LlamaForCausalLM(config)
    state = {hf_state_names(k): torch.from_numpy(v) for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    model = model.to(torch_dtype)

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", model_max_length=spec.context_length)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".", suffix=".tmp"))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        fast.save_pretrained(tmp)
        (tmp / "cycle_spec.json").write_text(json.dumps(asdict(spec)))
        tmp.chmod(0o755)   # mkdtemp makes it private; a model directory is for reading
        if out.exists():
            old = out.with_name(out.name + ".old")
            os.replace(out, old)
            _rmtree(old)
        os.replace(tmp, out)
    except BaseException:
        _rmtree(tmp)
        raise
    return spec


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# CLI


def main(argv: Sequence[str] | None = None) -> int:
    from . import enginecache

    ap = argparse.ArgumentParser(prog="python -m specdecode_tune.testmodels",
                                 description=__doc__.split("\n\n")[0])
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


if __name__ == "__main__":
    sys.exit(main())
