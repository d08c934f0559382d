"""What the report says, in order: the ten-second summary, then the evidence behind it.

`summary_lines` is what a person reads first (and what the search prints at its end): the best
config and its gain over the baseline per level, the plateau verdict in one sentence, and how
sure we are (repeats, noise band). `blocks` is the whole report, rendered by `render`; a section
with a module of its own comes from there (`validation.blocks`, `predictions.blocks`,
`trials.blocks`; the workload's sections, `slo` and `prompts`, are added by `write_report_from`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..config import Experiment
from ..objective import PRIOR_DOF, pct
from ..space import STEPS
from . import predictions, trials, validation
from . import render as r
from .figures import Figure
from .recommend import (
    Recommendation,
    Schedule,
    runner_up_line,
    schedule_json,
    schedule_line,
)
from .rundata import SCHEDULE_IDS, Config, RunData
from .verdicts import AxisVerdict
from .words import band_pct, fmt_tok, fmt_value, pct_gain, shorten


def _x(ratio: float | None) -> str:
    return f"{ratio:.2f}x" if ratio is not None else "-"


def questions_line(data: RunData) -> str:
    """'Plateau questions: 1 answered by a boot, 2 by the model (predicted, not booted).'; ''
    where the search asked none (or its tables predate the column)."""
    booted, model = data.booted_questions, data.model_answers
    if not booted and not model:
        return ""
    return (f"Plateau questions: {len(booted)} answered by a boot, {len(model)} by the model "
            f"(predicted, not booted).")


def _question_blocks(data: RunData) -> list[r.Block]:
    """Which plateau questions a boot answered (the jumps and brackets, with why each was
    booted) and which the model answered without one (its verdict, with the probability)."""
    booted, model = data.booted_questions, data.model_answers
    if not booted and not model:
        return []
    out: list[r.Block] = [r.Heading(3, "Plateau questions: a boot or the model")]
    out.append(r.Para(
        "The search asks whether the curve climbs again beyond a plateau. A question costs a "
        "boot only where the fitted model cannot rule out a climb beyond the noise band (its "
        "errors on this run inside the band, a boot at the jump's value or beyond predicted "
        "within the band, a climb in at most 5% of its posterior draws); otherwise the model "
        "answers it, marked predicted, and a boot checks it only once a later measurement "
        "contradicts the model."))
    if booted:
        out.append(r.Para("Answered by a boot: " + "; ".join(
            f"{tid}: {why}" for tid, why in booted) + "."))
    if model:
        out.append(r.Para("Answered by the model (predicted, not booted): "
                          + "; ".join(model) + "."))
    return out


def band_text(data: RunData) -> str:
    if data.band_measured:
        n = sum(1 for cf in data.configs if cf.n >= 2)
        return (f"noise band {band_pct(data.band)} measured from the repeats of {n} "
                f"configuration(s)")
    return (f"noise band {band_pct(data.band)} assumed (too few repeats to measure it; the "
            f"experiment's search.noise_band)")


def best_table_lines(data: RunData, rec: Recommendation) -> list[str]:
    """The best config's figures per level, as the search prints them at its end: the same
    `Recommendation` rows (medians over its usable measurements) the report shows."""
    best = rec.config
    if best is None:
        return ["no feasible configuration was measured"]
    lines = [f"best config, per level (median of {best.n} measurement(s)) against the "
             f"no-speculation baseline:"]
    for row in rec.rows:
        if row.tok_s is None:
            continue
        rel = f"{row.speedup:5.2f}x" if row.speedup is not None else "   - "
        base = f"{row.base:8.1f}" if row.base else "       -"
        lines.append(f"  C={row.c:<3d} {row.tok_s:8.1f} tok/s  baseline {base}  {rel}")
    lines.append(f"launch: {rec.command}" if rec.command else rec.command_note)
    return lines


def summary_lines(data: RunData, rec: Recommendation, verdicts: Sequence[AxisVerdict],
                  sched: Schedule) -> list[str]:
    best = rec.config
    if best is None:
        why = ("" if data.baseline is not None else
               " (no no-speculation baseline was measured either, so nothing could be scored)")
        return [f"No usable configuration was measured{why}: {trials.counts(data)}.",
                "See the report's trial list for the reasons."]
    lines = []
    if data.baseline is None:
        lines.append(f"Best config: {data.label(best.params)}; no no-speculation baseline was "
                     f"measured, so gains are unknown (scores as the search recorded them).")
    else:
        per = ", ".join(f"C={row.c} {_x(row.speedup)}" for row in rec.rows
                        if row.speedup is not None)
        if rec.vs_baseline == "better":
            lines.append(f"Best config: {data.label(best.params)}: {pct(best.robust.median)} "
                         f"weighted vs no speculation ({per}).")
        else:
            lines.append(f"Run without speculation: the best config, {data.label(best.params)}, "
                         f"is {rec.vs_baseline} against the baseline "
                         f"({pct(best.robust.median)} weighted; {per}).")
    steps_v = next((v for v in verdicts if v.axis == STEPS), None)
    main_v = steps_v or (verdicts[0] if verdicts else None)
    if main_v is not None:
        lines.append(f"Plateau verdict: {main_v.summary}.")
    asked = questions_line(data)
    if asked:
        lines.append(asked)
    sure = f"How sure: best measured {best.n}x{_once(data, best)}; {band_text(data)}"
    ru = runner_up_line(data, rec)
    lines.append(sure + (f"; {ru}." if ru else "."))
    if sched.withheld:
        lines.append(sched.withheld + ".")
    elif sched.chain:
        lines.append(f"Per-level schedule: {schedule_line(data, sched)}.")
        checked = validation.validate(data, sched.slots)
        if checked is not None:
            lines.append(checked.why)
        elif sched.ask is None:
            lines.append("No schedule file is written (nothing to validate); recommended: "
                         "the static config.")
        else:
            lines.append("The schedule was not validated (no boot of it ran: objective.kind = "
                         "\"schedule\" does that); recommended: the static config.")
    spent = trials.measure_seconds(data)
    lines.append(f"Trials: {trials.counts(data)}" + (f"; {spent}." if spent else "."))
    return lines


def _once(data: RunData, best: Config) -> str:
    """Why the best counts one measurement, where it does: no repeat, or repeats that were
    suspect and left out (each with its reason); "" where more than one counts."""
    if best.n != 1:
        return ""
    left_out = [t for t in data.trials if t.config_key == best.key and t.suspect
                and t.trial_id not in SCHEDULE_IDS]
    if not left_out:
        return (" (once: no repeat backs its figures; re-measure it before trusting a small "
                "margin)")
    firsts = {t.repeat == 0 for t in left_out}
    noun = ("measurement" if firsts == {True, False} else "first measurement" if firsts == {True}
            else "re-measurement")
    one = len(left_out) == 1
    # Each suspect level's first clause: the suspect check's words (`Trial.suspect_brief`).
    why = left_out[0].suspect_brief if one else "; ".join(
        f"{t.trial_id}: {t.suspect_brief}" for t in left_out)
    return (f" (once counted: its {noun}{'' if one else 's'} "
            f"{', '.join(t.trial_id for t in left_out)} {'was' if one else 'were'} suspect "
            f"({why}) and left out; re-measure it before trusting a small margin)")


def measure_text(exp: Experiment | None) -> str:
    """How a level was measured: whole rounds until known, or a fixed window."""
    m = exp.measure if exp is not None else None
    if m is None or m.precision is None:
        return ("Levels: a fixed window per level" + (
            f" ({m.warmup_s:g} s warm-up, {m.duration_s:g} s window)" if m else "")
            + ", tok/s = the tokens that arrived in it over its length; \"known to\" is not "
              "estimated (a window over lockstep requests reads high or low by where it cuts "
              "their rounds).")
    return (f"Levels: measured in whole rounds until the 95% interval of tok/s, and of the "
            f"acceptance where requests bring their verify steps, is within "
            f"+-{m.precision:.1%} (at least {m.min_rounds} rounds kept, at most "
            f"{m.max_duration_s:g} s after a {m.warmup_s:g} s warm-up). A round is min(C, the "
            f"server's running limit) requests, ending when the level's n-th, 2n-th, ... "
            f"request finishes; tok/s = the tokens that arrived between the first and last "
            f"kept round ends over that time; the first rounds are left out where they are a "
            f"transient (MSER); the interval is the ratio interval over rounds (regenerative "
            f"method / batch means) with Law & Kelton's relative-precision stop "
            f"(specdecode_tune/load/rounds.py). \"known to\" is the widest over the "
            f"repeats; \"level s\" the median seconds a level took, warm-up included.")


def _verdict_blocks(data: RunData, v: AxisVerdict) -> list[r.Block]:
    out: list[r.Block] = [r.Heading(3, f"{v.axis}"), r.Para(v.headline + ".")]
    if v.per_level:
        out.append(r.Para("Per concurrency level (same configs):"))
        out.append(r.Bullets(v.per_level))
    if v.steps:
        head = ("step", "score") + tuple(f"C={c}" for c in data.levels)
        rows = []
        for s in v.steps:
            jump = "" if not s.jump else " (jump)" if s.jump_level is None \
                else f" (jump at C={s.jump_level})"
            cells = [f"{fmt_value(s.a)} -> {fmt_value(s.b)}{jump}",
                     pct(s.score) + (" (noise)" if s.score_within else "")]
            for c in data.levels:
                d = s.levels.get(c)
                cells.append("-" if d is None else pct(d[0]) + (" (noise)" if d[1] else ""))
            rows.append(tuple(cells))
        out.append(r.Para("Every step between adjacent measured values, at the best config of "
                          "each value; \"(noise)\" marks a difference inside the noise band "
                          f"(score {band_pct(data.band)}; per level: "
                          + ", ".join(f"C={c} {band_pct(b)}" for c, b in
                                      data.level_bands.items()) + ")."))
        out.append(r.Table(head, tuple(rows)))
    if v.infeasible:
        out.append(r.Para("Refused by the server, with no usable measurement at that value: "
                          + "; ".join(f"{fmt_value(val)} ({shorten(reason, 120)})"
                                      for val, reason in v.infeasible) + "."))
    return out


def _schedule_blocks(data: RunData, sched: Schedule) -> list[r.Block]:
    out: list[r.Block] = [r.Heading(2, "Per-concurrency schedule")]
    if not sched.entries:
        return out + [r.Para("No level has a usable measurement.")]
    rows = []
    for e in sched.entries:
        gain = pct_gain(e.gain) if e.gain else "-"
        if e.within_noise:
            gain += f" (within noise, {band_pct(data.level_bands.get(e.c, data.band))})"
        emitted = next((x for x in sched.chain if x.c == e.c), None)
        rows.append((f"C={e.c}", data.label(e.config.params), fmt_tok(e.tok_s), gain,
                     "-" if emitted is None else "no speculation" if emitted.steps == 0
                     else f"steps={emitted.steps}"))
    out.append(r.Para("For each measured concurrency level, the measured configuration with "
                      "the highest median tokens/s there (feasible, not suspect; the baseline "
                      "counts), its gain over the recommended static config at that level, and "
                      "the steps the emitted schedule uses there (the static config's where "
                      "the gain is within noise; a chain, topk = 1, since servers switch only "
                      "steps)."))
    out.append(r.Table(("level", "best measured config", "tok/s", "vs static best",
                        "emitted"), tuple(rows)))
    if sched.withheld:
        return out + [r.Para(sched.withheld + ": no schedule file is written and no "
                             "validation trial boots one.")]
    if sched.notes:
        out.append(r.Bullets(sched.notes))
    if sched.ask is None:      # no file emitted (the notes say why): nothing to validate
        return out
    out += validation.blocks(data, sched.slots)
    for f in sched.files:      # each engine's file, as its backend wrote it
        out.append(r.Heading(3, f.title))
        out.append(r.Para(f.about))
        if f.content is not None:
            out.append(r.Code(schedule_json(f.content), "json"))
            if f.command:
                out.append(r.Code(f.command, "sh"))
    return out


def blocks(data: RunData, rec: Recommendation, verdicts: Sequence[AxisVerdict],
           sched: Schedule, figures: Sequence[Figure], summary: Sequence[str]
           ) -> list[r.Block]:
    """The whole report in order: the summary and where the figures come from, the
    recommendation, the schedule, the plateau verdicts, the figures, the predictions, the
    trials and how the figures are computed."""
    out = _head_blocks(data, summary)
    out += _recommendation_blocks(data, rec)
    out += _schedule_blocks(data, sched)
    out += _verdicts_section(data, verdicts)
    out.append(r.Heading(2, "Figures"))
    if not figures:
        out.append(r.Para("No figure: nothing usable was measured."))
    out += [r.Image(f.name, f.title, f.caption) for f in figures]
    out += predictions.blocks(data)
    out += trials.blocks(data)
    out += _method_blocks(data.experiment)
    return out


def _head_blocks(data: RunData, summary: Sequence[str]) -> list[r.Block]:
    """The title, the ten-second summary and where the figures come from."""
    exp = data.experiment
    out: list[r.Block] = [r.Heading(1, f"Speculative-decoding report: {data.name}")]
    out.append(r.Bullets(tuple(summary)))
    src = f"run dir `{data.run_dir}`"
    if exp is not None:
        src += f"; experiment `{exp.name}` on backend `{exp.backend.kind}`"
        if exp.backend.kind == "sim":
            src += (" (the embedded simulator: figures come from its performance model, not "
                    "from a real server)")
    else:
        src += f"; {data.experiment_note}"
    out.append(r.Para(src + "."))
    return out


def _recommendation_blocks(data: RunData, rec: Recommendation) -> list[r.Block]:
    """The best static config, its launch command and its figures per level."""
    out: list[r.Block] = [r.Heading(2, "Recommendation")]
    if rec.config is None:
        out.append(r.Para("No feasible configuration was measured."))
        return out
    best = rec.config
    out.append(r.Para(
        f"Best static config for the objective (highest median - spread of its "
        f"scores over {best.n} measurement(s), suspect trials left out): "
        f"`{data.label(best.params)}`, score {best.robust.median:+.3f} "
        f"({pct(best.robust.median)} weighted vs no speculation: {rec.vs_baseline})."))
    if rec.command:
        out.append(r.Code(rec.command, "sh"))
    else:
        out.append(r.Para(rec.command_note + "."))
    rows = tuple((f"C={row.c}", fmt_tok(row.tok_s),
                  f"+-{row.precision:.1%}" if row.precision is not None else "-",
                  f"{fmt_tok(row.lo)} - {fmt_tok(row.hi)}" if row.n > 1 else "-", str(row.n),
                  fmt_tok(row.base), _x(row.speedup),
                  f"{row.accept:.2f}" if row.accept is not None else "-",
                  f"{row.level_s:.0f}" if row.level_s is not None else "-")
                 for row in rec.rows)
    out.append(r.Table(("level", "tok/s (median)", "known to (95%)", "min - max", "n",
                        "baseline tok/s", "speedup", "accept length", "level s"), rows))
    missing = [f"C={row.c}: {row.accept_why}" for row in rec.rows if row.accept_why]
    if missing:
        out.append(r.Para("Acceptance not read: " + "; ".join(missing) + "."))
    ru = runner_up_line(data, rec)
    if ru:
        out.append(r.Para(ru[0].upper() + ru[1:] + "."))
    return out


def _verdicts_section(data: RunData, verdicts: Sequence[AxisVerdict]) -> list[r.Block]:
    """Each axis's verdict, then which plateau questions a boot or the model answered."""
    out: list[r.Block] = [r.Heading(2, "Plateau verdicts")]
    out.append(r.Para(
        f"From the measured data, per ordinal parameter that varied. Curves use the best "
        f"configuration at each value (like with like when other settings vary); differences "
        f"are between medians over repeats; {band_text(data)}; a difference inside it is "
        f"\"within noise\", never a win."))
    if not verdicts:
        out.append(r.Para("No ordinal parameter took two values among usable configs."))
    for v in verdicts:
        out += _verdict_blocks(data, v)
    out += _question_blocks(data)
    return out


