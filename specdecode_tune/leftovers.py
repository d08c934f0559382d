"""What a search driver leaves behind, under its older import path: a facade of
`specdecode_tune.search.leftovers`, where the search's driver finds and ends, by PID, the
processes a killed driver of the same run left. New code imports that module; this one
re-exports exactly its `__all__`.
"""

from __future__ import annotations

from .search.leftovers import *  # noqa: F403 - a facade: every name of its __all__
from .search.leftovers import __all__ as __all__
