"""Objects in an S3 bucket (or any S3-compatible store: MinIO, R2, Ceph, moto) through boto3.

Reads are ranged GETs (``Range: bytes=start-end``), so an import holds one page of the object at a
time however large it is; writes are single PUTs, atomic by S3's own contract. The boto3 client is
made at the first call, not when the source or sink is built (a job's thunk builds one per
attempt and a declaration at import time must not dial anything), and from a session of its own:
boto3's default session is not safe to share between threads, the client it makes is.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from jobs_core.errors import StorageNotFoundError
from jobs_import_export._storage import check_key

_MISSING = frozenset({"404", "NoSuchKey", "NotFound"})


class S3Storage:
    """One bucket; both an :class:`ImportSource` and an :class:`ExportSink`.

    Args:
        bucket: the bucket name.
        client: a boto3 S3 client to use as it is (its endpoint and credentials are its own).
        endpoint_url: the store's URL, for S3-compatible stores (``http://127.0.0.1:9000``).
        region_name: the region (default: boto3's configuration chain).
        **client_options: anything else ``boto3.session.Session().client("s3", ...)`` takes
            (``aws_access_key_id``, ``config=botocore.config.Config(...)``, ...). Credentials
            default to boto3's chain (environment, profile, instance role).
    """

    def __init__(
        self,
        bucket: str,
        *,
        client: Any = None,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        **client_options: Any,
    ) -> None:
        if not isinstance(bucket, str) or not bucket:
            raise ValueError("bucket: must be a non-empty bucket name")
        self.bucket = bucket
        self._client_value = client
        self._options = {"endpoint_url": endpoint_url, "region_name": region_name}
        self._options.update(client_options)
        self._lock = threading.Lock()

    def client(self) -> Any:
        """Answer the boto3 client, making it at the first call."""
        with self._lock:
            if self._client_value is None:
                import boto3  # type: ignore[import-untyped]

                session = boto3.session.Session()
                self._client_value = session.client("s3", **self._options)
            return self._client_value

    def size(self, key: str) -> int:
        """Answer the object's ``ContentLength`` (a HEAD request).

        Raises:
            StorageNotFoundError: ``X_STORAGE_NOT_FOUND`` on a 404.
            botocore.exceptions.ClientError: any other refusal (retried by the job's policy).
        """
        with _not_found():
            answer = self.client().head_object(Bucket=self.bucket, Key=check_key(key))
        return int(answer["ContentLength"])

    def read_range(self, key: str, start: int, length: int) -> bytes:
        """Answer ``length`` bytes from ``start`` with one ranged GET (fewer at the end).

        Raises:
            StorageNotFoundError: ``X_STORAGE_NOT_FOUND`` on a 404.
            botocore.exceptions.ClientError: any other refusal (retried by the job's policy).
        """
        if length <= 0:
            return b""
        with _not_found():
            answer = self.client().get_object(
                Bucket=self.bucket, Key=check_key(key), Range=f"bytes={start}-{start + length - 1}"
            )
        body = answer["Body"]
        try:
            return bytes(body.read())
        finally:
            body.close()

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` with one PUT."""
        self.client().put_object(Bucket=self.bucket, Key=check_key(key), Body=data)


@contextmanager
def _not_found() -> Iterator[None]:
    """Turn a botocore 404 into :class:`StorageNotFoundError` (no key in the message)."""
    from botocore.exceptions import ClientError  # type: ignore[import-untyped]

    try:
        yield
    except ClientError as exc:
        if str(exc.response.get("Error", {}).get("Code", "")) in _MISSING:
            raise StorageNotFoundError("no object under that key in the bucket") from None
        raise


def s3_source(bucket: str, **options: Any) -> S3Storage:
    """Answer an :class:`ImportSource` reading ``bucket`` with ranged GETs.

    Args:
        bucket: the bucket name.
        **options: :class:`S3Storage`'s options (``endpoint_url=``, ``region_name=``, ``client=``,
            boto3 client keywords).
    """
    return S3Storage(bucket, **options)


def s3_sink(bucket: str, **options: Any) -> S3Storage:
    """Answer an :class:`ExportSink` writing to ``bucket`` with one PUT per object.

    Args:
        bucket: the bucket name.
        **options: :class:`S3Storage`'s options (``endpoint_url=``, ``region_name=``, ``client=``,
            boto3 client keywords).
    """
    return S3Storage(bucket, **options)


__all__ = ["S3Storage", "s3_sink", "s3_source"]
