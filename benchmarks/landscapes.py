"""Recorded real landscapes, replayed: the samplers compared on physics nobody here wrote.

`benchmarks/record_landscape.py` boots every point of a real engine's grid several times and
writes one Parquet row per (point, repeat, level). Here such a table becomes a landscape a
search can run on without a server:

- each replayed "boot" of a point draws ONE of its recorded repeats (seeded by the search's
  seed, the point and how often this search booted it), never their mean: the spread between
  two boots of one point (up to 15% on real engines) is what a sampler must live with. The
  same seed draws the same repeats whichever sampler asks, as the simulator benchmark's noise
  does (fair pairs);
- the search's baseline is one recorded repeat of the no-speculation point (steps 0), drawn
  the same way;
- a repeat the server refused (status infeasible) or that failed replays as that outcome: the
  sampler is told a violated constraint, as the search tells it;
- the truth a search is judged by is the recorded repeats' means: a point's score is the
  weighted mean log-speedup of its mean tok/s per level over the baseline's mean tok/s per
  level (the search's objective); the optimum is the best such score, and a boot "reaches 98%"
  when its point's score is within log 0.98 of it. A point no repeat of which measured is
  refused (score: the search's infeasible score).

The space the samplers search is the recorded grid without steps 0 (the baseline is measured
first, as every search does): an int range where an axis's values are consecutive integers,
else a categorical. The experiment is the one recorded (the file's metadata keeps it), with the
search's `max_trials` of the default experiment so that TPE starts as it would there.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from specdecode_tune.backends.speccounters import exactly_from_length
from specdecode_tune.config import Experiment, experiment_from_dict
from specdecode_tune.objective import RATIO_FLOOR
from specdecode_tune.records import COMPILED_GRAPHS
from specdecode_tune.samplers.model import (
    BASELINE_ATTR,
    MEASURED_ATTR,
    NOISE_BAND_ATTR,
    baseline_attr,
    measured_attr,
)
from specdecode_tune.search.sampler_factory import make_sampler
from specdecode_tune.search.searcher import INFEASIBLE_SCORE, MAX_DUPLICATES
from specdecode_tune.search.tuner import request_tokens
from specdecode_tune.space import STEPS, DefineByRun, ParamSpec, as_served, resolve

DATA = Path(__file__).resolve().parent / "data"
META_KEY = b"landscape"
TARGET = math.log(0.98)
TIED = "~"                       # a sampler's row judged by `tied`, not by 98%
RESAMPLED = "^"                  # ... by 98% of a resampled table's optimum (`resampled_hit`)
RESAMPLES = 200                  # resampled tables per landscape for that row
DEFAULT_MAX_TRIALS = 16          # experiments/sim-default.toml's search.max_trials

Key = tuple[Any, ...]            # the point's values, in the axes' order (steps first)


@dataclass(frozen=True)
class Boot:
    """One recorded boot of one point: its outcome and, where it measured, its levels."""

    repeat: int
    status: str                          # ok / infeasible / failed / pruned
    reason: str
    tok_s: dict[int, float]              # per closed-loop level measured
    levels: tuple[dict[str, Any], ...]   # the "measured" attr's levels
    facts: dict[str, int | None]
    window_s: dict[int, float] = field(default_factory=dict)   # each level's window, seconds

    @property
    def measured(self) -> bool:
        return self.status == "ok" and bool(self.tok_s)


@dataclass(frozen=True)
class Landscape:
    name: str
    exp: Experiment                      # the space is the grid without the baseline
    axes: tuple[tuple[str, tuple[Any, ...]], ...]
    baseline: tuple[Boot, ...]           # every recorded repeat of steps 0
    points: dict[Key, tuple[Boot, ...]]  # every recorded repeat of every other point
    base_mean: dict[int, float]
    scores: dict[Key, float]             # true score: from the repeats' means
    optimum: Key
    best: float
    meta: dict[str, Any]
    # The mean KV tokens of one request, as the search gives its model
    # (`search.tuner.request_tokens`: a ShareGPT workload's sample mean, ~267 tokens for
    # sglang-gpu, not its caps, 256 + 256: with the caps, until 2026-12-07, the model ran 25
    # requests at C=64 where SGLang ran a median 44-56).
    request_tokens: float | None = None

    @property
    def threshold(self) -> float:
        return self.best + TARGET

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.axes)

    def key_of(self, sampled: dict[str, Any]) -> Key | None:
        """The recorded point a sampled one is, as the server runs it (topk 1's draft tokens
        are not sampled: steps + 1); None where the draft tree cannot hold it."""
        served = as_served(sampled)
        return None if served is None else tuple(served[n] for n in self.names)

    def draw(self, key: Key, seed: int, nth: int) -> Boot:
        """The recorded repeat the `nth` boot (0, 1, ...) of `key` in search `seed` sees."""
        boots = self.points[key]
        return boots[int(_rng(seed, f"{key}/{nth}").integers(len(boots)))]

    def draw_baseline(self, seed: int) -> Boot:
        usable = [b for b in self.baseline if b.measured] or list(self.baseline)
        return usable[int(_rng(seed, "baseline").integers(len(usable)))]

    def score_of(self, tok_s: dict[int, float], base: dict[int, float]) -> float | None:
        return scored(tok_s, base, self.exp.level_weights())


def score(tok_s: dict[int, float], base: dict[int, float], weights: dict[int, float]) -> float:
    """The search's objective: the weighted mean log-speedup over the levels."""
    num = sum(w * math.log(max(tok_s[c] / base[c], RATIO_FLOOR))
              for c, w in weights.items() if w > 0)
    return num / sum(w for w in weights.values() if w > 0)


