"""The trial's own reads of a running server: its facts, its load, its counters.

Every GET a backend makes of a server besides the measured requests (`/server_info`,
`/get_load`, `/metrics`, `/v1/models`, `/props`) goes through here, on loopback and never
through an HTTP proxy from the environment, with the headers the trial gives it: the
experiment's API key (`trial_steps.api_headers`), which SGLang wants on every path but `/health*`
and `/metrics*`, vLLM on every `/v1/*` path, llama-server on every path but its health and
model list.

A 401 or 403 answer means the key did not reach the server or was refused: `KeyRefused`
(errors.py), which no caller's `except OSError` swallows, since every fact and counter read
after it would be missing too. Any other failure is the caller's, who marks what it could not
read (`unread` words it) instead of leaving a silent None.
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from ..errors import KeyRefused

# Servers are on loopback: never send their requests through an HTTP(S)_PROXY from the env.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# What a server answers to a request without the key it wants, or with another one.
AUTH_CODES = (401, 403)


def get_bytes(url: str, timeout_s: float, headers: Mapping[str, str] | None = None) -> bytes:
    """The body of GET `url`; KeyRefused on 401/403, the usual urllib/OSError otherwise."""
    req = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            return bytes(resp.read())
    except urllib.error.HTTPError as e:
        with e:
            if e.code in AUTH_CODES:
                raise KeyRefused(urllib.parse.urlsplit(url).path or "/", e.code,
                                 bool(headers and "Authorization" in headers)) from None
            raise


def get_json(url: str, timeout_s: float, headers: Mapping[str, str] | None = None) -> Any:
    return json.loads(get_bytes(url, timeout_s, headers))


def get_text(url: str, timeout_s: float, headers: Mapping[str, str] | None = None) -> str:
    return get_bytes(url, timeout_s, headers).decode("utf-8", errors="replace")


# What a failed read raises, short of KeyRefused: the callers catch these and mark the fact.
READ_ERRORS = (OSError, ValueError, http.client.HTTPException)


def unread(path: str, error: BaseException) -> str:
    """One line saying why GET `path` gave nothing: 'GET /server_info: http 404 Not Found',
    'GET /props: connection refused', 'GET /metrics: not JSON'."""
    if isinstance(error, urllib.error.HTTPError):
        why = f"http {error.code} {error.reason}".strip()
    elif isinstance(error, urllib.error.URLError):
        reason = error.reason
        why = ("timed out" if isinstance(reason, (TimeoutError, socket.timeout))
               else getattr(reason, "strerror", None) or str(reason))
    elif isinstance(error, (TimeoutError, socket.timeout)):
        why = "timed out"
    elif isinstance(error, json.JSONDecodeError):
        why = "not JSON"
    else:
        why = getattr(error, "strerror", None) or str(error) or type(error).__name__
    return f"GET {path}: {why}"[:300]
