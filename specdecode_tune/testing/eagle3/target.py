"""The target: a transformers `LlamaForCausalLM` trained from scratch on packed ShareGPT text,
and the three hidden states SGLang feeds an EAGLE-3 head from it.

Training: AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), linear warm-up over 5% of the
steps then cosine decay to 10%, gradient clipping at 1.0; bf16 autocast over fp32 weights on a
GPU, fp32 on a CPU. Untied embeddings (`tie_word_embeddings: false`, like Llama 3.1 8B; SGLang's
`LlamaForCausalLM` then loads `lm_head.weight` from the file). The folder is written by
`save_pretrained` in `saved_dtype`, with the tokenizer files beside it.

`Capture` records what SGLang 0.5.17 captures for EAGLE-3 (`LlamaModel.forward` in
sglang/srt/models/llama.py: `aux_hidden_states.append(hidden_states + residual)` when
`i in layers_to_capture`, BEFORE layer i runs; `set_eagle3_layers_to_capture` defaults to
[2, L // 2, L - 3]): the residual stream at the input of those layers, concatenated in that
order. Forward pre-hooks take it from the input of transformers' decoder layers, which is the
same sum (transformers keeps the residual stream un-split).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from .presets import Preset
from .tokenizer import BOS_ID, EOS_ID

ROPE_THETA = 10000.0
RMS_EPS = 1e-5


def llama_config(p: Preset) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=p.vocab_size, hidden_size=p.hidden, intermediate_size=p.ffn,
        num_hidden_layers=p.layers, num_attention_heads=p.heads, num_key_value_heads=p.kv_heads,
        head_dim=p.head_dim, max_position_embeddings=p.max_position, rms_norm_eps=RMS_EPS,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        hidden_act="silu", attention_bias=False, mlp_bias=False, tie_word_embeddings=False,
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=None, initializer_range=0.02)


def build_target(p: Preset, seed: int) -> Any:
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(p))


def pack(docs: Sequence[Sequence[int]], seq_len: int) -> torch.Tensor:
    """The documents end to end, cut into rows of `seq_len` tokens (the tail dropped)."""
    stream = torch.tensor([t for d in docs for t in d], dtype=torch.int32)
    rows = len(stream) // seq_len
    if rows < 1:
        raise ValueError(f"{len(stream)} tokens of text: not one sequence of {seq_len}")
    return stream[: rows * seq_len].view(rows, seq_len)


def batches(rows: torch.Tensor, batch: int, steps: int, gen: torch.Generator
            ) -> Iterator[torch.Tensor]:
    """`steps` batches of rows, each epoch in a new seeded order."""
    order = torch.randperm(len(rows), generator=gen)
    at = 0
    for _ in range(steps):
        if at + batch > len(order):
            order = torch.randperm(len(rows), generator=gen)
            at = 0
        idx = order[at: at + batch]
        at += batch
        yield rows[idx].long()


def lr_at(step: int, steps: int, peak: float) -> float:
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    t = (step - warm) / max(1, steps - warm)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def adamw(model: torch.nn.Module, lr: float, device: torch.device) -> torch.optim.Optimizer:
    decay = [q for n, q in model.named_parameters() if q.requires_grad and q.dim() >= 2
             and "embed" not in n]
    rest = [q for n, q in model.named_parameters() if q.requires_grad and not
            (q.dim() >= 2 and "embed" not in n)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": rest, "weight_decay": 0.0}], lr=lr,
                             betas=(0.9, 0.95), fused=device.type == "cuda")


def autocast(device: torch.device, dtype: str) -> Any:
    enabled = dtype == "bfloat16"
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)


def train_target(model: Any, rows: torch.Tensor, p: Preset, device: torch.device, seed: int,
                 log: Callable[[str], None]) -> list[float]:
    """Train in place; returns the loss every 10% of the steps."""
    gen = torch.Generator().manual_seed(seed + 1)
    opt = adamw(model, p.target_lr, device)
    model.train()
    losses: list[float] = []
    every = max(1, p.target_steps // 10)
    t0 = time.perf_counter()
    for step, x in enumerate(batches(rows, p.target_batch, p.target_steps, gen)):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, p.target_steps, p.target_lr)
        x = x.to(device, non_blocking=True)
        with autocast(device, p.train_dtype):
            loss = model(input_ids=x, labels=x, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % every == 0 or step + 1 == p.target_steps:
            value = float(loss.detach())
            losses.append(value)
            done = step + 1
            tok_s = done * p.target_batch * p.seq_len / (time.perf_counter() - t0)
            log(f"  target step {done}/{p.target_steps} loss {value:.3f} ({tok_s:,.0f} tok/s)")
    model.eval()
    return losses


@torch.no_grad()
def eval_loss(model: Any, rows: torch.Tensor, p: Preset, device: torch.device) -> float:
    """Mean next-token loss on held-out rows."""
    total, n = 0.0, 0
    for i in range(0, len(rows), p.target_batch):
        x = rows[i: i + p.target_batch].long().to(device)
        with autocast(device, p.train_dtype):
            loss = model(input_ids=x, labels=x, use_cache=False).loss
        total += float(loss) * len(x)
        n += len(x)
    return total / max(1, n)


class Capture:
    """Forward pre-hooks on the target's decoder layers `layers`: after a forward, `aux()` is
    their inputs concatenated in that order, [B, T, len(layers) * hidden]."""

    def __init__(self, model: Any, layers: Sequence[int]) -> None:
        self.layers = tuple(layers)
        self.seen: dict[int, torch.Tensor] = {}
        decoder = model.model.layers
        self.handles = [decoder[i].register_forward_pre_hook(self._hook(i), with_kwargs=True)
                        for i in sorted(set(self.layers))]

    def _hook(self, i: int) -> Callable[..., None]:
        def hook(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self.seen[i] = args[0] if args else kwargs["hidden_states"]
        return hook

    def aux(self) -> torch.Tensor:
        out = torch.cat([self.seen[i] for i in self.layers], dim=-1)
        self.seen.clear()
        return out

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def cast_weights(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """The parameters in `dtype`, the buffers left as they are: `model.to(torch.bfloat16)`
    would also round transformers' rotary `inv_freq` to bf16 (0.5625 for 0.5623), which shifts
    the angle at position 400 by up to a radian; SGLang computes RoPE in fp32."""
    for q in model.parameters():
        q.data = q.data.to(dtype)


def save_target(model: Any, tok: Any, out: Path, p: Preset) -> None:
    from .tokenizer import write_hf_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    model.to(getattr(torch, p.saved_dtype))
    model.generation_config.bos_token_id = BOS_ID
    model.generation_config.eos_token_id = EOS_ID
    model.save_pretrained(out, safe_serialization=True)
    write_hf_tokenizer(tok, out, model_max_length=p.max_position)
    for f in out.iterdir():
        f.chmod(0o644)     # safetensors files are written private
