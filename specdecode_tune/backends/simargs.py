"""The simulator's pre-flight: its own command line, run with `--check-args`, says what every
boot would refuse (unknown flags, bad values, a fault spec, a profile, an unset API-key
variable), before anything is started.

`python -m specdecode_tune.sim --check-args ARGS...` validates ARGS exactly as a boot would and
exits 0, or 2 with one line on stderr, `error: MESSAGE`, MESSAGE being one of
    the simulator does not know the argument(s) ARGS
    the simulator refuses its arguments: WHY
    --api-key-env NAME: that environment variable is not set or empty
    WHY the profile cannot be loaded, in the profile reader's words
(the simulator's CLI documents the same forms). This module runs it with this interpreter, the
one whose packages a local cluster's trials use, and turns the line into the pre-flight's
ConfigError, naming where in the experiment the arguments come from.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

from ..errors import ConfigError

CHECK_FLAG = "--check-args"
TIMEOUT_S = 60.0
_UNKNOWN = "the simulator does not know the argument(s) "
_REFUSED = "the simulator refuses its arguments: "
_API_KEY_ENV = "--api-key-env "


def check(module: str, args: Sequence[str]) -> None:
    """ConfigError, one line, where the simulator (`python -m module`) would refuse the server
    arguments `args`."""
    try:
        out = subprocess.run([sys.executable, "-m", module, CHECK_FLAG, *args],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(f"backend: the simulator's argument check did not run: {e}") from None
    if out.returncode == 0:
        return
    lines = [ln.strip() for ln in out.stderr.splitlines() if ln.strip()]
    line = lines[-1] if lines else f"exit status {out.returncode}"
    if out.returncode != 2 or len(lines) != 1 or not line.startswith("error: "):
        raise ConfigError(f"backend: the simulator's argument check failed "
                          f"(exit status {out.returncode}): {line}")
    raise ConfigError(message(line.removeprefix("error: ")))


def message(problem: str) -> str:
    """The pre-flight's words for the check's MESSAGE: where the arguments came from."""
    if problem.startswith(_UNKNOWN):
        return f"backend: {problem} (from backend.flags or backend.extra_args)"
    if problem.startswith(_REFUSED):
        return f"backend: {problem}"
    if problem.startswith(_API_KEY_ENV):
        return f"backend.extra_args: {problem}"
    return problem
