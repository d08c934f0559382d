"""The EAGLE-3 draft head: its module, its test-time-training (TTT) loop, its folder.

The computation is SGLang 0.5.17's `LlamaForCausalLMEagle3` (sglang/srt/models/llama_eagle3.py)
for one layer, as it runs in `eagle_worker_v2.py`:

- `fc`: [3H] -> [H] on the target's captured hidden states (`target.Capture`), applied only
  where the hidden state is 3H wide (the draft extend after a prefill or a verify);
- the layer: `residual = h`; `x = cat(input_layernorm(embed(token)), hidden_norm(h))` (embedding
  FIRST); q/k/v take 2H; `h = o_proj(attn(x)) + residual`; `h = mlp(post_attention_layernorm(h))
  + h`; the logits are `lm_head(norm(h))` and the hidden state passed to the next draft step is
  `h` BEFORE that norm (`norm_output` unset);
- `embed_tokens` is the target's: SGLang calls `set_embed` (eagle_worker_v2.py `init_lm_head`;
  `load_lm_head_from_target` is False because the config names `draft_vocab_size`), vLLM shares
  it when the file's copy is equal; it is a frozen copy here and written to the file;
- positions: the draft extend puts the head's row i (input token t[i+1], target hidden h[i]) at
  position i, and each draft step adds 1 (`forward_batch.positions.add_(1)`).

TTT (SpecForge's `OnlineEagle3Model.forward`): step 0 is the draft extend over every row; step s
feeds row i the token t[i+1+s] and the head's own step-(s-1) output at row i, at position i+s,
attending to the step-0 keys of rows <= i and to row i's own keys of steps 1..s, which is the
KV cache a chain drafted from row i sees in SGLang. The loss of step s is the cross-entropy to
the target's distribution at position i+1+s (soft labels), weighted 0.8**s. Unlike SpecForge,
the positions advance with s as they do when serving (SpecForge keeps position i), and
`lm_head`/`norm` start from the target's (SpecForge starts `lm_head` at random; EAGLE-1 and
-2 kept the target's).

Folder: `config.json` (architectures `LlamaForCausalLMEagle3`, model_type llama, one layer,
`draft_vocab_size` = `vocab_size`, so no d2t/t2d) and `model.safetensors` with SpecForge's
names (`fc.weight`, `midlayer.*`, `norm.weight`, `lm_head.weight`, `embed_tokens.weight`), which
SGLang 0.5.10 loads as they are, SGLang 0.5.17 through its legacy map (`midlayer` ->
`layers.0`), and vLLM 0.26.0 through its `WeightsMapper` (`midlayer.` -> `layers.0.`).
No `eagle_config` is written: the layer ids in it mean different layers to SGLang (which adds 1)
and to vLLM (which does not); without it both capture the inputs of layers 2, L//2, L-3.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .presets import Preset
from .target import RMS_EPS, ROPE_THETA, Capture, adamw, autocast, batches, lr_at
from .tokenizer import BOS_ID, EOS_ID

LOSS_DECAY = 0.8


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + RMS_EPS)
        return self.weight * x32.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, p: Preset) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = p.heads, p.kv_heads, p.head_dim
        self.q_proj = nn.Linear(2 * p.hidden, p.heads * p.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * p.hidden, p.kv_heads * p.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * p.hidden, p.kv_heads * p.head_dim, bias=False)
        self.o_proj = nn.Linear(p.heads * p.head_dim, p.hidden, bias=False)


class MLP(nn.Module):
    def __init__(self, p: Preset) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(p.hidden, p.ffn, bias=False)
        self.up_proj = nn.Linear(p.hidden, p.ffn, bias=False)
        self.down_proj = nn.Linear(p.ffn, p.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, p: Preset) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(p.hidden)
        self.hidden_norm = RMSNorm(p.hidden)
        self.self_attn = Attention(p)
        self.post_attention_layernorm = RMSNorm(p.hidden)
        self.mlp = MLP(p)


@dataclass
class KV:
    """The head's KV cache for one unrolled chain: the step-0 keys/values of every row
    (`k0`, `v0`: [B, heads, T, d], heads already repeated for GQA) and, per later step, one
    key/value per chain row ([B, heads, R, d]); `rows` [B, R] is the row each chain extends."""

    k0: torch.Tensor | None = None
    v0: torch.Tensor | None = None
    rows: torch.Tensor | None = None
    chain_k: list[torch.Tensor] = field(default_factory=list)
    chain_v: list[torch.Tensor] = field(default_factory=list)


def rope(x: torch.Tensor, pos: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Neox-style rotary embedding (SGLang's `is_neox_style=True`, transformers' Llama),
    computed in fp32 as SGLang's CUDA kernel does: x [B, heads, R, d], pos [B, R]."""
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim, 2, device=x.device,
                                             dtype=torch.float32) / head_dim))
    ang = pos.float()[..., None] * inv                       # [B, R, d/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None]
    half = head_dim // 2
    x32 = x.float()
    rot = torch.cat([-x32[..., half:], x32[..., :half]], -1)
    return (x32 * cos + rot * sin).to(x.dtype)


