"""What proposed each point: `ProposalSpace`, the define-by-run space handed to OptunaSearch.

It adds to each proposed config what proposed it, for the tables and the live lines: the
sampler that ran (`SAMPLER_KEY`; "enqueued" for the experiment's own points), the plateau
sampler's reason (`JUMP_KEY`), the hybrid's reason for a jump's bracket (`BRACKET_KEY`), the
plateau questions the model answered meanwhile (`PLATEAU_ANSWER_KEY`) and the model's prediction
(`stopping.PREDICTED_KEY`). These config keys are part of the contract with the trainable (see
`searcher`, which also exports them). A ProposalSpace pickles with the searcher; runs pickled
before this module existed name it `specdecode_tune.search.searcher.ProposalSpace`, so
`searcher` still exports it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from ..samplers import DECISION_ATTR
from ..samplers.answered import PLATEAU_ANSWER_ATTR
from ..samplers.observations import PREDICTED_ATTR
from ..space import DefineByRun
from .stopping import PREDICTED_KEY

__all__ = ["BRACKET_KEY", "JUMP_KEY", "PLATEAU_ANSWER_KEY", "SAMPLER_KEY", "ProposalSpace"]

log = logging.getLogger(__name__)

JUMP_KEY = "_jump_reason"       # config key: why the plateau sampler proposed this point
BRACKET_KEY = "_bracket_reason"  # config key: why the hybrid booted a plateau jump's bracket
PLATEAU_ANSWER_KEY = "_plateau_answered"  # config key: plateau questions the model answered
                                # while this point was proposed (JSON list of sentences)
SAMPLER_KEY = "_sampler"        # config key: the sampler that proposed it ("enqueued": the
                                # experiment's own point)


class ProposalSpace(DefineByRun):
    """The define-by-run space, adding to the trial's config, for the tables and progress, what
    proposed the point: the sampler that ran (`enqueued` for the experiment's own points) and
    the plateau sampler's reason. Pickled with the searcher, so a resumed search records the
    sampler it runs."""

    def __init__(self, space: Any, fixed: Any, sampler: str) -> None:
        super().__init__(space, fixed)
        self.sampler = sampler

    def __call__(self, trial: Any) -> dict[str, Any] | None:
        constants = super().__call__(trial) or {}
        reason = trial.user_attrs.get("jump_reason")
        if reason:
            constants[JUMP_KEY] = reason
        decision = trial.user_attrs.get(DECISION_ATTR)
        if isinstance(decision, dict) and decision.get("bracket"):
            constants[BRACKET_KEY] = decision.get("why") or "bracket"
        answered = trial.user_attrs.get(PLATEAU_ANSWER_ATTR)
        if answered:
            # Plateau questions the model answered without a boot while this point was
            # proposed: recorded with the trial that was booted instead.
            constants[PLATEAU_ANSWER_KEY] = json.dumps(list(answered))
        constants[SAMPLER_KEY] = "enqueued" if _enqueued(trial) else self.sampler
        predicted = _predict(trial)
        if predicted is not None:
            # What the model predicted before the boot, recorded with the trial (the report's
            # predicted-vs-measured table; the KV gate reads its p_feasible).
            constants[PREDICTED_KEY] = json.dumps(predicted)
            trial.set_user_attr(PREDICTED_ATTR, predicted)
        return constants


def _predict(trial: Any) -> dict[str, Any] | None:
    """The sampler's model's prediction for the trial's point, when it has one."""
    predict = getattr(trial.study.sampler, "predict", None)
    if predict is None:
        return None
    try:
        out = predict(trial.study, dict(trial.params))
    except Exception:  # a prediction is advice: never the reason a trial does not run
        log.debug("no prediction for trial %s", trial.number, exc_info=True)
        return None
    return out if isinstance(out, dict) else None


def _enqueued(trial: Any) -> bool:
    """Whether Optuna took this trial's parameters from `enqueue_trial` (its `fixed_params`
    system attribute), read through the public FrozenTrial."""
    from optuna.trial import TrialState

    for t in trial.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t.number == trial.number:
            return "fixed_params" in t.system_attrs
    return False