def scored(tok_s: Mapping[int, float], base: Mapping[int, float],
           weights: Mapping[int, float]) -> float | None:
    """`score`, or None where a weighted level is missing from either side."""
    if any(c not in tok_s or c not in base for c, w in weights.items() if w > 0):
        return None
    return score(dict(tok_s), dict(base), dict(weights))


def _rng(seed: int, what: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(what.encode())])


# ------------------------------------------------------------------------------------ loading


def read_meta(path: str | Path) -> dict[str, Any]:
    md = pq.read_schema(path).metadata or {}
    if META_KEY not in md:
        raise ValueError(f"{path}: not a recorded landscape (no '{META_KEY.decode()}' "
                         f"metadata; record one with benchmarks/record_landscape.py)")
    return json.loads(md[META_KEY])


def _space(axes: Sequence[tuple[str, Sequence[Any]]]) -> tuple[ParamSpec, ...]:
    specs = []
    for name, values in axes:
        vals = [v for v in values if not (name == STEPS and v == 0)]
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in vals)
        if ints and len(vals) > 1 and sorted(vals) == list(range(min(vals), max(vals) + 1)):
            specs.append(ParamSpec(name, "int", low=min(vals), high=max(vals)))
        else:
            specs.append(ParamSpec(name, "categorical", choices=tuple(vals)))
    return tuple(specs)


def _on_grid(point: dict[str, Any], axes: Sequence[tuple[str, Sequence[Any]]]
             ) -> dict[str, Any]:
    """An enqueued point of the recorded experiment, on the recorded grid: each value the
    nearest recorded one (ties to the larger; steps 0, the baseline, is not a point), what the
    grid does not vary left out. The experiment searched a wider space (sglang-gpu's first
    point, steps 3 at memory 0.006, is not on its landscape's grid of steps 2-8 at 0.0045);
    the search refuses an enqueued point outside its space, and so would the replay."""
    values = {n: [v for v in vals if not (n == STEPS and v == 0)] for n, vals in axes}
    out: dict[str, Any] = {}
    for name, v in point.items():
        vals = values.get(name)
        if not vals:
            continue
        out[name] = v if v in vals else max(
            vals, key=lambda x: (-abs(float(x) - float(v)), float(x)))
    return out


