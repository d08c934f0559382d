"""One trial: boot a server with one parameter set, measure each level, record, tear down.

`run_trial` is what a Ray Tune trial calls on its GPU pair, and what
`python -m specdecode_tune.trial` runs by hand, as the seed's user did six times. A server
that refuses the config at start-up (OOM, not enough KV memory, invalid arguments) gives a
result with status "infeasible" and the reason; a point the rules refuse is "pruned" without a
boot; a server that dies or hangs mid-run, or serves no request of a level, gives "failed",
keeping every level finished before.

After each level the trial checks that the server is still alive and still answers its health
path (within `HEALTH_PROBE_S`): a level during which it died or hung is kept, marked suspect,
and the trial ends there, since the levels after it would only measure a dead server.

A level in which no request succeeded (`load.level_failure`: every request failed, e.g. the
server refused the workload with a 400) measured nothing: it is kept (suspect, its note says
why) and the trial ends there as "failed", with the first failed request's words as the reason
("no request succeeded at C=1: http 400: <the server's message>"), never as "ok" at 0 tok/s.

The server's facts, its load and its counters are read with the experiment's API key
(`api_headers`), as the measured requests are: a server that refuses it (401/403) ends the
trial as "failed" with that reason (`errors.KeyRefused`), and a fact whose endpoint gave nothing
else is named in the row's facts (`records.FACTS_UNREAD`), never left a silent None.

Before that check, the trial waits (up to `DRAIN_S`) until the server runs and queues no
request: the requests cut at the level's end go on in the server until it sees the closed
connection, and their work must neither count in the next level's counters nor load its start.
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

from . import store, telemetry
from .backends import get_backend, preflight, refusals
from .config import Experiment, MeasureConfig, cliargs, load_experiment
from .errors import ConfigError, KeyRefused, ServerStartError
from .load import Api, LevelPlan, level_failure, measure
from .load.slo import Slo, good_requests
from .load.stats import ACCEPT_UNREAD
from .load.tokencount import server_lengths
from .records import FACTS_UNREAD, LevelSummary, RequestRecord, ServerFacts, TrialResult
from .server import ServerProcess
from .space import invalid_reason, resolve
from .store import rundir
from .store.files import check_writable

# Start-up failures that mean "this config does not fit / is refused": a fact about the point.
INFEASIBLE_KINDS = ("oom", "kv_memory", "invalid_args")

LevelCallback = Callable[[LevelSummary, Sequence[RequestRecord]], None]

# How long a server may take to answer its health path after a level before it counts as hung.
HEALTH_PROBE_S = 5.0
# The boot's log the backend reads its memory lines from (SGLang logs them early in a boot
# of a few thousand lines).
BOOT_LOG_BYTES = 4 << 20
# How long a level's end waits for the server to finish or abort the requests it still has.
DRAIN_S = 30.0
DRAIN_POLL_S = 0.02


def drain(busy: Callable[[], int | None], limit_s: float) -> tuple[int, float]:
    """Wait until `busy()` (the server's running + queued requests, None where it cannot
    tell) is 0 or None, for at most `limit_s`. Returns (requests left, seconds waited)."""
    t0 = time.monotonic()
    while True:
        left = busy() or 0
        waited = time.monotonic() - t0
        if left == 0 or waited >= limit_s:
            return left, waited
        time.sleep(min(DRAIN_POLL_S, limit_s - waited))


class _ServerGone(Exception):
    """The server died or stopped answering during a level: stop measuring, keep what is done."""


class _NothingMeasured(Exception):
    """No request of a level succeeded: stop measuring, keep what is done; the trial failed."""


def level_name(summary: LevelSummary) -> str:
    return f"C={summary.concurrency}" if summary.mode == "closed" else f"{summary.rate:g} req/s"


@dataclass(frozen=True)
class TrialContext:
    """Where one trial writes: tables to `run_dir` (a path or a pyarrow.fs URI shared by all
    nodes), logs and pidfiles to `local_dir` on the node that runs it."""

    run_dir: str
    local_dir: Path
    trial_id: str
    repeat: int = 0


def level_plans(m: MeasureConfig) -> list[LevelPlan]:
    """Closed-loop levels in the experiment's order, then open-loop rates."""
    def plan(concurrency: int | None = None, rate: float | None = None) -> LevelPlan:
        closed = concurrency is not None
        return LevelPlan(concurrency=concurrency, rate=rate, warmup_s=m.warmup_s,
                         duration_s=m.window_s if closed else m.duration_s,
                         max_requests=m.max_requests, request_timeout_s=m.request_timeout_s,
                         precision=m.precision if closed else None, min_rounds=m.min_rounds)

    return [plan(concurrency=c) for c in m.concurrency] + [plan(rate=r) for r in m.rates]


