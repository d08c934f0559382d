"""Would a paired comparison end a level sooner? Measured on a real server's requests.

Every boot of an experiment sends the same seeded prompt sequence, and with greedy decoding the
target writes the same answer whatever the draft does, so two configurations' C=1 levels serve
the same requests: the comparison is paired (common random numbers). This reads the per-request
rows of C=1 levels (the store's `requests` table, stacked, e.g.
`benchmarks/data/recording/sglang-gpu-h100-requests-c1.parquet`: SGLang 0.5.17 EAGLE-3 on an
H100, the landscape's second session) and prints, per configuration and per pair:

- how precisely one level's tok/s is known (the ratio-of-sums interval over its requests, as
  `load/rounds.py` computes it with a request as the round);
- for each pair, the share of common prompts answered with the same number of tokens, and how
  precisely the ratio of the two tok/s is known over the common prompts (the same delta-method
  interval, on the pairs (time of B, time of A)): if pairing helped much, this would be far
  below one level's;
- the per-request log-rate's spread, alone and after a regression on the request's lengths
  (1 / output tokens, input / output tokens): what a control variate on lengths could take out.

    python benchmarks/paired_requests.py [TABLE]
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from specdecode_tune.load.rounds import ratio

DEFAULT = Path(__file__).resolve().parent / "data" / "recording" / \
    "sglang-gpu-h100-requests-c1.parquet"


def rel_half(num: np.ndarray, den: np.ndarray) -> float:
    """The 95% relative half-width of sum(num) / sum(den) over K pairs: the interval the
    level's stop rule computes (`load.rounds.ratio`, the delta method)."""
    r = ratio(num.tolist(), den.tolist())
    assert r is not None and r.rel_half is not None
    return r.rel_half


def load(path: Path) -> dict[str, dict[str, np.ndarray]]:
    t = pq.read_table(path).to_pandas()
    t = t[t.in_window & t.error.isna() & (t.level == 1)]
    out = {}
    for trial, g in t.groupby("trial_id", sort=True):
        g = g.set_index("prompt_id")
        out[str(trial)] = {"prompt": g.index.to_numpy(), "out": g.output_tokens.to_numpy(float),
                           "inp": g.input_tokens.to_numpy(float),
                           "time": (g.end - g.start).to_numpy(float)}
    return out


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else DEFAULT
    levels = load(path)
    print(f"{path.name}: {len(levels)} C=1 levels")
    print("one level: requests, tok/s known to +-, log-rate sd, after the lengths' regression")
    for name, v in levels.items():
        y = np.log(v["out"] / v["time"])
        x = np.c_[np.ones(len(y)), 1 / v["out"], v["inp"] / v["out"]]
        resid = y - x @ np.linalg.lstsq(x, y, rcond=None)[0]
        print(f"  {name:45} {len(y):4d}  +-{rel_half(v['out'], v['time']):.1%}  "
              f"sd {y.std():.3f} -> {resid.std():.3f}")
    print("pairs: common prompts, same tokens, A alone +-, A/B paired +-, paired log-ratio sd")
    halves, paired = [], []
    for a, b in itertools.combinations(levels, 2):
        va, vb = levels[a], levels[b]
        common, ia, ib = np.intersect1d(va["prompt"], vb["prompt"], return_indices=True)
        same = float(np.mean(va["out"][ia] == vb["out"][ib]))
        alone = rel_half(va["out"][ia], va["time"][ia])
        # With the same tokens on every common prompt, tok/s A over tok/s B is time B / time A.
        ratio = rel_half(vb["time"][ib], va["time"][ia])
        lr = np.log(vb["time"][ib] / va["time"][ia])
        halves.append(alone)
        paired.append(ratio)
        print(f"  {a[-28:]:28} / {b[-28:]:28} {len(common):4d} {same:5.0%}  +-{alone:.1%}  "
              f"+-{ratio:.1%}  sd {lr.std():.3f}")
    print(f"median over pairs: one level +-{np.median(halves):.1%}, the paired ratio "
          f"+-{np.median(paired):.1%} (two independent levels: about "
          f"+-{np.median(halves) * np.sqrt(2):.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
