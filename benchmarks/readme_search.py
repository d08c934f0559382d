"""The README's main command itself, run N times: boots in all, why it stopped, what it picked.

`whole_search.py` replays the default search without servers (each boot drawn from the
profile's noise model, seconds per search). This runs the real thing: `python -m
specdecode_tune.search` on the experiment (default: the simulator, `experiments/sim-default.toml`)
with `--seed 0..N-1`, each in its own run dir, with Ray, the simulator's HTTP server, the
aiohttp load generator and the Parquet tables, as a user's run. The simulator's per-boot noise
is fresh each boot (it is not seeded), so two runs of one seed differ as two real runs do.

Per run it reads the run dir back (`report.data.read_run`, what the report reads) and prints:

- boots: the baseline and every trial (explorations and re-measurements);
- refused: trials the server refused at start-up;
- stopped: the stop rule's reason (the model knows) or the cap;
- picked: the report's best configuration (robust score first), and where it stands against the
  exhaustive optimum of the profile's model (`search_efficiency.build_truth`: noise-free
  `sim.model.predict` over the whole space). That optimum is the simulator's model, code we
  wrote; the served simulator adds its scheduler's dynamics on top, so the pick is also
  compared with the best median the run measured.

Per run it also prints the measurement seconds the search spent (`LevelSummary.level_s` summed
over every boot's levels, warm-ups included; boots and the pauses between levels not), beside
its boots, and where the rest of a boot's time goes, from the trials table's `started_at` and
`finished_at` (the trainable's own clock: `boot_gaps`): between boots, from a boot's end to the
start of the next boot that started after it (the searcher's proposal, Tune, Ray starting the
trial's actor); and per boot besides its levels (its server's start, the warm-up request, the
checks after each level). `--windows fixed,rule` runs each seed under both ways of measuring a
level: `rule`, the experiment as it is (measure.precision: windows that end when the level is
known), and `fixed`, the same experiment with the fixed windows it had before (a 1 s warm-up
and a 4 s window per level: `FIXED_MEASURE`); the two are printed side by side. `--profile
NAME` runs the experiment on another shipped simulator profile (its `backend.profile`
replaced), judged on that profile's model.

`--windows rule:precision=0.03:warmup_requests=0` runs the experiment with those [measure] keys
set (a variant of the rule beside it); each seed runs under every variant before the next seed,
so that a load on a shared machine falls on all of them alike; `--first-seed` starts elsewhere
than 0 (one seed at a time, alternating with another checkout's run of the same seed).

    python benchmarks/readme_search.py --seeds 10      # about 200 s a run on 2 cores
    python benchmarks/readme_search.py --seeds 3 --windows fixed,rule
    python benchmarks/readme_search.py --seeds 10 --profile bench-two-regime
"""

from __future__ import annotations

import argparse
import bisect
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import search_efficiency as se  # noqa: E402

from specdecode_tune import store  # noqa: E402
from specdecode_tune.config import load_experiment  # noqa: E402
from specdecode_tune.report.data import read_run  # noqa: E402

ROOT = HERE.parent
TARGET_BOOTS = 12
_STOPPED = re.compile(r"^stopped: (.*)$", re.MULTILINE)
# The README experiment's [measure] timing before issue 35: a fixed window per level.
FIXED_MEASURE = {"warmup_s": 1.0, "duration_s": 4.0}
_WINDOW_KEYS = ("precision", "min_rounds", "max_duration_s", "warmup_s", "duration_s")


def measure_overrides(windows: str) -> dict[str, str]:
    """The [measure] keys a `--windows` entry sets: {} for "rule" (the experiment as it is),
    FIXED_MEASURE for "fixed", and KEY=VALUE pairs after "rule:" for a variant of the rule
    ("rule:precision=0.03:warmup_requests=0")."""
    if windows == "fixed":
        return {k: str(v) for k, v in FIXED_MEASURE.items()}
    if windows == "rule":
        return {}
    head, _, rest = windows.partition(":")
    pairs = [p.split("=", 1) for p in rest.split(":") if p]
    if head != "rule" or not pairs or any(len(p) != 2 or not p[0] for p in pairs):
        raise ValueError(f"--windows entry {windows!r}: rule, fixed, or "
                         f"rule:KEY=VALUE[:KEY=VALUE...] ([measure] keys)")
    return {k.strip(): v.strip() for k, v in pairs}


def variant(text: str, windows: str, profile: str | None) -> str:
    """The experiment's text with fixed windows (`windows` = "fixed"; "rule" keeps it; "rule:
    KEY=VALUE:..." sets those [measure] keys) and another simulator profile, where asked."""
    sets = measure_overrides(windows)
    drop = _WINDOW_KEYS if windows == "fixed" else tuple(sets)
    out, section = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            section = stripped
            out.append(line)
            if sets and section == "[measure]":
                out += [f"{k} = {v}" for k, v in sets.items()]
            continue
        key = stripped.split("=", 1)[0].strip()
        if sets and section == "[measure]" and key in drop:
            continue
        if profile is not None and section == "[backend]" and key == "profile":
            line = f"profile = {profile!r}".replace("'", '"')
        out.append(line)
    return "\n".join(out) + "\n"


