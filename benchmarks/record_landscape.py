"""Record a real engine's landscape: every point of a grid, booted and measured, with repeats.

Each (point, repeat) is one boot through the project's own trial (`specdecode_tune.trial.
run_trial`: the backend's argv, `ServerProcess`, the load generator, the backend's counters), so
what is recorded is what a search's trial would have measured. The table (Parquet, one row per
point, repeat and level) is what `benchmarks/landscapes.py` replays in
`benchmarks/search_efficiency.py`: each replayed "boot" draws one recorded repeat.

    python benchmarks/record_landscape.py --experiment experiments/llamacpp-cpu.toml \\
        --axis speculative_num_steps=0-24 --axis spec_ngram_simple_size_n=1,2,3 \\
        --repeats 3 --out benchmarks/data/llamacpp-cpu.parquet

- `--axis NAME=VALUES` (repeatable): the grid, "LOW-HIGH" (ints) or "a,b,c". The first axis
  must be `speculative_num_steps`; its value 0 is the baseline (no speculation), recorded once
  per repeat with the experiment's fixed flags (the other axes mean nothing without a draft).
- The order is repeat-major, each repeat's points shuffled (seeded by the repeat): an
  interrupted recording holds whole grids with fewer repeats, and the machine's drift over the
  recording does not line up with an axis. Each session puts the baseline first in each
  repeat, and of the points that differ only in the memory fraction the roomiest first
  (`session_order`: where vLLM compiles, the compile falls on the boot whose pool can spare it).
- Resumable: rows already in `--out` (same point and repeat) are not booted again; the table is
  rewritten (atomically) after every boot. `--stop-at HH:MM` (UTC) starts no boot after then.
- One table, one pair of weights: a row is served by the weights of the session that booted it
  (each session's `model` fingerprint). Rows other weights served are moved to
  `<out>.other-weights.parquet` (kept, not replayed) and their points booted again with this
  session's; `--keep-other-weights` keeps them in the table instead (warned about).
- `--contenders F`: the first repeat boots the whole grid; a later one boots the baseline and
  only the points whose score so far (the experiment's objective on their repeats' mean tok/s,
  as `landscapes.py` scores them) is within F of the best point's (0.05: at least 95% of it).
  Enough of the grid to name the optimum firmly when a boot costs minutes: the points far below
  it keep one repeat, and the replay, which draws from the repeats a point has, takes them as
  they are. A point whose every boot so far compiled the engine's graphs at start (vLLM's
  first boot of a K class on a machine: a smaller KV pool) is repeated all the same. Decided
  before each boot on the table as it stands, so a point recorded earlier in the same session
  counts.
- The file's metadata (key `landscape`, JSON) holds the experiment as recorded (its TOML with
  the measure overrides), the axes, the engine's version, the model, the machine, the command of
  each session and the wall time each took.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import os
import platform
import random
import shlex
import signal
import statistics
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from itertools import product
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from landscapes import OTHER_WEIGHTS, compiled_at_boot, score, session_index

from specdecode_tune import procfs
from specdecode_tune.backends import get_backend, preflight
from specdecode_tune.backends.speccounters import exactly_from_length
from specdecode_tune.config import Experiment
from specdecode_tune.config.experiment import experiment_from_dict
from specdecode_tune.enginecache import expand_path
from specdecode_tune.errors import ConfigError
from specdecode_tune.records import TrialResult
from specdecode_tune.space import MEM, STEPS, as_served, resolve
from specdecode_tune.store import rundir
from specdecode_tune.telemetry import machine_gpu_uuids
from specdecode_tune.trial import TrialContext, run_trial

ROOT = Path(__file__).resolve().parent.parent
META_KEY = b"landscape"
FORMAT = 2                   # 2: histograms in SGLang's form for every engine (1: per position
                             # for vLLM and llama.cpp)

# Columns of every row, in order; `axis_<name>` columns (one per axis) come after `point`.
LEVEL_FIELDS: list[tuple[str, pa.DataType]] = [
    ("output_tok_s", pa.float64()), ("requests_s", pa.float64()),
    ("accept_length", pa.float64()), ("accept_histogram", pa.list_(pa.int64())),
    ("requests", pa.int64()), ("errors", pa.int64()), ("output_tokens", pa.int64()),
    ("duration_s", pa.float64()), ("ttft_p50", pa.float64()), ("tpot_p50", pa.float64()),
    ("e2e_p50", pa.float64()), ("suspect", pa.bool_()), ("note", pa.string()),
]
BOOT_FIELDS: list[tuple[str, pa.DataType]] = [
    ("status", pa.string()), ("reason", pa.string()), ("boot_s", pa.float64()),
    ("trial_wall_s", pa.float64()), ("max_total_num_tokens", pa.int64()),
    ("max_running_requests", pa.int64()), ("launch_command", pa.string()),
    ("started_at", pa.float64()),
    # The rest of what the server said of itself (ServerFacts.extra, JSON): among it, where
    # the engine compiles at boot, the graphs it compiled and loaded (vLLM sizes its KV pool
    # in the run that compiles: a first boot on a machine gets a smaller pool). Null in rows
    # recorded before 2026-12-07's second vLLM session.
    ("facts_json", pa.string()),
    # The fingerprint of the weights that served the boot (`model_facts`); null in rows recorded
    # before 2026-12-07's third vLLM session, whose session says it (`row_weights`).
    ("weights", pa.string()),
]


# ------------------------------------------------------------------------------------ the grid


def parse_axis(text: str) -> tuple[str, list[int | float | str]]:
    """'name=0-24' or 'name=1,2,3' -> (name, values)."""
    name, sep, raw = text.partition("=")
    name, raw = name.strip(), raw.strip()
    if not sep or not name or not raw:
        raise ConfigError(f"--axis {text!r}: expected NAME=LOW-HIGH or NAME=a,b,c, e.g. "
                          f"speculative_num_steps=0-24")
    if "," not in raw and "-" in raw.lstrip("-"):
        lo, _, hi = raw.partition("-")
        try:
            low, high = int(lo), int(hi)
        except ValueError:
            raise ConfigError(f"--axis {text!r}: a range takes two integers, e.g. 0-24") from None
        if high < low:
            raise ConfigError(f"--axis {text!r}: the range's high {high} is below its low {low}")
        return name, list(range(low, high + 1))
    values: list[int | float | str] = []
    for item in raw.split(","):
        item = item.strip()
        try:
            values.append(tomllib.loads(f"v = {item}")["v"])
        except tomllib.TOMLDecodeError:
            values.append(item)
    if len(set(map(str, values))) != len(values):
        raise ConfigError(f"--axis {text!r}: a value is repeated")
    return name, values


def grid_points(axes: Sequence[tuple[str, Sequence[Any]]]) -> list[dict[str, Any]]:
    """Every point of the grid: the baseline once (if steps 0 is on the axis), then the
    product of the axes for steps >= 1, each as the server runs it (`space.as_served`: with
    topk and draft-token axes, topk 1's points once, at steps + 1 draft tokens; points the
    draft tree cannot hold left out)."""
    if not axes or axes[0][0] != STEPS:
        raise ConfigError(f"--axis: the first axis must be {STEPS} (the draft length)")
    names = [n for n, _ in axes]
    if len(set(names)) != len(names):
        raise ConfigError(f"--axis: an axis is given twice ({', '.join(names)})")
    points: list[dict[str, Any]] = []
    if 0 in axes[0][1]:
        points.append({STEPS: 0})
    steps = [v for v in axes[0][1] if v != 0]
    seen: set[str] = set()
    for combo in product(steps, *(vals for _, vals in axes[1:])):
        # SGLang's EAGLE axes: topk 1 forces the draft tokens, and a tree too small for the
        # draft tokens is refused before any boot: such points are one point, or none.
        point = as_served(dict(zip(names, combo, strict=True)))
        if point is not None and point_id(point) not in seen:
            seen.add(point_id(point))
            points.append(point)
    return points


def point_id(point: Mapping[str, Any]) -> str:
    """The point's stable name in the table (its sampled values, JSON, sorted keys)."""
    return json.dumps(dict(point), sort_keys=True)


