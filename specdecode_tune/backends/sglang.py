"""SGLang (`python -m sglang.launch_server`); the simulator, which takes the same flags, is
backends/sim.py.

SGLang's rules that shape the argv (docs/engines-sglang.md): the three speculative numbers are
passed together or not at all (the baseline passes none, nor the algorithm); any other searched
or fixed setting is passed as `--name-with-dashes value`, a true boolean as a bare flag.

What differs between SGLang releases lives here too (docs/engines-sglang.md, each fact with
its source): the backend knows the release its servers run (`engine_version`: the experiment's
`backend.engine_version`, else the sglang installed in this Python, else `DEFAULT_VERSION`, the
release the project's contract tests run) and emits only what that release accepts.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
import urllib.error
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any, ClassVar

from ..config import BackendConfig
from ..enginecache import expand_path
from ..errors import ConfigError
from ..records import FACTS_UNREAD, GRAPH_MEMORY, MEMORY_ROOM, ServerFacts
from ..space import DRAFT, STEPS, TOPK, is_baseline
from . import httpread, prometheus, speccounters
from .common import at_least, flag_args, get_json
from .failurepatterns import FailurePatterns
from .files import LocalFile, hub_or_local
from .schedule import NOTHING, ScheduleAsk, ScheduleFile, Slots, check_slots
from .streamformat import NativeApi, PromptFields, StreamFormat, check_error_event

# SGLang's start-up failures (docs/engines-sglang.md section 12 has each line's source, per
# release): the memory pool checks (the KV pool, or a hybrid model's state cache, left after
# the weights cannot hold a request), and the argument checks, which assert or raise ValueError
# in server_args.py (0.5.10.post1) or, from 0.5.13, in arg_groups/*.py (the speculative ones:
# arg_groups/speculative_hook.py, called from server_args.py). Every pattern is kept whatever
# the release: a line of one release never means another thing in another.
# Its out-of-memory lines are PyTorch's (the classifier knows those for every engine; a capture
# that runs out says "Capture cuda graph failed: CUDA out of memory. ..." in every release);
# its hints say "out-of-memory", "an OOM problem" and "This is not an out-of-memory error",
# which must not count.
FAILURE_PATTERNS = FailurePatterns(
    kv_memory=(
        # 0.5.10.post1 model_runner_kv_cache_mixin.py L57; 0.5.17 pool_configurator.py L64 (a
        # budget that rounds to no token)
        r"Not enough memory\. Please try to increase --mem-fraction-static",
        # 0.5.14+ (0.5.17 mem_cache/kv_cache_configurator.py L1648): the weights (target and
        # draft) leave no budget; 0.5.10.post1 said "Not enough memory" for this too
        r"Loaded weights leave no GPU memory for the KV cache",
        # 0.5.13+ (0.5.17 kv_cache_configurator.py L1964, L1754): a hybrid model's state cache
        r"Not enough GPU memory for hybrid \(mamba/linear-attention\) state cache",
        r"state cache is too small to serve any requests",
        # 0.5.14+ (0.5.17 pool_configurator.py L576): sliding-window models
        r"leaves no room for the full KV pool",
    ),
    arg_exceptions=("AssertionError",),
    arg_check_files=(r"server_args\.py", r"arg_groups[/\\]\w+\.py"),
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


# The speculative fields of a finished request's last /generate chunk (tokenizer_manager.py
# `_calculate_spec_decoding_metrics`: 0.5.10.post1 L1902-1943, 0.5.17 L2739-2818), by the
# release that first writes them, newest first: (since, accepted draft tokens, proposed draft
# tokens, histogram), each the names it writes, its own first, the old ones it keeps as
# aliases after. Every release also writes `spec_verify_ct` and `spec_accept_length`
# (= completion_tokens / spec_verify_ct). The meanings are the same in all: accepted = draft
# tokens the target took (the bonus token not counted), proposed = spec_verify_ct times
# (--speculative-num-draft-tokens - 1) as the server was started (under the adaptive schedule
# that is the starting steps', not what each step drafted), histogram index j = this request's
# verify steps that took exactly j draft tokens (0.5.10.post1 eagle_info.py L430-433, 0.5.17
# batch_result_processor.py L636, L685-689).
SPEC_FIELD_NAMES: tuple[tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]], ...] = (
    ("0.5.12", ("spec_num_correct_drafts", "spec_accepted_drafts"),
     ("spec_num_proposed_drafts", "spec_proposed_drafts"),
     ("spec_correct_drafts_histogram", "spec_accept_histogram")),
    ("0.5.11", ("spec_accepted_drafts",), ("spec_proposed_drafts",), ("spec_accept_histogram",)),
    ("0", ("spec_accept_token_num",), ("spec_draft_token_num",), ("spec_accept_histogram",)),
)


def spec_field_names(version: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(accepted, proposed, histogram) names that release `version` writes."""
    return next(row[1:] for row in SPEC_FIELD_NAMES if at_least(version, row[0]))


