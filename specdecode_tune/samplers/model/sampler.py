"""`ModelGuidedSampler`: proposes the configuration with the largest expected improvement (EI)
of the search's score under the fitted model, and hands over where the model cannot be trusted.

Before each fresh trial the model is fitted anew (`fit`; nothing but measurements goes in) and
EI is averaged over joint posterior draws, with infeasible draws counting as no improvement,
over every valid configuration of the space (`candidates`), excluding those measured or
running; ties go to the higher mean score. The improvement is over the model's own mean of the
best measured configuration (the plug-in reference for noisy measurements: the best measured
value is the luckiest boot, against which nothing looks like an improvement;
`improvement.reference`). The plan names the model's four axes; every other parameter follows
the incumbent (else the base sampler). The base sampler (TPE by default) takes the trial
instead on:

- thin data: fewer than `min_trials` finished trials, or no feasible speculative trial with
  measurements yet (nothing to fit); with `cold_start` (the hybrid default) the model proposes
  anchors there instead (`anchor`: the configuration most likely to boot, bisecting the
  memory fraction on refusals);
- poor fit: the model's in-sample error on the measured tokens/s is above `max_residual` (or
  1.5 noise bands, when the measured band is wider), i.e. the server behaves in a way the
  model cannot express; the base sampler then searches it as a black box;
- nothing left: every configuration the model can name was measured or is running.

Once a boot was refused (out of memory, not enough KV memory), the model proposes only points
that boot in at least `SAFE_P` (`improvement`) of its posterior draws (while any remain): the
first refusal is the probe of the boundary, the next points stay on its safe side.

Every trial records who proposed it and why (the user attr "model_guided"). The sampler keeps
nothing between trials but its settings (the study holds the data), so it pickles with the
searcher and a fresh instance over a resumed study carries on. Its only randomness is the
posterior draws, seeded by (seed, trial number), and the base sampler's.

The parts it uses, one module each: `contexts` (the parameters the model has no term for,
one fit per combination), `improvement` (EI per context and the reference), `anchor` (the
cold start) and `oom.running_as_refused` (the pessimistic view of running trials).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from ...space import DRAFT, MEM, STEPS, TOPK, ParamSpec, is_baseline, resolve
from ..history import distributions, incumbent, union_spec, value_of
from ..observations import BASELINE_ATTR, MEASURED_ATTR, NOISE_BAND_ATTR
from ..planned import PlannedSampler, fit_into, set_trial_user_attr
from .anchor import anchor
from .candidates import Candidates, enumerate_space, one, point_key, subset
from .contexts import context_of, contexts, ctx_text, fitted_in, in_context
from .fit import Fit, fit_model, level_draws, predict_levels, score_draws, score_of
from .improvement import Option, Pick, best_reference, pick, sure_points
from .oom import fit_oom_running, oom_sure, running_as_refused
from .trials import TrialObs, parse_baseline, parse_measured

DECISION_ATTR = "model_guided"      # trial user attr: who proposed the trial, and why


class ModelGuidedSampler(PlannedSampler):
    """Proposes by expected improvement under a fitted model of speculative decoding.

    Args:
        base_sampler: proposes where the model does not (default `TPESampler(seed=seed)`).
        space: the experiment's searched parameters (`config.Experiment.space`); without it the
            space is read from the trials' distributions (which may not show the whole range
            of a define-by-run parameter).
        fixed: the backend's fixed flags, to resolve points as the trial will.
        min_trials: finished trials before the model may propose (the base sampler's first ones).
        max_residual: in-sample relative error of tok/s above which the model hands over.
        draws: posterior draws for EI.
        pessimistic_running: a point another trial is measuring counts, for the out-of-memory
            boundary of this proposal, as refused (two concurrent boots do not both bet on a
            boundary neither has measured).
        seed: seeds the draws (and the default base sampler).
        per_level: propose by the expected improvement of any level's best measured tok/s
            (the largest over levels), not of the score: a per-batch-size schedule uses the
            best config at every level (`[objective] kind = "schedule"`).
        refuses: why the servers' release crashes on a sampled point, or None
            (`backends.known_refusal` for the experiment's backend; picklable): such points
            are not candidates.
        cold_start: until a speculative boot has run, propose anchors (`anchor`: the
            configuration most likely to boot, bisecting memory on refusals) instead of
            handing the trial to the base sampler.
    """

    plan_key = "model_guided:plan"   # trial system attr: the proposed point

    def __init__(
        self,
        base_sampler: BaseSampler | None = None,
        *,
        space: Sequence[ParamSpec] | None = None,
        fixed: Mapping[str, Any] | None = None,
        min_trials: int = 2,
        max_residual: float = 0.08,
        draws: int = 48,
        pessimistic_running: bool = False,
        seed: int | None = None,
        per_level: bool = False,
        cold_start: bool = False,
        refuses: Callable[[Mapping[str, Any]], str | None] | None = None,
    ) -> None:
        super().__init__(base_sampler, seed)
        self._per_level = bool(per_level)
        self._refuses = refuses
        if isinstance(min_trials, bool) or not isinstance(min_trials, int) or min_trials < 0:
            raise ValueError(f"min_trials must be an int >= 0, got {min_trials!r}")
        if not (isinstance(max_residual, (int, float)) and math.isfinite(max_residual)
                and max_residual > 0):
            raise ValueError(f"max_residual must be a number > 0, got {max_residual!r}")
        if isinstance(draws, bool) or not isinstance(draws, int) or draws < 8:
            raise ValueError(f"draws must be an int >= 8, got {draws!r}")
        self._space = tuple(space) if space is not None else None
        self._fixed = dict(fixed or {})
        self._min_trials = min_trials
        self._max_residual = float(max_residual)
        self._draws = draws
        self._seed = 0 if seed is None else int(seed)
        self._pessimistic = bool(pessimistic_running)
        self._cache: dict[tuple, Candidates] = {}
        self._cold_start = bool(cold_start)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"] = {}        # derived from the space; rebuilt on demand
        return state

    # ------------------------------------------------------------------ the planned hooks

    def plan_trial(self, study: Study, trial: FrozenTrial) -> None:
        decision, plan = self.decide(study, trial.number)
        set_trial_user_attr(study, trial, DECISION_ATTR, decision)
        if plan is not None:
            self.store_plan(study, trial, plan)

    def planned_value(self, study: Study, trial: FrozenTrial, plan: dict[str, Any], name: str,
                      dist: BaseDistribution) -> Any:
        return fit_into(plan[name], dist) if name in plan else None

    # ------------------------------------------------------------------ deciding

    def decide(self, study: Study, number: int, band: float | None = None
               ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """(the decision recorded on the trial, the planned point or None for the base).
        `band`: also say the largest expected gain beyond it over the free points
        ("ei_beyond_band"; the stop rule's question, `search.stopping`)."""
        trials = study.get_trials(deepcopy=False)
        state = self.fitted(study, trials)
        if isinstance(state, str):
            if self.__dict__.get("_cold_start"):
                anchored = self._anchor(trials, number, state)
                if anchored is not None:
                    return anchored
            return _base(state), None
        ctxs = self._contexts(trials)
        options, poor = self._options(study, trials, number, state, ctxs)
        if not options:
            if poor and len(poor) == len(ctxs):
                return _base("poor fit: " + "; ".join(poor), state[0]), None
            return _base("every configuration the model can name was measured", state[0]), None
        best_trial = incumbent(study, trials)
        ref = best_reference(options)
        best_score = ref if ref is not None else (
            value_of(best_trial) if best_trial is not None else 0.0)
        picks = []
        beyond = 0.0
        sure = sure_points(options)
        for option in options:
            chosen, over = pick(option, best_score, band, self._per_level, sure)
            picks.append(chosen)
            beyond = max(beyond, over)
        best = max(picks, key=lambda p: (p.ei, p.mean))
        plan = dict(best.option.cands.sampled[best.at])
        plan.update(best.option.ctx)
        plan.update(_others(None if best_trial is None else dict(best_trial.params),
                            known=set(plan)))
        decision = _decision(best, best_score)
        if band is not None:
            decision["ei_beyond_band"] = beyond
        return decision, plan

    def _options(self, study: Study, trials: Sequence[FrozenTrial], number: int,
                 pooled: tuple[Fit, Candidates, list[TrialObs]], ctxs: Sequence[dict[str, Any]]
                 ) -> tuple[list[Option], list[str]]:
        """(Per context whose fit is good and where a point is free, its fit and its
        candidates' posterior draws; why each context with a poor fit was left out). With
        `pessimistic_running`, points other trials are measuring count as refused for the
        out-of-memory boundary."""
        limit = self.fit_limit(study)
        options: list[Option] = []
        poor: list[str] = []
        for ctx in ctxs:
            fit, cands, obs = pooled if not ctx else fitted_in(study, trials, ctx, pooled)
            probing = False
            bets: set[tuple] = set()
            if self.__dict__.get("_pessimistic"):
                liars = self._running_as_refused(trials, number, obs)
                if liars:
                    # a running boot the measured boundary is unsure of: a bet on it
                    measured = fit.oom
                    bets = {o.key for o in liars if measured is not None and measured.p_feasible(
                        1.0 if o.mem is None else o.mem, o.draft) < 1.0}
                    probing = bool(bets)
                    fit = dataclasses.replace(fit, oom=fit_oom_running(obs, liars, fit.oom))
            if fit.rms > limit:
                poor.append(f"{ctx_text(ctx)}in-sample error {fit.rms:.1%} of tok/s > "
                            f"{limit:.1%}")
                continue
            taken = {o.key for o in obs}
            for t in trials:
                if t.number != number and t.params and in_context(t.params, ctx):
                    taken.add(self._key_of(t.params))
            free = np.array([k not in taken for k in cands.keys])
            if not free.any():
                continue
            rng = np.random.default_rng([self._seed, number, len(options)])
            levels, ok_draws = level_draws(fit, cands, rng, self._draws)
            options.append(Option(ctx, fit, cands, obs, free, levels,
                                  score_of(fit, levels, ok_draws),
                                  oom_sure(fit.oom, cands) if probing else None,
                                  self._believed(trials, number, ctx, cands, fit, levels,
                                                 bets)))
        return options, poor

    def _believed(self, trials: Sequence[FrozenTrial], number: int, ctx: dict[str, Any],
                  cands: Candidates, fit: Fit, levels: dict[int, np.ndarray],
                  bets: set[tuple]) -> np.ndarray | None:
        """Per posterior draw, the best score the points other trials are measuring now (in
        this context) reach in that draw; None where none runs. A running point the measured
        out-of-memory boundary is unsure of (`bets`) is left out: it may be refused. The stop
        rule's expected gain beyond the band (`improvement.pick`) counts a free point's gain
        over that, draw by draw (the draws are joint, so the two move together): the slot
        beside a boot would otherwise boot its nearest neighbour (the same point a memory
        fraction lower: the running one counts as refused for the boundary), whose gain
        exists only in the draws where the running boot fails. Where nothing is worth a boot
        over it, the search waits for the running boot's answer (`search.stopping`)."""
        if not self.__dict__.get("_pessimistic"):
            return None
        index = {k: i for i, k in enumerate(cands.keys)}
        running = sorted({index[k] for t in trials
                          if t.state == TrialState.RUNNING and t.number != number and t.params
                          and in_context(t.params, ctx)
                          and (k := self._key_of(t.params)) in index and k not in bets})
        if not running:
            return None
        every = {c: v[:, running] for c, v in levels.items()}
        scores = score_of(fit, every, np.ones(every[next(iter(every))].shape, dtype=bool))
        return scores.max(axis=1)

    def _contexts(self, trials: Sequence[FrozenTrial]) -> list[dict[str, Any]]:
        """The contexts the model is fitted in (`contexts.contexts`)."""
        return contexts(self._specs(trials))

    def _anchor(self, trials: Sequence[FrozenTrial], number: int, why: str
                ) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The cold start's proposal (`anchor.anchor`); None where no candidate is left."""
        cands = self._candidates(trials)
        return None if cands is None else anchor(cands, trials, number, why, self._key_of)

    def _running_as_refused(self, trials: Sequence[FrozenTrial], number: int,
                            obs: Sequence[TrialObs] = ()) -> list[TrialObs]:
        """The points other trials are measuring now, as if the server had refused them for
        memory (`oom.running_as_refused`)."""
        keys = [self._key_of(t.params) for t in trials
                if t.state == TrialState.RUNNING and t.number != number and t.params]
        return running_as_refused([k for k in keys if k != ("baseline",)], obs)

    def fitted(self, study: Study, trials: Sequence[FrozenTrial] | None = None
               ) -> tuple[Fit, Candidates, list[TrialObs]] | str:
        """The model fitted to the study's finished trials (with the candidates and the
        observations), or why there is none (a sentence)."""
        trials = study.get_trials(deepcopy=False) if trials is None else trials
        finished = [t for t in trials if t.state.is_finished()]
        if len(finished) < self._min_trials:
            return (f"thin data: {len(finished)} finished trial(s), the model starts "
                    f"after {self._min_trials}")
        base = parse_baseline(study.user_attrs.get(BASELINE_ATTR))
        if base is None:
            return f"no baseline in study.user_attrs[{BASELINE_ATTR!r}]"
        obs = []
        for t in finished:
            o = parse_measured(t.user_attrs.get(MEASURED_ATTR), t.params)
            if o is not None:
                obs.append(o)
        cands = self._candidates(trials)
        if cands is None:
            return "no speculative configuration in the space"
        fit = fit_model(obs, base, cands, int(cands.steps.max()))
        if fit is None:
            return "thin data: no feasible speculative trial with measurements"
        return fit, cands, obs

    def fit_limit(self, study: Study) -> float:
        """The in-sample error above which the model hands over (its own, or 1.5 bands)."""
        band = study.user_attrs.get(NOISE_BAND_ATTR)
        limit = self._max_residual
        if isinstance(band, (int, float)) and math.isfinite(band):
            limit = max(limit, 1.5 * float(band))
        return limit

    def predict(self, study: Study, sampled: Mapping[str, Any], *, draws: int = 64
                ) -> dict[str, Any] | None:
        """What the model fitted to the study's finished trials predicts for one point (before
        it is booted): tok/s per level and acceptance length of the mean model, the mean score
        and the share of posterior draws in which the server accepts the boot. None where
        there is no fit, or the point is not one the model can name (the baseline, say)."""
        trials = study.get_trials(deepcopy=False)
        state = self.fitted(study, trials)
        if isinstance(state, str):
            return None
        ctx = context_of(sampled, self._contexts(trials))
        fit, cands, _ = state if ctx is None else fitted_in(study, trials, ctx, state)
        key = self._key_of(sampled)
        try:
            i = cands.keys.index(key)
        except ValueError:
            return None
        steps, topk, draft, mem = key
        rng = np.random.default_rng([self._seed, 7919, len(study.get_trials(deepcopy=False))])
        scores = score_draws(fit, one(cands, i), rng, draws)[:, 0]
        ok = np.isfinite(scores)
        levels = predict_levels(fit, steps, topk, draft, mem)
        return {
            "tok_s": None if levels is None else {str(c): float(v) for c, v in levels.items()},
            "accept_length": fit.accept.mean_length(steps, topk, draft),
            "score": float(scores[ok].mean()) if ok.any() else None,
            "p_feasible": float(ok.mean()),
            "fit_error": round(fit.rms, 5),
            "fit_ok": fit.rms <= self.fit_limit(study),
            "trials": fit.points,
        }

    def pair_draws(self, study: Study, a: Mapping[str, Any], b: Mapping[str, Any], *,
                   draws: int = 256, trials: Sequence[FrozenTrial] | None = None
                   ) -> tuple[Fit, dict[int, np.ndarray], np.ndarray, np.ndarray] | str:
        """Joint posterior draws at two points (the same draws of every coefficient, so what
        the two share cancels in their difference): (the fit, log tok/s per level {c: (draws,
        2)}, the score (draws, 2; -inf where refused), whether each boots (draws, 2)); or why
        there are none (a sentence): no fit, a point the model cannot name, the two in
        different contexts (their fits are separate)."""
        trials = study.get_trials(deepcopy=False) if trials is None else trials
        state = self.fitted(study, trials)
        if isinstance(state, str):
            return state
        ctxs = self._contexts(trials)
        ctx_a, ctx_b = context_of(a, ctxs), context_of(b, ctxs)
        if ctx_a != ctx_b:
            return "the two points are in different contexts of the model (separate fits)"
        fit, cands, _ = state if ctx_a is None else fitted_in(study, trials, ctx_a, state)
        try:
            i, j = cands.keys.index(self._key_of(a)), cands.keys.index(self._key_of(b))
        except ValueError:
            return "a point the model cannot name"
        two = subset(cands, [i, j])
        # Seeded by what has finished, so that asking before a trial starts (the search's
        # outlook) and while planning it give the same draws.
        done = sum(1 for t in trials if t.state.is_finished())
        rng = np.random.default_rng([self._seed, 104729, done])
        levels, ok = level_draws(fit, two, rng, draws)
        return fit, levels, score_of(fit, levels, ok), ok

    def _key_of(self, sampled: Mapping[str, Any]) -> tuple:
        params = resolve(sampled, self._fixed)
        if is_baseline(params):
            return ("baseline",)
        return point_key(params[STEPS], params[TOPK], params[DRAFT], params.get(MEM))

    # ------------------------------------------------------------------ the space

    def _specs(self, trials: Sequence[FrozenTrial]) -> tuple[ParamSpec, ...]:
        if self._space is not None:
            return self._space
        return tuple(union_spec(name, ds) for name, ds in distributions(trials).items())

    def _candidates(self, trials: Sequence[FrozenTrial]) -> Candidates | None:
        specs = self._specs(trials)
        sig: tuple[Any, ...] = (specs, tuple(sorted(self._fixed.items(), key=lambda kv: kv[0])))
        try:
            hash(sig)
        except TypeError:
            sig = (repr(specs), repr(sorted(self._fixed.items())))
        if sig in self._cache:
            return self._cache[sig]
        # A sampler pickled before `refuses` existed has none.
        cands = enumerate_space(specs, self._fixed, self.__dict__.get("_refuses"))
        if cands is not None:
            self._cache = {sig: cands}
        return cands


def _decision(best: Pick, best_score: float) -> dict[str, Any]:
    """What the trial records of the model's proposal: why, and what the fit says of it."""
    ctx, fit, scores = best.option.ctx, best.option.fit, best.option.scores
    ok = np.isfinite(scores[:, best.at])
    return {
        "by": "model",
        "why": ctx_text(ctx) + (
            f"expected improvement {best.ei:+.4f} of {best.level_note}" if best.level_note
            else f"expected improvement {best.ei:+.4f} over {best_score:+.4f}"),
        "ei": best.ei,
        "predicted_score": float(scores[ok, best.at].mean()) if ok.any() else None,
        "p_feasible": float(ok.mean()),
        "fit_error": round(fit.rms, 5),
        "tile": fit.step.tile,
        "route": fit.step.route,
        "accept_measured_to": fit.accept.measured_depth,
    }


def _others(incumbent_params: Mapping[str, Any] | None, known: set[str]) -> dict[str, Any]:
    """Parameters the model does not know: the incumbent's values (else the base sampler's)."""
    if not incumbent_params:
        return {}
    return {k: v for k, v in incumbent_params.items()
            if k not in known and k not in (STEPS, TOPK, DRAFT, MEM)}


def _base(why: str, fit: Fit | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"by": "base", "why": why}
    if fit is not None:
        out["fit_error"] = round(fit.rms, 5)
    return out