def run_once(experiment: str, seed: int, storage: str, timeout_s: float) -> dict[str, Any]:
    """One search, as the README runs it (plus --seed and a run dir of its own)."""
    name = f"seed{seed}"
    if (Path(storage) / name).exists():
        # The search would resume that run (and finish at once): not a measurement.
        raise RuntimeError(f"{Path(storage) / name} exists: give an empty --storage")
    cmd = [sys.executable, "-m", "specdecode_tune.search", "--experiment", experiment,
           "--seed", str(seed), "--storage", storage, "--name", name]
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                          check=False)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise RuntimeError(f"seed {seed}: exit {done.returncode}: " + " | ".join(tail))
    data = read_run(str(Path(storage) / name))
    gaps, besides = run_gaps(str(Path(storage) / name))
    trials = [t for t in data.trials if not t.baseline]
    measured = [sum(lv.level_s or 0.0 for lv in t.levels.values()) for t in data.trials]
    m = _STOPPED.search(done.stdout)
    stopped = m.group(1) if m else ""
    best = data.best
    by_median = max(data.configs, key=lambda cf: cf.robust.median) if data.configs else None
    return {"seed": seed, "wall_s": wall, "boots": 1 + len(trials),
            "measure_s": sum(measured), "gaps_s": gaps, "besides_s": besides,
            "refused": sum(1 for t in trials if t.status == "infeasible"),
            "explored": len({t.config_key for t in trials}),
            "self_stop": stopped.startswith("the model knows"), "stopped": stopped,
            "picked": None if best is None else best.params,
            "picked_median": None if best is None else best.robust.median,
            "best_median": None if by_median is None else by_median.robust.median}


def run_gaps(run_dir: str) -> tuple[list[float], list[float]]:
    """`boot_gaps` of a run dir, from its trials and levels tables."""
    tables = store.read_tables(run_dir)
    level_s: dict[str, float] = {}
    for row in tables.levels.select(["trial_id", "level_s"]).to_pylist():
        level_s[row["trial_id"]] = level_s.get(row["trial_id"], 0.0) + (row["level_s"] or 0.0)
    return boot_gaps(tables.trials.to_pylist(), level_s)


def boot_gaps(rows: Sequence[dict[str, Any]], level_s: dict[str, float]
              ) -> tuple[list[float], list[float]]:
    """(Between boots: for each boot that started after another ended, the seconds from the
    latest such end to its start; besides the levels: for each boot with measured levels, its
    seconds from start to end less its levels' `level_s`.) `rows`: the trials table's rows
    (trial_id, started_at, finished_at: datetimes or epoch seconds, None where unrecorded);
    `level_s`: each trial id's levels' seconds summed."""
    def sec(t: Any) -> float | None:
        return None if t is None else float(t.timestamp() if hasattr(t, "timestamp") else t)

    spans = [(r["trial_id"], sec(r.get("started_at")), sec(r.get("finished_at"))) for r in rows]
    spans = [(tid, a, b) for tid, a, b in spans if a is not None and b is not None]
    ends = sorted(b for _, _, b in spans)
    gaps = []
    for _, a, _ in sorted(spans, key=lambda s: s[1]):
        if i := bisect.bisect_right(ends, a):         # the boots that ended by this start
            gaps.append(a - ends[i - 1])
    besides = [b - a - level_s[tid] for tid, a, b in spans if level_s.get(tid)]
    return gaps, besides


def judge(row: dict[str, Any], truth: se.Truth, exp: Any) -> dict[str, Any]:
    """Where the pick stands on the profile model's exhaustive optimum."""
    key = None if row["picked"] is None else se.point_of(exp, row["picked"])
    return {**row, "key": key, "at": truth.at(key), "within": truth.within(key)}


