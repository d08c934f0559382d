"""A small Llama target and a TRAINED EAGLE-3 draft head for it, made locally from ShareGPT, for
serving EAGLE-3 speculative decoding in SGLang (0.5.17) and vLLM (0.26.0) with acceptance that
behaves like a real trained draft's (it falls with draft position, varies by prompt, drops at
temperature 0.7); a random head accepts nothing.

    python -m specdecode_tune.testing.eagle3 --out DIR [--preset gpu|toy] [--seed 0]

Phases (docs/eagle3-models.md has the sizes, the times and the figures):

1. data (`data`): ShareGPT's first exchanges, a fixed split by conversation id (2% held out);
2. tokenizer (`tokenizer`): byte-level BPE trained with `tokenizers`, `<s>`/`</s>`, no chat
   template; the HF files AutoTokenizer loads;
3. target (`target`): a transformers `LlamaForCausalLM` trained from scratch on the packed text;
4. head (`head`): the EAGLE-3 head (fc over three target hidden states, one decoder layer whose
   attention takes cat(embedding, hidden)), trained with test-time training on the target's
   hidden states and distributions, the way SpecForge trains one, matched to what SGLang
   0.5.17 feeds it when serving;
5. report (`report`): chain drafting simulated in PyTorch on held-out prompts: conditional
   acceptance per draft position and mean accept length, greedy and at temperature 0.7, top-k
   hit rates, and the untrained head for comparison; DIR/acceptance.json.

Presets (`presets`): `gpu` (one H100, about 4 minutes in all) and `toy` (a CPU, for CI; its
figures are a toy's).

Reproducibility: the split, the order of the training text and the tokenizer depend only on
the file and the seed. On a CPU a seed gives the same bytes again with the same torch and the
same number of threads. On a GPU it does not: cuBLAS and the attention kernels' backward
passes add in an order that varies from run to run, so the weights differ in their last bits
and the report's figures somewhat (by how much is for the first GPU runs to show);
`torch.use_deterministic_algorithms` is not set because it would slow the run past its budget
(and some kernels have no deterministic form).

torch, transformers, tokenizers and safetensors are not dependencies of the project: this
package's modules import them, and only `cli.main` imports those modules (on use), so
`import specdecode_tune.testing.eagle3` and `--help` need the standard library alone.
"""

from .cli import main
from .presets import PRESETS, Preset

__all__ = ["PRESETS", "Preset", "main"]
