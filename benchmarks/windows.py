"""Fixed windows against windows that end when the level is known: the same config booted again.

Boots one configuration of a simulator experiment (default: the README's, steps 4 draft 5 mem
0.92, its pick) `--boots` times under each way of measuring a level, through the project's own
trial (`trial.run_trial`: the simulator's HTTP server, the aiohttp load generator, the tables):

- `fixed 4 s`: a 1 s warm-up and a 4 s window per level (the README's experiment until issue 35);
- `fixed 16 s`: a 4 s warm-up and a 16 s window (the window that made two boots agree, stop 29);
- `rule`: the experiment's own `[measure]` with `precision` (load/rounds.py), or `--precision`.

For each level it prints every boot's tok/s (and, for the rule, the 95% interval it reached and
the rounds), the boots' largest relative difference (the two-boot agreement), the measurement
seconds per boot (the levels' own time, warm-ups included: `LevelSummary.level_s`), and, with
`--reference`, each method's mean against one long measurement of the same boot factor. With
`--noise-seed N` every boot draws the same per-boot speed factor (the simulator's `noise_seed`
flag), so what differs between boots is the window and the per-request draws; without it every
boot draws its own factor (about 1.5% on the seed profile), as real boots differ.

These are figures of our own simulator against our own load generator: a check of the method,
not of any GPU.

    python benchmarks/windows.py --boots 2 --noise-seed 7     # about 6 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from specdecode_tune.config import Experiment, MeasureConfig, load_experiment  # noqa: E402
from specdecode_tune.records import TrialResult  # noqa: E402
from specdecode_tune.store import rundir  # noqa: E402
from specdecode_tune.trial import TrialContext, run_trial  # noqa: E402

DEFAULT_POINT = {"speculative_num_steps": 4, "speculative_eagle_topk": 1,
                 "speculative_num_draft_tokens": 5, "mem_fraction_static": 0.92}


def methods(exp: Experiment, precision: float | None) -> dict[str, MeasureConfig]:
    """The ways of measuring a level, each a `[measure]` of the experiment."""
    m = exp.measure
    rule = m if m.precision is not None and precision is None else dataclasses.replace(
        m, precision=precision or 0.02, warmup_s=0.0 if m.precision is None else m.warmup_s,
        min_rounds=2 if m.precision is None else m.min_rounds)
    return {
        "fixed 4 s": dataclasses.replace(m, precision=None, warmup_s=1.0, duration_s=4.0),
        "fixed 16 s": dataclasses.replace(m, precision=None, warmup_s=4.0, duration_s=16.0),
        "rule": rule,
    }


def boot(exp: Experiment, measure: MeasureConfig, point: dict[str, Any], noise_seed: int | None,
         run_dir: str, tag: str) -> TrialResult:
    flags = dict(exp.backend.flags)
    if noise_seed is not None:
        flags["noise_seed"] = noise_seed
    e = dataclasses.replace(exp, measure=measure,
                            backend=dataclasses.replace(exp.backend, flags=flags))
    ctx = TrialContext(run_dir=run_dir, local_dir=rundir.logs_dir(rundir.local_dir(run_dir)),
                       trial_id=tag)
    result = run_trial(e, point, ctx)
    if result.status != "ok":
        raise RuntimeError(f"{tag}: {result.status}: {result.reason}")
    return result


def spent(result: TrialResult) -> float:
    return sum(s.level_s or 0.0 for s in result.levels)


def report(rows: dict[str, list[TrialResult]], ref: TrialResult | None,
           say: Any = print) -> dict[str, dict[str, float]]:
    """The table; returns per method its seconds per boot and worst agreement."""
    levels = [s.concurrency for s in next(iter(rows.values()))[0].levels]
    out: dict[str, dict[str, float]] = {}
    for name, boots in rows.items():
        say(f"\n{name}:")
        say(f"  {'level':>6}  " + "  ".join(f"{'boot ' + str(i + 1):>22}"
                                            for i in range(len(boots)))
            + f"  {'agreement':>9}" + ("  vs reference" if ref else ""))
        worst = 0.0
        for c in levels:
            cells, vals = [], []
            for b in boots:
                s = next(x for x in b.levels if x.concurrency == c)
                vals.append(s.output_tok_s)
                prec = f" +-{s.precision:.1%}" if s.precision is not None else ""
                rounds = f" {s.rounds}r" if s.rounds is not None else ""
                cells.append(f"{s.output_tok_s:7.1f}{prec}{rounds} {s.level_s or 0:4.1f}s")
            agree = (max(vals) - min(vals)) / statistics.fmean(vals)
            worst = max(worst, agree)
            vs = ""
            if ref is not None:
                r = next(x for x in ref.levels if x.concurrency == c).output_tok_s
                vs = f"  {statistics.fmean(vals) / r - 1:+.1%}"
            say(f"  {'C=' + str(c):>6}  " + "  ".join(f"{x:>22}" for x in cells)
                + f"  {agree:9.1%}{vs}")
        per_boot = statistics.fmean(spent(b) for b in boots)
        say(f"  measurement seconds per boot: {per_boot:.1f} (levels' own time, warm-ups "
            f"included); worst two-boot difference {worst:.1%}")
        out[name] = {"seconds": per_boot, "worst": worst}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default="experiments/sim-default.toml")
    ap.add_argument("--boots", type=int, default=2, help="boots per method (default 2)")
    ap.add_argument("--noise-seed", type=int, default=None,
                    help="the same per-boot speed factor in every boot (default: fresh)")
    ap.add_argument("--precision", type=float, default=None,
                    help="the rule's target (default: the experiment's, else 0.02)")
    ap.add_argument("--only", action="append", default=None,
                    help="run only this method (repeatable): 'fixed 4 s', 'fixed 16 s', 'rule'")
    ap.add_argument("--reference", action="store_true",
                    help="also one boot measured for long (10 s warm-up, 60 s window) to "
                         "hold every method's mean against (needs --noise-seed)")
    args = ap.parse_args(argv)
    exp = load_experiment(str(ROOT / args.experiment))
    if exp.backend.kind != "sim":
        ap.error("--experiment: a simulator experiment (backend.kind = \"sim\")")
    if args.reference and args.noise_seed is None:
        ap.error("--reference needs --noise-seed (one boot factor for every boot)")
    ways = methods(exp, args.precision)
    if args.only:
        unknown = [o for o in args.only if o not in ways]
        if unknown:
            ap.error(f"--only: {unknown[0]!r}; one of {', '.join(ways)}")
        ways = {k: v for k, v in ways.items() if k in args.only}
    print(f"config {DEFAULT_POINT} on {exp.name}; noise seed "
          f"{args.noise_seed if args.noise_seed is not None else 'fresh each boot'}; "
          f"rule: {ways['rule'].precision if 'rule' in ways else '-'}")
    rows: dict[str, list[TrialResult]] = {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="windows-") as tmp:
        ref = None
        if args.reference:
            long = dataclasses.replace(exp.measure, precision=None, warmup_s=10.0,
                                       duration_s=60.0)
            ref = boot(exp, long, DEFAULT_POINT, args.noise_seed, tmp, "reference")
        for name, m in ways.items():
            rows[name] = [boot(exp, m, DEFAULT_POINT, args.noise_seed, tmp,
                               f"{name.replace(' ', '')}-{i}") for i in range(args.boots)]
            print(f"  {name}: {args.boots} boot(s) done", flush=True)
    report(rows, ref)
    print(f"\n(wall {time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
