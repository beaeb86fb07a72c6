"""plan_subject, pure over catalogs built by hand (and a property test over random ones);
the catalog as read from a real server; declarations and treatments refused at once."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs_core.errors import (
    SubjectCycleError,
    SubjectDeclarationInvalidError,
    SubjectTableUndeclaredError,
    SubjectTreatmentInvalidError,
)
from jobs_pg import PostgresDriver
from jobs_subject import (
    Catalog,
    Column,
    ForeignKey,
    Table,
    TableName,
    Treatment,
    define_subject,
    plan_subject,
    read_catalog,
)

H = "app"


@dataclass
class Spec:
    table: str = "users"
    key: tuple[str, ...] = ("id",)
    schema: str = H
    tables: Mapping[str, Treatment] = field(default_factory=dict)
    columns: Mapping[str, Sequence[str]] = field(default_factory=dict)


def table(
    name: str, *columns: str, not_null: Sequence[str] = (), pk: Sequence[str] = ("id",)
) -> Table:
    return Table(
        name=TableName(H, name),
        columns=tuple(
            Column(c, "bigint", not_null=c in not_null or c in pk) for c in ("id", *columns)
        ),
        primary_key=tuple(pk),
        unique_keys=(tuple(pk),),
    )


def fk(
    child: str,
    columns: str,
    parent: str,
    on_delete: Any = "no action",
    parent_columns: str = "id",
    name: str | None = None,
) -> ForeignKey:
    cols = tuple(columns.split(","))
    return ForeignKey(
        name=name or f"{child}_{'_'.join(cols)}_fkey",
        child=TableName(H, child),
        columns=cols,
        parent=TableName(H, parent),
        parent_columns=tuple(parent_columns.split(",")),
        on_delete=on_delete,
        set_columns=cols if on_delete in ("set null", "set default") else (),
    )


def catalog(tables: Sequence[Table], keys: Sequence[ForeignKey]) -> Catalog:
    return Catalog(tables={t.name: t for t in tables}, foreign_keys=tuple(keys))


# users <-> teams (owner / member), comments replying to comments, a post's comments.
SOCIAL = catalog(
    [
        table("users", "team_id"),
        table("teams", "owner_id", not_null=["owner_id"]),
        table("posts", "author_id", not_null=["author_id"]),
        table("comments", "post_id", "author_id", "parent_id", not_null=["post_id", "author_id"]),
        table("likes", "comment_id"),
    ],
    [
        fk("teams", "owner_id", "users"),
        fk("users", "team_id", "teams"),
        fk("posts", "author_id", "users", "restrict"),
        fk("comments", "post_id", "posts"),
        fk("comments", "author_id", "users"),
        fk("comments", "parent_id", "comments"),
        fk("likes", "comment_id", "comments", "cascade"),
    ],
)
EVERY = {name: Treatment.DELETE for name in ("teams", "posts", "comments", "likes")}


def test_children_first_with_the_loop_closing_keys_cleared_first() -> None:
    plan = plan_subject(SOCIAL, Spec(tables=EVERY))
    order = plan.order
    assert order[-1] == "users"
    assert order.index("likes") < order.index("comments") < order.index("posts")
    assert order.index("teams") < order.index("users")
    assert [(c.key.name, c.columns) for c in plan.clears] == [
        ("comments_parent_id_fkey", ("parent_id",)),
        ("users_team_id_fkey", ("team_id",)),
    ]
    comments = plan.table("comments")
    assert [k.name for k in comments.keys] == ["comments_author_id_fkey", "comments_post_id_fkey"]
    described = plan.describe()
    assert described["tables"][order.index("likes")]["path"] == (
        "users.id <- comments.author_id <- likes.comment_id"
    )
    assert described["clear"][1] == {
        "table": "users",
        "key": "users_team_id_fkey",
        "columns": ["team_id"],
        "references": "teams",
        "path": "users.id <- teams.owner_id <- users.team_id",
    }


def test_every_undeclared_table_is_named_with_the_key_path_that_reaches_it() -> None:
    with pytest.raises(SubjectTableUndeclaredError) as caught:
        plan_subject(SOCIAL, Spec(tables={"posts": Treatment.DELETE, "teams": Treatment.DELETE}))
    assert caught.value.meta["tables"] == {
        "comments": "users.id <- comments.author_id",
    }
    # Only what the walk reached: likes hang off comments, which it never walked into.
    assert "likes" not in str(caught.value)


def test_a_reach_stops_at_a_kept_table() -> None:
    kept = {**EVERY, "comments": Treatment.ANONYMIZE({"author_id": None, "parent_id": None})}
    with pytest.raises(SubjectTreatmentInvalidError) as caught:
        plan_subject(SOCIAL, Spec(tables=kept))
    # likes reference comments only, which are kept: declaring them is stale; and comments
    # keep rows referencing posts (deleted) through a NO ACTION key they do not clear.
    problems = caught.value.meta["problems"]
    assert any(p.startswith("likes is declared but no foreign key path") for p in problems)
    assert any("comments is ANONYMIZE but keeps rows referencing posts" in p for p in problems)


@pytest.mark.parametrize(
    ("treatment", "on_delete", "fine"),
    [
        (Treatment.RETAIN("why"), "restrict", False),
        (Treatment.RETAIN("why"), "no action", False),
        (Treatment.RETAIN("why"), "cascade", False),
        (Treatment.RETAIN("why"), "set null", True),
        (Treatment.RETAIN("why"), "set default", True),
        (Treatment.ANONYMIZE({"note": "x"}), "cascade", False),
        (Treatment.ANONYMIZE({"user_id": None}), "cascade", True),
        (Treatment.ANONYMIZE({"user_id": None}), "restrict", True),
        (Treatment.DELETE, "restrict", True),
    ],
)
def test_a_kept_row_under_a_key_the_parent_delete_acts_on(
    treatment: Treatment, on_delete: str, fine: bool
) -> None:
    kept = catalog(
        [table("users"), table("invoices", "user_id", "note")],
        [fk("invoices", "user_id", "users", on_delete)],
    )
    spec = Spec(tables={"invoices": treatment})
    if fine:
        assert plan_subject(kept, spec).order == ["invoices", "users"]
        return
    with pytest.raises(SubjectTreatmentInvalidError, match=r"invoices is .* but keeps rows"):
        plan_subject(kept, spec)


def test_set_null_on_a_not_null_column_and_bad_anonymize_columns_are_refused_together() -> None:
    kept = catalog(
        [
            table("users", "email"),
            table("invoices", "user_id", not_null=["user_id"]),
            Table(
                name=TableName(H, "audit"),
                columns=(
                    Column("id", "bigint", True),
                    Column("user_id", "bigint"),
                    Column("action", "text", True),
                    Column("total", "bigint", generated=True),
                ),
                primary_key=("id",),
                unique_keys=(("id",),),
            ),
            table("notes", "audit_id"),
        ],
        [
            fk("invoices", "user_id", "users", "set null"),
            fk("audit", "user_id", "users", "set null"),
            fk("notes", "audit_id", "audit"),
        ],
    )
    values = {"action": None, "total": 1, "id": 2, "nope": 3}
    with pytest.raises(SubjectTreatmentInvalidError) as caught:
        plan_subject(
            kept,
            Spec(
                tables={
                    "invoices": Treatment.RETAIN("legal"),
                    "audit": Treatment.ANONYMIZE(values),
                    "missing": Treatment.DELETE,
                }
            ),
        )
    problems = caught.value.meta["problems"]
    assert (
        "invoices.user_id is NOT NULL but invoices_user_id_fkey is ON DELETE SET NULL"
        in (problems[0])
    )
    joined = " | ".join(problems)
    assert "sets action to None but the column is NOT NULL" in joined
    assert "sets total, which the database generates" in joined
    assert "sets id, a key other rows identify it by" in joined
    assert "names 'nope', which is not a column of it" in joined
    assert "missing is declared but is not a table of the database" in joined


def test_the_subject_cannot_be_retained() -> None:
    with pytest.raises(SubjectTreatmentInvalidError, match="users cannot be RETAIN"):
        plan_subject(SOCIAL, Spec(tables={**EVERY, "users": Treatment.RETAIN("no")}))


def test_the_subject_anonymized_keeps_its_row_and_so_its_restrict_children() -> None:
    kept = catalog(
        [table("users", "email"), table("invoices", "user_id"), table("orders", "user_id")],
        [fk("invoices", "user_id", "users", "restrict"), fk("orders", "user_id", "users")],
    )
    spec = Spec(
        tables={
            "users": Treatment.ANONYMIZE({"email": None}),
            "invoices": Treatment.RETAIN("legal"),
            "orders": Treatment.DELETE,
        }
    )
    plan = plan_subject(kept, spec)
    assert plan.order == ["invoices", "orders", "users"]
    assert plan.table("users").treatment.kind == "anonymize"


def test_an_unbreakable_loop_is_a_cycle() -> None:
    loop = catalog(
        [table("users"), table("a", "user_id", "b_id", not_null=["b_id"]), table("b", "a_id")],
        [fk("a", "user_id", "users"), fk("b", "a_id", "a"), fk("a", "b_id", "b")],
    )
    with pytest.raises(SubjectCycleError, match=r"a_b_id_fkey .* closes a loop .* b_id NOT NULL"):
        plan_subject(loop, Spec(tables={"a": Treatment.DELETE, "b": Treatment.DELETE}))


def test_a_loop_key_sharing_the_membership_columns_cannot_be_cleared() -> None:
    shared = catalog(
        [table("users"), table("items", "owner_id")],
        [
            fk("items", "owner_id", "users", name="items_owner"),
            fk("items", "owner_id", "items", name="items_self"),
        ],
    )
    with pytest.raises(SubjectCycleError, match="would cut the key path"):
        plan_subject(shared, Spec(tables={"items": Treatment.DELETE}))


def test_the_subject_table_its_key_and_columns_must_exist() -> None:
    with pytest.raises(SubjectDeclarationInvalidError, match="'people' is not in the database"):
        plan_subject(SOCIAL, Spec(table="people"))
    with pytest.raises(SubjectDeclarationInvalidError, match="must be columns of users holding"):
        plan_subject(SOCIAL, Spec(key=("team_id",), tables=EVERY))
    with pytest.raises(SubjectDeclarationInvalidError) as caught:
        plan_subject(
            SOCIAL,
            Spec(tables=EVERY, columns={"users": ["id", "secret"], "nowhere": ["id"]}),
        )
    assert caught.value.meta["problems"] == [
        "columns: users has no column 'secret'",
        "columns: nowhere is not a table of the plan",
    ]


@st.composite
def graphs(draw: st.DrawFn) -> tuple[Catalog, int]:
    """Tables t1..tn (t0 the subject) and random nullable keys between them."""
    n = draw(st.integers(min_value=1, max_value=7))
    edges = draw(
        st.lists(
            st.tuples(st.integers(0, n), st.integers(0, n)), min_size=0, max_size=3 * n, unique=True
        )
    )
    tables = [table(f"t{i}", *(f"r{k}" for k in range(len(edges)))) for i in range(n + 1)]
    keys = [fk(f"t{c}", f"r{k}", f"t{p}", name=f"k{k}") for k, (c, p) in enumerate(edges)]
    return catalog(tables, keys), n


@settings(max_examples=200, deadline=None)
@given(graphs())
def test_any_graph_plans_children_first_and_every_key_in_the_reach_is_followed_or_cleared(
    drawn: tuple[Catalog, int],
) -> None:
    graph, n = drawn
    spec = Spec(table="t0", tables={f"t{i}": Treatment.DELETE for i in range(1, n + 1)})
    reach = {TableName(H, "t0")}
    grew = True
    while grew:
        grew = False
        for key in graph.foreign_keys:
            if key.parent in reach and key.child not in reach:
                reach.add(key.child)
                grew = True
    spec.tables = {t.name: Treatment.DELETE for t in reach if t.name != "t0"}
    plan = plan_subject(graph, spec)
    position = {p.table.name: i for i, p in enumerate(plan.tables)}
    assert set(position) == reach and plan.order[-1] == "t0"
    membership = {k.name for p in plan.tables for k in p.keys}
    cleared = {c.key.name for c in plan.clears}
    for key in graph.foreign_keys:
        if key.parent in reach:
            assert (key.name in membership) != (key.name in cleared)
        if key.name in membership:
            assert position[key.child] < position[key.parent]


def test_treatments_refuse_what_cannot_be_written() -> None:
    with pytest.raises(SubjectTreatmentInvalidError, match="reason"):
        Treatment.RETAIN("  ")
    with pytest.raises(SubjectTreatmentInvalidError) as caught:
        Treatment.ANONYMIZE({"a": b"secret", "b": float("nan"), "c": "x\x00y", "": 1})
    assert caught.value.meta["problems"] == [
        "a: a bytes cannot be written to a column",
        "b: a NaN or infinite float cannot be written",
        "c: text holding NUL (U+0000) cannot be written to PostgreSQL",
        "a column name must be non-empty text, got ''",
    ]
    assert "secret" not in str(caught.value)
    with pytest.raises(SubjectTreatmentInvalidError, match="at least one"):
        Treatment.ANONYMIZE({})
    assert repr(Treatment.RETAIN("legal")) == "Treatment.RETAIN('legal')"
    assert Treatment.ANONYMIZE({"b": None, "a": 1}).describe() == {
        "treatment": "anonymize",
        "anonymize": ["a", "b"],
    }


def test_a_declaration_names_every_bad_field_at_once() -> None:
    with pytest.raises(SubjectDeclarationInvalidError) as caught:
        define_subject(
            table="",
            key=[],
            tables={"orders": "delete"},  # type: ignore[dict-item]
            driver="postgresql://x",  # type: ignore[arg-type]
            targets=[object()],  # type: ignore[list-item]
            columns={"users": "email"},
            batch=0,
        )
    problems = caught.value.meta["problems"]
    assert [p.split(":")[0] for p in problems] == [
        "table",
        "key",
        "tables['orders']",
        "driver",
        "columns['users']",
        "batch",
        "targets",
        "name",
    ]


class _Target:
    columns = ("a",)

    def __init__(self, name: str) -> None:
        self.name = name

    def export_page(self, subject: Any, cursor: Any) -> Any:
        return [], None

    def erase(self, subject: Any) -> None:
        return None


def test_targets_are_erased_or_retained_and_names_are_unique() -> None:
    name = f"t-{uuid.uuid4().hex[:8]}"
    with pytest.raises(SubjectDeclarationInvalidError) as caught:
        define_subject(
            table="users",
            key="id",
            name=name,
            targets=[
                _Target("auth"),
                (_Target("auth"), Treatment.RETAIN("x")),
                (_Target("s3"), Treatment.ANONYMIZE({"a": 1})),
            ],
        )
    assert caught.value.meta["problems"] == [
        "targets: 's3' must be erased or (target, Treatment.RETAIN('why'))",
        "targets: names must be unique, ['auth'] appear more than once",
    ]


def test_two_subjects_of_one_name_collide_and_a_redeclaration_replaces_its_own() -> None:
    name = f"dup-{uuid.uuid4().hex[:8]}"
    made = [define_subject(table="users", key="id", name=name) for _ in range(2)]
    assert made[0] is not made[1]  # the same line again: a reload
    with pytest.raises(SubjectDeclarationInvalidError, match="two subjects are named"):
        define_subject(table="users", key="id", name=name)


async def test_the_catalog_reads_composite_keys_actions_set_columns_and_not_null(
    pg_url: str, app_schema: str, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("CREATE TABLE orgs (id int PRIMARY KEY, code text NOT NULL UNIQUE)")
    conn.execute(
        "CREATE TABLE members (org_id int REFERENCES orgs ON DELETE CASCADE, user_id bigint, "
        "nick text GENERATED ALWAYS AS ('m' || user_id) STORED, PRIMARY KEY (org_id, user_id))"
    )
    conn.execute("CREATE UNIQUE INDEX members_partial ON members (user_id) WHERE org_id > 0")
    conn.execute(
        "CREATE TABLE grants (org_id int, user_id bigint NOT NULL, perm text, "
        "CONSTRAINT grants_member FOREIGN KEY (org_id, user_id) REFERENCES members "
        "ON DELETE SET NULL (org_id))"
    )
    conn.execute(
        "CREATE TABLE events (id int, org_id int REFERENCES orgs ON DELETE RESTRICT, at date) "
        "PARTITION BY RANGE (at)"
    )
    conn.execute(
        "CREATE TABLE events_2026 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO "
        "('2027-01-01')"
    )
    driver = PostgresDriver(pg_url, schema="jobs", min_size=0, max_size=1)
    try:
        async with driver.connection() as lent:
            read = await read_catalog(lent, names=[TableName(app_schema, "nothing")])
    finally:
        await driver.close()
    mine = [k for k in read.foreign_keys if k.child.schema == app_schema]
    assert [
        (k.name, k.child.name, k.columns, k.parent_columns, k.on_delete, k.set_columns)
        for k in mine
    ] == [
        ("events_org_id_fkey", "events", ("org_id",), ("id",), "restrict", ()),
        (
            "grants_member",
            "grants",
            ("org_id", "user_id"),
            ("org_id", "user_id"),
            "set null",
            ("org_id",),
        ),
        ("members_org_id_fkey", "members", ("org_id",), ("id",), "cascade", ()),
    ]
    members = read.tables[TableName(app_schema, "members")]
    assert members.primary_key == ("org_id", "user_id")
    assert members.unique_keys == (("org_id", "user_id"),)  # the partial index is no key
    assert [(c.name, c.type, c.not_null, c.generated) for c in members.columns] == [
        ("org_id", "integer", True, False),
        ("user_id", "bigint", True, False),
        ("nick", "text", False, True),
    ]
    orgs = read.tables[TableName(app_schema, "orgs")]
    assert orgs.unique_keys == (("id",), ("code",))
    assert TableName(app_schema, "events_2026") not in read.tables
    assert TableName(app_schema, "nothing") not in read.tables
