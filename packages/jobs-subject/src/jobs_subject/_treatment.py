"""What the erase does to a table's rows of the subject: delete, retain, or anonymise them.

``Treatment.DELETE`` removes the rows. ``Treatment.RETAIN("why")`` keeps them (they are
exported, never erased): the reason is recorded in the plan and the erase's result, because a
kept row of an erased person is a decision someone must be able to point at.
``Treatment.ANONYMIZE({"column": value, ...})`` keeps the rows with those columns overwritten,
``None`` for NULL. Whether a treatment can apply to its table (a NOT NULL column set to NULL, a
kept row under a RESTRICT key) is decided against the catalog when a run plans, not here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, time
from decimal import Decimal
from types import MappingProxyType
from typing import Any, ClassVar, Literal
from uuid import UUID

from jobs_core.errors import SubjectTreatmentInvalidError

Kind = Literal["delete", "retain", "anonymize"]

_VALUE_TYPES = (str, int, float, Decimal, bool, date, datetime, time, UUID)


@dataclass(frozen=True, slots=True, eq=True)
class Treatment:
    """A table's (or a target's) treatment under the erase; build one through the class members.

    Attributes:
        kind: ``"delete"``, ``"retain"`` or ``"anonymize"``.
        reason: why rows are kept (``RETAIN`` only).
        values: ``{column: value}`` written over the rows (``ANONYMIZE`` only).
    """

    DELETE: ClassVar[Treatment]
    """Remove the rows (children first, so no key refuses it)."""

    kind: Kind
    reason: str | None = None
    values: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    __hash__ = None  # type: ignore[assignment]

    @staticmethod
    def RETAIN(reason: str) -> Treatment:
        """Keep the rows: exported, never erased.

        Args:
            reason: why, non-empty text (``"legal hold, 10 years"``); shown in the plan and
                recorded in the erase's result.

        Raises:
            SubjectTreatmentInvalidError: ``X_SUBJECT_TREATMENT_INVALID`` for an empty reason.
        """
        if not isinstance(reason, str) or not reason.strip():
            raise SubjectTreatmentInvalidError(
                "Treatment.RETAIN(reason): the reason must be non-empty text saying why the rows "
                "are kept",
                problems=["RETAIN needs a reason"],
            )
        return Treatment("retain", reason=reason)

    @staticmethod
    def ANONYMIZE(values: Mapping[str, Any]) -> Treatment:
        """Keep the rows with ``values`` written over them.

        Args:
            values: ``{column: value}``, at least one; a value is ``None`` (NULL), text, a
                number, a bool, a date, time or datetime, or a UUID; it is cast to the column's
                type by the database.

        Raises:
            SubjectTreatmentInvalidError: ``X_SUBJECT_TREATMENT_INVALID`` for no values, a
                column name that is not text, or a value of another kind (named by its type,
                never quoted).
        """
        problems: list[str] = []
        if not isinstance(values, Mapping) or not values:
            problems.append("ANONYMIZE needs at least one {column: value}")
        else:
            for column, value in values.items():
                if not isinstance(column, str) or not column:
                    problems.append(f"a column name must be non-empty text, got {column!r}")
                elif _value_problem(value) is not None:
                    problems.append(f"{column}: {_value_problem(value)}")
        if problems:
            raise SubjectTreatmentInvalidError(
                "Treatment.ANONYMIZE(values): " + "; ".join(problems), problems=problems
            )
        return Treatment("anonymize", values=MappingProxyType(dict(values)))

    @property
    def deletes(self) -> bool:
        """Whether the erase removes the rows."""
        return self.kind == "delete"

    def describe(self) -> dict[str, Any]:
        """Answer the JSON form the plan and the erase's record show."""
        shown: dict[str, Any] = {"treatment": self.kind}
        if self.kind == "retain":
            shown["reason"] = self.reason
        if self.kind == "anonymize":
            shown["anonymize"] = sorted(self.values)
        return shown

    def __repr__(self) -> str:
        if self.kind == "retain":
            return f"Treatment.RETAIN({self.reason!r})"
        if self.kind == "anonymize":
            return f"Treatment.ANONYMIZE({sorted(self.values)!r} columns)"
        return "Treatment.DELETE"


Treatment.DELETE = Treatment("delete")


def _value_problem(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, _VALUE_TYPES):
        return f"a {type(value).__name__} cannot be written to a column"
    if isinstance(value, float) and not math.isfinite(value):
        return "a NaN or infinite float cannot be written"
    if isinstance(value, str) and "\x00" in value:
        return "text holding NUL (U+0000) cannot be written to PostgreSQL"
    return None


__all__ = ["Kind", "Treatment"]
