"""What an engine's log says when its server fails to start: one engine's words, as data.

Each backend declares a `FailurePatterns` (its `failure_patterns`); the server's classifier
(`server.failures.classify_failure`) applies them on top of what it knows of every server
(exit codes, Python's own messages, argparse, the GPU runtimes' out-of-memory lines). A log
line matching any pattern of a kind counts for that kind; the first such line is the reason.

- `oom`: GPU memory exhausted, in this engine's own words (regexes, case-sensitive).
- `kv_memory`: the model fits but the KV pool left over is empty or too small (regexes,
  matched ignoring case).
- `arg_exceptions`: names of exception classes that, whatever raised them, mean a start-up
  argument check failed (SGLang asserts in `server_args.py`; vLLM's pydantic raises
  `ValidationError`).
- `arg_check_files`: regexes of the source paths (in traceback frames, `File "..."`) of the
  engine's argument-checking code: a `ValueError` / `TypeError` in a log that shows such a
  frame is an argument error rather than a crash.
- `arg_lines`: regexes of the lines an engine prints when it refuses an argument without
  argparse's words or exit code 2 (llama.cpp: `error: invalid argument: --x`, exit 1).

`union(...)` merges several (the classifier's default when it is not told the engine).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class FailurePatterns:
    """One engine's start-up failure lines; see the module docstring for each field."""

    oom: tuple[str, ...] = ()
    kv_memory: tuple[str, ...] = ()
    arg_exceptions: tuple[str, ...] = ()
    arg_check_files: tuple[str, ...] = ()
    arg_lines: tuple[str, ...] = ()


def union(patterns: Iterable[FailurePatterns]) -> FailurePatterns:
    """Every pattern of each kind, in order, without repeats."""
    items = list(patterns)

    def merged(field: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p for fp in items for p in getattr(fp, field)))

    return FailurePatterns(oom=merged("oom"), kv_memory=merged("kv_memory"),
                           arg_exceptions=merged("arg_exceptions"),
                           arg_check_files=merged("arg_check_files"),
                           arg_lines=merged("arg_lines"))
