"""The experiment's `[backend]` table: which server to boot and its fixed settings.

Relative paths (model, draft model, server program, a simulator profile) are looked up from the
current folder, then from the experiment's folder, and made absolute when found: trials run in
their own working directories. Anything else is kept as written (a Hugging Face hub id,
`${SPECDECODE_CACHE}/...` expanded per machine, or a missing path that the pre-flight reports).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .reader import MISSING, Table

# The engines an experiment may name. The one list outside backends/ that a new engine touches:
# config reads an experiment before anything else runs and imports nothing downstream of it
# (config -> search -> trial -> backends), so it cannot ask the registry. The backends'
# contract suite (tests/unit/backends/test_backend_contract.py) fails until this list, the
# registry (`backends.BACKENDS`) and the suite's own table name the same engines.
BACKEND_KINDS = ("sim", "sglang", "vllm", "llamacpp")
APIS = ("generate", "completions", "chat")
# The engines whose server is a Python module that backend.python may run.
PYTHON_KINDS = ("sglang", "vllm")
# A release as its wheel names it: 0.5.10.post1, 0.5.13, 0.5.14rc0.
_VERSION = re.compile(r"\d+(\.\d+)+(\.?(post|rc|a|b|dev)\d+)*")


@dataclass(frozen=True)
class BackendConfig:
    """Which server to boot and its fixed settings. `flags` use the server's own names."""

    kind: str
    model_path: str
    speculative_algorithm: str | None = "EAGLE3"
    draft_model_path: str | None = None
    tp_size: int = 1
    host: str = "127.0.0.1"
    api: str = "generate"
    boot_timeout_s: float = 900.0
    flags: dict[str, Any] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    api_key_env: str | None = None
    binary: str | None = None          # server program (llama-server path); None = default
    profile: str | None = None         # sim only: performance profile name or path
    boot_time_s: float | None = None   # sim only: override the profile's boot time
    # sglang / sim: the SGLang release the servers run (which flags exist; see
    # backends/sglang_releases.py); None = the installed sglang's, else the one the project checked.
    engine_version: str | None = None
    # sglang / vllm: the Python that runs the engine's server module (`-m sglang.launch_server`,
    # `-m vllm.entrypoints.openai.api_server`): the engine in its own virtual environment or
    # site (the GPU route's engines/<name>/python wrapper); None = the search's own. SGLang's
    # checks each command line before a boot.
    python: str | None = None

    @classmethod
    def from_table(cls, t: Table, base_dir: Path | None = None) -> BackendConfig:
        """Read and check `[backend]`; `base_dir` is the experiment's folder."""
        kind = t.choice("kind", BACKEND_KINDS)
        model_path = t.get("model_path", str, "seed-qwen35-122b" if kind == "sim" else MISSING)
        algo = t.get("speculative_algorithm", str, "EAGLE3")
        cfg = cls(
            kind=kind,
            model_path=_relative_to(model_path, base_dir),
            speculative_algorithm=algo or None,
            draft_model_path=_optional_path(t, "draft_model_path", base_dir),
            tp_size=t.positive("tp_size", int, 1),
            host=t.get("host", str, "127.0.0.1"),
            api=t.choice("api", APIS,
                         "completions" if kind in ("vllm", "llamacpp") else "generate"),
            boot_timeout_s=float(t.positive("boot_timeout_s", (int, float), 900.0)),
            flags=_flags(t.sub("flags")),
            extra_args=tuple(_str_list(t, "extra_args")),
            env=_str_map(t.sub("env")),
            api_key_env=t.get("api_key_env", str, None) or None,
            binary=_optional_path(t, "binary", base_dir, bare=False),
            profile=_profile(t, kind, base_dir),
            boot_time_s=t.positive("boot_time_s", (int, float), None, zero_ok=True),
            engine_version=t.get("engine_version", str, None),
            python=_optional_path(t, "python", base_dir, bare=False),
        )
        if kind != "sim":
            for key in ("profile", "boot_time_s"):
                if getattr(cfg, key) is not None:
                    raise t.fail(key, getattr(cfg, key),
                                 "is only allowed with backend.kind = 'sim'")
        if cfg.python is not None and kind not in PYTHON_KINDS:
            raise t.fail("python", cfg.python, "is only allowed with backend.kind = 'sglang' "
                         "or 'vllm'")
        if cfg.python is not None and cfg.binary is not None:
            raise t.fail("python", cfg.python, "and backend.binary exclude each other (binary "
                         "is the whole server program; python runs the engine's server module)")
        if cfg.engine_version is not None:
            if kind not in ("sglang", "sim"):
                raise t.fail("engine_version", cfg.engine_version,
                             "is only allowed with backend.kind = 'sglang' or 'sim'")
            if not _VERSION.fullmatch(cfg.engine_version):
                raise t.fail("engine_version", cfg.engine_version,
                             "must be an SGLang release such as '0.5.10.post1'")
        t.done()
        return cfg


def _relative_to(value: str, base_dir: Path | None, *, bare: bool = True) -> str:
    """A relative path that exists from here or from the experiment's folder, made absolute;
    anything else kept as written. With `bare=False` a value without a slash is kept too (a
    program on PATH: a file of that name here is not what runs)."""
    if (not value or (not bare and "/" not in value) or value.startswith(("~", "$"))
            or os.path.isabs(value)):
        return value
    for p in (Path(value), *([base_dir / value] if base_dir is not None else [])):
        if p.exists():
            return os.path.abspath(p)   # not resolve(): a venv's python is a symlink
    return value


def _optional_path(t: Table, name: str, base_dir: Path | None, *, bare: bool = True
                   ) -> str | None:
    value = t.get(name, str, None)
    return None if value is None else _relative_to(value, base_dir, bare=bare)


def _profile(t: Table, kind: str, base_dir: Path | None) -> str | None:
    """backend.profile: a bundled profile's name (checked by the simulator's loader before a
    search), or the path of a profile TOML (a slash or a .toml suffix), which must exist."""
    value = t.get("profile", str, None)
    if kind != "sim" or not value or ("/" not in value and not value.endswith(".toml")):
        return value
    p = Path(value).expanduser()
    if not p.is_absolute() and not p.exists() and base_dir is not None:
        p = base_dir / p
    if p.is_dir():
        raise t.fail("profile", value, f"{p} is a directory; allowed: a profile TOML file or "
                                       f"a bundled profile's name")
    if not p.exists():
        raise t.fail("profile", value, "no such profile file; allowed: an existing profile "
                                       "TOML file or a bundled profile's name")
    return os.path.abspath(p)


def _flags(t: Table) -> dict[str, Any]:
    """`[backend.flags]`: server flags by name, '-' and '_' alike (stored with '_')."""
    out: dict[str, Any] = {}
    for k in list(t.data):
        v = t.get(k, (int, float, str, bool))
        if not k.replace("_", "").replace("-", "").isalnum():
            raise t.fail(k, v, "flag names are letters, digits, '_' and '-'")
        out[k.replace("-", "_")] = v
    t.done()
    return out


def _str_list(t: Table, name: str) -> list[str]:
    value = t.get(name, list, [])
    if not all(isinstance(x, str) for x in value):
        raise t.fail(name, value, "must be a list of strings")
    return value


def _str_map(t: Table) -> dict[str, str]:
    out = {k: t.get(k, str) for k in list(t.data)}
    t.done()
    return out
