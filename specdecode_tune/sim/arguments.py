"""SGLang's argument checks, as the simulator runs them: what `python -m sglang.launch_server`
refuses before it loads anything, and the server args it normalizes.

`normalize_params(profile, params)` gives (args, warnings) or raises `StartupError` with an
SGLang-like message, in SGLang 0.5.10.post1's order (server_args.py `__post_init__`): the
algorithm's choices (argparse), the model-specific checks (a hybrid model's radix cache), then
`_handle_speculative_decoding` (the running cap, the triple, NGRAM's defaults). The memory
accounting and the draft tree of a boot are `boot.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specdecode_tune.errors import SpecTuneError
from specdecode_tune.sim import adaptive
from specdecode_tune.sim.profile import Profile

# SGLang 0.5.10's --speculative-algorithm choices. NEXTN runs as EAGLE. NGRAM drafts from an
# n-gram trie of the text so far, no draft model; SGLang refuses it off CUDA ("Ngram
# speculative decoding only supports CUDA device."), the simulator stands in for a CUDA server.
SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
NGRAM_DEFAULT_DRAFT_TOKENS = 12       # SGLang's default for NGRAM
NGRAM_DEFAULT_MAX_BFS_BREADTH = 10    # --speculative-ngram-max-bfs-breadth, NGRAM's topk
STARTUP_KINDS = ("invalid_args", "kv_memory", "oom", "crashed")
# The SGLang release the simulator imitates unless `--sglang-version` says another (the
# backends' DEFAULT_VERSION; a test holds the two equal). Only the adaptive mode depends on it.
EMULATED_VERSION = "0.5.10.post1"
SPEC_DEFAULT_MAX_RUNNING = 48     # SGLang's running cap with speculation and no flag
# Hybrid (linear-attention / mamba) architectures whose radix cache SGLang 0.5.10.post1 refuses
# to combine with speculation under the default --mamba-scheduler-strategy no_buffer
# (server_args.py `_handle_model_specific_adjustments` -> `_handle_mamba_radix_cache`,
# support_mamba_cache=True; GraniteMoeHybrid only with mamba layers, not listed).
RADIX_SPEC_REFUSED = ("Qwen3NextForCausalLM", "Qwen3_5MoeForConditionalGeneration",
                      "Qwen3_5ForConditionalGeneration", "NemotronHForCausalLM",
                      "FalconH1ForCausalLM", "JetNemotronForCausalLM",
                      "JetVLMForConditionalGeneration", "Lfm2ForCausalLM")


class StartupError(SpecTuneError):
    """The simulated server cannot start; `kind` names why (a subset of START_FAILURE_KINDS).

    `raised_in` = (SGLang source file, line, function) for a refusal SGLang raises as an
    exception from its argument checks rather than argparse's exit 2: the CLI prints it as a
    traceback ending in that frame, and exits 1, as Python does."""

    def __init__(self, kind: str, message: str,
                 raised_in: tuple[str, int, str] | None = None) -> None:
        if kind not in STARTUP_KINDS:
            raise ValueError(f"kind must be one of {STARTUP_KINDS}, got {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.raised_in = raised_in

    @property
    def exit_code(self) -> int:
        # argparse exits 2 on bad arguments; an exception during start-up exits 1.
        return 2 if self.kind == "invalid_args" and self.raised_in is None else 1

    def log_text(self) -> str:
        """What the server prints for it: the message, or a traceback ending in it."""
        if self.raised_in is None:
            return self.message
        path, line, func = self.raised_in
        return ("Traceback (most recent call last):\n"
                '  File "sglang/launch_server.py", line 59, in <module>\n'
                "    server_args = prepare_server_args(sys.argv[1:])\n"
                f'  File "{path}", line {line}, in {func}\n'
                f"{self.message}")



def _int_arg(params: Mapping[str, Any], key: str, default: int | None, low: int) -> int | None:
    value = params.get(key)
    if value is None:      # absent, or given as None: the default
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise StartupError("invalid_args", f"error: --{key.replace('_', '-')} = {value!r}: "
                                           f"must be an integer >= {low}")
    return value


def normalize_params(profile: Profile, params: Mapping[str, Any]
                     ) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Apply defaults and SGLang's argument rules; returns (args, warnings) or raises
    StartupError."""
    d = profile.defaults
    warnings: list[str] = []
    out = dict(params)
    version = str(params.get("sglang_version") or EMULATED_VERSION)
    _adaptive_flags_known(params, version)
    algo = params.get("speculative_algorithm")
    algo = None if algo in (None, "", "NONE", "None") else str(algo)
    if algo is not None and algo not in SPEC_ALGORITHMS:
        raise StartupError(
            "invalid_args",
            f"error: argument --speculative-algorithm: invalid choice: {algo!r} "
            f"(choose from {', '.join(SPEC_ALGORITHMS)})",
        )
    arch = profile.architecture
    if algo is not None and arch in RADIX_SPEC_REFUSED and not params.get("disable_radix_cache"):
        # SGLang's words (server_args.py L2204-2209, sic: no space after the first period).
        raise StartupError(
            "invalid_args",
            f"ValueError: Speculative decoding for {arch} is not compatible with radix cache "
            "when using --mamba-scheduler-strategy no_buffer.To use radix cache with "
            "speculative decoding, please use --mamba-scheduler-strategy extra_buffer and set "
            "SGLANG_ENABLE_SPEC_V2=1.",
            raised_in=("sglang/srt/server_args.py", 2206, "_handle_mamba_radix_cache"))
    steps = _int_arg(params, "speculative_num_steps", None, 0)
    if algo is None or steps == 0:
        algo, steps, topk, draft = None, 0, 1, 1
    if algo == "NEXTN":
        algo = "EAGLE"
    running = _running_flag(params, algo, warnings)
    if algo == "NGRAM":
        steps, topk, draft = _ngram_numbers(params, steps, warnings)
    elif algo is not None:
        steps, topk, draft = _spec_numbers(profile, params, steps, warnings)
    frac = params.get("mem_fraction_static")
    frac = d.mem_fraction_static if frac is None else frac
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac < 1:
        raise StartupError("invalid_args",
                           f"error: --mem-fraction-static = {frac!r}: must be in (0, 1)")
    out.update(
        speculative_algorithm=algo,
        speculative_num_steps=steps if algo else None,   # NGRAM: as given (SGLang's None)
        speculative_eagle_topk=topk if algo else None,
        speculative_num_draft_tokens=draft if algo else None,
        mem_fraction_static=float(frac),
        tp_size=_int_arg(params, "tp_size", profile.hardware.tp_size, 1),
        cuda_graph_max_bs=_int_arg(params, "cuda_graph_max_bs", d.cuda_graph_max_bs, 1),
        max_running_requests=running,
        disable_radix_cache=bool(params.get("disable_radix_cache")),
    )
    if out.get("speculative_adaptive"):
        out.update(_adaptive_numbers(out, warnings))
    return out, tuple(warnings)


