"""Anchors: the model's cold start, before any speculative boot has run.

There is nothing to fit then, and a blind proposal is often refused (on a server short of
memory most of the space does not boot): the first points are anchors instead, the
configuration most likely to boot that still measures acceptance a few positions deep
(`anchor`), bisecting the memory fraction on refusals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from optuna.trial import FrozenTrial, TrialState

from ..observations import MEASURED_ATTR
from .candidates import Candidates
from .trials import parse_measured

# The anchor's draft depth: deep enough to measure acceptance at a few positions, shallow
# enough to need little memory (`anchor`).
ANCHOR_STEPS = 3


def anchor(cands: Candidates, trials: Sequence[FrozenTrial], number: int, why: str,
           key_of: Callable[[Mapping[str, Any]], tuple]
           ) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Before any speculative boot has run there is nothing to fit, and a blind proposal
    is often refused (on a server short of memory most of the space does not boot): the
    first points are anchors instead, the configuration most likely to boot that still
    measures acceptance a few positions deep. topk 1 (the chain: fewest draft tokens),
    the steps nearest `ANCHOR_STEPS` (the centre of the steps range where no memory
    fraction is searched), and the middle of the memory fractions no refusal
    has ruled out: an out-of-memory refusal at (mem, n) rules out every mem >= it for
    n or more draft tokens, a KV-pool refusal every mem <= it (a bisection on memory).
    Points measured or running are skipped. None where no candidate is left (the base
    sampler proposes). `why`: why the model cannot fit yet; `key_of`: a trial's params as
    the model names the point (`point_key`, or ("baseline",)).
    (The decision recorded on the trial, the planned point.)"""
    refusals, taken = _refusals(trials, number, key_of)
    out = np.array([k in taken for k in cands.keys])
    for kind, draft, m in refusals:
        more = cands.draft >= draft
        out |= more & ((cands.mem >= m - 1e-9) if kind == "oom" else (cands.mem <= m + 1e-9))
    ok = ~out & (cands.topk == cands.topk.min())
    if not ok.any():
        return None
    steps = cands.steps[ok]
    # With a memory fraction searched, memory is what refuses boots: the shallow chain.
    # Without one (llama.cpp, vLLM's n-gram spaces) a point's depth does not decide
    # whether it boots, and the centre of the steps range measures acceptance deeper.
    mem_axis = len(np.unique(cands.mem)) > 1
    want = ANCHOR_STEPS if mem_axis else float(np.median(np.unique(steps)))
    target = steps[np.argmin(np.abs(steps - want) + 0.1 * (steps < want))]
    ok &= cands.steps == target
    idx = np.nonzero(ok)[0]
    mems = np.sort(np.unique(cands.mem[idx]))
    mid = mems[(len(mems) - 1) // 2]
    best = int(idx[np.argmin(np.abs(cands.mem[idx] - mid) * 1e3 + cands.draft[idx])])
    plan = dict(cands.sampled[best])
    where = ("the middle of the memory fractions no refusal ruled out" if mem_axis
             else "the centre of the steps range")
    return {"by": "model", "why": f"anchor: {why}; the configuration most likely to boot "
                                  f"(topk {cands.topk[best]}, steps {target}, {where})",
            "anchor": True}, plan


def _refusals(trials: Sequence[FrozenTrial], number: int,
              key_of: Callable[[Mapping[str, Any]], tuple]
              ) -> tuple[list[tuple[str, int, float]], set[tuple]]:
    """((kind, draft tokens, mem) of every refusal for memory, measured or pessimistically
    assumed of a running point; the keys of every point measured or running), over the
    trials other than `number`."""
    refusals, taken = [], set()
    for t in trials:
        if t.number == number or not t.params:
            continue
        key = key_of(t.params)
        taken.add(key)
        if key == ("baseline",):
            continue
        o = parse_measured(t.user_attrs.get(MEASURED_ATTR), t.params) \
            if t.state.is_finished() else None
        if o is not None and not o.feasible and o.failure in ("oom", "kv"):
            refusals.append((o.failure, o.draft, 1.0 if o.mem is None else o.mem))
        elif t.state == TrialState.RUNNING and key[3] is not None:
            # Pessimistic, as for the model's proposals: a running anchor may run out.
            refusals.append(("oom", key[2], key[3]))
    return refusals, taken
