"""The commands' parser errors (config/cliargs.Parser): one line, exit 2, and a mistyped flag
named with the flag it is close to."""

from __future__ import annotations

import pytest

from specdecode_tune import trial
from specdecode_tune.config.cliargs import parse
from specdecode_tune.search import cli as search_cli


@pytest.mark.parametrize(("build", "argv", "said"), [
    (search_cli.build_parser, ["--max-trails", "3"],
     "unrecognized arguments: --max-trails 3; did you mean --max-trials?"),
    (search_cli.build_parser, ["--exprmient", "a.toml", "--sampel=tpe"],
     "did you mean --experiment (for --exprmient), --sampler (for --sampel)?"),
    (trial.build_parser, ["--experiment", "x.toml", "--sett", "a=1"],
     "unrecognized arguments: --sett a=1; did you mean --set?"),
])
def test_a_mistyped_flag_is_named_with_the_one_it_is_close_to(
        build, argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert parse(build(), argv) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1 and err.startswith("error: ")
    assert err.rstrip().endswith("--help lists the flags)")


def test_a_flag_close_to_none_is_named_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse(search_cli.build_parser(), ["--no-such-flag", "7"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --no-such-flag 7 (" in err and "did you mean" not in err
