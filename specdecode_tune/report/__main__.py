"""`python -m specdecode_tune.report`: see `specdecode_tune.report.cli`."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
