"""The byte-level BPE tokenizer of the EAGLE-3 test pair (`tokenizers`), and its HF files.

Special tokens: `<s>` (id 0, BOS, put in front of every encoded text by the post-processor, as
Llama's tokenizers do) and `</s>` (id 1, EOS). No chat template: prompts are plain text.

Files (what AutoTokenizer reads, transformers 5.x): `tokenizer.json` (the `tokenizers` model
itself) and `tokenizer_config.json`, written here rather than by `save_pretrained`, so that the
class it names (`PreTrainedTokenizerFast`, in every transformers 5 release) does not depend on
the transformers that made the files. The target's config.json says `model_type: llama`; the
explicit class keeps AutoTokenizer from building a Llama (SentencePiece-style) tokenizer instead.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BOS, EOS = "<s>", "</s>"
BOS_ID, EOS_ID = 0, 1


def train_bpe(texts: Sequence[str], vocab_size: int) -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` trained on `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(texts), trainer=trainer, length=len(texts))
    if tok.token_to_id(BOS) != BOS_ID or tok.token_to_id(EOS) != EOS_ID:
        raise RuntimeError("the trained tokenizer's special tokens are not ids 0 and 1")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, BOS_ID)])
    return tok


def write_hf_tokenizer(tok: Any, out: Path, *, model_max_length: int) -> None:
    """tokenizer.json and tokenizer_config.json into the folder `out`."""
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for i, t in ((BOS_ID, BOS), (EOS_ID, EOS))},
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def encode_documents(tok: Any, texts: Sequence[str]) -> list[list[int]]:
    """Each text as `<s>` + its tokens + `</s>`."""
    return [e.ids + [EOS_ID] for e in tok.encode_batch(list(texts))]