def plan_key(plan: LevelPlan) -> tuple[str, float]:
    return ("rate", float(plan.rate)) if plan.rate else ("closed", float(plan.concurrency or 0))


def summary_key(s: LevelSummary) -> tuple[str, float]:
    return ("rate", float(s.rate or 0)) if s.mode == "rate" else ("closed", float(s.concurrency))


def api_key(exp: Experiment) -> str:
    """The API key from the environment variable the experiment names ('' without one)."""
    name = exp.backend.api_key_env
    return os.environ.get(name, "") if name else ""


def api_headers(exp: Experiment) -> dict[str, str]:
    """Authorization with the experiment's API key; never stored."""
    key = api_key(exp)
    return {"Authorization": f"Bearer {key}"} if key else {}


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

    bad = invalid_reason(params)
    if bad is not None:
        return finish("pruned", bad)

    done = {summary_key(s) for s in done_levels}
    plans = [p for p in level_plans(exp.measure) if plan_key(p) not in done]
    if not plans and done_levels:
        # Resumed after every level was measured: nothing to boot for.
        return finish("ok", "", done_facts)

    backend = get_backend(exp.backend.kind)
    # The server's own argument check where the backend has one (SGLang's parser, the
    # simulator's CLI): a command line every boot would refuse costs no boot. Its reason reads
    # as a refusal at start-up does, so the search learns it the same way.
    refused = refusals(exp.backend, [params])[0]
    if refused is not None:
        return finish("infeasible", f"invalid_args: {refused} (checked before a boot)")
    argv = backend.argv(exp.backend, params, "{port}")
    env = {**os.environ, **backend.env(exp.backend, run_dir=str(ctx.local_dir))}
    ctx.local_dir.mkdir(parents=True, exist_ok=True)
    facts = ServerFacts()
    try:
        with ServerProcess(argv, env=env, host=exp.backend.host,
                          health_path=backend.health_path, backend=backend,
                          secrets=[api_key(exp)],
                          log_path=rundir.server_log(ctx.local_dir, ctx.trial_id),
                           boot_timeout_s=exp.backend.boot_timeout_s,
                           pidfile=rundir.pidfile(ctx.local_dir, ctx.trial_id)) as srv:
            facts = backend.read_facts(srv.base_url, headers=api_headers(exp))
            gpu_ids = facts.gpu_ids or tuple(
                g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g)
            facts = dataclasses.replace(facts, gpu_ids=gpu_ids, boot_s=srv.boot_s)
            # The memory the boot left free and its graphs kept (the engine's own memory
            # lines): the model's out-of-memory boundary learns from boots that ran, not only
            # from boots refused.
            memory = backend.memory_facts(srv.log_tail(BOOT_LOG_BYTES))
            if memory:
                facts = dataclasses.replace(facts, extra={**facts.extra, **memory})
            # What the server runs at once (the backend knows where its engine says it).
            limit = backend.running_limit(facts, params)
            if isinstance(limit, int) and limit > 0:
                # A level measured in rounds: a loop over the limit is served in waves of it.
                plans = [dataclasses.replace(p, round_size=limit) if p.by_rounds else p
                         for p in plans]
            # A sharegpt sample counted again by the server's tokenizer, where it has an
            # endpoint for it (llama-server, vLLM).
            lengths = server_lengths_of(exp, backend, srv.base_url)
            if lengths is not None:
                facts = dataclasses.replace(facts, extra={
                    **facts.extra, "sharegpt_counted_by": "server tokenize endpoint",
                    "sharegpt_prompts": len(lengths)})
            if on_facts is not None:
                on_facts(facts)
            # GPU telemetry of exactly this trial's GPUs, one window per level (records
            # nothing, and says so once, where there is no NVML or no GPU).
            sampler = telemetry.TelemetrySampler(
                env.get("CUDA_VISIBLE_DEVICES"), own_pids=lambda: telemetry.server_pids(srv.pid),
                rules=telemetry.SuspectRules(warmup_s=exp.measure.warmup_s))
            counters: list[Any] = []      # the server's counters when the level started
            slo = slo_of(exp)

            def level_start(_plan: LevelPlan) -> None:
                sampler.cut()             # the warm-up and the pause between levels: dropped
                counters[:] = [backend.metrics_snapshot(srv.base_url, api_headers(exp))]

            def record(summary: LevelSummary, records: Sequence[RequestRecord]) -> None:
                tele = sampler.cut()
                summary = telemetry.merge_level(summary, tele)
                left, waited = drain(
                    lambda: backend.in_flight(srv.base_url, api_headers(exp)),
                    min(DRAIN_S, exp.measure.request_timeout_s))
                if left:
                    summary = dataclasses.replace(summary, note=(
                        summary.note + "; " if summary.note else "") + (
                        f"server still had {left} request(s) {waited:.0f} s after the level"))
                if summary.accept_length is None and counters:
                    # Servers that give no per-request verify counts (vLLM, llama.cpp): the
                    # acceptance of the level from their counters' deltas.
                    acc, hist = backend.window_acceptance(
                        counters[0], backend.metrics_snapshot(srv.base_url, api_headers(exp)))
                    if acc is not None:
                        summary = dataclasses.replace(
                            summary, accept_length=acc,
                            accept_histogram=hist or summary.accept_histogram,
                            note="; ".join(p for p in summary.note.split("; ")
                                           if p and p != ACCEPT_UNREAD))
                over = limit is not None and summary.mode == "closed" \
                    and summary.concurrency > limit
                note = summary.note
                if over:
                    note = (note + "; " if note else "") + \
                        f"concurrency {summary.concurrency} > running limit {limit}: queueing"
                alive = srv.alive()
                probe_s = min(HEALTH_PROBE_S, exp.measure.request_timeout_s)
                answering = alive and srv.answers(probe_s)
                if not alive:
                    note = (note + "; " if note else "") + "server died during the level"
                elif not answering:
                    note = (note + "; " if note else "") + "server stopped answering"
                summary = dataclasses.replace(
                    summary, over_running_limit=over, note=note,
                    suspect=summary.suspect or summary.errors > 0 or not answering)
                if slo is not None:
                    good, total = good_requests(records, slo)
                    summary = dataclasses.replace(summary, slo_good=good, slo_total=total)
                store.write_level(ctx.run_dir, ctx.trial_id, summary, records,
                                    params=params, repeat=ctx.repeat)
                store.write_telemetry(ctx.run_dir, ctx.trial_id, store.level_tag(summary),
                                        tele.samples)
                finished.append(summary)
                if on_level is not None:
                    on_level(summary, records)
                if not alive:
                    raise _ServerGone(f"server exited during the run: "
                                      f"{_last_line(srv.log_tail(4000))}")
                if not answering:
                    raise _ServerGone(f"server hung: no answer from {backend.health_path} "
                                      f"within {probe_s:g} s after the level "
                                      f"{level_name(summary)}")
                why = level_failure(records)
                if why is not None:
                    raise _NothingMeasured(f"no request succeeded at {level_name(summary)}: "
                                           f"{why}")

            if plans:
                try:
                    with sampler:
                        measure(srv.base_url,
                                Api(exp.backend.api, stream=backend.stream_format),
                                exp.workload, plans,
                                warmup_requests=exp.measure.warmup_requests, on_level=record,
                                headers={**api_headers(exp), **backend.request_headers},
                                on_level_start=level_start, lengths=lengths)
                except (_ServerGone, _NothingMeasured) as stop:
                    return finish("failed", str(stop), facts)
            if not srv.alive():
                return finish("failed", f"server exited during the run: "
                                        f"{_last_line(srv.log_tail(4000))}", facts)
    except ServerStartError as e:
        status = "infeasible" if e.kind in INFEASIBLE_KINDS else "failed"
        return finish(status, f"{e.kind}: {e.reason}", facts)
    except KeyRefused as e:
        # The server wants a key its own reads did not bring: every fact and counter would be
        # missing, so the trial stops here (the server is stopped on the way out).
        return finish("failed", str(e), facts)
    return finish("ok", "", facts)


