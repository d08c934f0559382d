"""The stream server's command line: `python -m specdecode_tune.testing.streamserver`."""

from __future__ import annotations

import argparse

from aiohttp import web

from .app import FAIL_MODES, StreamConfig, make_app


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="A tiny SSE stream server for the load generator's tests and benchmark.")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--chunk-delay", type=float, default=0.0)
    ap.add_argument("--first-delay", type=float, default=None)
    ap.add_argument("--burst", type=int, default=1)
    ap.add_argument("--no-continuous-usage", action="store_true")
    ap.add_argument("--no-spec", action="store_true")
    ap.add_argument("--fail-every", type=int, default=0)
    ap.add_argument("--fail-mode", choices=FAIL_MODES, default="none")
    ap.add_argument("--fail-after-chunks", type=int, default=2)
    a = ap.parse_args(argv)
    cfg = StreamConfig(
        tokens_per_chunk=a.tokens_per_chunk,
        chunk_delay=a.chunk_delay,
        first_delay=a.first_delay,
        burst=a.burst,
        continuous_usage=not a.no_continuous_usage,
        spec=not a.no_spec,
        fail_every=a.fail_every,
        fail_mode=a.fail_mode,
        fail_after_chunks=a.fail_after_chunks,
    )
    web.run_app(
        make_app(cfg), host="127.0.0.1", port=a.port, print=None, access_log=None,
        shutdown_timeout=0.5, backlog=1024,
    )
    return 0