class Eagle3Head(nn.Module):
    """Parameter names are the checkpoint's (SpecForge's) names."""

    def __init__(self, p: Preset, embed: torch.Tensor) -> None:
        super().__init__()
        self.p = p
        self.register_buffer("embed_tokens", embed.detach().clone(), persistent=False)
        self.fc = nn.Linear(3 * p.hidden, p.hidden, bias=False)
        self.midlayer = MidLayer(p)
        self.norm = RMSNorm(p.hidden)
        self.lm_head = nn.Linear(p.hidden, p.vocab_size, bias=False)

    def state_for_file(self) -> dict[str, torch.Tensor]:
        state = {k: v for k, v in self.state_dict().items()}
        state["embed_tokens.weight"] = self.embed_tokens
        return state

    def step(self, tokens: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor, kv: KV,
             rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step. tokens [B, R], hidden [B, R, H] (or [B, R, 3H]: then `fc` first),
        pos [B, R]. The first call on a `kv` is step 0 (R = T rows, causal); later calls
        extend the rows `rows` [B, R] of it. Returns (hidden before the final norm, logits)."""
        if hidden.shape[-1] != self.p.hidden:
            hidden = self.fc(hidden)
        layer, a = self.midlayer, self.midlayer.self_attn
        emb = F.embedding(tokens, self.embed_tokens).to(hidden.dtype)
        x = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(hidden)], dim=-1)
        b, r, _ = x.shape
        q = a.q_proj(x).view(b, r, a.heads, a.head_dim).transpose(1, 2)
        k = a.k_proj(x).view(b, r, a.kv_heads, a.head_dim).transpose(1, 2)
        v = a.v_proj(x).view(b, r, a.kv_heads, a.head_dim).transpose(1, 2)
        q, k = rope(q, pos, a.head_dim), rope(k, pos, a.head_dim)
        rep = a.heads // a.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if kv.k0 is None:
            kv.k0, kv.v0 = k, v
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            assert kv.v0 is not None and rows is not None
            kv.chain_k.append(k)
            kv.chain_v.append(v)
            t = kv.k0.shape[2]
            keys = torch.cat([kv.k0, *kv.chain_k], dim=2)
            vals = torch.cat([kv.v0, *kv.chain_v], dim=2)
            causal = torch.arange(t, device=x.device)[None, None, :] <= rows[:, :, None]
            eye = torch.eye(r, dtype=torch.bool, device=x.device)[None].expand(b, r, r)
            mask = torch.cat([causal] + [eye] * len(kv.chain_k), dim=-1)[:, None]
            if r == 1:
                # one query a row (the simulated chain): plain attention, which is all a
                # masked SDPA call does for it (and was the slow part of the report on an
                # H100, which the per-call kernel choice may explain)
                w = (q @ keys.transpose(-1, -2)).float() * a.head_dim ** -0.5
                w = w.masked_fill(~mask, float("-inf")).softmax(-1)
                o = w.to(vals.dtype) @ vals
            else:
                o = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask)
        h = a.o_proj(o.transpose(1, 2).reshape(b, r, a.heads * a.head_dim)) + hidden
        h = layer.mlp(layer.post_attention_layernorm(h)) + h
        return h, self.lm_head(self.norm(h))

    def unroll(self, ids: torch.Tensor, aux: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Teacher-forced TTT over every row: step s gives row i the token ids[i+1+s] (0 past
        the end) and its own previous output; returns the logits [B, T, V] of each step. Row i
        of step s predicts the token at i+2+s, so rows i < T-1-s have a target distribution
        (the target's logits at position i+1+s)."""
        b, t = ids.shape
        kv = KV()
        rows = torch.arange(t, device=ids.device)[None].expand(b, t)
        hidden = aux
        out = []
        for s in range(steps):
            tok = F.pad(ids[:, 1 + s:], (0, 1 + s))
            hidden, logits = self.step(tok, hidden, rows + s, kv, rows if s else None)
            out.append(logits)
        return out


def build_head(p: Preset, target: Any, seed: int) -> Eagle3Head:
    """A head at its initialisation: `lm_head` and `norm` copied from the target's (EAGLE-1
    and -2 reuse the target's LM head; starting from it shortens training), the rest PyTorch's
    default init (seeded), `embed_tokens` the target's."""
    torch.manual_seed(seed + 2)
    head = Eagle3Head(p, target.model.embed_tokens.weight.float())
    with torch.no_grad():
        head.lm_head.weight.copy_(target.lm_head.weight.float())
        head.norm.weight.copy_(target.model.norm.weight.float())
    return head


def soft_ce(logits: torch.Tensor, target_p: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the draft's logits to the target's probabilities."""
    logq = torch.log_softmax(logits.float(), dim=-1)
    return -(target_p * logq).sum(-1).mean()


def train_head(head: Eagle3Head, target: Any, rows: torch.Tensor, p: Preset,
               device: torch.device, seed: int, log: Callable[[str], None]) -> list[list[float]]:
    """TTT training in place; returns, every 10% of the steps, each TTT step's top-1
    agreement with the target's argmax on the batch."""
    gen = torch.Generator().manual_seed(seed + 3)
    opt = adamw(head, p.head_lr, device)
    cap = Capture(target, p.capture_layers)
    head.train()
    every = max(1, p.head_steps // 10)
    history: list[list[float]] = []
    t = p.seq_len
    t0 = time.perf_counter()
    try:
        for step, x in enumerate(batches(rows, p.head_batch, p.head_steps, gen)):
            for g in opt.param_groups:
                g["lr"] = lr_at(step, p.head_steps, p.head_lr)
            x = x.to(device, non_blocking=True)
            with torch.no_grad(), autocast(device, p.train_dtype):
                tlogits = target(input_ids=x, use_cache=False).logits
                aux = cap.aux()
            with torch.no_grad():
                tprob = torch.softmax(tlogits.float(), dim=-1)
                tbest = tlogits.argmax(-1)
            del tlogits
            loss = torch.zeros((), device=device)
            accs: list[torch.Tensor] = []
            with autocast(device, p.train_dtype):
                for s, logits in enumerate(head.unroll(x, aux, p.ttt_length)):
                    n = t - 1 - s
                    loss = loss + LOSS_DECAY ** s * soft_ce(logits[:, :n], tprob[:, 1 + s:])
                    with torch.no_grad():
                        accs.append((logits[:, :n].argmax(-1) == tbest[:, 1 + s:])
                                    .float().mean())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if (step + 1) % every == 0 or step + 1 == p.head_steps:
                history.append([round(float(a), 4) for a in accs])
                tok_s = (step + 1) * p.head_batch * t / (time.perf_counter() - t0)
                log(f"  head step {step + 1}/{p.head_steps} loss {float(loss.detach()):.3f} top-1 "
                    f"agreement by TTT step {' '.join(f'{a:.2f}' for a in history[-1])} "
                    f"({tok_s:,.0f} tok/s)")
    finally:
        cap.remove()
    head.eval()
    return history


def head_config(p: Preset) -> dict[str, Any]:
    """config.json of the head: a one-layer Llama config with the target's sizes, plus
    `draft_vocab_size` (read by SGLang's and vLLM's EAGLE-3 classes; equal to `vocab_size`,
    so there is no d2t map). Written field by field, not by transformers, so that it does not
    change with the transformers that made it."""
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": p.hidden,
        "intermediate_size": p.ffn,
        "num_hidden_layers": 1,
        "num_attention_heads": p.heads,
        "num_key_value_heads": p.kv_heads,
        "head_dim": p.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": RMS_EPS,
        "max_position_embeddings": p.max_position,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": p.vocab_size,
        "draft_vocab_size": p.vocab_size,
        "tie_word_embeddings": False,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "dtype": p.saved_dtype,
    }


def save_head(head: Eagle3Head, out: Path, p: Preset) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, p.saved_dtype)
    state = {k: v.detach().to("cpu", dtype).contiguous()
             for k, v in sorted(head.state_for_file().items())}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(head_config(p), indent=2) + "\n")
    for f in out.iterdir():
        f.chmod(0o644)


def expected_names(p: Preset) -> dict[str, list[int]]:
    """The head file's tensor names and shapes."""
    h, f, v, d = p.hidden, p.ffn, p.vocab_size, p.head_dim
    m = "midlayer."
    return {
        "embed_tokens.weight": [v, h],
        "fc.weight": [h, 3 * h],
        m + "input_layernorm.weight": [h],
        m + "hidden_norm.weight": [h],
        m + "self_attn.q_proj.weight": [p.heads * d, 2 * h],
        m + "self_attn.k_proj.weight": [p.kv_heads * d, 2 * h],
        m + "self_attn.v_proj.weight": [p.kv_heads * d, 2 * h],
        m + "self_attn.o_proj.weight": [h, p.heads * d],
        m + "post_attention_layernorm.weight": [h],
        m + "mlp.gate_proj.weight": [f, h],
        m + "mlp.up_proj.weight": [f, h],
        m + "mlp.down_proj.weight": [h, f],
        "norm.weight": [h],
        "lm_head.weight": [v, h],
    }


def param_count(module: nn.Module) -> int:
    return sum(math.prod(q.shape) for q in module.parameters())