def report(rows: Sequence[dict[str, Any]], truth: se.Truth,
           say: Callable[[str], None] = print, title: str = "") -> None:
    say("")
    say("== the README's main command, run for real (python -m specdecode_tune.search "
        "--seed N; baseline and re-measurements counted)" + (f": {title}" if title else ""))
    for r in rows:
        key = "-" if r["key"] is None else "steps={} topk={} draft={} mem={}".format(*r["key"])
        gap = (r["best_median"] - r["picked_median"]) if r["picked_median"] is not None else 0.0
        say(f"   seed {r['seed']:>2}: {r['boots']:>2} boots ({r['explored']} explored, "
            f"{r['refused']} refused), {'self-stop' if r['self_stop'] else 'cap'}, "
            f"{r['wall_s']:.0f} s, measuring {r['measure_s']:.0f} s "
            f"({r['measure_s'] / r['boots']:.1f} s a boot); picked {key} at {r['at']:.1%} of "
            f"the model's optimum ({100 * (math.exp(-gap) - 1):+.1f}% vs the run's best median)")
        say(f"            between boots {_spread(r['gaps_s'])}; per boot besides its levels "
            f"{_spread(r['besides_s'])}")
    b = [r["boots"] for r in rows]
    opt = "steps={} topk={} draft={} mem={}".format(*truth.optimum)
    m = [r["measure_s"] for r in rows]
    say(f"   measuring median {statistics.median(m):.0f} s a search "
        f"({statistics.median(x / r['boots'] for x, r in zip(m, rows)):.1f} s a boot), "
        f"wall median {statistics.median(r['wall_s'] for r in rows):.0f} s")
    say(f"   between boots, all runs: {_spread([g for r in rows for g in r['gaps_s']])}; per "
        f"boot besides its levels {_spread([x for r in rows for x in r['besides_s']])}")
    say(f"   boots median {statistics.median(b):g} / worst {max(b)}; self-stop "
        f"{sum(r['self_stop'] for r in rows)}/{len(rows)}; picked within 2% of the optimum "
        f"({opt}) {sum(r['within'] for r in rows)}/{len(rows)}; refused worst "
        f"{max(r['refused'] for r in rows)}")
    ok = all(r["boots"] <= TARGET_BOOTS and r["self_stop"] for r in rows)
    say(f"  target: stops by itself in <= {TARGET_BOOTS} boots in every run: "
        f"{'MET' if ok else 'NOT MET'}; picks within 2% in every run: "
        f"{'MET' if all(r['within'] for r in rows) else 'NOT MET'}")


def _spread(xs: Sequence[float]) -> str:
    """"median 2.1 s (0.3-5.0 s, 7)": the median, the range and the count; "-" for none."""
    if not xs:
        return "-"
    return (f"median {statistics.median(xs):.1f} s ({min(xs):.1f}-{max(xs):.1f} s, "
            f"{len(xs)})")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10, help="runs, --seed 0..N-1 (default 10)")
    ap.add_argument("--first-seed", type=int, default=0,
                    help="the first --seed (default 0): --first-seed 3 --seeds 2 runs 3 and 4")
    ap.add_argument("--experiment", default="experiments/sim-default.toml",
                    help="a simulator experiment (default: the README's)")
    ap.add_argument("--storage", default=None,
                    help="where the run dirs go (default: a temporary folder, removed)")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds per run")
    ap.add_argument("--windows", default="rule",
                    help="comma-separated: rule (the experiment's [measure]), fixed (a 1 s "
                         "warm-up and a 4 s window per level), rule:KEY=VALUE[:KEY=VALUE] "
                         "(the experiment's with those [measure] keys set); each seed runs "
                         "under each, in turn (seed 0 under each, then seed 1...), so that "
                         "a shared machine's load falls on all alike")
    ap.add_argument("--profile", default=None,
                    help="another shipped simulator profile for the experiment's backend")
    args = ap.parse_args(argv)
    windows = [w.strip() for w in args.windows.split(",") if w.strip()]
    try:
        for w in windows:
            measure_overrides(w)
    except ValueError as e:
        ap.error(str(e))
    if not windows:
        ap.error(f"--windows: {args.windows!r}; allowed: rule, fixed, rule:KEY=VALUE...")
    source = ROOT / args.experiment
    exp = load_experiment(str(source))
    if exp.backend.kind != "sim":
        ap.error(f"--experiment: backend kind {exp.backend.kind!r}; this benchmark judges the "
                 f"pick on a simulator profile's model, so it needs kind = \"sim\"")
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="readme-search-") as tmp:
        storage = args.storage or tmp
        paths, truths, wexps = {}, {}, {}
        for i, w in enumerate(windows):
            paths[w] = Path(tmp) / f"experiment-{i}.toml"
            paths[w].write_text(variant(source.read_text(), w, args.profile))
            wexps[w] = load_experiment(str(paths[w]))
            truths[w] = se.build_truth(wexps[w].backend.profile, wexps[w])
            results[w] = []
        # Seed-major: a load spike falls on every variant.
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for i, w in enumerate(windows):
                row = judge(run_once(str(paths[w]), seed, str(Path(storage) / f"w{i}"),
                                     args.timeout), truths[w], wexps[w])
                results[w].append(row)
                print(f"  {w} seed {seed}: {row['boots']} boots, measuring "
                      f"{row['measure_s']:.0f} s, wall {row['wall_s']:.0f} s, at "
                      f"{row['at']:.1%}; between boots {_spread(row['gaps_s'])}", flush=True)
    for w, rows in results.items():
        report(rows, truths[w], title=f"{w} windows ({wexps[w].backend.profile})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