def _boot(rows: Sequence[dict[str, Any]], per_position: bool = False) -> Boot:
    """One recorded boot. `per_position`: the table's histograms are per-position counts (format
    1 from vLLM or llama.cpp), given to the samplers in SGLang's form, as a search's are."""
    first = rows[0]
    tok_s: dict[int, float] = {}
    window_s: dict[int, float] = {}
    levels = []
    for r in sorted(rows, key=lambda r: r["concurrency"]):
        if r["output_tok_s"] is None:
            continue
        c = int(r["concurrency"])
        tok_s[c] = float(r["output_tok_s"])
        if r.get("duration_s"):
            window_s[c] = float(r["duration_s"])
        lv: dict[str, Any] = {"concurrency": c, "output_tok_s": tok_s[c]}
        if r["accept_length"] is not None:
            lv["accept_length"] = float(r["accept_length"])
        if r["accept_histogram"]:
            hist = [int(x) for x in r["accept_histogram"]]
            lv["accept_histogram"] = list(exactly_from_length(hist, r["accept_length"])) \
                if per_position else hist
        levels.append(lv)
    facts = {"max_total_num_tokens": first["max_total_num_tokens"],
             "max_running_requests": first["max_running_requests"]}
    return Boot(int(first["repeat"]), str(first["status"]), first["reason"] or "", tok_s,
                tuple(levels), facts, window_s)


def _mean_tok_s(boots: Sequence[Boot]) -> dict[int, float]:
    ok = [b for b in boots if b.measured]
    levels = sorted({c for b in ok for c in b.tok_s})
    return {c: statistics.fmean(b.tok_s[c] for b in ok if c in b.tok_s) for c in levels}


def load_landscape(path: str | Path, max_trials: int = DEFAULT_MAX_TRIALS) -> Landscape:
    """A recorded table as a replayable landscape (ValueError where it cannot be one)."""
    meta = read_meta(path)
    axes = tuple((str(n), tuple(v)) for n, v in meta["axes"])
    exp = experiment_from_dict(meta["experiment"], where=f"{path} (metadata)")
    exp = dataclasses.replace(exp, space=_space(axes), search=dataclasses.replace(
        exp.search, max_trials=max(max_trials, exp.search.max_trials),
        enqueue=tuple(_on_grid(p, axes) for p in exp.search.enqueue)))
    names = [n for n, _ in axes]
    by_boot: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in pq.read_table(path).to_pylist():
        by_boot.setdefault((row["point"], int(row["repeat"])), []).append(row)
    baseline: list[Boot] = []
    points: dict[Key, list[Boot]] = {}
    per_position = int(meta.get("format", 1)) < 2 and meta.get("engine") in ("vllm", "llamacpp")
    for (pid, _), rows in sorted(by_boot.items()):
        point = json.loads(pid)
        boot = _boot(rows, per_position)
        if int(point.get(STEPS, 0)) == 0:
            baseline.append(boot)
        else:
            points.setdefault(tuple(point[n] for n in names), []).append(boot)
    if not any(b.measured for b in baseline):
        raise ValueError(f"{path}: no measured repeat of the baseline ({STEPS} = 0): a "
                         f"landscape needs it to score the other points")
    if not points:
        raise ValueError(f"{path}: no point with {STEPS} >= 1 recorded")
    grid = [k for k in (tuple(p[n] for n in names) if p is not None else None
                        for p in (as_served(dict(zip(names, combo, strict=True)))
                                  for combo in product(*(
                                      tuple(v for v in vals if not (n == STEPS and v == 0))
                                      for n, vals in axes))))
            if k is not None]
    missing = [k for k in grid if k not in points]
    if missing:
        raise ValueError(f"{path}: {len(missing)} of the {len(grid)} grid points have no "
                         f"recorded boot (e.g. {dict(zip(names, missing[0], strict=True))}): "
                         f"finish the recording (record_landscape.py resumes where it stopped)")
    base_mean = _mean_tok_s(baseline)
    weights = exp.level_weights()
    scores: dict[Key, float] = {}
    for key, boots in points.items():
        mean = _mean_tok_s(boots)
        ok = all(c in mean for c, w in weights.items() if w > 0)
        scores[key] = score(mean, base_mean, weights) if ok else INFEASIBLE_SCORE
    optimum = max(scores, key=lambda k: scores[k])
    return Landscape(str(meta.get("name", Path(path).stem)), exp, axes, tuple(baseline),
                     {k: tuple(v) for k, v in points.items()}, base_mean, scores, optimum,
                     scores[optimum], meta, request_tokens(exp))


