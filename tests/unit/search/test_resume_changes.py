"""A run dir resumed with an edited experiment: refused where its results would not hold, else
one line saying what the run keeps and what applies from now (search/changes.py).

The run dir keeps the experiment it was started with (`experiment.toml`); each test writes
that copy, edits the experiment one way and asks. The command line is checked in-process with
Ray's start replaced by a function that fails the test (a refusal comes before Ray), and one
resume that goes on is checked up to Ray's start.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specdecode_tune.config import load_experiment
from specdecode_tune.errors import ConfigError
from specdecode_tune.search import changes
from specdecode_tune.search import cli as search_cli
from tests.conftest import DATA

SMALL = (DATA / "sim-small.toml").read_text()


def edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def started_run(tmp_path: Path, edited: str) -> tuple[str, Path]:
    """A run dir started with sim-small, and the edited experiment's file."""
    run_dir = tmp_path / "runs" / "sim-small"
    run_dir.mkdir(parents=True)
    (run_dir / "experiment.toml").write_text(SMALL)
    path = tmp_path / "exp.toml"
    path.write_text(edited)
    return str(run_dir), path


# (what changed, the edit, the words of the one line)
REFUSED = [
    ("measure", ("concurrency = [1, 16]", "concurrency = [1, 8]"),
     "measure.concurrency [1, 16] -> [1, 8]"),
    ("measure window", ("duration_s = 5.0", "duration_s = 2.0"), "measure.duration_s 5.0 -> 2.0"),
    ("objective", ("[search]", '[objective]\nweights = { "1" = 1.0, "16" = 2.0 }\n[search]'),
     'objective.weights (unset) -> {"1": 1.0, "16": 2.0}'),
    ("space", ("high = 8", "high = 10"), "space.speculative_num_steps.high 8 -> 10"),
    ("space parameter", ("[workload]", '[space.speculative_eagle_topk]\ntype = "categorical"\n'
                         'choices = [1, 2]\n\n[workload]'),
     'space.speculative_eagle_topk (unset) -> {"type": "categorical", "log": false, '
     '"choices": [1, 2]}'),
    ("backend flag", ("cuda_graph_max_bs = 64", "cuda_graph_max_bs = 32"),
     "backend.flags.cuda_graph_max_bs 64 -> 32"),
    ("backend model", ('model_path = "Qwen/Qwen3.5-122B-A10B"', 'model_path = "other/model"'),
     "backend.model_path 'Qwen/Qwen3.5-122B-A10B' -> 'other/model'"),
    ("backend server", ("tp_size = 2", "tp_size = 4"), "backend.tp_size 2 -> 4"),
    ("workload", ("output_len = 512", "output_len = 256"), "workload.output_len 512 -> 256"),
    ("workload sampling", ("output_len = 512", "output_len = 512\ntemperature = 0.7"),
     "workload.temperature 0.0 -> 0.7"),
    ("resources per trial", ("gpus_per_trial = 2", "gpus_per_trial = 1"),
     "search.gpus_per_trial 2 -> 1"),
]
KEPT = [
    ("trial cap", ("max_trials = 4", "max_trials = 8"), "search.max_trials 4 -> 8"),
    ("sampler", ('sampler = "tpe"', 'sampler = "random"'), "search.sampler 'tpe' -> 'random'"),
    ("repeats", ("repeats = 2", "repeats = 3"), "search.repeats 2 -> 3"),
    ("trials at a time", ("max_concurrent = 2", "max_concurrent = 1"),
     "search.max_concurrent 2 -> 1"),
]
APPLIED = [
    ("boot timeout", ("boot_timeout_s = 30", "boot_timeout_s = 90"),
     "backend.boot_timeout_s 30.0 -> 90.0"),
    ("cluster", ("num_gpus = 4", "num_gpus = 8"), "cluster.num_gpus 4 -> 8"),
]


@pytest.mark.parametrize(("what", "change", "words"), REFUSED, ids=[c[0] for c in REFUSED])
def test_a_change_the_results_depend_on_is_refused_in_one_line(
        what: str, change: tuple[str, str], words: str, tmp_path: Path) -> None:
    run_dir, path = started_run(tmp_path, edit(SMALL, *change))
    with pytest.raises(ConfigError) as caught:
        changes.check(load_experiment(path), run_dir)
    line = str(caught.value)
    assert "\n" not in line
    assert f"results do not hold for this one: {words}." in line, line
    assert "--name" in line and "--fresh" in line and "not deleted" in line


@pytest.mark.parametrize(("what", "change", "words"), KEPT, ids=[c[0] for c in KEPT])
def test_a_change_the_resumed_searcher_holds_is_kept_and_said(
        what: str, change: tuple[str, str], words: str, tmp_path: Path) -> None:
    run_dir, path = started_run(tmp_path, edit(SMALL, *change))
    said = changes.check(load_experiment(path), run_dir)
    assert said is not None and "\n" not in said
    assert f"{words}: kept as the run was started" in said, said
    assert "--name" in said


