"""One trial: boot a server with one parameter set, measure each level, record, tear down.

`run_trial` is what a Ray Tune trial calls on its GPU pair, and what
`python -m specdecode_tune.trial` runs by hand, as the seed's user did six times. A server
that refuses the config at start-up (OOM, not enough KV memory, invalid arguments) gives a
result with status "infeasible" and the reason; a point the rules refuse is "pruned" without a
boot; a server that dies or hangs mid-run, or serves no request of a level, gives "failed",
keeping every level finished before.

After each level the trial checks that the server is still alive and still answers its health
path (within `trial_steps.HEALTH_PROBE_S`): a level during which it died or hung is kept,
marked suspect, and the trial ends there, since the levels after it would only measure a dead
server.

A level in which no request succeeded (`load.level_failure`: every request failed, e.g. the
server refused the workload with a 400) measured nothing: it is kept (suspect, its note says
why) and the trial ends there as "failed", with the first failed request's words as the reason
("no request succeeded at C=1: http 400: <the server's message>"), never as "ok" at 0 tok/s.

The server's facts, its load and its counters are read with the experiment's API key
(`trial_steps.api_headers`), as the measured requests are: a server that refuses it (401/403)
ends the trial as "failed" with that reason (`errors.KeyRefused`), and a fact whose endpoint
gave nothing else is named in the row's facts (`records.FACTS_UNREAD`), never left a silent
None.

Before that check, the trial waits (up to `trial_steps.DRAIN_S`) until the server runs and queues no
request: the requests cut at the level's end go on in the server until it sees the closed
connection, and their work must neither count in the next level's counters nor load its start.

This module holds the trial's sequence (`run_trial`), where it writes (`TrialContext`), its
row (`record_trial`) and the command; each step's own code (the levels left, the server's
facts, what follows a level) is `trial_steps.py`'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import store
from .backends import Backend, get_backend, preflight, refusals
from .config import Experiment, cliargs, load_experiment
from .errors import ConfigError, KeyRefused, ServerStartError
from .records import (
    BEFORE_A_BOOT,
    FACTS_UNREAD,
    LevelSummary,
    RequestRecord,
    ServerFacts,
    TrialResult,
)
from .server import ServerProcess
from .space import invalid_reason, resolve
from .store import rundir
from .store.files import check_writable
from .trial_steps import (
    LevelCallback,
    LevelRecorder,
    LevelTarget,
    NothingMeasured,
    ServerGone,
    api_key,
    drain,
    in_rounds_of,
    last_line,
    plans_left,
    read_server,
)

# `drain` is the trial's, imported from here by its tests.
__all__ = ["INFEASIBLE_KINDS", "TrialContext", "build_parser", "drain", "format_levels", "main",
           "record_trial", "run_trial"]

# Start-up failures that mean "this config does not fit / is refused": a fact about the point.
INFEASIBLE_KINDS = ("oom", "kv_memory", "invalid_args")


@dataclass(frozen=True)
class TrialContext:
    """Where one trial writes: tables to `run_dir` (a path or a pyarrow.fs URI shared by all
    nodes), logs and pidfiles to `local_dir` on the node that runs it."""

    run_dir: str
    local_dir: Path
    trial_id: str
    repeat: int = 0


def run_trial(
    exp: Experiment,
    sampled: Mapping[str, Any],
    ctx: TrialContext,
    *,
    done_levels: Sequence[LevelSummary] = (),
    done_facts: ServerFacts | None = None,
    on_facts: Callable[[ServerFacts], None] | None = None,
    on_level: LevelCallback | None = None,
    extra: Mapping[str, Any] | None = None,
    write_row: bool = True,
) -> TrialResult:
    """Boot, read the server's facts, warm up, measure each level not in `done_levels`, write
    the tables, tear down. Expected failures are results, never exceptions.

    A resumed trial passes the levels (and facts) its checkpoint holds; `on_facts` and
    `on_level` let the caller checkpoint them. `extra` holds columns of the trial's row the
    result does not (TRIAL_EXTRA_KEYS). With `write_row=False` the row is the caller's to write
    (`record_trial`), with what it computes from the result (the search: the score)."""
    t0 = time.monotonic()
    started_at = time.time()
    params = resolve(sampled, exp.backend.flags)
    finished: list[LevelSummary] = list(done_levels)

    def finish(status: str, reason: str = "", facts: ServerFacts | None = None) -> TrialResult:
        result = TrialResult(
            trial_id=ctx.trial_id, params=params, status=status, reason=reason,
            facts=facts or ServerFacts(), levels=tuple(finished),
            wall_s=time.monotonic() - t0, repeat=ctx.repeat,
            suspect=any(s.suspect for s in finished))
        if write_row:
            record_trial(ctx, result, started_at=started_at, extra=extra)
        return result

    # Before a boot: a point the rules refuse, levels all measured before, a refused argv.
    bad = invalid_reason(params)
    if bad is not None:
        return finish("pruned", bad)
    plans = plans_left(exp.measure, done_levels)
    if not plans and done_levels:
        # Resumed after every level was measured: nothing to boot for.
        return finish("ok", "", done_facts)
    backend = get_backend(exp.backend.kind)
    # The server's own argument check where the backend has one (SGLang's parser, the
    # simulator's CLI): a command line every boot would refuse costs no boot. Its reason reads
    # as a refusal at start-up does, so the search learns it the same way.
    refused = refusals(exp.backend, [params])[0]
    if refused is not None:
        return finish("infeasible", f"invalid_args: {refused} {BEFORE_A_BOOT}")
    server, env = _server(exp, backend, params, ctx)
    facts = ServerFacts()
    try:
        with server as srv:     # booted: the facts, then warm-up and levels, then the verdict
            facts, limit, lengths = read_server(exp, backend, srv, env, params)
            if on_facts is not None:
                on_facts(facts)
            levels = LevelRecorder(
                exp, backend, srv, env=env, limit=limit, finished=finished, on_level=on_level,
                target=LevelTarget(ctx.run_dir, ctx.trial_id, params, ctx.repeat))
            if plans:
                try:
                    # A loop over the running limit is served in rounds of it.
                    levels.measure_all(in_rounds_of(plans, limit), lengths)
                except (ServerGone, NothingMeasured) as stop:
                    return finish("failed", str(stop), facts)
            if not srv.alive():
                return finish("failed", f"server exited during the run: "
                                        f"{last_line(srv.log_tail(4000))}", facts)
    except ServerStartError as e:
        status = "infeasible" if e.kind in INFEASIBLE_KINDS else "failed"
        return finish(status, f"{e.kind}: {e.reason}", facts)
    except KeyRefused as e:
        # The server wants a key its own reads did not bring: every fact and counter would be
        # missing, so the trial stops here (the server is stopped on the way out).
        return finish("failed", str(e), facts)
    return finish("ok", "", facts)


def _server(exp: Experiment, backend: Backend, params: Mapping[str, Any], ctx: TrialContext
            ) -> tuple[ServerProcess, dict[str, str]]:
    """The trial's server, not started yet (its `with` starts it and always stops it), and the
    environment it runs in: its log and pidfile in the trial's `local_dir`."""
    argv = backend.argv(exp.backend, params, "{port}")
    env = {**os.environ, **backend.env(exp.backend, run_dir=str(ctx.local_dir))}
    ctx.local_dir.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(argv, env=env, host=exp.backend.host,
                           health_path=backend.health_path, backend=backend,
                           secrets=[api_key(exp)],
                           log_path=rundir.server_log(ctx.local_dir, ctx.trial_id),
                           boot_timeout_s=exp.backend.boot_timeout_s,
                           pidfile=rundir.pidfile(ctx.local_dir, ctx.trial_id))
    return server, env


