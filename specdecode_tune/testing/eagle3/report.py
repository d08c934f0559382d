"""The acceptance report: EAGLE-3 chain drafting (topk 1) simulated in PyTorch with the target
and the head, on held-out ShareGPT prompts.

`simulate` runs speculative decoding as SGLang's EAGLE worker does, batch by batch, without KV
caches (each verify recomputes the target over the whole sequence, which causal attention makes
equal to a cached run): after the prefill the target's next token is the first "bonus" token;
then per iteration the head drafts `draft_steps` tokens from the target hidden states of every
accepted position (the draft extend) and its own chain, the target scores all of them in one
forward, and the longest accepted prefix plus one target token is emitted. Acceptance:

- greedy: a draft is accepted while it equals the target's argmax (lossless, so the text is the
  target's greedy text);
- `target_only` at temperature T: the draft is the head's top-1 token d and is accepted with
  probability p(d), p the target's softmax at T; on rejection the token is drawn from p without
  d. This is speculative sampling with a one-hot draft distribution, what SGLang 0.5.17 does by
  default at T > 0 (eagle_utils.py: `draft_probs` zeros, `tree_speculative_sampling_target_only`,
  thresholds 1.0);
- `rejection` at temperature T: the draft is sampled from q, the head's softmax at T, accepted
  with probability min(1, p(d) / q(d)), and on rejection the token is drawn from
  norm(max(0, p - q)) (SGLang's --speculative-use-rejection-sampling).

Figures per iteration: position k is "reached" when drafts 1..k-1 were accepted; the
conditional acceptance of position k is accepted / reached over all iterations (null where
never reached). The accept length of an iteration is accepted drafts + 1 (SGLang's
`spec_accept_length`); its mean is emitted tokens / iterations, over all prompts and per prompt.

`greedy_walk` gives greedy decoding's figures without the loop, from the head's chains
teacher-forced along the target's greedy text (greedy decoding emits that text whatever the
head): the untrained head's are computed so. `topk_hits` measures, teacher-forced along the
greedy text, how often the target's token is in
the head's top-k at draft position k given that it was in the top-k at every earlier position
(the chain of a full top-k tree; SGLang's tree keeps only `topk` nodes a level, so this is an
upper bound of what its tree can accept).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .head import KV, Eagle3Head
from .presets import Preset
from .target import Capture
from .tokenizer import EOS_ID

TOPKS = (1, 2, 4)


def _rates(num: torch.Tensor, den: torch.Tensor) -> list[float | None]:
    return [round(float(a) / float(b), 4) if b > 0 else None for a, b in zip(num, den)]


def _pick(logits: torch.Tensor, mode: str, temperature: float, gen: torch.Generator
          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The draft token of each row, and q (the draft distribution) where it is sampled."""
    if mode != "rejection":
        return logits.argmax(-1), None
    q = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(q, 1, generator=gen).squeeze(-1), q


@torch.no_grad()
def simulate(target: Any, head: Eagle3Head, prompts: Sequence[Sequence[int]], p: Preset, *,
             mode: str, temperature: float, seed: int, device: torch.device) -> dict[str, Any]:
    """Speculative decoding of `prompts` (token ids, `<s>` first) with `p.draft_steps`
    drafts a step; mode "greedy", "target_only" or "rejection". Returns the figures and the
    generated token ids of each prompt (`texts`)."""
    run = _Decoding(prompts, p, mode, temperature, seed, device)
    cap = Capture(target, p.capture_layers)
    try:
        aux = run.prefill(target, cap)
        while not bool(run.done.all()):
            drafts, qs = run.draft(head, aux)
            probs, aux = run.verify(target, cap)
            n_acc, bonus = run.accept(probs, drafts, qs)
            run.emit(n_acc, bonus)
    finally:
        cap.remove()
    return run.figures()