def _method_blocks(exp: Experiment | None) -> list[r.Block]:
    """How the figures are computed: the score, the robust score, the levels, the noise band
    and the verdicts' terms."""
    out: list[r.Block] = [r.Heading(2, "How the figures are computed")]
    out.append(r.Bullets((
        ("Score of a trial: the weighted mean over concurrency levels of log(tok/s / baseline "
         "tok/s at that level), weights from the experiment's objective; 0 is the baseline, "
         "+0.10 is about +10%." if exp is None or exp.objective.kind != "goodput" else
         "Score of a trial: the weighted mean over concurrency levels of log(good requests/s "
         "/ the baseline's at that level) (goodput objective: see the levels section); 0 is "
         "the baseline."),
        ("Robust score of a configuration: median - spread over its repeats (vLLM's tuner "
         "ranks by median - 1.4826 * MAD); the spread is 1.4826 * MAD shrunk towards half the "
         f"noise band, which counts as {PRIOR_DOF} residual degrees of freedom against the "
         "repeats' n - 1, so a configuration measured once carries the pooled spread, not "
         "none; suspect trials (telemetry flags, errors during a level) are left out."),
        measure_text(exp),
        ("Noise band: two pooled standard deviations of repeated scores around their medians "
         "(objective.noise_band); each level's band uses the repeats' log tok/s at that level."),
        ("Verdict terms: a plateau is adjacent values within the band of the best; a peak is a "
         "plateau (or best value) with a worse value beyond it; escaped: a flat run left "
         "behind by a value better than it by more than the band."),
    )))
    return out