def record_trial(ctx: TrialContext, result: TrialResult, *, started_at: float,
                 extra: Mapping[str, Any] | None = None) -> None:
    """The trial's row in the trials table: the result, where and when it ran (`started_at`,
    epoch seconds; finished now), and the caller's `extra` columns."""
    columns = {"node": socket.gethostname(), "started_at": started_at,
               "finished_at": time.time(), **(extra or {})}
    store.write_trial(ctx.run_dir, result, extra=columns)


# ---------------------------------------------------------------------------------------------
# CLI: one trial by hand


def format_levels(levels: Sequence[LevelSummary]) -> str:
    """One row per level: its figures, how well they are known (`+-`: the 95% interval of
    tok/s over whole rounds, `rounds`; "fixed" for a fixed window) and the seconds it took."""
    head = f"{'level':>8} {'tok/s':>9} {'+-':>6} {'req/s':>7} {'ttft p50':>9} " \
           f"{'tpot p50':>9} {'accept':>7} {'errors':>6} {'rounds':>6} {'time':>6}  note"
    rows = [head]
    for s in levels:
        name = f"C={s.concurrency}" if s.mode == "closed" else f"{s.rate:g}/s"
        acc = f"{s.accept_length:.2f}" if s.accept_length is not None else "-"
        ttft = f"{s.ttft_p50 * 1e3:.0f}ms" if s.ttft_p50 is not None else "-"
        tpot = f"{s.tpot_p50 * 1e3:.1f}ms" if s.tpot_p50 is not None else "-"
        prec = f"{s.precision:.1%}" if s.precision is not None else "-"
        rounds = "fixed" if s.rounds is None else str(s.rounds)
        took = f"{s.level_s:.1f}s" if s.level_s is not None else "-"
        rows.append(f"{name:>8} {s.output_tok_s:9.1f} {prec:>6} {s.requests_s:7.2f} {ttft:>9} "
                    f"{tpot:>9} {acc:>7} {s.errors:6d} {rounds:>6} {took:>6}  {s.note}")
    return "\n".join(rows)


