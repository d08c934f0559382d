"""Every flag of both commands, walked with bad values: one `error:` line, exit 2, nothing
booted, started or written.

The flags come from the parsers themselves (`search.cli.build_parser`, `trial.build_parser`),
so a flag added to either command without bad values here fails
`test_every_flag_of_both_commands_has_bad_values`, and is then walked like the others. A flag
that takes no value is given one (`--json=yes`). Each bad value runs the command's `main()`
in-process from an empty working directory, with Ray's start and the trial's server replaced by
functions that fail the test, so "nothing booted or started" is checked, not assumed; "nothing
written" is the folder's listing before and after. Two run through the real command line too.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from specdecode_tune import trial as trial_module
from specdecode_tune.search import cli as search_cli
from tests.conftest import DATA, REPO

SMALL = str(DATA / "sim-small.toml")
STEPS = "speculative_num_steps"

# (command, flag) -> [(the flag's bad value, or a list of arguments; a fragment its error line
# must hold)]. "{tmp}" is the test's folder. Values a parser refuses and values the experiment
# refuses (its [space] ranges, its fixed flags' types, SGLang's rules) both belong here.
BAD: dict[tuple[str, str], list[tuple[str | list[str], str]]] = {
    ("trial", "--experiment"): [
        ("", "must be a TOML experiment file"),
        ("{tmp}/missing.toml", "no such experiment file"),
        ("{tmp}", "is a directory"),
        ("{tmp}/broken.toml", "TOML syntax error"),
    ],
    ("trial", "--set"): [
        (f"{STEPS}=abc", "must be an integer in [1, 8]"),
        (f"{STEPS}=1.5", "must be an integer in [1, 8]"),
        (f"{STEPS}=true", "must be an integer in [1, 8]"),
        (f"{STEPS}=9", "must be an integer in [1, 8]"),
        (f"{STEPS}=-1", "must be an integer in [1, 8]"),
        (f"{STEPS}=", "empty value"),
        ("speculative_eagle_topk=", "empty value"),
        ("speculative_eagle_topk=2", "give speculative_num_steps too"),
        ("speculative_eagle_topk=0", "an integer top-k in [1, 64]"),
        ([f"{STEPS}=3", "--set", "speculative_eagle_topk=1.5"], "an integer top-k"),
        ([f"{STEPS}=3", "--set", "speculative_num_draft_tokens=9"], "steps + 1 = 4"),
        ([f"{STEPS}=2", "--set", "speculative_eagle_topk=4", "--set",
          "speculative_num_draft_tokens=40"], "not one the server boots"),
        ([f"{STEPS}=3", "--set", f"{STEPS}=4"], "given twice"),
        ("mem_fraction_static=abc", "must be a number"),
        ("mem_fraction_static=1.5", "a fraction in (0, 1]"),
        ("mem_fraction_static=0", "a fraction in (0, 1]"),
        ("disable_radix_cache=1", "must be true or false"),
        ("cuda_graph_max_bs=many", "must be an integer"),
        ("cuda_graph_max_bs=0", "a positive integer"),
        ("no_such_flag=1", "is not a parameter of"),
        ("=4", "expected NAME=VALUE"),
        (STEPS, "expected NAME=VALUE"),
    ],
    ("trial", "--run-dir"): [
        ("", "must be a folder or a storage URI"),
        ("/proc/nope", "not writable"),
        ("{tmp}/a-file/run", "not writable"),
        ("nosuchscheme://bucket/run", "not a storage URI"),
    ],
    ("trial", "--json"): [
        ("--json=yes", "ignored explicit argument"),
    ],
    ("search", "--experiment"): [
        ("", "must be a TOML experiment file"),
        ("{tmp}/missing.toml", "no such experiment file"),
        ("{tmp}", "is a directory"),
        ("{tmp}/broken.toml", "TOML syntax error"),
    ],
    ("search", "--max-trials"): [
        ("0", "must be an integer >= 1"),
        ("-3", "must be an integer >= 1"),
        ("1.5", "must be an integer >= 1"),
        ("abc", "must be an integer >= 1"),
        ("", "must be an integer >= 1"),
    ],
    ("search", "--address"): [
        ("", "must be HOST:PORT"),
        ("nohost", "must be HOST:PORT"),
        ("127.0.0.1:notaport", "must be HOST:PORT"),
        ("127.0.0.1:99999", "a port in [1, 65535]"),
        ("127.0.0.1:1", "no Ray head answers there"),
    ],
    ("search", "--storage"): [
        ("", "must be a folder or a storage URI"),
        ("/proc/nope", "not writable"),
        ("{tmp}/a-file", "not writable"),
        ("nosuchscheme://bucket/runs", "not a storage URI"),
    ],
    ("search", "--name"): [
        ("", "must be a plain name"),
        ("a/b", "must be a plain name"),
        (".hidden", "must be a plain name"),
    ],
    ("search", "--resume"): [
        ("--resume=yes", "ignored explicit argument"),
        (["--resume", "--fresh"], "not allowed with argument"),
        ("--resume", "no search to resume"),
    ],
    ("search", "--fresh"): [
        ("--fresh=yes", "ignored explicit argument"),
        (["--fresh", "--resume"], "not allowed with argument"),
    ],
    ("search", "--sampler"): [
        ("", "must be one of hybrid"),
        ("nope", "must be one of hybrid"),
        ("TPE", "must be one of hybrid"),
    ],
    ("search", "--seed"): [
        ("-5", "must be an integer in [0, 4294967295]"),
        ("4294967296", "must be an integer in [0, 4294967295]"),
        ("1.5", "must be an integer in [0, 4294967295]"),
        ("abc", "must be an integer in [0, 4294967295]"),
        ("", "must be an integer in [0, 4294967295]"),
    ],
}

PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "trial": trial_module.build_parser, "search": search_cli.build_parser}


def flags(command: str) -> dict[str, argparse.Action]:
    """Every flag of a command's parser (its long name), from the parser's own actions."""
    out = {}
    for action in PARSERS[command]()._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        long_names = [o for o in action.option_strings if o.startswith("--")]
        assert long_names, f"{command}: a positional or short-only argument {action.dest}"
        out[long_names[0]] = action
    return out


CASES = [(command, flag, value, fragment)
         for command in PARSERS for flag in flags(command)
         for value, fragment in BAD.get((command, flag), [])]


def test_every_flag_of_both_commands_has_bad_values() -> None:
    walked = {(command, flag) for command in PARSERS for flag in flags(command)}
    missing = sorted(walked - set(BAD))
    assert not missing, f"flags without bad values to walk: {missing}"
    assert not set(BAD) - walked, f"bad values for flags that are gone: {set(BAD) - walked}"
    assert all(BAD[key] for key in BAD)


def base_args(command: str, tmp: Path, flag: str) -> list[str]:
    """A command line that would boot (the trial) or start Ray (the search), without `flag`."""
    if command == "trial":
        base = {"--experiment": [SMALL], "--run-dir": [str(tmp / "run")],
                "--set": [f"{STEPS}=3"]}
    else:
        base = {"--experiment": [SMALL], "--storage": [str(tmp / "runs")],
                "--max-trials": ["1"]}
    return [a for name, values in base.items() if name != flag for v in values
            for a in (name, v)]


def bad_args(flag: str, value: str | list[str], action: argparse.Action, tmp: Path
             ) -> list[str]:
    def fill(text: str) -> str:
        return text.replace("{tmp}", str(tmp))

    if isinstance(value, list):
        items = [fill(v) for v in value]
        return items if items[0].startswith("--") else [flag, *items]
    if action.nargs == 0:          # a flag without a value: the "value" is the whole argument
        return [fill(value)]
    return [f"{flag}={fill(value)}"] if value.startswith("-") else [flag, fill(value)]


def listing(root: Path) -> dict[str, int | None]:
    """Every path under `root`, with its files' modification times. (A folder's own time
    moves when the run dir's storage is tried: a folder made and removed in it at once.)"""
    return {str(p): None if p.is_dir() else p.stat().st_mtime_ns for p in root.rglob("*")}


