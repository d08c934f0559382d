"""The Tune searcher's older import path: a facade of `specdecode_tune.search.searcher`.

Kept because a run started before the search became a package pickled its searcher under this
module's name (`specdecode_tune.searcher.RepeatingSearcher`, `SpecOptunaSearch`,
`FailureStreak`): resuming it looks the classes up here. New code imports
`specdecode_tune.search.searcher`. This module re-exports exactly its `__all__`.
"""

from __future__ import annotations

from .search.searcher import *  # noqa: F403 - a facade: every name of its __all__
from .search.searcher import __all__ as __all__
