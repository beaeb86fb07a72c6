"""Objects in a dict: the source and sink for tests and demos."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from jobs_core.errors import StorageNotFoundError
from jobs_import_export._storage import check_key


class MemoryStorage:
    """An in-process object store; both an :class:`ImportSource` and an :class:`ExportSink`.

    Thread-safe (the factories call it from worker threads). Objects live as long as the instance:
    share one instance between the job's thunk and the test, e.g.
    ``store = memory_sink(); export_rows(..., sink=lambda: store)``.

    Args:
        objects: initial objects, ``{key: bytes}`` (copied).
    """

    def __init__(self, objects: Mapping[str, bytes] | None = None) -> None:
        self._lock = threading.Lock()
        self._objects: dict[str, bytes] = {}
        for key, data in (objects or {}).items():
            self._objects[check_key(key)] = bytes(data)

    def size(self, key: str) -> int:
        """Answer the object's length in bytes.

        Raises:
            StorageNotFoundError: ``X_STORAGE_NOT_FOUND``.
        """
        return len(self._get(key))

    def read_range(self, key: str, start: int, length: int) -> bytes:
        """Answer up to ``length`` bytes from offset ``start``.

        Raises:
            StorageNotFoundError: ``X_STORAGE_NOT_FOUND``.
        """
        return self._get(key)[start : start + length]

    def put(self, key: str, data: bytes) -> None:
        """Store a copy of ``data`` under ``key`` (replacing it)."""
        copied = bytes(data)
        with self._lock:
            self._objects[check_key(key)] = copied

    def get(self, key: str) -> bytes:
        """Answer the whole object (tests read exports back with it).

        Raises:
            StorageNotFoundError: ``X_STORAGE_NOT_FOUND``.
        """
        return self._get(key)

    def keys(self, prefix: str = "") -> list[str]:
        """Answer the keys starting with ``prefix``, sorted."""
        with self._lock:
            return sorted(key for key in self._objects if key.startswith(prefix))

    def _get(self, key: str) -> bytes:
        with self._lock:
            found = self._objects.get(key)
        if found is None:
            raise StorageNotFoundError("no object under that key in the memory store")
        return found


def memory_source(objects: Mapping[str, bytes] | MemoryStorage | None = None) -> MemoryStorage:
    """Answer an in-memory :class:`ImportSource`.

    Args:
        objects: ``{key: bytes}`` to import from, or an existing :class:`MemoryStorage` (answered
            as it is, so an export's sink can be imported back).
    """
    if isinstance(objects, MemoryStorage):
        return objects
    return MemoryStorage(objects)


def memory_sink() -> MemoryStorage:
    """Answer an empty in-memory :class:`ExportSink` (read it back with ``get``/``keys``)."""
    return MemoryStorage()


__all__ = ["MemoryStorage", "memory_sink", "memory_source"]