def schedule(points: Sequence[dict[str, Any]], repeats: int) -> list[tuple[dict[str, Any], int]]:
    """Repeat-major, each repeat's points shuffled with the repeat as seed."""
    order: list[tuple[dict[str, Any], int]] = []
    for r in range(repeats):
        batch = list(points)
        random.Random(1000 + r).shuffle(batch)
        order += [(p, r) for p in batch]
    return order


def session_order(todo: Sequence[tuple[dict[str, Any], int]]
                  ) -> list[tuple[dict[str, Any], int]]:
    """This session's boots in the schedule's order, but in each repeat the baseline first (a
    fresh machine's first boot warms what every point shares, and each machine, however fast,
    measures a baseline of its own, which the scores' mean baseline then holds and a reader can
    set its points against, even where the session ends early), and of the points that differ
    only in the memory fraction, the roomiest where the first of them stood. vLLM compiles its
    graphs at the first boot of a K on a machine and then has ~51 MiB less for its KV pool
    (docs/engines-vllm.md section 3): at the roomiest fraction the smaller pool still holds the
    heaviest level, so the compile costs that boot its start-up seconds and not its figure, and
    the same K's tighter fractions after it load the compiled graphs with their whole pool. The
    other slots keep the shuffle's places: only which of a K's fractions comes first is fixed
    (the roomiest), a far smaller tie of the order to the memory axis than sorting by it,
    traded for figures taken with the whole pool."""
    out: list[tuple[dict[str, Any], int]] = []
    for r in dict.fromkeys(rep for _, rep in todo):
        batch = [p for p, rep in todo if rep == r]
        batch.sort(key=lambda p: int(p.get(STEPS, 0)) != 0)        # stable: the baseline first
        slots: dict[str, list[int]] = {}
        for i, p in enumerate(batch):
            slots.setdefault(point_id({k: v for k, v in p.items() if k != MEM}), []).append(i)
        for where in slots.values():
            roomiest = max(where, key=lambda i: float(batch[i].get(MEM, 0.0)))
            batch[where[0]], batch[roomiest] = batch[roomiest], batch[where[0]]
        out += [(p, r) for p in batch]
    return out