@lru_cache(maxsize=16)
def landscape_of(path: str) -> Landscape:
    return load_landscape(path)


# The rows of a table that other weights served, set aside beside it by the recorder
# (record_landscape.aside_path): kept, never replayed.
OTHER_WEIGHTS = ".other-weights"


def session_index(started_at: float | None, starts: Sequence[float]) -> int | None:
    """Which recording session booted a row: the index in `starts` (the sessions' starts,
    ascending, epoch seconds) of the last one at or before the row's `started_at`; None where
    the row has no start or came before them all. A session's `started_utc` is cut to the
    second, and a boot starts after its session did."""
    if started_at is None:
        return None
    found = [i for i, t in enumerate(starts) if t <= float(started_at)]
    return found[-1] if found else None


def compiled_at_boot(row: Mapping[str, Any]) -> bool | None:
    """Whether a row's boot compiled the engine's graphs at its start (the backend's fact
    `records.COMPILED_GRAPHS`, kept in `facts_json`); None where the row does not say."""
    try:
        facts = json.loads(row.get("facts_json") or "{}")
    except ValueError:
        return None
    n = facts.get(COMPILED_GRAPHS)
    return None if n is None else float(n) > 0


def recorded_paths(given: Sequence[str] | None) -> list[str]:
    """The tables to replay: those given, else every Parquet under benchmarks/data/ (not the
    rows set aside beside one)."""
    if given:
        return [str(p) for p in given]
    return sorted(str(p) for p in DATA.glob("*.parquet")
                  if not p.stem.endswith(OTHER_WEIGHTS)) if DATA.is_dir() else []


# ------------------------------------------------------------------------------ the repeats


def repeat_scores(land: Landscape, key: Key) -> list[float]:
    """Each measured repeat's score against the baseline's mean."""
    out = []
    for b in land.points[key]:
        s = land.score_of(b.tok_s, land.base_mean) if b.measured else None
        if s is not None:
            out.append(s)
    return out


def noise_sigma(land: Landscape) -> float:
    """The median over points of the standard deviation of a repeat's score."""
    sds = [statistics.stdev(s) for k in land.points if len(s := repeat_scores(land, k)) > 1]
    return statistics.median(sds) if sds else 0.0


def noise_band(land: Landscape) -> float:
    """The band the search's repeats would measure: two sigmas, at least the experiment's."""
    return max(land.exp.search.noise_band, 2.0 * noise_sigma(land))


# ---------------------------------------------------------------------------------- a search


