"""What changed in the experiment since its run dir was started, and whether the run may go on.

The run dir keeps the experiment it was started with (`experiment.toml`, copied by
`tuner.keep_experiment`). A later command on the same run dir (a resume, or a start over a run
dir whose Tune state is missing but whose baseline is kept) compares that copy with the
experiment it is given, setting by setting as both load (defaults filled in, paths resolved
from the given experiment's folder; where the copy no longer loads, the two files' tables as
written), and sorts every key that differs:

- `RESULTS`: what the run's measurements and scores depend on: the server and its flags
  (`[backend]`, but for the three below), `[space]`, `[workload]`, `[measure]`, `[objective]`,
  and the search's baseline and resources per trial. A run that went on would mix levels,
  scores and a baseline of the old experiment with the new one's (a changed
  `measure.concurrency` would keep the old levels' figures and never measure the new ones):
  `check` refuses, one line naming each key with its old and new value, pointing at `--name`
  or `--storage` (a new run beside the old) and `--fresh` (the old one moved aside, not
  deleted).
- `KEPT`: what the resumed searcher holds (pickled with Tune's state: the sampler and its seed,
  the trial cap, the repeats, the noise band, the enqueued points) or Tune's own state
  (`max_concurrent`). A resume cannot change them: it goes on with the run's own, and says so.
- `APPLIED`: how to reach and run the servers, not what they measure (`backend.api_key_env`,
  `backend.host`, `backend.boot_timeout_s`, `[cluster]`, the name and description): taken from
  the given experiment, and said.

Nothing here writes or deletes anything.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import Experiment, experiment_from_dict
from ..config.reader import read_toml
from ..errors import ConfigError
from ..store import rundir
from ..store.files import filesystem

# Keys (dotted, or a table's prefix ending in ".") a resume takes from the given experiment.
APPLIED = ("name", "description", "backend.api_key_env", "backend.host", "backend.boot_timeout_s",
           "cluster.")
# Keys the resumed run keeps as it was started (its searcher's, Tune's).
KEPT = ("search.sampler", "search.seed", "search.max_trials", "search.repeats",
        "search.remeasure_top", "search.noise_band", "search.enqueue", "search.max_concurrent")
RESULTS = "RESULTS"


@dataclass(frozen=True)
class Change:
    key: str
    old: Any
    new: Any

    @property
    def kind(self) -> str:
        if _matches(self.key, APPLIED):
            return "APPLIED"
        if _matches(self.key, KEPT):
            return "KEPT"
        return RESULTS

    def text(self) -> str:
        return f"{self.key} {_show(self.old)} -> {_show(self.new)}"


def _matches(key: str, names: tuple[str, ...]) -> bool:
    return any(key.startswith(n) if n.endswith(".") else key == n or key.startswith(n + ".")
               for n in names)


_UNSET = object()


def _show(value: Any) -> str:
    if value is _UNSET or value is None:
        return "(unset)"
    if isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, (list, tuple, dict)):
        text = json.dumps(value, default=str, separators=(", ", ": "))
    else:
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _flat(value: Any, prefix: str, out: dict[str, Any]) -> dict[str, Any]:
    """Tables to dotted keys; a table with other than string keys (objective.weights), a list
    and a value are leaves; an empty table and an unset value give no key."""
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        for k, v in value.items():
            _flat(v, f"{prefix}.{k}" if prefix else k, out)
    elif value is not None and value != {}:
        out[prefix] = value
    return out


def _under(keys: Any, prefix: str) -> bool:
    return any(k == prefix or k.startswith(prefix + ".") for k in keys)


def _subtree(flat: dict[str, Any], prefix: str) -> Any:
    if prefix in flat:
        return flat[prefix]
    return {k[len(prefix) + 1:]: v for k, v in flat.items() if k.startswith(prefix + ".")}


def settings(exp: Experiment) -> dict[str, Any]:
    """Every setting of a loaded experiment by dotted key (`space.<name>.<field>`)."""
    data = dataclasses.asdict(exp)
    data.pop("source", None)
    data["space"] = {p["name"]: {k: v for k, v in p.items() if k != "name"}
                     for p in data["space"]}
    return _flat(data, "", {})


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    """The keys whose values differ, in sorted order; what one side lacks as a whole (a
    parameter added to [space], a flag removed) is one change at its own key."""
    out: dict[str, Change] = {}
    for k in sorted(set(old) | set(new)):
        if old.get(k, _UNSET) == new.get(k, _UNSET):
            continue
        key = k
        if k not in old or k not in new:
            lacking = old if k not in old else new
            parts = k.split(".")
            key = next(p for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1))
                       if not _under(lacking, p))
        out.setdefault(key, Change(key, _subtree(old, key) if _under(old, key) else _UNSET,
                                   _subtree(new, key) if _under(new, key) else _UNSET))
    return list(out.values())


def kept_copy(run_dir: str) -> bytes | None:
    """The experiment file the run was started with, or None where the run dir has none."""
    fs, root = filesystem(run_dir)
    try:
        with fs.open_input_stream(rundir.experiment_file(root)) as f:
            return bytes(f.read())
    except (FileNotFoundError, OSError):
        return None


def changes_since_start(exp: Experiment, run_dir: str) -> list[Change] | None:
    """What differs between the run's copy of its experiment and `exp`; None where the run dir
    keeps no copy (a run started before copies were kept, or no run)."""
    raw = kept_copy(run_dir)
    if raw is None:
        return None
    where = f"{run_dir}/{rundir.EXPERIMENT_FILE}"
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{where}: the run's copy of its experiment cannot be read ({e}); "
                          f"give this run another --name, or start over with --fresh") from None
    try:
        old = settings(experiment_from_dict(data, where=where,
                                            base_dir=Path(exp.source).parent))
        new = settings(exp)
    except ConfigError:
        # The copy no longer loads here (a file it names is gone): the tables as written.
        old, new = _flat(data, "", {}), _flat(read_toml(exp.source), "", {})
    return differences(old, new)


def check(exp: Experiment, run_dir: str) -> str | None:
    """Raise ConfigError (one line) where the run at `run_dir` was started with an experiment
    whose results `exp` would not reproduce; else the line to say about what differs (what
    the run keeps, what applies from now), or None where nothing does."""
    found = changes_since_start(exp, run_dir)
    if not found:
        return None
    refused = [c for c in found if c.kind == RESULTS]
    if refused:
        more = [c for c in found if c.kind != RESULTS]
        raise ConfigError(
            f"the run {run_dir} was started with another experiment, and its results do not "
            f"hold for this one: {'; '.join(c.text() for c in refused)}"
            + (f" (also {'; '.join(c.text() for c in more)})" if more else "")
            + ". Give this run another --name (or --storage), or start over with --fresh "
              "(the old run is moved aside, not deleted); nothing was started")
    kept = [c for c in found if c.kind == "KEPT"]
    applied = [c for c in found if c.kind == "APPLIED"]
    parts = []
    if kept:
        parts.append(f"{'; '.join(c.text() for c in kept)}: kept as the run was started (its "
                     f"searcher holds {'them' if len(kept) > 1 else 'it'}; for the new "
                     f"value{'s' if len(kept) > 1 else ''} start a new run with --name, or "
                     f"--fresh)")
    if applied:
        parts.append(f"{'; '.join(c.text() for c in applied)}: applies from now")
    return "the experiment differs from the one the run was started with: " + \
        "; ".join(parts)
