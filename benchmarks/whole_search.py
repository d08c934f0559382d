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
- picked: the searcher's ranking's first (median less the shrunk spread, as the search's
  incumbent), and whether its true score is within 2% of the exhaustive optimum.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import search_efficiency as se  # noqa: E402

from specdecode_tune.samplers import (  # noqa: E402
    BASELINE_ATTR,
    MEASURED_ATTR,
    NOISE_BAND_ATTR,
    baseline_attr,
    measured_attr,
)
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
from specdecode_tune.search.tuner import request_tokens  # noqa: E402
from specdecode_tune.space import DefineByRun, resolve  # noqa: E402

TARGET_BOOTS = 12
# A boot's status for a point the rules refuse before a boot (`space.invalid_reason`: a draft
# tree too small for its draft tokens), as `trial.run_trial` reports it: no boot is counted.
PRUNED = "pruned"


class Drive(NamedTuple):
    """One search driven without Ray: the searcher (its ranking, configs, stop reason), the
    Optuna search under it (its study's trials) and the boots (the baseline included)."""

    searcher: RepeatingSearcher
    inner: SpecOptunaSearch
    boots: int


# A boot: the config as the searcher proposed it -> (its score or None where refused or
# failed, its `measured` attr, the reason it was not scored). An attr whose status is PRUNED
# was answered without a boot.
Boot = Callable[[dict[str, Any]], tuple[float | None, dict[str, Any], str | None]]


def drive(exp: Any, seed: int, baseline: dict[str, Any], boot: Boot, *, band: float,
          sampler: str = "hybrid", gate: KVGate | None = None) -> Drive:
    """Run the default search (`RepeatingSearcher` over `SpecOptunaSearch`, the stop rule and
    the KV gate, as `search.tuner.build_tuner` builds them) to its end without Ray:
    `max_concurrent` trials at a time, the oldest finishing first, each measured by `boot`.
    `baseline` is the study's baseline attr (`samplers.baseline_attr`)."""
    from ray.tune.search import Searcher

    s = exp.search
    inner = SpecOptunaSearch(
        space=ProposalSpace(exp.space, exp.backend.flags, sampler), metric="score", mode="max",
        sampler=make_sampler(sampler, exp, seed),
        points_to_evaluate=[dict(p) for p in s.enqueue] or None, seed=seed)
    inner.study().set_user_attr(BASELINE_ATTR, baseline)
    searcher = RepeatingSearcher(inner, max_trials=s.max_trials, repeats=s.repeats,
                                 remeasure_top=s.remeasure_top, default_band=band,
                                 stop_rule=StopRule(), gate=gate or KVGate())
    live: list[tuple[str, dict[str, Any]]] = []
    boots, n, finished = 1, 0, False          # the baseline is the first boot
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
        score, attr, reason = boot(cfg)
        status = "ok" if score is not None else str(attr.get("status") or "infeasible")
        if status == PRUNED:
            boots -= 1          # a point the rules refuse: the trial answers it without a boot
        searcher.on_trial_complete(tid, {
            "score": INFEASIBLE_SCORE if score is None else score,
            "feasible": score is not None, "status": status,
            "reason": reason, MEASURED_KEY: json.dumps(attr)})
    return Drive(searcher, inner, boots)


def run_whole(profile: str, seed: int, sampler: str = "hybrid") -> dict[str, Any]:
    """One whole search on `profile`: its boots, refusals, stop and pick."""
    truth = se.truth_of(profile)
    exp = truth.exp
    base = se.measured_baseline(truth, seed)
    baseline = baseline_attr(
        levels=[{"concurrency": c, "output_tok_s": v} for c, v in base.items()],
        weights=exp.level_weights(),
        facts={"max_total_num_tokens": truth.base_kv, "max_running_requests": truth.base_limit},
        request_tokens=request_tokens(exp))
    gate = KVGate()
    weights = exp.level_weights()
    refused = 0
    seconds = {w: se.boot_seconds(truth, None, w) for w in se.WINDOWS}

    def boot(cfg: dict[str, Any]) -> tuple[float | None, dict[str, Any], str | None]:
        nonlocal refused
        key = se.point_of(exp, cfg)
        tok_s, attr = se.measure(truth, key, seed, int(cfg.get(REPEAT_KEY, 0)))
        point = truth.points[key]
        if not point.feasible:
            refused += 1
        for w in se.WINDOWS:
            seconds[w] += se.boot_seconds(truth, key, w)
        score = se._score(tok_s, base, weights) if tok_s else None
        return score, attr, point.reason

    run = drive(exp, seed, baseline, boot, band=exp.search.noise_band, sampler=sampler,
                gate=gate)
    searcher, inner = run.searcher, run.inner
    ranked = searcher.ranking()
    picked = se.point_of(exp, searcher.configs[ranked[0][0]]) if ranked else None
    # Diagnostic only (not what the search picks): the best median, without the spread.
    by_median = max(ranked, key=lambda kv: kv[1].median)[0] if ranked else None
    at_median = truth.at(se.point_of(exp, searcher.configs[by_median])) if by_median else 0.0
    errors = [e for t in inner.study().trials
              for e in level_errors(t.user_attrs.get("predicted"), t.user_attrs.get("measured"))]
    return {"errors": errors, "profile": profile, "seed": seed, "boots": run.boots,
            "refused": refused,
            "seconds": seconds,
            "skipped": len(gate.skipped), "explored": searcher.explored,
            "stopped": searcher.stop_reason, "picked": picked,
            "within": truth.within(picked), "at": truth.at(picked), "at_median": at_median}


