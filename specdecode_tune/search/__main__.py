"""`python -m specdecode_tune.search`: the search's command (`cli`)."""

import sys

from .cli import main

sys.exit(main())
