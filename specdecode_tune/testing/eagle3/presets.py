"""The two sizes of the EAGLE-3 test pair (`Preset`): `gpu` (one H100, about 4 minutes) and
`toy` (a CPU, under a minute of training, for CI). Standard library only.

Steps, not seconds, bound each training phase, so that a seed gives the same run on any
machine of a kind (a time budget would stop at a different step on a busier machine). The
`gpu` step counts were sized from the throughput measured on an H100 (docs/eagle3-models.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Preset:
    """Every size and step count of one run; validates itself."""

    name: str
    # data: conversations of the training split used (None = all), characters of text the
    # tokenizer is trained on, tokens per packed training sequence
    train_conversations: int | None
    tokenizer_chars: int
    vocab_size: int
    seq_len: int
    # the target (a Llama)
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    max_position: int
    target_steps: int
    target_batch: int          # sequences of seq_len tokens per step
    target_lr: float
    # the EAGLE-3 head: one decoder layer, trained with `ttt_length` unrolled steps
    head_steps: int
    head_batch: int
    head_lr: float
    ttt_length: int
    # the acceptance report
    eval_prompts: int
    eval_prompt_tokens: int    # held-out prompts are cut to at most this many tokens
    eval_new_tokens: int       # tokens generated per prompt
    draft_steps: int           # chain length (topk 1), as --speculative-num-steps
    # "bfloat16" on a GPU (autocast, weights saved in bf16); "float32" on a CPU
    train_dtype: str = "bfloat16"
    saved_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        ints = ("tokenizer_chars", "vocab_size", "seq_len", "hidden", "layers", "heads",
                "kv_heads", "ffn", "max_position", "target_steps", "target_batch", "head_steps",
                "head_batch", "ttt_length", "eval_prompts", "eval_prompt_tokens",
                "eval_new_tokens", "draft_steps")
        for name in ints:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {name}={value!r}")
        if self.hidden % self.heads or (self.hidden // self.heads) % 2:
            raise ValueError(f"hidden must be a multiple of heads with an even head size, got "
                             f"hidden={self.hidden}, heads={self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads must be a multiple of kv_heads, got heads={self.heads}, "
                             f"kv_heads={self.kv_heads}")
        if self.layers < 7:
            # SGLang and vLLM capture the inputs of layers 2, L//2 and L-3, each layer once
            # (`if i in layers_to_capture`): below 7 layers two of them are the same layer,
            # the head would get 2H features where its fc takes 3H.
            raise ValueError(f"layers must be >= 7, got {self.layers}")
        if self.max_position < self.seq_len:
            raise ValueError(f"max_position must be >= seq_len, got {self.max_position} < "
                             f"{self.seq_len}")
        if self.eval_prompt_tokens + self.eval_new_tokens + self.draft_steps + 2 \
                > self.max_position:
            raise ValueError("eval_prompt_tokens + eval_new_tokens + draft_steps must fit "
                             "in max_position")
        if self.train_dtype not in ("bfloat16", "float32") or \
                self.saved_dtype not in ("bfloat16", "float32"):
            raise ValueError("train_dtype and saved_dtype must be bfloat16 or float32")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def capture_layers(self) -> tuple[int, int, int]:
        """The target layers whose INPUT (residual stream before the layer) feeds the head:
        SGLang 0.5.17's and vLLM 0.26.0's default (2, L // 2, L - 3)."""
        n = self.layers
        return (2, n // 2, n - 3)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


PRESETS: dict[str, Preset] = {
    # One H100: a 39.9M-parameter Llama (hidden 512, 10 layers, GQA 8/4 heads of 64) trained
    # on 49M tokens (~2.8 passes over the training split's ~17.5M), its head on 12.3M x 7 TTT
    # steps. Run on an H100 with 1100/550 steps and 128 new tokens: 255 s; these cut ~26 s.
    "gpu": Preset(
        name="gpu", train_conversations=None, tokenizer_chars=6_000_000, vocab_size=8192,
        seq_len=1024, hidden=512, layers=10, heads=8, kv_heads=4, ffn=1536,
        max_position=2048, target_steps=1000, target_batch=48, target_lr=1.5e-3,
        head_steps=500, head_batch=24, head_lr=1.5e-3, ttt_length=7,
        eval_prompts=64, eval_prompt_tokens=256, eval_new_tokens=96, draft_steps=7),
    # A CPU in CI: a 0.4M-parameter Llama on a few hundred conversations.
    "toy": Preset(
        name="toy", train_conversations=300, tokenizer_chars=300_000, vocab_size=512,
        seq_len=128, hidden=64, layers=7, heads=2, kv_heads=1, ffn=192,
        max_position=512, target_steps=150, target_batch=16, target_lr=1e-2,
        head_steps=80, head_batch=8, head_lr=4e-3, ttt_length=5,
        eval_prompts=16, eval_prompt_tokens=48, eval_new_tokens=40, draft_steps=5,
        train_dtype="float32", saved_dtype="float32"),
}