def build_parser() -> argparse.ArgumentParser:
    """The command's flags; each value is checked as the experiment's are (`config.cliargs`)."""
    ap = cliargs.Parser(
        prog="python -m specdecode_tune.trial",
        description="Boot one server with one parameter set and measure it at each level.")
    ap.add_argument("--experiment", default="experiments/sim-default.toml",
                    type=cliargs.text("a TOML experiment file"),
                    help="experiment TOML (default: %(default)s)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    type=cliargs.setting,
                    help="a parameter value, e.g. speculative_num_steps=4 (repeatable); held "
                         "to the parameter's type and [space] range")
    ap.add_argument("--run-dir", default=None, type=cliargs.text("a folder or a storage URI"),
                    help="where tables go (default: runs/<experiment>/manual)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = cliargs.parse(build_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        exp = load_experiment(args.experiment)
        preflight(exp.backend)   # the server runs here: its model files must be here too
        sampled = cliargs.point_from_sets(args.set, exp)
        run_dir = args.run_dir or str(Path("runs") / exp.name / "manual")
        # Before the boot: a run dir that cannot be written would lose the levels measured.
        check_writable("--run-dir", args.run_dir or run_dir, run_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    trial_id = f"manual-{store.config_key(resolve(sampled, exp.backend.flags))}-" \
               f"{time.strftime('%Y%m%d-%H%M%S')}"
    ctx = TrialContext(run_dir=run_dir, local_dir=rundir.logs_dir(rundir.local_dir(run_dir)),
                       trial_id=trial_id)
    params = resolve(sampled, exp.backend.flags)
    print(f"trial {trial_id}: {json.dumps(params, sort_keys=True)}", flush=True)

    print(format_levels([]), flush=True)

    def progress(summary: LevelSummary, _records: Sequence[RequestRecord]) -> None:
        print(format_levels([summary]).splitlines()[1], flush=True)

    result = run_trial(exp, sampled, ctx, on_level=progress)
    if args.json:
        print(json.dumps(dataclasses.asdict(result), default=str, indent=2))
    else:
        facts = result.facts
        print(f"status: {result.status}" + (f" ({result.reason})" if result.reason else ""))
        unread = facts.extra.get(FACTS_UNREAD)
        print(f"server: max_total_num_tokens={facts.max_total_num_tokens} "
              f"max_running_requests={facts.max_running_requests} "
              f"gpus={','.join(facts.gpu_ids) or '-'}"
              + (f" (not read: {unread})" if unread else ""))
        print(f"tables: {run_dir}/{rundir.TABLES_DIR}")
    return 0 if result.status in ("ok", "infeasible", "pruned") else 1


if __name__ == "__main__":
    sys.exit(main())
