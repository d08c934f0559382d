"""Bad input to `python -m specdecode_tune.search`: one line, exit 2, nothing started or written.

Each file under `tests/data/bad/` is an experiment with one thing wrong. Its header says what:

    # <what is wrong>
    # expect: <text the one stderr line must contain>
    # args: <more CLI arguments>            (optional)
    # storage: file                         (optional: --storage names a file, not a folder)
    # skip-if-installed: <package>          (optional: only bad where that package is missing)

Every file goes through the CLI's `main()` in-process with `ray.init` replaced by a function that
fails the test, so the check is that the error comes before Ray, and fast. A few go through the
real command line as well, tagged with SPECDECODE_TEST_TAG: no process they started (Ray's
included) may be alive once they exit.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from specdecode_tune import search
from specdecode_tune.testing.processes import kill_pids, tagged_processes
from tests.conftest import DATA, REPO

BAD = sorted((DATA / "bad").glob("*.toml"))


@dataclass(frozen=True)
class Case:
    path: Path
    expect: str
    args: tuple[str, ...]
    storage_is_file: bool
    needs_missing: str | None


def case(path: Path) -> Case:
    head = path.read_bytes().decode(errors="replace")

    def directive(name: str) -> str | None:
        m = re.search(rf"^# {name}: (.*)$", head, re.M)
        return m.group(1).strip() if m else None

    expect = directive("expect")
    assert expect, f"{path.name} has no '# expect:' line"
    return Case(path=path, expect=expect, args=tuple((directive("args") or "").split()),
                storage_is_file=directive("storage") == "file",
                needs_missing=directive("skip-if-installed"))


def prepare(c: Case, tmp_path: Path) -> tuple[list[str], dict[str, float]]:
    if c.needs_missing and importlib.util.find_spec(c.needs_missing) is not None:
        pytest.skip(f"{c.needs_missing} is installed here, so {c.path.name} is not bad")
    storage = tmp_path / "runs"
    if c.storage_is_file:
        storage.write_text("a file, not a folder\n")
    argv = ["--experiment", str(c.path), "--storage", str(storage), *c.args]
    return argv, snapshot(tmp_path)


def snapshot(root: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in root.rglob("*")}


def test_there_are_enough_bad_files() -> None:
    assert len(BAD) >= 25
    for path in BAD:
        case(path)


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_experiment_in_process(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture) -> None:
    import ray

    def no_ray(*args: object, **kwargs: object) -> None:
        raise AssertionError("ray.init was called: the bad input was not caught before Ray")

    monkeypatch.setattr(ray, "init", no_ray)
    c = case(path)
    argv, before = prepare(c, tmp_path)
    t0 = time.monotonic()
    code = search.main(argv)
    wall = time.monotonic() - t0
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and c.expect in lines[0], lines[0]
    assert out == ""
    assert snapshot(tmp_path) == before, "something was written"
    assert wall < 30       # a guard against going on into a boot, not a speed target


# Through the real command line: the ones that get furthest before failing.
CLI_CASES = ["sim-hybrid-radix-cache", "syntax-unclosed-table", "unreachable-cluster",
             "storage-is-a-file", "sim-bad-fault",
             "jsonl-malformed-line", "sim-profile-bad-value", "llamacpp-model-missing"]


@pytest.mark.parametrize("name", CLI_CASES)
def test_bad_experiment_on_the_command_line(name: str, tmp_path: Path) -> None:
    c = case(DATA / "bad" / f"{name}.toml")
    argv, before = prepare(c, tmp_path)
    tag = uuid.uuid4().hex
    env = {**os.environ, "SPECDECODE_TEST_TAG": tag}
    t0 = time.monotonic()
    try:
        out = subprocess.run([sys.executable, "-m", "specdecode_tune.search", *argv], cwd=REPO,
                             capture_output=True, text=True, timeout=60, env=env)
        wall = time.monotonic() - t0
        left = tagged_processes(tag)
    finally:
        kill_pids(tagged_processes(tag))
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and c.expect in out.stderr, out.stderr
    assert out.stdout == ""
    assert not left, f"processes started: {left}"
    assert snapshot(tmp_path) == before
    # a guard against a search that goes on into a boot, not a speed target (loaded machines)
    assert wall < 30, f"{wall:.1f} s"
