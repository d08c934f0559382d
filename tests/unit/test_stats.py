"""The package's statistics module: a leaf that load, the objective and the report share."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

import specdecode_tune.stats as stats


def test_stats_imports_nothing_of_the_package() -> None:
    """Anyone may import it, so it may import no one (the flow is one-way)."""
    tree = ast.parse(Path(stats.__file__).read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m.startswith("specdecode_tune") or m == ""]
    assert all(n.level == 0 for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))


def test_spreads() -> None:
    assert stats.mad_sigma([0.5]) == 0.0
    assert stats.mad_sigma([0.80, 0.82, 0.78, 5.0]) == pytest.approx(stats.MAD_K * 0.02)
    assert stats.moderated_sd(0.0, 0, 0.01, 3) == pytest.approx(0.01)
    assert stats.moderated_sd(0.02, 3, 0.01, 3) == pytest.approx(math.sqrt(0.00025))
    # Residuals about each group's median, over sum(len - 1) degrees of freedom.
    assert stats.pooled_sd([[1.0, 3.0], [5.0]]) == pytest.approx(math.sqrt(2.0))
    with pytest.raises(ValueError):
        stats.pooled_sd([[1.0], [2.0]])
