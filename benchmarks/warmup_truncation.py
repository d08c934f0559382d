"""How much of a level the warm-up rule drops on a real server, and what that does to its figure.

`load/rounds.py` measures a level in whole rounds: after `warmup_s`, MSER (White 1997) drops the
first rounds where that lowers the kept rounds' variance over their count, and the level stops
at the first round where tok/s and acceptance are known to the target precision. Both are
evaluated again at every round. When the H100 run below was measured, MSER searched the whole
level for its cut; it now searches the first `rounds.START_ROUNDS` rounds only. This prints
both rules side by side.

This replays that rule on a real server's rounds (the batches `rounds.known` reads: start, end,
tokens, tokens and verify steps of the requests that completed in each), stored in
`benchmarks/data/recording/sglang-gpu-h100-rounds.parquet`: SGLang 0.5.17 EAGLE-3 on an H100,
six configurations of the landscape's second session at C=1, 16 and 64, memory fraction 0.0045
(a pool that binds at C=64). The rounds were rebuilt from the run's per-request table: each
request's chunk arrival times (start + TTFT + its chunk gaps) with its output tokens spread
evenly over its chunks (the table keeps the gaps, not each chunk's size), a round = min(C, 64)
completions. Per level and rule it prints where the rule stopped, how many rounds it dropped
and its figure against all the rounds the level ran after `warmup_s`. The old rule's replay
reproduces the live run's notes (e.g. "first 46 of 95 rounds left out" at C=1 for steps 2 /
topk 4 / 8 draft tokens).

    python benchmarks/warmup_truncation.py [TABLE] [--warmup-s 2] [--precision 0.02]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq

from specdecode_tune.load.rounds import START_ROUNDS, Batch, Known, known
from specdecode_tune.load.scheduler import warmup_rounds

DEFAULT = Path(__file__).resolve().parent / "data" / "recording" / \
    "sglang-gpu-h100-rounds.parquet"


def levels(path: Path) -> dict[tuple[str, int], list[Batch]]:
    """(trial, concurrency) -> its batches in order."""
    out: dict[tuple[str, int], list[Batch]] = {}
    for r in sorted(pq.read_table(path).to_pylist(),
                    key=lambda r: (r["trial_id"], r["concurrency"], r["round"])):
        out.setdefault((r["trial_id"], r["concurrency"]), []).append(Batch(
            r["start"], r["end"], r["tokens"], r["done_tokens"], r["verify_ct"],
            r["completed"]))
    return out


def first_rounds(bs: list[Batch], warmup_s: float) -> int:
    """The rounds `warmup_s` leaves out, as the live rule counts them (the level starts at 0)."""
    return warmup_rounds([b.end for b in bs], 0.0, warmup_s)


# The rule as the H100 run measured: MSER's cut searched over the whole level.
WHOLE_LEVEL = 1 << 30


# Both rules here as the H100 run had them: the interval over rounds, each its own batch (the
# interval over 10 batches of rounds came after, benchmarks/stop_rule.py).
PER_ROUND = 1 << 30


def replay(bs: list[Batch], warmup_s: float, cap_s: float,
           start_rounds: int = START_ROUNDS, n_groups: int = PER_ROUND
           ) -> Iterator[tuple[int, Known]]:
    """What the rule knows at each complete round that ended by `cap_s` (times from the
    level's start): (rounds so far, the figures), as the live rule asks after each round."""
    for k in range(1, len(bs) + 1):
        if bs[k - 1].end > cap_s:
            return
        sub = bs[:k]
        kn = known(sub, first_rounds(sub, warmup_s), start_rounds, n_groups)
        if kn is not None and kn.tok_s is not None:
            yield k, kn


def live(bs: list[Batch], warmup_s: float, precision: float, min_rounds: int,
         cap_s: float, start_rounds: int = START_ROUNDS) -> tuple[int, int, float]:
    """The live rule replayed: (rounds when it stopped, rounds dropped, tok/s)."""
    last = None
    for k, kn in replay(bs, warmup_s, cap_s, start_rounds):
        assert kn.tok_s is not None
        last = (k, kn.warmup, kn.tok_s.value)
        if kn.met(precision, min_rounds):
            break
    assert last is not None
    return last


def without_mser(bs: list[Batch], warmup_s: float) -> float:
    kept = bs[first_rounds(bs, warmup_s):] or bs
    return sum(b.tokens for b in kept) / sum(b.seconds for b in kept)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("table", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--precision", type=float, default=0.02)
    ap.add_argument("--min-rounds", type=int, default=2)
    ap.add_argument("--cap-s", type=float, default=32.0)
    a = ap.parse_args(argv)
    rules = {"as run (whole level)": WHOLE_LEVEL, f"now (first {START_ROUNDS})": START_ROUNDS}
    print("per rule: the round it stopped at, the rounds it dropped, its tok/s, and that against "
          "all the rounds after warmup_s")
    print(f"{'level':34} {'rounds':>6}" + "".join(
        f" | {name:>20}: stop drop   tok/s vs all" for name in rules))
    big: dict[str, list[str]] = {name: [] for name in rules}
    for (trial, c), bs in levels(a.table).items():
        plain = without_mser(bs, a.warmup_s)
        name = f"{trial.removeprefix('land-r0-static0.0045-')} C={c}"
        line = f"{name:34} {len(bs):6d}"
        for rule, start in rules.items():
            k, dropped, value = live(bs, a.warmup_s, a.precision, a.min_rounds, a.cap_s, start)
            line += f" | {'':>20}  {k:4d} {dropped:4d} {value:7.0f} {value / plain - 1:+6.1%}"
            if dropped >= k // 4:
                big[rule].append(f"{name}: {dropped} of {k}, {value / plain - 1:+.1%}")
        print(line)
    for rule, items in big.items():
        print(f"{rule}: levels where a quarter or more of the rounds were dropped: {len(items)}"
              + "".join(f"\n  {x}" for x in items))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
