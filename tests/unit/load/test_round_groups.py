"""The interval over batches of rounds (load/rounds.py `groups`): a round its own batch below
2 x GROUPS rounds, GROUPS batches of consecutive rounds from then on; the figure is the same
ratio of sums either way, the interval widens where rounds are correlated."""

from __future__ import annotations

import random

from specdecode_tune.load.rounds import GROUPS, Batch, groups, known


def _rounds(values: list[float], seconds: float = 0.5) -> list[Batch]:
    out, t = [], 0.0
    for v in values:
        out.append(Batch(t, t + seconds, v * seconds, 0.0, 0, 16))
        t += seconds
    return out


def test_rounds_are_their_own_batches_below_twice_the_groups_then_groups_of_them() -> None:
    bs = _rounds([1.0] * 19)
    assert [len(g) for g in groups(bs)] == [1] * 19
    bs = _rounds([1.0] * 33)
    sizes = [len(g) for g in groups(bs)]
    assert len(sizes) == GROUPS == 10 and sum(sizes) == 33
    assert sizes == [4, 4, 4] + [3] * 7          # the earlier ones the larger
    flat = [b for g in groups(bs) for b in g]
    assert flat == bs                            # consecutive, nothing dropped or repeated


def test_correlated_rounds_get_a_wider_interval_and_the_same_figure() -> None:
    """An AR(1) wander (phi 0.9) of the server's speed over 40 rounds: neighbouring rounds
    agree, so the interval over rounds is too narrow; over 10 batches of 4 it is wider."""
    rng = random.Random(3)
    x, vals = 0.0, []
    for _ in range(40):
        x = 0.9 * x + rng.gauss(0.0, 0.02)
        vals.append(1000.0 * (1.0 + x))
    bs = _rounds(vals)
    per_round = known(bs, n_groups=1 << 30)
    grouped = known(bs)
    assert per_round is not None and grouped is not None
    assert per_round.warmup == grouped.warmup
    assert abs(per_round.tok_s.value - grouped.tok_s.value) < 1e-9
    assert grouped.tok_s.rel_half > 1.5 * per_round.tok_s.rel_half


def test_independent_rounds_keep_an_interval_of_about_the_same_width() -> None:
    rng = random.Random(5)
    bs = _rounds([1000.0 * (1.0 + rng.gauss(0.0, 0.03)) for _ in range(60)])
    per_round = known(bs, n_groups=1 << 30)
    grouped = known(bs)
    assert per_round is not None and grouped is not None
    ratio = grouped.tok_s.rel_half / per_round.tok_s.rel_half
    assert 0.6 < ratio < 1.6, ratio
