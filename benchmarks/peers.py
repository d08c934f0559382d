"""The peers' own code on our landscapes: boots to 98% of the optimum, side by side (issue 34).

    python benchmarks/peers.py                  # every landscape, 10 seeds
    python benchmarks/peers.py --seeds 2 --landscapes seed-qwen35-122b    # a quick look

Per landscape (the four simulator profiles of `search_efficiency.py`, every recorded table of
`benchmarks/data/`) and per tool: the boots until the first boot of a point within 2% of the
optimum, median and worst over the seeds (the baseline's boot not counted, as for our
samplers), and where the tool's final recommendation lies (its true score as a share of the
optimum's speedup; median and worst over the seeds). Every boot of every tool replays one
recorded repeat (or one simulator measurement) by the same draw rule, seeded by the seed, the
point and how often this run booted it (`benchmarks/peer_engine.py`).

- ours: the default sampler (hybrid), counted as `search_efficiency.py` counts it (budget 40);
  its pick is the whole default search's (`whole_search.run_whole`, and the same searcher on a
  recorded table here).
- vllm-tuner 0.1.6 (PyPI, its own venv; `benchmarks/peer_drivers/vllm_tuner_run.py`): its
  defaults (TPE, 10 start-up trials, 50 trials, 50 concurrent requests), the space as it can
  express it: `speculative_config` a categorical of JSON strings (vLLM drafts a chain: steps
  only, topk 1; an n-gram size as `prompt_lookup_max`) and `gpu_memory_utilization` for the
  memory fraction. Its pick is its study's best trial. Its sampler takes no seed.
- SGLang's bench_speculative.py: its loops as written (batch size outermost, then steps, topk,
  draft tokens; the script's validity rule), the space's values as its arguments and the
  landscape's levels as `--batch-size`, one run of the script per value of a dimension it
  cannot sweep (the memory fraction, an n-gram size); deterministic boots. Its pick: the
  config with the best objective over its measured batch sizes (the script prints, the user
  picks).
- vLLM's tune_speculative_k (PR #49163): `vllm bench sweep serve` over K (0 and the steps
  values, one boot per K, all batch sizes and its default 3 runs inside that boot), then its
  rule per batch size. Its pick is a per-batch-size K schedule; its share of the optimum is the
  schedule's (each level served at its own K), which can pass 100%.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from itertools import product
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import landscapes as L  # noqa: E402
import peer_argv  # noqa: E402
import search_efficiency as se  # noqa: E402
from peer_engine import Replay  # noqa: E402

from specdecode_tune.enginecache import cache_dir  # noqa: E402

PEER_VENVS = Path(os.environ.get("SPECDECODE_PEER_VENVS", cache_dir() / "peers"))
OUR_BUDGET = 40
TUNER_TRIALS = 50                 # vllm-tuner's n_trials default
TUNER_CONCURRENCY = 50            # its benchmark.concurrent_requests default
SWEEP_RUNS = 3                    # vllm bench sweep --num-runs default
MAD_SCALE = 1.4826
K_PENALTY, K_REL_MAD, K_TIE = 1.0, 0.1, 0.01     # tune_speculative_k's defaults
PEERS = ("vllm-tuner", "bench_speculative", "tune_speculative_k")


# ------------------------------------------------------------------------- the landscapes


class Land:
    """A landscape as the peers see it: the replay, its axes, the truth."""

    def __init__(self, name: str):
        self.name = name
        self.recorded = name.endswith(".parquet")
        self.replay0 = Replay(name, 0)
        if self.recorded:
            self.land = L.landscape_of(str(Path(name).resolve()))
            self.levels = sorted(self.land.exp.level_weights())
            self.weights = self.land.exp.level_weights()
            self.engine = str(self.land.meta.get("engine"))
            self.scores = self.land.scores
            self.best = self.land.best
            self.tied = L.tied(self.land)
        else:
            self.truth = se.truth_of(name)
            self.levels = sorted(self.truth.exp.level_weights())
            self.weights = self.truth.exp.level_weights()
            self.engine = "sglang-sim"
            self.scores = {k: p.score for k, p in self.truth.points.items()}
            self.best = self.truth.best
            self.tied = set()
        self.values = self.replay0.values
        # An n-gram engine's recorded table (steps, an n-gram size), told by its algorithm;
        # else EAGLE's: a simulator profile, or a recorded EAGLE table (SGLang's, with topk and
        # draft tokens; vLLM's, a chain: steps and the memory alone).
        self.n_gram = self.recorded and "eagle" not in str(
            self.land.exp.backend.speculative_algorithm or "").lower()

    @property
    def label(self) -> str:
        return Path(self.name).stem if self.recorded else self.name

    def at(self, key: Any) -> float:
        s = self.scores.get(tuple(key)) if key is not None else None
        return 0.0 if s is None or s <= se.INFEASIBLE_SCORE else math.exp(s - self.best)

    def hit(self, keys: Sequence[Any]) -> int | None:
        cut = self.best + L.TARGET - 1e-12
        return next((i for i, k in enumerate(keys, 1)
                     if k is not None and self.scores.get(tuple(k), -math.inf) >= cut), None)

    def hit_tied(self, keys: Sequence[Any]) -> int | None:
        return next((i for i, k in enumerate(keys, 1)
                     if k is not None and tuple(k) in self.tied), None)

    def mean_tok_s(self, key: Any) -> dict[int, float]:
        """The truth's per-level tok/s of a point (None key: the baseline)."""
        if self.recorded:
            boots = self.land.baseline if key is None else self.land.points[tuple(key)]
            return L._mean_tok_s(boots)
        return dict(self.truth.base if key is None else self.truth.points[tuple(key)].tok_s)