def _every(i: int) -> tuple[str, ...]:
    return tuple(dict.fromkeys(name for row in SPEC_FIELD_NAMES for name in row[i]))


# What SGLang streams: its own /generate API beside the OpenAI ones, and per request (in
# /generate's meta_info) its speculative counters, under the names of every release above,
# the newest first (the load generator takes the first present, so one format reads them all).
STREAM_FORMAT = StreamFormat(
    native_apis=(NativeApi("generate", "/generate", generate_body, interpret_generate),),
    verify_ct=("spec_verify_ct",),
    accepted=_every(1),
    drafted=_every(2),
    histogram=_every(3),
)

# The release the contract tests parse with (tests/contract, scripts/install_sglang_cpu.sh) and
# the simulator imitates; the default when nothing says which release the servers run.
DEFAULT_VERSION = "0.5.10.post1"
# --speculative-adaptive / --speculative-adaptive-config exist from 0.5.11 (argparse refuses
# them before: exit 2); the per-batch-size file the report writes (keys = batch sizes, each
# {"candidate_steps": [...]}) is read from 0.5.13 (0.5.11-0.5.12 take one flat object).
ADAPTIVE_FLAGS_SINCE = "0.5.11"
ADAPTIVE_PER_BATCH_SIZE_SINCE = "0.5.13"

# Hybrid (linear-attention / mamba) architectures whose speculation SGLang refuses with radix
# cache on under the default --mamba-scheduler-strategy no_buffer, at argument checking
# (server_args.py `_handle_mamba_radix_cache`, 0.5.10.post1 to 0.5.13; from 0.5.14 its
# --mamba-radix-cache-strategy auto picks a buffer itself). Qwen3.5-MoE, the seed's, is one.
RADIX_SPEC_REFUSED = ("Qwen3NextForCausalLM", "Qwen3_5MoeForConditionalGeneration",
                      "Qwen3_5ForConditionalGeneration", "NemotronHForCausalLM",
                      "FalconH1ForCausalLM", "JetNemotronForCausalLM",
                      "JetVLMForConditionalGeneration", "Lfm2ForCausalLM")
RADIX_SPEC_ALLOWED_SINCE = "0.5.14"

# Flags SGLang renamed (docs/engines-sglang.md section 1): from 0.5.14 `--cuda-graph-max-bs` is
# `--cuda-graph-max-bs-decode` (the old name a deprecated alias through 0.5.18; from 0.5.20
# argparse's prefix matching refuses it as ambiguous with `--cuda-graph-max-bs-prefill`) and
# `--mamba-scheduler-strategy` is `--mamba-radix-cache-strategy` (same values plus `auto`;
# the old name gone from 0.5.20). The experiment keeps one name, the one 0.5.10 has; the
# backend writes the one the servers' release takes.
RENAMED_FLAGS = {"cuda_graph_max_bs": ("0.5.14", "cuda_graph_max_bs_decode"),
                 "mamba_scheduler_strategy": ("0.5.14", "mamba_radix_cache_strategy")}

# SGLang's own argument check (backends/sglang_argcheck.py), run by the servers' Python.
ARGCHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sglang_argcheck.py")
ARGCHECK_TIMEOUT_S = 300.0


