"""`python -m specdecode_tune.sim`: launch the simulated SGLang server.

Takes SGLang's launch flags (same spellings, `--api-key` included) plus `--profile NAME|PATH`,
`--boot-time SECONDS`, `--noise-seed N`, `--api-key-env NAME` (read the key from that
environment variable, so that it never shows in the process's command line), and fault
injection: `--fault SPEC` (repeatable) and `--fault-seed N`; see `faults.py` for the specs.
Behaves as SGLang at start-up: bad arguments exit 2 at once (argparse style); memory failures
("Not enough memory", "CUDA out of memory") exit 1 after part of the boot time, as SGLang fails
after loading weights. The port is bound at once and answers 503 until the boot time has
passed. SIGTERM or SIGINT stops it within a fraction of a second. All logs go to stderr.

`--check-args` parses and validates the other arguments exactly as a boot would (the parser,
the profile, the argument rules, the API-key variable) and starts nothing: it exits 0, or 2
with one line on stderr, `error: MESSAGE`, where MESSAGE is one of
    the simulator does not know the argument(s) ARGS
    the simulator refuses its arguments: WHY
    --api-key-env NAME: that environment variable is not set or empty
    WHY the profile cannot be loaded, in the profile reader's words
The search's pre-flight runs it (through the sim backend) and relies on these forms.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import signal
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

from aiohttp import web

from specdecode_tune.errors import ConfigError
from specdecode_tune.sim.arguments import EMULATED_VERSION, StartupError, normalize_params
from specdecode_tune.sim.faults import FaultInjector, parse_fault, parse_faults
from specdecode_tune.sim.profile import DEFAULT_PROFILE, Profile, load_profile
from specdecode_tune.sim.server import InjectedCrash, SimServer, make_app

log = logging.getLogger("specdecode_tune.sim")


CHECK_FLAG = "--check-args"


def build_parser(cls: type[argparse.ArgumentParser] = argparse.ArgumentParser
                 ) -> argparse.ArgumentParser:
    p = cls(
        prog="python -m specdecode_tune.sim",
        description="A simulated SGLang server (speculative decoding performance model; no GPU, "
                    "no model).",
    )
    p.add_argument("--model-path", "--model", dest="model_path", default=None,
                   help="reported model path (default: the profile's)")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", "--tp", dest="tp_size", type=int, default=None)
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--speculative-draft-model-path", default=None)
    p.add_argument("--speculative-num-steps", type=int, default=None)
    p.add_argument("--speculative-eagle-topk", type=int, default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--speculative-ngram-max-bfs-breadth", type=int, default=None,
                   help="NGRAM's tree breadth (its topk), as SGLang's")
    for flag in ("--speculative-ngram-min-bfs-breadth", "--speculative-ngram-max-trie-depth",
                 "--speculative-ngram-capacity"):
        p.add_argument(flag, type=int, default=None, help="accepted and ignored")
    p.add_argument("--speculative-ngram-match-type", choices=("BFS", "PROB"), default=None,
                   help="accepted and ignored")
    p.add_argument("--speculative-adaptive", action="store_true", default=None,
                   help="SGLang's adaptive mode (per-batch-size steps, topk 1); needs "
                        "--sglang-version >= 0.5.13, as SGLang (see sim/adaptive.py)")
    p.add_argument("--speculative-adaptive-config", default=None, metavar="PATH",
                   help="the adaptive mode's JSON: {\"BS\": {\"candidate_steps\": [S]}, ...}")
    p.add_argument("--sglang-version", default=EMULATED_VERSION,
                   help=f"the SGLang release to imitate where releases differ (default "
                        f"{EMULATED_VERSION}); the adaptive flags need >= 0.5.13")
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--cuda-graph-max-bs", type=int, default=None)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--incremental-streaming-output", action="store_true",
                   help="as SGLang's: each /generate chunk carries only its new text and ids")
    p.add_argument("--disable-radix-cache", action="store_true",
                   help="as SGLang's (the simulator caches no prefix either way); speculation "
                        "on a hybrid model's profile needs it, as in SGLang 0.5.10")
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument("--trust-remote-code", action="store_true", help="accepted and ignored")
    p.add_argument("--log-level", default="info", help="accepted and ignored")
    p.add_argument("--profile", default=DEFAULT_PROFILE,
                   help="simulator profile: bundled NAME or a TOML PATH")
    p.add_argument("--boot-time", type=float, default=None,
                   help="seconds to 'load' (default: the profile's)")
    p.add_argument("--noise-seed", type=int, default=None,
                   help="seed of the per-boot speed factor and step jitter (default: fresh each "
                        "boot)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' (as SGLang; shows in ps: "
                        "prefer --api-key-env)")
    p.add_argument("--api-key-env", default=None, metavar="NAME",
                   help="require the key held by environment variable NAME")
    p.add_argument("--fault", action="append", default=[], type=_fault_arg, metavar="SPEC",
                   help="inject a fault (repeatable): crash-at-start, oom-at-start, "
                        "crash-after:N, hang-after:N, slow-start:S, malformed-sse:P, "
                        "drop-midway:P, slowdown-after:S:F, optionally @NAME>=VALUE "
                        "(see specdecode_tune/sim/faults.py)")
    p.add_argument("--fault-seed", type=int, default=0, help="seed of the random fault choices")
    p.add_argument(CHECK_FLAG, action="store_true",
                   help="validate the arguments as a boot would and start nothing: exit 0, or 2 "
                        "with one line 'error: ...' on stderr")
    return p


def _fault_arg(text: str) -> str:
    try:
        parse_fault(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


# Flags of the simulator itself: not server args, never reported by /server_info.
_OWN_FLAGS = ("profile", "boot_time", "noise_seed", "log_level", "api_key", "api_key_env", "fault",
              "fault_seed", "check_args")


def server_args(ns: argparse.Namespace, model_path: str) -> dict[str, Any]:
    """The args as SGLang names them (what /server_info reports)."""
    args = {k: v for k, v in vars(ns).items() if k not in _OWN_FLAGS}
    args["model_path"] = ns.model_path or model_path
    args["tokenizer_path"] = args["model_path"]
    args["served_model_name"] = ns.served_model_name or args["model_path"]
    if args["random_seed"] is None:     # SGLang draws one when unset
        args["random_seed"] = random.SystemRandom().randrange(1 << 30)
    return args


async def serve(sim: SimServer, host: str, port: int) -> int:
    """Bind at once, boot, serve until SIGTERM/SIGINT; returns the exit code."""
    runner = web.AppRunner(make_app(sim), access_log=None, handler_cancellation=True,
                           shutdown_timeout=0.5)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as e:
        log.error("cannot bind %s:%d: %s", host, port, e)
        await runner.cleanup()
        return 1
    log.info("simulator listening on http://%s:%d (profile %s); loading for %.1f s",
             host, port, sim.profile.name, sim.boot_seconds)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    boot = asyncio.create_task(sim.boot())
    stopped = asyncio.create_task(stop.wait())
    code = 0
    try:
        await asyncio.wait({boot, stopped}, return_when=asyncio.FIRST_COMPLETED)
        err = boot.exception() if boot.done() else None
        if err is not None:
            if isinstance(err, InjectedCrash):
                log.error("Scheduler hit an exception:\n%s", err)
                return 1
            if not isinstance(err, StartupError):
                raise err
            log.error("Scheduler hit an exception during start-up:\n%s", err.log_text())
            code = err.exit_code
        elif boot.done():
            log.info("The server is fired up and ready to roll!")
            await stopped
    finally:
        boot.cancel()
        stopped.cancel()
        await sim.close()
        await runner.cleanup()
    return code


class Refused(Exception):
    """What a boot refuses before it binds its port. `why` in the simulator's words; `line` is
    what a boot prints and `code` its exit status; `kind`: "args", "profile" or "api_key_env"."""

    def __init__(self, kind: str, why: str, line: str | None = None, code: int = 2) -> None:
        super().__init__(why)
        self.kind = kind
        self.why = why
        self.line = f"error: {why}" if line is None else line
        self.code = code


@dataclass(frozen=True)
class Launch:
    """A boot's validated arguments."""

    profile: Profile
    args: dict[str, Any]                # as SGLang names them
    normalized: dict[str, Any]
    warnings: tuple[str, ...]
    boot_s: float
    api_key: str | None