def level_errors(predicted: Any, measured: Any) -> list[float]:
    """|predicted / measured - 1| of tok/s per level of one trial (the report's error)."""
    if not isinstance(predicted, dict) or not isinstance(measured, dict):
        return []
    tok = predicted.get("tok_s") or {}
    out = []
    for c, lv in (measured.get("levels") or {}).items():    # the "measured" attr's map
        p, m = tok.get(str(c)), lv.get("output_tok_s")
        if isinstance(p, (int, float)) and isinstance(m, (int, float)) and m > 0:
            out.append(abs(p / m - 1.0))
    return out


def recorded_errors(path: str, seed: int, budget: int = 12) -> list[float]:
    """The default sampler on a recorded landscape (each boot one recorded repeat, as
    `landscapes.run_search`): its model's prediction of each point before the boot against
    what the boot measured."""
    import landscapes
    import optuna

    land = landscapes.landscape_of(path)
    exp = land.exp
    study = optuna.create_study(direction="maximize",
                                sampler=make_sampler("hybrid", exp, seed))
    base_boot = land.draw_baseline(seed)
    study.set_user_attr(BASELINE_ATTR, baseline_attr(
        levels=list(base_boot.levels), weights=exp.level_weights(), facts=base_boot.facts,
        request_tokens=land.request_tokens))
    study.set_user_attr(NOISE_BAND_ATTR, landscapes.noise_band(land))
    space = DefineByRun(exp.space, exp.backend.flags)
    nth: dict[Any, int] = {}
    errors: list[float] = []
    for _ in range(budget):
        trial = study.ask()
        space(trial)
        key = land.key_of(trial.params)
        if key is None:          # the draft tree cannot hold it: refused without a boot
            trial.set_constraint("feasible", 1.0)
            study.tell(trial, INFEASIBLE_SCORE)
            continue
        predicted = study.sampler.predict(study, dict(trial.params))
        nth[key] = nth.get(key, -1) + 1
        boot = land.draw(key, seed, nth[key])
        value = land.score_of(boot.tok_s, base_boot.tok_s) if boot.measured else None
        params = resolve(trial.params, exp.backend.flags)
        attr = (measured_attr(status="ok", params=params, facts=boot.facts,
                              levels=list(boot.levels)) if value is not None else
                measured_attr(status=boot.status if boot.status != "ok" else "failed",
                              params=params, reason=boot.reason or "no level measured"))
        trial.set_user_attr(MEASURED_ATTR, attr)
        if value is not None:
            errors += level_errors(predicted, attr)
        trial.set_constraint("feasible", 0.0 if value is not None else 1.0)
        study.tell(trial, value if value is not None else INFEASIBLE_SCORE)
    return errors


def _task(args: tuple[str, int]) -> dict[str, Any]:
    return run_whole(*args)


def run(profiles: Sequence[str], seeds: int, jobs: int = 1) -> list[dict[str, Any]]:
    tasks = [(p, seed) for p in profiles for seed in range(seeds)]
    if jobs > 1 and len(tasks) > 1:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(_task, tasks, chunksize=1))
    return [_task(t) for t in tasks]


def recorded_seconds(path: str) -> dict[str, Any]:
    """A recorded landscape's measuring seconds per boot: the fixed windows it was recorded
    with, and the rule's modelled from each point's mean tok/s and running limit
    (`search_efficiency.level_seconds`, the simulator's rounds per level: the recordings hold
    one figure per level and boot, no spread within a level); medians over the points."""
    import landscapes

    land = landscapes.landscape_of(path)
    m = land.exp.measure
    out_len = se.mean_length(land.exp.workload.output_len)
    rule, rounds_s = [], {c: [] for c in m.concurrency}
    for boots in land.points.values():
        ok = [b for b in boots if b.measured]
        if not ok:
            continue
        limit = next((b.facts.get("max_running_requests") for b in ok
                      if b.facts.get("max_running_requests")), None)
        tok = {c: statistics.fmean(b.tok_s[c] for b in ok if c in b.tok_s)
               for c in m.concurrency if any(c in b.tok_s for b in ok)}
        rule.append(sum(se.level_seconds(c, v, limit, out_len, "rule") for c, v in tok.items()))
        for c, v in tok.items():
            rounds_s[c].append((min(c, limit) if limit else c) * out_len / max(v, 1e-9))
    measured, capped, levels = recorded_windows(land, m.max_duration_s)
    return {"fixed": len(m.concurrency) * (m.warmup_s + m.duration_s), "window": m.duration_s,
            "rule": statistics.median(rule) if rule else None,
            "round_s": {c: statistics.median(v) for c, v in rounds_s.items() if v},
            "measured": measured, "capped": capped, "levels": levels,
            "ran_rule": m.precision is not None, "cap": m.max_duration_s}