@pytest.mark.parametrize(("command", "flag", "value", "fragment"), CASES,
                         ids=[f"{c}{f}={v}" for c, f, v, _ in CASES])
def test_a_bad_value_is_one_error_line_and_exit_2_before_anything_starts(
        command: str, flag: str, value: str | list[str], fragment: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import ray

    def started(what: str) -> Callable[..., None]:
        def fail(*args: object, **kwargs: object) -> None:
            # pytest.fail is no Exception: the command's own `except Exception` cannot eat it.
            pytest.fail(f"{what} although {flag} {value!r} is bad")
        return fail

    monkeypatch.setattr(ray, "init", started("Ray was started"))
    monkeypatch.setattr(trial_module, "ServerProcess", started("a server was booted"))
    monkeypatch.setattr(trial_module, "run_trial", started("the trial ran"))
    work = tmp_path / "work"
    work.mkdir()
    (work / "broken.toml").write_text("name = [unclosed\n")
    (work / "a-file").write_text("a file, not a folder\n")
    monkeypatch.chdir(work)
    argv = base_args(command, work, flag) + bad_args(flag, value, flags(command)[flag], work)
    before = listing(tmp_path)

    main = trial_module.main if command == "trial" else search_cli.main
    code = main(argv)

    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert code == 2, (argv, code, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert fragment in lines[0], lines[0]
    assert out == ""
    assert listing(tmp_path) == before, "something was written"


@pytest.mark.parametrize(("command", "args", "fragment"), [
    ("trial", ["--set", f"{STEPS}=1.5"], "must be an integer in [1, 8]"),
    ("search", ["--seed", "-5"], "must be an integer in [0, 4294967295]"),
])
def test_on_the_command_line_too(command: str, args: list[str], fragment: str,
                                 tmp_path: Path) -> None:
    argv = base_args(command, tmp_path, args[0]) + args
    done = subprocess.run([sys.executable, "-m", f"specdecode_tune.{command}", *argv],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
    assert fragment in done.stderr and done.stdout == ""
    assert list(tmp_path.iterdir()) == []