def validate(ns: argparse.Namespace) -> Launch:
    """The parsed arguments checked as a boot checks them, in its order; raises Refused."""
    try:
        profile = load_profile(ns.profile)
    except ConfigError as e:
        raise Refused("profile", str(e)) from None
    args = server_args(ns, profile.model_path)
    try:
        normalized, warnings = normalize_params(profile, args)
    except StartupError as e:
        raise Refused("args", e.message.removeprefix("error: "), line=e.log_text(),
                      code=e.exit_code) from None
    boot = profile.boot.seconds if ns.boot_time is None else ns.boot_time
    if boot < 0:
        raise Refused("args", f"--boot-time = {boot}: must be >= 0")
    if ns.api_key is not None and ns.api_key_env is not None:
        raise Refused("args", "give --api-key or --api-key-env, not both")
    api_key = ns.api_key
    if ns.api_key_env is not None:
        api_key = os.environ.get(ns.api_key_env, "")
        if not api_key:
            raise Refused("api_key_env", f"--api-key-env {ns.api_key_env}: that environment "
                                         f"variable is not set or empty")
    return Launch(profile, args, normalized, warnings, boot, api_key)


class _CheckingParser(argparse.ArgumentParser):
    """argparse's error() prints the usage and exits; the check mode reports it as one line."""

    def error(self, message: str) -> NoReturn:
        raise Refused("args", message)


def check_args(argv: list[str]) -> str | None:
    """What a boot with `argv` would refuse, as the check mode's one MESSAGE (the module
    docstring lists its forms), or None when it would start."""
    try:
        ns, unknown = build_parser(_CheckingParser).parse_known_args(argv)
        if unknown:
            return f"the simulator does not know the argument(s) {' '.join(unknown)}"
        validate(ns)
    except Refused as r:
        return r.why if r.kind != "args" else f"the simulator refuses its arguments: {r.why}"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if CHECK_FLAG in argv:
        problem = check_args(argv)
        if problem is not None:
            print(f"error: {problem}", file=sys.stderr)
            return 2
        return 0
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="[%(asctime)s] %(levelname)s %(message)s")
    ns = build_parser().parse_args(argv)        # exits 2 on bad flags
    try:
        launch = validate(ns)
    except Refused as r:
        print(r.line, file=sys.stderr)
        return r.code
    for w in launch.warnings:
        log.warning(w)
    faults = FaultInjector(parse_faults([*launch.profile.faults, *ns.fault]), launch.normalized,
                           ns.fault_seed)
    if faults:
        log.warning("fault injection on: %s", ", ".join(faults.describe()))
    sim = SimServer(launch.profile, launch.args, launch.boot_s, ns.noise_seed, faults=faults,
                    api_key=launch.api_key)
    return asyncio.run(serve(sim, ns.host, ns.port))

if __name__ == "__main__":
    sys.exit(main())
