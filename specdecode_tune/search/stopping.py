"""When a search knows enough, and which boots it need not make.

`max_trials` is a cap, not a target: a boot of a 100B+ model costs minutes of a GPU pair, and a
search that has learnt where the optimum is should not spend the rest of its budget confirming
it. Two rules, asked by `RepeatingSearcher` (`search.searcher`) before each boot:

- `StopRule`: exploring stops (the final re-measurements still run, then the searcher finishes)
  when all of these hold:
  - at least `min_explored` points were explored, and no exploration is still running (its
    answer could change the model);
  - the sampler's model fits the measurements well (its in-sample error is under its limit:
    where it does not, nothing is known and the search runs to its cap);
  - no plateau question is open: no far probe decided or running, and none the next trial
    would start (`HybridSampler.outlook`);
  - over every configuration not yet measured, the best expected gain *beyond the noise
    band* (the mean over posterior draws of max(0, score - reference - band), in the score's
    units, log-speedup) is at most `ei_fraction` (0.5) of the band (the narrower of the one
    the repeats measured and the experiment's `search.noise_band`, so that a noisy server's
    wide band does not pass a gain worth a boot as noise). A gain inside the band is one a
    boot cannot tell from noise: it does not rank the point above the incumbent, so it is not
    worth a boot. Until 2026-12-06 the rule asked the expected improvement itself, small gains
    included, to be at most a quarter of the band; near an optimum the model's spread keeps that
    above the limit at every unmeasured neighbour, and the search walked them one boot each
    (bench-two-regime 17.5 / 23 boots, the replay of `benchmarks/whole_search.py`; with this
    rule 13 / 15, picks within 2% 39 of 40 over the four profiles as before: the figures are
    in docs/search-efficiency.md).
  The reason is kept (`StopRule.why`) and printed on the search's last lines.
  While a plateau probe (a jump) runs, the question is open and the rule cannot hold; the
  model would propose the trial beside it. Where that proposal's expected gain beyond the band
  is itself within the limit (`waits_for_probe`), it is not booted: the next exploration waits
  for the probe's answer. Booted beside the probe, such a proposal was a point the rule would
  not have booted a moment later (bench-tile-shelves seeds 3, 19 and 29 of the replay: steps
  7 at another memory fraction, expected improvement 0.003-0.005, beside the jump to steps
  10-12; docs/search-efficiency.md, 2026-12-07).
- `KVGate`: before a boot, a point the fitted memory model (the KV budget line, the
  out-of-memory boundary, the neighbourhoods refused boots rule out: `samplers.model`) says the
  server will refuse (the share of posterior draws in which the boot succeeds is at most
  `max_p_feasible`, 5%) is not booted: Optuna is told a violated constraint, as for a refusal,
  and the point is recorded as skipped with the prediction. Where the fit is unsure the point
  is booted once: that probe measures the boundary. After the search's first refused boot,
  points that boot in fewer than `after_refusal` (90%) of the draws are skipped too, so the
  next boots stay on the boundary's safe side: the first refusal showed the fit can be wrong
  there, and a second boundary (the KV pool's minimum beside the capture's out-of-memory
  edge) is no better known. Measured with `benchmarks/whole_search.py`, 10 seeds a profile,
  2026-12-05 (ranking with the shrunk spread): on bench-noisy, whose optimum sits beside the
  out-of-memory edge, 70% and 80% let one seed be refused twice (its second refusal the KV
  pool's minimum, booted at p 0.89); 90% skips that boot and changes nothing else on any
  profile (boots 12 / 15, picks 7/10 within 2%); 95% skips 11 points over the seeds and loses
  a pick. (2026-12-04, before the logged memory and the calibrated warm-up, 90% cost picks:
  83-93% of the optimum; the edge was then found only by probing it.)

Both read the sampler's `outlook` / `predict` (`samplers.HybridSampler`, the default) and do
nothing for samplers without them: the other samplers run to `max_trials` and boot what they
propose, as before.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

PREDICTED_KEY = "_predicted"     # config key: the model's prediction at proposal time (JSON)


class StopRule:
    """Whether exploring can stop: the model knows, and no plateau question is open."""

    def __init__(self, *, min_explored: int = 4, ei_fraction: float = 0.5) -> None:
        if isinstance(min_explored, bool) or not isinstance(min_explored, int) \
                or min_explored < 1:
            raise ValueError(f"min_explored must be an int >= 1, got {min_explored!r}")
        if not (isinstance(ei_fraction, (int, float)) and math.isfinite(ei_fraction)
                and ei_fraction > 0):
            raise ValueError(f"ei_fraction must be a number > 0, got {ei_fraction!r}")
        self.min_explored = min_explored
        self.ei_fraction = float(ei_fraction)
        self.why: str | None = None
        self.waits_for_probe = False

    def check(self, study: Any, sampler: Any, band: float, explored: int) -> str | None:
        """Why exploring stops now (also kept in `why`), or None to go on."""
        if self.why is not None:
            return self.why
        self.waits_for_probe = False
        outlook = getattr(sampler, "outlook", None)
        if outlook is None or explored < self.min_explored:
            return None
        o = outlook(study, band=band)
        limit = self.ei_fraction * band
        # A plateau probe is running and the model's own next proposal is not worth a boot by
        # this rule's measure: the next exploration waits for the probe's answer (which either
        # opens a new question or lets the rule hold) instead of booting it beside the probe.
        beside = o.get("model_ei_beyond_band")
        self.waits_for_probe = bool(
            o.get("by") == "plateau" and o.get("running") and isinstance(beside, (int, float))
            and beside <= limit)
        if o.get("by") != "model" or not isinstance(o.get("ei_beyond_band"), (int, float)):
            return None
        if o["ei_beyond_band"] > limit:
            return None
        ei = o.get("ei")
        said = "" if not isinstance(ei, (int, float)) else \
            f"; the best expected improvement, small gains included, is {ei:+.4f}"
        self.why = (f"the model knows: the best remaining expected gain beyond the noise band "
                    f"is {o['ei_beyond_band']:+.4f} (log-speedup; at most {limit:.4f}, "
                    f"{self.ei_fraction:g} of +-{band:.3f}){said}; the model's fit error is "
                    f"{o.get('fit_error', 0.0):.1%}; no plateau question is open; {explored} "
                    f"points explored")
        return self.why


class KVGate:
    """Skips boots the fitted KV model is sure the server refuses, and (`known`) boots the
    servers' release is known to crash on (`backends.known_refusal`)."""

    def __init__(self, *, max_p_feasible: float = 0.05, after_refusal: float = 0.9,
                 known: Callable[[Mapping[str, Any]], str | None] | None = None) -> None:
        if not (isinstance(max_p_feasible, (int, float)) and 0 <= max_p_feasible < 1):
            raise ValueError(f"max_p_feasible must be in [0, 1), got {max_p_feasible!r}")
        if not (isinstance(after_refusal, (int, float))
                and max_p_feasible <= after_refusal < 1):
            raise ValueError(f"after_refusal must be in [max_p_feasible, 1), got "
                             f"{after_refusal!r}")
        self.max_p_feasible = float(max_p_feasible)
        self.after_refusal = float(after_refusal)
        self.skipped: list[dict[str, Any]] = []
        self.known = known          # picklable (a partial of a module-level function)

    def refuses(self, config: Mapping[str, Any], refused_before: bool = False) -> str | None:
        """Why this proposal is not booted (a sentence), or None to boot it. Reads the
        prediction the proposal carries (`PREDICTED_KEY`). `refused_before`: the server has
        refused a boot of this search already (the boundary was probed once: an unsure point,
        booting in fewer than `after_refusal` of the draws, is skipped too)."""
        point = {k: v for k, v in config.items() if not k.startswith("_")}
        known = self.__dict__.get("known")       # a gate pickled before it: None
        crash = known(point) if known is not None else None
        if crash is not None:
            self.skipped.append({"params": point, "why": crash, "by": "release"})
            return f"not booted: {crash}"
        pred = prediction_of(config)
        if pred is None or not isinstance(pred.get("p_feasible"), (int, float)):
            return None
        p = float(pred["p_feasible"])
        limit = self.after_refusal if refused_before else self.max_p_feasible
        if p > limit or (refused_before and p >= limit):
            return None
        why = (f"not booted: the fitted KV model says the server refuses it (the boot "
               f"succeeds in {p:.0%} of the posterior draws, "
               + (f"under {limit:.0%} after a refusal)" if refused_before
                  else f"<= {limit:.0%})"))
        self.skipped.append({"params": point, "p_feasible": p, "why": why})
        return why


def prediction_of(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The prediction a proposed config carries, or None."""
    raw = config.get(PREDICTED_KEY)
    if not raw:
        return None
    try:
        pred = json.loads(raw) if isinstance(raw, str) else dict(raw)
    except (TypeError, ValueError):
        return None
    return pred if isinstance(pred, dict) else None