def recorded_windows(land: Any, cap: float) -> tuple[float | None, int, int]:
    """What the recording's own windows took: the median over its boots (each point's repeats
    and the baseline's) of the seconds its measured levels' windows lasted, the levels that
    ran to `cap` (within 2%), and the levels counted. The recorder measures as the search does,
    so under measure.precision this is the rule as the server ran it."""
    boots = [b for bs in (land.baseline, *land.points.values()) for b in bs
             if b.status == "ok" and b.window_s]
    windows = [w for b in boots for w in b.window_s.values()]
    return (statistics.median(sum(b.window_s.values()) for b in boots) if boots else None,
            sum(w >= 0.98 * cap for w in windows), len(windows))


def report_recorded(paths: Sequence[str], seeds: int,
                    say: Callable[[str], None] = print) -> None:
    """The prediction error of the default sampler's model on each recorded landscape, and
    its measuring seconds per boot under the fixed windows and the rule."""
    for path in paths:
        sec = recorded_seconds(path)
        rounds = ", ".join(f"C={c} {v:.1f} s" for c, v in sec["round_s"].items())
        say(f"  measuring seconds per boot, recorded {Path(path).name}: fixed windows "
            f"{sec['fixed']:.1f} s (a {sec['window']:g} s window; a round, median over the "
            f"points: {rounds}) / the rule, modelled with the simulator's rounds per level: "
            + ("-" if sec["rule"] is None else f"{sec['rule']:.1f} s"))
        if sec["measured"] is not None:
            how = (f"the rule as this server ran it: {sec['capped']} of {sec['levels']} "
                   f"windows {0.98 * sec['cap']:.1f} s or longer, the cap {sec['cap']:g} s less "
                   "any warm-up rounds left out" if sec["ran_rule"] else "its fixed windows")
            if sec["ran_rule"] and sec["rule"] and sec["measured"] > 2 * sec["rule"]:
                how += "; the simulator's rounds per level do not model this server"
            say(f"  measuring seconds per boot, recorded {Path(path).name}, as measured: "
                f"{sec['measured']:.1f} s, the windows alone, median over the boots ({how})")
    for path in paths:
        errs = [e for seed in range(seeds) for e in recorded_errors(path, seed)]
        med = f"{statistics.median(errs):.1%} over {len(errs)} predicted levels" if errs \
            else "no prediction (no fit)"
        say(f"  prediction error before the boot, recorded {Path(path).name}: median {med} "
            f"(12 boots per seed, {seeds} seeds)")


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
    say("   measuring seconds per search, median (per boot), modelled "
        "(search_efficiency.boot_seconds): fixed 1 s + 4 s windows / the rule (+-2%)")
    for profile, rs in by.items():
        med = {w: statistics.median(r["seconds"][w] for r in rs) for w in se.WINDOWS}
        per = {w: statistics.median(r["seconds"][w] / r["boots"] for r in rs)
               for w in se.WINDOWS}
        say(f"   {profile:<20} " + " / ".join(f"{med[w]:6.0f} s ({per[w]:4.1f} s)"
                                             for w in se.WINDOWS))
    seed = by.get("seed-qwen35-122b", [])
    if seed:
        ok_boots = all(r["boots"] <= TARGET_BOOTS and r["stopped"] for r in seed)
        ok_pick = all(r["within"] for r in seed)
        say(f"  target: sim-default stops by itself in <= {TARGET_BOOTS} boots in every seed: "
            f"{'MET' if ok_boots else 'NOT MET'}; picks within 2% of the optimum in "
            f"{sum(1 for r in seed if r['within'])}/{len(seed)}: "
            f"{'MET' if ok_pick else 'NOT MET'}")
    if seed:
        n = sum(1 for r in seed if r["at_median"] >= 0.98 - 1e-9)
        say(f"  diagnostic (not the search's pick): ranking by the median alone, without the "
            f"spread, would pick within 2% in {n}/{len(seed)} seeds")
    worst = max((r["refused"] for r in rows), default=0)
    say(f"  target: refused boots per default search <= 1 on every profile: worst {worst}: "
        f"{'MET' if worst <= 1 else 'NOT MET'}")
    for r in seed[:1]:
        say(f"  why it stopped (seed {r['seed']}): {r['stopped'] or 'the cap (max_trials)'}")
    for profile, rs in by.items():
        errs = [e for r in rs for e in r["errors"]]
        if errs:
            say(f"  prediction error before the boot, {profile}: median "
                f"{statistics.median(errs):.1%} over {len(errs)} predicted levels (tok/s, "
                f"|predicted / measured - 1|, every seed)")
