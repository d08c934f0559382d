"""A level's tally: its requests' states -> `RequestRecord`s, and the output tokens in its window.

How output tokens are counted. Throughput is the number of tokens whose chunk ARRIVED inside
the measurement window ``[warmup end, window end]``, divided by the window's length: requests
that started in the warm-up or are cut at the end contribute exactly their in-window tokens,
so ramp-up and ramp-down do not bias the figure. Per chunk, the token count comes from a
cumulative counter where the API has one (`/generate`'s ``meta_info.completion_tokens``; the
OpenAI APIs' per-chunk ``usage`` when the server honours ``continuous_usage_stats``, which
SGLang and vLLM do). Otherwise each chunk with non-empty text counts 1, and the final ``usage``
corrects it: the request's in-window count is scaled by ``usage.completion_tokens / chunks``
(speculative decoding puts several tokens in one chunk, so 1 per chunk would undercount by the
acceptance length). A request cut at the window end has no final usage; it is scaled by the
level's ratio of reported to counted tokens over the requests that had one.

A record's speculative counters come from the request's last kept metadata, under the keys
its engine declares (`backends.streamformat.StreamFormat`); its times are relative to the
level's start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..backends import ANY_ENGINE_STREAM
from ..backends.streamformat import StreamFormat
from ..records import RequestRecord
from .plan import is_int
from .workload import Prompt


class RequestState:
    """Mutable state of one request, written once when the request ends (or is cancelled)."""

    __slots__ = (
        "index", "prompt", "start", "end", "times", "sizes", "counted", "in_win", "inexact",
        "meta", "error", "error_detail", "cancelled",
    )

    def __init__(self, index: int, prompt: Prompt) -> None:
        self.index = index
        self.prompt = prompt
        self.start = 0.0
        self.end: float | None = None
        self.times: list[float] = []      # arrival time of each chunk that carried tokens
        self.sizes: list[int] = []        # ... and its tokens (1 where counted per chunk)
        self.counted = 0                  # tokens counted chunk by chunk
        self.in_win = 0                   # ... of which arrived inside the window
        self.inexact = False              # some chunk was counted as 1 token, not by a counter
        self.meta: dict[str, Any] | None = None   # last meta_info / usage seen
        self.error: str | None = None
        self.error_detail: str | None = None    # the server's own words for it
        self.cancelled = False


def tally_level(
    reqs: Sequence[RequestState], level: int, t0: float, w0: float, window_end: float,
    stream: StreamFormat = ANY_ENGINE_STREAM,
) -> tuple[list[RequestRecord], int]:
    """Turn request states into records, and count the tokens that arrived in the window."""
    # Requests counted 1 per chunk with a final usage total give the ratio of reported to
    # counted tokens; it corrects those that never got their total (cut at the window end).
    reported = counted = 0
    for st in reqs:
        total = _final_total(st.meta)
        if st.inexact and total is not None and st.counted:
            reported += total
            counted += st.counted
    level_ratio = reported / counted if counted else 1.0

    records = []
    window_tokens = 0.0
    for st in reqs:
        meta = st.meta or {}
        total = _final_total(meta)
        if st.inexact:
            ratio = total / st.counted if total is not None and st.counted else level_ratio
            window_tokens += st.in_win * ratio
        else:
            ratio = 1.0
            window_tokens += st.in_win
        out = total if total is not None else round(st.counted * ratio)
        end = st.end if st.end is not None else window_end
        times = st.times
        prompt_tokens = meta.get("prompt_tokens")
        hist = next((meta[k] for k in stream.histogram if k in meta), None)
        records.append(
            RequestRecord(
                level=level,
                index=st.index,
                start=st.start - t0,
                end=end - t0,
                ttft=(times[0] - st.start) if times else None,
                input_tokens=prompt_tokens if is_int(prompt_tokens) else st.prompt.input_len,
                output_tokens=out,
                chunk_gaps=tuple(b - a for a, b in zip(times, times[1:])),
                verify_ct=_first_int(meta, stream.verify_ct),
                accepted_tokens=_first_int(meta, stream.accepted),
                draft_tokens=_first_int(meta, stream.drafted),
                accept_histogram=(
                    tuple(hist) if isinstance(hist, list) and all(is_int(h) for h in hist) else ()
                ),
                in_window=not st.cancelled and w0 <= end <= window_end,
                error=None if st.cancelled else st.error,
                error_detail=None if st.cancelled else st.error_detail,
                prompt_id=st.prompt.prompt_id,
            )
        )
    return records, round(window_tokens)


def finished_round_figures(st: RequestState, stream: StreamFormat = ANY_ENGINE_STREAM
                           ) -> tuple[float, int | None]:
    """A request that ended: (its output tokens, its verify steps or None). Tokens are the
    final count where the server gave one, else the chunks counted; a failed request brings
    what it streamed before failing (its time counts in its round as well)."""
    total = _final_total(st.meta)
    tokens = float(total if total is not None else st.counted)
    return tokens, (_first_int(st.meta, stream.verify_ct) if st.meta and st.error is None
                    else None)


def _final_total(meta: Mapping[str, Any] | None) -> int | None:
    if not meta:
        return None
    ct = meta.get("completion_tokens")
    return ct if is_int(ct) and ct >= 0 else None


def _first_int(meta: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    # Engines rename their counters across versions; take whichever name is present.
    for k in keys:
        v = meta.get(k)
        if is_int(v):
            return v
    return None