def run_search(land: Landscape, sampler_name: str, seed: int, budget: int,
               trace: list[tuple[Key, Boot, dict[str, Any]]] | None = None) -> list[float]:
    """The true score of each boot a search with this sampler makes, in order (as
    search_efficiency.run_search does on a simulator profile). `trace` gets each boot's point,
    the recorded repeat it drew and the "measured" attr the sampler was given."""
    import optuna

    exp = land.exp
    study = optuna.create_study(direction="maximize",
                                sampler=make_sampler(sampler_name, exp, seed))
    base_boot = land.draw_baseline(seed)
    base = base_boot.tok_s
    study.set_user_attr(BASELINE_ATTR, baseline_attr(
        levels=list(base_boot.levels), weights=exp.level_weights(), facts=base_boot.facts,
        request_tokens=land.request_tokens))
    study.set_user_attr(NOISE_BAND_ATTR, noise_band(land))
    space = DefineByRun(exp.space, exp.backend.flags)
    known: dict[Key, float | None] = {}
    nth: dict[Key, int] = {}
    boots: list[float] = []
    duplicates = refused = 0
    while len(boots) < budget:
        trial = study.ask()
        space(trial)
        key = land.key_of(trial.params)
        if key is None:
            # a tree too small for its draft tokens: the trial refuses it without a boot
            _tell(study, trial, None)
            refused += 1
            if refused > MAX_REFUSED:
                raise RuntimeError(f"{sampler_name}: {MAX_REFUSED} points in a row the draft "
                                   f"tree cannot hold; the sampler does not learn the rule")
            continue
        refused = 0
        if key in known and duplicates < MAX_DUPLICATES:
            duplicates += 1
            _tell(study, trial, known[key])
            continue
        duplicates = 0
        nth[key] = nth.get(key, -1) + 1
        boot = land.draw(key, seed, nth[key])
        params = resolve(trial.params, exp.backend.flags)
        value = land.score_of(boot.tok_s, base) if boot.measured else None
        if value is None:
            status = boot.status if boot.status != "ok" else "failed"
            attr = measured_attr(status=status, params=params,
                                 reason=boot.reason or "no level measured")
        else:
            attr = measured_attr(status="ok", params=params, facts=boot.facts,
                                 levels=list(boot.levels))
        trial.set_user_attr(MEASURED_ATTR, attr)
        if trace is not None:
            trace.append((key, boot, attr))
        known.setdefault(key, value)
        boots.append(land.scores[key])
        _tell(study, trial, value)
    return boots


MAX_REFUSED = 1000


def _tell(study: Any, trial: Any, value: float | None) -> None:
    trial.set_constraint("feasible", 0.0 if value is not None else 1.0)
    study.tell(trial, value if value is not None else INFEASIBLE_SCORE)


def grid_order(land: Landscape) -> list[Key]:
    """The grid as a user's loop runs it: the axes in order, steps outermost."""
    return [k for k in product(*(tuple(v for v in vals if not (n == STEPS and v == 0))
                                 for n, vals in land.axes)) if k in land.points]


def first_hit(scores: Sequence[float], threshold: float) -> int | None:
    for i, s in enumerate(scores, start=1):
        if s >= threshold - 1e-12:
            return i
    return None


def hits(path: str, sampler: str, seed: int, budget: int) -> int | None:
    """Boots until 98% of the optimum on the landscape at `path` (None: not within budget)."""
    return both_hits(path, sampler, seed, budget)[0]


def both_hits(path: str, sampler: str, seed: int, budget: int
              ) -> tuple[int | None, int | None, int | None]:
    """(boots until 98% of the optimum, boots until a point the recording cannot rank below
    the optimum (`tied`), boots until 98% of a resampled table's optimum (`resampled_hit`)),
    None where not within the budget."""
    land = landscape_of(path)
    if sampler == "grid":
        keys = grid_order(land)
    else:
        trace: list[tuple[Key, Boot, dict[str, Any]]] = []
        run_search(land, sampler, seed, budget, trace=trace)
        keys = [k for k, _, _ in trace]
    near = tied(land)
    return (first_hit([land.scores[k] for k in keys], land.threshold),
            next((i for i, k in enumerate(keys, start=1) if k in near), None),
            resampled_hit(path, keys))


