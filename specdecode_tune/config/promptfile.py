"""JSONL prompt files: read, validated and parsed in one pass, when the experiment is loaded.

One prompt per line, in any of three shapes:
``{"messages": [{"role": ..., "content": ...}, ...]}`` (OpenAI style),
``{"conversations": [{"from": "human"|"gpt"|"system", "value": ...}, ...]}`` (ShareGPT style),
or ``{"prompt": "..."}``. Other keys of a row are ignored; trailing assistant turns are dropped
(they are the reference answer, not part of the prompt).

The file is UTF-8 (a byte-order mark on the first line is allowed); lines holding only
whitespace are skipped; every other line must be one prompt. A bad line is a `ConfigError`
naming the file, the line number, the problem and what is allowed. With `max_prompts` only the
first that many prompts are read, by the check and by the trials alike, so a large file costs
one bounded pass; the parsed rows are cached per (path, version, limit), so the workload of
the process that loaded the experiment does not read the file again.

`config.workload` validates the file when an experiment loads; the load generator's workload
(`load.workload`) reads its rows to send them. It lives in `config` because the check runs
there, and `config` imports nothing downstream of it.
"""

from __future__ import annotations

import functools
import json
import os
import stat
from collections.abc import Iterable
from typing import Any, NoReturn

from ..errors import ConfigError

_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
}
_CHAT_ROLES = ("system", "user", "assistant", "developer", "tool")
_BOM = b"\xef\xbb\xbf"

Row = tuple[str, tuple[dict[str, str], ...] | None]   # (plain text, chat turns or None)
Rows = list[Row]


def load_rows(path: str | os.PathLike[str], max_prompts: int | None = None) -> Rows:
    """The prompts of a JSONL file (the first `max_prompts` if given); `ConfigError` for a
    file that cannot be read or a line that is not a prompt."""
    path = os.fspath(path)
    what = f"workload.path {path}"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        _bad_row(what, "no such file", "an existing JSONL prompt file")
    except OSError as e:
        _bad_row(what, f"cannot read ({e.strerror})", "a readable JSONL prompt file")
    if stat.S_ISDIR(st.st_mode):
        _bad_row(what, "is a directory", "a JSONL prompt file")
    if not stat.S_ISREG(st.st_mode):
        _bad_row(what, "is not a regular file", "a JSONL prompt file")
    return _load(path, st.st_mtime_ns, st.st_size, max_prompts)


@functools.lru_cache(maxsize=4)
def _load(path: str, mtime_ns: int, size: int, max_prompts: int | None) -> Rows:
    """Parse a prompt file once per (path, version, limit); each level then only shuffles."""
    del mtime_ns, size  # part of the cache key only: a rewritten file is parsed again
    what = f"workload.path {path}"
    try:
        # bytes: a line that is not UTF-8 is reported with its number
        with open(path, "rb") as f:
            rows = _parse_lines(f, what, max_prompts)
    except OSError as e:
        _bad_row(what, f"cannot read ({e.strerror})", "a readable JSONL prompt file")
    if not rows:
        _bad_row(what, "holds no prompts", "a file with at least one prompt")
    return rows


def _parse_lines(lines: Iterable[bytes], what: str, max_prompts: int | None) -> Rows:
    rows: Rows = []
    for lineno, raw in enumerate(lines, 1):
        if max_prompts is not None and len(rows) >= max_prompts:
            break
        where = f"{what}:{lineno}"
        if lineno == 1 and raw.startswith(_BOM):
            raw = raw[len(_BOM):]
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            _bad_row(where, f"not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})",
                     "UTF-8 text, one JSON object per line")
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except RecursionError:
            _bad_row(where, "JSON nested too deeply to read", "one JSON object per line")
        except ValueError as exc:
            # JSONDecodeError has .msg; an over-long integer is a plain ValueError
            msg = getattr(exc, "msg", None) or str(exc)
            _bad_row(where, f"not valid JSON ({msg})", "one JSON object per line")
        rows.append(parse_row(obj, where))
    return rows


ROW_SHAPES = '{"messages": [...]}, {"conversations": [...]} or {"prompt": "..."}'
# list key -> (role field, text field, role names as written -> chat role)
_TURN_SHAPES = {
    "messages": ("role", "content", {r: r for r in _CHAT_ROLES}),
    "conversations": ("from", "value", _SHAREGPT_ROLES),
}


def parse_row(obj: Any, where: str) -> Row:
    """One decoded JSON line -> (text, turns); `ConfigError` naming `where` if it is no prompt."""
    if not isinstance(obj, dict):
        _bad_row(where, f"got {type(obj).__name__}", f"an object {ROW_SHAPES}")
    key = next((k for k in _TURN_SHAPES if k in obj), None)
    if key is None:
        if "prompt" not in obj:
            _bad_row(where, f"keys {sorted(obj)!r:.80}", ROW_SHAPES)
        text = obj["prompt"]
        if not isinstance(text, str) or not text.strip():
            _bad_row(where, f"prompt={text!r:.60}", "a non-empty string")
        return text, None
    role_key, text_key, roles = _TURN_SHAPES[key]
    turns = obj[key]
    if not isinstance(turns, list) or not turns:
        _bad_row(where, f"{key}={turns!r:.60}", f"a non-empty list of {{{role_key}, {text_key}}}")
    msgs = []
    for t in turns:
        name = t.get(role_key) if isinstance(t, dict) else None
        role = roles.get(name.lower()) if isinstance(name, str) else None
        text = _content_text(t.get(text_key)) if isinstance(t, dict) else None
        if role is None or text is None:
            _bad_row(where, f"turn {t!r:.60}",
                     f'{{"{role_key}": one of {", ".join(roles)}, "{text_key}": text}}')
        msgs.append({"role": role, "content": text})
    while msgs and msgs[-1]["role"] == "assistant":
        msgs.pop()   # the reference answer, not part of the prompt
    if not any(m["role"] == "user" for m in msgs):
        _bad_row(where, "no user turn before the last answer", "a conversation with a user turn")
    text = "\n\n".join(m["content"] for m in msgs)
    if not text.strip():
        _bad_row(where, f"{key} whose turns are all empty", "a conversation with some text")
    return text, tuple(msgs)


def _bad_row(where: str, what: str, allowed: str) -> NoReturn:
    raise ConfigError(f"{where}: {what}; allowed: {allowed}")


def _content_text(content: Any) -> str | None:
    """OpenAI content: a string, or a list of parts of which the text parts count."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        texts = [p for p in parts if isinstance(p, str)]
        if parts and len(texts) == len(parts):
            return "\n".join(texts)
    return None