@pytest.mark.parametrize(("what", "change", "words"), APPLIED, ids=[c[0] for c in APPLIED])
def test_a_change_of_how_to_run_applies_and_is_said(
        what: str, change: tuple[str, str], words: str, tmp_path: Path) -> None:
    run_dir, path = started_run(tmp_path, edit(SMALL, *change))
    said = changes.check(load_experiment(path), run_dir)
    assert said is not None and "\n" not in said
    assert f"{words}: applies from now" in said, said


def test_a_refusal_names_what_it_would_also_have_kept(tmp_path: Path) -> None:
    text = edit(edit(SMALL, "max_trials = 4", "max_trials = 8"), "high = 8", "high = 6")
    run_dir, path = started_run(tmp_path, text)
    with pytest.raises(ConfigError, match=re.escape(
            "space.speculative_num_steps.high 8 -> 6 (also search.max_trials 4 -> 8)")):
        changes.check(load_experiment(path), run_dir)


def test_the_same_experiment_or_no_copy_says_nothing(tmp_path: Path) -> None:
    run_dir, path = started_run(tmp_path, SMALL + "\n# a comment changes nothing\n")
    assert changes.check(load_experiment(path), run_dir) is None
    assert changes.check(load_experiment(path), str(tmp_path / "no-run")) is None


def test_a_copy_that_no_longer_loads_is_compared_as_written(tmp_path: Path) -> None:
    """The run's copy names a prompt file that is gone: the tables are compared as written."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello there", "output_len": 8}\n')
    with_file = edit(SMALL, "[workload]\n", f'[workload]\nkind = "jsonl"\npath = "{prompts}"\n')
    with_file = re.sub(r"input_len = 256\noutput_len = 512\n", "", with_file)
    run_dir, _ = started_run(tmp_path, SMALL)
    (Path(run_dir) / "experiment.toml").write_text(with_file)
    prompts.unlink()
    with pytest.raises(ConfigError, match=r"workload\.kind 'jsonl' -> \(unset\)"):
        changes.check(load_experiment(tmp_path / "exp.toml"), run_dir)


# --- through the command ----------------------------------------------------------------------

def test_the_command_refuses_an_edited_experiment_before_anything_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """The issue's case: measure.concurrency and the objective's weights edited, the same
    command run again: exit 2, one line, nothing started, the old run untouched."""
    import ray

    def no_ray(*args: object, **kwargs: object) -> None:
        pytest.fail("Ray was started for a run whose experiment changed")

    monkeypatch.setattr(ray, "init", no_ray)
    text = edit(SMALL, "concurrency = [1, 16]", "concurrency = [1, 8]")
    text = edit(text, "[search]", '[objective]\nweights = { "1" = 1.0, "8" = 1.0 }\n[search]')
    run_dir, path = started_run(tmp_path, text)
    kept = (Path(run_dir) / "experiment.toml").read_bytes()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code = search_cli.main(["--experiment", str(path), "--storage", str(tmp_path / "runs"),
                            "--max-trials", "2"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: the run "), err
    assert "measure.concurrency [1, 16] -> [1, 8]; objective.weights" in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert (Path(run_dir) / "experiment.toml").read_bytes() == kept


def test_fresh_or_another_name_is_not_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture) -> None:
    """What the refusal points at goes past it (up to Ray's start, stopped here)."""
    import ray

    class Stop(Exception):
        pass

    def stop(*args: object, **kwargs: object) -> None:
        raise Stop("stopped where Ray would start")

    monkeypatch.setattr(ray, "init", stop)
    run_dir, path = started_run(tmp_path, edit(SMALL, "concurrency = [1, 16]",
                                               "concurrency = [1, 8]"))
    storage = str(tmp_path / "runs")
    for extra in (["--name", "other"], ["--fresh"]):
        code = search_cli.main(["--experiment", str(path), "--storage", storage, *extra])
        out, err = capsys.readouterr()
        assert "started with another experiment" not in err, err
        assert code == 2 and "could not start or join Ray: stopped where Ray" in err, err
    assert list((tmp_path / "runs").glob("sim-small.old-*")), "--fresh moved the old run aside"


def test_a_resume_says_what_it_keeps_of_the_command_line_and_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """--sampler, --seed and --max-trials on a resume, and a larger max_trials in the file:
    the run keeps the settings it was started with, and says so (it used to print the new cap
    and run none of it)."""
    import ray

    def stop(*args: object, **kwargs: object) -> None:
        raise RuntimeError("stopped where Ray would start")

    monkeypatch.setattr(ray, "init", stop)
    monkeypatch.setattr(search_cli, "can_resume", lambda plan: True)
    monkeypatch.setattr(search_cli, "run_settings", lambda plan: {
        "sampler": "tpe", "seed": 0, "max_trials": 4, "max_concurrent": 2})
    run_dir, path = started_run(tmp_path, edit(SMALL, "max_trials = 4", "max_trials = 8"))
    search_cli.main(["--experiment", str(path), "--storage", str(tmp_path / "runs"),
                     "--max-trials", "6", "--seed", "3", "--sampler", "tpe"])
    out = capsys.readouterr().out
    assert "search.max_trials 4 -> 8: kept as the run was started" in out, out
    assert ("--seed 3, --max-trials 6: ignored when resuming; the search goes on with the "
            "sampler, seed and trial cap it was started with (tpe, seed 0, 4 trials)") in out
    assert "(resuming; sampler tpe, 4 trials, 2 at a time" in out, out


@pytest.mark.parametrize("missing", ["No module named 'specdecode_tune.searcher'",
                                     "module 'specdecode_tune.search' has no attribute "
                                     "'_DefineByRunWithJump'"])
def test_a_run_saved_by_the_old_layout_asks_for_fresh_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: str) -> None:
    """Runs pickled before 2026-12-06 name the shims that went (specdecode_tune.searcher,
    search._DefineByRunWithJump): a resume says so and what to do, not Ray's traceback."""
    from ray import tune

    from specdecode_tune.search.preflight import RunPlan
    from specdecode_tune.search.tuner import build_tuner

    def old_pickle(*_a: object, **_k: object) -> None:
        raise (ModuleNotFoundError if "module named" in missing else AttributeError)(missing)

    monkeypatch.setattr(tune.Tuner, "restore", staticmethod(old_pickle))
    exp = load_experiment(DATA / "sim-small.toml")
    plan = RunPlan(exp=exp, run_dir=str(tmp_path / "r"), local_dir=tmp_path / "r",
                   storage=str(tmp_path), name="r", is_uri=False)
    with pytest.raises(ConfigError) as e:
        build_tuner(plan, [], "hybrid", 0, 4, resume=True)
    line = str(e.value)
    assert "\n" not in line and "older specdecode_tune" in line and "--fresh" in line


