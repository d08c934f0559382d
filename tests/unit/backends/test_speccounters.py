"""Acceptance over a window from speculative counters (vLLM's names, llama.cpp's copy)."""

from __future__ import annotations

import pytest
from conftest import pick_free_port

from specdecode_tune.backends import get_backend
from specdecode_tune.backends import prometheus as promtext
from specdecode_tune.backends.speccounters import (
    exactly_accepted,
    in_flight,
    per_position,
    snapshot,
    window,
)
from specdecode_tune.trial import drain

P = "vllm:"


def snap(drafts: float, accepted: float, per_pos: tuple[float, ...] = (),
         prefix: str = P) -> dict[str, float]:
    s = {f"{prefix}spec_decode_num_drafts_total": drafts,
         f"{prefix}spec_decode_num_draft_tokens_total": drafts * 4,
         f"{prefix}spec_decode_num_accepted_tokens_total": accepted}
    for i, v in enumerate(per_pos):
        s[f'{prefix}spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}'] = v
    return s


def test_acceptance_length_is_one_plus_accepted_per_draft_over_the_window() -> None:
    before = snap(100, 150, (80, 50, 20, 0))
    after = snap(160, 330, (140, 110, 70, 10))
    length, hist = window(before, after, P)
    assert length == pytest.approx(1 + 180 / 60)
    # per position (60, 60, 50, 10) over 60 verify steps: SGLang's form, exactly j accepted
    assert hist == (0, 0, 10, 40, 10)
    assert sum(hist) == 60                                   # the verify steps
    assert sum(j * n for j, n in enumerate(hist)) == 180     # the accepted tokens
    assert per_position(hist) == (60, 60, 50, 10)


def test_exactly_accepted_and_per_position_are_inverse_and_clip_torn_reads() -> None:
    assert exactly_accepted(10, (9, 8, 8)) == (1, 1, 0, 8)
    assert per_position((1, 1, 0, 8)) == (9, 8, 8)
    assert exactly_accepted(10, ()) == ()
    # A later position read above an earlier one (a step added between two reads): capped.
    assert exactly_accepted(10, (7, 9)) == (3, 0, 7)
    assert exactly_accepted(5, (7,)) == (0, 5)


def test_counters_that_appear_during_the_window_count_from_zero() -> None:
    # vLLM creates the per-position series lazily: absent before = 0
    length, hist = window({}, snap(10, 25, (9, 8, 8)), P)
    assert length == pytest.approx(3.5)
    assert hist == (1, 1, 0, 8)


@pytest.mark.parametrize("before,after", [
    (None, snap(1, 1)),
    (snap(1, 1), None),
    ({}, {}),                                     # no speculation: no counters at all
    (snap(10, 5), snap(10, 5)),                   # nothing verified in the window
    (snap(10, 5), snap(4, 2)),                    # counters went down: a restart
    (snap(10, 5, (3,)), snap(12, 9, (2,))),       # a per-position counter went down
])
def test_windows_that_cannot_say_give_none(before: dict | None, after: dict | None) -> None:
    assert window(before, after, P) == (None, ())


def test_snapshot_sums_over_engines_keeps_positions_and_drops_buckets() -> None:
    text = ('vllm:spec_decode_num_drafts_total{engine="0"} 5\n'
            'vllm:spec_decode_num_drafts_total{engine="1"} 7\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 3\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",position="1"} 4\n'
            'vllm:ttft_seconds_bucket{le="0.1"} 9\n'
            'other:thing 1\n')
    assert snapshot(promtext.parse(text), P) == {
        "vllm:spec_decode_num_drafts_total": 12.0,
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1"}': 7.0,
    }


def test_backends_use_their_own_prefix() -> None:
    lc = get_backend("llamacpp")
    before, after = snap(0, 0, prefix="llamacpp:"), snap(8, 20, (8, 7, 5), prefix="llamacpp:")
    assert lc.window_acceptance(before, after) == (pytest.approx(3.5), (0, 1, 2, 5))
    assert get_backend("vllm").window_acceptance(before, after) == (None, ())
    # SGLang's acceptance comes per request: no window from counters
    assert get_backend("sglang").window_acceptance(before, after) == (None, ())
    assert get_backend("sim").metrics_snapshot("http://127.0.0.1:9") is None


def test_drain_waits_until_the_server_is_idle_and_no_longer() -> None:
    seen = iter([3, 2, 0, 5])
    calls: list[int] = []

    def busy() -> int:
        calls.append(1)
        return next(seen)
    left, waited = drain(busy, 5.0)
    assert (left, len(calls)) == (0, 3)
    assert waited < 1.0


def test_drain_gives_up_at_its_limit_and_says_how_many_are_left() -> None:
    left, waited = drain(lambda: 2, 0.1)
    assert left == 2 and 0.1 <= waited < 1.0


def test_drain_does_not_wait_where_the_server_cannot_tell() -> None:
    assert drain(lambda: None, 5.0)[0] == 0


def test_in_flight_is_none_without_a_metrics_endpoint() -> None:
    assert in_flight(f"http://127.0.0.1:{pick_free_port()}", ("x",), timeout_s=1.0) is None
