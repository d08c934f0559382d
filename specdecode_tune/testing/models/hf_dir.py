"""The cycle model as an HF model directory for vLLM (`transformers`, `torch`, `tokenizers`).

The tokenizer is word-level, trained locally (`tokenizers`) on the project's random workload
text plus the cycle's made-up words. Those packages are imported lazily: run the writer with
the vLLM venv's python, which has them from vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from ..folders import whole_folder
from .spec import CycleModelSpec, cycle_weights, make_spec

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


def hf_state_names(name: str) -> str:
    """The HF LlamaForCausalLM name of a GGUF tensor name."""
    if name in _HF_NAMES:
        return _HF_NAMES[name]
    _, layer, rest = name.split(".", 2)
    return f"model.layers.{layer}.{_HF_LAYER_NAMES[rest]}"


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

    from ...config import WorkloadSpec
    from ...load.workload import make_prompts

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
    spec = make_spec(tok.get_vocab_size(), ids, dim=dim, layers=layers, heads=heads,
                     kv_heads=kv_heads, ffn=ffn, noise=noise, seed=seed,
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
    with whole_folder(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        fast.save_pretrained(tmp)
        (tmp / "cycle_spec.json").write_text(json.dumps(asdict(spec)))
    return spec

