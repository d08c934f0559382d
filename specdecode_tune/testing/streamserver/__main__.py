"""`python -m specdecode_tune.testing.streamserver`: see its `cli` module."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
