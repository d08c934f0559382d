"""The default sampler, the stop rule and the KV gate, driven directly (no cluster)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import optuna
import pytest
from ray.tune.search import Searcher

from specdecode_tune.config import SAMPLERS, SearchConfig, load_experiment
from specdecode_tune.samplers import DECISION_ATTR, HybridSampler
from specdecode_tune.search.sampler_factory import make_sampler
from specdecode_tune.search.searcher import REPEAT_KEY, RepeatingSearcher, SpecOptunaSearch
from specdecode_tune.search.stopping import PREDICTED_KEY, KVGate, StopRule
from specdecode_tune.search.summary import skipped_lines
from specdecode_tune.space import DefineByRun, ParamSpec

REPO = Path(__file__).resolve().parents[3]


def test_hybrid_is_the_default_and_the_others_stay_selectable() -> None:
    assert SearchConfig().sampler == "hybrid"
    assert {"hybrid", "plateau", "model", "tpe", "random", "nsga2"} <= set(SAMPLERS)
    exp = load_experiment(REPO / "experiments" / "sim-default.toml")
    assert exp.search.sampler == "hybrid"
    assert isinstance(make_sampler("hybrid", exp, 0), HybridSampler)


class Outlook:
    """A sampler stand-in whose outlook is set by the test."""

    def __init__(self, outlook: dict) -> None:
        self.value = outlook

    def outlook(self, study: object, band: float | None = None) -> dict:
        self.band = band
        return self.value


@pytest.mark.parametrize(("outlook", "explored", "stops"), [
    ({"by": "model", "ei": 0.001, "ei_beyond_band": 0.0, "fit_error": 0.01}, 5, True),
    # Small gains likely (EI over a quarter of the band), none beyond the band worth a boot.
    ({"by": "model", "ei": 0.02, "ei_beyond_band": 0.004, "fit_error": 0.01}, 5, True),
    ({"by": "model", "ei": 0.05, "ei_beyond_band": 0.02, "fit_error": 0.01}, 5, False),
    ({"by": "model", "ei": 0.001, "ei_beyond_band": 0.0}, 2, False),   # too few points
    ({"by": "model", "ei": 0.001}, 5, False),              # no gain beyond the band said
    ({"by": "plateau", "why": "a plateau on steps is not probed yet"}, 5, False),
    ({"by": "base", "why": "poor fit"}, 5, False),                     # nothing known
])
def test_the_stop_rule_needs_a_good_fit_no_open_plateau_and_no_gain_beyond_the_band(
        outlook: dict, explored: int, stops: bool) -> None:
    rule = StopRule(min_explored=4)
    sampler = Outlook(outlook)
    why = rule.check(None, sampler, 0.025, explored)
    assert (why is not None) == stops
    if explored >= 4:
        assert sampler.band == 0.025          # the rule's band is what the gain is beyond
    if stops:
        assert "beyond the noise band" in why and "0.0125" in why and rule.why == why


def test_a_sampler_without_an_outlook_never_stops_early() -> None:
    assert StopRule().check(None, object(), 0.025, 100) is None


def test_the_kv_gate_skips_only_what_the_fit_is_sure_the_server_refuses() -> None:
    gate = KVGate(max_p_feasible=0.05)
    sure = {"speculative_num_steps": 9, PREDICTED_KEY: json.dumps({"p_feasible": 0.0})}
    unsure = {"speculative_num_steps": 8, PREDICTED_KEY: json.dumps({"p_feasible": 0.4})}
    assert gate.refuses(sure) is not None
    assert gate.refuses(unsure) is None                 # the probe of the boundary
    assert gate.refuses({"speculative_num_steps": 3}) is None   # no prediction: boot it
    assert [s["params"] for s in gate.skipped] == [{"speculative_num_steps": 9}]
    # After a refusal the boundary was probed once: the unsure point is skipped too.
    assert gate.refuses(unsure, refused_before=True) is not None
    # ... and so is one the fit gives even 89%: after a refusal only a near-sure boot runs.
    fair = {"speculative_num_steps": 7, PREDICTED_KEY: json.dumps({"p_feasible": 0.89})}
    assert gate.refuses(fair, refused_before=True) is not None
    assert gate.refuses(fair) is None
    likely = {"speculative_num_steps": 6, PREDICTED_KEY: json.dumps({"p_feasible": 0.9})}
    assert gate.refuses(likely, refused_before=True) is None


def test_the_gate_skips_what_the_servers_release_crashes_on_and_pickles() -> None:
    """SGLang 0.5.17 crashes at boot on a tree narrower than deep (an H100, 2026-12-06): the
    search's gate, given the experiment's backend, tells such a proposal to Optuna as refused
    and boots nothing; 0.5.14 boots it; the gate survives a checkpoint's pickle."""
    import functools
    import pickle

    from specdecode_tune.backends import known_refusal
    from specdecode_tune.config import BackendConfig

    def gate_for(version: str) -> KVGate:
        cfg = BackendConfig(kind="sglang", model_path="m", draft_model_path="d",
                            engine_version=version, binary="/opt/sglang-server")
        return KVGate(known=functools.partial(known_refusal, cfg))

    short = {"speculative_num_steps": 8, "speculative_eagle_topk": 2,
             "speculative_num_draft_tokens": 8,
             PREDICTED_KEY: json.dumps({"p_feasible": 1.0})}
    gate = pickle.loads(pickle.dumps(gate_for("0.5.17")))
    why = gate.refuses(short)
    assert why is not None and why.startswith("not booted: backend: speculative_num_draft_"
                                              "tokens = 8 < speculative_num_steps + 1 = 9")
    assert gate.skipped[0]["by"] == "release" and PREDICTED_KEY not in gate.skipped[0]["params"]
    assert gate.refuses({**short, "speculative_num_draft_tokens": 9}) is None
    assert gate.refuses({"speculative_num_steps": 0}) is None          # the baseline
    assert gate_for("0.5.14").refuses(short) is None
    old = KVGate()
    del old.__dict__["known"]                  # a gate pickled before it knew of crashes
    assert old.refuses(short) is None
    # The search's closing lines name the cause of each skip.
    kv = {"params": {"speculative_num_steps": 9}, "p_feasible": 0.0, "why": "not booted: kv"}
    lines = skipped_lines([kv, *gate.skipped])
    assert lines[0].startswith("not booted: 1 point(s) the fitted KV model says")
    assert lines[1].startswith("not booted: 1 point(s) the servers' release crashes on (e.g. "
                               "{'speculative_num_steps': 8, 'speculative_eagle_topk': 2, "
                               "'speculative_num_draft_tokens': 8}: backend: ")


