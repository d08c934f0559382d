"""The search's live lines: one readable line per finished trial, whatever its reason."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from specdecode_tune.config import load_experiment
from specdecode_tune.search import REASON_CHARS, Progress, short_reason
from tests.conftest import DATA

LONG = ("kv_memory: Not enough memory. Please try to increase --mem-fraction-static. Current "
        "value: mem_fraction_static=0.85; the KV pool of 8 draft tokens needs 12.4 GiB beyond "
        "the target and draft weights (the server's log has the whole message)")


def test_a_long_reason_is_cut_at_a_word_with_an_ellipsis() -> None:
    short = short_reason(LONG)
    assert len(short) <= REASON_CHARS and short.endswith("…")
    assert LONG.startswith(short[:-1])
    assert LONG[len(short) - 1] in " ,;:.("           # the cut falls between words
    assert short_reason("refused: out of memory") == "refused: out of memory"
    assert short_reason("first line\nsecond line") == "first line"
    assert short_reason("") == ""


def test_the_trial_line_carries_the_short_reason(capsys: pytest.CaptureFixture) -> None:
    exp = load_experiment(DATA / "sim-small.toml")
    progress = Progress(exp, 4)
    trial = SimpleNamespace(trial_id="abc123", config={"speculative_num_steps": 8},
                            last_result={"feasible": False, "status": "infeasible",
                                         "reason": LONG})
    progress.on_trial_complete(0, [], trial)
    line = capsys.readouterr().out.strip()
    m = re.fullmatch(r"trial +1 +abc123 +steps=8 +-> infeasible: (.*)  \[\d+s\]", line)
    assert m, line
    assert m.group(1) == short_reason(LONG)