def journal_with_path(run_dir: Path, path: str) -> None:
    """The run's Optuna journal, its settings saying where the run began (as build_tuner
    writes them)."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from specdecode_tune.search.tuner import RUN_ATTR
    from specdecode_tune.store import rundir

    storage = JournalStorage(JournalFileBackend(str(rundir.journal_file(run_dir))))
    study = optuna.create_study(study_name=run_dir.name, storage=storage, direction="maximize")
    study.set_user_attr(RUN_ATTR, {"sampler": "tpe", "seed": 0, "max_trials": 4,
                                   "max_concurrent": 2, "path": path})


def test_a_moved_run_is_refused_before_anything_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """A run dir copied from elsewhere (another machine's /tmp, a renamed folder): restored,
    Tune's checkpoints and the Optuna journal would go on being written where it began (seen
    on 2026-12-07: the journal at the old place grew, the copy's did not). One line, exit 2,
    before Ray; the same run where it began goes on (up to Ray's start)."""
    import ray

    class Stop(Exception):
        pass

    def stop(*args: object, **kwargs: object) -> None:
        raise Stop("stopped where Ray would start")

    monkeypatch.setattr(ray, "init", stop)
    monkeypatch.setattr(search_cli, "can_resume", lambda plan: True)
    run_dir, path = started_run(tmp_path, SMALL)
    storage = tmp_path / "runs"
    journal_with_path(Path(run_dir), "/elsewhere/runs/sim-small")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code = search_cli.main(["--experiment", str(path), "--storage", str(storage)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert f"error: the run {run_dir} was started at /elsewhere/runs/sim-small" in err, err
    assert "move it back" in err and "--fresh" in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before

    here = tmp_path / "here"
    run_here, _ = started_run(here, SMALL)
    journal_with_path(Path(run_here), str((here / "runs" / "sim-small").absolute()))
    code = search_cli.main(["--experiment", str(path), "--storage", str(here / "runs")])
    out, err = capsys.readouterr()
    assert "was started at" not in err, err
    assert code == 2 and "could not start or join Ray: stopped where Ray" in err, err


def test_the_same_run_by_another_spelling_is_not_a_moved_one(tmp_path: Path) -> None:
    """--storage given as a relative path from elsewhere, with `..`, or through a symlink names
    the folder the run began in: no refusal."""
    from specdecode_tune.search.preflight import plan_run
    from specdecode_tune.search.tuner import moved_from

    run_dir, path = started_run(tmp_path, SMALL)
    journal_with_path(Path(run_dir), str((tmp_path / "runs" / "sim-small").absolute()))
    (tmp_path / "link").symlink_to(tmp_path / "runs")
    (tmp_path / "sub").mkdir()
    exp = load_experiment(path)
    from specdecode_tune.search.tuner import run_settings

    for storage in (tmp_path / "sub" / ".." / "runs", tmp_path / "link"):
        args = search_cli.build_parser().parse_args(["--storage", str(storage)])
        plan = plan_run(exp, args)
        assert run_settings(plan).get("path"), storage       # the journal was read
        assert moved_from(plan, run_settings(plan)) is None, storage
    elsewhere = tmp_path / "copy"
    import shutil
    shutil.copytree(tmp_path / "runs", elsewhere)
    args = search_cli.build_parser().parse_args(["--storage", str(elsewhere)])
    plan = plan_run(exp, args)
    assert moved_from(plan, run_settings(plan)) == str(
        (tmp_path / "runs" / "sim-small").absolute())
