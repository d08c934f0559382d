"""`python -m specdecode_tune.testing.models`: see `specdecode_tune.testing.models.cli`."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
