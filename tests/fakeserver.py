"""A tiny stand-in server for the server-lifecycle tests (stdlib only, starts in ~50 ms).

    python tests/fakeserver.py --port 8123 [--healthy-after 0.5] [--bind-delay 0.2]
        [--log "torch.OutOfMemoryError: CUDA out of memory."] [--exit-code 1 --exit-after 0.1]
        [--ignore-sigterm] [--grandchild PIDFILE] [--hang] [--mute] [--print-env NAME]

It answers GET /health with 503 until `--healthy-after` seconds after start, then 200. It can
exit with a code after printing log lines (a failed boot), never bind (a hang), bind but never
answer (a hang that keeps the socket), ignore SIGTERM
(so only SIGKILL ends it), and spawn a grandchild in its process group (as SGLang spawns its
schedulers) whose pid it writes to a file. Every mode ends by itself after `--max-life` seconds,
so a broken test cannot leave it running for long. Unknown flags exit 2 through argparse, which
is the real "invalid arguments" path.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

T0 = time.monotonic()


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser(prog="fakeserver")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--bind-delay", type=float, default=0.0, help="seconds before binding")
    ap.add_argument("--healthy-after", type=float, default=0.0,
                    help="seconds after start before /health answers 200 (503 before)")
    ap.add_argument("--log", action="append", default=[], help="a line to print to stderr")
    ap.add_argument("--exit-code", type=int, default=None, help="exit with this code")
    ap.add_argument("--exit-after", type=float, default=0.0)
    ap.add_argument("--ignore-sigterm", action="store_true")
    ap.add_argument("--grandchild", default=None, help="spawn a grandchild, write its pid here")
    ap.add_argument("--grandchild-ignore-sigterm", action="store_true")
    ap.add_argument("--hang", action="store_true", help="stay alive, never bind")
    ap.add_argument("--mute", action="store_true",
                    help="bind and listen but never answer (connections hang)")
    ap.add_argument("--print-env", action="append", default=[])
    ap.add_argument("--max-life", type=float, default=120.0)
    args = ap.parse_args()

    print(f"fakeserver pid={os.getpid()} pgid={os.getpgrp()}", flush=True)
    for name in args.print_env:
        print(f"env {name}={os.environ.get(name, '<unset>')}", flush=True)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.grandchild:
        ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
            if args.grandchild_ignore_sigterm else ""
        child = subprocess.Popen(
            [sys.executable, "-c",
             f"import signal, time; {ignore}time.sleep({args.max_life})"])
        _write_atomic(args.grandchild, str(child.pid))
        print(f"grandchild pid={child.pid}", flush=True)
    for line in args.log:
        print(line, file=sys.stderr, flush=True)

    if args.exit_code is not None:
        time.sleep(args.exit_after)
        return args.exit_code
    if args.hang:
        time.sleep(args.max_life)
        return 0

    time.sleep(args.bind_delay)
    if args.mute:
        import socket
        sock = socket.create_server((args.host, args.port), backlog=64)
        print(f"listening (mute) on {args.host}:{args.port}", flush=True)
        time.sleep(args.max_life)
        sock.close()
        return 0

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                ready = time.monotonic() - T0 >= args.healthy_after
                code, body = (200, b"ok") if ready else (503, b"starting")
            else:
                code, body = 404, b"not found"
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *a: object) -> None:
            pass   # one line per health probe would drown the log the tests read

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"listening on {args.host}:{args.port}", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    time.sleep(max(0.0, args.max_life - (time.monotonic() - T0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
