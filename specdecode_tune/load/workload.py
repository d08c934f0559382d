"""Workloads: which prompts a load level sends, with which output lengths and sampling settings.

Two kinds:

- ``random``: prompts of seeded random common words, one word per token for a server that
  counts whitespace words (a real tokenizer sees about one token per common word too). Input
  and output lengths are fixed or drawn uniformly from an inclusive ``(low, high)`` range.
- ``jsonl``: one prompt per line of a file, in any of three shapes (see `config.promptfile`,
  which reads and validates the file when the experiment loads): OpenAI ``messages``, ShareGPT
  ``conversations`` or ``{"prompt": "..."}``. Output lengths come from the spec, so trials stay
  comparable.

Everything is deterministic per ``(seed, stream)``: ``stream`` selects an independent sequence
(the trial gives each level its own, so a server's prefix cache never sees a repeated prompt
from an earlier level, while level k of every trial gets exactly the same prompts).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from ..config import Length, WorkloadSpec
from ..config.promptfile import load_rows

# Common short English words: most tokenizers encode " word" as a single token, so a prompt of
# N words is close to N tokens on a real server and exactly N on one that counts words.
_VOCAB = tuple(
    """the of and to in is was for on are with as his they be at one have this from or had by
    word but what some we can out other were all there when up use your how said an each she
    which do their time if will way about many then them write would like so these her long
    make thing see him two has look more day could go come did number sound no most people my
    over know water than call first who may down side been now find any new work part take get
    place made live where after back little only round man year came show every good me give
    our under name very through just form sentence great think say help low line differ turn
    cause much mean before move right boy old too same tell does set three want air well also
    play small end put home read hand port large spell add even land here must big high such
    follow act why ask men change went light kind off need house picture try us again animal
    point mother world near build self earth father head stand own page should country found
    answer school grow study still learn plant cover food sun four between state keep eye never
    last let thought city tree cross farm hard start might story saw far sea draw left late run
    while press close night real life few north open seem together next white children begin
    got walk example ease paper group always music those both mark often letter until mile
    river car feet care second book carry took science eat room friend began idea fish
    mountain stop once base hear horse cut sure watch color face wood main enough plain girl
    usual young ready above ever red list though feel talk bird soon body dog family direct
    pose leave song measure door product black short numeral class wind question happen
    complete ship area half rock order fire south problem piece told knew pass since top whole
    king space heard best hour better true during hundred five remember step early hold west
    ground interest reach fast verb sing listen six table travel less morning ten simple
    several vowel toward war lay against pattern slow center love person money serve appear
    road map rain rule govern pull cold notice voice unit power town fine certain fly fall
    lead cry dark machine note wait plan figure star box noun field rest correct able pound
    done beauty drive stood contain front teach week final gave green quick develop ocean warm
    free minute strong special mind behind clear tail produce fact street inch multiply
    nothing course stay wheel full force blue object decide surface deep moon island foot
    system busy test record boat common gold possible plane stead dry wonder laugh thousand
    ago ran check game shape equate miss brought heat snow tire bring yes distant fill east
    paint language among""".split()  # noqa: SIM905 (500 words read better as prose than as a list)
)


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request's worth of workload: what to send and how much to ask for."""

    text: str                                   # the prompt as plain text (all APIs but chat)
    messages: tuple[dict[str, str], ...] | None  # chat turns for /v1/chat/completions, if any
    input_len: int                              # estimate: whitespace words in the prompt
    output_len: int                             # tokens to ask for (max_new_tokens / max_tokens)
    temperature: float = 0.0
    ignore_eos: bool = True
    prompt_id: str | None = None                # the prompt's id in its source (ShareGPT id)


def make_prompts(spec: WorkloadSpec, n: int, stream: int = 0) -> list[Prompt]:
    """The first `n` prompts of `spec`'s sequence number `stream` (deterministic)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n=}")
    return list(itertools.islice(iter_prompts(spec, stream), n))


def iter_prompts(spec: WorkloadSpec, stream: int = 0,
                 lengths: Mapping[str, tuple[int, int]] | None = None) -> Iterator[Prompt]:
    """An endless, deterministic prompt sequence; with `max_prompts` it cycles over that many.
    `lengths` (sharegpt: the server's token counts by prompt id, `load.tokencount`) replaces
    the sample's counts and keeps only the prompts it names."""
    rng = random.Random(_mix(spec.seed, stream))
    if spec.kind == "random":
        gen = _random_prompts(spec, rng)
        if spec.max_prompts is not None:
            return itertools.cycle(list(itertools.islice(gen, spec.max_prompts)))
        return gen
    if spec.kind == "sharegpt":
        return _sharegpt_prompts(spec, rng, lengths)
    return _jsonl_prompts(spec, rng)


def _mix(seed: int, stream: int) -> int:
    # A fixed odd multiplier keeps (seed, stream) pairs apart without Python's salted hash().
    return (seed * 0x9E3779B97F4A7C15 + stream) & ((1 << 64) - 1)


def _draw(rng: random.Random, length: Length) -> int:
    if isinstance(length, int):
        return length
    return rng.randint(length[0], length[1])


def _random_prompts(spec: WorkloadSpec, rng: random.Random) -> Iterator[Prompt]:
    vocab = _VOCAB
    while True:
        n_in = _draw(rng, spec.input_len)
        n_out = _draw(rng, spec.output_len)
        text = " ".join(rng.choices(vocab, k=n_in))
        yield Prompt(text, None, n_in, n_out, float(spec.temperature), spec.ignore_eos)


def _jsonl_prompts(spec: WorkloadSpec, rng: random.Random) -> Iterator[Prompt]:
    # validated (and, in the process that loaded the experiment, parsed) at load time
    rows = load_rows(spec.path, spec.max_prompts)  # type: ignore[arg-type]
    order = list(range(len(rows)))
    while True:
        # A fresh seeded order each pass, so a file sorted by length still mixes within a level.
        rng.shuffle(order)
        for i in order:
            text, messages = rows[i]
            yield Prompt(
                text,
                messages,
                len(text.split()),
                _draw(rng, spec.output_len),
                float(spec.temperature),
                spec.ignore_eos,
            )


def _sharegpt_prompts(spec: WorkloadSpec, rng: random.Random,
                      lengths: Mapping[str, tuple[int, int]] | None) -> Iterator[Prompt]:
    # drawn when the spec was built (and cached on disk for other processes)
    prompts = [(p, (p.input_len, p.output_len) if lengths is None else lengths[p.id])
               for p in spec.sharegpt_sample().prompts if lengths is None or p.id in lengths]
    order = list(range(len(prompts)))
    while True:
        rng.shuffle(order)
        for i in order:
            p, (n_in, n_out) = prompts[i]
            yield Prompt(p.text, ({"role": "user", "content": p.text},), n_in, n_out,
                         float(spec.temperature), spec.ignore_eos, p.id)