def tied(land: Landscape) -> set[Key]:
    """The points the recording cannot rank below the optimum: within 2% of it, or trailing it
    by at most one standard error of the difference of the two means (from the spread of their
    recorded repeats' scores). A point's truth is a mean of a few noisy boots (two repeats of
    one H200 point differed by 15%): where the top of a flat landscape lies within that error,
    "the optimum" is the point that drew the luckiest repeats, and reaching exactly it measures
    luck. The benchmark reports both, the 98% first.

    A point booted once has no spread of its own: it takes the table's (`noise_sigma`, a
    repeat's sd over the repeated points). Without that, a table whose optimum was booted once
    (`--contenders` repeats only the points near the best, and a session can end before its
    repeat) tied nothing to it, and a one-boot point trailing by a hair stayed ranked below."""
    sigma = noise_sigma(land)
    best = land.optimum
    var_b = _mean_var(repeat_scores(land, best), sigma)
    out = set()
    for key, score_ in land.scores.items():
        if score_ >= land.threshold - 1e-12:
            out.add(key)
            continue
        var_r = _mean_var(repeat_scores(land, key), sigma)
        if var_b is None or var_r is None or score_ <= INFEASIBLE_SCORE:
            continue
        if land.best - score_ <= math.sqrt(var_b + var_r):
            out.add(key)
    return out


def _mean_var(repeats: Sequence[float], sigma: float) -> float | None:
    """The variance of a point's mean score: from its repeats' spread, or, booted once, from
    the table's sd of a repeat; None where neither is known (no repeat, or no point of the
    table repeated)."""
    if len(repeats) >= 2:
        return statistics.variance(repeats) / len(repeats)
    return sigma ** 2 if len(repeats) == 1 and sigma > 0 else None


@dataclass(frozen=True)
class Stability:
    """How firmly a recording names its optimum: the recorded repeats resampled with
    replacement (the baseline's too), the means recomputed, the argmax taken again."""

    resamples: int
    argmax_share: dict[Key, float]     # share of resamples in which each point is the argmax
    optimum_share: float               # ... of the recorded optimum
    within_share: float                # share in which the recorded optimum is within 2% of
                                       # the resample's argmax
    near_points: float                 # mean number of points within 2% of the argmax


def resampled_scores(land: Landscape, resamples: int, seed: int = 0
                     ) -> Iterator[dict[Key, float]]:
    """The table's true scores as another recording of as many repeats might have measured
    them: each point's repeats (and the baseline's) drawn with replacement, the means
    recomputed (the bootstrap). Points without a measured repeat are left out. A point booted
    once would come back unchanged from every resample, as if its one boot were its truth: its
    score is drawn instead about that boot with the table's sd of a repeat (`noise_sigma`;
    a parametric draw, where the repeats give none)."""
    rng = np.random.default_rng(seed)
    weights = land.exp.level_weights()
    sigma = noise_sigma(land)
    base = [b for b in land.baseline if b.measured]
    booted = {k: ok for k in land.points
              if land.scores[k] > INFEASIBLE_SCORE
              and (ok := [b for b in land.points[k] if b.measured])}
    for _ in range(resamples):
        bm = _mean_tok_s([base[i] for i in rng.integers(len(base), size=len(base))])
        scores = {}
        for k, ok in booted.items():
            mean = _mean_tok_s([ok[i] for i in rng.integers(len(ok), size=len(ok))])
            if all(c in mean and c in bm for c, w in weights.items() if w > 0):
                scores[k] = score(mean, bm, weights)
                if len(ok) == 1 and sigma > 0:
                    scores[k] += float(rng.normal(0.0, sigma))
        yield scores


def optimum_stability(land: Landscape, resamples: int = 1000, seed: int = 0) -> Stability:
    """The bootstrap of the recording's optimum. A point's truth is the mean of 3-9 boots; where
    the top of the landscape is flatter than that mean's error, a second recording of the same
    engine would name another optimum in a share of cases this measures, and "boots to 98% of
    the optimum" is then judged against a point one recording happened to favour."""
    wins: dict[Key, int] = {}
    within = near = 0
    for scores in resampled_scores(land, resamples, seed):
        best = max(scores, key=lambda k: scores[k])
        wins[best] = wins.get(best, 0) + 1
        cut = scores[best] + TARGET - 1e-12
        within += scores.get(land.optimum, INFEASIBLE_SCORE) >= cut
        near += sum(1 for v in scores.values() if v >= cut)
    share = {k: n / resamples for k, n in sorted(wins.items(), key=lambda kv: -kv[1])}
    return Stability(resamples, share, share.get(land.optimum, 0.0), within / resamples,
                     near / resamples)


