"""Windows that end when a level is known: a closed loop measured in whole rounds.

A closed loop's C requests start together and, where their lengths are fixed, stay in lockstep:
every round is a prefill of C prompts and a decode of C answers, and a fixed window cuts these
rounds wherever its ends fall (a 4 s window over rounds of 2.7-3.2 s read C=32 4-10% high on
the simulator, issue 35). Here a level is measured in whole rounds instead:

- a round is n requests, n = min(C, the server's running limit): the server runs at most its
  limit at once, so a loop over it is served in waves of the limit; round k is complete at
  tau_k, when the level's (k n)-th request finished (tau_0: the level's start, when all C were
  sent); in lockstep that is each round's last request;
- batch k is the time from tau_(k-1) to tau_k, its figure the output tokens whose chunks
  arrived in it over its length; the level's tok/s is the ratio of the sums over the batches
  it keeps, and its acceptance the completed requests' tokens over their verify steps;
- the first batches may be a transient (the C requests start at once and drift apart over
  rounds; a server that queues fills its running slots in the first round): they are dropped
  by MSER, White's truncation rule (White 1997, "An effective truncation heuristic for bias
  reduction in simulation output"; with batches of 5 observations, MSER-5, the rule Hoad,
  Robinson & Davies 2010 found the most reliable), here with a round as the batch: the d
  below K/2 that minimises the kept batches' squared deviations over (K - d)^2; it looks for
  that start among the first START_ROUNDS rounds only (so it drops at most 3): a slow episode
  later in the level is the server's, not a warm-up. Over the whole level, MSER dropped
  27-46 rounds in 3 of 18 levels of a real SGLang server (H100, 2026-12-06), once a mid-level
  slow span that put the level 10% high, and, chosen anew each time the stop is asked, it
  can pick the cut that makes the kept rounds look precise (`benchmarks/warmup_truncation.py`);
- the level ends at the first complete round where at least `min_rounds` rounds are kept and
  the 95% interval of each figure is within the target relative precision; or at the cap, with
  the precision it reached.

The interval. Under lockstep the loop is in the same state at every tau_k (n requests about to
be prefilled), so the batches are regeneration cycles and the interval of the ratio of sums is
the regenerative method's (Crane & Iglehart 1975; Law & Kelton, *Simulation Modeling and
Analysis*, 3rd ed. 2000, section 9.5.3: the delta-method variance of the ratio estimator, a
Student t quantile for K - 1 degrees of freedom). Where the requests have drifted apart, the
tau_k are no longer regenerations; the same interval is then batch means with a round as the
batch (Law & Kelton section 9.5.2), valid as far as one round's figure is nearly independent
of the next. On real servers with ShareGPT traffic it is not: requests of uneven length span
rounds, neighbouring prompts are alike, the server's speed wanders over seconds; a served vLLM
search (H100, 2026-12-07) ended 3 of 30 levels after 2-7 kept rounds "known to +-1.4-1.9%",
one 17% below the same point's other boot, while its other levels ran 20 s to +-2.7-8.2%.
So from 2 x GROUPS kept rounds on, the interval is over GROUPS batches of consecutive rounds
(`groups`), each batch growing with the level while their number stays: batch means with a
fixed number of batches (Schmeiser 1982), whose interval holds once a batch is long against
the rounds' correlation. Replayed on the real rounds of both engines
(`benchmarks/stop_rule.py`), with at least 30 rounds kept the stops before the cap fell
within 2.2% (SGLang) and 4.3% (vLLM) of the whole level's figure, against 13% and 79% with
the interval over rounds and 2 rounds. Both ends of the kept span are round completions, the
same point of the loop's cycle, so no round is cut at a phase that biases the figure.

The stop is the relative-precision sequential procedure of Law & Kelton (section 9.4.1, after
Law, Kelton & Koenig 1981): stop at the first K with half-width / |estimate| <= g / (1 + g),
which puts the estimate within a relative error g of the mean with probability about 0.95.
Its coverage is asymptotic (Chow & Robbins 1965): with few rounds it falls short where rounds
vary a lot, as a stop can follow rounds that agree by chance; `min_rounds` (30 unless the
experiment says: the simulator's lock-stepped rounds of alike requests, regeneration cycles
drawn alike, keep 2), the batches and the t quantile guard against that;
docs/search-efficiency.md measures how it holds on the simulator and on real rounds.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

# Student's t 97.5% quantiles for 1..30 degrees of freedom; beyond 30 the normal's 1.96 is
# within 4%.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


# The interval's batches from 2 x GROUPS kept rounds on: GROUPS batches of consecutive rounds
# (batch means with a fixed number of batches, their size growing with the level: Schmeiser,
# "Batch size effects in the analysis of simulation output", Operations Research 30(3), 1982,
# who finds the cost of few batches small from 8-10 on and little gained beyond 30; Law &
# Kelton section 9.5.2). A round as the
# batch assumes one round's figure nearly independent of the next: on real servers with
# ShareGPT traffic it is not (benchmarks/stop_rule.py).
GROUPS = 10

# MSER's window: the rounds after `warmup_s` where a start-up is looked for. The start-ups seen
# on the H100 (a first round longer than warmup_s at C=64, a first round of slots filling and
# batch shapes met at C=16) were 1-3 rounds; a longer one is for `warmup_s`.
START_ROUNDS = 8


def t975(dof: int) -> float:
    """Student's t 97.5% quantile (a two-sided 95% interval)."""
    if dof < 1:
        return math.inf
    return _T975[dof - 1] if dof <= len(_T975) else 1.96