def server_lengths_of(exp: Experiment, backend: Any, base_url: str
                      ) -> dict[str, tuple[int, int]] | None:
    """A sharegpt workload's token counts from the server's tokenize endpoint, where the
    backend has one (`load.tokencount`); None otherwise, or when it does not answer."""
    endpoint = getattr(backend, "tokenize", None)
    if exp.workload.kind != "sharegpt" or endpoint is None:
        return None
    return server_lengths(base_url, endpoint, exp.workload.sharegpt_sample(),
                          headers={**api_headers(exp), **backend.request_headers})


def slo_of(exp: Experiment) -> Slo | None:
    """The goodput objective's latency targets (seconds), or None for other objectives."""
    o = exp.objective
    if o.kind != "goodput":
        return None

    def s(ms: float | None) -> float | None:
        return None if ms is None else ms / 1000.0

    return Slo(ttft_s=s(o.ttft_ms), tpot_s=s(o.tpot_ms), itl_s=s(o.itl_ms),
               percentile=o.percentile)


def record_trial(ctx: TrialContext, result: TrialResult, *, started_at: float,
                 extra: Mapping[str, Any] | None = None) -> None:
    """The trial's row in the trials table: the result, where and when it ran (`started_at`,
    epoch seconds; finished now), and the caller's `extra` columns."""
    columns = {"node": socket.gethostname(), "started_at": started_at,
               "finished_at": time.time(), **(extra or {})}
    store.write_trial(ctx.run_dir, result, extra=columns)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(empty log)"


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
