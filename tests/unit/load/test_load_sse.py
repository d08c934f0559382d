"""The SSE parser: framing cases, and properties over arbitrary bytes split arbitrarily."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdecode_tune.load import SSEError, SSEParser


def reference_events(stream: bytes) -> list[bytes]:
    """The WHATWG algorithm run over the whole stream at once (data payloads only)."""
    lines = re.split(rb"\r\n|\r|\n", stream)
    lines.pop()   # the unterminated tail is not a line yet
    events: list[bytes] = []
    data: list[bytes] | None = None
    for line in lines:
        if line == b"":
            if data is not None:
                events.append(b"\n".join(data))
            data = None
        elif line.startswith(b":"):
            continue
        else:
            name, sep, value = line.partition(b":")
            if sep and value.startswith(b" "):
                value = value[1:]
            if name == b"data":
                data = [*(data or []), value]
    return events


def feed_all(parts: list[bytes], parser: SSEParser | None = None) -> list[bytes]:
    p = parser or SSEParser()
    out: list[bytes] = []
    for part in parts:
        out.extend(p.feed(part))
    return out


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(max(c, 0), len(data)) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


# --- framing cases ------------------------------------------------------------------------------


def test_single_events_and_done() -> None:
    stream = b'data: {"a": 1}\n\ndata: {"a": 2}\n\ndata: [DONE]\n\n'
    assert feed_all([stream]) == [b'{"a": 1}', b'{"a": 2}', b"[DONE]"]


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_line_endings(eol: bytes) -> None:
    stream = b"data: x" + eol + eol + b"data: y" + eol + eol
    assert feed_all([stream]) == [b"x", b"y"]
    # the same stream one byte at a time: a CR and its LF in different slices is one line end
    assert feed_all([bytes([b]) for b in stream]) == [b"x", b"y"]


def test_crlf_split_between_cr_and_lf_is_one_line_end() -> None:
    stream = b"data: a\r\ndata: b\r\n\r\n"
    cut = stream.index(b"\r") + 1
    assert feed_all([stream[:cut], stream[cut:]]) == [b"a\nb"]


def test_multiline_data_comments_and_other_fields() -> None:
    stream = (
        b": keep-alive\n\n"
        b"event: message\nid: 7\nretry: 100\ndata: line1\ndata:line2\ndata\n\n"
        b":only a comment\n\n"
    )
    assert feed_all([stream]) == [b"line1\nline2\n"]


def test_event_without_data_is_not_dispatched_and_empty_data_is() -> None:
    assert feed_all([b"event: ping\n\n"]) == []
    assert feed_all([b"data:\n\n"]) == [b""]


def test_only_one_leading_space_is_stripped() -> None:
    assert feed_all([b"data:  two\n\n"]) == [b" two"]


def test_unterminated_event_waits_for_its_blank_line() -> None:
    p = SSEParser()
    assert p.feed(b"data: par") == []
    assert p.feed(b"tial\n") == []
    assert p.feed(b"\n") == [b"partial"]


def test_event_split_inside_multibyte_character() -> None:
    payload = '{"text": "héllo ✓"}'.encode()
    stream = b"data: " + payload + b"\n\n"
    cut = stream.index("✓".encode()) + 1
    assert feed_all([stream[:cut], stream[cut:]]) == [payload]


def test_returned_list_is_reused_between_feeds() -> None:
    p = SSEParser()
    first = p.feed(b"data: a\n\n")
    assert first == [b"a"]
    p.feed(b"data: b\n\n")
    assert first == [b"b"]   # documented: valid until the next feed


def test_oversized_event_is_an_error_not_unbounded_memory() -> None:
    p = SSEParser(max_event_bytes=1000)
    with pytest.raises(SSEError):
        for _ in range(20):
            p.feed(b"x" * 100)


# --- properties ---------------------------------------------------------------------------------

SSE_PIECES = [
    b"data: ", b"data:", b"data", b":", b": c", b"\r", b"\n", b"\r\n", b"\n\n", b'{"a":1}',
    b"[DONE]", b"event: e", b"id: 1", b" ", b"x", b"\xff\xfe", "é".encode(), b"\x00",
]
sse_like = st.lists(st.sampled_from(SSE_PIECES), max_size=60).map(b"".join)
cuts = st.lists(st.integers(min_value=0, max_value=400), max_size=12)


@settings(max_examples=400, deadline=None)
@given(stream=sse_like, cut_points=cuts)
def test_split_anywhere_gives_the_reference_events(stream: bytes, cut_points: list[int]) -> None:
    expected = reference_events(stream)
    assert feed_all(split_at(stream, cut_points)) == expected
    assert feed_all([stream[i : i + 1] for i in range(len(stream))]) == expected   # every cut


@settings(max_examples=300, deadline=None)
@given(stream=st.binary(max_size=400), cut_points=cuts)
def test_arbitrary_bytes_never_crash_and_split_does_not_matter(
    stream: bytes, cut_points: list[int]
) -> None:
    whole = feed_all([stream])
    assert feed_all(split_at(stream, cut_points)) == whole == reference_events(stream)


@settings(max_examples=100, deadline=None)
@given(payloads=st.lists(st.binary(max_size=50).filter(lambda b: b"\n" not in b and b"\r" not in b),
                         max_size=10),
       cut_points=cuts)
def test_payloads_round_trip(payloads: list[bytes], cut_points: list[int]) -> None:
    stream = b"".join(b"data: " + p + b"\n\n" for p in payloads)
    expected = [p for p in payloads]
    assert feed_all(split_at(stream, cut_points)) == expected