# ----------------------------------------------------------------------------------- the table


def schema(axis_names: Sequence[str], axis_types: Mapping[str, pa.DataType]) -> pa.Schema:
    fields = [pa.field("point", pa.string())]
    fields += [pa.field(f"axis_{n}", axis_types[n]) for n in axis_names]
    fields += [pa.field("repeat", pa.int64()), pa.field("concurrency", pa.int64())]
    fields += [pa.field(n, t) for n, t in BOOT_FIELDS + LEVEL_FIELDS]
    return pa.schema(fields)


def axis_type(values: Sequence[Any]) -> pa.DataType:
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return pa.int64()
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return pa.float64()
    return pa.string()


def rows_of(result: TrialResult, point: Mapping[str, Any], repeat: int,
            axis_names: Sequence[str], levels: Sequence[int], launch: str,
            started_at: float, weights: str | None = None) -> list[dict[str, Any]]:
    """One row per level: the level's figures, or nulls where the boot measured none (refused,
    failed before or during it)."""
    by_c = {s.concurrency: s for s in result.levels if s.mode == "closed"}
    boot = {"status": result.status, "reason": result.reason, "boot_s": result.facts.boot_s,
            "trial_wall_s": result.wall_s,
            "max_total_num_tokens": result.facts.max_total_num_tokens,
            "max_running_requests": result.facts.max_running_requests,
            "launch_command": launch, "started_at": started_at,
            "facts_json": json.dumps(result.facts.extra, sort_keys=True, default=str),
            "weights": weights}
    rows = []
    for c in levels:
        row: dict[str, Any] = {"point": point_id(point), "repeat": repeat, "concurrency": c,
                               **{f"axis_{n}": point.get(n) for n in axis_names}, **boot}
        s = by_c.get(c)
        for name, _ in LEVEL_FIELDS:
            value = getattr(s, name) if s is not None else None
            row[name] = list(value) if name == "accept_histogram" and value is not None \
                else value
        rows.append(row)
    return rows