def test_the_oom_boundary_is_unknown_until_a_boot_runs_out_then_bounds_its_side() -> None:
    from specdecode_tune.samplers.model.oom import fit_oom
    from specdecode_tune.samplers.model.trials import TrialObs

    def obs(mem: float, draft: int, ok: bool) -> TrialObs:
        return TrialObs(steps=draft - 1, topk=1, draft=draft, mem=mem, feasible=ok,
                        failure=None if ok else "oom", kv=None, limit=None, levels=())

    assert fit_oom([obs(0.85, 5, True)]) is None            # nothing refused: no boundary
    fit = fit_oom([obs(0.85, 5, True), obs(0.92, 5, False)])
    assert fit is not None
    assert fit.p_feasible(0.92, 5) == 0.0                   # refused there
    assert fit.p_feasible(0.93, 6) == 0.0                   # and above it, with more tokens
    assert fit.p_feasible(0.85, 5) == 1.0                   # ran there
    assert 0.0 < fit.p_feasible(0.88, 5) < 1.0              # in between: unsure
    assert fit.p_feasible(0.88, 5) > fit.p_feasible(0.91, 5)


class StopsAfter:
    """A stop rule that fires once `n` points were explored."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.why: str | None = None

    def check(self, study: object, sampler: object, band: float, explored: int) -> str | None:
        if explored >= self.n:
            self.why = f"stop after {self.n}"
        return self.why


def _searcher(rule: object, gate: KVGate | None = None) -> RepeatingSearcher:
    space = (ParamSpec("speculative_num_steps", "int", 1, 10),)
    inner = SpecOptunaSearch(space=DefineByRun(space, {}), metric="score", mode="max",
                             sampler=optuna.samplers.RandomSampler(seed=1), seed=1)
    return RepeatingSearcher(inner, max_trials=10, repeats=3, remeasure_top=1,
                             default_band=0.025, stop_rule=rule, gate=gate)  # type: ignore[arg-type]


def _score(cfg: dict) -> dict:
    s = cfg["speculative_num_steps"]
    return {"feasible": True, "score": math.log(1 + s) - 0.05 * s * s}


def test_the_rule_caps_exploring_then_the_remeasurements_run_then_it_finishes() -> None:
    searcher = _searcher(StopsAfter(4))
    ran = []
    for i in range(100):
        cfg = searcher.suggest(f"t{i}")
        if cfg == Searcher.FINISHED:
            break
        assert isinstance(cfg, dict)
        ran.append(cfg)
        searcher.on_trial_complete(f"t{i}", _score(cfg))
    explored = [c for c in ran if c.get(REPEAT_KEY, 0) == 0]
    assert len(explored) == 4                              # not the cap of 10
    assert any(c.get(REPEAT_KEY, 0) > 0 for c in ran)      # the re-measurements still ran
    assert searcher.stop_reason == "stop after 4"
    assert searcher.inner.study().user_attrs["stop_reason"] == "stop after 4"


def test_the_rule_waits_for_a_running_exploration_before_it_stops() -> None:
    searcher = _searcher(StopsAfter(2))
    a, b = searcher.suggest("a"), searcher.suggest("b")
    assert isinstance(a, dict) and isinstance(b, dict)
    searcher.on_trial_complete("a", _score(a))
    # Two explored, one still running: no third exploration, no finish; it waits.
    assert searcher.suggest("c") is None
    searcher.on_trial_complete("b", _score(b))
    nxt = searcher.suggest("d")
    assert isinstance(nxt, dict) and nxt.get(REPEAT_KEY, 0) > 0


def test_a_gated_point_is_told_to_optuna_as_refused_and_not_booted() -> None:
    class Gate(KVGate):
        def refuses(self, config: dict, refused_before: bool = False) -> str | None:
            return "predicted refused" if config["speculative_num_steps"] >= 6 else None

    searcher = _searcher(None, Gate())
    booted = []
    for i in range(40):
        cfg = searcher.suggest(f"t{i}")
        if cfg == Searcher.FINISHED:
            break
        assert isinstance(cfg, dict)
        booted.append(cfg["speculative_num_steps"])
        searcher.on_trial_complete(f"t{i}", _score(cfg))
    assert booted and all(s < 6 for s in booted)
    told = [t for t in searcher.inner.study().trials
            if t.params.get("speculative_num_steps", 0) >= 6]
    assert told and all(t.constraints == {"feasible": 1.0} for t in told)


def test_the_hybrid_sampler_records_who_proposed_and_predicts_before_the_boot() -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import whole_search

    captured: list[optuna.Study] = []
    original = SpecOptunaSearch.study

    def study(self: SpecOptunaSearch) -> optuna.Study:
        s = original(self)
        if not captured:
            captured.append(s)
        return s

    SpecOptunaSearch.study = study  # type: ignore[method-assign]
    try:
        result = whole_search.run_whole("seed-qwen35-122b", 0)
    finally:
        SpecOptunaSearch.study = original  # type: ignore[method-assign]
    trials = captured[0].trials
    by = [t.user_attrs.get(DECISION_ATTR, {}).get("by") for t in trials]
    assert "model" in by
    predicted = [t.user_attrs["predicted"] for t in trials if "predicted" in t.user_attrs]
    assert predicted and all({"tok_s", "accept_length", "p_feasible"} <= set(p)
                             for p in predicted)
    assert result["boots"] >= 1 + result["explored"]
    # The stop rule's figure: the expected gain beyond a band, never more than the expected
    # improvement itself, and smaller the wider the band.
    sampler = captured[0].sampler
    narrow = sampler.outlook(captured[0], band=0.01)
    wide = sampler.outlook(captured[0], band=0.05)
    if narrow["by"] == "model":
        assert 0.0 <= wide["ei_beyond_band"] <= narrow["ei_beyond_band"] <= narrow["ei"]
    assert "ei_beyond_band" not in sampler.outlook(captured[0])
    # A plateau probe running (its trial not finished): the question is open, and the outlook
    # says what the model's proposal beside it would gain beyond the band (the stop rule's
    # `waits_for_probe` reads it), as the model's own decision says it with no probe running.
    from specdecode_tune.samplers.plateau import events as ev
    events = ev.load_events(captured[0])
    ev.save_events(captured[0], [*events, {"outcome": None, "trial_number": 10_000}])
    running = sampler.outlook(captured[0], band=0.025)
    assert running["by"] == "plateau" and running["running"] is True
    decision, _ = sampler.model.decide(captured[0], len(trials), band=0.025)
    assert decision["by"] == "model"          # the search stopped on a good fit
    assert running["model_ei_beyond_band"] == decision["ei_beyond_band"]
    assert "model_ei_beyond_band" not in sampler.outlook(captured[0])
    ev.save_events(captured[0], events)


def test_a_gate_skip_is_news_to_the_stop_rule() -> None:
    """A proposal the KV gate skips is told to the study as a refusal; that can answer what
    kept the rule from stopping (a plateau probe the gate says the server refuses). The rule is
    asked again before the next proposal is booted, not only after the next trial finishes."""
    class Gate(KVGate):
        def refuses(self, config: dict, refused_before: bool = False) -> str | None:
            if config["speculative_num_steps"] >= 6:
                self.skipped.append({"params": dict(config)})
                return "predicted refused"
            return None

    class StopsAfterASkip:
        why: str | None = None

        def check(self, study: object, sampler: object, band: float, explored: int
                  ) -> str | None:
            if gate.skipped:
                self.why = "the skip answered the last question"
            return self.why

    gate = Gate()
    searcher = _searcher(StopsAfterASkip(), gate)
    after_skip = []
    for i in range(60):
        cfg = searcher.suggest(f"t{i}")
        if cfg == Searcher.FINISHED:
            break
        assert isinstance(cfg, dict)
        if cfg.get(REPEAT_KEY, 0) == 0 and gate.skipped:
            after_skip.append(cfg)
        searcher.on_trial_complete(f"t{i}", _score(cfg))
    assert gate.skipped and searcher.stop_reason == "the skip answered the last question"
    assert after_skip == []          # no exploration booted once the rule held


@pytest.mark.parametrize(("beside", "waits"), [
    (0.004, True),          # the model's next proposal is not worth a boot: wait for the probe
    (0.02, False),          # it is (over half the band): booted beside the probe, as before
    (None, False),          # the model says nothing (poor fit, TPE's turn): as before
])
def test_the_rule_makes_the_trial_beside_a_running_probe_wait_only_if_it_is_not_worth_a_boot(
        beside: float | None, waits: bool) -> None:
    outlook: dict = {"by": "plateau", "running": True, "why": "the probe of trial 5 runs"}
    if beside is not None:
        outlook["model_ei_beyond_band"] = beside
    rule = StopRule(min_explored=4)
    assert rule.check(None, Outlook(outlook), 0.025, 6) is None      # never a stop
    assert rule.waits_for_probe is waits
    # A plateau not yet probed is the next trial itself: nothing waits for it.
    rule.check(None, Outlook({"by": "plateau", "why": "not probed yet",
                              "model_ei_beyond_band": 0.0}), 0.025, 6)
    assert rule.waits_for_probe is False


class ProbeRunning:
    """A stop rule whose outlook is a running plateau probe beside which the model's next
    proposal is not worth a boot, until `answered` is set; then it holds."""

    def __init__(self) -> None:
        self.why: str | None = None
        self.waits_for_probe = False
        self.answered = False
        self.checks = 0

    def check(self, study: object, sampler: object, band: float, explored: int) -> str | None:
        self.checks += 1
        self.waits_for_probe = explored >= 1 and not self.answered
        if self.answered:
            self.why = "the probe answered"
        return self.why


def test_the_trial_beside_a_running_probe_waits_for_its_answer_then_the_rule_holds() -> None:
    rule = ProbeRunning()
    searcher = _searcher(rule)
    probe = searcher.suggest("probe")
    assert isinstance(probe, dict)
    # The probe started (one exploration more): the rule is asked again, and the slot beside
    # it waits instead of booting the model's proposal.
    assert searcher.suggest("beside") is None
    assert searcher.explored == 1
    rule.answered = True
    searcher.on_trial_complete("probe", _score(probe))
    nxt = searcher.suggest("next")
    assert isinstance(nxt, dict) and nxt.get(REPEAT_KEY, 0) > 0     # the re-measurements
    assert searcher.stop_reason == "the probe answered" and searcher.explored == 1
