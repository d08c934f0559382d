"""The Ray Tune searcher: Optuna proposes, this decides what runs next.

`SpecOptunaSearch` is Ray's OptunaSearch with the one thing it lacks for servers: a config the
server refuses is told to Optuna as a violated constraint (`trial.set_constraint`), not as a
failed trial, so constraint-aware samplers learn where the feasible region ends.

`RepeatingSearcher` wraps it and spends part of the budget on re-measuring: the incumbent is
measured `repeats` times and the runners-up twice, so that scores are medians with a MAD
penalty and the noise band is measured, not assumed. Early in the search (after a third of the
budget) it re-measures the incumbent once, so the plateau detector works with a measured band.
Repeats never reach Optuna (the study sees each configuration once). The whole state pickles
into Tune's experiment dir, so an interrupted search resumes with it.
"""

from __future__ import annotations

import json
import logging
import pickle
from typing import Any

from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from .objective import Robust, noise_band

log = logging.getLogger(__name__)

REPEAT_KEY = "_repeat"          # config key: 0 = explored by Optuna, n = n-th re-measurement
JUMP_KEY = "_jump_reason"       # config key: why the plateau sampler proposed this point
SAMPLER_KEY = "_sampler"        # config key: the sampler that proposed it ("enqueued": the
                                # experiment's own point)
MAX_DUPLICATES = 25             # repeated proposals answered from data before giving up


def params_key(config: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in config.items() if not k.startswith("_")},
                      sort_keys=True, default=str)


class SpecOptunaSearch(OptunaSearch):
    """OptunaSearch where `result["feasible"] == False` becomes a violated constraint."""

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is not None and result is not None and "feasible" in result:
            ot_trial.set_constraint("feasible", 0.0 if result["feasible"] else 1.0)
        if ot_trial is not None and result is not None and result.get("measured"):
            # What the trial measured, for samplers that learn from more than the score.
            ot_trial.set_user_attr("measured", json.loads(result["measured"]))
        super().on_trial_complete(trial_id, result, error)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        # Per-level progress carries no objective value; the final result is told on completion.
        return

    def study(self) -> Any:
        return self._ot_study


class RepeatingSearcher(Searcher):
    """Explore `max_trials` points through Optuna, interleave re-measurements, then finish."""

    def __init__(self, inner: SpecOptunaSearch, *, max_trials: int, repeats: int,
                 remeasure_top: int, default_band: float, infeasible_score: float = -5.0,
                 metric: str = "score",
                 mode: str = "max") -> None:
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

    # -- Tune's Searcher interface -------------------------------------------------------------

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict,
                              **spec: Any) -> bool:
        return self.inner.set_search_properties(metric, mode, config, **spec)

    def suggest(self, trial_id: str) -> dict | str | None:
        repeat = self._next_repeat()
        if repeat is not None:
            self.repeat_budget -= 1
            return self._repeat(trial_id, *repeat)
        if self.explored >= self.max_trials:
            return None if self.live else Searcher.FINISHED
        # A boot costs minutes: a point already measured is answered from the measurements
        # (told to Optuna at once), a point being measured now waits for that trial's answer,
        # and Optuna is asked again. After MAX_DUPLICATES such answers in a row the space is
        # taken as exhausted: the point runs as a re-measurement.
        for attempt in range(MAX_DUPLICATES):
            # Every proposal gets its own id: one answered from data is completed under it.
            probe = f"{trial_id}~{attempt}"
            config = self.inner.suggest(probe)
            if config in (None, Searcher.FINISHED):
                return config
            key = params_key(config)
            known = self.scores.get(key)
            running = self._running_trial(key)
            if not known and key not in self.infeasible and running is not None:
                self.followers.setdefault(running, []).append(probe)
                self.duplicates += 1
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
        self.explored += 1
        self.configs.setdefault(key, config)
        return self._repeat(trial_id, key, len(self.scores.get(key, [])) + self._pending(key))

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
        except Exception:  # noqa: BLE001 - the band is advice to the sampler, never fatal
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
        # Trials that were running when the driver died are re-run by Tune under the same id;
        # their bookkeeping stays in `live` so their completion is counted once.

    # -- what to re-measure --------------------------------------------------------------------

    def ranking(self) -> list[tuple[str, Robust]]:
        ranked = [(k, Robust.of(v)) for k, v in self.scores.items() if v]
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
        if self.explored < self.max_trials:
            # One early repeat of the incumbent, so the noise band is measured mid-search.
            if self.early_repeat_done or self.explored < max(3, self.max_trials // 3):
                return None
            self.early_repeat_done = True
            targets = [(ranked[0][0], 2)]
        else:
            targets = [(ranked[0][0], self.repeats)]
            targets += [(k, 2) for k, _ in ranked[1:1 + self.remeasure_top]]
        for key, wanted in targets:
            have = len(self.scores.get(key, [])) + self._pending(key)
            if have < wanted:
                return key, have
        return None
