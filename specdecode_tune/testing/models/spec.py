"""The cycle model: its architecture and cycle (`CycleModelSpec`) and its weights, pure numpy.

How the weights make greedy output cycle is in the package docstring (`specdecode_tune.testing
.models`). Tensors use GGUF names and [out, in] shapes; the HF writer renames them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# The top logit (the cycle's next token) is about this large; the others are about
# LOGIT_SCALE / sqrt(dim) * N(0, 1). Large enough for a clear greedy choice, small enough to
# keep bf16/f16 logits exact.
LOGIT_SCALE = 20.0


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


def make_spec(vocab_size: int, cycle_tokens: Sequence[int], *, dim: int = 256,
              layers: int = 2, heads: int = 4, kv_heads: int | None = None,
              ffn: int | None = None, noise: float = 0.0, seed: int = 0,
              context_length: int = 4096) -> CycleModelSpec:
    """The spec the writers build: `kv_heads` defaults to `heads`, `ffn` to 2 * `dim`."""
    return CycleModelSpec(
        vocab_size=vocab_size, cycle_tokens=tuple(cycle_tokens), dim=dim, layers=layers,
        heads=heads, kv_heads=kv_heads or heads, ffn=ffn or 2 * dim, noise=noise, seed=seed,
        context_length=context_length)
