"""The report of a search: plots, plateau verdicts, the recommended launch command and schedule.

    python -m specdecode_tune.report RUN_DIR [--out DIR] [--experiment FILE]

`write_report(run_dir)` reads the run's tables (a local path or any `pyarrow.fs` URI), and
writes into `<run_dir>/report/` (or `out_dir`; a URI run dir gets a local folder, since the
report is for a person at this machine):

    report.md                    the ten-second summary first, then the evidence
    report.html                  the same, with the figures embedded (readable offline)
    *.png                        figures (matplotlib Agg, no display)
    *.json                       the per-level schedule in each engine's format, as its
                                 backend writes it (backends.schedule_files): SGLang's
                                 adaptive config, vLLM's --speculative-config, TensorRT-LLM's
                                 draft_len_schedule (where it fits)

Modules: `data` (run dir -> the values of `rundata`: trials, configs, baseline, noise band),
`words` (how settings and numbers are written), `curves` (the curve along an axis and its
shape), `verdicts` (plateau / peak / escape in words), `recommend` (best config, command,
schedule and its formats), `validation` (the schedule's own boot, level by level), `trials`,
`predictions`, `slo` and `prompts` (the workload's sections), `figures`, `render` (Markdown /
HTML, atomic writes), `build` (what the report says, in order), `cli`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..config import Experiment
from ..store.rundir import REPORT_DIR, report_dir
from . import build, figures, prompts, recommend, render, slo, verdicts
from .data import RunDirError, read_run
from .rundata import RunData


@dataclass(frozen=True)
class ReportOutput:
    """Where the report went and its ten-second summary."""

    path: str                         # report.md
    html_path: str                    # report.html
    figures: list[str]                # PNG paths
    summary_lines: list[str]          # what a person reads first (the search prints it too)
    best_lines: list[str] = field(default_factory=list)  # the best config's per-level figures
    schedule_paths: list[str] = field(default_factory=list)   # the engines' schedule files


def default_out_dir(run_dir: str) -> str:
    """`<run_dir>/report` for a local run dir; for a URI, a local folder named after it (the
    same temp folder the search keeps a URI run's logs in)."""
    return report_dir(run_dir)


def write_report(run_dir: str, *, experiment: Experiment | None = None,
                 out_dir: str | None = None) -> ReportOutput:
    """Write the report of `run_dir`; raises RunDirError when there is nothing to report.

    `experiment` defaults to `<run_dir>/experiment.toml` (the search copies it there); without
    one the report says why it has no launch command."""
    data = read_run(run_dir, experiment)
    return write_report_from(data, out_dir or default_out_dir(run_dir))


def write_report_from(data: RunData, out_dir: str) -> ReportOutput:
    """Write the report of already-read run data into `out_dir`."""
    rec = recommend.recommend(data)
    sched = recommend.schedule(data)
    axis_verdicts = verdicts.verdicts(data)
    figs = figures.all_figures(data)
    # The workload's sections (report/slo.py, report/prompts.py): goodput and saturation per
    # level, per-request acceptance; before the closing definitions.
    acc = prompts.request_acceptance(data)
    extra_figs = [*slo.figures(data), *prompts.figures(data, acc)]
    summary = build.summary_lines(data, rec, axis_verdicts, sched)
    blocks = build.blocks(data, rec, axis_verdicts, sched, figs, summary)
    extra = [*slo.blocks(data), *prompts.blocks(data, acc)]
    extra += [render.Image(f.name, f.title, f.caption) for f in extra_figs]
    at = next((i for i, b in enumerate(blocks) if isinstance(b, render.Heading)
               and b.text == "How the figures are computed"), len(blocks))
    blocks[at:at] = extra
    figs = [*figs, *extra_figs]

    os.makedirs(out_dir, exist_ok=True)
    fig_paths = [render.write_atomic(os.path.join(out_dir, f.name), f.png) for f in figs]
    sched_paths = [render.write_atomic(os.path.join(out_dir, f.file_name),
                                       recommend.schedule_json(f.content) + "\n")
                   for f in sched.files if f.content is not None]
    md = render.write_atomic(os.path.join(out_dir, "report.md"), render.to_markdown(blocks))
    html_path = render.write_atomic(
        os.path.join(out_dir, "report.html"),
        render.to_html(blocks, {f.name: f.png for f in figs}, f"Report: {data.name}"))
    return ReportOutput(path=md, html_path=html_path, figures=fig_paths,
                        summary_lines=summary, schedule_paths=sched_paths,
                        best_lines=build.best_table_lines(data, rec))


__all__ = ["REPORT_DIR", "ReportOutput", "RunDirError", "default_out_dir", "write_report",
           "write_report_from"]
