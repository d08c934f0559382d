"""`python -m specdecode_tune.testing.eagle3`: see `specdecode_tune.testing.eagle3.cli`."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