def landscape_names(given: Sequence[str] | None) -> list[str]:
    return list(given) if given else [*se.PROFILES, *L.recorded_paths(None)]


# ----------------------------------------------------------------------------------- ours


def ours(land: Land, seeds: int) -> dict[str, Any]:
    hits, tied, picks = [], [], []
    for seed in range(seeds):
        if land.recorded:
            h, t, _ = L.both_hits(str(Path(land.name).resolve()), "hybrid", seed, OUR_BUDGET)
            hits.append(h)
            tied.append(t)
            picks.append(land.at(whole_recorded(land, seed)))
        else:
            truth = land.truth
            hits.append(se.first_hit(se.run_search(truth, "hybrid", seed, OUR_BUDGET),
                                     truth.threshold))
            import whole_search
            picks.append(whole_search.run_whole(land.name, seed)["at"])
    return {"hits": hits, "tied": tied if land.recorded else None, "picks": picks,
            "budget": OUR_BUDGET}


def whole_recorded(land: Land, seed: int) -> Any:
    """The whole default search (`whole_search.drive`, as `whole_search.run_whole`) on a
    recorded table, each boot one recorded repeat: its pick."""
    return whole_recorded_drive(land, seed)[0]


def whole_recorded_drive(land: Land, seed: int) -> tuple[Any, Any]:
    """`whole_recorded`'s pick, and the search (`whole_search.Drive`: boots, the searcher)."""
    import whole_search

    from specdecode_tune.samplers import baseline_attr, measured_attr
    from specdecode_tune.space import invalid_reason, resolve

    lnd = land.land
    exp = lnd.exp
    base_boot = lnd.draw_baseline(seed)
    baseline = baseline_attr(
        levels=list(base_boot.levels), weights=exp.level_weights(), facts=base_boot.facts,
        request_tokens=lnd.request_tokens)
    nth: dict[Any, int] = {}

    def params_of(cfg: dict[str, Any]) -> dict[str, Any]:
        return resolve({k: v for k, v in cfg.items() if not k.startswith("_")},
                       exp.backend.flags)

    def boot(cfg: dict[str, Any]) -> tuple[float | None, dict[str, Any], str | None]:
        params = params_of(cfg)
        key = lnd.key_of(params)
        if key is None:       # the draft tree cannot hold it: the trial refuses it unbooted
            why = invalid_reason(params) or "not a point the server runs"
            return None, measured_attr(status=whole_search.PRUNED, params=params,
                                       reason=why), why
        nth[key] = nth.get(key, -1) + 1
        b = lnd.draw(key, seed, nth[key])
        value = lnd.score_of(b.tok_s, base_boot.tok_s) if b.measured else None
        attr = (measured_attr(status="ok", params=params, facts=b.facts,
                              levels=list(b.levels)) if value is not None else
                measured_attr(status=b.status if b.status != "ok" else "failed",
                              params=params, reason=b.reason or "no level measured"))
        return value, attr, b.reason

    drive = whole_search.drive(exp, seed, baseline, boot, band=L.noise_band(lnd))
    ranked = drive.searcher.ranking()
    pick = lnd.key_of(params_of(drive.searcher.configs[ranked[0][0]])) if ranked else None
    return pick, drive


