"""The simulator's HTTP server: SGLang's endpoints over the real-time scheduler (aiohttp).

`SimServer` holds the state of one boot: it answers 503 on `/health` while "loading", applies
the start-up memory rules where SGLang hits them (after the weights load), then starts the
scheduler. `make_app` wires the routes. Client disconnects cancel the handler (aiohttp's
`handler_cancellation`), which aborts the request and frees its slot and KV. Errors are JSON:
400 for a malformed body, 401 without the API key (when one is set), 404 / 405 for unknown
paths or methods, 503 while starting.

With an API key (`--api-key` / `--api-key-env`), every path but `/health*` and `/metrics` needs
`Authorization: Bearer <key>`, as SGLang's API-key middleware does. The key is never logged and
never reported by `/server_info`. Injected faults (`faults.py`) hook into boot, request arrival
and the streaming loop; without faults the hooks do nothing. The generation loop behind
`/generate` and the OpenAI endpoints, and the JSON error body, are `responses.py`.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from specdecode_tune import __version__
from specdecode_tune.sim import metrics, releases
from specdecode_tune.sim.api import (
    GenParams,
    OpenAIFormat,
    SglangFormat,
    parse_generate,
    parse_openai,
)
from specdecode_tune.sim.arguments import EMULATED_VERSION, StartupError
from specdecode_tune.sim.boot import Facts, GiB, startup
from specdecode_tune.sim.faults import FaultInjector
from specdecode_tune.sim.profile import Profile
from specdecode_tune.sim.responses import json_error, serve
from specdecode_tune.sim.scheduler import Scheduler, boot_speed_factor

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
log = logging.getLogger("specdecode_tune.sim")


class SimServer:
    """One boot of the simulated server: args, profile, and (once ready) facts and scheduler."""

    def __init__(self, profile: Profile, args: dict[str, Any], boot_seconds: float,
                 noise_seed: int | None, faults: FaultInjector | None = None,
                 api_key: str | None = None) -> None:
        self.profile = profile
        self.args = args                      # server args, SGLang names
        self.faults = faults if faults is not None else FaultInjector((), args)
        self.boot_seconds = self.faults.boot_seconds(boot_seconds)
        self.noise_seed = noise_seed
        self.api_key = api_key or None
        self.facts: Facts | None = None
        self.scheduler: Scheduler | None = None
        self._task: asyncio.Task[None] | None = None
        # the SGLang release imitated where releases differ (sim/releases.py)
        self.version = str(args.get("sglang_version") or EMULATED_VERSION)

    @property
    def ready(self) -> bool:
        return self.scheduler is not None

    async def boot(self) -> None:
        """Sleep through the boot; raises StartupError where SGLang would fail (after weights
        load)."""
        fail_at = self.boot_seconds * self.profile.boot.fail_at_fraction
        # SGLang's memory lines (model_runner.py), in its words and units (GB = 2**30 bytes):
        # the free memory before the weights and after the CUDA graph capture.
        log.info("Load weight begin. avail mem=%.2f GB",
                 self.profile.hardware.gpu_memory_bytes / GiB)
        await asyncio.sleep(fail_at)
        injected = self.faults.startup_failure()
        if injected is not None:
            kind, message = injected
            if kind == "oom":
                raise StartupError("oom", message)
            raise InjectedCrash(message)
        facts = startup(self.profile, self.args)
        log.info("%s", releases.capture_end_line(
            self.version, facts.speculative, fail_at, facts.graph_kept_bytes / GiB,
            facts.free_after_capture_bytes / GiB))
        log.info("max_total_num_tokens=%d, max_running_requests=%d, max_req_input_len=%d",
                 facts.max_total_num_tokens, facts.max_running_requests, facts.max_req_input_len)
        await asyncio.sleep(self.boot_seconds - fail_at)
        noise = random.Random(self.noise_seed)   # None = fresh entropy: boots differ as real ones
        factor = boot_speed_factor(self.profile.noise.boot_sigma, noise)
        self.facts = facts
        self.scheduler = Scheduler(self.profile, facts, self.args.get("random_seed"), factor,
                                   noise.getrandbits(64))
        self._task = asyncio.create_task(self.scheduler.run())
        self.faults.on_hang = self.scheduler.freeze
        self.faults.on_slowdown = self._slow_down

    def _slow_down(self, factor: float) -> None:
        if self.scheduler is not None:
            self.scheduler.speed_factor *= factor

    async def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def server_info(self) -> dict[str, Any]:
        facts, sched = self.facts, self.scheduler
        if facts is None or sched is None:
            raise web.HTTPServiceUnavailable()
        c = sched.counters
        kv_gb = facts.kv_bytes / GiB
        # As SGLang 0.5.10's http_server.server_info: the server args (max_running_requests is
        # the flag, 48 after the speculative reset, or null), the scheduler's figures, and
        # internal_states with the args again and the scheduler's effective running limit.
        # No GPU ids: SGLang reports none (the trial reads CUDA_VISIBLE_DEVICES itself).
        return {
            **facts.params,      # the server args, normalized
            "max_total_num_tokens": facts.max_total_num_tokens,
            "max_req_input_len": facts.max_req_input_len,
            "profile": self.profile.name,
            "version": f"{__version__}-sim",
            "simulator": True,
            "faults": self.faults.describe(),
            "internal_states": [
                {
                    **facts.params,
                    "avg_spec_accept_length": c.avg_accept_length,
                    "effective_max_running_requests_per_dp": facts.max_running_requests,
                    "max_total_num_tokens": facts.max_total_num_tokens,
                    "last_gen_throughput": c.interval_gen_throughput,
                    "memory_usage": releases.memory_usage(
                        self.version, facts.speculative, weight_gb=facts.weight_bytes / GiB,
                        kv_gb=kv_gb, graph_gb=facts.headroom_need_bytes / GiB,
                        tokens=facts.max_total_num_tokens,
                        available_gb=facts.free_after_capture_bytes / GiB),
                }
            ],
        }

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.args["model_path"],
            "tokenizer_path": self.args["model_path"],
            "is_generation": True,
            "weight_version": "default",
        }


class InjectedCrash(Exception):
    """An injected crash during start-up (fault crash-at-start)."""


# Paths SGLang's API-key middleware lets through without the key.
_OPEN_PATHS = ("/health", "/metrics")


def _guard(sim: SimServer) -> Middleware:
    """Middleware: an injected hang holds every request; a set API key is required."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        await sim.faults.wait_if_hung()
        if sim.api_key is not None and not request.path.startswith(_OPEN_PATHS):
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {sim.api_key}".encode()):
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return guard


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPServiceUnavailable:
        return json_error(503, "The server is starting up")
    except web.HTTPNotFound:
        return json_error(404, f"Not Found: {request.path}")
    except web.HTTPMethodNotAllowed:
        return json_error(405, f"Method Not Allowed: {request.method} {request.path}")


