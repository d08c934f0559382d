"""Ctrl-C during `tuner.fit()` (search/cli.py): Tune stops gracefully but fit returns as if
the search were done, so the driver records the SIGINT itself and hands it to Tune as SIGUSR1
(Tune's other stop signal). Held here with real signals to this process."""

from __future__ import annotations

import os
import signal

import pytest

from specdecode_tune.search.cli import _ctrl_c_stops_tune_gracefully


@pytest.fixture
def usr1():
    before = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, before)


def test_the_first_ctrl_c_is_recorded_and_reaches_tunes_stop(usr1) -> None:
    seen: list[int] = []
    before = signal.getsignal(signal.SIGINT)
    with _ctrl_c_stops_tune_gracefully() as interrupted:
        assert os.environ["TUNE_DISABLE_SIGINT_HANDLER"] == "1"
        signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))   # what Tune sets in fit
        assert not interrupted.is_set()
        os.kill(os.getpid(), signal.SIGINT)
        assert interrupted.is_set() and seen == [signal.SIGUSR1]
        # the second one is the old handler's: KeyboardInterrupt, not swallowed
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before
    assert "TUNE_DISABLE_SIGINT_HANDLER" not in os.environ


def test_a_ctrl_c_before_tune_listens_stops_at_once(usr1) -> None:
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)      # SIGUSR1's default would end the process
    with pytest.raises(KeyboardInterrupt), _ctrl_c_stops_tune_gracefully() as interrupted:
        os.kill(os.getpid(), signal.SIGINT)
    assert interrupted.is_set()


def test_no_ctrl_c_no_interruption(usr1) -> None:
    with _ctrl_c_stops_tune_gracefully() as interrupted:
        pass
    assert not interrupted.is_set()
