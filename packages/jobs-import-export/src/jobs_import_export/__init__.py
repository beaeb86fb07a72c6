"""jobs-import-export: exports to object storage and imports from it, as jobs.

:func:`export_rows` streams a paged read to a sink, one ``part-NNNNN`` object per page and a
``manifest.json`` last; :func:`import_rows` reads one object a page at a time through a pydantic
schema into the app's ``handle``, refused rows reported to an :class:`ErrorSink`. Both are
factories over :func:`jobs_core.job`: each page is a step, so a killed run resumes at the last
checkpoint, and memory holds one page, not the file.

Storage is two small protocols, :class:`ImportSource` (``size``, ``read_range``) and
:class:`ExportSink` (``put``), with S3 (:func:`s3_source`, :func:`s3_sink`), local directory
(:func:`local_source`, :func:`local_sink`) and in-memory (:func:`memory_source`,
:func:`memory_sink`) implementations; :func:`encode_records` writes one part's bytes as the
exports do, for other packages' exports through the same sinks.
"""

from jobs_core.errors import (
    ExportPartTooLargeError,
    ExportRowInvalidError,
    ImportHeaderMismatchError,
    ImportRecordTooLargeError,
    ImportSourceChangedError,
    ImportTooManyErrorsError,
    StorageKeyInvalidError,
    StorageNotFoundError,
)
from jobs_import_export._csv import FORMULA_TRIGGERS
from jobs_import_export._encode import encode_records
from jobs_import_export._export import ExportReport, PageReader, export_rows
from jobs_import_export._import import ErrorSink, ImportReport, import_rows
from jobs_import_export._import_page import REFUSALS
from jobs_import_export._local import LocalStorage, local_sink, local_source
from jobs_import_export._memory import MemoryStorage, memory_sink, memory_source
from jobs_import_export._s3 import S3Storage, s3_sink, s3_source
from jobs_import_export._storage import ExportSink, ImportSource, check_key

__version__ = "0.1.0"

__all__ = [
    "FORMULA_TRIGGERS",
    "REFUSALS",
    "ErrorSink",
    "ExportPartTooLargeError",
    "ExportReport",
    "ExportRowInvalidError",
    "ExportSink",
    "ImportHeaderMismatchError",
    "ImportRecordTooLargeError",
    "ImportReport",
    "ImportSource",
    "ImportSourceChangedError",
    "ImportTooManyErrorsError",
    "LocalStorage",
    "MemoryStorage",
    "PageReader",
    "S3Storage",
    "StorageKeyInvalidError",
    "StorageNotFoundError",
    "check_key",
    "encode_records",
    "export_rows",
    "import_rows",
    "local_sink",
    "local_source",
    "memory_sink",
    "memory_source",
    "s3_sink",
    "s3_source",
]
