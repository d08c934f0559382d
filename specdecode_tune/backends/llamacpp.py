"""llama.cpp's `llama-server`: n-gram or draft-model speculation, one static binary.

Parameters -> flags (llama.cpp as vendored in llama-cpp-python 0.3.36):

- `speculative_num_steps` (the project's uniform name) is the draft length K; 0 is the baseline
  (no `--spec-type` at all). `speculative_eagle_topk` / `speculative_num_draft_tokens` are
  derived by `space.resolve` (topk 1, K + 1) and not passed: llama.cpp drafts a single chain.
- `backend.speculative_algorithm` picks llama.cpp's `--spec-type` (case-insensitive); aliases:
  "ngram" -> ngram-simple, "draft"/"standalone" -> draft-simple, "eagle3" -> draft-eagle3,
  "mtp"/"nextn" -> draft-mtp. K goes to the type's draft-length flag:

      ngram-simple    --spec-ngram-simple-size-m K    lookup --spec-ngram-simple-size-n n
      ngram-map-k     --spec-ngram-map-k-size-m K     lookup --spec-ngram-map-k-size-n n
      ngram-map-k4v   --spec-ngram-map-k4v-size-m K   lookup --spec-ngram-map-k4v-size-n n
      ngram-mod       --spec-ngram-mod-n-max K        minimum --spec-ngram-mod-n-min
      ngram-cache, draft-*   --spec-draft-n-max K     (draft-* also --spec-draft-model PATH)

  The lookup length n is the fixed flag of that name (`spec_ngram_simple_size_n = 2` in
  `[backend.flags]`), else llama.cpp's default (12), and is lowered to K when larger:
  llama.cpp silently drafts nothing when the draft length is below the lookup length, which no
  search wants. Likewise ngram-mod's minimum (default 48) is lowered to K. The argv, and so the
  report's launch command, shows the values actually used.
- `max_running_requests` -> `--parallel` (the server's slots: requests decoded together);
  otherwise a fixed `parallel` flag, else llama-server's own default.
- `mem_fraction_static` has no llama.cpp meaning and is not passed.
- Any other setting is passed as `--name-with-dashes value` (e.g. `ctx_size`, `threads`).
- `--metrics` is always on: the windowed acceptance reads its counters.
- `backend.api_key_env`: the key goes to the server as `LLAMA_API_KEY` (its environment form
  of `--api-key`), and to every read of `/props` and `/metrics`.

`backend.binary` is the llama-server path (`${SPECDECODE_CACHE}` and `~` expand); unset, the
one `scripts/build_llama_server.sh` builds, else `llama-server` on PATH. `model_path` expands
the same way.

Acceptance: per request, the final streamed chunk's `timings` holds `draft_n` (draft tokens
proposed) and `draft_n_accepted`; over a window, `/metrics` counters (see speccounters). The
per-request timings have no count of verify steps, so only the counters give an acceptance
*length*; the timings give the acceptance *rate* (accepted / proposed) and must sum to the same
deltas of the draft-token and accepted-token counters.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from ..config import BackendConfig
from ..enginecache import expand_path, llama_server_path
from ..errors import ConfigError
from ..records import FACTS_UNREAD, ServerFacts
from ..space import DRAFT, MEM, STEPS, TOPK, is_baseline
from . import httpread, speccounters
from .common import flag_args, get_json
from .failurepatterns import FailurePatterns
from .files import LocalFile
from .schedule import ScheduleAsk
from .streamformat import StreamFormat
from .tokenize_endpoint import LLAMA_SERVER, TokenizeEndpoint

METRICS_PREFIX = "llamacpp:"
# The variable llama-server reads its API key from when --api-key is not given; with a key it
# wants it on every path but /health, /v1/health, /models, /v1/models (so on /props, /metrics).
API_KEY_ENV = "LLAMA_API_KEY"
LLAMA_DEFAULT_NGRAM_N = 12        # llama.cpp's default lookup length (common.h)
LLAMA_DEFAULT_NGRAM_MOD_N_MIN = 48

SPEC_ALIASES = {
    "ngram": "ngram-simple",
    "draft": "draft-simple",
    "standalone": "draft-simple",
    "eagle3": "draft-eagle3",
    "eagle": "draft-eagle3",
    "mtp": "draft-mtp",
    "nextn": "draft-mtp",
}
# --spec-type -> (draft-length flag, lower-bound flag that must not exceed it, its default)
SPEC_TYPES: dict[str, tuple[str, str | None, int | None]] = {
    "ngram-simple": ("spec_ngram_simple_size_m", "spec_ngram_simple_size_n",
                     LLAMA_DEFAULT_NGRAM_N),
    "ngram-map-k": ("spec_ngram_map_k_size_m", "spec_ngram_map_k_size_n", LLAMA_DEFAULT_NGRAM_N),
    "ngram-map-k4v": ("spec_ngram_map_k4v_size_m", "spec_ngram_map_k4v_size_n",
                      LLAMA_DEFAULT_NGRAM_N),
    "ngram-mod": ("spec_ngram_mod_n_max", "spec_ngram_mod_n_min", LLAMA_DEFAULT_NGRAM_MOD_N_MIN),
    "ngram-cache": ("spec_draft_n_max", None, None),
    "draft-simple": ("spec_draft_n_max", None, None),
    "draft-eagle3": ("spec_draft_n_max", None, None),
    "draft-mtp": ("spec_draft_n_max", None, None),
}
# Fixed flags whose value is a file llama-server reads at start-up.
FILE_FLAGS = ("chat_template_file", "grammar_file", "mmproj", "lora")
# Settings that never become a flag of their own.
_SKIP = (STEPS, TOPK, DRAFT, MEM, "max_running_requests")


def spec_type(cfg: BackendConfig) -> str | None:
    """llama.cpp's `--spec-type` for this backend config (None: no speculation)."""
    algo = (cfg.speculative_algorithm or "").strip().lower().replace("_", "-")
    if not algo or algo == "none":
        return None
    algo = SPEC_ALIASES.get(algo, algo)
    if algo not in SPEC_TYPES:
        allowed = ", ".join(sorted(set(SPEC_TYPES) | set(SPEC_ALIASES)))
        raise ConfigError(f"backend.speculative_algorithm = {cfg.speculative_algorithm!r}: "
                          f"llama.cpp takes one of {allowed}")
    if algo.startswith("draft-") and not cfg.draft_model_path:
        raise ConfigError(f"backend.speculative_algorithm = {cfg.speculative_algorithm!r} "
                          f"needs backend.draft_model_path (a GGUF draft model)")
    return algo


