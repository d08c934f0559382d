"""Does a level that stops early know its figure? The precision rule replayed on real servers.

`load/rounds.py` ends a level at the first whole round where tok/s (and acceptance) is known
to the target precision, with at least `min_rounds` rounds kept. The served vLLM search on an
H100 (2026-12-07, `docs/gpu-runs.md`) ended 3 of its 30 levels after 2-7 kept rounds (1-5 s)
"known to +-1.4-1.9%", while every other level of that run ran to its 20 s cap known to only
+-2.7-8.2%; one of the three read 17% below the same point's first boot. This replays the rule
on the rounds of the levels that ran to their cap, and asks of each stop before the cap how
far its figure is from the whole level's.

The rounds: SGLang 0.5.17 EAGLE-3 (`benchmarks/data/recording/sglang-gpu-h100-rounds.parquet`,
18 levels) and vLLM 0.26.0 EAGLE-3 (`vllm-gpu-h100-rounds.parquet` beside it, 27 levels that
ran to the cap, rebuilt with `--rebuild RUN_DIR` from the run's request table as the SGLang
table was: each request's chunks at start + TTFT + its gaps, its output tokens spread evenly
over them, a round = min(C, 64) completions, the requests cut at the level's end counted as
in flight, `rounds.batches` and `scheduler.round_ends`' rule).

Replays. A level is replayed from its start (the rule as it ran, `warmup_s` then MSER) and
from every round after its warm-up as a level that starts warm (MSER still looks at its first
rounds): one level gives tens of replays, each a window of at most `--cap-s`. A replay's
"truth" is the level's figure over all its rounds after the warm-up (itself known to only
+-2.7-8.2% on these levels: an error below that is no proof, one far above it is a wrong
stop). Per interval (over rounds, the rule until 2026-12-07; over 10 batches of rounds, the
rule since) and `min_rounds` it prints the replays that stopped before their cap, their
seconds, and how many were off by more than the target precision.

    python benchmarks/stop_rule.py [--min-rounds 2,3,5,10,20] [--precision 0.02]
    python benchmarks/stop_rule.py --rebuild RUN_DIR --out TABLE    (a run's rounds)
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from warmup_truncation import PER_ROUND, replay
from warmup_truncation import levels as load

from specdecode_tune.load.rounds import GROUPS, Batch, Stream, batches, known
from specdecode_tune.load.scheduler import warmup_rounds

HERE = Path(__file__).resolve().parent / "data" / "recording"
TABLES = {"SGLang 0.5.17": HERE / "sglang-gpu-h100-rounds.parquet",
          "vLLM 0.26.0": HERE / "vllm-gpu-h100-rounds.parquet"}
# Each engine's window cap after the warm-up, as its experiments have it (sglang-gpu: 30 s,
# vllm-gpu: 20 s); --cap-s replaces both.
CAPS = {"SGLang 0.5.17": 30.0, "vLLM 0.26.0": 20.0}
RUNNING_LIMIT = 64          # both runs' --max-running-requests / --max-num-seqs
# The interval over rounds, each its own batch (the rule until 2026-12-07), and over GROUPS
# batches of rounds from 2 x GROUPS rounds on (the rule since).
INTERVALS = {"rounds": PER_ROUND, f"{GROUPS} batches": GROUPS}


def rebuild(run_dir: Path) -> dict[tuple[str, int], list[Batch]]:
    """(trial, concurrency) -> the level's rounds, from the run's request table."""
    rows = ds.dataset(run_dir / "tables" / "requests", format="parquet").to_table(
        columns=["trial_id", "level", "start", "end", "ttft", "output_tokens", "chunk_gaps",
                 "verify_ct", "error"]).to_pylist()
    by: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        by.setdefault((r["trial_id"], r["level"]), []).append(r)
    out = {}
    for (trial, c), reqs in sorted(by.items()):
        cut = max(r["end"] for r in reqs)
        streams, ends = [], []
        for r in reqs:
            t = r["start"] + (r["ttft"] or 0.0)
            times = [t]
            for g in r["chunk_gaps"]:
                t += g
                times.append(t)
            done = r["end"] < cut - 1e-3
            size = r["output_tokens"] / len(times)       # times holds the first token's
            streams.append(Stream(times=times, sizes=[size] * len(times),
                                  end=r["end"] if done else None, completed=done,
                                  tokens=float(r["output_tokens"]) if done else 0.0,
                                  verify_ct=r["verify_ct"] if done else None))
            if done:
                ends.append(r["end"])
        n = min(c, RUNNING_LIMIT)
        bounds = [0.0, *sorted(ends)[n - 1::n]]
        out[(trial, c)] = batches(bounds, streams)
    return out


def write(levels: dict[tuple[str, int], list[Batch]], path: Path) -> None:
    """The rounds as `warmup_truncation.levels` (`load` here) reads them back."""
    rows = [{"trial_id": t, "concurrency": c, "round": i, "start": b.start, "end": b.end,
             "tokens": b.tokens, "done_tokens": b.done_tokens, "verify_ct": b.verify_ct,
             "completed": b.completed}
            for (t, c), bs in levels.items() for i, b in enumerate(bs)]
    pq.write_table(pa.Table.from_pylist(rows), path)


def stop(bs: list[Batch], warmup_s: float, precision: float, min_rounds: int,
         cap_s: float, n_groups: int = GROUPS) -> tuple[float, float] | None:
    """The rule replayed on `bs` (times from the level's start): (seconds, tok/s) where it
    stopped before `cap_s`, None where it ran to the cap."""
    for k, kn in replay(bs, warmup_s, cap_s, n_groups=n_groups):
        if kn.met(precision, min_rounds):
            assert kn.tok_s is not None
            return bs[k - 1].end, kn.tok_s.value
    return None


def shifted(bs: list[Batch]) -> list[Batch]:
    t0 = bs[0].start
    return [Batch(b.start - t0, b.end - t0, b.tokens, b.done_tokens, b.verify_ct, b.completed)
            for b in bs]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-rounds", default="2,3,5,10,20")
    ap.add_argument("--precision", type=float, default=0.02)
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--cap-s", type=float, default=None,
                    help="the window's cap after the warm-up (default: each engine's "
                         "experiments', SGLang 30 s, vLLM 20 s)")
    ap.add_argument("--rebuild", type=Path, help="a run dir: write its rounds to --out")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if a.rebuild:
        if a.out is None:
            ap.error("--rebuild needs --out")
        levels = rebuild(a.rebuild)
        write(levels, a.out)
        print(f"{a.out}: {sum(map(len, levels.values()))} rounds of {len(levels)} levels")
        return 0
    mins = [int(x) for x in a.min_rounds.split(",")]
    print(f"target +-{a.precision:.0%}; a replay 'wrong' when its stop is off the level's "
          f"whole figure by more than that")
    print(f"{'engine':14} {'interval':>10} {'min_rounds':>10} {'replays':>8} {'stopped':>8} "
          f"{'median s':>9} {'wrong':>6} {'median |err|':>12} {'max |err|':>9}")
    for engine, path in TABLES.items():
        if not path.exists():
            print(f"{engine}: no table at {path}")
            continue
        levels = load(path)
        cap = a.cap_s if a.cap_s is not None else CAPS[engine]
        for (interval, n_groups), m in itertools.product(INTERVALS.items(), mins):
            n = stopped = wrong = 0
            errs, secs = [], []
            for bs in levels.values():
                first = warmup_rounds([b.end for b in bs], 0.0, a.warmup_s)
                whole = known(bs, first)
                if whole is None or whole.tok_s is None or bs[-1].end < a.warmup_s + cap - 3:
                    continue        # a level that stopped early itself: no whole figure
                truth = whole.tok_s.value
                starts = [(bs, a.warmup_s)] + [(shifted(bs[j:]), 0.0)
                                              for j in range(whole.warmup, len(bs) - 2)]
                for sub, w in starts:
                    n += 1
                    got = stop(sub, w, a.precision, m, w + cap, n_groups)
                    if got is None:
                        continue
                    stopped += 1
                    secs.append(got[0])
                    err = abs(got[1] / truth - 1)
                    errs.append(err)
                    wrong += err > a.precision
            med = statistics.median(errs) if errs else 0.0
            print(f"{engine:14} {interval:>10} {m:10d} {n:8d} {stopped:8d} "
                  f"{statistics.median(secs) if secs else 0:9.1f} {wrong:6d} {med:12.1%} "
                  f"{max(errs, default=0):9.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
