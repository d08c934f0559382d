"""Run SGLang's own code on our inputs; run by the SGLang venv's python, not by pytest's.

    python sglang_probe.py IN.json OUT.json

IN.json: {"cases": [{"argv": [...], "env": {...}}, ...], "trees": [[steps, topk, draft], ...]}
OUT.json: {"sglang": version, "cases": [...], "trees": [...]}, in the same order; with
"memory_templates": true in IN.json also SGLang's memory log lines (`memory_templates`).

A case is one server command line (without `python -m sglang.launch_server`), answered by the
backend's own checker, `specdecode_tune/backends/sglang_argcheck.py` (`run_case`: SGLang's
`prepare_server_args(argv)` then `check_server_args()`; its docstring gives the answer's form).

A tree is one (steps, topk, draft tokens) run through SGLang's own EAGLE draft-tree code on the
CPU with random draft probabilities, exactly as `EAGLEWorker.draft_forward` calls it
(`spec_utils.select_top_k_tokens` per step, then `eagle_utils.organize_draft_results`, whose
`torch.topk` keeps draft - 1 of the candidates): {"ok": true, "candidates": n} or
{"ok": false, "error": ...}. This is where a draft count too large for the tree fails at the
first decode on a real server; argument checking does not look at it.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import warnings
from importlib import metadata

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)


@functools.cache
def _argcheck():
    """The backend's own checker (specdecode_tune/backends/sglang_argcheck.py), loaded by its
    path: this venv has sglang, not the project, and the file imports nothing of the project.
    The cases go through exactly the code a search's trial runs before a boot."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir,
                        "specdecode_tune", "backends", "sglang_argcheck.py")
    spec = importlib.util.spec_from_file_location("sglang_argcheck", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_case(case: dict) -> dict:
    return _argcheck().run_case(case)


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


# SGLang's memory log lines the backend reads (`memory_facts` in backends/sglang_logs.py): where
# they are written, and a phrase that tells each one.
MEMORY_LINES = (
    ("sglang.srt.model_executor.model_runner", "Load weight begin"),
    ("sglang.srt.model_executor.model_runner", "end. Time elapsed"),
    ("sglang.srt.speculative.eagle_worker", "Capture draft cuda graph end"),
    ("sglang.srt.speculative.eagle_worker", "Capture draft extend cuda graph end"),
)


def memory_templates() -> list[dict]:
    """SGLang's own f-strings for its memory lines, read from its source (without importing
    the modules, which need CUDA), as str.format templates: {"module", "phrase", "template",
    "fields": the source of each replacement field, in order}."""
    import ast
    import importlib.util

    out = []
    for module, phrase in MEMORY_LINES:
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin, module
        with open(spec.origin) as f:
            source = f.read()
        for node in ast.walk(ast.parse(source, spec.origin)):
            if not isinstance(node, ast.JoinedStr):
                continue
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
            if phrase not in text or "avail mem=" not in text:
                continue
            template, fields = "", []
            for v in node.values:
                if isinstance(v, ast.Constant):
                    template += str(v.value).replace("{", "{{").replace("}", "}}")
                else:
                    assert isinstance(v, ast.FormattedValue)
                    spec_text = "".join(c.value for c in v.format_spec.values) \
                        if isinstance(v.format_spec, ast.JoinedStr) else ""
                    template += ("{" + str(len(fields)) + (":" + spec_text if spec_text else "")
                                 + "}")
                    fields.append(ast.get_source_segment(source, v.value))
            out.append({"module": module, "phrase": phrase, "template": template,
                        "fields": fields})
    return out


def main() -> None:
    with open(sys.argv[1]) as f:
        job = json.load(f)
    out = {"sglang": metadata.version("sglang"),
           "cases": [run_case(c) for c in job.get("cases", [])],
           "trees": [run_tree(*t) for t in job.get("trees", [])],
           "memory_templates": memory_templates() if job.get("memory_templates") else []}
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