class LlamaCppBackend:
    name = "llamacpp"
    health_path = "/health"
    # Kept verbatim by scripts/device/engine_readings.py; in flight: the gauges in /metrics.
    raw_paths: ClassVar[tuple[tuple[str, str], ...]] = (
        ("props.json", "/props"), ("health.txt", "/health"), ("slots.json", "/slots"))
    load_path: ClassVar[str] = "/metrics"
    # llama-server (cpp-httplib) closes the connection after every streamed response although
    # it answers "Keep-Alive": a client that puts the connection back in its pool gets
    # "Server disconnected" on the next request. Saying "Connection: close" avoids the reuse.
    request_headers: ClassVar[Mapping[str, str]] = {"Connection": "close"}
    busy_gauges: ClassVar[tuple[str, ...]] = ("llamacpp:requests_processing",
                                              "llamacpp:requests_deferred")
    # llama-server's own words (0.3.36 on this machine, tests/data/llamacpp-0.3.36): a context
    # whose cache does not fit ends "failed to initialize the context: failed to allocate
    # buffer for kv cache"; a bad value or flag is refused by its own parser with exit 1
    # ('error while handling argument "--parallel": stoi', 'error: invalid argument: --x').
    # Beyond these, what every server prints (the CUDA runtime's "out of memory", exit codes).
    failure_patterns: ClassVar[FailurePatterns] = FailurePatterns(
        kv_memory=(r"failed to allocate buffer for kv cache",),
        arg_lines=(r'^error while handling argument "', r"^error: invalid argument: "))
    # The final chunk's `timings` (beside `usage`) holds the request's draft counters.
    stream_format: ClassVar[StreamFormat] = StreamFormat(
        side_objects=("timings",), accepted=("draft_n_accepted",), drafted=("draft_n",))
    # POST /tokenize: a ShareGPT sample's lengths in the model's tokens (tokenize_endpoint.py)
    tokenize: ClassVar[TokenizeEndpoint | None] = LLAMA_SERVER

    def program(self, cfg: BackendConfig) -> str:
        if cfg.binary:
            return expand_path(cfg.binary)
        built = llama_server_path()
        if built.is_file():
            return str(built)
        return shutil.which("llama-server") or "llama-server"

    def validate(self, cfg: BackendConfig) -> None:
        """Raise ConfigError for a config this backend cannot serve (call before a search)."""
        spec_type(cfg)

    def local_files(self, cfg: BackendConfig) -> list[LocalFile]:
        """`--model` (always a local GGUF: llama-server downloads nothing with it), the draft
        of a draft-* speculation, and the fixed flags that name files."""
        gguf = "a GGUF model file"
        files = [LocalFile("backend.model_path", cfg.model_path, expand_path(cfg.model_path),
                           f"{gguf} (llama-server --model)", file_only=True)]
        kind = spec_type(cfg)
        if kind is not None and kind.startswith("draft-") and cfg.draft_model_path:
            files.append(LocalFile("backend.draft_model_path", cfg.draft_model_path,
                                   expand_path(cfg.draft_model_path),
                                   f"{gguf} (llama-server --spec-draft-model)", file_only=True))
        for name in FILE_FLAGS:
            value = cfg.flags.get(name)
            if isinstance(value, str):
                files.append(LocalFile(f"backend.flags.{name}", value, expand_path(value),
                                       f"a file (llama-server {_flag(name)})", file_only=True))
        return files

    def spec_args(self, cfg: BackendConfig, params: Mapping[str, Any]) -> list[str]:
        """The speculation flags, with their length flags (see the module docstring)."""
        kind = spec_type(cfg)
        if kind is None or is_baseline(params):
            return []
        k = int(params[STEPS])
        length_flag, bound_flag, bound_default = SPEC_TYPES[kind]
        args = ["--spec-type", kind]
        if kind.startswith("draft-"):
            args += ["--spec-draft-model", expand_path(str(cfg.draft_model_path))]
        args += [_flag(length_flag), str(k)]
        if bound_flag is not None:
            bound = int(params.get(bound_flag, bound_default))
            args += [_flag(bound_flag), str(min(bound, k))]
        return args

    def server_args(self, cfg: BackendConfig, params: Mapping[str, Any]) -> list[str]:
        args = ["--model", expand_path(cfg.model_path)]
        if params.get("max_running_requests") is not None:
            args += ["--parallel", str(int(params["max_running_requests"]))]
        spec = self.spec_args(cfg, params)
        args += spec
        # Flags the speculation arguments already set are not repeated.
        owned = tuple(a[2:].replace("-", "_") for a in spec if a.startswith("--"))
        args += flag_args(params, skip=_SKIP + owned)
        if "metrics" not in params:
            args.append("--metrics")
        return args + list(cfg.extra_args)

    def argv(self, cfg: BackendConfig, params: Mapping[str, Any], port: int | str) -> list[str]:
        return ([self.program(cfg)] + self.server_args(cfg, params)
                + ["--host", cfg.host, "--port", str(port)])

    def env(self, cfg: BackendConfig, run_dir: str | None = None) -> dict[str, str]:
        env = dict(cfg.env)
        if cfg.api_key_env:
            # llama-server reads its key from LLAMA_API_KEY as from --api-key (common/arg.cpp):
            # the environment keeps it off argv.
            env[API_KEY_ENV] = os.environ.get(cfg.api_key_env, "")
        return env

    def launch_command(self, cfg: BackendConfig, params: Mapping[str, Any]) -> str:
        key = f' --api-key "${cfg.api_key_env}"' if cfg.api_key_env else ""
        return shlex.join(["llama-server"] + self.server_args(cfg, params)) + key

    def read_facts(self, base_url: str, timeout_s: float = 10.0,
                   headers: Mapping[str, str] | None = None) -> ServerFacts:
        """From `/props` (it wants the API key where one is set): `total_slots` (requests
        decoded together) and the context per slot; the KV budget is slots x per-slot context
        (llama.cpp splits its context evenly)."""
        try:
            props = get_json(base_url + "/props", timeout_s, headers)
        except httpread.READ_ERRORS as e:
            return ServerFacts(extra={FACTS_UNREAD: httpread.unread("/props", e)})
        if not isinstance(props, dict):
            return ServerFacts(extra={FACTS_UNREAD: "GET /props: not a JSON object"})
        gen = props.get("default_generation_settings")
        slot_ctx = _int(gen.get("n_ctx")) if isinstance(gen, dict) else None
        slots = _int(props.get("total_slots"))
        extra: dict[str, Any] = {"n_ctx_per_slot": slot_ctx}
        for key in ("build_info", "model_path"):
            if isinstance(props.get(key), str):
                extra[key] = props[key]
        if isinstance(props.get("model_path"), str):
            extra["model_name"] = Path(props["model_path"]).name
        return ServerFacts(
            max_total_num_tokens=slot_ctx * slots if slot_ctx and slots else None,
            max_running_requests=slots,
            extra=extra,
        )

    def in_flight(self, base_url: str, headers: Mapping[str, str] | None = None,
                  timeout_s: float = 5.0) -> int | None:
        # llama-server computes these from its slots when /metrics is asked (a metrics task on
        # its queue), so they are current (the engine tests' drain holds it).
        return speccounters.in_flight(base_url, self.busy_gauges, timeout_s, headers)

    def running_limit(self, facts: ServerFacts, params: Mapping[str, Any]) -> Any:
        # /props' slots (read_facts); where unread, the --parallel it was given.
        return facts.max_running_requests or params.get("max_running_requests")

    def refusal_advice(self, message: str) -> str:
        return ""

    def schedule_file(self, cfg: BackendConfig | None, ask: ScheduleAsk | None) -> None:
        return None     # llama.cpp reads no per-batch-size schedule: no format to write

    def schedule_params(self, cfg: BackendConfig, params: Mapping[str, Any],
                        config_path: str) -> tuple[dict[str, Any] | None, str]:
        return None, ("llama.cpp has no per-batch-size draft schedule: SGLang's adaptive mode "
                      "(and the simulator's copy of it) and vLLM's per-batch-size K boot from a "
                      "schedule file; the report writes the formats unvalidated")

    def memory_facts(self, log_text: str) -> dict[str, float]:
        return {}       # llama.cpp has no memory fraction to tune

    def metrics_snapshot(self, base_url: str, headers: Mapping[str, str] | None = None
                         ) -> dict[str, float] | None:
        return speccounters.scrape(base_url, METRICS_PREFIX, headers=headers)

    def window_acceptance(self, before: Mapping[str, float] | None,
                          after: Mapping[str, float] | None
                          ) -> tuple[float | None, tuple[int, ...]]:
        return speccounters.window(before, after, METRICS_PREFIX)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _int(value: Any) -> int | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return int(value)
    return None