def _adaptive_flags_known(params: Mapping[str, Any], version: str) -> None:
    """argparse's refusal of the adaptive flags where the emulated release has none; the
    flat-object config of 0.5.11 and 0.5.12 is not imitated (refused, saying so)."""
    given = [f"--{k.replace('_', '-')}" for k in ("speculative_adaptive",
                                                  "speculative_adaptive_config")
             if params.get(k) not in (None, False)]
    if not given:
        return
    key = adaptive.release_key(version)
    if key < adaptive.ADAPTIVE_FLAGS_SINCE:
        raise StartupError("invalid_args",
                           f"error: unrecognized arguments: {' '.join(given)} (SGLang "
                           f"{version} has no adaptive mode; it comes in 0.5.11)")
    if key < adaptive.ADAPTIVE_PER_BATCH_SIZE_SINCE:
        raise StartupError("invalid_args",
                           f"error: SGLang {version} reads --speculative-adaptive-config as "
                           f"one flat object; the simulator imitates the per-batch-size "
                           f"format of SGLang >= 0.5.13 only (--sglang-version)")


def _adaptive_numbers(args: Mapping[str, Any], warnings: list[str]) -> dict[str, Any]:
    """SGLang's `_maybe_disable_adaptive` then `_init_adaptive_speculative_params`: the mode
    off (with SGLang's warning) where it is unsupported, else the schedule loaded, the steps
    checked against its candidates and draft tokens = steps + 1."""
    algo, topk = args["speculative_algorithm"], args["speculative_eagle_topk"]
    why = adaptive.unsupported_reason(algo, topk)
    if why is not None:
        warnings.append(f"speculative_adaptive disabled: {why}. Falling back to static "
                        f"speculative params.")
        return {"speculative_adaptive": False, "adaptive_schedule": None}
    path = args.get("speculative_adaptive_config")
    if not path:
        raise StartupError("invalid_args",
                           "error: --speculative-adaptive without --speculative-adaptive-config"
                           ": the simulator has no copy of SGLang's built-in EMA config")
    try:
        sched = adaptive.load_schedule(str(path), int(args["cuda_graph_max_bs"]))
    except adaptive.AdaptiveConfigError as e:
        raise StartupError("invalid_args", f"ValueError: {e}",
                           raised_in=("sglang/srt/speculative/adaptive_spec_params.py", 0,
                                      "_load_adaptive_config")) from None
    cands = list(sched.candidate_steps)
    steps = args["speculative_num_steps"]
    if steps is None:
        steps = cands[len(cands) // 2]
    if steps not in cands:
        raise StartupError(
            "invalid_args",
            f"ValueError: --speculative-num-steps={steps} is not in the adaptive config "
            f"candidate_steps {cands}. Pass one of those values.",
            raised_in=("sglang/srt/arg_groups/speculative_hook.py", 0,
                       "_init_adaptive_speculative_params"))
    return {"speculative_num_steps": steps, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": steps + 1, "adaptive_schedule": sched}


def _running_flag(params: Mapping[str, Any], algo: str | None, warnings: list[str]
                  ) -> int | None:
    """--max-running-requests as SGLang leaves it: with speculation and no flag, 48 (with its
    warning; `_handle_speculative_decoding`). The scheduler then takes the lower of this and
    what memory allows."""
    flag = _int_arg(params, "max_running_requests", None, 1)
    if flag is None and algo is not None:
        warnings.append("Max running requests is reset to 48 for speculative decoding. You can "
                        "override this by explicitly setting --max-running-requests.")
        return SPEC_DEFAULT_MAX_RUNNING
    return flag


def _ngram_numbers(params: Mapping[str, Any], steps: int | None, warnings: list[str]
                   ) -> tuple[int | None, int, int]:
    """(steps as given, topk, draft tokens) for NGRAM as SGLang sets them: topk is the trie's
    --speculative-ngram-max-bfs-breadth, draft tokens 12 unless given (with its warning)."""
    topk = _int_arg(params, "speculative_ngram_max_bfs_breadth", None, 1) \
        or NGRAM_DEFAULT_MAX_BFS_BREADTH
    draft = _int_arg(params, "speculative_num_draft_tokens", None, 1)
    if draft is None:
        warnings.append("speculative_num_draft_tokens is set to 12 by default for ngram "
                        "speculative decoding. You can override this by explicitly setting "
                        "--speculative-num-draft-tokens.")
        draft = NGRAM_DEFAULT_DRAFT_TOKENS
    if draft < 2:
        raise StartupError("invalid_args",
                           f"error: --speculative-num-draft-tokens = {draft}: must be >= 2")
    return steps, topk, draft


def _spec_numbers(
    profile: Profile, params: Mapping[str, Any], steps: int | None, warnings: list[str]
) -> tuple[int, int, int]:
    """(steps, topk, draft tokens) under SGLang's rules: all three or none; topk 1 forces a
    chain."""
    topk = _int_arg(params, "speculative_eagle_topk", None, 1)
    draft = _int_arg(params, "speculative_num_draft_tokens", None, 1)
    if steps is None and topk is None and draft is None:   # SGLang chooses them itself
        d = profile.defaults
        return d.speculative_num_steps, d.speculative_eagle_topk, d.speculative_num_draft_tokens
    if steps is None or topk is None or draft is None:
        raise StartupError(
            "invalid_args",
            "error: --speculative-num-steps, --speculative-eagle-topk and "
            "--speculative-num-draft-tokens must be set together or not at all "
            f"(got steps={steps}, topk={topk}, draft tokens={draft})",
        )
    if topk == 1 and draft != steps + 1:
        warnings.append(
            f"speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 = {steps + 1} "
            f"(was {draft}) because speculative_eagle_topk == 1"
        )
        draft = steps + 1
    if draft < 2:
        raise StartupError("invalid_args",
                           f"error: --speculative-num-draft-tokens = {draft}: must be >= 2")
    return steps, topk, draft
