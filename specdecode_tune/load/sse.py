"""An incremental Server-Sent-Events parser, one for every server's stream.

It takes the response body's bytes split anywhere and returns each event's data payload as
bytes (UTF-8 as sent; JSON decodes it); see `SSEParser`.
"""

from __future__ import annotations

import re

_LINE_END = re.compile(rb"\r\n|\r|\n")


class SSEError(Exception):
    """A stream broke the SSE framing badly enough to stop reading it (an oversized event)."""


class SSEParser:
    """Incremental parser of a `text/event-stream` body (WHATWG HTML, "server-sent events").

    `feed(data)` accepts any slice of the byte stream and returns the data payloads of the events
    completed by it. Lines end in CRLF, LF or CR (a CR at the end of one slice and an LF at the
    start of the next are one line end). Comment lines (``:...``) are skipped; ``data`` lines of
    one event are joined with ``\\n``; an event is dispatched on a blank line when it had at least
    one ``data`` line; other fields (``event``, ``id``, ``retry``) are ignored since no LLM server
    uses them for content. An unterminated event at end of stream is dropped, as the spec says.

    The returned list is reused: it is valid until the next `feed` call. That saves a list per
    chunk on the hot path; callers iterate it at once.
    """

    __slots__ = ("_buf", "_data", "_data_size", "_skip_lf", "_events", "_max_event")

    def __init__(self, max_event_bytes: int = 64 * 1024 * 1024) -> None:
        self._buf = b""                     # the incomplete last line
        self._data: list[bytes] | None = None   # data lines of the event being read
        self._data_size = 0
        self._skip_lf = False               # the previous slice ended in CR
        self._events: list[bytes] = []
        self._max_event = max_event_bytes   # bounds memory against a stream with no line ends

    def feed(self, data: bytes) -> list[bytes]:
        events = self._events
        events.clear()
        if self._skip_lf:
            self._skip_lf = False
            if data[:1] == b"\n":
                data = data[1:]
        if self._buf:
            data = self._buf + data
            self._buf = b""
        # Fast path: the usual slice is exactly one single-line event, "data: {...}\n\n".
        if (
            self._data is None
            and data.startswith(b"data: ")
            and data.endswith(b"\n\n")
            and data.count(b"\n") == 2
            and b"\r" not in data
        ):
            events.append(data[6:-2])
            return events
        if b"\r" in data:
            lines = _LINE_END.split(data)
            # A trailing CR ends its line now; an LF starting the next slice belongs to it.
            self._skip_lf = data.endswith(b"\r")
        else:
            lines = data.split(b"\n")
        self._buf = lines.pop()
        for line in lines:
            if not line:
                if self._data is not None:
                    d = self._data
                    events.append(d[0] if len(d) == 1 else b"\n".join(d))
                    self._data = None
                    self._data_size = 0
                continue
            if line[0] == 0x3A:  # ":" starts a comment (keep-alives)
                continue
            colon = line.find(b":")
            if colon < 0:
                name, value = line, b""
            else:
                name, value = line[:colon], line[colon + 1 :]
                if value[:1] == b" ":
                    value = value[1:]
            if name == b"data":
                if self._data is None:
                    self._data = [value]
                else:
                    self._data.append(value)
                self._data_size += len(value)
        if len(self._buf) + self._data_size > self._max_event:
            raise SSEError(f"event larger than {self._max_event} bytes")
        return events
