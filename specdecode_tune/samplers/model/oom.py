"""The out-of-memory boundary: which (memory fraction, draft tokens) the server refuses at boot.

SGLang needs room outside the static pool (1 - mem_fraction_static of the GPU) for buffers that
grow with the tokens verified per step (CUDA-graph capture of the draft and verify passes); with
too little it fails the boot with "CUDA out of memory" (the simulator copies the rule:
`sim/boot.py`, headroom need = fixed + per-token * cuda_graph_max_bs * n). So a boot at
(mem, n) runs out of memory where mem > alpha - beta * n, beta >= 0: a boundary line, unknown.

This module keeps the set of lines consistent with what was measured (a version space):
every refused boot of kind "oom" at (m, n) says alpha - beta * n < m; every boot that ran at
(m, n) says alpha - beta * n >= m. Where the engine logged its memory after the CUDA graph
capture (SGLang's "avail mem" and "mem usage" lines, as shares of the memory its pool is sized
against: `TrialObs.room` r, the free memory after the last capture, and `TrialObs.graph` g,
what the captures kept), a boot that ran also says:
- alpha - beta * n <= m + r: the fraction could not have risen by more than r (the capture would
  have had less than it kept). An upper bound, as a refusal is.
- alpha - beta * n >= m + r - g: it could have risen by r - g, if the warm-up passes before a
  capture, whose memory is freed before the reading, use no more than the capture keeps (they
  run the same forward passes eagerly).
- beta between the growth of g per draft token (a line over boots at two or more draft counts)
  and twice it, and at most 2 g / n of any boot: by the same assumption the need grows per
  draft token at least as the graphs' memory does and at most twice as fast, and the graphs
  keep at least their per-token part.
Those two rest on our assumption (measured on an H200 with a stand-in capture in SGLang's
pattern, not SGLang itself: the warm-up took 0.33-0.79 of the graphs' memory with SGLang's own
batch sizes, the need grew 1.97 times as fast as the graphs; docs/engines-sglang.md section
6b): where a refusal contradicts them they are dropped, then the upper bounds if they too
contradict the refusals (another process took memory between boots), and the refusals alone
bound the line. Within a band from the logged graphs the slopes are spread evenly across it;
the log-spaced grid (for refusals alone, where the slope is unknown by decades) weighted the
band's steep end least, where a large warm-up puts the truth (docs/search-efficiency.md has
the figures).
Over a grid of slopes beta, each consistent slope has an interval of alpha. A point is refused
in a draw when it lies above the drawn line; where every consistent line says so, the refusal
is certain (p_feasible 0). With neither a refusal nor a logged room nothing bounds the line from
above and nothing is predicted refused: the first out-of-memory boot is the probe that measures
the boundary. SGLang's capture progress ("Capturing batches (bs=N avail_mem=X GB)") is not
read: `torch.cuda.graph` empties the cache before each capture, so its least reading is the end
reading (measured there: 2 MB apart) and says nothing more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .trials import TrialObs

# Mem fraction per draft token, 0 .. 0.05 (0.8 over 16 tokens), log-spaced: a uniform prior
# on the log of the slope (real servers' graph buffers cost a few hundred MB per draft token
# on a 80-140 GB GPU, 0.002-0.01), so a small slope is as likely as a large one per decade.
SLOPES = np.concatenate([[0.0], np.geomspace(1e-4, 0.05, 100)])
# Within a band the logged graphs allow, slopes spread evenly (ours: a count, not a measurement).
BAND_SLOPES = 24


@dataclass(frozen=True)
class OOMFit:
    beta: np.ndarray            # consistent slopes
    lo: np.ndarray              # alpha >= lo (per slope; -inf where nothing ran)
    hi: np.ndarray              # alpha < hi (per slope)

    @property
    def floor(self) -> np.ndarray:
        """alpha's lower end per slope: `lo`, or 0.2 under `hi` where the interval is open
        below (the prior's span)."""
        return np.where(np.isfinite(self.lo), self.lo, self.hi - 0.2)

    def draws(self, rng: np.random.Generator, m: int) -> tuple[np.ndarray, np.ndarray]:
        """(alpha, beta) of `m` lines drawn from the version space (uniform slope, uniform
        alpha in its interval; an interval open below spans 0.2 under its top)."""
        i = rng.integers(len(self.beta), size=m)
        lo = self.floor[i]
        alpha = lo + (self.hi[i] - lo) * rng.random(m)
        return alpha, self.beta[i]

    def refused(self, alpha: np.ndarray, beta: np.ndarray, mem: np.ndarray,
                n: np.ndarray) -> np.ndarray:
        """(draws, N): whether each drawn line refuses each point."""
        return mem[None, :] > alpha[:, None] - beta[:, None] * n[None, :] + 1e-9

    def p_feasible(self, mem: float, n: float) -> float:
        """The share of the version space (slopes uniform, alpha uniform) that boots (mem, n)."""
        need = mem + self.beta * n
        lo = self.floor
        span = np.maximum(self.hi - lo, 1e-12)
        return float(np.mean(np.clip((self.hi - need) / span, 0.0, 1.0)))


def fit_oom(obs: Sequence[TrialObs]) -> OOMFit | None:
    """The version space of boundary lines, or None where nothing bounds it from above (no
    out-of-memory boot, no logged room)."""
    oom = [((o.mem if o.mem is not None else 1.0), o.draft) for o in obs
           if not o.feasible and o.failure == "oom"]
    ran = [((o.mem if o.mem is not None else 1.0), o.draft) for o in obs if o.feasible]
    # (mem, room, graphs' memory, draft tokens) of the boots that logged their memory
    logged = [(o.mem, o.room, o.graph, o.draft) for o in obs
              if o.feasible and o.mem is not None and o.room is not None and o.room >= 0]
    upper = [(m + r, n) for m, r, _, n in logged]
    graphs = [(m, r, g, n) for m, r, g, n in logged if g is not None and g > 0 and n > 0]
    lower = [(m + r - g, n) for m, r, g, n in graphs if r > g]
    slopes = _slopes([(n, g) for _, _, g, n in graphs])
    tries = [(oom + upper, ran + lower, slopes), (oom + upper, ran, None)] if upper else []
    for above, below, band in [*tries, (oom, ran, None)]:
        if above and (fit := _fit(above, below, band)) is not None:
            return fit
    return None


def _slopes(graphs: Sequence[tuple[int, float]]) -> tuple[float, float] | None:
    """(least, steepest) slope the logged graph memory allows: the graphs' growth per draft token
    (a least-squares line over boots at two or more draft counts) up to twice it, or up to
    twice the graphs' memory per draft token of any boot (they keep at least their per-token
    part); None without a logged graph. `graphs`: (draft tokens, graphs' memory) per boot."""
    if not graphs:
        return None
    steepest = min(2 * g / n for n, g in graphs)
    n = np.array([n for n, _ in graphs], dtype=float)
    g = np.array([g for _, g in graphs], dtype=float)
    if len(set(n.tolist())) < 2:
        return 0.0, steepest
    growth = float(np.polyfit(n, g, 1)[0])
    if growth <= 0 or growth > steepest:
        return 0.0, steepest
    return growth, min(steepest, 2 * growth)


def _fit(above: list[tuple[float, int]], ran: list[tuple[float, int]],
         slopes: tuple[float, float] | None = None) -> OOMFit | None:
    """Lines below every `above` point (a refusal, or a ran boot's room) and on or above every
    `ran` point, with a slope within `slopes` (least, steepest) where given."""
    b = SLOPES if slopes is None else np.linspace(*slopes, BAND_SLOPES)
    hi = np.min([m + b * n for m, n in above], axis=0)
    lo = np.max([m + b * n for m, n in ran], axis=0) if ran else np.full(b.shape, -np.inf)
    ok = lo < hi + 1e-9         # a room of 0 (a boot on the boundary) leaves one line
    if not ok.any():
        return None             # no line explains the data: the rule does not hold here
    return OOMFit(beta=b[ok], lo=lo[ok], hi=hi[ok])


def oom_sure(fit: OOMFit | None, cands: Any) -> np.ndarray:
    """(N,) whether every line of the version space boots each candidate (`cands`: its `mem`,
    None for 1.0, and `draft` arrays); all True without a boundary."""
    mem = np.asarray(cands.mem, dtype=float)
    if fit is None:
        return np.ones(mem.shape, dtype=bool)
    n = np.asarray(cands.draft, dtype=float)
    need = mem[:, None] + fit.beta[None, :] * n[:, None]
    return np.all(need <= fit.floor[None, :] + 1e-9, axis=1)


def fit_oom_running(obs: Sequence[TrialObs], running: Sequence[TrialObs],
                    measured: OOMFit | None) -> OOMFit | None:
    """The version space with points other trials are measuring now counted as refused (the
    pessimistic view of a concurrent proposal: it does not bet on a boundary they probe). A
    running point no line can join with the measurements (in effect below a boot that ran)
    says nothing and is left out: counting it would leave no line, and with no line nothing
    would be predicted refused at all. `measured`: `fit_oom(obs)`, kept when no running point
    is."""
    kept: list[TrialObs] = []
    for r in running:
        if fit_oom([*obs, *kept, r]) is not None:
            kept.append(r)
    return fit_oom([*obs, *kept]) if kept else measured


def running_as_refused(running: Sequence[tuple], obs: Sequence[TrialObs] = ()
                       ) -> list[TrialObs]:
    """The points other trials are measuring now (`running`: their keys, `point_key`), as if
    the server had refused them for memory: a proposal made while they run does not bet on the
    boundary they probe. A point a measured boot shows will run (one ran at a fraction at least
    as high with at least as many draft tokens) is no such bet and is left out: a refusal there
    would contradict the measurements, and no boundary line would be left."""
    ran = [(1.0 if o.mem is None else o.mem, o.draft) for o in obs if o.feasible]
    out = []
    for steps, topk, draft, mem in running:
        m = 1.0 if mem is None else mem
        if any(rm >= m - 1e-9 and rn >= draft for rm, rn in ran):
            continue
        out.append(TrialObs(steps=steps, topk=topk, draft=draft, mem=mem, feasible=False,
                            failure="oom", kv=None, limit=None, levels=()))
    return out