class _Decoding:
    """One batch of prompts decoded speculatively (`simulate`): the token buffer (prompt,
    accepted tokens, then the drafts under verification), each row's length, and the counters
    of drafts reached and accepted per position."""

    def __init__(self, prompts: Sequence[Sequence[int]], p: Preset, mode: str,
                 temperature: float, seed: int, device: torch.device) -> None:
        self.p, self.mode, self.temperature, self.device = p, mode, temperature, device
        self.k = k = p.draft_steps
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.b = b = len(prompts)
        self.plen = torch.tensor([len(x) for x in prompts], device=device)
        self.width = int(self.plen.max()) + p.eval_new_tokens + 2 * k + 2
        self.buf = torch.zeros(b, self.width, dtype=torch.long, device=device)
        for i, x in enumerate(prompts):
            self.buf[i, : len(x)] = torch.tensor(list(x), device=device)
        self.reached = torch.zeros(k, dtype=torch.long, device=device)
        self.accepted = torch.zeros(k, dtype=torch.long, device=device)
        self.iters = torch.zeros(b, dtype=torch.long, device=device)
        self.emitted = torch.zeros(b, dtype=torch.long, device=device)
        self.ar = torch.arange(b, device=device)
        self.lens = self.plen
        self.done = torch.zeros(b, dtype=torch.bool, device=device)

    def target_probs(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits.float() / max(self.temperature, 1e-6), dim=-1)

    def sample_p(self, probs: torch.Tensor) -> torch.Tensor:
        if self.mode == "greedy":
            return probs.argmax(-1)
        return torch.multinomial(probs, 1, generator=self.gen).squeeze(-1)

    def prefill(self, target: Any, cap: Capture) -> torch.Tensor:
        """The prompts through the target: its first token is the first bonus token. Returns
        the captured hidden states (the head's input)."""
        ar, plen = self.ar, self.plen
        logits = target(input_ids=self.buf[:, :int(plen.max())], use_cache=False).logits
        aux = cap.aux()
        self.buf[ar, plen] = self.sample_p(self.target_probs(logits[ar, plen - 1]))
        self.lens = plen + 1
        self.done = self.buf[ar, plen] == EOS_ID
        return aux

    def draft(self, head: Eagle3Head, aux: torch.Tensor
              ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """The draft extend over every accepted position, then the head's chain from row
        lens-2; the drafts [B, K] are written after each row's tokens. Returns them and their
        draft distributions (None where the draft is the head's top-1)."""
        ar, lens, k = self.ar, self.lens, self.k
        n = int(lens.max())
        kv = KV()
        pos = torch.arange(n - 1, device=self.device)[None].expand(self.b, n - 1)
        hid, lg = head.step(self.buf[:, 1:n], aux[:, : n - 1], pos, kv)
        row = (lens - 2)[:, None]
        hid = hid[ar, lens - 2][:, None]
        tok, q = _pick(lg[ar, lens - 2], self.mode, self.temperature, self.gen)
        drafts, qs = [tok], [q]
        for s in range(1, k):
            hid, lg = head.step(drafts[-1][:, None], hid, row + s, kv, row)
            tok, q = _pick(lg[:, 0], self.mode, self.temperature, self.gen)
            drafts.append(tok)
            qs.append(q)
        d = torch.stack(drafts, 1)                                  # [B, K]
        self.buf.scatter_(1, lens[:, None] + torch.arange(k, device=self.device)[None], d)
        return d, qs

    def verify(self, target: Any, cap: Capture) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's distributions at lens-1 .. lens-1+K [B, K+1, V], and the captured
        hidden states of the forward."""
        lens, k = self.lens, self.k
        logits = target(input_ids=self.buf[:, : int(lens.max()) + k], use_cache=False).logits
        aux = cap.aux()
        at = (lens - 1)[:, None] + torch.arange(k + 1, device=self.device)[None]
        return self.target_probs(logits[self.ar[:, None], at]), aux

    def accept(self, probs: torch.Tensor, d: torch.Tensor, qs: Sequence[torch.Tensor | None]
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(accepted drafts per row, the token after them): the replacement drawn at the first
        rejection, else the target's own next token. No host syncs in here: every row draws
        its would-be replacement token at every position, and the first rejection's is kept."""
        b, device = self.b, self.device
        ok = torch.ones(b, dtype=torch.bool, device=device)
        n_acc = torch.zeros(b, dtype=torch.long, device=device)
        bonus = torch.zeros(b, dtype=torch.long, device=device)
        live = ~self.done
        for s in range(self.k):
            ps = probs[:, s]
            acc, resid = _accepts(self.mode, ps, d[:, s: s + 1], qs[s], self.gen)
            self.reached[s] += (ok & live).sum()
            self.accepted[s] += (ok & acc & live).sum()
            resid = torch.where(resid.sum(-1, keepdim=True) > 0, resid, ps)
            replace = self.sample_p(resid / resid.sum(-1, keepdim=True))
            bonus = torch.where(ok & ~acc, replace, bonus)
            n_acc += (ok & acc).long()
            ok = ok & acc
        return n_acc, torch.where(ok, self.sample_p(probs[:, self.k]), bonus)

    def emit(self, n_acc: torch.Tensor, bonus: torch.Tensor) -> None:
        """The accepted drafts are in place: the bonus goes after them, the rejected drafts
        are cleared, and a row ends at EOS or after `eval_new_tokens`."""
        ar, lens, k, live = self.ar, self.lens, self.k, ~self.done
        steps = torch.arange(k + 1, device=self.device)
        self.buf[ar, lens + n_acc] = bonus
        clear = lens[:, None] + n_acc[:, None] + 1 + steps[None, :k]
        self.buf.scatter_(1, clear.clamp(max=self.width - 1), 0)
        new = torch.stack([self.buf[ar, lens + j] for j in range(k + 1)], 1)
        hit_eos = ((new == EOS_ID) & (steps[None] <= n_acc[:, None])).any(1)
        self.iters += live.long()
        self.emitted += (n_acc + 1) * live.long()
        self.lens = torch.where(live, lens + n_acc + 1, lens)
        self.done = self.done | hit_eos | (self.lens - self.plen >= self.p.eval_new_tokens)

    def figures(self) -> dict[str, Any]:
        iters, emitted = self.iters, self.emitted
        per_prompt = (emitted.float() / iters.clamp(min=1).float()).cpu()
        return {
            "mode": self.mode,
            "temperature": self.temperature if self.mode != "greedy" else 0.0,
            "per_position": _rates(self.accepted.cpu(), self.reached.cpu()),
            "reached": self.reached.tolist(),
            "accepted": self.accepted.tolist(),
            "iterations": int(iters.sum()),
            "mean_accept_length": round(float(emitted.sum()) / max(1, int(iters.sum())), 4),
            "per_prompt_accept_length": summary(per_prompt[iters.cpu() > 0].tolist()),
            "texts": [self.buf[i, int(self.plen[i]): int(self.lens[i])].tolist()
                      for i in range(self.b)],
        }


def _accepts(mode: str, ps: torch.Tensor, d: torch.Tensor, q: torch.Tensor | None,
             gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Whether each row's draft `d` [B, 1] is accepted under the target's distribution `ps`,
    and the distribution a rejection draws its replacement from (unnormalized); the rules of
    the module docstring per mode."""
    pd = ps.gather(1, d).squeeze(1)
    if mode == "greedy":
        return d[:, 0] == ps.argmax(-1), ps
    rand = torch.rand(ps.shape[0], device=ps.device, generator=gen)
    if mode == "target_only":
        return rand < pd, ps.scatter(1, d, 0.0)
    assert q is not None
    qd = q.gather(1, d).squeeze(1)
    return rand < (pd / qd).clamp(max=1.0), (ps - q).clamp(min=0.0)


def summary(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    v = sorted(values)

    def q(f: float) -> float:
        return round(v[min(len(v) - 1, int(f * len(v)))], 3)
    return {"min": round(v[0], 3), "p25": q(0.25), "median": q(0.5), "p75": q(0.75),
            "max": round(v[-1], 3)}


@torch.no_grad()
def teacher_forced(target: Any, head: Eagle3Head, prompts: Sequence[Sequence[int]],
                    texts: Sequence[Sequence[int]], p: Preset, device: torch.device
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The head's chains teacher-forced along prompt + text: (top [K, B, n, max k] of the
    head's top-k token ids of draft position k+1 at every row, truth [K, B, n] the text's
    token there, plen [B], lens [B]), on the CPU. Row i's chain is the one SGLang drafts
    after a verify whose last accepted token (the bonus) is at i+1."""
    cap = Capture(target, p.capture_layers)
    seqs = [list(a) + list(t) for a, t in zip(prompts, texts)]
    n = max(len(seq) for seq in seqs)
    ids = torch.zeros(len(seqs), n, dtype=torch.long, device=device)
    for i, seq in enumerate(seqs):
        ids[i, : len(seq)] = torch.tensor(seq, device=device)
    try:
        target(input_ids=ids, use_cache=False)
        aux = cap.aux()
    finally:
        cap.remove()
    top, truth = [], []
    for s, logits in enumerate(head.unroll(ids, aux, p.draft_steps)):
        top.append(logits.topk(max(TOPKS), dim=-1).indices.cpu())
        truth.append(torch.nn.functional.pad(ids[:, 2 + s:], (0, 2 + s)).cpu())
    plen = torch.tensor([len(a) for a in prompts])
    lens = torch.tensor([len(seq) for seq in seqs])
    return torch.stack(top), torch.stack(truth), plen, lens


def topk_hits(tf: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], p: Preset
              ) -> dict[str, list[float | None]]:
    """Conditional top-k hit rate per draft position, teacher-forced along the greedy texts
    (`teacher_forced`), over every chain start in the generated part."""
    top, truth, plen, lens = tf
    n = top.shape[2]
    rows = torch.arange(n)[None]
    start = rows + 1 >= plen[:, None]          # the chain's last known token is generated
    out = {}
    for k in TOPKS:
        alive = start.clone()
        num = torch.zeros(p.draft_steps, dtype=torch.long)
        den = torch.zeros(p.draft_steps, dtype=torch.long)
        for s in range(p.draft_steps):
            hit = (top[s, ..., :k] == truth[s][..., None]).any(-1)
            live = alive & ((rows + 2 + s) < lens[:, None])
            den[s] = live.sum()
            num[s] = (live & hit).sum()
            alive = live & hit
        out[str(k)] = _rates(num, den)
    return out


def greedy_walk(tf: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], p: Preset
                ) -> dict[str, Any]:
    """Greedy decoding's figures from the teacher-forced chains (`teacher_forced`) along the
    target's greedy texts, verify after verify: greedy decoding emits the target's greedy
    text whatever the head, and a verify accepts the drafts up to the first that is not the
    text's token, so this equals `simulate(mode="greedy")` without running the loop (up to
    bf16 ties, and the last verify of each text)."""
    top, truth, plen, lens = tf
    hit = (top[..., 0] == truth).tolist()          # [K][B][n]
    k_steps = p.draft_steps
    reached, accepted = [0] * k_steps, [0] * k_steps
    per_prompt = []
    iters = emitted = 0
    for b in range(len(plen)):
        r, end = int(plen[b]) - 1, int(lens[b])
        it = em = 0
        while r + 2 < end:
            a = 0
            for s in range(k_steps):
                if r + 2 + s >= end:
                    break
                reached[s] += 1
                if not hit[s][b][r]:
                    break
                accepted[s] += 1
                a += 1
            it += 1
            em += a + 1
            r += a + 1
        iters += it
        emitted += em
        if it:
            per_prompt.append(em / it)
    return {
        "mode": "greedy (teacher-forced walk along the greedy texts)",
        "temperature": 0.0,
        "per_position": _rates(torch.tensor(accepted), torch.tensor(reached)),
        "reached": reached,
        "accepted": accepted,
        "iterations": iters,
        "mean_accept_length": round(emitted / max(1, iters), 4),
        "per_prompt_accept_length": summary(per_prompt),
    }


