"""The two storage seams: :class:`ImportSource` reads by byte range, :class:`ExportSink` writes.

They are deliberately tiny so that any object store, a filesystem, or an app's own storage layer
can stand behind them with a few lines, and so that other packages (jobs-subject's exports) write
through the same sinks. Both are synchronous: every call the factories make runs in a worker
thread, so a blocking client (boto3, plain files) never stalls the event loop, and an async store
wraps itself with ``asyncio.run_coroutine_threadsafe`` in a few lines. An async protocol was
rejected: boto3, the client the spec names, is blocking, and every implementation here would be
a thread hop wearing an ``async`` costume.

Keys are ``/``-separated text checked by :func:`check_key` before any implementation sees them,
so a key built from an input can never climb out of a local root or address a bucket's root.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from jobs_core.errors import StorageKeyInvalidError
from jobs_import_export._untrusted import shown

MAX_KEY_BYTES = 1024
"""The longest key accepted, in UTF-8 bytes (S3's limit)."""


@runtime_checkable
class ImportSource(Protocol):
    """Where an import reads its object from, a byte range at a time.

    Implementations: :func:`~jobs_import_export.s3_source`,
    :func:`~jobs_import_export.local_source`, :func:`~jobs_import_export.memory_source`.
    Both methods are called from a worker thread and may block.
    """

    def size(self, key: str) -> int:
        """Answer the object's length in bytes.

        Raises:
            StorageNotFoundError: ``X_STORAGE_NOT_FOUND`` when there is no such object.
        """
        ...

    def read_range(self, key: str, start: int, length: int) -> bytes:
        """Answer ``length`` bytes from byte ``start`` (0-based), fewer only at the object's end.

        Args:
            key: the object's key (already checked by :func:`check_key`).
            start: the first byte's offset, ``>= 0``.
            length: how many bytes, ``>= 1``.

        Raises:
            StorageNotFoundError: ``X_STORAGE_NOT_FOUND`` when there is no such object.
        """
        ...


@runtime_checkable
class ExportSink(Protocol):
    """Where an export (or an import's error report) writes its objects.

    ``put`` replaces the whole object and must be atomic: a reader sees the old object or the new
    one, never a torn write (S3 puts are; :func:`~jobs_import_export.local_sink` writes a
    temporary file and renames it). It must also be idempotent: a page that runs twice after a
    crash puts the same key again. Called from a worker thread; may block.
    """

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, replacing any object already there.

        Args:
            key: the object's key (already checked by :func:`check_key`).
            data: the object's bytes.
        """
        ...


def check_key(key: object, *, what: str = "key") -> str:
    """Answer ``key`` when it is a safe object key; raise otherwise.

    A safe key is non-empty text of at most 1,024 UTF-8 bytes, made of ``/``-separated segments
    that are neither empty nor ``.`` nor ``..``, with no control character (so no NUL, tab or
    newline) and no backslash.

    Args:
        key: the candidate.
        what: how the message names it (``"key"``, ``"prefix"``).

    Raises:
        StorageKeyInvalidError: ``X_STORAGE_KEY_INVALID``, naming the rule broken; the key is
            shown escaped and cut, since it may come from an input.
    """
    problem = _key_problem(key)
    if problem is not None:
        rendered = shown(key) if isinstance(key, str) else type(key).__name__
        raise StorageKeyInvalidError(f"{what} {rendered}: {problem}", rule=problem)
    assert isinstance(key, str)
    return key


def join_key(*parts: str) -> str:
    """Join key parts with ``/`` (each part's own leading and trailing ``/`` dropped) and check it.

    Raises:
        StorageKeyInvalidError: ``X_STORAGE_KEY_INVALID`` as :func:`check_key`.
    """
    return check_key("/".join(part.strip("/") for part in parts))


def _key_problem(key: object) -> str | None:
    if not isinstance(key, str):
        return "must be text"
    if not key:
        return "must not be empty"
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        return f"longer than {MAX_KEY_BYTES} bytes"
    if any(ord(ch) < 0x20 or ch == "\x7f" for ch in key):
        return "contains a control character"
    if "\\" in key:
        return "contains a backslash"
    if any(segment in ("", ".", "..") for segment in key.split("/")):
        return "has an empty, '.' or '..' segment (or starts or ends with '/')"
    return None


__all__ = ["MAX_KEY_BYTES", "ExportSink", "ImportSource", "check_key", "join_key"]
