"""A server's tokenize endpoint, where it has one: what a ShareGPT sample's lengths are
counted with after boot (`load.tokencount`; docs/workloads.md).

- llama-server: `POST /tokenize` `{"content": text, "add_special": bool}` -> `{"tokens": [...]}`
  (tools/server/server.cpp, `handle_tokenize`; `format_tokenizer_response`);
- vLLM: `POST /tokenize` `{"prompt": text, "add_special_tokens": true}` -> `{"count", "tokens",
  "max_model_len"}` (`TokenizeCompletionRequest` / `TokenizeResponse` in its OpenAI protocol).

SGLang and the simulator declare none (the sample's own counts stand).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class TokenizeEndpoint:
    path: str
    body: Callable[[str], dict[str, Any]]
    count: Callable[[Any], int | None]


def _tokens_len(obj: Any) -> int | None:
    tokens = obj.get("tokens") if isinstance(obj, dict) else None
    return len(tokens) if isinstance(tokens, list) else None


def _count_field(obj: Any) -> int | None:
    n = obj.get("count") if isinstance(obj, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) else _tokens_len(obj)


# BOS counted as the benchmarks' tokenizer.encode does (it adds special tokens).
LLAMA_SERVER = TokenizeEndpoint("/tokenize", lambda text: {"content": text, "add_special": True},
                                _tokens_len)
VLLM = TokenizeEndpoint("/tokenize", lambda text: {"prompt": text, "add_special_tokens": True},
                        _count_field)
