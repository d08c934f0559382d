"""A model folder written whole or not at all (the test-model tools' one way to write one)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def whole_folder(out: Path) -> Iterator[Path]:
    """Yield a temporary folder beside `out`; when the block ends without an exception it
    replaces `out` (an older `out` is removed), else it is removed and `out` stays as it was.
    The folder is made readable by all: mkdtemp makes it private, a model folder is for
    reading."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".", suffix=".tmp"))
    try:
        yield tmp
        tmp.chmod(0o755)
        if out.exists():
            old = out.with_name(out.name + ".old")
            os.replace(out, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
