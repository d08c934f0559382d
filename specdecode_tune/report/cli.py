"""`python -m specdecode_tune.report RUN_DIR [--out DIR] [--experiment FILE]`.

Prints the ten-second summary and where the report went. A missing or empty run dir, or a bad
experiment file, is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..config import load_experiment
from ..errors import ConfigError
from . import default_out_dir, write_report_from
from .data import RunDirError, read_run


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m specdecode_tune.report",
        description="Write the report of a search run: figures, plateau verdicts, the "
                    "recommended launch command and a per-concurrency schedule.")
    ap.add_argument("run_dir", help="the run dir (a local path or a pyarrow.fs URI)")
    ap.add_argument("--out", default=None,
                    help="local folder for the report (default: RUN_DIR/report; for a URI "
                         "run dir, a folder under the system temp dir)")
    ap.add_argument("--experiment", default=None,
                    help="experiment TOML (default: RUN_DIR/experiment.toml, which the search "
                         "writes)")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        exp = load_experiment(args.experiment) if args.experiment else None
        data = read_run(args.run_dir, exp)
    except (RunDirError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = write_report_from(data, args.out or default_out_dir(args.run_dir))
    for line in out.summary_lines:
        print(line)
    print(f"report: {out.path}")
    print(f"html:   {out.html_path}")
    for path in out.figures + out.schedule_paths:
        print(f"        {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
