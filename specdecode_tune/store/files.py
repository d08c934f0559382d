"""Files on any filesystem: a local path or a URI to a `pyarrow.fs` filesystem, written atomically.

`filesystem(target)` turns a local path or any URI `pyarrow.fs` understands (file://, s3://,
gs://, ...) into (filesystem, path inside it), so that every node of a cluster can write to the
same place.

`write_atomic(fs, path, data)` is the package's one atomic write (tables, the experiment's
copy, pidfiles, the driver's record, the report's files). The data is complete in memory first;
then, on a filesystem with a rename (local disk, file:// URIs, ...), it goes to a hidden
temporary file in the same folder (`.<name>.tmp-<pid>-<random>`), which is renamed over the
final name: a reader sees the old file or the new one, never half of one. Locally the file and
then its folder are fsync'ed, so that what a measured level cost minutes of GPU time to get
survives a crash. On object stores (S3, GCS, Azure) a single put is already all-or-nothing and a
rename would be a copy, so the object is put directly. Either way a killed writer leaves at most
a hidden temporary file, which every reader of the package ignores.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from ..errors import ConfigError

# Object stores: a put is atomic and a rename is a copy, so write the final name directly.
_PUT_IS_ATOMIC = frozenset({"s3", "gcs", "abfs"})


def is_uri(target: str | os.PathLike[str]) -> bool:
    """Whether `target` is a URI (`scheme://...`) rather than a local path."""
    return "://" in os.fspath(target)


def filesystem(target: str | os.PathLike[str]) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a local path (made absolute) or a URI."""
    text = os.fspath(target)
    if is_uri(text):
        fs, path = pafs.FileSystem.from_uri(text)
    else:
        fs, path = pafs.LocalFileSystem(), os.path.abspath(text)
    return fs, path.rstrip("/") or "/"


def check_writable(flag: str, value: str, target: str) -> None:
    """ConfigError, one line naming `flag` and `value`, unless the run dir `target` (a local
    path or a URI) can be written: a URI `pyarrow.fs` understands, or a local path whose nearest
    existing folder takes a new folder. That is tried (a hidden folder made and removed at
    once), since permission bits do not say it: root may write anywhere by them, and /proc or a
    read-only mount refuse all the same. Nothing is left behind."""
    if is_uri(target):
        try:
            pafs.FileSystem.from_uri(target)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types here
            raise ConfigError(f"{flag} {value!r}: not a storage URI pyarrow.fs understands "
                              f"({str(e).splitlines()[0]})") from None
        return
    path = os.path.abspath(target)
    folder = path
    while not os.path.lexists(folder):
        folder = os.path.dirname(folder)
    problem = None
    if not os.path.isdir(folder):
        problem = f"{folder} is not a folder"
    else:
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".specdecode-probe-", dir=folder))
        except OSError as e:
            problem = f"{folder} takes no new folder: {e.strerror or e}"
    if problem is not None:
        raise ConfigError(f"{flag} {value!r}: not writable (the run dir {path} cannot be "
                          f"created there: {problem}); give a folder this user can write")


def _fsync(path: str, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(fs: pafs.FileSystem, path: str, data: bytes | pa.Buffer) -> str:
    """Write `data` to `path` on `fs` atomically (see the module doc), creating its folder.
    Returns `path`."""
    parent, name = path.rsplit("/", 1)
    fs.create_dir(parent, recursive=True)
    if fs.type_name in _PUT_IS_ATOMIC:
        with fs.open_output_stream(path) as out:
            out.write(data)
        return path
    tmp = f"{parent}/.{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    local = isinstance(fs, pafs.LocalFileSystem)
    try:
        with fs.open_output_stream(tmp) as out:
            out.write(data)
        if local:
            _fsync(tmp)
        fs.move(tmp, path)         # rename(2) locally: replaces the old file atomically
        if local:
            _fsync(parent, directory=True)
    except BaseException:
        try:
            fs.delete_file(tmp)
        except OSError:
            pass
        raise
    return path


def write_file(target: str | os.PathLike[str], data: bytes | str) -> str:
    """Write `data` (str as UTF-8) atomically to a local path or a URI; returns `target` as
    given."""
    fs, path = filesystem(target)
    write_atomic(fs, path, data.encode("utf-8") if isinstance(data, str) else data)
    return os.fspath(target)


def write_json(target: str | os.PathLike[str], value: Any) -> str:
    """`value` as JSON with sorted keys, written atomically (`write_file`)."""
    return write_file(target, json.dumps(value, sort_keys=True))


__all__ = ["filesystem", "is_uri", "write_atomic", "write_file", "write_json"]
