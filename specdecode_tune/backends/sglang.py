"""SGLang (`python -m sglang.launch_server`) and the simulator, which takes the same flags.

SGLang's rules that shape the argv (../shared/SERVERS.md): the three speculative numbers are
passed together or not at all (the baseline passes none, nor the algorithm); any other searched
or fixed setting is passed as `--name-with-dashes value`, a true boolean as a bare flag.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..config import BackendConfig
from ..errors import ConfigError
from ..records import ServerFacts
from ..space import DRAFT, STEPS, TOPK, is_baseline
from . import simargs
from .failurepatterns import FailurePatterns
from .files import LocalFile, hub_or_local
from .streamformat import NativeApi, PromptFields, StreamFormat, check_error_event

# SGLang's start-up failures: the memory pool check (the KV pool left after the weights cannot
# hold one request), and server_args.py's argument checks, which assert or raise ValueError.
# Its out-of-memory lines are PyTorch's (the classifier knows those for every engine); its
# hints say "out-of-memory" and "This is not an out-of-memory error", which must not count.
FAILURE_PATTERNS = FailurePatterns(
    kv_memory=(r"Not enough memory\. Please try to increase --mem-fraction-static",),
    arg_exceptions=("AssertionError",),
    arg_check_files=(r"server_args\.py",),
)


def generate_body(prompt: PromptFields) -> dict[str, Any]:
    """SGLang's native `/generate` request, streamed."""
    return {
        "text": prompt.text,
        "sampling_params": {
            "max_new_tokens": prompt.output_len,
            "temperature": prompt.temperature,
            "ignore_eos": prompt.ignore_eos,
        },
        "stream": True,
    }


def interpret_generate(obj: Any) -> tuple[bool, int | None, dict[str, Any] | None]:
    """SGLang `/generate`: ``meta_info.completion_tokens`` is cumulative in every chunk."""
    if type(obj) is not dict:
        raise TypeError("chunk is not an object")
    meta = obj.get("meta_info")
    if meta is None:
        check_error_event(obj)
        return bool(obj.get("text")), None, None
    if type(meta) is not dict:
        raise TypeError("meta_info is not an object")
    ct = meta.get("completion_tokens")
    return True, (ct if type(ct) is int else None), meta


# What SGLang streams: its own /generate API beside the OpenAI ones, and per request (in
# /generate's meta_info) its speculative counters, under names that changed across versions.
STREAM_FORMAT = StreamFormat(
    native_apis=(NativeApi("generate", "/generate", generate_body, interpret_generate),),
    verify_ct=("spec_verify_ct",),
    accepted=("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num"),
    drafted=("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num"),
    histogram=("spec_correct_drafts_histogram", "spec_accept_histogram"),
)

_SPEC_FLAGS = ((STEPS, "--speculative-num-steps"), (TOPK, "--speculative-eagle-topk"),
               (DRAFT, "--speculative-num-draft-tokens"))


def flag_args(params: Mapping[str, Any], skip: tuple[str, ...] = ()) -> list[str]:
    """`--name-with-dashes value` for each setting; True -> bare flag, False/None -> nothing."""
    out: list[str] = []
    for name, value in params.items():
        if name in skip or name.startswith("_") or value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        out.append(flag) if value is True else out.extend([flag, _fmt(value)])
    return out


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return repr(round(value, 6))
    return str(value)


