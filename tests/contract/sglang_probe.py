"""Run SGLang's own code on our inputs; run by the SGLang venv's python, not by pytest's.

    python sglang_probe.py IN.json OUT.json

IN.json: {"cases": [{"argv": [...], "env": {...}}, ...], "trees": [[steps, topk, draft], ...]}
OUT.json: {"sglang": version, "cases": [...], "trees": [...]}, in the same order.

A case is one server command line (without `python -m sglang.launch_server`): it goes through
`sglang.srt.server_args.prepare_server_args(argv)` and then `ServerArgs.check_server_args()`,
the two checks `sglang.launch_server` runs before it loads anything (the second one from
`Engine._launch_subprocesses`). `env` is set for that case only (SGLang reads its `envs` at
call time). The answer: {"ok": true, "triple": [steps, topk, draft], ...normalized fields} or
{"ok": false, "error": "ValueError: ...", "exit": argparse's exit code or null}.

A tree is one (steps, topk, draft tokens) run through SGLang's own EAGLE draft-tree code on the
CPU with random draft probabilities, exactly as `EAGLEWorker.draft_forward` calls it
(`spec_utils.select_top_k_tokens` per step, then `eagle_utils.organize_draft_results`, whose
`torch.topk` keeps draft - 1 of the candidates): {"ok": true, "candidates": n} or
{"ok": false, "error": ...}. This is where a draft count too large for the tree fails at the
first decode on a real server; argument checking does not look at it.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import os
import sys
import warnings
from importlib import metadata

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

FIELDS = ("speculative_algorithm", "disable_radix_cache", "max_running_requests",
          "mamba_scheduler_strategy", "attention_backend", "page_size",
          "disable_overlap_schedule", "mem_fraction_static")


def run_case(case: dict) -> dict:
    from sglang.srt.server_args import prepare_server_args

    saved = {k: os.environ.get(k) for k in case.get("env", {})}
    os.environ.update(case.get("env", {}))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = prepare_server_args(list(case["argv"]))
            args.check_server_args()
    except SystemExit as e:   # argparse: unknown flag or bad value
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return {"ok": False, "exit": e.code, "error": lines[-1] if lines else f"exit {e.code}"}
    except Exception as e:  # noqa: BLE001 - SGLang's checks raise ValueError/AssertionError/...
        return {"ok": False, "exit": None, "error": f"{type(e).__name__}: {e}"}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    out = {"ok": True, "triple": [args.speculative_num_steps, args.speculative_eagle_topk,
                                  args.speculative_num_draft_tokens]}
    out.update({k: getattr(args, k, None) for k in FIELDS})
    return out


@functools.cache
def sglang_function(module: str, name: str):
    """A top-level function of an SGLang module, compiled from that module's own source file
    without importing the module: `spec_utils` imports the scheduler, the memory pools and
    sgl_kernel (CUDA-only), which the parser's venv does not have; `select_top_k_tokens` itself
    needs only torch (and SGLang's `fast_topk`). Decorators are dropped."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, module
    with open(spec.origin) as f:
        tree = ast.parse(f.read(), spec.origin)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    node.decorator_list = []   # `@torch.compile(...)`: the same computation, uncompiled
    code = compile(ast.Module(body=[node], type_ignores=[]), spec.origin, "exec")
    import torch
    from sglang.srt.utils.common import fast_topk

    ns = {"torch": torch, "fast_topk": fast_topk}
    exec(code, ns)
    return ns[name]


def run_tree(steps: int, topk: int, draft: int, batch: int = 2, vocab: int = 64) -> dict:
    import torch
    from sglang.srt.speculative.eagle_utils import organize_draft_results
    from sglang.srt.utils.common import fast_topk

    select_top_k_tokens = sglang_function("sglang.srt.speculative.spec_utils",
                                          "select_top_k_tokens")

    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(batch, vocab, generator=gen).softmax(-1)
    topk_p, topk_index = fast_topk(probs, topk, dim=-1)
    hidden = torch.zeros(batch, 4)
    scores = None
    score_list, token_list, parents_list = [], [], []
    try:
        for i in range(steps):
            _, hidden, scores, tree_info = select_top_k_tokens(
                i, topk_p, topk_index, hidden, scores, topk)
            score_list.append(tree_info[0])
            token_list.append(tree_info[1])
            parents_list.append(tree_info[2])
            if i == steps - 1:
                break
            probs = torch.rand(hidden.shape[0], vocab, generator=gen).softmax(-1)
            topk_p, topk_index = fast_topk(probs, topk, dim=-1)
        candidates = int(torch.cat(score_list, dim=1).flatten(1).shape[1])
        organize_draft_results(score_list, token_list, parents_list, draft)
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return {"ok": True, "candidates": candidates}


def main() -> None:
    with open(sys.argv[1]) as f:
        job = json.load(f)
    out = {"sglang": metadata.version("sglang"),
           "cases": [run_case(c) for c in job.get("cases", [])],
           "trees": [run_tree(*t) for t in job.get("trees", [])]}
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