@lru_cache(maxsize=16)
def resampled_targets(path: str, resamples: int = 0) -> tuple[frozenset[Key], ...]:
    """Per resampled table (`resampled_scores`; `RESAMPLES` of them by default), the points
    within 2% of its optimum."""
    out = []
    for scores in resampled_scores(landscape_of(path), resamples or RESAMPLES):
        cut = max(scores.values()) + TARGET - 1e-12
        out.append(frozenset(k for k, v in scores.items() if v >= cut))
    return tuple(out)


def resampled_hit(path: str, keys: Sequence[Key]) -> int | None:
    """Boots until 98% of a resampled table's optimum: the median over the resampled tables
    (the lower middle, so a boot count); None where the middle one is not reached."""
    hits = sorted(next((i for i, k in enumerate(keys, start=1) if k in near), math.inf)
                  for near in resampled_targets(path))
    middle = hits[(len(hits) - 1) // 2]
    return None if math.isinf(middle) else int(middle)


def _task(args: tuple[str, str, int, int]
          ) -> tuple[str, str, int, int | None, int | None, int | None]:
    path, sampler, seed, budget = args
    return (path, sampler, seed, *both_hits(path, sampler, seed, budget))


# ---------------------------------------------------------------------------------- describe


def describe(land: Landscape) -> list[str]:
    """The landscape in a few lines: what was recorded, the best point, how flat it is."""
    meta = land.meta
    sessions = meta.get("sessions", [])
    wall = sum(float(s.get("wall_s", 0.0)) for s in sessions if "dropped" not in s)
    boots = len(land.baseline) + sum(len(v) for v in land.points.values())
    engine = next((s.get("engine_version") for s in sessions if s.get("engine_version")), "")
    model = next((s.get("model", {}).get("name") for s in sessions if s.get("model")), "")
    lines = [f"recorded: {meta.get('engine')} ({engine or 'version unknown'}), model {model}, "
             f"{boots} boots in {wall / 60:.0f} min, levels C="
             f"{','.join(str(c) for c in meta.get('levels', []))}"]
    opt = dict(zip(land.names, land.optimum, strict=True))
    feasible = [s for s in land.scores.values() if s > INFEASIBLE_SCORE]
    near = sum(1 for s in land.scores.values() if s >= land.threshold)
    refused = len(land.scores) - len(feasible)
    lines.append(f"optimum {_short(opt)}: {math.exp(land.best):.2f}x the baseline (mean of "
                 f"{sum(1 for b in land.points[land.optimum] if b.measured)} repeats); "
                 f"{near} of {len(land.scores)} points within 2% of it; {refused} refused")
    near_keys = sorted(tied(land))
    lines.append(f"{len(near_keys)} points the recording cannot rank below the optimum "
                 f"(within 2%, or trailing it by at most one standard error of the difference "
                 f"of the means): " + ", ".join(_short(dict(zip(land.names, k, strict=True)))
                                               for k in near_keys))
    st = optimum_stability(land)
    others = ", ".join(f"{_short(dict(zip(land.names, k, strict=True)))} {v:.0%}"
                       for k, v in list(st.argmax_share.items())[:4] if k != land.optimum)
    sigma = noise_sigma(land)
    once = sum(1 for k in land.points if len(repeat_scores(land, k)) == 1)
    drawn = (f"; the {once} point(s) booted once drawn with a repeat's sd"
             if once and sigma > 0 else "")
    lines.append(f"the optimum under resampling ({st.resamples} bootstrap resamples of the "
                 f"repeats{drawn}): argmax in {st.optimum_share:.0%} (others: "
                 f"{others or 'none'}); within 2% of the resample's argmax in "
                 f"{st.within_share:.0%}; "
                 f"{st.near_points:.1f} points within 2% on average")
    if feasible:
        lo, med = min(feasible), statistics.median(feasible)
        lines.append(f"flatness: median point at {math.exp(med - land.best):.1%} of the "
                     f"optimum, worst at {math.exp(lo - land.best):.1%}; a repeat's score "
                     f"varies by {sigma:.3f} (sd, log units; replay noise band "
                     f"{noise_band(land):.3f})")
    return lines


def _short(point: dict[str, Any]) -> str:
    names = {STEPS: "steps"}
    return " ".join(f"{names.get(k, k)}={v}" for k, v in point.items())


def report(rows: Sequence[Any], say: Callable[[str], None] = print) -> None:
    """Rows (search_efficiency.Row, profile = the table's path) per recorded landscape."""
    by_path: dict[str, list[Any]] = {}
    for r in rows:
        by_path.setdefault(r.profile, []).append(r)
    for path, prow in by_path.items():
        land = landscape_of(path)
        say("")
        say(f"== recorded: {land.name}  ({Path(path).name})")
        for line in describe(land):
            say(f"   {line}")
        strict = [r for r in prow if not r.sampler.endswith((TIED, RESAMPLED))]
        near = [r for r in prow if r.sampler.endswith(TIED)]
        again = [r for r in prow if r.sampler.endswith(RESAMPLED)]
        for rs, what in ((strict, "boots to 98% of the optimum"),
                         (near, "boots to a point the recording cannot rank below the "
                                "optimum (`tied`)"),
                         (again, f"boots to 98% of a resampled table's optimum, the median "
                                 f"over {RESAMPLES} (`resampled`)")):
            if not rs:
                continue
            say(f"   {'sampler':<9} {'budget':>6} {'median':>7} {'worst':>6} {'reached':>8}"
                f"   {what}, per seed ('-': not within the budget)")
            for r in rs:
                per = " ".join("-" if h is None else str(h) for h in r.hits)
                if r.sampler.startswith("grid"):
                    per = f"deterministic: {per.split()[0]} (of {r.budget})"
                say(f"   {r.sampler.rstrip(TIED + RESAMPLED):<9} {r.budget:>6} "
                    f"{_fmt(r.median, r.budget):>7} {_fmt(r.worst, r.budget):>6} "
                    f"{r.within(r.budget):>3}/{len(r.hits):<4}   {per}")


def _fmt(x: float, budget: int) -> str:
    return f">{budget}" if math.isinf(x) else f"{x:g}"


def run_benchmark(paths: Sequence[str], samplers: Sequence[str], seeds: int, budget: int,
                  row: Callable[..., Any], jobs: int = 1) -> list[Any]:
    """`row(profile, sampler, budget, hits)` per landscape and sampler (the grid: once, its
    length as the budget)."""
    tasks = [(p, s, seed, budget) for p in paths for s in samplers if s != "grid"
             for seed in range(seeds)]
    if jobs > 1 and len(tasks) > 1:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            done = list(pool.map(_task, tasks, chunksize=1))
    else:
        done = [_task(t) for t in tasks]
    results: dict[tuple[str, str], dict[int, tuple[int | None, int | None, int | None]]] = {}
    for path, sampler, seed, *hit in done:
        results.setdefault((path, sampler), {})[seed] = tuple(hit)
    rows = []
    for p in paths:
        for s in samplers:
            if s == "grid":
                n = len(grid_order(landscape_of(p)))
                for suffix, hit in zip(("", TIED, RESAMPLED), both_hits(p, s, 0, n),
                                       strict=True):
                    rows.append(row(p, s + suffix, n, (hit,) * seeds))
            else:
                per = [results[(p, s)][i] for i in range(seeds)]
                for j, suffix in enumerate(("", TIED, RESAMPLED)):
                    rows.append(row(p, s + suffix, budget, tuple(h[j] for h in per)))
    return rows
