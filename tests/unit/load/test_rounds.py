"""load.rounds: batches between round completions, MSER's warm-up, the ratio interval and the
sequential stop, on streams whose figures are known."""

from __future__ import annotations

import math
import random

import pytest

from specdecode_tune.load.rounds import Batch, Stream, batches, known, mser, ratio, t975


def test_t_quantiles_are_students() -> None:
    assert t975(1) == pytest.approx(12.706)
    assert t975(4) == pytest.approx(2.776)
    assert t975(30) == pytest.approx(2.042)
    assert t975(200) == pytest.approx(1.96)
    assert math.isinf(t975(0))


def test_ratio_interval_is_the_delta_method_one() -> None:
    # Equal denominators: the interval is the t interval of the batch means x / y.
    r = ratio([10.0, 12.0, 11.0, 9.0], [1.0, 1.0, 1.0, 1.0])
    assert r is not None and r.value == pytest.approx(10.5)
    sd = math.sqrt(sum((x - 10.5) ** 2 for x in (10, 12, 11, 9)) / 3)
    assert r.rel_half == pytest.approx(t975(3) * sd / 2 / 10.5)
    # One batch: a value, no interval; none: nothing.
    one = ratio([5.0], [2.0])
    assert one is not None and one.value == 2.5 and one.rel_half is None
    assert ratio([], []) is None
    # Batches of unequal length with the same rate: the ratio is exact, the interval zero.
    same = ratio([100.0, 300.0, 50.0], [1.0, 3.0, 0.5])
    assert same is not None and same.value == pytest.approx(100.0)
    assert same.rel_half == pytest.approx(0.0, abs=1e-12)


def test_mser_drops_a_transient_and_keeps_a_stationary_run() -> None:
    rng = random.Random(1)
    steady = [100 + rng.gauss(0, 0.5) for _ in range(12)]
    series = [130.0, 115.0, *steady]
    d = mser(series)
    # The transient goes; MSER may also trim a few steady values (whatever lowers the kept
    # mean's standard error), never half of them.
    assert 2 <= d <= 7
    kept = series[d:]
    assert sum(kept) / len(kept) == pytest.approx(100.0, abs=0.5)
    assert mser([100.0, 100.2, 99.9, 100.1, 99.8, 100.0]) <= 1
    # Never more than it keeps, and two values are never cut to one.
    assert mser([130.0, 100.0]) == 0
    assert mser([130.0, 120.0, 100.0]) <= 1


def _lockstep(rounds: int, n: int, round_s: float, tokens: int, first_s: float = 0.0
              ) -> tuple[list[float], list[Stream]]:
    """n requests per round, each `tokens` tokens in 4 chunks spread over its round, all ending
    at the round's end; the first round lasts `first_s` longer (a start-up transient)."""
    streams, ends, t = [], [], 0.0
    for k in range(rounds):
        length = round_s + (first_s if k == 0 else 0.0)
        end = t + length
        for _ in range(n):
            times = [t + length * (i + 1) / 4 for i in range(4)]
            streams.append(Stream(times=times, sizes=[tokens / 4] * 4, end=end,
                                  completed=True, tokens=tokens, verify_ct=tokens // 4))
        ends.append(end)
        t = end
    return ends, streams


def test_batches_hold_each_rounds_tokens_and_completions() -> None:
    ends, streams = _lockstep(rounds=3, n=4, round_s=2.0, tokens=100)
    bs = batches([0.0, *ends], streams)
    assert [(b.start, b.end) for b in bs] == [(0.0, 2.0), (2.0, 4.0), (4.0, 6.0)]
    assert [b.tokens for b in bs] == [400.0] * 3
    assert [b.completed for b in bs] == [4] * 3
    assert [b.verify_ct for b in bs] == [100] * 3
    assert bs[0].tok_s == pytest.approx(200.0)


def test_known_leaves_out_a_slow_first_round_and_meets_the_target() -> None:
    ends, streams = _lockstep(rounds=6, n=4, round_s=2.0, tokens=100, first_s=1.0)
    k = known(batches([0.0, *ends], streams))
    assert k is not None
    assert k.warmup == 1 and k.kept == 5 and k.rounds == 6
    assert k.tok_s is not None and k.tok_s.value == pytest.approx(200.0)
    assert k.accept is not None and k.accept.value == pytest.approx(4.0)
    assert k.met(precision=0.02, min_rounds=3)
    assert not k.met(precision=0.02, min_rounds=6)
    # Kept rounds only: with the first round in, the figure would read low.
    everything = ratio([b.tokens for b in batches([0.0, *ends], streams)],
                       [b.seconds for b in batches([0.0, *ends], streams)])
    assert everything is not None and everything.value < 190


def test_the_stop_asks_the_law_kelton_margin_and_every_figure() -> None:
    # Rounds whose rate alternates +-2%: an interval about +-2.6% over four rounds.
    bs = [Batch(float(i), float(i + 1), 100.0 * (1.02 if i % 2 else 0.98), 100.0, 25, 4)
          for i in range(4)]
    k = known(bs)
    assert k is not None and k.tok_s is not None and k.tok_s.rel_half is not None
    assert k.warmup == 0
    assert not k.met(precision=k.tok_s.rel_half, min_rounds=2)   # g / (1 + g) < g
    assert k.met(precision=k.tok_s.rel_half * 1.1, min_rounds=2)
    # An acceptance known worse than the target keeps the level going.
    noisy = [Batch(b.start, b.end, 100.0, 100.0, 25 if i % 2 else 40, 4)
             for i, b in enumerate(bs)]
    k2 = known(noisy)
    assert k2 is not None and k2.accept is not None
    assert not k2.met(precision=0.05, min_rounds=2)
    # No verify steps (an engine that gives none per request): throughput alone decides.
    bare = [Batch(b.start, b.end, 100.0, 0.0, 0, 4) for b in bs]
    k3 = known(bare)
    assert k3 is not None and k3.accept is None and k3.met(precision=0.01, min_rounds=2)


def test_warmup_seconds_leave_out_the_rounds_inside_them() -> None:
    ends, streams = _lockstep(rounds=5, n=2, round_s=1.0, tokens=10)
    bs = batches([0.0, *ends], streams)
    k = known(bs, first=2)
    assert k is not None and k.warmup >= 2 and k.start == pytest.approx(2.0)
    assert known([], 0) is None


def test_a_slow_episode_after_the_start_is_kept_not_taken_for_a_warm_up() -> None:
    # A start-up of two slow rounds, then 40 rounds at 200 tok/s with a slow span (150 tok/s)
    # at rounds 12-21, as a real server's C=16 level showed (docs/gpu-runs.md): the start goes,
    # the slow span stays in the figure. MSER over the whole level would drop it all.
    rates = [80.0, 120.0] + [150.0 if 12 <= k < 22 else 200.0 for k in range(2, 42)]
    bs, t = [], 0.0
    for r in rates:
        bs.append(Batch(t, t + 1.0, r, r, int(r // 4), 16))
        t += 1.0
    assert mser([b.tok_s for b in bs]) > 10          # the whole-level MSER cut
    k = known(bs)
    assert k is not None and k.tok_s is not None
    assert k.warmup == 2
    steady = rates[2:]
    assert k.tok_s.value == pytest.approx(sum(steady) / len(steady))
