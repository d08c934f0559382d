"""Tiny llama-architecture test models whose greedy output cycles, made locally.

No model hub is reachable from CI, and random weights never repeat themselves, so n-gram
speculation would draft nothing useful on them. These models are built so that it does:

- every token embedding is a random vector of norm sqrt(dim), so RMSNorm leaves it unchanged;
- attention-output and feed-forward-down weights are zero, so the residual stream of a position
  is its own token's embedding, whatever the layers compute;
- the output (lm_head) row of token c[i+1] of a fixed cycle c[0..N-1] is the embedding of c[i]
  (scaled), every other row is zero: greedy decoding then emits c[i+1] after c[i], forever, and
  any prompt token enters the cycle at once (its embedding is closest to some cycle row).

n-gram speculation then accepts every draft once one cycle has been generated. `noise` adds
Gaussian noise to the attention-output and FFN-down weights (standard deviation
noise / sqrt(fan_in)): attention mixes in the context, which sometimes tips the argmax to
another cycle token, a jump the n-gram drafter cannot foresee. Acceptance falls as noise grows;
the output is still deterministic (greedy), so a trial can be repeated exactly.

Modules: `spec` (the spec and its weights, pure numpy), `gguf_file` (GGUF for llama.cpp, with
a vocabulary llama.cpp ships), `hf_dir` (an HF directory for vLLM, with a word-level tokenizer
trained locally; run it with the vLLM venv's python, which has torch, transformers and
tokenizers), `cli` (the command line). The writers import their packages lazily, so this
package imports with numpy alone.

    python -m specdecode_tune.testing.models gguf --out m.gguf --cycle 32 --noise 0.0 --dim 256
    $VLLM_PY -m specdecode_tune.testing.models hf --out m-hf --cycle 32 --noise 0.0 --dim 256
"""

from .cli import main
from .gguf_file import pick_cycle_gguf, read_gguf_spec, write_gguf
from .hf_dir import HF_SPECIALS, hf_state_names, made_up_words, train_word_tokenizer, write_hf
from .spec import LOGIT_SCALE, CycleModelSpec, cycle_weights, make_spec, reference_greedy

__all__ = [
    "HF_SPECIALS", "LOGIT_SCALE", "CycleModelSpec", "cycle_weights", "hf_state_names", "main",
    "made_up_words", "make_spec", "pick_cycle_gguf", "read_gguf_spec", "reference_greedy",
    "train_word_tokenizer", "write_gguf", "write_hf",
]
