"""Objects as files under one directory.

A key ``a/b/c.csv`` is the file ``<root>/a/b/c.csv``; :func:`~jobs_import_export._storage.
check_key` has already refused ``..``, absolute keys and empty segments, so no key reaches
outside the root. A put writes a temporary file beside its target, flushes it to disk and renames
it over the target (``os.replace``, atomic on POSIX), so a reader, or a crash, never sees half a
part. Temporary names start with ``.tmp-``, which no ``part-*`` or ``errors-*`` glob matches.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from jobs_core.errors import StorageNotFoundError
from jobs_import_export._storage import check_key

TEMP_PREFIX = ".tmp-"
"""How a put's temporary file is named before its rename (never matched by ``part-*``)."""


class LocalStorage:
    """A directory as an object store; both an :class:`ImportSource` and an :class:`ExportSink`.

    Args:
        root: the directory keys resolve under; created (with parents) at the first put.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path(self, key: str) -> Path:
        """Answer the file that holds ``key``.

        Raises:
            StorageKeyInvalidError: ``X_STORAGE_KEY_INVALID`` for an unsafe key.
        """
        return self.root.joinpath(*check_key(key).split("/"))

    def size(self, key: str) -> int:
        """Answer the file's length in bytes.

        Raises:
            StorageNotFoundError: ``X_STORAGE_NOT_FOUND`` when the file does not exist.
        """
        try:
            return self.path(key).stat().st_size
        except FileNotFoundError:
            raise StorageNotFoundError("no file under that key in the local root") from None

    def read_range(self, key: str, start: int, length: int) -> bytes:
        """Answer up to ``length`` bytes of the file from offset ``start``.

        Raises:
            StorageNotFoundError: ``X_STORAGE_NOT_FOUND`` when the file does not exist.
        """
        try:
            with self.path(key).open("rb") as f:
                f.seek(start)
                return f.read(length)
        except FileNotFoundError:
            raise StorageNotFoundError("no file under that key in the local root") from None

    def put(self, key: str, data: bytes) -> None:
        """Write ``data`` to the key's file atomically (temporary file, fsync, rename)."""
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=target.parent, prefix=TEMP_PREFIX, suffix=".part")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                # Durable before it is visible: a crash after the rename never leaves an empty
                # file under the final name.
                os.fsync(f.fileno())
            os.replace(temp, target)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise


def local_source(root: str | os.PathLike[str]) -> LocalStorage:
    """Answer an :class:`ImportSource` reading files under the directory ``root``."""
    return LocalStorage(root)


def local_sink(root: str | os.PathLike[str]) -> LocalStorage:
    """Answer an :class:`ExportSink` writing files under the directory ``root`` atomically."""
    return LocalStorage(root)


__all__ = ["TEMP_PREFIX", "LocalStorage", "local_sink", "local_source"]
