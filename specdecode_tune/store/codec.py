"""Records as JSON values and back: the typed codec of a Tune trial's checkpoints.

A trial checkpoints after each measured level, so that a trial retried elsewhere (its node
lost) measures only the levels it lacks. A checkpoint folder holds `levels.json` (the finished
levels, a list of `level_to_dict` values) and, once the server has booted, `facts.json` (its
`facts_to_dict`). `write_checkpoint` / `read_checkpoint` are that folder's writer and reader;
the dict codecs are exact inverses through `json.dumps` / `json.loads` and refuse unknown keys.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..records import LevelSummary, ServerFacts
from .rundir import CHECKPOINT_FACTS_FILE, CHECKPOINT_LEVELS_FILE

LEVEL_FIELDS = tuple(f.name for f in dataclasses.fields(LevelSummary))
_FACTS_FIELDS = frozenset(f.name for f in dataclasses.fields(ServerFacts))


def level_to_dict(summary: LevelSummary) -> dict[str, Any]:
    """A LevelSummary as a JSON-ready dict (for a Tune checkpoint of finished levels)."""
    out = dataclasses.asdict(summary)
    out["accept_histogram"] = list(summary.accept_histogram)
    return out


def level_from_dict(values: Mapping[str, Any]) -> LevelSummary:
    """The inverse of `level_to_dict`; also takes a levels-table row's level columns."""
    unknown = sorted(set(values) - set(LEVEL_FIELDS))
    if unknown:
        raise ValueError(f"not LevelSummary fields: {unknown}")
    fields = dict(values)
    fields["accept_histogram"] = tuple(fields.get("accept_histogram") or ())
    fields["saturated"] = bool(fields.get("saturated") or False)   # null in older files
    return LevelSummary(**fields)


def facts_to_dict(facts: ServerFacts) -> dict[str, Any]:
    """ServerFacts as a JSON-ready dict."""
    return {"max_total_num_tokens": facts.max_total_num_tokens,
            "max_running_requests": facts.max_running_requests,
            "gpu_ids": list(facts.gpu_ids), "boot_s": facts.boot_s, "extra": dict(facts.extra)}


def facts_from_dict(values: Mapping[str, Any]) -> ServerFacts:
    """The inverse of `facts_to_dict`."""
    unknown = sorted(set(values) - _FACTS_FIELDS)
    if unknown:
        raise ValueError(f"not ServerFacts fields: {unknown}")
    fields = dict(values)
    fields["gpu_ids"] = tuple(fields.get("gpu_ids") or ())
    fields["extra"] = dict(fields.get("extra") or {})
    return ServerFacts(**fields)


def levels_to_json(levels: Sequence[LevelSummary]) -> str:
    """Level summaries as a JSON list."""
    return json.dumps([level_to_dict(s) for s in levels])


def levels_from_json(text: str) -> list[LevelSummary]:
    """The inverse of `levels_to_json`."""
    return [level_from_dict(d) for d in json.loads(text)]


def write_checkpoint(directory: str | os.PathLike[str], levels: Sequence[LevelSummary],
                     facts: ServerFacts | None) -> None:
    """Fill a (new, empty) checkpoint folder with the finished levels and the server's facts."""
    folder = Path(directory)
    (folder / CHECKPOINT_LEVELS_FILE).write_text(levels_to_json(levels))
    if facts is not None:
        (folder / CHECKPOINT_FACTS_FILE).write_text(json.dumps(facts_to_dict(facts)))


def read_checkpoint(directory: str | os.PathLike[str]
                    ) -> tuple[list[LevelSummary], ServerFacts | None]:
    """(finished levels, the server's facts or None) from a checkpoint folder."""
    folder = Path(directory)
    levels = levels_from_json((folder / CHECKPOINT_LEVELS_FILE).read_text())
    facts_path = folder / CHECKPOINT_FACTS_FILE
    facts = facts_from_dict(json.loads(facts_path.read_text())) if facts_path.exists() else None
    return levels, facts
