"""The embedded simulator's backend (`python -m specdecode_tune.sim`): SGLang's flags, as the
release it imitates names them, plus its own (the profile, the boot time, the release to
imitate). It stands in for SGLang, so it is SGLang's backend in all else: the report's launch
command is SGLang's, its schedule file SGLang's adaptive config. What every boot would refuse is
said by the simulator's own CLI (`simargs`), its profile checked before a search starts.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ..config import BackendConfig
from . import simargs
from .common import each_refusal, fmt
from .files import LocalFile
from .sglang import SGLangBackend
from .sglang_releases import DEFAULT_VERSION


class SimBackend(SGLangBackend):
    """The embedded simulator: SGLang's flags plus its profile and boot-time override."""

    name = "sim"
    module = "specdecode_tune.sim"

    def server_args(self, cfg: BackendConfig, params: Mapping[str, Any],
                    version: str | None = None) -> list[str]:
        # The simulator's own command line has the flag names of the release it imitates; its
        # launch command (for the real SGLang) has those of backend.engine_version.
        args = super().server_args(cfg, params, version or DEFAULT_VERSION)
        if cfg.profile:
            args += ["--profile", cfg.profile]
        if cfg.boot_time_s is not None:
            args += ["--boot-time", fmt(float(cfg.boot_time_s))]
        if cfg.engine_version:   # the release to imitate where releases differ (adaptive mode)
            args += ["--sglang-version", cfg.engine_version]
        return args

    def validate(self, cfg: BackendConfig) -> None:
        """The profile every boot would load: missing, unreadable, not TOML, bad values."""
        from ..sim.profile import DEFAULT_PROFILE, load_profile
        load_profile(cfg.profile or DEFAULT_PROFILE)

    def check_args(self, cfg: BackendConfig, argv: Sequence[str]) -> None:
        """What every boot would refuse: the simulator's CLI says (`simargs`)."""
        simargs.check(self.module, argv[len(self._head(cfg)):])

    def refusals(self, cfg: BackendConfig, argvs: Sequence[Sequence[str]]
                 ) -> list[str | None]:
        return each_refusal(lambda argv: self.check_args(cfg, argv), argvs)

    def known_crash(self, cfg: BackendConfig, params: Mapping[str, Any],
                    version: str | None = None) -> str | None:
        """SGLang's, for the release the simulator imitates (backend.engine_version, else its
        default), whatever sglang this Python has: it crashes on them at boot as that
        release does."""
        return super().known_crash(cfg, params,
                                   version or cfg.engine_version or DEFAULT_VERSION)

    def local_files(self, cfg: BackendConfig) -> list[LocalFile]:
        return []   # the simulator loads no model: model_path and the draft are names only

    def key_args(self, cfg: BackendConfig) -> list[str]:
        # The simulator also reads the key from a variable it is named (its own flag), so the
        # key stays off its command line.
        return ["--api-key-env", cfg.api_key_env] if cfg.api_key_env else []

    def engine_version(self, cfg: BackendConfig) -> tuple[str, str]:
        # The simulator imitates DEFAULT_VERSION whatever is installed here.
        if cfg.engine_version:
            return cfg.engine_version, "backend.engine_version"
        return DEFAULT_VERSION, "the release the simulator imitates; set backend.engine_version"

    def launch_command(self, cfg: BackendConfig, params: Mapping[str, Any]) -> str:
        # The simulator stands in for SGLang: the command to take away is SGLang's.
        return shlex.join(["python", "-m", "sglang.launch_server"]
                          + SGLangBackend.server_args(self, cfg, params)) + self.key_text(cfg)