class Routes:
    """Request handlers over one SimServer."""

    def __init__(self, sim: SimServer) -> None:
        self.sim = sim

    def _scheduler(self) -> Scheduler:
        if self.sim.scheduler is None:
            raise web.HTTPServiceUnavailable()
        return self.sim.scheduler

    async def health(self, request: web.Request) -> web.Response:
        """SGLang's `/health` = `/health_generate` (`http_server.py` `health_generate`: 0.5.10
        L476-548, 0.5.17 L646-720, the same): 503 while starting; unless
        SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is false (then `/health`, not
        `/health_generate`, is a plain 200), a 1-token generation is submitted and polled
        every second, the first poll after one second, for up to SGLANG_HEALTH_CHECK_TIMEOUT
        (20 s) before a 503. So a probe of a live server takes >= 1 s, as there
        (docs/engines-sglang.md section 8)."""
        if not self.sim.ready or self.sim.scheduler is None:
            return json_error(503, "The server is starting up")
        if request.path == "/health" and os.environ.get(
                "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "true").lower() in (
                "0", "false", "no", "off"):
            return web.Response(text="")
        timeout_s = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
        sched = self.sim.scheduler
        # A busy scheduler skips the health request (0.5.10 scheduler.py
        # `process_input_requests`): any output since the probe began answers it.
        busy = bool(sched.running or sched.waiting)
        req = None if busy else sched.submit_health_check()
        seen = sched.counters.generation_tokens
        tic = time.monotonic()
        try:
            while time.monotonic() - tic < timeout_s:
                await asyncio.sleep(1)
                if (req.finished if req is not None
                        else sched.counters.generation_tokens != seen or not sched.running):
                    return web.Response(text="")
            return json_error(503, "health check timed out")
        finally:
            if req is not None:
                sched.abort(req)

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.sim.server_info())

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.sim.model_info())

    async def models(self, request: web.Request) -> web.Response:
        name = self.sim.args["served_model_name"]
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "owned_by": "sglang"}]})

    async def flush_cache(self, request: web.Request) -> web.Response:
        sched = self._scheduler()
        if sched.running or sched.waiting:
            return web.Response(status=400, text="Cache not flushed. There are still requests "
                                                 "running or waiting.")
        return web.Response(text="Cache flushed.\n")

    async def get_load(self, request: web.Request) -> web.Response:
        # SGLang 0.5.10's /get_load: one item per DP rank (one here), asked of the scheduler now.
        # From 0.5.11 a deprecated shim over /v1/loads that says so in the log on every call.
        sched = self._scheduler()
        if releases.at_least(self.sim.version, releases.V1_LOADS_SINCE):
            log.warning(releases.GET_LOAD_DEPRECATED)
        return web.json_response([{"dp_rank": 0, "num_reqs": sched.load(),
                                   "num_waiting_reqs": len(sched.waiting),
                                   "num_tokens": sched.kv_reserved}])

    async def v1_loads(self, request: web.Request) -> web.Response:
        # SGLang 0.5.11+'s /v1/loads (the fields 0.5.17 answered with on the GPU machine,
        # tests/data/sglang-0.5.17/v1_loads-idle.json); 404 before 0.5.11, as there.
        if not releases.at_least(self.sim.version, releases.V1_LOADS_SINCE):
            raise web.HTTPNotFound()
        sched = self._scheduler()
        facts = self.sim.facts
        running = sched.load() - len(sched.waiting)
        return web.json_response({"version": self.sim.version, "loads": [{
            "dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": len(sched.waiting),
            "num_used_tokens": sched.kv_reserved,
            "max_total_num_tokens": facts.max_total_num_tokens if facts else None,
            "max_running_requests": facts.max_running_requests if facts else None}]})

    async def metrics(self, request: web.Request) -> web.Response:
        name = self.sim.args["served_model_name"]
        text = metrics.render(self._scheduler(), name, self.sim.version)
        if self.sim.faults:
            text += "\n".join(self.sim.faults.metrics_lines(f'model_name="{name}"')) + "\n"
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def generate(self, request: web.Request) -> web.StreamResponse:
        facts = self.sim.facts
        # SGLang counts a request's proposed drafts with the draft tokens it was started with
        # (server_args; under the adaptive schedule the starting steps', whatever each step ran)
        nodes = (int(facts.params["speculative_num_draft_tokens"]) - 1
                 if facts is not None and facts.speculative else None)
        return await self._serve(
            request,
            lambda body: parse_generate(body, self.sim.profile.defaults.max_new_tokens),
            lambda req, params: SglangFormat(
                req, nodes, bool(self.sim.args.get("incremental_streaming_output")),
                releases.spec_field_names(self.sim.version)),
            refusal_in_stream=True,
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        model = self.sim.args["served_model_name"]
        return await self._serve(
            request,
            lambda body: parse_openai(body, chat=False),
            lambda req, params: OpenAIFormat(req, params, model, chat=False),
        )

    async def chat(self, request: web.Request) -> web.StreamResponse:
        model = self.sim.args["served_model_name"]
        return await self._serve(
            request,
            lambda body: parse_openai(body, chat=True),
            lambda req, params: OpenAIFormat(req, params, model, chat=True),
        )

    async def _serve(
        self,
        request: web.Request,
        parse: Callable[[Any], GenParams],
        make_format: Callable[[Any, GenParams], SglangFormat | OpenAIFormat],
        refusal_in_stream: bool = False,
    ) -> web.StreamResponse:
        """The one generation loop (`responses.serve`) over this boot's scheduler (503 while
        starting) and faults."""
        return await serve(request, self._scheduler(), self.sim.faults, parse, make_format,
                           refusal_in_stream)


def make_app(sim: SimServer) -> web.Application:
    routes = Routes(sim)
    app = web.Application(middlewares=[_guard(sim), _json_errors])
    for path in ("/health", "/health_generate"):
        app.router.add_get(path, routes.health)
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, routes.server_info)
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, routes.model_info)
    app.router.add_get("/v1/models", routes.models)
    app.router.add_get("/get_load", routes.get_load)
    app.router.add_get("/v1/loads", routes.v1_loads)
    app.router.add_route("*", "/flush_cache", routes.flush_cache)
    app.router.add_post("/generate", routes.generate)
    app.router.add_post("/v1/completions", routes.completions)
    app.router.add_post("/v1/chat/completions", routes.chat)
    if sim.args.get("enable_metrics"):
        app.router.add_get("/metrics", routes.metrics)
    return app