@torch.no_grad()
def heldout_agreement(target: Any, head: Eagle3Head, rows: torch.Tensor, p: Preset,
                      device: torch.device, batch: int = 8) -> list[float]:
    """SpecForge's per-position accuracy on held-out text: teacher-forced TTT along the
    held-out documents (packed rows), how often the head's top-1 at draft position k equals
    the target's argmax there, over every row (not conditioned on earlier positions)."""
    cap = Capture(target, p.capture_layers)
    hits = torch.zeros(p.draft_steps)
    counts = torch.zeros(p.draft_steps)
    try:
        for i in range(0, len(rows), batch):
            x = rows[i: i + batch].long().to(device)
            best = target(input_ids=x, use_cache=False).logits.argmax(-1)
            aux = cap.aux()
            t = x.shape[1]
            for s, logits in enumerate(head.unroll(x, aux, p.draft_steps)):
                n = t - 1 - s
                hits[s] += float((logits[:, :n].argmax(-1) == best[:, 1 + s:]).sum())
                counts[s] += best[:, 1 + s:].numel()
    finally:
        cap.remove()
    return [round(float(h / c), 4) for h, c in zip(hits, counts)]


def mean_length(rates: Sequence[float | None]) -> float:
    """The accept length a chain with these conditional rates would give: 1 + sum over k of
    the product of the rates up to k."""
    total, prod = 1.0, 1.0
    for r in rates:
        if r is None:
            break
        prod *= r
        total += prod
    return round(total, 4)


def table(report: dict[str, Any]) -> str:
    """The compact table printed at the end of a run."""
    k = report["eval"]["draft_steps"]
    head = f"{'':26}" + "".join(f"{'pos ' + str(i + 1):>7}" for i in range(k)) + \
        f"{'accept len':>12}"
    lines = [head]

    def row(name: str, rates: Sequence[float | None], length: float | str) -> None:
        cells = "".join(f"{'-' if r is None else format(r, '.2f'):>7}" for r in rates)
        lines.append(f"{name:26}{cells}{length!s:>12}")

    for key, label in (("greedy", "greedy"), ("target_only", "T=0.7 top-1 drafts"),
                       ("rejection", "T=0.7 sampled drafts")):
        r = report[key]
        row(label, r["per_position"], f"{r['mean_accept_length']:.2f}")
    for kk, rates in report["topk_hits"].items():
        row(f"top-{kk} hit (teacher-forced)", rates, f"({mean_length(rates):.2f})")
    row("held-out text top-1 (TTT)", report["heldout_agreement"], "")
    u = report["untrained_head"]["greedy"]
    row("untrained head, greedy", u["per_position"], f"{u['mean_accept_length']:.2f}")
    return "\n".join(lines)
