"""The Ray Tune searcher: Optuna proposes, this decides what runs next.

`SpecOptunaSearch` is Ray's OptunaSearch with the one thing it lacks for servers: a config the
server refuses is told to Optuna as a violated constraint (`trial.set_constraint`), not as a
failed trial, so constraint-aware samplers learn where the feasible region ends.

`RepeatingSearcher` wraps it and spends part of the budget on re-measuring, so that scores are
medians less a spread (1.4826 * MAD shrunk towards the pooled noise: objective.Robust) and the
noise band is measured, not assumed. Early in the search (after a third of the budget) it
re-measures the incumbent once. Once exploring ends, the final re-measurements run one at a
time (the incumbent's first may start beside the last running trial), each decided on every
answer so far (`_final_repeat`): the incumbent is re-measured once,
then up to `repeats` boots while another config's median is within the noise band of its own,
and the top `remeasure_top` runners-up to 2 boots each unless their median is below the
incumbent's beyond the band (a second boot would have to measure above the incumbent by more
than the band to lift their median past it); a re-measurement that changes the ranking brings
the new incumbent's and runners-up's turn. The band these
decisions use is never narrower than the experiment's (`objective.cautious_band`).
Repeats never reach Optuna (the study sees each configuration once). The whole state pickles
into Tune's experiment dir, so an interrupted search resumes with it.

Both stop the search early (`suggest` returns `Searcher.FINISHED`; trials already running
finish) when trials keep failing for a reason no config changes (`failures.FailureStreak`): a
workload the server refuses, a model path that does not exist, a boot timeout too short for the
model.

`proposals.ProposalSpace` is the define-by-run space handed to OptunaSearch: it adds to each
proposed config what proposed it (`SAMPLER_KEY`, `JUMP_KEY`).

The contract with the trainable is the config keys (`REPEAT_KEY` below; `JUMP_KEY`,
`SAMPLER_KEY` from `proposals`, exported here too) and the final result's keys: the metric
("score", or one per Pareto metric), "feasible", "status", "reason" and `MEASURED_KEY` (what
the trial measured, as JSON text, handed to Optuna as the trial's "measured" attr for the
samplers).

This is the one module that touches Ray Tune's and OptunaSearch's internals: OptunaSearch
keeps its Optuna trials by Tune trial id in `_ot_trials` and its study in `_ot_study`, with no
public access to either; re-keying a probe's trial, setting constraints and attrs, and
answering a proposal from data all need them.
"""

from __future__ import annotations

import json
import logging
import pickle
from typing import Any

from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from ..objective import Robust, cautious_band, noise_band
from ..samplers.observations import PREDICTED_ATTR
from .failures import FAILURE_STREAK, FailureStreak, failure_signature
from .proposals import BRACKET_KEY, JUMP_KEY, PLATEAU_ANSWER_KEY, SAMPLER_KEY, ProposalSpace
from .stopping import PREDICTED_KEY, KVGate, StopRule

# FailureStreak and ProposalSpace pickle with the searcher: runs saved before they had modules
# of their own (failures.py, proposals.py) name them here, so this module keeps exporting them.
__all__ = [
    "BRACKET_KEY", "FAILURE_STREAK", "INFEASIBLE_SCORE", "JUMP_KEY", "MAX_DUPLICATES",
    "MEASURED_KEY", "PLATEAU_ANSWER_KEY", "PREDICTED_ATTR", "PREDICTED_KEY", "REPEAT_KEY",
    "SAMPLER_KEY", "SKIPPED_ATTR", "STOP_ATTR",
    "FailureStreak", "ProposalSpace", "RepeatingSearcher",
    "SpecOptunaSearch", "failure_signature", "params_key",
]

log = logging.getLogger(__name__)

REPEAT_KEY = "_repeat"          # config key: 0 = explored by Optuna, n = n-th re-measurement
MAX_DUPLICATES = 25             # repeated proposals answered from data before giving up
MEASURED_KEY = "measured"       # final result key: what the trial measured, as JSON text (a
                                # dict would be flattened by Tune)
