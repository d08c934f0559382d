"""Why a server did not become healthy, from its exit status and the tail of its log (pure).

What every server prints is known here: exit codes and signals, a `python -m` of a module that
is not installed, argparse's messages, the GPU runtimes' out-of-memory lines (PyTorch's, CUDA's,
HIP's, NCCL's), a ValueError/TypeError raised from argparse, and the line naming an exception.
What one engine prints (its KV pool checks, its argument checks, its own out-of-memory words)
is its backend's `failure_patterns`; with no backend named, every engine's apply.

Terminal colours are stripped first; the first matching line is the reason (later ones tend to
be other ranks or consequences), trimmed to one line of at most 300 characters.
"""

from __future__ import annotations

import functools
import re
import signal
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..backends import ANY_ENGINE_FAILURES
from ..backends.failurepatterns import FailurePatterns

if TYPE_CHECKING:
    from ..backends import Backend

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

# A `python -m pkg.mod` whose package is not installed: the interpreter prints
# "<python>: No module named pkg.mod" or "... Error while finding module specification ...".
_MISSING_MODULE = re.compile(
    r"python[\w.]*: (?:No module named \S+|Error while finding module specification.*)")

# GPU memory exhausted (weights, activations, CUDA graphs), in PyTorch's, CUDA's, HIP's and
# NCCL's words. Deliberately not a bare "out of memory": SGLang's hints say "out-of-memory"
# and "This is not an out-of-memory error", which must not count.
_GPU_OOM = (r"CUDA out of memory", r"CUDA error: out of memory", r"OutOfMemoryError",
            r"HIP out of memory", r"cudaErrorMemoryAllocation", r"hipErrorOutOfMemory",
            r"Cuda failure 'out of memory'")

# argparse's own messages (exit code 2), and its frames in a traceback.
_ARGPARSE = re.compile(
    r": error: (?:argument |unrecognized arguments|the following arguments are required"
    r"|one of the arguments|invalid choice|ambiguous option)")
_ARGPARSE_FILE = r"argparse\.py"

_USAGE = re.compile(r"^usage:|error:")

# A ValueError/TypeError is an argument error only where an argument-checking frame shows.
_VALUE_ERROR = re.compile(r"(?:^|[\s)])(?:[\w]+\.)*(ValueError|TypeError)\b(?::|$)")

# The last line that names an exception, for the reason of a plain crash.
_EXCEPTION_LINE = re.compile(r"(?:^|[\s)])(?:[\w]+\.)*\w*(?:Error|Exception|Interrupt)\b(?::|$)"
                             r"|Segmentation fault|core dumped|Fatal Python error|Aborted")

_REASON_MAX = 300


class _Compiled:
    """One engine's patterns as the regexes the classifier searches (None: none declared)."""

    def __init__(self, fp: FailurePatterns) -> None:
        self.oom = _alternation(_GPU_OOM + fp.oom)
        self.kv = _alternation(fp.kv_memory, re.IGNORECASE)
        names = "|".join(re.escape(n) for n in fp.arg_exceptions)
        self.arg_exception = re.compile(
            rf"(?:^|[\s)])(?:[\w]+\.)*({names})\b") if names else None
        files = "|".join((_ARGPARSE_FILE, *fp.arg_check_files))
        self.arg_frame = re.compile(rf'File "[^"]*(?:{files})"')
        self.arg_line = _alternation(fp.arg_lines)


def _alternation(patterns: Sequence[str], flags: int = 0) -> re.Pattern[str] | None:
    return re.compile("|".join(f"(?:{p})" for p in patterns), flags) if patterns else None


@functools.lru_cache(maxsize=16)
def _compiled(fp: FailurePatterns) -> _Compiled:
    return _Compiled(fp)


def clean_lines(log_tail: str) -> list[str]:
    """The log's non-blank lines, stripped of terminal colours and surrounding space."""
    return [ln.strip() for ln in _ANSI.sub("", log_tail).splitlines() if ln.strip()]


