"""A server's log with secrets blanked out before they reach the file.

SGLang takes its API key only as `--api-key` on its command line and logs its whole
`server_args=ServerArgs(... api_key='...')` at start-up (0.5.10: `entrypoints/engine.py`). So a
server started with a key writes into a pipe, and this copier writes the log file with each
secret replaced by `***`. A secret split across two reads is still caught: the last
`len(secret) - 1` bytes of a read wait for the next one.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import BinaryIO

MASK = b"***"
_READ = 64 * 1024


def redact(data: bytes, secrets: Sequence[bytes]) -> bytes:
    for s in secrets:
        data = data.replace(s, MASK)
    return data


class RedactingCopier:
    """Copies from a pipe's read end to `out`, secrets masked, until the writers close it."""

    def __init__(self, read_fd: int, out: BinaryIO, secrets: Sequence[str]) -> None:
        self._fd = read_fd
        self._out = out
        self._secrets = sorted({s.encode() for s in secrets if s}, key=len, reverse=True)
        self._keep = max((len(s) for s in self._secrets), default=1) - 1
        self._thread = threading.Thread(target=self._run, name="server-log", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pending = b""
        try:
            while True:
                chunk = os.read(self._fd, _READ)
                if not chunk:
                    break
                data = redact(pending + chunk, self._secrets)
                cut = len(data) - self._keep if self._keep else len(data)
                # Hold back a tail that may be the start of a secret (never inside the mask).
                cut = max(cut, 0)
                self._out.write(data[:cut])
                self._out.flush()
                pending = data[cut:]
            self._out.write(redact(pending, self._secrets))
            self._out.flush()
        finally:
            os.close(self._fd)
            self._out.close()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
