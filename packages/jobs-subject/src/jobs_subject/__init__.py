"""jobs-subject: one person's data exported or erased, planned from the database's foreign keys.

Declare the person once with :func:`define_subject` (their table and key, a
:class:`Treatment` for each table that hangs off them, their :class:`SubjectTarget` s), then
declare the jobs: :func:`subject_export` writes everything of one subject to an ``ExportSink``,
:func:`subject_erase` erases it. Every run reads ``pg_catalog`` when it starts and plans with
:func:`plan_subject` (pure): a table that references the subject and has no treatment, a
treatment the database would defeat, or a loop that cannot be broken is refused before a row is
touched. Erases run children first, a page of parent keys per durable step, so a killed worker's
run resumes where it stopped.
"""

from jobs_core.errors import (
    SubjectCycleError,
    SubjectDeclarationInvalidError,
    SubjectEraseBlockedError,
    SubjectTableUndeclaredError,
    SubjectTreatmentInvalidError,
)
from jobs_subject._catalog import (
    Catalog,
    Column,
    ForeignKey,
    Table,
    TableName,
    key_path,
    read_catalog,
)
from jobs_subject._erase import (
    MAX_FRESH_ROUNDS,
    ErasedTables,
    EraseRecord,
    StepRunner,
    subject_erase,
    subject_erase_tables,
)
from jobs_subject._export import ExportRecord, subject_export
from jobs_subject._plan import Clear, Plan, PlannedTable, SubjectSpec, plan_subject
from jobs_subject._subject import DEFAULT_BATCH, SUBJECTS, Subject, define_subject
from jobs_subject._target import SubjectTarget, TargetEntry, TargetPage
from jobs_subject._treatment import Treatment

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_BATCH",
    "MAX_FRESH_ROUNDS",
    "SUBJECTS",
    "Catalog",
    "Clear",
    "Column",
    "EraseRecord",
    "ErasedTables",
    "ExportRecord",
    "ForeignKey",
    "Plan",
    "PlannedTable",
    "StepRunner",
    "Subject",
    "SubjectCycleError",
    "SubjectDeclarationInvalidError",
    "SubjectEraseBlockedError",
    "SubjectSpec",
    "SubjectTableUndeclaredError",
    "SubjectTarget",
    "SubjectTreatmentInvalidError",
    "Table",
    "TableName",
    "TargetEntry",
    "TargetPage",
    "Treatment",
    "define_subject",
    "key_path",
    "plan_subject",
    "read_catalog",
    "subject_erase",
    "subject_erase_tables",
    "subject_export",
]