def radix_spec_refusal(arch: str) -> str:
    """SGLang's words for that refusal (sic: no space after the first period)."""
    return (f"Speculative decoding for {arch} is not compatible with radix cache when using "
            "--mamba-scheduler-strategy no_buffer.To use radix cache with speculative decoding, "
            "please use --mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1.")


def local_architecture(model_path: str) -> str | None:
    """`architectures[0]` of a local model folder's config.json, or None (a hub id, a path not
    on this machine, no readable config)."""
    path = os.path.join(os.path.expandvars(os.path.expanduser(model_path)), "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            archs = json.load(f).get("architectures")
    except (OSError, ValueError, AttributeError):
        return None
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None




@functools.cache
def installed_version() -> str | None:
    """The sglang release installed in this Python, or None (read once)."""
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


_SPEC_FLAGS = ((STEPS, "--speculative-num-steps"), (TOPK, "--speculative-eagle-topk"),
               (DRAFT, "--speculative-num-draft-tokens"))


def renamed(params: Mapping[str, Any], version: str) -> dict[str, Any]:
    """`params` with the flags `version` renamed under their new names (RENAMED_FLAGS)."""
    out: dict[str, Any] = {}
    for name, value in params.items():
        since, new = RENAMED_FLAGS.get(name, ("", ""))
        out[new if since and at_least(version, since) else name] = value
    return out


@functools.cache
def python_sglang_version(python: str) -> str | None:
    """The sglang release installed for another Python, or None (read once per Python)."""
    try:
        out = subprocess.run([python, "-c", "import importlib.metadata as m; "
                              "print(m.version('sglang'))"], capture_output=True, text=True,
                             timeout=60, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split()
    return lines[-1] if out.returncode == 0 and lines else None


@functools.cache
def _argcheck(python: str, job: str) -> dict[str, Any]:
    """SGLang's answers for a job (JSON) run by `python`; cached: a search asks about the
    same command line again (re-measurements, resumed trials)."""
    try:
        out = subprocess.run([python, ARGCHECK], input=job, capture_output=True, text=True,
                             timeout=ARGCHECK_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"sglang": None, "error": f"the argument check did not run: {e}"}
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        err = [ln for ln in out.stderr.splitlines() if ln.strip()]
        return {"sglang": None, "error": f"the argument check failed (exit status "
                                         f"{out.returncode}): {err[-1] if err else 'no output'}"}
    return answer


def _without_endpoint(args: list[str]) -> list[str]:
    """Server arguments without `--host`/`--port` (the trial's port is a placeholder here)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("--host", "--port"):
            skip = True
        else:
            out.append(a)
    return out


# SGLang's memory lines: each rank logs the free memory of its GPU ("avail mem=X GB", X in
# 2**30 bytes, read after emptying the allocator's cache) before it loads weights, and after
# each CUDA graph capture with what that capture kept. "Load weight begin. avail mem=X GB" is
# the same in every release (0.5.10.post1 model_runner.py L1075, 0.5.17 L1012); the first one
# of a rank is the target's (the draft model loads after it). The capture's end line:
# - 0.5.10.post1 to 0.5.13: "Capture cuda graph end. Time elapsed: T s. mem usage=K GB. avail
#   mem=X GB." (model_runner.py L2460-2461; the piecewise prefill graphs' L2574-2575; the EAGLE
#   draft worker's "Capture draft cuda graph end. ..." and "Capture draft extend cuda graph
#   end. ...", eagle_worker.py L257, L272): a period after the usage.
# - from 0.5.14 (`CAPTURE_COMMA_SINCE`): one line per graph kind, a comma after the usage:
#   "Capture target verify CUDA graph end. elapsed=T s, mem usage=K GB, avail mem=X GB." (0.5.17
#   model_runner_components/cuda_graph_setup.py L453-455: "{target|draft} {decode|verify}";
#   L374-376: "target prefill" / "draft prefill"; eagle_worker_v2.py L384-387 "draft decode",
#   L479-482 "draft extend"; multi-layer EAGLE's per-step draft extend,
#   multi_layer_eagle_draft_extend_cuda_graph_runner.py L602-605, L905-907).
# Both forms are read. From 0.5.12 the draft worker writes its own captures' lines (draft
# decode, draft extend) on TP rank 0 only (`log_info_on_rank0`; 0.5.17 eagle_worker_v2.py L362,
# L382, L455, L477), after the lines every rank writes, so with tp > 1 the other ranks' logs
# stop short: their missing captures are taken as TP0's (the draft is sharded alike), their
# usage taken off the rank's last reading and added to what its captures kept.
# The rank tags come from SGLang's log prefix ("[%(asctime)s DP0 PP0 ATTN_CP0 MOE_DP0 TP1 EP1]",
# configure_logger's prefix as the scheduler builds it; the same in 0.5.17, scheduler.py
# L4846-4856).
CAPTURE_COMMA_SINCE = "0.5.14"
_LOAD_BEGIN = re.compile(r"Load weight begin\. avail mem=([0-9.]+) GB")
_CAPTURE_END = re.compile(r"Capture [^\n]*? end\. [^\n]*?mem usage=(-?[0-9.]+) GB[.,] "
                          r"avail mem=([0-9.]+) GB")
_RANK = re.compile(r"\b([A-Z][A-Z_]*\d+)\b")


def memory_facts(log_text: str) -> dict[str, float]:
    """records.MEMORY_ROOM and GRAPH_MEMORY from a boot's log: the free memory after the last
    CUDA graph capture, and the memory the captures kept (their "mem usage" summed), over the
    free memory before the weights, on the rank with the least room; {} where the log has no
    capture line (CUDA graphs off, a CPU server). A rank whose log lacks the last captures of
    the rank with the most (SGLang >= 0.5.12 logs the draft's on TP0 only) is given that
    rank's usage for them.

    SGLang sizes its static pool as mem_fraction_static times the memory free at start-up (the
    rest outside the pool is that times 1 - mem_fraction_static: `profile_max_num_token`;
    0.5.17 kv_cache_configurator.py `_profile_available_bytes`, where the draft's weights are
    in the pool too), so adding r to the fraction takes r times that memory from what the
    capture had: the room is how far the fraction could have risen, at most. Not the boundary
    itself: the warm-up passes before each capture use memory they free before the reading."""
    first: dict[str, float] = {}
    captures: dict[str, list[tuple[float, float]]] = {}    # (mem usage, avail mem) per line
    for line in log_text.splitlines():
        head = line[:line.find("]") + 1] if line.startswith("[") else ""
        rank = " ".join(_RANK.findall(head))
        if (m := _LOAD_BEGIN.search(line)) is not None:
            first.setdefault(rank, float(m.group(1)))
        elif (m := _CAPTURE_END.search(line)) is not None and rank in first:
            captures.setdefault(rank, []).append((max(0.0, float(m.group(1))),
                                                  float(m.group(2))))
    if not captures:
        return {}
    fullest = max(captures.values(), key=len)
    room: dict[str, tuple[float, float]] = {}
    for rank, lines in captures.items():
        if first[rank] <= 0:
            continue
        unseen = sum(usage for usage, _ in fullest[len(lines):])
        room[rank] = ((lines[-1][1] - unseen) / first[rank],
                      (sum(usage for usage, _ in lines) + unseen) / first[rank])
    if not room:
        return {}
    left, graphs = min(room.values())
    return {MEMORY_ROOM: round(max(0.0, left), 6), GRAPH_MEMORY: round(graphs, 6)}


V1_LOADS = "/v1/loads?include=core"
METRICS_TIMEOUT_S = 1.5
NO_CRASH_DIAGNOSTICS = {"SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0",
                        "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0"}
GENERATED = "sglang:generation_tokens_total"
VERIFY_CALLS = "sglang:spec_verify_calls_total"


def spec_counters(samples: Sequence[prometheus.Sample]) -> dict[str, float] | None:
    """The two counters of a /metrics page whose deltas give a window's acceptance (each
    summed over its labels), or None where the release writes no verify-call counter."""
    found = {name: prometheus.total(samples, name) for name in (GENERATED, VERIFY_CALLS)}
    gen, calls = found[GENERATED], found[VERIFY_CALLS]
    return None if gen is None or calls is None else {GENERATED: gen, VERIFY_CALLS: calls}


def _load_count(body: Any, keys: tuple[str, ...]) -> int | None:
    """Requests running or waiting, summed over the DP ranks of a /v1/loads (its `loads`) or
    /get_load answer; None where a rank lacks a count."""
    ranks = body["loads"] if isinstance(body, dict) and "loads" in body else body
    if isinstance(ranks, dict):
        ranks = [ranks]
    if not isinstance(ranks, list) or not ranks:
        return None
    total = 0
    for rank in ranks:
        for key in keys:
            n = rank.get(key) if isinstance(rank, dict) else None
            if not isinstance(n, int) or isinstance(n, bool):
                return None
            total += n
    return total


# The per-batch-size schedule file (`schedule_file`): SGLang `--speculative-adaptive-config`
# (with `--speculative-adaptive`), as read in the stored sgl-project/sglang sources. Released
# wheels: the flags exist from 0.5.11 and read this format from 0.5.13 (docs/engines-sglang.md
# section 3), so the command is given only where `schedule_params` says the servers' release
# takes it. The flag takes the PATH of a JSON file ("Path to a JSON config file for adaptive
# speculative decoding tuning knobs", `python/sglang/srt/arg_groups/fields/spec.py`, commit
# 015c8726). `python/sglang/srt/speculative/adaptive_spec_params.py` (commit 015c8726),
# `_load_adaptive_config`: the keys that are integer strings are batch sizes, each
# `{"candidate_steps": [non-negative ints], ...}` (optional `ema_alpha`, `update_interval`,
# `warmup_batches`, `up_hysteresis`, `down_hysteresis`, `ceiling_coeff`); a top-level
# `"strategy"` is "ema" (default) or "throughput_aware" (in the stored source, in no wheel up to
# 0.5.23; none is written here); `adaptive_unsupported_reason` refuses adaptive mode unless
# topk = 1 and the algorithm is EAGLE/EAGLE3. `adaptive_step_router.py` (commit a12239f6) routes
# a batch to the largest key <= its size after CUDA-graph padding (the first key below that).
# `_init_adaptive_speculative_params` in `arg_groups/speculative_hook.py` (commit 004c82e0):
# `--speculative-num-steps` must be in the union of the candidate steps, and draft tokens become
# steps + 1. A slot with one candidate never moves: a fixed per-level schedule.
SCHEDULE_FILE = "sglang-adaptive-config.json"
SCHEDULE_TITLE = "SGLang: --speculative-adaptive-config"
SCHEDULE_ABOUT = (
    f"A JSON file (written next to this report as `{SCHEDULE_FILE}`), passed "
    f"with `--speculative-adaptive --speculative-adaptive-config PATH` (SGLang >= 0.5.13 "
    f"reads this format); topk = 1 only. "
    f"Keys are batch sizes: SGLang uses the largest key <= the batch size (after "
    f"CUDA-graph padding); one candidate per key pins that level's steps. Format as "
    f"read in sgl-project/sglang `speculative/adaptive_spec_params.py`.")


def adaptive_config(slots: Slots) -> dict[str, Any]:
    """SGLang's adaptive-config JSON: one candidate per slot (a fixed schedule)."""
    check_slots(slots)
    return {str(start): {"candidate_steps": [steps]} for start, steps in slots}


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
        cases = [{"argv": _without_endpoint(list(a[head:])), "env": self.env(cfg)}
                 for a in argvs]
        answer = _argcheck(python, json.dumps({"cases": cases, "cpu_if_no_gpu": True},
                                              sort_keys=True))
        found = answer.get("cases")
        if not isinstance(found, list) or len(found) != len(argvs):
            return [None] * len(argvs)
        return [None if a.get("ok") or not a.get("refused") else
                f"backend: SGLang {answer.get('sglang')}'s own argument check refuses the "
                f"command line: {a.get('error')}" for a in found]

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
                return _load_count(get_json(base_url + V1_LOADS, timeout_s, headers),
                                   ("num_running_reqs", "num_waiting_reqs"))
            except urllib.error.HTTPError as e:
                if e.code != 404:
                    return None
                self._no_v1_loads.add(base_url)
            except (OSError, ValueError):
                return None
        try:
            return _load_count(get_json(f"{base_url}/get_load", timeout_s, headers),
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
