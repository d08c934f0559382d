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


def test_a_trial_folder_is_named_by_its_id_and_point_not_its_bookkeeping() -> None:
    from specdecode_tune.search.tuner import trial_dirname
    config = {"speculative_num_steps": 4, "speculative_eagle_topk": 1,
              "speculative_num_draft_tokens": 5, "mem_fraction_static": 0.92,
              "_predicted": '{"tok_s": {"1": 275.73, "16": 1999.78}}', "_sampler": "model"}
    name = trial_dirname(SimpleNamespace(trial_id="4a1b2c3d", config=config))
    assert name == "4a1b2c3d_steps=4_topk=1_draft=5_mem=0.92"
    again = trial_dirname(SimpleNamespace(trial_id="5e6f", config={**config, "_repeat": 2}))
    assert again == "5e6f_steps=4_topk=1_draft=5_mem=0.92_repeat2"
    assert "/" not in trial_dirname(SimpleNamespace(trial_id="t", config={"path": "/a/b"}))