INFEASIBLE_SCORE = -5.0         # told to Optuna with a violated constraint: never the best
# PREDICTED_ATTR ("predicted"): the Optuna trial user attr with the model's prediction at
# proposal; the samplers read it back (the model's errors on this run: `samplers.answered`).
STOP_ATTR = "stop_reason"       # Optuna study user attr: why exploring stopped before the cap
SKIPPED_ATTR = "kv_skipped"     # Optuna study user attr: boots the KV gate did not make


def params_key(config: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in config.items() if not k.startswith("_")},
                      sort_keys=True, default=str)


class SpecOptunaSearch(OptunaSearch):
    """OptunaSearch where `result["feasible"] == False` becomes a violated constraint.

    Used alone (Pareto objectives), it stops on a `FailureStreak` when given one (`streak`);
    inside RepeatingSearcher the wrapper keeps the streak, since it sees every trial."""

    streak: FailureStreak | None = None

    def suggest(  # type: ignore[override]  # returns Searcher.FINISHED, a str: Ray omits it
            self, trial_id: str) -> dict | str | None:
        if self.streak is not None and self.streak.tripped:
            return Searcher.FINISHED
        return super().suggest(trial_id)

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        ot_trial = self._ot_trials.get(trial_id)
        if self.streak is not None and ot_trial is not None and result is not None:
            self.streak.observe(params_key(ot_trial.params), result.get("status"),
                                result.get("reason"))
        if ot_trial is not None and result is not None and "feasible" in result:
            ot_trial.set_constraint("feasible", 0.0 if result["feasible"] else 1.0)
        if ot_trial is not None and result is not None and result.get(MEASURED_KEY):
            # What the trial measured, for samplers that learn from more than the score.
            ot_trial.set_user_attr("measured", json.loads(result[MEASURED_KEY]))
        super().on_trial_complete(trial_id, result, error)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        # Per-level progress carries no objective value; the final result is told on completion.
        return

    def study(self) -> Any:
        return self._ot_study