def per_position_histograms(meta: Mapping[str, Any]) -> bool:
    """Whether a table's histograms are per-position accepted counts: format 1 from an engine
    whose acceptance comes from its counters (vLLM, llama.cpp). From format 2 every level's
    histogram is SGLang's form, verify steps per number of accepted tokens."""
    return int(meta.get("format", 1)) < 2 and meta.get("engine") in ("vllm", "llamacpp")


def read_existing(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(rows, metadata) of a recording, or ([], {}) where there is none yet."""
    if not path.is_file():
        return [], {}
    table = pq.read_table(path)
    meta = json.loads((table.schema.metadata or {}).get(META_KEY, b"{}"))
    return table.to_pylist(), meta


def write_table(path: Path, rows: Sequence[Mapping[str, Any]], sch: pa.Schema,
                meta: Mapping[str, Any]) -> None:
    table = pa.Table.from_pylist(list(rows), schema=sch).replace_schema_metadata(
        {META_KEY: json.dumps(meta, sort_keys=True).encode()})
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def done_keys(rows: Sequence[Mapping[str, Any]]) -> set[tuple[str, int]]:
    return {(r["point"], int(r["repeat"])) for r in rows}


def mean_tok_s(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int], float]:
    """(point id, level) -> the mean tok/s of its measured repeats."""
    acc: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        if r.get("output_tok_s"):
            acc.setdefault((r["point"], int(r["concurrency"])), []).append(
                float(r["output_tok_s"]))
    return {k: sum(v) / len(v) for k, v in acc.items()}


def contender_scores(rows: Sequence[Mapping[str, Any]], weights: Mapping[int, float]
                     ) -> dict[str, float] | None:
    """Each point's score (point id -> the objective on its measured repeats' mean tok/s per
    level against the baseline's), for the points measured at every weighted level; None where
    no baseline is measured yet (nothing can be scored)."""
    means = mean_tok_s(rows)
    base_id = point_id({STEPS: 0})
    used = {c: w for c, w in weights.items() if w > 0}
    if not all((base_id, c) in means for c in used):
        return None
    base = {c: means[(base_id, c)] for c in used}
    return {pid: score({c: means[(pid, c)] for c in used}, base, used)
            for pid in {p for p, _ in means} - {base_id}
            if all((pid, c) in means for c in used)}


def not_a_contender(point: Mapping[str, Any], repeat: int, rows: Sequence[Mapping[str, Any]],
                    weights: Mapping[int, float], within: float | None) -> str:
    """Why `--contenders` leaves this boot out ('' where it is booted): the first repeat and
    the baseline always are; a later repeat of a point only within `within` of the best."""
    if within is None or repeat == 0 or int(point.get(STEPS, 0)) == 0:
        return ""
    scores = contender_scores(rows, weights)
    if not scores:
        return ""
    mine = scores.get(point_id(point))
    if mine is None:
        return "no repeat of it measured every level"
    best = max(scores.values())
    if mine < best + math.log1p(-within):
        return (f"{math.exp(mine - best):.1%} of the best point's score, under "
                f"{1 - within:.0%} (--contenders {within:g})")
    return ""


def compiled_only(point: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether every boot of the point so far compiled the engine's graphs at its start (a
    fact the backend read from the server's log, `records.COMPILED_GRAPHS`). vLLM compiles
    inside the run that sizes its KV pool, so such a boot had a smaller pool than the same
    point has once the compile cache holds its graphs (0.26.0: 41% smaller at 0.0075 on the
    test pair, 2026-12-07): its figure is not the point's as a server that booted before
    serves it, and `--contenders` does not pass the point over on it."""
    pid = point_id(point)
    boots = [r for r in rows if r["point"] == pid and r.get("status") == "ok"]
    return bool(boots) and all(compiled_at_boot(r) for r in boots)


# ---------------------------------------------------------------------------- what was booted


def engine_version(exp: Experiment) -> str:
    """The engine's own words on its version ('' where it says nothing)."""
    program = get_backend(exp.backend.kind).argv(exp.backend, {STEPS: 0}, 0)[0]
    if exp.backend.kind == "llamacpp":
        cmd = [program, "--version"]
    elif exp.backend.kind in ("vllm", "sglang") and program.endswith(("python", "python3")):
        mod = exp.backend.kind
        cmd = [program, "-c", f"import {mod}; print('{mod}', {mod}.__version__)"]
    else:
        return ""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    lines = [ln.strip() for ln in (proc.stdout + "\n" + proc.stderr).splitlines()
             if ln.strip() and ("version" in ln.lower() or ln.startswith(exp.backend.kind))]
    return "; ".join(lines[-3:])


def model_facts(exp: Experiment) -> dict[str, Any]:
    """The served models' name, size and a fingerprint of their bytes (target and draft):
    models trained again on a GPU differ in their last bits (docs/gpu.md section 5), so two
    sessions of one table may serve different weights under the same name and size."""
    path = Path(expand_path(exp.backend.model_path))
    paths = [path] + ([Path(expand_path(exp.backend.draft_model_path))]
                      if exp.backend.draft_model_path else [])
    h = hashlib.sha256()
    size = 0
    for root in paths:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for f in files:
            h.update(f"{f.relative_to(root.parent)}\0".encode())
            with open(f, "rb") as r:
                for block in iter(lambda r=r: r.read(1 << 22), b""):
                    h.update(block)
            size += f.stat().st_size if root == path else 0
    return {"name": path.name, "bytes": size, "sha256": h.hexdigest()[:16]}


def row_weights(rows: Sequence[Mapping[str, Any]], sessions: Sequence[Mapping[str, Any]]
                ) -> list[str | None]:
    """The fingerprint of the weights that served each row: its own, or, in rows recorded
    before rows kept it, that of the last session started before the row's boot (None where
    that session took none, or the row has no start)."""
    started = sorted((dt.datetime.fromisoformat(s["started_utc"]).timestamp(),
                      s.get("model", {}).get("sha256")) for s in sessions if s.get("started_utc"))
    starts = [t for t, _ in started]
    out: list[str | None] = []
    for r in rows:
        if r.get("weights"):
            out.append(str(r["weights"]))
        else:
            i = session_index(r.get("started_at"), starts)
            out.append(None if i is None else started[i][1])
    return out


def set_aside_other_weights(rows: Sequence[Mapping[str, Any]],
                            sessions: Sequence[Mapping[str, Any]], mine: str | None
                            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the rows these weights or unknown ones served, the rows other known weights served).
    Two trained pairs differ by more than a boot's noise (vLLM's K 4: 3.79 and 3.56 tokens a
    step, 2026-12-07), so their rows are not repeats of one landscape."""
    kept: list[dict[str, Any]] = []
    aside: list[dict[str, Any]] = []
    for r, sha in zip(rows, row_weights(rows, sessions), strict=True):
        (aside if mine is not None and sha not in (None, mine) else kept).append(dict(r))
    return kept, aside


def aside_path(out: Path) -> Path:
    """Where the rows of other weights go: beside the table, kept, not replayed."""
    return out.with_name(f"{out.stem}{OTHER_WEIGHTS}{out.suffix}")


def machine_facts() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    # Which machine: every lent GPU machine says node "vm", and H100s of one model served
    # these test models 30-44% apart (docs/gpu-runs.md); the GPUs' UUIDs and the kernel's boot
    # id tell one machine from the next, and a restarted session on the same one from both.
    return {"node": platform.node(), "cpu": cpu, "cpus": os.cpu_count(),
            "platform": platform.platform(), "loadavg_at_start": list(os.getloadavg()),
            "gpu_uuids": machine_gpu_uuids(), "boot_id": procfs.boot_id() or ""}


def recorded_experiment(path: Path, overrides: Mapping[str, Any]) -> tuple[Experiment, str]:
    """The experiment with `[measure]` overridden, and its TOML-equivalent dict as JSON (what
    the replay rebuilds it from)."""
    data = tomllib.loads(path.read_text())
    data.setdefault("measure", {}).update({k: v for k, v in overrides.items() if v is not None})
    exp = experiment_from_dict(data, where=str(path), base_dir=path.parent)
    return exp, json.dumps(data, sort_keys=True)


# What a boot measures depends on these sections of the experiment; the others (the search's
# sampler and budget, the name, the cluster) do not, and a later session may add repeats to a
# table whose experiment file has changed only there. The table keeps the first session's.
MEASURED_BY = ("backend", "workload", "measure", "objective")


def _measured_by(experiment: Any) -> dict[str, Any] | None:
    if not isinstance(experiment, dict):
        return None
    return {k: experiment.get(k) for k in MEASURED_BY}


# ------------------------------------------------------------------------------------- record


def record(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    exp_path = Path(args.experiment)
    axes = [parse_axis(a) for a in args.axis]
    exp, exp_json = recorded_experiment(exp_path, {
        "concurrency": args.concurrency, "warmup_s": args.warmup_s,
        "duration_s": args.duration_s, "warmup_requests": args.warmup_requests})
    preflight(exp.backend)
    points = grid_points(axes)
    names = [n for n, _ in axes]
    sch = schema(names, {n: axis_type(v) for n, v in axes})
    levels = list(exp.measure.concurrency)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows, meta = read_existing(out)
    if meta and per_position_histograms(meta):
        # Written before levels carried SGLang's histogram form: its rows are turned into it
        # now, so that one table never holds both.
        for r in rows:
            if r.get("accept_histogram"):
                r["accept_histogram"] = list(exactly_from_length(r["accept_histogram"],
                                                                 r.get("accept_length")))
        meta["format"] = FORMAT
    if meta and (meta.get("axes") != [[n, list(v)] for n, v in axes]
                 or _measured_by(meta.get("experiment")) != _measured_by(json.loads(exp_json))):
        raise ConfigError(f"{out}: recorded with other axes or another experiment; "
                          f"give another --out or the same --axis and --experiment")
    if not meta:
        meta = {"format": FORMAT, "name": args.name or out.stem, "engine": exp.backend.kind,
                "experiment_file": str(exp_path), "experiment": json.loads(exp_json),
                "axes": [[n, list(v)] for n, v in axes], "repeats": args.repeats,
                "levels": levels, "sessions": []}
    meta["repeats"] = max(int(meta.get("repeats", 0)), args.repeats)
    session = {"command": shlex.join(["python", "benchmarks/record_landscape.py", *args.argv]),
               "started_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
               "engine_version": engine_version(exp), "model": model_facts(exp),
               "machine": machine_facts(), "boots": 0, "wall_s": 0.0}
    meta["sessions"].append(session)
    mine = session["model"].get("sha256")
    if args.keep_other_weights:
        if others := sorted({str(w) for w in row_weights(rows, meta["sessions"])
                             if w not in (None, mine)}):
            print(f"record_landscape: WARNING: earlier sessions of this table served other "
                  f"weights ({', '.join(others)}; now {mine}), kept (--keep-other-weights): a "
                  f"point's repeats then hold two models' spread", file=sys.stderr, flush=True)
    else:
        rows, aside = set_aside_other_weights(rows, meta["sessions"], mine)
        if aside:
            side = aside_path(out)
            # The table's metadata (every session's, which say whose rows they are) goes along.
            old_rows, _ = read_existing(side)
            write_table(side, [*old_rows, *aside], sch, meta)
            gone = sorted(done_keys(aside))
            session["set_aside"] = {"boots": len(gone), "to": side.name,
                                    "weights": sorted({str(w) for w in row_weights(
                                        aside, meta["sessions"])})}
            write_table(out, rows, sch, meta)
            print(f"record_landscape: {len(gone)} boot(s) served other weights "
                  f"({', '.join(session['set_aside']['weights'])}; now {mine}): moved to "
                  f"{side} and booted again (carry one trained pair to every session, "
                  f"docs/gpu.md section 5; --keep-other-weights mixes them)", flush=True)
    done = done_keys(rows)
    n_before = len(rows)
    todo = session_order([(p, r) for p, r in schedule(points, args.repeats)
                          if (point_id(p), r) not in done])
    print(f"record_landscape: {len(points)} points x {args.repeats} repeats at C="
          f"{','.join(map(str, levels))}; {len(done)} boots already recorded, {len(todo)} to "
          f"go -> {out}", flush=True)
    print(f"  engine: {session['engine_version'] or '?'}; model {session['model']}", flush=True)
    stop_at = _stop_time(args.stop_at)
    run_dir = str(Path(args.run_dir or ROOT / "runs" / "landscapes" / meta["name"]))
    local = rundir.logs_dir(run_dir)
    backend = get_backend(exp.backend.kind)
    stopped = ""
    tried = 0
    passed: list[str] = []
    weights = exp.level_weights()
    if args.contenders is not None:
        meta["contenders"] = args.contenders
        session["contenders"] = args.contenders
    for i, (point, repeat) in enumerate(todo, start=1):
        if stop_at is not None and time.time() >= stop_at:
            stopped = f"--stop-at {args.stop_at} reached"
            break
        why = not_a_contender(point, repeat, rows, weights, args.contenders)
        if why and compiled_only(point, rows):
            print(f"  [{i}/{len(todo)}] r{repeat} {point_id(point)} booted though {why}: every "
                  f"boot of it so far compiled at start (a smaller KV pool)", flush=True)
            session.setdefault("repeated_compiled", []).append(f"r{repeat} {point_id(point)}")
            why = ""
        if why:
            passed.append(f"r{repeat} {point_id(point)}")
            print(f"  [{i}/{len(todo)}] r{repeat} {point_id(point)} not booted: {why}",
                  flush=True)
            continue
        params = resolve(point, exp.backend.flags)
        launch = backend.launch_command(exp.backend, params)
        trial_id = f"land-r{repeat}-" + "-".join(
            f"{k.split('_')[-1]}{v}" for k, v in sorted(point.items()))
        started = time.time()
        result = run_trial(exp, point, TrialContext(run_dir=run_dir, local_dir=local,
                                                    trial_id=trial_id, repeat=repeat))
        rows += rows_of(result, point, repeat, names, levels, launch, started, mine)
        tried += 1
        if result.booted:      # a point refused before a boot costs none
            session["boots"] += 1
        session["wall_s"] = round(time.monotonic() - t0, 1)
        write_table(out, rows, sch, meta)
        figs = " ".join(f"C={s.concurrency}:{s.output_tok_s:.1f}tok/s"
                        + (f"/acc{s.accept_length:.2f}" if s.accept_length else "")
                        for s in result.levels)
        print(f"  [{i}/{len(todo)}] r{repeat} {point_id(point)} {result.status} "
              f"{result.wall_s:.0f}s {figs} {result.reason[:160]}", flush=True)
    session["wall_s"] = round(time.monotonic() - t0, 1)
    session["ended_utc"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    if stopped:
        session["stopped"] = stopped
    if passed:
        session["not_contenders"] = passed
    ratio, pairs = drift(rows[:n_before], rows[n_before:])
    if ratio is not None:
        session["drift"] = {"ratio": round(ratio, 4), "pairs": pairs}
        if abs(math.log(ratio)) > math.log(DRIFT_LIMIT):
            print(f"record_landscape: WARNING: this session measured the points the table had "
                  f"already {ratio:.2f}x the earlier sessions' tok/s (median over {pairs} "
                  f"point-levels): a table that mixes machines or loads ranks its points by "
                  f"which session booted them; record into another --out, or drop one "
                  f"session's rows", file=sys.stderr, flush=True)
    write_table(out, rows, sch, meta)
    left = len(todo) - tried - len(passed)
    print(f"record_landscape: {session['boots']} boots in {session['wall_s']:.0f}s; "
          f"{len(done_keys(rows))} recorded in all" + (f"; {left} left ({stopped})" if left
                                                       else ""), flush=True)
    return 0


DRIFT_LIMIT = 1.10     # a session off the earlier ones by more than this is warned about


def drift(before: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]
          ) -> tuple[float | None, int]:
    """(median over the (point, level)s both measured of this session's mean tok/s over the
    earlier sessions', how many), or (None, 0) where they share none. Two sessions on different
    machines, or one on a machine another job loaded, measure the same point differently; the
    replay takes a point's repeats as one machine's spread."""
    old, now = mean_tok_s(before), mean_tok_s(new)
    ratios = [now[k] / old[k] for k in now.keys() & old.keys() if old[k] > 0]
    return (statistics.median(ratios), len(ratios)) if ratios else (None, 0)


def _stop_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        hh, mm = (int(x) for x in text.split(":"))
    except ValueError:
        raise ConfigError(f"--stop-at {text!r}: expected HH:MM (UTC)") from None
    now = dt.datetime.now(dt.UTC)
    at = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
    if at < now - dt.timedelta(hours=12):
        at += dt.timedelta(days=1)
    return at.timestamp()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/record_landscape.py",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", required=True, help="an engine experiment TOML")
    ap.add_argument("--axis", action="append", required=True, metavar="NAME=VALUES",
                    help="a grid axis: NAME=LOW-HIGH or NAME=a,b,c (first: "
                         "speculative_num_steps)")
    ap.add_argument("--repeats", type=int, default=3, help="boots per point (default 3)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=None,
                    help="levels (default: the experiment's)")
    ap.add_argument("--warmup-s", type=float, default=None)
    ap.add_argument("--duration-s", type=float, default=None)
    ap.add_argument("--warmup-requests", type=int, default=None)
    ap.add_argument("--out", required=True, help="the Parquet table (resumed if present)")
    ap.add_argument("--name", default=None, help="the landscape's name (default: --out's stem)")
    ap.add_argument("--run-dir", default=None,
                    help="where the trials' own tables and logs go (default: "
                         "runs/landscapes/<name>)")
    ap.add_argument("--stop-at", default=None, metavar="HH:MM",
                    help="UTC time after which no boot starts")
    ap.add_argument("--keep-other-weights", action="store_true",
                    help="keep the rows earlier sessions recorded on other weights (by "
                         "default they are moved to <out>.other-weights.parquet and booted "
                         "again)")
    ap.add_argument("--contenders", type=float, default=None, metavar="F",
                    help="after the first repeat, boot only the baseline and the points "
                         "within F of the best score so far (e.g. 0.05)")
    given = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(given)
    args.argv = given
    if args.repeats < 1:
        print("error: --repeats must be >= 1", file=sys.stderr)
        return 2
    if args.contenders is not None and not 0 < args.contenders < 1:
        print(f"error: --contenders {args.contenders:g}: a fraction of the best score, "
              f"between 0 and 1 (e.g. 0.05)", file=sys.stderr)
        return 2
    # A recording runs for long in the background (where SIGINT is ignored): SIGTERM and SIGINT
    # leave through the trial's teardown (the server is stopped), keeping every boot written.
    def leave(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGINT, leave)
    try:
        return record(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
