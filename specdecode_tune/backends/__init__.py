"""Backends: how to boot one kind of server with one parameter set, and how to read it.

A backend turns resolved parameters into an argv list (never a shell string), names its health
path, reads the server's facts after boot, and says how a person would launch the same server.
`BACKENDS` maps the experiment's `backend.kind` to an implementation.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

from ..config import BackendConfig
from ..records import ServerFacts
from .sglang import SGLangBackend, SimBackend


class Backend(Protocol):
    """The contract every server kind implements."""

    name: str
    health_path: str

    def argv(self, cfg: BackendConfig, params: Mapping[str, Any], port: int | str) -> list[str]:
        """The server's command line for these resolved parameters on this port."""

    def env(self, cfg: BackendConfig) -> dict[str, str]:
        """Extra environment for the server process (added to the trial's own)."""

    def read_facts(self, base_url: str, timeout_s: float = 10.0) -> ServerFacts:
        """What the healthy server says about itself (KV budget, running limit, GPUs)."""

    def launch_command(self, cfg: BackendConfig, params: Mapping[str, Any]) -> str:
        """The command a person runs to serve with these settings (for the report)."""

    def program(self, cfg: BackendConfig) -> str:
        """The executable that argv starts (checked before a search starts anything)."""


BACKENDS: dict[str, Backend] = {
    "sglang": SGLangBackend(),
    "sim": SimBackend(),
}


def get_backend(kind: str) -> Backend:
    try:
        return BACKENDS[kind]
    except KeyError:
        raise ValueError(f"backend kind must be one of {sorted(BACKENDS)}, got {kind!r}") \
            from None