# Servers are on loopback: never send their requests through an HTTP(S)_PROXY from the env.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get_json(url: str, timeout_s: float, headers: Mapping[str, str] | None = None) -> Any:
    req = urllib.request.Request(url, headers=dict(headers or {}))
    with _OPENER.open(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


class SGLangBackend:
    name = "sglang"
    health_path = "/health"
    request_headers: ClassVar[Mapping[str, str]] = {}
    failure_patterns: ClassVar[FailurePatterns] = FAILURE_PATTERNS
    stream_format: ClassVar[StreamFormat] = STREAM_FORMAT
    module = "sglang.launch_server"

    def program(self, cfg: BackendConfig) -> str:
        return cfg.binary or sys.executable

    def _head(self, cfg: BackendConfig) -> list[str]:
        if cfg.binary:
            return [cfg.binary]
        return [sys.executable, "-m", self.module]

    def server_args(self, cfg: BackendConfig, params: Mapping[str, Any]) -> list[str]:
        args = ["--model-path", cfg.model_path, "--tp-size", str(cfg.tp_size)]
        if not is_baseline(params) and cfg.speculative_algorithm:
            args += ["--speculative-algorithm", cfg.speculative_algorithm]
            if cfg.draft_model_path:
                args += ["--speculative-draft-model-path", cfg.draft_model_path]
            for name, flag in _SPEC_FLAGS:
                args += [flag, str(int(params[name]))]
        args += flag_args(params, skip=(STEPS, TOPK, DRAFT))
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
        return dict(cfg.env)

    def validate(self, cfg: BackendConfig) -> None:
        if "--api-key" in cfg.extra_args:
            raise ConfigError("backend.extra_args: --api-key would put the key in the run's "
                              "tables and report; export it and name the variable in "
                              "backend.api_key_env instead")

    def local_files(self, cfg: BackendConfig) -> list[LocalFile]:
        """`--model-path`, the draft and `--tokenizer-path` where they are local paths (each
        may be a hub id instead; SGLang takes them as written)."""
        files = hub_or_local("backend.model_path", cfg.model_path)
        if cfg.speculative_algorithm:
            files += hub_or_local("backend.draft_model_path", cfg.draft_model_path)
        return files + hub_or_local("backend.flags.tokenizer_path",
                                    cfg.flags.get("tokenizer_path"))

    def launch_command(self, cfg: BackendConfig, params: Mapping[str, Any]) -> str:
        head = [cfg.binary] if cfg.binary else ["python", "-m", "sglang.launch_server"]
        return shlex.join(head + self.server_args(cfg, params)) + self.key_text(cfg)

    def read_facts(self, base_url: str, timeout_s: float = 10.0) -> ServerFacts:
        info: dict[str, Any] = {}
        for path in ("/server_info", "/get_server_info"):
            try:
                info = get_json(base_url + path, timeout_s)
                break
            except (urllib.error.URLError, OSError, ValueError):
                continue
        states = info.get("internal_states") or [{}]
        state = states[0] if isinstance(states, list) and states else {}

        def pick(key: str) -> int | None:
            # The scheduler's effective figure first: the top-level server arg may be the
            # unset flag (None) even though the scheduler capped it.
            for src in (state, info):
                value = src.get(key) if isinstance(src, dict) else None
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    return int(value)
            return None

        gpu_ids = info.get("gpu_ids")
        return ServerFacts(
            max_total_num_tokens=pick("max_total_num_tokens"),
            max_running_requests=pick("max_running_requests"),
            gpu_ids=tuple(str(g) for g in gpu_ids) if isinstance(gpu_ids, list) else (),
            extra={k: info[k] for k in ("max_req_input_len", "version", "profile") if k in info},
        )

    def in_flight(self, base_url: str, headers: Mapping[str, str] | None = None,
                  timeout_s: float = 5.0) -> int | None:
        # Not the gauges sglang:num_running_reqs / num_queue_reqs: SGLang writes them on a
        # prefill, every 40th decode batch and after 30 s idle, so after a level's cut they keep
        # their last value for up to 30 s. GET /get_load asks the scheduler now (0.5.10:
        # http_server.py, scheduler_metrics_mixin.get_load): one item per DP rank, `num_reqs`
        # = running + waiting. It needs the API key where one is set.
        try:
            ranks = get_json(f"{base_url}/get_load", timeout_s, headers)
        except (OSError, ValueError):
            return None
        if isinstance(ranks, dict):
            ranks = [ranks]
        if not isinstance(ranks, list):
            return None
        counts = [r.get("num_reqs") for r in ranks if isinstance(r, dict)]
        ints = [n for n in counts if isinstance(n, int)]
        return sum(ints) if ints and len(ints) == len(counts) else None

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

    def metrics_snapshot(self, base_url: str) -> dict[str, float] | None:
        # SGLang's acceptance comes per request (meta_info); its /metrics gauge covers the
        # last log interval, not a window, so there is nothing to difference.
        return None

    def window_acceptance(self, before: Mapping[str, float] | None,
                          after: Mapping[str, float] | None
                          ) -> tuple[float | None, tuple[int, ...]]:
        return None, ()


class SimBackend(SGLangBackend):
    """The embedded simulator: SGLang's flags plus its profile and boot-time override."""

    name = "sim"
    module = "specdecode_tune.sim"

    def server_args(self, cfg: BackendConfig, params: Mapping[str, Any]) -> list[str]:
        args = super().server_args(cfg, params)
        if cfg.profile:
            args += ["--profile", cfg.profile]
        if cfg.boot_time_s is not None:
            args += ["--boot-time", _fmt(float(cfg.boot_time_s))]
        return args

    def validate(self, cfg: BackendConfig) -> None:
        """The profile every boot would load: missing, unreadable, not TOML, bad values."""
        from ..sim.profile import DEFAULT_PROFILE, load_profile
        load_profile(cfg.profile or DEFAULT_PROFILE)

    def check_args(self, cfg: BackendConfig, argv: Sequence[str]) -> None:
        """What every boot would refuse: the simulator's CLI says (`simargs`)."""
        simargs.check(self.module, argv[len(self._head(cfg)):])

    def local_files(self, cfg: BackendConfig) -> list[LocalFile]:
        return []   # the simulator loads no model: model_path and the draft are names only

    def key_args(self, cfg: BackendConfig) -> list[str]:
        # The simulator also reads the key from a variable it is named (its own flag), so the
        # key stays off its command line.
        return ["--api-key-env", cfg.api_key_env] if cfg.api_key_env else []

    def launch_command(self, cfg: BackendConfig, params: Mapping[str, Any]) -> str:
        # The simulator stands in for SGLang: the command to take away is SGLang's.
        return shlex.join(["python", "-m", "sglang.launch_server"]
                          + SGLangBackend.server_args(self, cfg, params)) + self.key_text(cfg)
