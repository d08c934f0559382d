"""The run's tables, under their older name: a facade of `specdecode_tune.store`.

`from specdecode_tune import results` keeps working for the tests, benchmarks and scripts
that use it (`results.read_tables`, `results.write_level`, `results.write_trial`,
`results.level_summaries`, ...). New code imports `specdecode_tune.store`, where the layout
(`store.rundir`), the schemas (`store.schemas`) and the writers and readers (`store.tables`,
`store.rows`, `store.codec`) live. This module re-exports exactly `store.__all__`.
"""

from __future__ import annotations

from .store import *  # noqa: F403 - a facade: every name of store.__all__, no list kept twice