# ------------------------------------------------------------------------------ vllm-tuner


def tuner_space(land: Land) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
    """(vllm-tuner's `parameters`, its static_parameters, what it cannot express)."""
    steps = list(land.values[peer_argv.STEPS])
    missing = []
    if land.n_gram:
        ns = list(land.values.get(peer_argv.NGRAM_N, [None]))
        flags = land.land.exp.backend.flags
        opts = []
        for k, n in product(steps, ns):
            cfg: dict[str, Any] = {"method": "ngram", "num_speculative_tokens": k}
            lookup = n if n is not None else flags.get("prompt_lookup_max")
            if lookup is not None:
                cfg["prompt_lookup_max"] = int(lookup)
                cfg["prompt_lookup_min"] = int(flags.get("prompt_lookup_min", 1) or 1)
            opts.append(json.dumps(cfg))
        params = [{"name": "speculative_config", "options": opts}]
        if land.engine == "llamacpp":
            missing.append("a llama.cpp server (vLLM's ngram method and prompt_lookup_max "
                           "stand for llama.cpp's ngram-simple draft and its n)")
        return params, {}, missing
    exp = land.land.exp if land.recorded else land.truth.exp
    opts = [json.dumps({"method": "eagle3", "model": exp.backend.draft_model_path,
                        "num_speculative_tokens": k}) for k in steps]
    mem = {s.name: s for s in exp.space}[peer_argv.MEM]
    missing.append("topk and draft tokens (vLLM's EAGLE drafts a chain: topk 1, draft = "
                   "steps + 1)")
    params: list[dict[str, Any]] = [{"name": "speculative_config", "options": opts}]
    if mem.type != "categorical":
        params.append({"name": "gpu_memory_utilization", "min": mem.low, "max": mem.high,
                       "step": mem.step})
    elif len(mem.choices) > 1:        # a recorded grid's values (vllm-tuner's options: str)
        params.append({"name": "gpu_memory_utilization",
                       "options": [str(v) for v in mem.choices]})
    return params, {}, missing


