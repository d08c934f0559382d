"""The whole default search, without servers: boots in all, why it stopped, what it picked.

`search_efficiency.py` counts boots until a sampler first boots a good config; a search also
measures the baseline, re-measures its best points, must stop by itself and must pick. This
runs the search's own `RepeatingSearcher` over `SpecOptunaSearch` (the default sampler, the stop
rule and the KV gate, as `search.tuner.build_tuner` builds them; the experiment's enqueued
point, repeats, re-measurements and `max_concurrent` trials at a time, the oldest finishing
first) on a simulator profile, each boot measured as `search_efficiency.measure` does (noise
included). Per search it reports:

- boots: the baseline, every exploration and every re-measurement (a point the KV gate skips
  or a proposal answered from data is no boot);
- refused: boots the server refused at start-up (the truth says infeasible);
- stopped: by the stop rule (its reason) or at the cap (`max_trials`);
- picked: the searcher's ranking's first (median with the MAD penalty, as the search's
  incumbent), and whether its true score is within 2% of the exhaustive optimum.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import search_efficiency as se  # noqa: E402

from specdecode_tune.samplers import BASELINE_ATTR, baseline_attr  # noqa: E402
from specdecode_tune.search.sampler_factory import make_sampler  # noqa: E402
from specdecode_tune.search.searcher import (  # noqa: E402
    INFEASIBLE_SCORE,
    MEASURED_KEY,
    REPEAT_KEY,
    ProposalSpace,
    RepeatingSearcher,
    SpecOptunaSearch,
)
from specdecode_tune.search.stopping import KVGate, StopRule  # noqa: E402
from specdecode_tune.space import resolve  # noqa: E402

TARGET_BOOTS = 12


def run_whole(profile: str, seed: int, sampler: str = "hybrid") -> dict[str, Any]:
    """One whole search on `profile`: its boots, refusals, stop and pick."""
    from ray.tune.search import Searcher

    truth = se.truth_of(profile)
    exp = truth.exp
    s = exp.search
    inner = SpecOptunaSearch(
        space=ProposalSpace(exp.space, exp.backend.flags, sampler), metric="score", mode="max",
        sampler=make_sampler(sampler, exp, seed),
        points_to_evaluate=[dict(p) for p in s.enqueue] or None, seed=seed)
    base = se.measured_baseline(truth, seed)
    inner.study().set_user_attr(BASELINE_ATTR, baseline_attr(
        levels=[{"concurrency": c, "output_tok_s": v} for c, v in base.items()],
        weights=exp.level_weights(),
        facts={"max_total_num_tokens": truth.base_kv, "max_running_requests": truth.base_limit},
        request_tokens=se.mean_length(exp.workload.input_len)
        + se.mean_length(exp.workload.output_len)))
    gate = KVGate()
    searcher = RepeatingSearcher(inner, max_trials=s.max_trials, repeats=s.repeats,
                                 remeasure_top=s.remeasure_top, default_band=s.noise_band,
                                 stop_rule=StopRule(), gate=gate)
    weights = exp.level_weights()
    live: list[tuple[str, dict[str, Any]]] = []
    boots, refused, n = 1, 0, 0          # the baseline is the first boot
    finished = False
    for _ in range(10 * s.max_trials + 50):          # bounded: a search is never longer
        while not finished and len(live) < s.max_concurrent:
            tid = f"t{n}"
            n += 1
            cfg = searcher.suggest(tid)
            if cfg == Searcher.FINISHED:
                finished = True
                break
            if cfg is None:
                break
            assert isinstance(cfg, dict)
            live.append((tid, cfg))
            boots += 1
        if not live:
            break
        tid, cfg = live.pop(0)
        params = resolve({k: v for k, v in cfg.items() if not k.startswith("_")},
                         exp.backend.flags)
        key = se.key_of(params)
        tok_s, attr = se.measure(truth, key, seed, int(cfg.get(REPEAT_KEY, 0)))
        point = truth.points[key]
        if not point.feasible:
            refused += 1
        score = se._score(tok_s, base, weights) if tok_s else None
        searcher.on_trial_complete(tid, {
            "score": INFEASIBLE_SCORE if score is None else score,
            "feasible": score is not None,
            "status": "ok" if score is not None else "infeasible",
            "reason": point.reason, MEASURED_KEY: json.dumps(attr)})
    ranked = searcher.ranking()
    picked = None
    if ranked:
        cfg = searcher.configs[ranked[0][0]]
        picked = se.key_of(resolve({k: v for k, v in cfg.items() if not k.startswith("_")},
                                   exp.backend.flags))
    true = truth.points[picked].score if picked else -math.inf
    return {"profile": profile, "seed": seed, "boots": boots, "refused": refused,
            "skipped": len(gate.skipped), "explored": searcher.explored,
            "stopped": searcher.stop_reason, "picked": picked,
            "within": true >= truth.threshold - 1e-12,
            "at": math.exp(true - truth.best) if picked else 0.0}


def _task(args: tuple[str, int]) -> dict[str, Any]:
    return run_whole(*args)


def run(profiles: Sequence[str], seeds: int, jobs: int = 1) -> list[dict[str, Any]]:
    tasks = [(p, seed) for p in profiles for seed in range(seeds)]
    if jobs > 1 and len(tasks) > 1:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(_task, tasks, chunksize=1))
    return [_task(t) for t in tasks]


def report(rows: Sequence[dict[str, Any]], say: Callable[[str], None] = print) -> None:
    say("")
    say("== the whole default search (hybrid sampler, stop rule, KV gate; baseline and "
        "re-measurements counted)")
    say(f"   {'profile':<20} {'boots med/worst':>15} {'self-stop':>9} {'picked<=2%':>10} "
        f"{'refused max':>11} {'skipped':>7}   boots per seed; picked at % of the optimum")
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["profile"], []).append(r)
    for profile, rs in by.items():
        b = [r["boots"] for r in rs]
        say(f"   {profile:<20} {statistics.median(b):>7g} / {max(b):<5} "
            f"{sum(1 for r in rs if r['stopped']):>4}/{len(rs):<4} "
            f"{sum(1 for r in rs if r['within']):>5}/{len(rs):<4} "
            f"{max(r['refused'] for r in rs):>11} {sum(r['skipped'] for r in rs):>7}   "
            + " ".join(f"{r['boots']}({r['at']:.1%})" for r in rs))
    seed = by.get("seed-qwen35-122b", [])
    if seed:
        ok_boots = all(r["boots"] <= TARGET_BOOTS and r["stopped"] for r in seed)
        ok_pick = all(r["within"] for r in seed)
        say(f"  target: sim-default stops by itself in <= {TARGET_BOOTS} boots in every seed: "
            f"{'MET' if ok_boots else 'NOT MET'}; picks within 2% of the optimum in "
            f"{sum(1 for r in seed if r['within'])}/{len(seed)}: "
            f"{'MET' if ok_pick else 'NOT MET'}")
    worst = max((r["refused"] for r in rows), default=0)
    say(f"  target: refused boots per default search <= 1 on every profile: worst {worst}: "
        f"{'MET' if worst <= 1 else 'NOT MET'}")
    for r in seed[:1]:
        say(f"  why it stopped (seed {r['seed']}): {r['stopped'] or 'the cap (max_trials)'}")
