"""Targets: the subject's data that lives outside the database (an auth provider, a bucket).

A target is structural, as a purge target is: any object with ``name``, ``columns``,
``export_page`` and ``erase`` is one, so the package that owns the data ships its own
(an auth package's ``auth_subject_target``) without importing this one. Each call is handed the
subject's row read fresh from the database in that step, never a copy kept in a step's output:
a run's step outputs live as long as its job row, and the person's data must not.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Protocol, TypeAlias, runtime_checkable

from jobs_core.types import JSONValue
from jobs_subject._treatment import Treatment

TargetPage: TypeAlias = tuple[Sequence[Mapping[str, Any]], JSONValue]
"""What ``export_page`` answers: ``(rows, next_cursor)``, ``next_cursor`` ``None`` at the end."""


@runtime_checkable
class SubjectTarget(Protocol):
    """Where else the subject's data lives; exported page by page and erased once.

    Attributes:
        name: unique among the subject's targets; names its step and its export folder.
        columns: the columns of the rows ``export_page`` answers, in file order.

    Both methods may be coroutine functions; plain ones run in a worker thread. Both run at
    least once per step (a killed worker's step runs again), so make them idempotent.
    """

    name: str
    columns: Sequence[str]

    def export_page(
        self, subject: Mapping[str, Any], cursor: JSONValue
    ) -> TargetPage | Awaitable[TargetPage]:
        """Answer one page of this target's data about the subject.

        Args:
            subject: the subject's row (every column), read fresh for this step.
            cursor: ``None`` for the first page, then the ``next_cursor`` last answered
                (it is stored in the step's output, so it must be JSON and hold no personal
                data: an offset, an opaque token).

        Returns:
            ``(rows, next_cursor)``: rows of ``{column: value}``; ``next_cursor`` ``None``
            after the last page.
        """
        ...

    def erase(self, subject: Mapping[str, Any]) -> int | Awaitable[int | None] | None:
        """Erase everything this target holds about the subject.

        Args:
            subject: the subject's row (every column), read fresh for this step.

        Returns:
            How many records it erased, for the erase's record (``None`` if unknown).
        """
        ...


TargetEntry: TypeAlias = SubjectTarget | tuple[SubjectTarget, Treatment]
"""A ``targets=`` entry: a target (erased), or ``(target, Treatment.RETAIN("why"))`` (exported,
never erased)."""


__all__ = ["SubjectTarget", "TargetEntry", "TargetPage"]
