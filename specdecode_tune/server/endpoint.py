"""Where a server listens and whether it answers: a free port, the base URL, a health probe.

Probes go to loopback and never through an HTTP proxy from the environment.
"""

from __future__ import annotations

import http.client
import socket
import urllib.error
import urllib.request


def pick_free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on `host` a moment ago (bound to 0, then released).

    Another process may take it before the server binds; the server then fails to bind and the
    start is reported as a crash, which a retry of the trial resolves.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def base_url(host: str, port: int) -> str:
    """The URL of a server bound to `host`:`port` (a wildcard bind is reached on loopback)."""
    return f"http://{_url_host(host)}:{port}"


def _url_host(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_status(url: str, timeout_s: float) -> int | None:
    """The status of GET `url`, or None when nothing answered."""
    try:
        with _OPENER.open(url, timeout=timeout_s) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        e.close()
        return int(e.code)
    except (urllib.error.URLError, OSError, http.client.HTTPException):
        return None
