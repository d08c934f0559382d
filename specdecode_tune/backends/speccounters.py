"""Speculative-decoding counters on `/metrics`, and the acceptance length over a window.

vLLM's counter names (vllm/v1/metrics/loggers.py), which llama.cpp's server copies under its own
prefix (`llamacpp:`):

    {prefix}spec_decode_num_drafts_total          verify steps that carried a draft
    {prefix}spec_decode_num_draft_tokens_total    draft tokens proposed
    {prefix}spec_decode_num_accepted_tokens_total draft tokens accepted
    {prefix}spec_decode_num_accepted_tokens_per_pos_total{position="i"}

The acceptance length of a window is 1 + delta(accepted) / delta(drafts): tokens emitted per
verify step, the bonus token included, which is what SGLang's `spec_accept_length` means too.
The window's histogram is given as SGLang gives its `spec_accept_histogram`, the one form a
level's `accept_histogram` has whatever the engine: index j = verify steps that accepted
exactly j drafted tokens (so its sum is delta(drafts) and sum(j * h[j]) is delta(accepted)).
The counters count per position instead (the drafts whose i-th token was accepted: a step
that accepted j tokens adds one at each position below j): `exactly_accepted` turns one form
into the other, `per_position` back.
A snapshot is taken before and after a measurement window; the deltas cover exactly the
requests the server worked on in between (warm-up excluded), unlike a lifetime average.

Steps in which the drafter proposed nothing (llama.cpp's n-gram drafter with no match, vLLM's
n-gram proposer likewise) are not verify steps of a draft and are not counted: the figure is
the acceptance of the drafts that were made.

A level ends by cutting the requests still streaming, and the server goes on with them for a
moment (until it sees the closed connection). The trial waits for `in_flight` to reach 0 before
it takes the "after" snapshot, so the steps of those requests count in their own level and
never in the next one's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from . import httpread, prometheus

DRAFTS = "spec_decode_num_drafts_total"
DRAFT_TOKENS = "spec_decode_num_draft_tokens_total"
ACCEPTED = "spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "spec_decode_num_accepted_tokens_per_pos_total"

def get_text(url: str, timeout_s: float, headers: Mapping[str, str] | None = None) -> str:
    """GET `url` on loopback, no proxy (KeyRefused on 401/403: `httpread`)."""
    return httpread.get_text(url, timeout_s, headers)


def snapshot(samples: list[prometheus.Sample], prefix: str) -> dict[str, float]:
    """The samples named `prefix...`, summed over their labels except `position`, keyed
    `name` or `name{position="i"}`. Histogram buckets are left out (not needed, and many)."""
    out: dict[str, float] = {}
    for s in samples:
        if not s.name.startswith(prefix) or s.name.endswith(("_bucket", "_created")):
            continue
        pos = s.label("position")
        key = s.name if pos is None else f'{s.name}{{position="{pos}"}}'
        out[key] = out.get(key, 0.0) + s.value
    return out


def read_samples(base_url: str, timeout_s: float = 5.0,
                 headers: Mapping[str, str] | None = None) -> list[prometheus.Sample] | None:
    """The samples of `base_url/metrics`, or None when it cannot be read or parsed (a server
    that refuses the API key raises KeyRefused: llama-server wants it on /metrics)."""
    try:
        return prometheus.parse(get_text(base_url + "/metrics", timeout_s, headers))
    except httpread.READ_ERRORS:
        return None


def scrape(base_url: str, prefix: str, timeout_s: float = 5.0,
           headers: Mapping[str, str] | None = None) -> dict[str, float] | None:
    """A snapshot of `base_url/metrics`, or None when it cannot be read or parsed."""
    samples = read_samples(base_url, timeout_s, headers)
    return None if samples is None else snapshot(samples, prefix)


def window(before: Mapping[str, float] | None, after: Mapping[str, float] | None,
           prefix: str) -> tuple[float | None, tuple[int, ...]]:
    """(acceptance length, verify steps per number of accepted tokens) between two snapshots.

    (None, ()) when a snapshot is missing, the counters are absent (no speculation), no draft
    was verified in the window, or a counter went down (the server restarted)."""
    if before is None or after is None:
        return None, ()
    drafts, accepted = prefix + DRAFTS, prefix + ACCEPTED
    if drafts not in after or accepted not in after:
        return None, ()
    d_drafts = after[drafts] - before.get(drafts, 0.0)
    d_accepted = after[accepted] - before.get(accepted, 0.0)
    if d_drafts <= 0 or d_accepted < 0:
        return None, ()
    per_pos: dict[int, int] = {}
    head = prefix + ACCEPTED_PER_POS + '{position="'
    for key, value in after.items():
        if key.startswith(head) and key.endswith('"}'):
            try:
                pos = int(key[len(head):-2])
            except ValueError:
                continue
            delta = value - before.get(key, 0.0)
            if delta < 0:
                return None, ()
            per_pos[pos] = round(delta)
    counts = tuple(per_pos.get(i, 0) for i in range(max(per_pos) + 1)) if per_pos else ()
    return 1.0 + d_accepted / d_drafts, exactly_accepted(round(d_drafts), counts)


def exactly_accepted(drafts: int, per_pos: Sequence[int]) -> tuple[int, ...]:
    """Verify steps that accepted exactly j tokens (j = 0..len(per_pos)), from the number of
    verify steps and the per-position accepted counts. A count above the one before it (the
    counters were read while a step was being added) is taken as equal to it. () where there
    are no per-position counts."""
    if not per_pos:
        return ()
    at_least = [max(0, int(drafts))]
    for c in per_pos:
        at_least.append(min(max(0, int(c)), at_least[-1]))
    return tuple(a - b for a, b in zip(at_least, [*at_least[1:], 0]))


def exactly_from_length(per_pos: Sequence[int], accept_length: float | None
                        ) -> tuple[int, ...]:
    """`exactly_accepted` where the number of verify steps is known only through the
    acceptance length (1 + accepted / steps): a level stored before levels carried SGLang's
    form (recorded landscapes of format 1 from vLLM and llama.cpp)."""
    accepted = sum(int(c) for c in per_pos)
    if not per_pos:
        return ()
    steps = round(accepted / (accept_length - 1.0)) if accept_length and accept_length > 1.0 \
        else max(int(c) for c in per_pos)
    return exactly_accepted(steps, per_pos)


def per_position(exact: Sequence[int]) -> tuple[int, ...]:
    """The per-position accepted counts of an exactly-j histogram (the inverse of
    `exactly_accepted` for consistent counts): position i counts the steps that accepted more
    than i tokens."""
    return tuple(sum(exact[i + 1:]) for i in range(len(exact) - 1))


def in_flight(base_url: str, gauges: Sequence[str], timeout_s: float = 5.0,
              headers: Mapping[str, str] | None = None) -> int | None:
    """The requests the server is running or queueing now: the sum of its `gauges` on
    /metrics, or None when /metrics cannot be read or has none of them."""
    samples = read_samples(base_url, timeout_s, headers)
    if samples is None:
        return None
    wanted = set(gauges)
    values = [s.value for s in samples if s.name in wanted]
    return round(sum(values)) if values else None
