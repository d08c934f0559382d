"""Load and run the EAGLE-3 test pair with SGLang's own model classes on the CPU; run by the
SGLang venv's python (scripts/install_sglang_cpu.sh: sglang 0.5.10.post1 --no-deps) with the
repository on PYTHONPATH, not by pytest's.

    python eagle3_sglang_probe.py PAIR_DIR OUT.json

Loading: for the head (`LlamaForCausalLMEagle3`, sglang/srt/models/llama_eagle3.py) and the target
(`LlamaForCausalLM`, sglang/srt/models/llama.py): build the class from the folder's config.json
as SGLang's model loader would (transformers' AutoConfig), fill every parameter with NaN, feed
the folder's model.safetensors to the class's own `load_weights`, and report each parameter's
shape, how many of its elements are still NaN (the vocabulary padding rows of the embedding
and the LM head excluded) and the element counts of file and parameters. A weight that the
loader skipped (SGLang's loaders drop unknown names silently) leaves NaN behind or makes the
counts differ. Also reported: the head's `load_lm_head_from_target` and `hot_token_id` (the
d2t map) and SGLang's version.

Running (`compare`): SGLang's target and head forward passes on one held-out-like sequence, with
each RadixAttention replaced by plain attention over the same KV entries SGLang's cache holds
(`PlainAttention`: causal for an extend; for a chain step, the extend's keys up to the chain's
row plus the chain's own), against the project's: the target's hidden states captured for the
head (transformers' model with `target.Capture` vs SGLang's `layers_to_capture` with
`set_eagle3_layers_to_capture()`), and the head's logits and passed-on hidden state for the
draft extend and two chain steps (`head.Eagle3Head.step` vs SGLang's `LlamaModel.forward`), and
the training graph: the teacher-forced TTT unroll (`Eagle3Head.unroll`) at steps 0-2 of one row
against SGLang's draft extend and chain fed the true tokens.
Reported as the largest absolute differences and the logits' scale.

Needs no GPU: SGLANG_USE_CPU_ENGINE=1 makes the rotary embedding take its CPU path, the
distributed state is a one-process gloo group, and the global server args are ServerArgs'
defaults (no `__post_init__`, which would look for a model on the hub).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import sys
import warnings

os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)


def setup() -> None:
    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    args = object.__new__(ServerArgs)
    for f in dataclasses.fields(ServerArgs):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = None
        object.__setattr__(args, f.name, value)
    object.__setattr__(args, "device", "cpu")
    set_global_server_args_for_scheduler(args)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                    distributed_init_method=f"tcp://127.0.0.1:{port}")
    ps.initialize_model_parallel(1, 1)


def native(model) -> None:
    """Every SGLang CustomOp of `model` on its PyTorch-native path (a CPU with AMX would
    otherwise take sgl_kernel's CPU ops, which this venv does not have)."""
    for m in model.modules():
        if hasattr(m, "_forward_method") and hasattr(m, "forward_native"):
            m._forward_method = m.forward_native


class Batch:
    """The little of SGLang's ForwardBatch that the Llama and EAGLE-3 forwards read here."""

    def __init__(self, hidden=None, chain_row=None) -> None:
        self.mm_input_embeds = None
        self.spec_info = type("Spec", (), {"hidden_states": hidden})()
        self.chain_row = chain_row
        self.forward_mode = type("Mode", (), {"is_extend": staticmethod(lambda: True),
                                              "is_draft_extend": staticmethod(
                                                  lambda include_v2=False: True),
                                              "is_draft_extend_v2": staticmethod(
                                                  lambda: True)})()

    def contains_mm_inputs(self) -> bool:
        return False


def plain_attention(attn_module, cache: dict):
    """A stand-in for a RadixAttention: an extend (chain_row None) attends causally over its
    tokens and keeps their keys/values; a chain step (one token) attends to the kept keys up
    to its row and to every earlier chain step's, as SGLang's KV cache holds them."""
    import torch

    heads, kv_heads = attn_module.tp_q_head_num, attn_module.tp_k_head_num
    d, scale = attn_module.head_dim, attn_module.scaling

    def forward(q, k, v, forward_batch, save_kv_cache=True, **kwargs):
        n = q.shape[0]
        q = q.view(n, heads, d).transpose(0, 1)
        k = k.view(n, kv_heads, d).transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        v = v.view(n, kv_heads, d).transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        row = forward_batch.chain_row
        if row is None:
            cache["k0"], cache["v0"], cache["chain"] = k, v, []
            mask = torch.ones(n, n, dtype=torch.bool).tril()
            keys, vals = k, v
        else:
            cache["chain"].append((k, v))
            keys = torch.cat([cache["k0"][:, : row + 1]] + [c[0] for c in cache["chain"]], 1)
            vals = torch.cat([cache["v0"][:, : row + 1]] + [c[1] for c in cache["chain"]], 1)
            mask = torch.ones(n, keys.shape[1], dtype=torch.bool)
        o = torch.nn.functional.scaled_dot_product_attention(q, keys, vals, attn_mask=mask,
                                                             scale=scale)
        return o.transpose(0, 1).reshape(n, heads * d)
    return forward


def compare(pair_dir: str, target_model, head_model) -> dict:
    """The project's target capture and head against SGLang's forward passes."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from specdecode_tune.testing.eagle3.head import KV, Eagle3Head
    from specdecode_tune.testing.eagle3.presets import Preset
    from specdecode_tune.testing.eagle3.target import Capture

    with open(os.path.join(pair_dir, "acceptance.json")) as f:
        rep = json.load(f)
    names = {f.name for f in dataclasses.fields(Preset)}
    p = Preset(**{k: v for k, v in rep["sizes"].items() if k in names})
    torch.manual_seed(0)
    ids = torch.randint(2, p.vocab_size, (24,))
    ids[0] = 0
    n = len(ids)
    pos = torch.arange(n)

    for m in (target_model, head_model):
        native(m)
        for mod in m.modules():
            if type(mod).__name__ == "RadixAttention":
                mod.forward = plain_attention(mod, {})
    # SGLang's target: aux hidden states of the default layers
    target_model.set_eagle3_layers_to_capture()
    with torch.no_grad():
        _, sg_aux = target_model.model(ids, pos, Batch())
    sg_aux = torch.cat(sg_aux, dim=-1)
    # the project's: transformers' model with the pre-hooks
    hf = AutoModelForCausalLM.from_pretrained(os.path.join(pair_dir, "target"),
                                              dtype=torch.float32)
    cap = Capture(hf, p.capture_layers)
    with torch.no_grad():
        hf(input_ids=ids[None])
    aux = cap.aux()[0]
    cap.remove()

    head = Eagle3Head(p, hf.model.embed_tokens.weight.float())
    state = load_file(os.path.join(pair_dir, "eagle3", "model.safetensors"))
    state.pop("embed_tokens.weight")
    head.load_state_dict({k: v.float() for k, v in state.items()})
    head.eval()
    lm = head_model.lm_head.weight[: p.vocab_size]
    diffs = {"aux": float((sg_aux - aux).abs().max()), "aux_scale": float(aux.abs().max())}
    tok = torch.cat([ids[1:], torch.tensor([5])])     # the draft extend's shifted input ids
    kv = KV()
    with torch.no_grad():
        normed, (sg_h,) = head_model.model(tok, pos, Batch(hidden=aux))
        h, logits = head.step(tok[None], aux[None], pos[None], kv)
        diffs["extend_logits"] = float((normed @ lm.T - logits[0]).abs().max())
        diffs["extend_hidden"] = float((sg_h - h[0]).abs().max())
        diffs["logit_scale"] = float(logits.abs().max())
        row = n - 1
        sg_prev, prev = sg_h[row: row + 1], h[:, row: row + 1]
        for s in (1, 2):
            d = int(logits[0, -1].argmax()) if s == 1 else int(logits[0, 0].argmax())
            normed, (sg_prev,) = head_model.model(torch.tensor([d]), torch.tensor([row + s]),
                                                  Batch(hidden=sg_prev, chain_row=row))
            prev, logits = head.step(torch.tensor([[d]]), prev, torch.tensor([[row + s]]), kv,
                                     torch.tensor([[row]]))
            diffs[f"chain{s}_logits"] = float((normed @ lm.T - logits[0]).abs().max())
            diffs[f"chain{s}_hidden"] = float((sg_prev - prev[0]).abs().max())
        # training: the teacher-forced unroll's row r at step s is SGLang's chain from row r
        # fed the true tokens t[r+1+s] at positions r+s
        steps = head.unroll(ids[None], aux[None], 3)
        tok = torch.cat([ids[1:], torch.tensor([0])])   # the unroll's step-0 input
        normed, (sg_h,) = head_model.model(tok, pos, Batch(hidden=aux))
        row = n - 4
        sg_prev = sg_h[row: row + 1]
        diffs["ttt0_logits"] = float((normed[row] @ lm.T - steps[0][0, row]).abs().max())
        for s in (1, 2):
            normed, (sg_prev,) = head_model.model(ids[row + 1 + s: row + 2 + s],
                                                  torch.tensor([row + s]),
                                                  Batch(hidden=sg_prev, chain_row=row))
            diffs[f"ttt{s}_logits"] = float((normed[0] @ lm.T - steps[s][0, row]).abs().max())
    return diffs


def load(cls: type, folder: str) -> dict:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    with torch.device("cpu"):
        model = cls(config)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for p in params.values():
            p.fill_(float("nan"))
    weights = load_file(os.path.join(folder, "model.safetensors"))
    model.load_weights(iter(weights.items()))
    vocab = config.vocab_size
    out = {}
    for name, p in params.items():
        data = p.detach()
        if "embed_tokens" in name or "lm_head" in name:
            data = data[:vocab]               # the rows past the vocabulary are padding
        out[name] = {"shape": list(p.shape), "nan": int(torch.isnan(data).sum()),
                     "elements": int(data.numel())}
    return {"params": out, "file_elements": sum(int(t.numel()) for t in weights.values()),
            "file_names": sorted(weights), "model": model, "config": config}


def main() -> None:
    pair_dir, out_file = sys.argv[1:3]
    from importlib import metadata

    setup()
    from sglang.srt.models.llama import LlamaForCausalLM
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

    head = load(LlamaForCausalLMEagle3, os.path.join(pair_dir, "eagle3"))
    target = load(LlamaForCausalLM, os.path.join(pair_dir, "target"))
    hm, tm = head.pop("model"), target.pop("model")
    head.pop("config")
    target.pop("config")
    head["load_lm_head_from_target"] = bool(getattr(hm, "load_lm_head_from_target", None))
    head["hot_token_id"] = None if hm.hot_token_id is None else hm.hot_token_id.tolist()
    result = {"sglang": metadata.version("sglang"), "head": head, "target": target,
              "compare": compare(pair_dir, tm, hm)}
    with open(out_file, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
