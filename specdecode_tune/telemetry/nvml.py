"""NVML as telemetry talks to it: importing pynvml, its errors and strings, and saying a problem
once.

nvidia-ml-py (`import pynvml`) is optional: a machine without GPUs need not have it, and a fake
with its function names (tests/fakenvml.py) stands in for it in tests. Nothing here needs its
constants, so old bindings and fakes work alike. Telemetry never fails a trial, so its problems
are logged, each once per process (`log_once`), rather than raised.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger(__package__)   # "specdecode_tune.telemetry", for every module of it

_logged: set[str] = set()
_logged_lock = threading.Lock()


def log_once(level: int, key: str, msg: str, *args: Any) -> None:
    """Log `msg` unless a message with this `key` was logged already in this process."""
    with _logged_lock:
        if key in _logged:
            return
        _logged.add(key)
    log.log(level, msg, *args)


def load_nvml() -> Any:
    """The pynvml module; ImportError without nvidia-ml-py."""
    import pynvml  # optional: a machine without GPUs need not have it

    return pynvml


def text(value: Any) -> str:
    """An NVML string: bytes from old bindings, str from new ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def error_types(nvml: Any) -> tuple[type[BaseException], ...]:
    """(NVMLError,) of this binding, or () where it has none."""
    base = getattr(nvml, "NVMLError", None)
    return (base,) if isinstance(base, type) and issubclass(base, BaseException) else ()


def error_name(exc: BaseException) -> str:
    """The NVML error's short name: "NotSupported" for NVMLError_NotSupported."""
    return type(exc).__name__.removeprefix("NVMLError_")