class RepeatingSearcher(Searcher):
    """Explore `max_trials` points through Optuna, interleave re-measurements, then finish."""

    def __init__(self, inner: SpecOptunaSearch, *, max_trials: int, repeats: int,
                 remeasure_top: int, default_band: float,
                 infeasible_score: float = INFEASIBLE_SCORE, metric: str = "score",
                 mode: str = "max", stop_rule: StopRule | None = None,
                 gate: KVGate | None = None) -> None:
        super().__init__(metric=metric, mode=mode)
        self.inner = inner
        self.max_trials = max_trials
        self.repeats = repeats
        self.remeasure_top = remeasure_top
        self.default_band = default_band
        self.explored = 0
        self.live: dict[str, tuple[str, int]] = {}       # trial id -> (params key, repeat)
        self.configs: dict[str, dict[str, Any]] = {}      # params key -> config
        self.scores: dict[str, list[float]] = {}          # params key -> feasible scores
        self.band = default_band
        self.early_repeat_done = False
        self.infeasible: set[str] = set()                 # params keys the server refused
        self.infeasible_score = infeasible_score
        self.duplicates = 0                               # proposals not booted again
        # Optuna may propose a point that another trial is measuring right now (two pairs, one
        # best guess): that proposal waits for the running trial's answer instead of booting
        # the same server twice. running trial id -> the proposals' Optuna ids.
        self.followers: dict[str, list[str]] = {}
        self.repeat_budget = (remeasure_top + 1) * max(repeats, 2)
        self.streak = FailureStreak()
        # max_trials is a cap: the stop rule ends exploring when the model knows (then the
        # final re-measurements run); the gate skips boots the KV model says are refused.
        self.stop_rule = stop_rule
        self.gate = gate

    # -- Tune's Searcher interface -------------------------------------------------------------

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict,
                              **spec: Any) -> bool:
        return self.inner.set_search_properties(metric, mode, config, **spec)

    def suggest(  # type: ignore[override]  # returns Searcher.FINISHED, a str: Ray omits it
            self, trial_id: str) -> dict | str | None:
        if self.streak.tripped:
            # A cause no config changes: no more boots (re-measurements included).
            return Searcher.FINISHED
        repeat = self._next_repeat()
        if repeat is not None:
            self.repeat_budget -= 1
            return self._repeat(trial_id, *repeat)
        if self.explored < self.max_trials and (self._blind() or self._knows()):
            return None                      # wait for the running explorations first
        if self.explored >= self.max_trials:
            repeat = self._next_repeat()     # the cap may have been reached just now
            if repeat is not None:
                self.repeat_budget -= 1
                return self._repeat(trial_id, *repeat)
            return None if self.live else Searcher.FINISHED
        # A boot costs minutes: a point already measured is answered from the measurements
        # (told to Optuna at once), a point being measured now waits for that trial's answer,
        # and Optuna is asked again. After MAX_DUPLICATES such answers in a row the space is
        # taken as exhausted: the point runs as a re-measurement.
        why: str | None = None
        for attempt in range(MAX_DUPLICATES):
            why = None
            # Every proposal gets its own id: one answered from data is completed under it.
            probe = f"{trial_id}~{attempt}"
            proposal = self.inner.suggest(probe)
            if not isinstance(proposal, dict):      # None (wait) or Searcher.FINISHED
                return proposal
            config: dict[str, Any] = proposal
            key = params_key(config)
            known = self.scores.get(key)
            running = self._running_trial(key)
            if not known and key not in self.infeasible and running is not None:
                self.followers.setdefault(running, []).append(probe)
                self.duplicates += 1
                continue
            gate = self.__dict__.get("gate")      # a searcher pickled before the gate: None
            why = None if known or key in self.infeasible or gate is None \
                else gate.refuses(config, refused_before=bool(self.infeasible))
            if why is not None and gate is not None:
                # Predicted refused: told to Optuna as a refusal, never booted.
                self.inner.on_trial_complete(probe, {self.metric: self.infeasible_score,
                                                     "feasible": False, "reason": why})
                self.duplicates += 1
                try:
                    self.inner.study().set_user_attr(SKIPPED_ATTR, gate.skipped)
                except Exception:  # the record is advice: never fatal
                    log.debug("could not store the skipped boots in the study", exc_info=True)
                if self._knows() or self.explored >= self.max_trials:
                    # The skip answered a question (a plateau probe the gate says is refused
                    # is answered as a refusal): the stop rule may hold now. Without this
                    # check the next proposal was booted, though the rule already held.
                    return self.suggest(trial_id)
                continue
            if not known and key not in self.infeasible:
                # Tune's trial id owns the Optuna trial from here on.
                self.inner._ot_trials[trial_id] = self.inner._ot_trials.pop(probe)
                self.explored += 1
                self.configs.setdefault(key, config)
                self.live[trial_id] = (key, 0)
                return config
            answer = ({self.metric: Robust.of(known).median, "feasible": True} if known
                      else {self.metric: self.infeasible_score, "feasible": False})
            self.inner.on_trial_complete(probe, answer)
            self.duplicates += 1
        if why is not None:
            # The last proposal was one the gate skips: never booted as a re-measurement
            # either; the best point is re-measured instead (or the search ends).
            ranked = self.ranking()
            if not ranked:
                return None if self.live else Searcher.FINISHED
            key = ranked[0][0]
            config = self.configs[key]
        self.explored += 1
        self.configs.setdefault(key, config)
        return self._repeat(trial_id, key, len(self.scores.get(key, [])) + self._pending(key))

    def _blind(self) -> bool:
        """Whether the next proposal would be made blind, with an exploration running: until
        one point has measured, the model and the KV gate have nothing to go on, and a blind
        proposal in a space the server refuses half of is a refused boot half the time. A
        search with the stop rule and a sampler that predicts then explores one at a time."""
        if self.__dict__.get("stop_rule") is None or self.scores:
            return False
        if not hasattr(self.inner.study().sampler, "predict"):
            return False
        return any(n == 0 for _, n in self.live.values())

    def _knows(self) -> bool:
        """Whether the stop rule ends exploring now: True while it would but an exploration is
        still running (the caller waits for its answer, then asks again); once none runs, the
        cap becomes the explored count (the final re-measurements run, then the searcher
        finishes) and the reason is stored in the study."""
        rule = self.__dict__.get("stop_rule")      # a searcher pickled before the rule: None
        if rule is None:
            return False
        # What the rule's answer can change with: a finished trial, a proposal the KV gate
        # skipped (told to the study as a refusal), or an exploration started (a plateau
        # probe opens a question: the trial beside it may have to wait for its answer).
        gate = self.__dict__.get("gate")
        done = (self.__dict__.get("completed", 0), 0 if gate is None else len(gate.skipped),
                self.explored)
        if rule.why is None:
            if self.__dict__.get("checked_at") == done:
                # Nothing new since the last check: the same answer.
                return bool(self.__dict__.get("waiting"))
            self.checked_at = done
            self.waiting = False
            try:
                study = self.inner.study()
                # The narrower of the measured band and the experiment's: a noisy server's
                # wide band must not make a small expected improvement look like noise.
                why = rule.check(study, study.sampler, min(self.band, self.default_band),
                                 self.explored)
            except Exception:  # the rule is advice: a search never fails on it
                log.debug("the stop rule could not be checked", exc_info=True)
                return False
            if why is None:
                if getattr(rule, "waits_for_probe", False) and any(
                        n == 0 for _, n in self.live.values()):
                    # A plateau probe runs and the model's next proposal is not worth a boot
                    # (`StopRule.waits_for_probe`): wait for the probe's answer.
                    self.waiting = True
                    return True
                return False
            if any(n == 0 for _, n in self.live.values()):
                rule.why = None             # decided again once the running ones answered
                self.waiting = True
                return True
            try:
                study.set_user_attr(STOP_ATTR, why)
            except Exception:  # the reason is also the searcher's: never fatal
                log.debug("could not store the stop reason in the study", exc_info=True)
        self.max_trials = self.explored
        return False

    @property
    def stop_reason(self) -> str | None:
        rule = self.__dict__.get("stop_rule")
        return None if rule is None else rule.why

    def _repeat(self, trial_id: str, key: str, n: int) -> dict:
        self.live[trial_id] = (key, n)
        return {**self.configs[key], REPEAT_KEY: n}

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        # Per-level results are progress, not intermediate values of the objective: nothing
        # prunes a server mid-trial, so Optuna hears only the final result.
        return

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        key, n = self.live.pop(trial_id, (None, 0))
        if key is None:
            return
        self.completed = self.__dict__.get("completed", 0) + 1
        if result:
            self.streak.observe(key, result.get("status"), result.get("reason"))
        if n == 0:
            self.inner.on_trial_complete(trial_id, result, error)
        for probe in self.followers.pop(trial_id, []):
            # The same point's answer, without what it measured: the measurements are the
            # running trial's, and samplers that learn from them must not count them twice.
            same = None if not result else {k: result[k] for k in (self.metric, "feasible")
                                             if k in result}
            self.inner.on_trial_complete(probe, same, error)
        if result and result.get("feasible") and result.get(self.metric) is not None:
            self.scores.setdefault(key, []).append(float(result[self.metric]))
        elif result and result.get("feasible") is False:
            self.infeasible.add(key)
        self.band = noise_band(self.scores.values(), self.default_band)
        try:
            self.inner.study().set_user_attr("noise_band", self.band)
        except Exception:  # the band is advice to the sampler, never fatal
            log.debug("could not store the noise band in the study", exc_info=True)

    def save(self, checkpoint_path: str) -> None:
        state = {k: v for k, v in self.__dict__.items() if k != "inner"}
        with open(checkpoint_path, "wb") as f:
            pickle.dump({"own": state, "inner": self.inner.__dict__.copy()}, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            saved = pickle.load(f)
        self.__dict__.update(saved["own"])
        self.inner.__dict__.update(saved["inner"])
        if "streak" not in saved["own"]:          # saved before the stop rule existed
            self.streak = FailureStreak()
        # Trials that were running when the driver died are re-run by Tune under the same id;
        # their bookkeeping stays in `live` so their completion is counted once.

    # -- what to re-measure --------------------------------------------------------------------

    def ranking(self) -> list[tuple[str, Robust]]:
        # The spreads shrink towards the measured noise: a point measured once ranks with the
        # pooled spread, not with none (objective.Robust).
        ranked = [(k, Robust.of(v, self.band)) for k, v in self.scores.items() if v]
        sign = 1.0 if self.mode == "max" else -1.0
        return sorted(ranked, key=lambda kv: sign * kv[1].score, reverse=True)

    def _running_trial(self, key: str) -> str | None:
        """The trial measuring `key` now (an exploration before a re-measurement), if any."""
        running = [(n, tid) for tid, (k, n) in self.live.items() if k == key]
        return min(running)[1] if running else None

    def _pending(self, key: str) -> int:
        return sum(1 for k, _ in self.live.values() if k == key)

    def _next_repeat(self) -> tuple[str, int] | None:
        if self.repeat_budget <= 0:
            return None
        ranked = self.ranking()
        if not ranked:
            return None
        if self.explored >= self.max_trials:
            return self._final_repeat(ranked)
        # One early repeat of the incumbent, mid-search. (Alone it is one residual degree of
        # freedom: the band stays the experiment's until the final re-measurements; dropping
        # it cost bench-noisy 3 of 10 picks in the replay, benchmarks/whole_search.py.)
        if self.early_repeat_done or self.explored < max(3, self.max_trials // 3):
            return None
        self.early_repeat_done = True
        key = ranked[0][0]
        have = len(self.scores.get(key, [])) + self._pending(key)
        return (key, have) if have < 2 else None

    def _final_repeat(self, ranked: list[tuple[str, Robust]]) -> tuple[str, int] | None:
        """The next final re-measurement, decided on every answer so far (while a trial runs,
        only the incumbent's first: the rest waits for it), or None when nothing is left to
        decide:

        - the incumbent is re-measured once (min(2, repeats) boots back the pick);
        - then to `repeats` boots while some other config's median is within the band of its
          own (undecided): the pick's own figures first;
        - then each of the top `remeasure_top` runners-up measured once whose median is within
          the band below the incumbent's (one below it beyond the band is decided: its second
          boot would have to measure above the incumbent's median by more than the band to
          lift its median of two past it).

        A re-measurement that changes the ranking changes the incumbent and the runners-up,
        so the next call decides for them. The band is `objective.cautious_band`: the
        measured band once the repeats measure one, before that the experiment's widened by
        the repeats so far (a noisy server's first repeats widen it; the experiment's band
        alone would call its differences beyond noise)."""
        key, best = ranked[0]
        if self.live:
            # The incumbent's first re-measurement is owed unless a running trial overtakes it
            # beyond the band: it starts beside them (a boot lost in that case only, a boot's
            # wait saved in every other). The rest waits for their answers.
            have = best.n + self._pending(key)
            return (key, have) if have < min(2, self.repeats) else None
        band = cautious_band(self.scores.values(), self.default_band)
        sign = 1.0 if self.mode == "max" else -1.0
        others = ranked[1:]

        def undecided(other: Robust) -> bool:
            return sign * (best.median - other.median) <= band

        if best.n < min(2, self.repeats):
            return key, best.n
        if best.n < self.repeats and any(undecided(r) for _, r in others):
            return key, best.n
        for other, r in others[:self.remeasure_top]:
            if r.n < 2 and undecided(r):
                return other, r.n
        return None