def short(line: str) -> str:
    """`line` trimmed to a reason's length."""
    return line if len(line) <= _REASON_MAX else line[: _REASON_MAX - 3] + "..."


def _first(pattern: re.Pattern[str] | None, lines: Sequence[str]) -> str | None:
    # The first match is the root cause; later ones tend to be other ranks or consequences.
    if pattern is None:
        return None
    for ln in lines:
        if pattern.search(ln):
            return ln
    return None


def _exit_text(returncode: int, raised: bool) -> str:
    """How the process ended; `raised`: its log shows an exception."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        text = f"killed by {name}"
        if -returncode == signal.SIGKILL and not raised:
            # Nobody here sent it during boot; with no error in the log, the kernel's OOM
            # killer is the usual sender. After an error it is the server's own clean-up:
            # SGLang's launcher kills its process tree with SIGKILL when a child fails
            # (engine.py `launch_phase_sigquit_handler` -> `kill_process_tree`; seen on 0.5.17
            # after a RuntimeError in the draft worker's CUDA graph capture).
            text += " (host out of memory? the kernel's OOM killer sends SIGKILL)"
        return text
    return f"exit code {returncode}"


def _last(lines: Sequence[str]) -> str:
    return lines[-1] if lines else "(empty log)"


def classify_failure(returncode: int | None, log_tail: str,
                     backend: Backend | None = None) -> tuple[str, str]:
    """Why a server did not become healthy: (kind, one-line reason).

    `returncode` is the exit status (negative: killed by that signal), or None when the process
    was still alive at the deadline. `backend` names the engine whose `failure_patterns` apply
    (None: every engine's). Kinds are checked in this order: "missing_binary" (exit 127, or
    `python -m` of a module that is not installed), "oom", "kv_memory", "invalid_args"
    (argparse's exit 2 and messages, an exception the engine names as an argument check, such
    as SGLang's AssertionError or vLLM's pydantic ValidationError, a ValueError/TypeError
    raised from an argument-checking file), then "crashed". With `returncode=None` the kind is
    "timeout", unless the log already shows an OOM or KV shortage (a server that logged that
    and then hung is still a config that does not fit). The reason is the matching log line,
    trimmed.
    """
    engine = _compiled(ANY_ENGINE_FAILURES if backend is None else backend.failure_patterns)
    lines = clean_lines(log_tail)
    if returncode is not None:
        if returncode == 127:
            return "missing_binary", short(f"exit code 127 (command not found): {_last(lines)}")
        line = _first(_MISSING_MODULE, lines)
        if line is not None:
            return "missing_binary", short(line)

    line = _first(engine.oom, lines)
    if line is not None:
        return "oom", short(line)
    line = _first(engine.kv, lines)
    if line is not None:
        return "kv_memory", short(line)

    if returncode is None:
        return "timeout", short(f"alive but not healthy at the deadline; "
                                f"last log line: {_last(lines)}")

    line = _first(_ARGPARSE, lines) or _first(engine.arg_line, lines)
    if line is not None:
        return "invalid_args", short(line)
    if returncode == 2:
        usage = _first(_USAGE, lines[::-1])
        return "invalid_args", short(f"exit code 2 (argument error): {usage or _last(lines)}")
    line = _first(engine.arg_exception, lines)
    if line is not None:
        return "invalid_args", short(line)
    if any(engine.arg_frame.search(ln) for ln in lines):
        line = _first(_VALUE_ERROR, lines)
        if line is not None:
            return "invalid_args", short(line)

    culprit = next((ln for ln in reversed(lines) if _EXCEPTION_LINE.search(ln)), None)
    exit_text = _exit_text(returncode, raised=culprit is not None)
    if culprit is None:
        culprit = _last(lines)
    if returncode == 0:
        exit_text = "exited with code 0 before it was healthy"
    return "crashed", short(f"{exit_text}: {culprit}")
