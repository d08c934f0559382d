"""Optuna's NSGA-II, made to pickle.

Ray Tune saves the searcher, with its sampler, at every checkpoint, and a resumed search goes on
from that pickle. Optuna 5.1's `NSGAIISampler` guards its generation cache with a
`threading.Lock` (`_thread_lock`), which does not pickle: `--sampler nsga2` raised TypeError in
`SpecOptunaSearch.save` at the first checkpoint. The lock guards one process's threads only, so
the pickle leaves it out and the copy makes its own.
"""

from __future__ import annotations

import threading
from typing import Any

import optuna


class NSGAIISampler(optuna.samplers.NSGAIISampler):
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_thread_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._thread_lock = threading.Lock()