def run_tuner(land: Land, seed: int, work: Path) -> dict[str, Any]:
    import yaml
    py = PEER_VENVS / "vllm-tuner" / "bin" / "python"
    params, static, _ = tuner_space(land)
    cfg = {"model": "stand-in/model", "parameters": params,
           "optimization": {"n_trials": TUNER_TRIALS}}
    if static:
        cfg["static_parameters"] = static
    conf = work / f"tuner-{land.label}-{seed}.yaml"
    conf.write_text(yaml.safe_dump(cfg))
    oracle = ["env", f"PYTHONPATH={ROOT}", sys.executable, str(HERE / "peer_engine.py"),
              "oracle", str(Path(land.name).resolve()) if land.recorded else land.name,
              str(seed)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    out = subprocess.run([str(py), str(HERE / "peer_drivers" / "vllm_tuner_run.py"), str(conf),
                          json.dumps(oracle)], capture_output=True, text=True, env=env,
                         timeout=600, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"vllm-tuner run failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def tuner(land: Land, seeds: int, work: Path) -> dict[str, Any]:
    hits, tied, picks, snaps = [], [], [], set()
    for seed in range(seeds):
        r = run_tuner(land, seed, work)
        keys = [b["key"] for b in r["boots"]]
        for b in r["boots"]:
            snaps.update(f"{a}: {v[0]}->{v[1]}" for a, v in b["snapped"].items())
        hits.append(land.hit(keys))
        tied.append(land.hit_tied(keys))
        picks.append(land.at(r["best"]["key"]))
    return {"hits": hits, "tied": tied if land.recorded else None, "picks": picks,
            "budget": TUNER_TRIALS, "missing": tuner_space(land)[2],
            "snapped": sorted(snaps)[:6]}


# --------------------------------------------------------------------------- vllm-optimizer


def optimizer_config(land: Land, work: Path, port: int) -> dict[str, Any]:
    """vllm-optimizer's YAML: the space as `tune:` values (the same strings vllm-tuner gets),
    one vLLM Bench Serve run per level of the landscape, its defaults otherwise (grid, 4
    repeats, baseline on)."""
    params, _, _ = tuner_space(land)
    tune: dict[str, Any] = {}
    for p in params:
        name = p["name"].replace("_", "-")
        tune[name] = ({"values": p["options"]} if "options" in p else
                      {"min": p["min"], "max": p["max"], "step": p["step"]})
    model = work / "model"
    model.mkdir(parents=True, exist_ok=True)
    return {"schema_version": 1, "experiment": {"name": "peers", "output_dir": str(work / "runs")},
            "server": {"model": str(model), "host": "127.0.0.1", "port": port},
            "tune": tune,
            "benchmark": {"engine": "vllm", "runs": [
                {"name": f"c{c}", "args": {"dataset-name": "random", "random-input-len": 256,
                                           "random-output-len": 256, "num-prompts": 100,
                                           "request-rate": "inf", "max-concurrency": c,
                                           "ignore-eos": True}} for c in land.levels]},
            "optimization": {"maximize": "output_tokens_per_second"}}


def run_optimizer(land: Land, seed: int, work: Path, port: int = 8011) -> dict[str, Any]:
    """vllm-optimizer's real CLI (`vllm-opt --config`), its `vllm serve` and `vllm bench
    serve` the stand-in (`peer_engine.write_bin`) on PATH: end to end over HTTP."""
    import yaml
    from peer_engine import write_bin
    exe = PEER_VENVS / "vllm-optimizer" / "bin" / "vllm-opt"
    work.mkdir(parents=True, exist_ok=True)
    state = work / "state"
    landscape = str(Path(land.name).resolve()) if land.recorded else land.name
    write_bin(work / "bin", landscape, seed, state)
    conf = work / "conf.yaml"
    conf.write_text(yaml.safe_dump(optimizer_config(land, work, port), sort_keys=False))
    env = {**os.environ, "PATH": f"{work / 'bin'}:{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT)}
    out = subprocess.run([str(exe), "--config", str(conf)], capture_output=True, text=True,
                         env=env, timeout=3600, check=False, cwd=work)
    result = json.loads(next((work / "runs").rglob("result.json")).read_text())
    boots = [json.loads(line) for line in (state / "boots.jsonl").read_text().splitlines()]
    keys = [b["key"] for b in boots if b["key"] is not None]
    best = result.get("best_tuned") or result.get("best") or {}
    argv = ["vllm", "serve", "m"]
    for k, v in (best.get("server_args") or {}).items():
        argv += [f"--{k}", str(v)]
    pick = Replay(landscape, seed).key_of(peer_argv.parse(argv)["settings"])[0] if best \
        else None
    return {"keys": keys, "pick": pick, "status": result.get("status"), "rc": out.returncode,
            "boots_all": len(boots)}


# ------------------------------------------------------------------------ bench_speculative


def bench_speculative_boots(land: Land, optimum_first: bool = False
                            ) -> list[tuple[int, dict[str, Any]]]:
    """(batch size, the sglang settings) per boot, in the script's order, the baseline's
    boots (steps 0) left in: one script run per value of what it cannot sweep, in ascending
    order (`optimum_first`: the run with the optimum's value first, the user's best luck)."""
    levels = land.levels
    steps = [0, *land.values[peer_argv.STEPS]]
    if land.n_gram:
        reruns = [{peer_argv.NGRAM_N: n} for n in land.values.get(peer_argv.NGRAM_N, [])] or [{}]
        topks, drafts = [0, 1], None
    else:
        reruns = [{peer_argv.MEM: m} for m in land.values.get(peer_argv.MEM, [])] or [{}]
        topks = [0, *land.values.get(peer_argv.TOPK, (1,))]       # a chain engine: topk 1
        drafts = [0, *land.values[peer_argv.DRAFT]] if peer_argv.DRAFT in land.values else None
    if optimum_first:
        best = max(land.scores, key=lambda k: land.scores[k])
        opt = dict(zip(land.replay0.names, best, strict=True))
        reruns.sort(key=lambda r: any(opt.get(a) != v for a, v in r.items()))
    out = []
    for rerun in reruns:
        for bs in levels:
            for s in steps:
                for t in topks:
                    for d in (drafts if drafts is not None else [0, s + 1]):
                        if s * t + 1 < d:
                            continue
                        if (s == 0 or t == 0 or d == 0) and s + t + d != 0:
                            continue
                        settings = {peer_argv.STEPS: s, **rerun}
                        if s:
                            settings.update({peer_argv.TOPK: t, peer_argv.DRAFT: d})
                        out.append((bs, settings))
    return out


def bench_speculative(land: Land, seeds: int) -> dict[str, Any]:
    order = bench_speculative_boots(land)
    lucky = Replay(land.replay0.name, 0)
    first = land.hit([lucky.key_of(s)[0] for _, s in bench_speculative_boots(land, True)
                      if s[peer_argv.STEPS]])
    hits, tied, picks = [], [], []
    for seed in range(seeds):
        replay = Replay(land.name if not land.recorded else str(Path(land.name).resolve()),
                        seed)
        keys: list[Any] = []
        measured: dict[Any, dict[int, float]] = {}
        base: dict[int, float] = {}
        for bs, settings in order:
            served = replay.boot(settings)
            if served.key is None:
                if served.ok:
                    base[bs] = served.tok_s.get(bs, served.at(bs))
                continue
            keys.append(served.key)
            if served.ok:
                measured.setdefault(served.key, {})[bs] = served.tok_s.get(bs, served.at(bs))
        hits.append(land.hit(keys))
        tied.append(land.hit_tied(keys))
        full = {k: v for k, v in measured.items() if all(c in v for c in land.levels)}
        pick = max(full, key=lambda k: L.score(full[k], base, land.weights)) if full and \
            all(c in base for c in land.levels) else None
        picks.append(land.at(pick))
    n = sum(1 for _, s in order if s[peer_argv.STEPS])
    missing = ([] if not land.n_gram else ["topk and draft tokens (EAGLE's) on an n-gram "
                                           "engine: topk 1, draft steps+1"])
    if first != hits[0]:
        what = "memory fraction" if not land.n_gram else "n-gram size"
        missing.append(f"a sweep of the {what} (one script run per value, ascending; {n} "
                       f"boots in all): with the optimum's value run first it boots a 98% "
                       f"point at boot {first}")
    return {"hits": hits, "tied": tied if land.recorded else None, "picks": picks,
            "budget": n, "deterministic": True, "missing": missing}


# ----------------------------------------------------------------------- tune_speculative_k


def k_rule(samples: dict[int, dict[int, list[float]]]) -> dict[int, int]:
    """tune_speculative_k's selection, re-derived from its description: per batch size, each
    K's conservative throughput (median less penalty x 1.4826 x MAD; a K whose relative MAD
    passes the limit is dropped here, where the tool aborts), the best's; a K within 1% of the
    best counts as tied with it and the smallest tied K wins. `samples[bs][k]`: the runs."""
    pick = {}
    for bs, by_k in samples.items():
        cons = {}
        for k, runs in by_k.items():
            med = statistics.median(runs)
            mad = statistics.median(abs(r - med) for r in runs)
            if med > 0 and mad / med > K_REL_MAD:
                continue
            cons[k] = max(med - K_PENALTY * MAD_SCALE * mad, 0.0)
        if not cons or max(cons.values()) <= 0:
            continue
        top = max(cons.values())
        utility = {k: 1.0 if v / top >= 1.0 - K_TIE else v / top for k, v in cons.items()}
        pick[bs] = min(cons, key=lambda k: (-utility[k], k))
    return pick


def tune_k(land: Land, seeds: int) -> dict[str, Any]:
    ks = [0, *land.values[peer_argv.STEPS]]
    fixed: dict[str, Any] = {}
    missing = []
    if land.recorded and peer_argv.NGRAM_N in land.values:
        fixed[peer_argv.NGRAM_N] = peer_argv.VLLM_NGRAM_DEFAULT
        missing.append("the n-gram size (its sweep groups by K alone: vLLM's default "
                       "prompt_lookup_max, the nearest recorded n)")
    if not land.n_gram:
        fixed[peer_argv.MEM] = peer_argv.VLLM_MEM_DEFAULT
        missing.append("topk, draft tokens (chain: topk 1) and the memory fraction (its sweep "
                       "groups by K alone: vLLM's default 0.9)")
    hits, tied, picks = [], [], []
    for seed in range(seeds):
        replay = Replay(land.name if not land.recorded else str(Path(land.name).resolve()),
                        seed)
        keys: list[Any] = []
        samples: dict[int, dict[int, list[float]]] = {bs: {} for bs in land.levels}
        key_of_k: dict[int, Any] = {}
        for k in ks:
            settings = {peer_argv.STEPS: k, **fixed}
            if k:
                settings.update({peer_argv.TOPK: 1, peer_argv.DRAFT: k + 1})
            served = replay.boot(settings)      # one boot per K: every batch size and run in it
            if served.key is not None:
                keys.append(served.key)
                key_of_k[k] = served.key
            if not served.ok:
                continue                          # refused: --continue-on-error drops it
            for bs in land.levels:
                samples[bs][k] = [served.tok_s.get(bs, served.at(bs))] * SWEEP_RUNS
        hits.append(land.hit(keys))
        tied.append(land.hit_tied(keys))
        schedule = k_rule(samples)
        picks.append(schedule_share(land, schedule, key_of_k))
    return {"hits": hits, "tied": tied if land.recorded else None, "picks": picks,
            "budget": len(ks) - 1, "deterministic": True, "missing": missing}


def schedule_share(land: Land, schedule: dict[int, int], key_of_k: dict[int, Any]) -> float:
    """A per-batch-size K schedule's true speedup as a share of the optimum's: each level
    served at its K's true tok/s (K 0: the baseline's)."""
    if set(schedule) != set(land.levels):
        return 0.0
    base = land.mean_tok_s(None)
    tok = {}
    for bs, k in schedule.items():
        t = land.mean_tok_s(None if k == 0 else key_of_k[k])
        if bs not in t:
            return 0.0
        tok[bs] = t[bs]
    return math.exp(L.score(tok, base, land.weights) - land.best)


# ------------------------------------------------------------------------------ the table


def _med(hits: Sequence[int | None]) -> float:
    return statistics.median(math.inf if h is None else h for h in hits)


def _worst(hits: Sequence[int | None]) -> float:
    return max(math.inf if h is None else h for h in hits)


def _mw(r: dict[str, Any], key: str = "hits") -> str:
    hits = r[key]
    if hits is None:
        return ""
    m, w = _med(hits), _worst(hits)
    f = (lambda x: f">{r['budget']}" if math.isinf(x) else f"{x:g}")  # noqa: E731
    return f"{f(m)}" if r.get("deterministic") and key == "hits" and m == w else f"{f(m)}/{f(w)}"


def _pick(r: dict[str, Any]) -> str:
    p = r["picks"]
    return f"{statistics.median(p):.1%}/{min(p):.1%}"


def table(results: dict[str, dict[str, dict[str, Any]]], seeds: int) -> list[str]:
    head = ("| landscape | ours: boots to 98% (tied) | ours: pick | "
            + " | ".join(f"{p}: boots to 98% (tied) | {p}: pick" for p in PEERS)
            + " | best peer / ours |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, res in results.items():
        o = res["ours"]
        cells = [name, _cell(o), _pick(o)]
        for p in PEERS:
            cells += [_cell(res[p]), _pick(res[p])]
        best = min(_med(res[p]["hits"]) for p in PEERS)
        ratio = best / _med(o["hits"]) if not math.isinf(_med(o["hits"])) else 0.0
        cells.append("inf" if math.isinf(ratio) else f"{ratio:.1f}x")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"boots: median/worst over {seeds} seeds (one figure: deterministic boots), "
                 f"the baseline's boot(s) not counted; (tied): to a point the recording cannot "
                 f"rank below the optimum (recorded tables). pick: the final recommendation's "
                 f"true speedup as a share of the optimum's, median/worst over the seeds.")
    return lines


def _cell(r: dict[str, Any]) -> str:
    t = _mw(r, "tied") if r.get("tied") is not None else ""
    return _mw(r) + (f" ({t})" if t else "")


def verdict(results: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    out = []
    for name, res in results.items():
        o = res["ours"]
        om, opick = _med(o["hits"]), statistics.median(o["picks"])
        for p in PEERS:
            r = res[p]
            pm, ppick = _med(r["hits"]), statistics.median(r["picks"])
            if not (pm >= 3 * om and opick >= min(ppick, 1.0) - 1e-9):
                why = []
                if pm < 3 * om:
                    why.append(f"reaches 98% in {pm:g} boots (median) against our {om:g}")
                if opick < min(ppick, 1.0) - 1e-9:
                    why.append(f"picks at {ppick:.1%} against our {opick:.1%}")
                out.append(f"- {name}: {p} " + " and ".join(why))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/peers.py",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--landscapes", nargs="*", default=None,
                    help="profile names or recorded tables (default: all)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--skip", nargs="*", default=[], choices=PEERS)
    ap.add_argument("--vllm-optimizer", action="store_true",
                    help="instead: vllm-optimizer's real CLI end to end on each landscape, "
                         "seed 0 (its grid boots in a fixed order; minutes per landscape)")
    args = ap.parse_args(argv)
    if args.vllm_optimizer:
        return optimizer_main(landscape_names(args.landscapes))
    t0 = time.monotonic()
    py = PEER_VENVS / "vllm-tuner" / "bin" / "python"
    if "vllm-tuner" not in args.skip and not py.exists():
        print(f"error: no vllm-tuner venv at {py.parent.parent} (python -m venv it and pip "
              f"install 'vllm-tuner[http]==0.1.6'; SPECDECODE_PEER_VENVS moves it)",
              file=sys.stderr)
        return 2
    results: dict[str, dict[str, dict[str, Any]]] = {}
    notes: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        for name in landscape_names(args.landscapes):
            land = Land(name)
            res = {"ours": ours(land, args.seeds),
                   "bench_speculative": bench_speculative(land, args.seeds),
                   "tune_speculative_k": tune_k(land, args.seeds)}
            res["vllm-tuner"] = (tuner(land, args.seeds, Path(tmp))
                                 if "vllm-tuner" not in args.skip else
                                 {"hits": [None] * args.seeds, "tied": None,
                                  "picks": [0.0] * args.seeds, "budget": 0})
            results[land.label] = res
            notes[land.label] = [f"{p} cannot express {m}" for p in PEERS
                                 for m in res[p].get("missing", [])]
            print(f"# {land.label}: done at {time.monotonic() - t0:.0f}s", file=sys.stderr,
                  flush=True)
    for line in table(results, args.seeds):
        print(line)
    print("\nwhat a peer cannot express (it gets the nearest):")
    for name, ns in notes.items():
        for n in ns:
            print(f"- {name}: {n}")
    bad = verdict(results)
    print("\ndone-when (the best peer needs >= 3x our boots to 98%, with a pick no closer): "
          + ("MET on every landscape" if not bad else "NOT MET:"))
    for line in bad:
        print(line)
    print(f"\nwall time {time.monotonic() - t0:.0f}s ({args.seeds} seeds)")
    return 0


def optimizer_main(names: Sequence[str]) -> int:
    t0 = time.monotonic()
    print("| landscape | vllm-optimizer: boots to 98% (tied) | pick | boots in all | status |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="peers-opt-") as tmp:
        for name in names:
            land = Land(name)
            r = run_optimizer(land, 0, Path(tmp) / land.label)
            h, t = land.hit(r["keys"]), land.hit_tied(r["keys"])
            f = (lambda x: "-" if x is None else str(x))  # noqa: E731
            tied = f" ({f(t)})" if land.recorded else ""
            print(f"| {land.label} | {f(h)}{tied} | {land.at(r['pick']):.1%} | "
                  f"{r['boots_all']} (baseline included) | {r['status']} |", flush=True)
    print(f"\nwall time {time.monotonic() - t0:.0f}s (seed 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