@dataclass(frozen=True, slots=True)
class Ratio:
    """A ratio of sums over batches and its 95% interval's half-width relative to it."""

    value: float
    rel_half: float | None   # None with fewer than two batches (no interval)


def ratio(num: Sequence[float], den: Sequence[float]) -> Ratio | None:
    """sum(num) / sum(den) with the delta-method interval over the pairs (num_k, den_k): the
    residuals num_k - R den_k, their variance over K - 1, the t quantile for K - 1."""
    k = len(num)
    total = sum(den)
    if k == 0 or total <= 0:
        return None
    r = sum(num) / total
    if k < 2 or r == 0:
        return Ratio(r, None)
    s2 = sum((x - r * y) ** 2 for x, y in zip(num, den)) / (k - 1)
    half = t975(k - 1) * math.sqrt(s2 / k) / (total / k)
    return Ratio(r, half / abs(r))


def mser(values: Sequence[float]) -> int:
    """White's MSER truncation point: the d below half the values (d <= (n - 1) // 2, so that
    more are kept than dropped and two values are never cut to one) minimising the squared
    deviations of values[d:] around their mean over (n - d)^2; the first such d."""
    n = len(values)
    best_d, best = 0, math.inf
    for d in range((n - 1) // 2 + 1):
        kept = values[d:]
        m = math.fsum(kept) / len(kept)
        stat = math.fsum((v - m) ** 2 for v in kept) / len(kept) ** 2
        if stat < best - 1e-12 * abs(best if math.isfinite(best) else 0.0):
            best_d, best = d, stat
    return best_d


@dataclass(frozen=True, slots=True)
class Batch:
    """The time from one round's completion to the next's."""

    start: float
    end: float
    tokens: float            # output tokens whose chunks arrived in (start, end]
    done_tokens: float       # output tokens of the requests that completed in it with verify steps
    verify_ct: int           # ... their verify steps
    completed: int           # requests that completed in it (ok or not)

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Known:
    """What the complete rounds say of a level: the batches kept after the warm-up."""

    rounds: int               # complete rounds
    warmup: int               # the first ones dropped (MSER)
    tok_s: Ratio | None
    accept: Ratio | None      # None where the requests bring no verify steps
    start: float              # the kept span, on the caller's clock
    end: float

    @property
    def kept(self) -> int:
        return self.rounds - self.warmup

    def met(self, precision: float, min_rounds: int) -> bool:
        """The sequential rule: enough kept rounds, and every figure's half-width within the
        target, as Law & Kelton's g / (1 + g)."""
        if self.kept < max(2, min_rounds) or self.tok_s is None:
            return False
        goal = precision / (1.0 + precision)
        figures = [self.tok_s] + ([self.accept] if self.accept is not None else [])
        return all(f.rel_half is not None and f.rel_half <= goal for f in figures)


def groups(kept: Sequence[Batch], n: int = GROUPS) -> list[Sequence[Batch]]:
    """The batches of the interval: each round its own below 2 n rounds; from 2 n on, n
    batches of consecutive rounds (their sizes differ by at most one, the earlier ones the
    larger), so a batch grows with the level while their number stays (Schmeiser 1982)."""
    k = len(kept)
    if k < 2 * n:
        return [kept[i:i + 1] for i in range(k)]
    size, extra = divmod(k, n)
    out, i = [], 0
    for j in range(n):
        m = size + (1 if j < extra else 0)
        out.append(kept[i:i + m])
        i += m
    return out


def known(batches: Sequence[Batch], first: int = 0,
          start_rounds: int = START_ROUNDS, n_groups: int = GROUPS) -> Known | None:
    """The level's tok/s and acceptance over `batches`, the first `first` of them not counted
    (a warm-up in seconds) and then MSER's warm-up among the next `start_rounds`; None without
    a batch. The figures are ratios of sums over the kept rounds; their intervals are over
    `groups` of them (`n_groups`; a very large one: each round its own batch, the rule until
    2026-12-07)."""
    usable = list(batches[first:])
    if not usable:
        return None
    d = mser([b.tok_s for b in usable[:start_rounds]])
    kept = usable[d:]
    gs = groups(kept, n_groups)
    tok = ratio([sum(b.tokens for b in g) for g in gs], [sum(b.seconds for b in g) for g in gs])
    acc = None
    if all(b.verify_ct > 0 for b in kept):
        acc = ratio([sum(b.done_tokens for b in g) for g in gs],
                    [float(sum(b.verify_ct for b in g)) for g in gs])
    return Known(rounds=len(batches), warmup=first + d, tok_s=tok, accept=acc,
                 start=kept[0].start, end=kept[-1].end)


@dataclass(frozen=True, slots=True)
class Stream:
    """One request as the batches see it: its chunks' arrival times and token counts, when
    it ended, and (where it completed) its tokens and verify steps."""

    times: Sequence[float]
    sizes: Sequence[float]
    end: float | None         # None: still running
    completed: bool           # ended without being cut (ok or failed)
    tokens: float             # its output tokens (completed ones)
    verify_ct: int | None     # its verify steps (completed ok ones, where the server says)


def batches(bounds: Sequence[float], streams: Sequence[Stream]) -> list[Batch]:
    """The batches between consecutive `bounds` (round completions, ascending): the tokens
    that arrived in each, and the requests that completed in each."""
    n = len(bounds) - 1
    if n < 1:
        return []
    tokens = [0.0] * n
    done_tokens = [0.0] * n
    verify = [0] * n
    completed = [0] * n
    lo, hi = bounds[0], bounds[-1]
    for s in streams:
        if s.times and s.times[-1] > lo and s.times[0] <= hi:
            for t, size in zip(s.times, s.sizes):
                if lo < t <= hi:
                    tokens[bisect.bisect_left(bounds, t) - 1] += size
        if s.completed and s.end is not None and lo < s.end <= hi:
            k = bisect.bisect_left(bounds, s.end) - 1
            completed[k] += 1
            if s.verify_ct:
                verify[k] += s.verify_ct
                done_tokens[k] += s.tokens
    return [Batch(bounds[i], bounds[i + 1], tokens[i], done_tokens[i], verify[i], completed[i])
            for i in range(n)]
