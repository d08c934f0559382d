"""Token counts from the server's own tokenizer, for a ShareGPT sample's lengths.

Where the backend declares a tokenize endpoint (a backend's `tokenize`: llama-server's and vLLM's
`/tokenize`, `backends/tokenize_endpoint.py`), the trial asks it, once after boot, for the token
count of each sampled prompt and reply; the levels then ask each request for its reply's length
as the server counts it, and the sample's length filters are applied again to those counts.
Where the backend has none (SGLang, the simulator) the sample's own counts stand (the model's local
tokenizer, or the stated approximation; `config.sharegpt`).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from ..backends.tokenize_endpoint import TokenizeEndpoint

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def server_lengths(base_url: str, endpoint: TokenizeEndpoint, sample: Any,
                   headers: Mapping[str, str] | None = None,
                   timeout_s: float = 30.0) -> dict[str, tuple[int, int]] | None:
    """{prompt id: (prompt tokens, reply tokens)} as the server counts them, for the prompts
    of a `config.sharegpt.Sample` that still pass its filters; None when the endpoint does not
    answer (the sample's counts then stand)."""
    out: dict[str, tuple[int, int]] = {}
    for p in sample.prompts:
        n_in = _count(base_url, endpoint, p.text, headers, timeout_s)
        n_out = _count(base_url, endpoint, p.reply, headers, timeout_s)
        if n_in is None or n_out is None:
            return None
        f = sample.filters
        if n_in < f[0] or n_out < f[0] or n_in > f[1] or n_in + n_out > f[2]:
            continue
        out[p.id] = (n_in, n_out)
    return out or None


def _count(base_url: str, endpoint: TokenizeEndpoint, text: str,
           headers: Mapping[str, str] | None, timeout_s: float) -> int | None:
    req = urllib.request.Request(
        base_url.rstrip("/") + endpoint.path, data=json.dumps(endpoint.body(text)).encode(),
        headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            return endpoint.count(json.loads(resp.read()))
    except (OSError, ValueError, urllib.error.URLError):
        return None
