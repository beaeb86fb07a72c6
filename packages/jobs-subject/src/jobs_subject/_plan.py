"""``plan_subject``: the reach, the order and every refusal, pure over a :class:`Catalog`.

The reach is a depth-first walk from the subject's table along the foreign keys that reference
it: a table reached through a key is the subject's when its treatment is declared, and the walk
goes on from it only when the erase deletes it (a kept row keeps its children's references
valid, so what hangs off it is not the subject's). A key that leads back to a table on the
current path closes a loop: it is not followed but *cleared* (its nullable columns set to NULL
where they point at the subject's rows) before anything is deleted, so the members of a team
the subject owns lose their team, not their account, and a reply to the subject's comment loses
its parent, not its text. Every other key the walk crossed is a *membership* key: a table's rows
of the subject are those that reference a row of the subject through one of them.

Order is children first (each table after every table whose membership keys reference it), the
subject's own row last, so no NO ACTION or RESTRICT key ever refuses a delete.

Every refusal is raised here, before a row is touched, as one error per code listing each
problem: ``X_SUBJECT_DECLARATION_INVALID`` (the subject's table, key or ``columns=``),
``X_SUBJECT_TABLE_UNDECLARED`` (a reached table without a treatment, with the key path that
reached it), ``X_SUBJECT_TREATMENT_INVALID`` (a treatment the database would defeat) and
``X_SUBJECT_CYCLE`` (a loop whose closing key cannot be cleared). The subject's table and key are
checked first, then undeclared tables, treatments, loops and last ``columns=``.

Rejected: following a loop-closing key (deleting every row it reaches). On a self-reference it
deletes other people's replies, and on users <-> teams every member of the subject's team: an
erasure that destroys other subjects' data.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from jobs_core.errors import (
    SubjectCycleError,
    SubjectDeclarationInvalidError,
    SubjectTableUndeclaredError,
    SubjectTreatmentInvalidError,
)
from jobs_subject._catalog import Catalog, ForeignKey, Table, TableName, key_path
from jobs_subject._treatment import Treatment


@dataclass(frozen=True, slots=True)
class PlannedTable:
    """One table of the plan.

    Attributes:
        table: the catalog's table.
        shown: its name as the plan shows it (``schema.name`` outside the subject's schema).
        treatment: what the erase does to its rows of the subject.
        keys: its membership keys (to the subject or to tables the erase deletes), in the order
            the walk found them; empty for the subject's own table.
        path: the first key path that reached it, from the subject.
        export_columns: the columns an export writes (``columns=`` or every column).
    """

    table: Table
    shown: str
    treatment: Treatment
    keys: tuple[ForeignKey, ...]
    path: tuple[ForeignKey, ...]
    export_columns: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Clear:
    """A loop-closing key, cleared before anything is deleted.

    Attributes:
        key: the foreign key.
        child: the referencing table (whose column values change).
        columns: the columns set to NULL (the key's nullable ones).
        path: the key path from the subject, ending with this key.
    """

    key: ForeignKey
    child: Table
    columns: tuple[str, ...]
    path: tuple[ForeignKey, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    """What a run does, read from the catalog when it starts.

    Attributes:
        subject: the subject's table.
        key: the subject's key columns.
        home: the subject's schema (tables there are shown unqualified).
        tables: every planned table, children first; the subject's table last.
        clears: the loop-closing keys, cleared before the tables.
    """

    subject: Table
    key: tuple[str, ...]
    home: str
    tables: tuple[PlannedTable, ...]
    clears: tuple[Clear, ...]

    def table(self, shown: str) -> PlannedTable:
        """Answer the planned table shown as ``shown`` (``KeyError`` if it is not planned)."""
        for planned in self.tables:
            if planned.shown == shown:
                return planned
        raise KeyError(shown)

    @property
    def order(self) -> list[str]:
        """The tables' shown names, children first."""
        return [planned.shown for planned in self.tables]

    def describe(self) -> dict[str, Any]:
        """Answer the plan as JSON (what ``jobsctl subject plan NAME --json`` prints)."""
        return {
            "subject": self.subject.name.shown(self.home),
            "schema": self.home,
            "key": list(self.key),
            "order": self.order,
            "tables": [
                {
                    "table": planned.shown,
                    **planned.treatment.describe(),
                    "path": key_path(planned.path, self.home),
                    "keys": [_key_json(fk, self.home) for fk in planned.keys],
                    "export_columns": list(planned.export_columns),
                }
                for planned in self.tables
            ],
            "clear": [
                {
                    "table": clear.child.name.shown(self.home),
                    "key": clear.key.name,
                    "columns": list(clear.columns),
                    "references": clear.key.parent.shown(self.home),
                    "path": key_path(clear.path, self.home),
                }
                for clear in self.clears
            ],
        }


def _key_json(fk: ForeignKey, home: str) -> dict[str, Any]:
    return {
        "key": fk.name,
        "columns": list(fk.columns),
        "references": fk.parent.shown(home),
        "referenced_columns": list(fk.parent_columns),
        "on_delete": fk.on_delete,
    }


class SubjectSpec(Protocol):
    """The parts of a declaration the planner reads (a :class:`~jobs_subject.Subject` is one).

    Attributes:
        table: the subject's table (``name`` or ``schema.name``).
        key: its key columns.
        schema: the schema unqualified names resolve in.
        tables: ``{table: Treatment}``.
        columns: ``{table: exported columns}``.
    """

    @property
    def table(self) -> str: ...

    @property
    def key(self) -> tuple[str, ...]: ...

    @property
    def schema(self) -> str: ...

    @property
    def tables(self) -> Mapping[str, Treatment]: ...

    @property
    def columns(self) -> Mapping[str, Sequence[str]]: ...


def resolve(name: str, home: str) -> TableName:
    """Answer the table ``name`` means: ``schema.table`` as written, else ``table`` in ``home``."""
    schema, dot, table = name.partition(".")
    return TableName(schema, table) if dot else TableName(home, name)


class _Walk:
    """One depth-first walk from the subject, collecting the plan's facts and its problems."""

    def __init__(self, catalog: Catalog, spec: SubjectSpec, subject: Table) -> None:
        self.catalog = catalog
        self.home = spec.schema
        self.subject = subject
        self.declared = {resolve(name, self.home): t for name, t in spec.tables.items()}
        self.subject_treatment = self.declared.get(subject.name, Treatment.DELETE)
        self.referencing: dict[TableName, list[ForeignKey]] = defaultdict(list)
        for fk in sorted(catalog.foreign_keys, key=lambda k: (k.child, k.name)):
            self.referencing[fk.parent].append(fk)
        self.keys: dict[TableName, list[ForeignKey]] = {subject.name: []}
        self.paths: dict[TableName, tuple[ForeignKey, ...]] = {subject.name: ()}
        self.loops: list[tuple[ForeignKey, tuple[ForeignKey, ...]]] = []
        self.undeclared: dict[TableName, tuple[ForeignKey, ...]] = {}
        self.invalid: list[str] = []
        self.on_path: set[TableName] = set()

    def treatment(self, name: TableName) -> Treatment | None:
        if name == self.subject.name:
            return self.subject_treatment
        return self.declared.get(name)

    def deleted(self, name: TableName) -> bool:
        treatment = self.treatment(name)
        return treatment is not None and treatment.deletes

    def walk(self, parent: TableName, path: tuple[ForeignKey, ...]) -> None:
        self.on_path.add(parent)
        for fk in self.referencing.get(parent, []):
            child = fk.child
            reach = (*path, fk)
            if child in self.on_path:
                if self.deleted(parent):
                    self.loops.append((fk, reach))
                continue
            treatment = self.treatment(child)
            if treatment is None:
                self.undeclared.setdefault(child, reach)
                continue
            first = child not in self.keys
            self.keys.setdefault(child, []).append(fk)
            self.paths.setdefault(child, reach)
            if not treatment.deletes:
                if self.deleted(parent):
                    self.check_kept(fk, treatment)
            elif first:
                self.walk(child, reach)
        self.on_path.discard(parent)

    def check_kept(self, fk: ForeignKey, treatment: Treatment) -> None:
        """Refuse a kept row whose key the parent's delete would break or act on."""
        child = self.catalog.tables[fk.child]
        shown = fk.child.shown(self.home)
        parent = fk.parent.shown(self.home)
        cleared = treatment.kind == "anonymize" and _clears(fk, treatment.values)
        if fk.on_delete in ("no action", "restrict", "cascade") and not cleared:
            action = fk.on_delete.upper()
            consequence = (
                f"deleting rows of {parent} would delete these rows too (ON DELETE CASCADE)"
                if fk.on_delete == "cascade"
                else f"deleting rows of {parent} would be refused (ON DELETE {action})"
            )
            fix = (
                "set the key to None in ANONYMIZE"
                if treatment.kind == "anonymize"
                else "ANONYMIZE it with the key set to None"
            )
            self.invalid.append(
                f"{shown} is {treatment.kind.upper()} but keeps rows referencing {parent} through "
                f"{fk.name} ({fk.describe(self.home)}): {consequence}; {fix}, change the key's "
                f"ON DELETE to SET NULL, or keep the rows of {parent} (ANONYMIZE it)"
            )
        if fk.on_delete == "set null":
            stuck = [c for c in fk.set_columns if _not_null(child, c)]
            if stuck:
                self.invalid.append(
                    f"{shown}.{', '.join(stuck)} is NOT NULL but {fk.name} is ON DELETE SET NULL: "
                    f"deleting rows of {parent} would fail; make the column nullable"
                )


def _not_null(table: Table, name: str) -> bool:
    column = table.column(name)
    return column is not None and column.not_null


def _clears(fk: ForeignKey, values: Mapping[str, Any]) -> bool:
    """Whether ``values`` set enough of the key to NULL that it references nothing."""
    nulled = [c for c in fk.columns if c in values and values[c] is None]
    return len(nulled) == len(fk.columns) if fk.match_full else bool(nulled)


def plan_subject(catalog: Catalog, subject: SubjectSpec) -> Plan:
    """Plan an export or erase of ``subject`` from ``catalog``; pure (no I/O).

    Args:
        catalog: what :func:`~jobs_subject.read_catalog` read (or one built by hand).
        subject: the declaration (a :class:`~jobs_subject.Subject`).

    Returns:
        The :class:`Plan`: the tables children first, the loop-closing keys to clear.

    Raises:
        SubjectDeclarationInvalidError: ``X_SUBJECT_DECLARATION_INVALID``: the subject's table
            is not in the catalog, its key is not a unique key of it, or ``columns=`` names a
            table that is not planned or a column it lacks.
        SubjectTableUndeclaredError: ``X_SUBJECT_TABLE_UNDECLARED``: a table references the
            subject and has no treatment; ``meta["tables"]`` maps each to its key path.
        SubjectTreatmentInvalidError: ``X_SUBJECT_TREATMENT_INVALID``: a treatment cannot apply
            (the message says why and how to fix it).
        SubjectCycleError: ``X_SUBJECT_CYCLE``: a loop-closing key has no nullable column, or
            clearing it would cut a membership key of the same table.
    """
    home = subject.schema
    root = catalog.tables.get(resolve(subject.table, home))
    if root is None:
        raise SubjectDeclarationInvalidError(
            f"the subject's table {subject.table!r} is not in the database (schema {home!r})",
            problems=[f"table {subject.table!r} not found"],
        )
    key = tuple(subject.key)
    missing_key = [c for c in key if root.column(c) is None]
    if missing_key or not any(set(u) <= set(key) for u in root.unique_keys):
        raise SubjectDeclarationInvalidError(
            f"the subject's key ({', '.join(key)}) must be columns of {subject.table} holding a "
            "unique key (its primary key, say)"
            + (f"; no column {', '.join(missing_key)}" if missing_key else ""),
            problems=[f"key {list(key)} is not unique in {subject.table}"],
        )
    walk = _Walk(catalog, subject, root)
    walk.walk(root.name, ())
    if walk.undeclared:
        paths = {t.shown(home): key_path(p, home) for t, p in sorted(walk.undeclared.items())}
        raise SubjectTableUndeclaredError(
            f"{len(paths)} table(s) reference the subject {root.name.shown(home)} with no "
            "declared treatment (nothing was touched): "
            + "; ".join(f"{table}, reached by {path}" for table, path in paths.items()),
            tables=paths,
        )
    _check_treatments(catalog, subject, walk)
    clears = _clears_of(walk, key)
    order = _children_first(walk, root.name)
    columns = _export_columns(catalog, subject, set(walk.keys))
    tables = tuple(
        PlannedTable(
            table=catalog.tables[name],
            shown=name.shown(home),
            treatment=walk.treatment(name) or Treatment.DELETE,
            keys=tuple(walk.keys[name]),
            path=walk.paths[name],
            export_columns=columns[name],
        )
        for name in order
    )
    return Plan(subject=root, key=key, home=home, tables=tables, clears=clears)


def _check_treatments(catalog: Catalog, spec: SubjectSpec, walk: _Walk) -> None:
    """Raise every treatment problem: the walk's and each declared treatment's own."""
    home = spec.schema
    problems = list(walk.invalid)
    if walk.subject_treatment.kind == "retain":
        problems.append(
            f"the subject's table {walk.subject.name.shown(home)} cannot be RETAIN: keeping the "
            "person's own row is no erasure (ANONYMIZE it instead)"
        )
    referenced: dict[TableName, set[str]] = defaultdict(set)
    for fk in catalog.foreign_keys:
        referenced[fk.parent].update(fk.parent_columns)
    for name, treatment in sorted(walk.declared.items()):
        shown = name.shown(home)
        table = catalog.tables.get(name)
        if table is None:
            problems.append(f"{shown} is declared but is not a table of the database")
            continue
        if name not in walk.keys:
            problems.append(
                f"{shown} is declared but no foreign key path from the subject reaches it "
                "(a path through a RETAIN or ANONYMIZE table stops there); drop the entry"
            )
            continue
        if treatment.kind == "anonymize":
            problems += _anonymize_problems(table, shown, treatment, referenced[name])
    if problems:
        raise SubjectTreatmentInvalidError(
            f"{len(problems)} treatment(s) cannot apply (nothing was touched): "
            + "; ".join(problems),
            problems=problems,
        )


def _anonymize_problems(
    table: Table, shown: str, treatment: Treatment, referenced: set[str]
) -> list[str]:
    problems = []
    for name, value in treatment.values.items():
        column = table.column(name)
        if column is None:
            problems.append(f"ANONYMIZE of {shown} names {name!r}, which is not a column of it")
        elif value is None and column.not_null:
            problems.append(
                f"ANONYMIZE of {shown} sets {name} to None but the column is NOT NULL; give a "
                "value or make the column nullable"
            )
        elif column.generated:
            problems.append(f"ANONYMIZE of {shown} sets {name}, which the database generates")
        elif name in table.primary_key or name in referenced:
            problems.append(
                f"ANONYMIZE of {shown} sets {name}, a key other rows identify it by (primary "
                "key or referenced by a foreign key); leave it out"
            )
    return problems


def _clears_of(walk: _Walk, key: tuple[str, ...]) -> tuple[Clear, ...]:
    home = walk.home
    clears = []
    problems = []
    for fk, path in walk.loops:
        child = walk.catalog.tables[fk.child]
        nullable = tuple(c for c in fk.columns if not _not_null(child, c))
        members = {c for k in walk.keys.get(fk.child, []) for c in k.columns}
        if fk.child == walk.subject.name:
            members |= set(key)
        enough = len(nullable) == len(fk.columns) if fk.match_full else bool(nullable)
        if not enough:
            problems.append(
                f"{fk.name} ({fk.describe(home)}) closes a loop ({key_path(path, home)}) and "
                f"cannot be cleared: {', '.join(fk.columns)} NOT NULL"
            )
        elif members & set(nullable):
            problems.append(
                f"{fk.name} ({fk.describe(home)}) closes a loop but clearing "
                f"{', '.join(sorted(members & set(nullable)))} would cut the key path its table's "
                "rows are found by"
            )
        else:
            clears.append(Clear(key=fk, child=child, columns=nullable, path=path))
    if problems:
        raise SubjectCycleError(
            f"{len(problems)} loop(s) of deleted tables cannot be broken (nothing was touched): "
            + "; ".join(problems),
            problems=problems,
        )
    return tuple(clears)


def _children_first(walk: _Walk, root: TableName) -> list[TableName]:
    """Answer the reached tables so each comes after every table whose keys reference it."""
    home = walk.home
    waiting = {name: 0 for name in walk.keys}
    for keys in walk.keys.values():
        for fk in keys:
            waiting[fk.parent] += 1
    ready = sorted((n for n, count in waiting.items() if count == 0), key=lambda n: n.shown(home))
    order: list[TableName] = []
    while ready:
        name = ready.pop(0)
        order.append(name)
        for fk in walk.keys[name]:
            waiting[fk.parent] -= 1
            if waiting[fk.parent] == 0:
                ready.append(fk.parent)
                ready.sort(key=lambda n: n.shown(home))
    # The walk drops every key that closes a loop, so what it kept is acyclic.
    assert len(order) == len(waiting) and order[-1] == root
    return order


def _export_columns(
    catalog: Catalog, spec: SubjectSpec, planned: set[TableName]
) -> dict[TableName, tuple[str, ...]]:
    home = spec.schema
    chosen = {name: tuple(c.name for c in catalog.tables[name].columns) for name in planned}
    problems = []
    for written, names in spec.columns.items():
        name = resolve(written, home)
        if name not in planned:
            problems.append(f"columns: {written} is not a table of the plan")
            continue
        table = catalog.tables[name]
        unknown = [c for c in names if table.column(c) is None]
        if unknown:
            problems.append(f"columns: {written} has no column {', '.join(map(repr, unknown))}")
            continue
        chosen[name] = tuple(names)
    if problems:
        raise SubjectDeclarationInvalidError(
            "the declaration's columns= do not match the database: " + "; ".join(problems),
            problems=problems,
        )
    return chosen


__all__ = ["Clear", "Plan", "PlannedTable", "SubjectSpec", "plan_subject", "resolve"]
