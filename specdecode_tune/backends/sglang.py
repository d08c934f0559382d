"""SGLang (`python -m sglang.launch_server`); the simulator, which takes the same flags, is
backends/sim.py.

SGLang's rules that shape the argv (docs/engines-sglang.md): the three speculative numbers are
passed together or not at all (the baseline passes none, nor the algorithm); any other searched
or fixed setting is passed as `--name-with-dashes value`, a true boolean as a bare flag.

What differs between SGLang releases is known in backends/ too (docs/engines-sglang.md, each
fact with its source): the backend knows the release its servers run (`engine_version`: the
experiment's `backend.engine_version`, else the sglang installed in this Python, else
`DEFAULT_VERSION`, the release the project's contract tests run) and emits only what that
release accepts. That knowledge is in the modules beside this one: `sglang_releases` (flags
by release, the hybrid models' refusal), `sglang_python` (the servers' Python: its release,
SGLang's own argument check), `sglang_logs` (start-up failures, memory lines), `sglang_wire`
(/generate's stream, /metrics' counters, /v1/loads) and `sglang_schedule` (the adaptive-config
file).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import urllib.error
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..config import BackendConfig
from ..enginecache import expand_path
from ..errors import ConfigError
from ..records import FACTS_UNREAD, ServerFacts
from ..space import DRAFT, STEPS, TOPK, is_baseline
from . import httpread, speccounters
from .common import at_least, flag_args, get_json
from .failurepatterns import FailurePatterns
from .files import LocalFile, hub_or_local
from .schedule import NOTHING, ScheduleAsk, ScheduleFile
from .sglang_logs import FAILURE_PATTERNS, memory_facts
from .sglang_python import argcheck, installed_version, python_sglang_version, without_endpoint
from .sglang_releases import (
    ADAPTIVE_FLAGS_SINCE,
    ADAPTIVE_PER_BATCH_SIZE_SINCE,
    DEFAULT_VERSION,
    RADIX_SPEC_ALLOWED_SINCE,
    RADIX_SPEC_REFUSED,
    local_architecture,
    radix_spec_refusal,
    renamed,
    short_tree_crash,
)
from .sglang_schedule import SCHEDULE_ABOUT, SCHEDULE_FILE, SCHEDULE_TITLE, adaptive_config
from .sglang_wire import GENERATED, STREAM_FORMAT, V1_LOADS, VERIFY_CALLS, load_count, spec_counters
from .streamformat import StreamFormat

_SPEC_FLAGS = ((STEPS, "--speculative-num-steps"), (TOPK, "--speculative-eagle-topk"),
               (DRAFT, "--speculative-num-draft-tokens"))
METRICS_TIMEOUT_S = 1.5
NO_CRASH_DIAGNOSTICS = {"SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0",
                        "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0"}


class SGLangBackend:
    name = "sglang"
    health_path = "/health"
    # What a person reads of a live server, kept verbatim by scripts/device/engine_readings.py:
    # (file name, GET path); and the path of the scheduler's own count of requests in flight
    # (what in_flight reads), which it polls through a measured level.
    raw_paths: ClassVar[tuple[tuple[str, str], ...]] = (
        ("server_info.json", "/server_info"), ("health.txt", "/health"),
        ("health_generate.txt", "/health_generate"), ("get_load-idle.json", "/get_load"),
        ("v1_loads-idle.json", "/v1/loads?include=core"), ("model_info.json", "/model_info"))
    load_path: ClassVar[str] = V1_LOADS
    request_headers: ClassVar[Mapping[str, str]] = {}
    failure_patterns: ClassVar[FailurePatterns] = FAILURE_PATTERNS
    stream_format: ClassVar[StreamFormat] = STREAM_FORMAT
    module = "sglang.launch_server"

    def __init__(self) -> None:
        self._no_v1_loads: set[str] = set()   # servers that answered 404 to /v1/loads

    def program(self, cfg: BackendConfig) -> str:
        return cfg.binary or cfg.python or sys.executable

    def _head(self, cfg: BackendConfig) -> list[str]:
        if cfg.binary:
            return [cfg.binary]
        return [cfg.python or sys.executable, "-m", self.module]

    def server_args(self, cfg: BackendConfig, params: Mapping[str, Any],
                    version: str | None = None) -> list[str]:
        """The server's arguments, with the flag names of `version` (default: the release
        the servers run, `engine_version`)."""
        args = ["--model-path", expand_path(cfg.model_path), "--tp-size", str(cfg.tp_size)]
        if not is_baseline(params) and cfg.speculative_algorithm:
            args += ["--speculative-algorithm", cfg.speculative_algorithm]
            if cfg.draft_model_path:
                args += ["--speculative-draft-model-path", expand_path(cfg.draft_model_path)]
            for name, flag in _SPEC_FLAGS:
                args += [flag, str(int(params[name]))]
        version = version or self.engine_version(cfg)[0]
        args += flag_args(renamed(params, version), skip=(STEPS, TOPK, DRAFT))
        if "enable_metrics" not in params:
            args.append("--enable-metrics")
        return args + list(cfg.extra_args)

    def argv(self, cfg: BackendConfig, params: Mapping[str, Any], port: int | str) -> list[str]:
        return (self._head(cfg) + self.server_args(cfg, params) + self.key_args(cfg)
                + ["--host", cfg.host, "--port", str(port)])

    def key_args(self, cfg: BackendConfig) -> list[str]:
        """The API key for the server: SGLang takes it only as `--api-key KEY` (no environment
        form), so it is read from `backend.api_key_env` at boot. The trial masks it in the
        server's log (SGLang logs its server_args), and no table or report holds argv; the
        launch command names the variable instead."""
        if not cfg.api_key_env:
            return []
        return ["--api-key", os.environ.get(cfg.api_key_env, "")]

    def key_text(self, cfg: BackendConfig) -> str:
        return f' --api-key "${cfg.api_key_env}"' if cfg.api_key_env else ""

    def env(self, cfg: BackendConfig, run_dir: str | None = None) -> dict[str, str]:
        # A trial ends its server by SIGTERM to the process group, so the scheduler exits
        # first and the launcher takes that for a crash: from 0.5.13 it then sleeps 5 s "before
        # crash diagnostics" (py-spy and CUDA coredumps of schedulers already gone; 0.5.17
        # tokenizer_manager.py L2979-3065, both switches on by default in environ.py L1031-1032):
        # 5 s of every boot on the H100 (docs/gpu-runs.md). The experiment's own env wins.
        return {**NO_CRASH_DIAGNOSTICS, **cfg.env}

    def validate(self, cfg: BackendConfig) -> None:
        """A hybrid model's speculation refused at every boot (when its config.json is on this
        machine; a hub id is left to the server)."""
        if "--api-key" in cfg.extra_args:
            raise ConfigError("backend.extra_args: --api-key would put the key in the run's "
                              "tables and report; export it and name the variable in "
                              "backend.api_key_env instead")
        if (not cfg.speculative_algorithm or cfg.flags.get("disable_radix_cache")
                or cfg.flags.get("mamba_scheduler_strategy") == "extra_buffer"):
            return
        version, origin = self.engine_version(cfg)
        arch = local_architecture(cfg.model_path)
        if arch in RADIX_SPEC_REFUSED and not at_least(version, RADIX_SPEC_ALLOWED_SINCE):
            raise ConfigError(
                f"backend: SGLang {version} ({origin}) refuses every speculative server of "
                f"{arch} (a hybrid model) with radix cache on: \"{radix_spec_refusal(arch)}\"; "
                f"set disable_radix_cache = true in [backend.flags] (docs/engines-sglang.md "
                f"section 1)")

    def local_files(self, cfg: BackendConfig) -> list[LocalFile]:
        """`--model-path`, the draft and `--tokenizer-path` where they are local paths (each
        may be a hub id instead; SGLang takes them as written)."""
        files = hub_or_local("backend.model_path", cfg.model_path, expand_path(cfg.model_path))
        if cfg.speculative_algorithm and cfg.draft_model_path:
            files += hub_or_local("backend.draft_model_path", cfg.draft_model_path,
                                  expand_path(cfg.draft_model_path))
        return files + hub_or_local("backend.flags.tokenizer_path",
                                    cfg.flags.get("tokenizer_path"))

    def launch_command(self, cfg: BackendConfig, params: Mapping[str, Any]) -> str:
        head = [cfg.binary] if cfg.binary else ["python", "-m", "sglang.launch_server"]
        return shlex.join(head + self.server_args(cfg, params)) + self.key_text(cfg)

    def engine_version(self, cfg: BackendConfig) -> tuple[str, str]:
        """(the SGLang release the servers run, where that comes from)."""
        if cfg.engine_version:
            return cfg.engine_version, "backend.engine_version"
        if cfg.python:
            theirs = python_sglang_version(cfg.python)
            if theirs is not None:
                return theirs, "the sglang of backend.python"
        else:
            installed = installed_version()
            if installed is not None:
                return installed, "the sglang installed here"
        return DEFAULT_VERSION, "the default; set backend.engine_version to yours"

    def check_args(self, cfg: BackendConfig, argv: Sequence[str]) -> None:
        """SGLang's own argument check on `argv` (`sglang_argcheck.py`, run by the Python that
        launches the servers: `backend.python` or this one), where that Python has sglang: a
        command line every boot would refuse raises ConfigError (one line, SGLang's words).
        Nothing is said where it cannot tell (no sglang there, a `backend.binary`, a model
        config it cannot read here): the boot decides."""
        problem = self.refusals(cfg, [argv])[0]
        if problem is not None:
            raise ConfigError(problem)

    def refusals(self, cfg: BackendConfig, argvs: Sequence[Sequence[str]]
                 ) -> list[str | None]:
        """`check_args` for several command lines in one run of SGLang's parser: per argv, the
        one-line refusal or None."""
        python = self.argcheck_python(cfg)
        if python is None or not argvs:
            return [None] * len(argvs)
        head = len(self._head(cfg))
        cases = [{"argv": without_endpoint(list(a[head:])), "env": self.env(cfg)}
                 for a in argvs]
        answer = argcheck(python, json.dumps({"cases": cases, "cpu_if_no_gpu": True},
                                             sort_keys=True))
        found = answer.get("cases")
        if not isinstance(found, list) or len(found) != len(argvs):
            return [None] * len(argvs)
        return [None if a.get("ok") or not a.get("refused") else
                f"backend: SGLang {answer.get('sglang')}'s own argument check refuses the "
                f"command line: {a.get('error')}" for a in found]

    def known_crash(self, cfg: BackendConfig, params: Mapping[str, Any],
                    version: str | None = None) -> str | None:
        """Resolved speculative `params` SGLang's argument checks pass and its boot is known to
        crash on, in the release the servers run (`version`, default `engine_version`), as a
        one-line refusal; None otherwise (sglang_releases.py: each with where it was seen)."""
        steps, topk, draft = params.get(STEPS), params.get(TOPK), params.get(DRAFT)
        if steps is None or topk is None or draft is None:
            return None
        why = short_tree_crash(int(steps), int(topk), int(draft),
                               version or self.engine_version(cfg)[0])
        return f"backend: {why}" if why else None

    def argcheck_python(self, cfg: BackendConfig) -> str | None:
        """The Python whose sglang checks command lines, or None where there is none: a
        `backend.binary` (the Python behind it is unknown), or no sglang in this Python."""
        if cfg.binary:
            return None
        if cfg.python:
            return cfg.python
        return sys.executable if installed_version() is not None else None

    def schedule_params(self, cfg: BackendConfig, params: Mapping[str, Any],
                        config_path: str) -> tuple[dict[str, Any] | None, str]:
        """({**params, adaptive mode on with the per-batch-size file at `config_path`}, '')
        for a release that reads that file, else (None, which release it needs and why)."""
        version, origin = self.engine_version(cfg)
        if not at_least(version, ADAPTIVE_PER_BATCH_SIZE_SINCE):
            flags = ("has no --speculative-adaptive / --speculative-adaptive-config (they come "
                     f"in {ADAPTIVE_FLAGS_SINCE})" if not at_least(version, ADAPTIVE_FLAGS_SINCE)
                     else "reads --speculative-adaptive-config as one flat object")
            return None, (f"No SGLang schedule command: SGLang {version} ({origin}) {flags}; "
                          f"the per-batch-size file written here needs SGLang >= "
                          f"{ADAPTIVE_PER_BATCH_SIZE_SINCE}.")
        return {**params, **self.adaptive_flags(config_path)}, ""

    def schedule_command(self, cfg: BackendConfig, params: Mapping[str, Any],
                         config_path: str) -> tuple[str | None, str]:
        """(the launch command of a per-batch-size steps schedule read from `config_path`,
        '') for a release that takes one, else (None, which release it needs and why)."""
        settings, why = self.schedule_params(cfg, params, config_path)
        return (None, why) if settings is None else (self.launch_command(cfg, settings), "")

    def schedule_file(self, cfg: BackendConfig | None, ask: ScheduleAsk | None
                      ) -> ScheduleFile:
        """The adaptive-config file of `ask`; its command where `cfg` is this backend's and
        its release reads the file (`schedule_params`; the simulator's copy of the mode too)."""
        if ask is None:
            return ScheduleFile("sglang", SCHEDULE_TITLE, SCHEDULE_FILE, None, NOTHING)
        command = None
        if cfg is not None and cfg.kind == self.name:
            command, _ = self.schedule_command(cfg, ask.params, SCHEDULE_FILE)
        return ScheduleFile("sglang", SCHEDULE_TITLE, SCHEDULE_FILE,
                            adaptive_config(ask.slots), SCHEDULE_ABOUT, command)

    @staticmethod
    def adaptive_flags(config_path: str) -> dict[str, Any]:
        """The settings that turn on adaptive mode with the per-batch-size file at
        `config_path` (the schedule command, and the search's validation trials)."""
        return {"speculative_adaptive": True, "speculative_adaptive_config": config_path}

    def read_facts(self, base_url: str, timeout_s: float = 10.0,
                   headers: Mapping[str, str] | None = None) -> ServerFacts:
        # /server_info wants the API key where one is set (KeyRefused without it).
        info: dict[str, Any] = {}
        unread: list[str] = []
        for path in ("/server_info", "/get_server_info"):
            try:
                info = get_json(base_url + path, timeout_s, headers)
                unread = []
                break
            except httpread.READ_ERRORS as e:
                unread.append(httpread.unread(path, e))
        states = info.get("internal_states") or [{}]
        state = states[0] if isinstance(states, list) and states else {}

        def pick(key: str, *sources: Any) -> int | None:
            for src in sources or (state, info):
                value = src.get(key) if isinstance(src, dict) else None
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    return int(value)
            return None

        # The running limit the scheduler enforces: internal_states[0]'s
        # effective_max_running_requests_per_dp (per DP rank: times dp_size). max_running_requests
        # is only the flag (48 after the speculative reset, or null), above the effective figure
        # for hybrid models or a small KV pool; it is the fallback where the effective one is
        # missing (an older SGLang).
        running = pick("effective_max_running_requests_per_dp", state)
        if running is not None:
            running *= max(1, pick("dp_size", info, state) or 1)
        else:
            running = pick("max_running_requests")
        gpu_ids = info.get("gpu_ids")   # not from SGLang (the trial falls back to its env)
        return ServerFacts(
            max_total_num_tokens=pick("max_total_num_tokens"),
            max_running_requests=running,
            gpu_ids=tuple(str(g) for g in gpu_ids) if isinstance(gpu_ids, list) else (),
            extra={k: info[k] for k in ("max_req_input_len", "version", "profile") if k in info}
            | ({FACTS_UNREAD: "; ".join(unread)} if unread else {}),
        )

    def in_flight(self, base_url: str, headers: Mapping[str, str] | None = None,
                  timeout_s: float = 5.0) -> int | None:
        # Not the gauges sglang:num_running_reqs / num_queue_reqs: SGLang writes them on a
        # prefill, every 40th decode batch and after 30 s idle, so after a level's cut they keep
        # their last value for up to 30 s. The scheduler is asked now instead, one item per DP
        # rank: GET /v1/loads?include=core from 0.5.11 (`num_running_reqs` +
        # `num_waiting_reqs`; 0.5.17 http_server.py L809-835, load_inquirer.py `get_loads`
        # L91-124), GET /get_load before it (0.5.10: `num_reqs` = running + waiting). From 0.5.11
        # /get_load is a deprecated shim over the same items that logs "Endpoint '/get_load' is
        # deprecated ..." on every call: 518 such lines in one 8 s level of the live 0.5.17
        # server (tests/data/sglang-0.5.17/healthy-startup.log). A server that answers 404 to
        # /v1/loads (an older release) is asked /get_load from then on. Both need the API key
        # where one is set.
        if base_url not in self._no_v1_loads:
            try:
                return load_count(get_json(base_url + V1_LOADS, timeout_s, headers),
                                  ("num_running_reqs", "num_waiting_reqs"))
            except urllib.error.HTTPError as e:
                if e.code != 404:
                    return None
                self._no_v1_loads.add(base_url)
            except (OSError, ValueError):
                return None
        try:
            return load_count(get_json(f"{base_url}/get_load", timeout_s, headers),
                              ("num_reqs",))
        except (OSError, ValueError):
            return None

    def running_limit(self, facts: ServerFacts, params: Mapping[str, Any]) -> Any:
        # The scheduler's effective limit (read_facts); where /server_info was not read, the
        # --max-running-requests it was given.
        return facts.max_running_requests or params.get("max_running_requests")

    def refusal_advice(self, message: str) -> str:
        # SGLang 0.5.10 (server_args.py, _handle_mamba_radix_cache): a hybrid model (Qwen3.5,
        # Qwen3-Next) refuses speculation with radix cache on. Its own remedy
        # (--mamba-scheduler-strategy extra_buffer with SGLANG_ENABLE_SPEC_V2=1) is CUDA-only
        # and refuses topk > 1; turning radix cache off serves every point of the space.
        if "not compatible with radix cache" in message:
            return ("set disable_radix_cache = true in [backend.flags] (SGLang's other route, "
                    "--mamba-scheduler-strategy extra_buffer with SGLANG_ENABLE_SPEC_V2=1, "
                    "refuses topk > 1)")
        return ""

    def memory_facts(self, log_text: str) -> dict[str, float]:
        return memory_facts(log_text)

    def metrics_snapshot(self, base_url: str, headers: Mapping[str, str] | None = None
                         ) -> dict[str, float] | None:
        # The acceptance comes per request (meta_info); from 0.5.13 /metrics also has the two
        # counters whose deltas give it over a window: `sglang:generation_tokens_total` and
        # `sglang:spec_verify_calls_total`, both added when a request finishes, by its
        # completion_tokens and its spec_verify_ct (0.5.17 metrics_collector.py L1486-1495,
        # L1713-1727; tokenizer_manager.py L2866-2893). Not the `spec_accept_length` gauge: it
        # is the last decode log interval's, not a window's. None before 0.5.13 (no counter).
        # A short wait: the trial asks at every level's start, and a hung server must not
        # hold it (its /metrics answered in milliseconds on the H100, under load).
        samples = speccounters.read_samples(base_url, timeout_s=METRICS_TIMEOUT_S,
                                            headers=headers)
        return None if samples is None else spec_counters(samples)

    def window_acceptance(self, before: Mapping[str, float] | None,
                          after: Mapping[str, float] | None
                          ) -> tuple[float | None, tuple[int, ...]]:
        # Tokens per verify call over the requests that finished in the window: the
        # completion-weighted mean of their final chunks' spec_accept_length (= completion_tokens
        # / spec_verify_ct). Seen live (0.5.17, H100): 95203 / 30430 = 3.13 against 3.12 from
        # the same level's final chunks. No histogram: SGLang has no counter of one.
        if not before or not after:
            return None, ()
        d_calls = after.get(VERIFY_CALLS, 0.0) - before.get(VERIFY_CALLS, 0.0)
        d_gen = after.get(GENERATED, 0.0) - before.get(GENERATED, 0.0)
        if d_calls <= 0 or d_gen < 0:
            return None, ()
        return d_gen / d_calls, ()
