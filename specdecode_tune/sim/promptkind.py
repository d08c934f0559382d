"""Acceptance that depends on the prompt: a prompt's kind, and the profile's factor for it.

Real drafts are accepted far more often on some text than on other: the seed's greedy
`ignore_eos` runs produce repetitive text the draft predicts almost perfectly, code is
predictable in its syntax, open-ended chat at temperature > 0 is the hardest. A profile with a
`[prompt_kinds]` table scales its conditional acceptance per draft position by the factor of
the request's prompt kind (capped at `CAP`), and, for code and chat, by a per-request
log-normal factor (`request_sigma`), so a ShareGPT mix gives a spread of per-request
acceptance. Repetitive prompts keep the profile's own tables, as they were fitted, with no
per-request factor; a profile without the table treats every prompt so.

The kind is read from the prompt's text (`classify`):
- `code`: a fenced block (```), or at least 3 lines that look like code (ending in `;`, `{`,
  `}` or `:` after a keyword, or starting with `def `, `class `, `import `, `#include`,
  `function `, `public `, `SELECT `, ...), or symbols `{}();=<>[]` over 6% of characters;
- `repetitive`: 20 or more words with no sentence punctuation at all (the random workload's
  word lists) or fewer than 30% distinct words;
- `chat`: everything else.
"""

from __future__ import annotations

import math
import random
import re

KINDS = ("code", "chat", "repetitive")
CAP = 0.995

_CODE_LINE = re.compile(
    r"^\s*(def |class |import |from \S+ import |#include|function |public |private |"
    r"const |let |var |return |SELECT |INSERT |CREATE |for \(|if \(|while \()|"
    r"[;{}]\s*$", re.MULTILINE)
_SYMBOLS = re.compile(r"[{}();=<>\[\]]")
_PUNCT = re.compile(r"[.,;:!?]")


def classify(text: str) -> str:
    """`code`, `chat` or `repetitive` for a prompt's text."""
    if "```" in text or len(_CODE_LINE.findall(text)) >= 3:
        return "code"
    if text and len(_SYMBOLS.findall(text)) / len(text) > 0.06:
        return "code"
    words = text.split()
    if len(words) >= 20 and (not _PUNCT.search(text)
                             or len({w.lower() for w in words}) / len(words) < 0.3):
        return "repetitive"
    return "chat"


def scaled(probs: tuple[float, ...], kind: str | None, factors: dict[str, float] | None,
           request_sigma: float, rng: random.Random) -> tuple[float, ...]:
    """The conditional acceptance per position for one request of this kind."""
    if not factors or kind is None or kind == "repetitive":
        return probs
    f = factors.get(kind, 1.0)
    if request_sigma > 0:
        f *= math.exp(rng.gauss(0.0, request_sigma))
    return tuple(min(p * f, CAP) for p in probs)
