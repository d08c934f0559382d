"""What a peer's server command asks for: `vllm serve ...` or `python -m sglang.launch_server ...`
argv read into the landscape's axis names (issue 34).

Standard library only: the stand-in engine (`benchmarks/peer_engine.py`) and the drivers that
run a peer's own code in the peer's virtual environment (`benchmarks/peer_drivers/`) both parse
the argv the peer built with this one function, so a boot is the same point on both sides.

The settings use the landscape's axis names (`specdecode_tune.space`): steps
(`speculative_num_steps`), topk, draft tokens, the memory fraction, and llama.cpp's n-gram size
where a recorded table has it. What vLLM calls them:

- `--speculative-config JSON`: `num_speculative_tokens` is steps (vLLM drafts a chain: topk 1);
  `prompt_lookup_max` is the n-gram size (vLLM's default when absent: `VLLM_NGRAM_DEFAULT`);
  no config (or K 0) is the no-speculation baseline;
- `--gpu-memory-utilization` is the memory fraction (vLLM's default 0.9 when absent).

SGLang's flags are the axes' own names (`--speculative-num-steps` ...).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

STEPS = "speculative_num_steps"
TOPK = "speculative_eagle_topk"
DRAFT = "speculative_num_draft_tokens"
MEM = "mem_fraction_static"
NGRAM_N = "spec_ngram_simple_size_n"
VLLM_MEM_DEFAULT = 0.9            # vLLM's --gpu-memory-utilization default
VLLM_NGRAM_DEFAULT = 5            # vLLM's prompt_lookup_max for method ngram when not given
DEFAULT_PORT = {"vllm": 8000, "sglang": 30000}


def _flags(argv: Sequence[str]) -> tuple[list[str], dict[str, str | bool]]:
    """Positional words and `--flag value` / `--flag=value` / bare `--flag` (True)."""
    pos: list[str] = []
    flags: dict[str, str | bool] = {}
    i = 0
    while i < len(argv):
        a = str(argv[i])
        if a.startswith("--"):
            name, eq, val = a[2:].partition("=")
            name = name.replace("-", "_")
            if eq:
                flags[name] = val
            elif i + 1 < len(argv) and not str(argv[i + 1]).startswith("--"):
                flags[name] = str(argv[i + 1])
                i += 1
            else:
                flags[name] = True
        else:
            pos.append(a)
        i += 1
    return pos, flags


def parse(argv: Sequence[str]) -> dict[str, Any]:
    """{"engine", "model", "host", "port", "settings": {axis name: value}, "flags"} for a
    `vllm serve MODEL ...` argv (the executable's own name first or left out) or an SGLang
    `launch_server` argv (`python -m sglang.launch_server ...` or its flags alone, with
    `--model-path`). ValueError where the argv is neither or its speculative config is not
    JSON."""
    words = [str(a) for a in argv]
    if words and words[0].rsplit("/", 1)[-1] == "vllm":
        words = words[1:]
    if words[:1] == ["serve"]:
        return _vllm(words[1:])
    if "-m" in words and "sglang.launch_server" in words:
        words = words[words.index("sglang.launch_server") + 1:]
    if words and words[0] == "sglang.launch_server":
        words = words[1:]
    pos, flags = _flags(words)
    if "model_path" in flags or "model" in flags:
        return _sglang(flags)
    raise ValueError(f"not a `vllm serve` or `sglang.launch_server` argv: {list(argv)!r}")


def _vllm(words: list[str]) -> dict[str, Any]:
    pos, flags = _flags(words)
    model = pos[0] if pos else str(flags.get("model", ""))
    settings: dict[str, Any] = {STEPS: 0}
    raw = flags.get("speculative_config")
    if isinstance(raw, str) and raw:
        try:
            cfg = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--speculative-config is not JSON: {raw!r} ({exc})") from exc
        if not isinstance(cfg, dict):
            raise ValueError(f"--speculative-config is not a JSON object: {raw!r}")
        k = int(cfg.get("num_speculative_tokens") or 0)
        settings[STEPS] = k
        if k:
            settings[TOPK] = 1
            settings[DRAFT] = k + 1
            if str(cfg.get("method", "")).startswith("ngram"):
                settings[NGRAM_N] = int(cfg.get("prompt_lookup_max") or VLLM_NGRAM_DEFAULT)
            settings["method"] = str(cfg.get("method", ""))
    settings[MEM] = float(flags.get("gpu_memory_utilization", VLLM_MEM_DEFAULT))
    return {"engine": "vllm", "model": model, "host": str(flags.get("host", "127.0.0.1")),
            "port": int(flags.get("port", DEFAULT_PORT["vllm"])), "settings": settings,
            "flags": flags}


def _sglang(flags: dict[str, str | bool]) -> dict[str, Any]:
    model = str(flags.get("model_path", flags.get("model", "")))
    settings: dict[str, Any] = {STEPS: int(flags.get("speculative_num_steps", 0) or 0)}
    if flags.get("speculative_algorithm") and settings[STEPS]:
        settings[TOPK] = int(flags.get("speculative_eagle_topk", 1))
        settings[DRAFT] = int(flags.get("speculative_num_draft_tokens", settings[STEPS] + 1))
        settings["method"] = str(flags["speculative_algorithm"])
    else:
        settings[STEPS] = 0
    if "mem_fraction_static" in flags:
        settings[MEM] = float(flags["mem_fraction_static"])
    return {"engine": "sglang", "model": model, "host": str(flags.get("host", "127.0.0.1")),
            "port": int(flags.get("port", DEFAULT_PORT["sglang"])), "settings": settings,
            "flags": flags}
