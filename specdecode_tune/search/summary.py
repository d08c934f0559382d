"""The closing lines of a finished search: how long it took, why it stopped early if it did,
the trials by status, the best config against the baseline per level with the plateau verdicts
(the report's own lines: one computation for both), and where the tables and the study are.

Everything here is read back from the run dir's tables, so a resumed run's summary counts the
trials of every driver that ran it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..backends import get_backend
from ..store import read_table, rundir
from .baseline import BASELINE_ID
from .preflight import RunPlan
from .progress import say
from .searcher import SKIPPED_ATTR, STOP_ATTR, FailureStreak
from .validate import SAME_ID, SCHEDULE_ID


def print_summary(plan: RunPlan, elapsed_s: float, max_trials: int | None = None) -> str | None:
    """Print the closing lines; returns why the search stopped early, or None. `max_trials`:
    the cap this driver ran under (--max-trials, else the experiment's)."""
    stopped = stopped_early(plan)
    say("")
    say(f"search finished in {elapsed_s:.0f}s")
    if stopped:
        say(stopped)
    say(trial_counts(plan))
    report(plan)
    say(f"tables: {plan.run_dir}/{rundir.TABLES_DIR} (Parquet: requests, levels, trials); "
        f"Optuna study: {rundir.journal_file(plan.local_dir)}")
    for line in why_stopped(plan, stopped, max_trials):
        say(line)
    return stopped


def why_stopped(plan: RunPlan, stopped: str | None, max_trials: int | None = None
                ) -> list[str]:
    """The last lines: why the search stopped (the stop rule's reason, read from the study,
    else the cap: `max_trials`, else the experiment's), and the boots the gate did not make
    (the KV model's refusals, the release's known crashes)."""
    if stopped:
        return [f"stopped: {stopped}"]
    attrs = study_attrs(plan)
    lines = skipped_lines(attrs.get(SKIPPED_ATTR) or [])
    reason = attrs.get(STOP_ATTR)
    if reason:
        lines.append(f"stopped: {reason}; then the re-measurements")
    else:
        cap = max_trials or plan.exp.search.max_trials
        where = ("--max-trials" if cap != plan.exp.search.max_trials
                 else "the experiment's max_trials")
        lines.append(f"stopped: the trial cap ({cap} points, {where}) was reached, then the "
                     f"re-measurements")
    return lines


def skipped_lines(skipped: Sequence[Mapping[str, Any]]) -> list[str]:
    """The gate's skips, one line per cause: the fitted KV model's refusals, the release's
    known crashes."""
    by_kv = [e for e in skipped if e.get("by") != "release"]
    crashes = [e for e in skipped if e.get("by") == "release"]
    lines = []
    if by_kv:
        lines.append(f"not booted: {len(by_kv)} point(s) the fitted KV model says the server "
                     f"refuses (e.g. {by_kv[0].get('params')})")
    if crashes:
        lines.append(f"not booted: {len(crashes)} point(s) the servers' release crashes on "
                     f"(e.g. {crashes[0].get('params')}: {crashes[0].get('why')})")
    return lines


def study_attrs(plan: RunPlan) -> dict:
    """The Optuna study's user attrs, read from the run's journal ({} where there is none)."""
    journal = rundir.journal_file(plan.local_dir)
    if not journal.exists():
        return {}
    try:
        import optuna
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        storage = JournalStorage(JournalFileBackend(str(journal)))
        return dict(optuna.load_study(study_name=plan.name, storage=storage).user_attrs)
    except Exception:  # noqa: BLE001 - the closing line must not fail the search
        return {}


def stopped_early(plan: RunPlan) -> str | None:
    """Why the searcher stopped before its budget (searcher.FailureStreak: trials in a row at
    distinct configs failing with the same reason), or None. The rule is replayed over the
    trials table in the order the trials finished, so a resumed run that stops says so too."""
    rows = [r for r in read_table(plan.run_dir, "trials").to_pylist()
            if r["trial_id"] not in (BASELINE_ID, SCHEDULE_ID, SAME_ID)]
    rows.sort(key=lambda r: (r["finished_at"] is None, r["finished_at"]))
    streak = FailureStreak()
    for r in rows:
        streak.observe(r["config_key"], r["status"], r["reason"])
    if streak.tripped is None:
        return None
    advice = get_backend(plan.exp.backend.kind).refusal_advice(streak.tripped)
    return streak.tripped + (f"; {advice}" if advice else "")


def trial_counts(plan: RunPlan) -> str:
    """One line counting the trials by status (the trials table only: the requests table, a
    row per request, is not needed here)."""
    trials = [r for r in read_table(plan.run_dir, "trials").to_pylist()
              if r["trial_id"] != BASELINE_ID]
    keys = {r["config_key"] for r in trials}
    n = {s: sum(1 for r in trials if r["status"] == s) for s in ("ok", "infeasible")}
    other = len(trials) - n["ok"] - n["infeasible"]
    return (f"trials: {len(trials)} measured ({n['ok']} ok, {n['infeasible']} infeasible, "
            f"{other} failed/pruned), {len(keys)} distinct configs")


def report(plan: RunPlan) -> None:
    """Write the run's report and print its best-config lines (or why there is none)."""
    from ..report import RunDirError, write_report

    try:
        out = write_report(plan.run_dir)
    except RunDirError as e:
        # The tables are written; a report that cannot be made must not hide them.
        say("no feasible configuration was measured")
        say(f"report: not written ({e})")
        return
    # The best config's figures are the report's (one computation for both).
    for line in out.best_lines + out.summary_lines:
        say(line)
    say(f"report: {out.path} (and report.html beside it)")
