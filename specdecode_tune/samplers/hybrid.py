"""`HybridSampler`, the default: the model proposes where its fit is good, the plateau question
stays explicit, and TPE takes over where the fit is poor.

Before each fresh trial, in this order:

1. **The plateau question.** The plateau-escape logic (`plateau/`) looks for a plateau around
   the incumbent (with `per_level`, first around each concurrency level's own incumbent, on
   that level's own score); when it finds one, this trial is its far probe (the jump, with its
   reason and, once it finishes, its outcome recorded on the trial and in the study's
   `plateau_events`, as `PlateauEscapeSampler` records them). One probe at a time, never for an
   enqueued trial. The question costs a boot only where the model cannot answer it
   (`answered`: its errors on this run inside the noise band, a boot at the jump's value or
   beyond predicted within the band, a climb beyond the band in at most 5% of its draws);
   where it can, the answer is recorded as predicted (with the probability) on the trial
   planned instead, and booted as a check only once a later measurement contradicts it. A
   jump that came back no better (within noise, or worse) is followed by
   its bracket (`plateau/bracket.py`): one boot in the middle of the stretch the jump skipped,
   where a peak the model cannot express can hide.
2. **The model.** Otherwise the model-guided logic (`model/`) fits acceptance per draft
   position, step time and the KV budget to what the trials measured and proposes the point of
   largest expected improvement, when its fit is good: its error on the measured points
   (each measured level's tok/s as the fitted model predicts it, relative, RMS) is at most
   `max_residual` (8%) or 1.5 noise bands, whichever is larger. A point another trial is
   measuring counts as refused for the memory boundary of this proposal, so two concurrent
   boots do not both bet on a boundary neither has measured.
3. **TPE.** Where the fit is poor (the server behaves in a way the model cannot express) or
   the space holds nothing the model can name, the trial goes to the base sampler (TPE), which
   searches it as a black box. Before any speculative boot has run (nothing to fit) the model
   proposes anchors, not TPE: the chain three steps deep in the middle of the memory fractions
   no refusal has ruled out (a blind first proposal on a server short of memory was refused
   six times running on the noisy benchmark profile); where no memory fraction is searched,
   the chain at the centre of the steps range.

Why this is the default: on the benchmark's simulator profiles and recorded real landscapes
(`benchmarks/search_efficiency.py`) the model reaches 98% of the optimum in a few boots where
TPE and plateau-over-TPE need tens; the plateau probe keeps the one question a model fitted to
the near side of a plateau cannot answer by itself (it extrapolates; the probe measures); and
TPE keeps the search going where the model's physics do not hold.

Every trial records who proposed it and why (user attr "model_guided": `by` is "plateau",
"model" or "base"). `predict(study, params)` is the model's prediction for any point before it
is booted (the search records it with the trial, the stop rule and the KV gate read it;
`search.stopping`). Everything lives in the study, so the sampler pickles with the searcher and
a fresh instance over a resumed study carries on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from ..space import ParamSpec
from . import answered as answers
from .model import DECISION_ATTR, ModelGuidedSampler
from .observations import BASELINE_ATTR, Baseline
from .planned import PlannedSampler, fit_into, set_trial_user_attr
from .plateau import PlateauEscapeSampler
from .plateau import events as ev
from .plateau.bracket import next_bracket
from .plateau.events import fmt
from .plateau.geometry import Plateau
from .plateau.scales import baseline_tok_s


class HybridSampler(PlannedSampler):
    """Plateau probe, else the model where its fit is good, else `base_sampler` (TPE).

    Args:
        base_sampler: proposes where neither plans (default `TPESampler(seed=seed)`).
        space, fixed: the experiment's searched parameters and fixed flags (as for
            `ModelGuidedSampler`).
        noise_band: the plateau logic's band until the search measures one.
        max_residual: the model's fit error (relative tok/s) above which TPE takes over.
        per_level: the model proposes by the expected improvement of any level's best, and
            the plateau probe also looks for plateaus on each level's own score
            (`[objective] kind = "schedule"`; see `ModelGuidedSampler`, `PlateauEscapeSampler`).
        seed: seeds the model's posterior draws (and the default base sampler).
    """

    plan_key = "hybrid:plan"     # trial system attr: which part planned it ("plateau"/"model")

    def __init__(
        self,
        base_sampler: BaseSampler | None = None,
        *,
        space: Sequence[ParamSpec] | None = None,
        fixed: Mapping[str, Any] | None = None,
        noise_band: float = 0.025,
        max_residual: float = 0.08,
        seed: int | None = None,
        per_level: bool = False,
        refuses: Callable[[Mapping[str, Any]], str | None] | None = None,
    ) -> None:
        super().__init__(base_sampler, seed)
        # Both parts share the one base sampler; neither's own before_trial runs (this one's
        # calls the base's once), so the base sees each trial once.
        self._plateau = PlateauEscapeSampler(self._base, noise_band=noise_band, seed=seed,
                                             per_level=per_level)
        self._model = ModelGuidedSampler(self._base, space=space, fixed=fixed,
                                         max_residual=max_residual, min_trials=1,
                                         pessimistic_running=True, seed=seed,
                                         per_level=per_level, cold_start=True,
                                         refuses=refuses)

    @property
    def model(self) -> ModelGuidedSampler:
        return self._model

    @property
    def plateau(self) -> PlateauEscapeSampler:
        return self._plateau

    # ------------------------------------------------------------------ the planned hooks

    def plan_trial(self, study: Study, trial: FrozenTrial) -> None:
        if self._plateau_question(study, trial):
            event = ev.event_of(ev.load_events(study), trial.number)
            reason = "" if event is None else event["reason"]
            set_trial_user_attr(study, trial, DECISION_ATTR,
                                {"by": "plateau", "why": reason})
            self.store_plan(study, trial, "plateau")
            return
        if self._bracket(study, trial):
            return
        self._model.plan_trial(study, trial)
        if self._model.plan_of(study, trial) is not None:
            self.store_plan(study, trial, "model")

    def _plateau_question(self, study: Study, trial: FrozenTrial) -> bool:
        """Plans this trial as a plateau probe where one is due (`answered`): a model answer
        a later measurement contradicts is checked by its jump; else each plateau found is put
        to the model first, and answered by it (recorded, no boot) where it can rule the climb
        out; the first it cannot is this trial's jump. Whether this trial is a probe."""
        trials = study.get_trials(deepcopy=False)
        events = ev.load_events(study)
        if self._plateau._resolve_stale(events, trials):
            ev.save_events(study, events)
        if any(e["outcome"] is None for e in events):
            return False        # one probe at a time
        band = self._plateau._band(study)
        due = self._check_due(study, trials, events, band)
        if due is not None:
            event, why = due
            self._start_check(study, trial, event, why, events)
            return True
        said: list[str] = []
        for _ in range(64):     # bounded: each answer blocks its plateau's height
            plateau, inc = self._plateau._find_jump(study, trials, events, band)
            if plateau is None or inc is None:
                break
            ans = self._answer(study, trials, plateau, dict(inc.params), band)
            if ans.by_model:
                event = ev.new_event(study, trial, plateau, inc, band,
                                     None if plateau.level is None
                                     else baseline_tok_s(study, plateau.level))
                answers.record(event, ans, trial.number)
                events.append(event)
                said.append(event["verdict"])
                continue
            self._plateau._start_jump(study, trial, plateau, inc, band, events)
            self._booted_because(study, trial, ans.why)
            break
        jumps = self._plateau.plan_of(study, trial) is not None
        if said:
            if not jumps:
                ev.save_events(study, events)     # (a jump saved them with its own)
            set_trial_user_attr(study, trial, answers.PLATEAU_ANSWER_ATTR, said,
                                visible_now=True)
        return jumps

    def _answer(self, study: Study, trials: Sequence[FrozenTrial], plateau: Plateau,
                incumbent: dict[str, Any], band: float) -> answers.Answer:
        try:
            return answers.answer(self._model, study, trials, plateau.axis,
                                  plateau.direction, plateau.jump_to, incumbent,
                                  plateau.level, band)
        except Exception as e:  # noqa: BLE001 - an answer is advice: then the jump is booted
            return answers.Answer(False, f"the model could not answer ({type(e).__name__})")

    def _check_due(self, study: Study, trials: Sequence[FrozenTrial],
                   events: list[dict[str, Any]], band: float
                   ) -> tuple[dict[str, Any], str] | None:
        """The first model answer a later measurement contradicts, and how (`answered`)."""
        by_number = {t.number: t for t in trials}
        base = Baseline.from_attr(study.user_attrs.get(BASELINE_ATTR))
        for event in answers.answered(events):
            why = answers.contradiction(event, trials, None if base is None else base.weights)
            inc = by_number.get(event["incumbent_trial"])
            if why is None and inc is not None:
                ans = self._answer(study, trials, answers.plateau_of(event), dict(inc.params),
                                   event["noise_band"])
                if not ans.by_model:
                    why = f"refitted to what was measured since, {ans.why}"
            if why is not None and inc is not None:
                return event, why
        return None

    def _start_check(self, study: Study, trial: FrozenTrial, event: dict[str, Any], why: str,
                     events: list[dict[str, Any]]) -> None:
        """Boot the jump a model answer stood for: the event becomes a jump's, judged when the
        trial finishes as any jump is, with what the model had said kept."""
        inc = next(t for t in study.get_trials(deepcopy=False)
                   if t.number == event["incumbent_trial"])
        event["check"] = why
        event["model_verdict"] = event["verdict"]
        event["trial_number"] = trial.number
        event["outcome"] = None
        event["verdict"] = None
        event["reason"] = (f"check of the model's answer ({event['model_verdict']}): {why}; "
                           f"jumping to {fmt(event['jump_to'])}")
        self._plateau.store_plan(study, trial, {
            "axis": event["axis"],
            "direction": event["direction"],
            "plateau_to": event["plateau_to"],
            "jump_to": event["jump_to"],
            "incumbent_at": event["incumbent_at"],
            "params": {k: v for k, v in inc.params.items() if k != event["axis"]},
        })
        set_trial_user_attr(study, trial, ev.JUMP_REASON_ATTR, event["reason"], visible_now=True)
        ev.save_events(study, events)

    def _booted_because(self, study: Study, trial: FrozenTrial, why: str) -> None:
        """Say on the jump why the model could not answer its question."""
        events = ev.load_events(study)
        event = ev.event_of(events, trial.number)
        if event is None:
            return
        event["booted_because"] = why
        event["reason"] = f"{event['reason']} (booted: {why})"
        set_trial_user_attr(study, trial, ev.JUMP_REASON_ATTR, event["reason"], visible_now=True)
        ev.save_events(study, events)

    def _bracket(self, study: Study, trial: FrozenTrial) -> bool:
        """Plans the bracket of a jump that came back no better (`plateau.bracket`), if one
        is due; whether it did."""
        events = ev.load_events(study)
        found = next_bracket(events, study.get_trials(deepcopy=False), trial.number)
        if found is None:
            return False
        event, point, why = found
        event["bracket_trial"] = trial.number
        event["bracket_at"] = point[event["axis"]]
        ev.save_events(study, events)
        # Visible now: the search's define-by-run function shows the reason as the trial
        # starts, as a jump's.
        set_trial_user_attr(study, trial, DECISION_ATTR,
                            {"by": "plateau", "why": why, "bracket": True}, visible_now=True)
        self.store_plan(study, trial, {"bracket": point})
        return True

    def planned_value(self, study: Study, trial: FrozenTrial, plan: Any, name: str,
                      dist: BaseDistribution) -> Any:
        if isinstance(plan, dict) and isinstance(plan.get("bracket"), dict):
            point = plan["bracket"]
            return fit_into(point[name], dist) if name in point else None
        part: PlannedSampler = self._plateau if plan == "plateau" else self._model
        own = part.plan_of(study, trial)
        return None if own is None else part.planned_value(study, trial, own, name, dist)

    def trial_finished(self, study: Study, trial: FrozenTrial, state: TrialState,
                       values: Sequence[float] | None) -> None:
        self._plateau.trial_finished(study, trial, state, values)

    # ------------------------------------------------------------------ what the search asks

    def predict(self, study: Study, sampled: Mapping[str, Any]) -> dict[str, Any] | None:
        """The model's prediction for `sampled` from the finished trials (`ModelGuidedSampler
        .predict`), or None where there is no fit."""
        return self._model.predict(study, sampled)

    def outlook(self, study: Study, band: float | None = None) -> dict[str, Any]:
        """What the next fresh trial would be, without planning one: {"by": "plateau", "why"}
        when a plateau is open (a probe decided or running, or one the next trial would start),
        else the model's decision ({"by": "model", "ei": the best remaining expected
        improvement, ...} or {"by": "base", "why"}). `band`: the model's decision also says
        the best expected gain beyond it ("ei_beyond_band", what the stop rule asks)."""
        trials = study.get_trials(deepcopy=False)
        events = ev.load_events(study)
        self._plateau._resolve_stale(events, trials)
        open_ = [e for e in events if e["outcome"] is None]
        if open_:
            out: dict[str, Any] = {"by": "plateau", "running": True,
                                   "why": f"the plateau probe of trial "
                                          f"{open_[0]['trial_number']} has no answer yet"}
            if band is not None:
                # One probe at a time: the next trial is the model's (or the base's). What
                # the model expects of it says whether it is worth a boot beside the probe.
                decision, _ = self._model.decide(study, len(trials), band=band)
                if decision.get("by") == "model" and "ei_beyond_band" in decision:
                    out["model_ei_beyond_band"] = decision["ei_beyond_band"]
            return out
        noise = self._plateau._band(study)
        due = self._check_due(study, trials, events, noise)
        if due is not None:
            return {"by": "plateau", "why": f"the model's answer on {due[0]['axis']} is to be "
                                            f"checked by a boot: {due[1]}"}
        for _ in range(64):
            # As `_plateau_question` would plan: a plateau the model answers is no open
            # question (its answer is recorded when the next trial is planned).
            plateau, inc = self._plateau._find_jump(study, trials, events, noise)
            if plateau is None or inc is None:
                break
            ans = self._answer(study, trials, plateau, dict(inc.params), noise)
            if not ans.by_model:
                at = "" if plateau.level is None else f" at C={plateau.level}"
                return {"by": "plateau",
                        "why": f"a plateau{at} on {plateau.axis} is not probed yet"}
            event = ev.new_event(study, inc, plateau, inc, noise, None)
            answers.record(event, ans, len(trials))
            events.append(event)
        found = next_bracket(events, trials, len(trials))
        if found is not None:
            return {"by": "plateau", "why": found[2]}
        decision, _ = self._model.decide(study, len(trials), band=band)
        return decision
