"""Local files a backend config names (models, drafts, tokenizers), checked before anything
starts on the machine whose servers would read them.

Each backend lists the files its server would open (`Backend.local_files`): a path exactly as
the server gets it (after the backend's own expansion of `${SPECDECODE_CACHE}`, `$VARS`, `~`).
A value that may also be a Hugging Face hub id (`Qwen/Qwen3.5-122B`, `gpt2`) is listed only
when it cannot be one: absolute, `~`, `./`, `../`, or not of the hub's `name` / `org/name` form.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..errors import ConfigError

# A hub id: `name` or `org/name` of letters, digits, '-', '_' and '.'.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


@dataclass(frozen=True)
class LocalFile:
    key: str            # where the experiment names it: "backend.model_path"
    value: str          # as written there
    path: str           # as the server gets it
    allowed: str        # what it must be, for the message
    file_only: bool = False   # True: a file (a GGUF); False: a file or a folder (HF model)


def may_be_hub_id(value: str) -> bool:
    """False for what is certainly a local path; True for what the server may download."""
    if os.path.isabs(value) or value.startswith(("~", "./", "../")) or value in (".", ".."):
        return False
    return _HUB_ID.fullmatch(value) is not None


def hub_or_local(key: str, value: object, path: str | None = None) -> list[LocalFile]:
    """`value` as a LocalFile when it cannot be a hub id (else nothing to check here)."""
    if not isinstance(value, str) or not value:
        return []
    path = value if path is None else path
    if may_be_hub_id(value) and may_be_hub_id(path):
        return []
    return [LocalFile(key, value, path, "a local model folder or file, or a Hugging Face hub "
                                        "id (org/name)")]


def check(files: list[LocalFile]) -> None:
    """ConfigError, one line, for the first file that is missing, of the wrong kind or
    unreadable."""
    for f in files:
        at = "" if f.path == f.value else f" ({f.path})"
        if not os.path.exists(f.path):
            problem = "no such file or folder"
        elif f.file_only and os.path.isdir(f.path):
            problem = "is a directory"
        elif not os.access(f.path, os.R_OK):
            problem = "cannot be read (permission denied)"
        else:
            continue
        raise ConfigError(f"{f.key} = {f.value!r}{at}: {problem}; allowed: {f.allowed}")
