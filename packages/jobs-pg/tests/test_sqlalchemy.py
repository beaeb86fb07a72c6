"""SQLAlchemy 2: an enqueue inside a Session's (or AsyncSession's) transaction stages on its
psycopg connection; commit publishes (through the relay), rollback drops; psycopg only.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel
from sqlalchemy import String, create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from jobs_core import JobRegistry, job, portal
from jobs_core.errors import DriverRequestInvalidError
from jobs_core.outbox import Outbox
from jobs_core.testing import run_jobs
from jobs_pg import PostgresDriver
from jobs_pg import sqlalchemy as jobs_sa


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str] = mapped_column(String(40))


class Ship(BaseModel):
    order_id: int


class Boom(Exception):
    pass


shipped: list[int] = []
registry = JobRegistry()


@job(
    input=Ship,
    idempotency_key=lambda s: f"ship:{s.order_id}",
    tenant="none",
    name="sa.ship",
    registry=registry,
)
async def ship(input: Ship, step: Any, ctx: Any) -> None:
    shipped.append(input.order_id)


def sa_url(pg_url: str, driver: str) -> str:
    return pg_url.replace("postgresql://", f"postgresql+{driver}://", 1)


def counts(pg_url: str, schema: str) -> tuple[int, int, int]:
    """(orders, outbox rows, jobs) in the test's schema."""
    with psycopg.connect(pg_url) as conn:
        found = conn.execute(
            f'SELECT (SELECT count(*) FROM "{schema}".orders), '
            f'(SELECT count(*) FROM "{schema}".outbox), (SELECT count(*) FROM "{schema}".jobs)'
        ).fetchone()
    assert found is not None
    return int(found[0]), int(found[1]), int(found[2])


@pytest.fixture
def installed(pg_url: str, schema: str) -> Iterator[tuple[PostgresDriver, Outbox]]:
    portal.shutdown()
    driver = PostgresDriver(pg_url, schema=schema, min_size=0, max_size=4)
    outbox = jobs_sa.install(driver)
    portal.run(driver.migrate())
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{schema}".orders (id serial PRIMARY KEY, item text)')
    shipped.clear()
    yield driver, outbox
    portal.run(driver.close())
    jobs_sa.uninstall()
    portal.shutdown()


@pytest.fixture
def engine(pg_url: str, schema: str) -> Iterator[Any]:
    made = create_engine(sa_url(pg_url, "psycopg")).execution_options(
        schema_translate_map={None: schema}
    )
    yield made
    made.dispose()


def publish(outbox: Outbox) -> int:
    """Run one relay pass on the portal (where the driver's pool lives); answer rows published."""
    return portal.run(outbox.relay().run_once())


def run_worker(driver: PostgresDriver) -> None:
    # Only where a job is due: a worker stopped within milliseconds of its start can hang on
    # its LISTEN connection's stop (issue 14, item 6), which an idle run_jobs would risk.
    portal.run(run_jobs(driver, registry=registry, timeout="20s"))


def test_a_session_commit_publishes_the_staged_job_and_the_worker_runs_it(
    installed: tuple[PostgresDriver, Outbox], engine: Any, pg_url: str, schema: str
) -> None:
    driver, outbox = installed
    with Session(engine) as session, session.begin():
        order = Order(item="book")
        session.add(order)
        session.flush()
        result = ship.enqueue_sync(Ship(order_id=order.id))
        # Staged on the session's connection: nothing is visible outside the transaction yet.
        assert counts(pg_url, schema) == (0, 0, 0)
        order_id = order.id
    assert counts(pg_url, schema) == (1, 1, 0)
    assert publish(outbox) == 1
    run_worker(driver)
    assert shipped == [order_id]
    assert counts(pg_url, schema)[2] == 1
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(f'SELECT id FROM "{schema}".jobs').fetchone()
    assert row is not None and row[0] == result.id


def test_a_session_rollback_drops_the_order_and_the_job(
    installed: tuple[PostgresDriver, Outbox], engine: Any, pg_url: str, schema: str
) -> None:
    _driver, outbox = installed
    with pytest.raises(Boom), Session(engine) as session, session.begin():
        order = Order(item="book")
        session.add(order)
        session.flush()
        ship.enqueue_sync(Ship(order_id=order.id))
        raise Boom
    assert counts(pg_url, schema) == (0, 0, 0)
    assert publish(outbox) == 0
    assert counts(pg_url, schema) == (0, 0, 0)


def test_an_enqueue_before_the_first_flush_still_joins_the_transaction(
    installed: tuple[PostgresDriver, Outbox], engine: Any, pg_url: str, schema: str
) -> None:
    with Session(engine) as session:
        session.add(Order(item="pen"))
        ship.enqueue_sync(Ship(order_id=7))  # no statement has run on the session yet
        session.rollback()
    assert counts(pg_url, schema) == (0, 0, 0)
    with Session(engine) as session:
        session.add(Order(item="pen"))
        ship.enqueue_sync(Ship(order_id=8))
        session.commit()
    assert counts(pg_url, schema) == (1, 1, 0)


def test_outside_a_session_transaction_an_enqueue_is_queued_directly(
    installed: tuple[PostgresDriver, Outbox], engine: Any, pg_url: str, schema: str
) -> None:
    with Session(engine) as session, session.begin():
        session.add(Order(item="cup"))
    ship.enqueue_sync(Ship(order_id=9))
    assert counts(pg_url, schema) == (1, 0, 1)


def test_a_non_psycopg_dialect_is_refused_inside_its_transaction(
    installed: tuple[PostgresDriver, Outbox], pg_url: str, schema: str
) -> None:
    lite = create_engine("sqlite://")
    Base.metadata.create_all(lite)
    with Session(lite) as session, session.begin():
        session.add(Order(item="mug"))
        with pytest.raises(
            DriverRequestInvalidError, match=r"sqlite\+pysqlite.*postgresql\+psycopg"
        ):
            ship.enqueue_sync(Ship(order_id=1))
    assert counts(pg_url, schema) == (0, 0, 0)


@pytest.fixture
async def async_engine(pg_url: str, schema: str) -> AsyncIterator[Any]:
    made = create_async_engine(sa_url(pg_url, "psycopg_async")).execution_options(
        schema_translate_map={None: schema}
    )
    yield made
    await made.dispose()


async def test_an_async_session_commits_and_rolls_back_its_staged_jobs(
    installed: tuple[PostgresDriver, Outbox], async_engine: Any, pg_url: str, schema: str
) -> None:
    _driver, outbox = installed
    with pytest.raises(Boom):
        async with AsyncSession(async_engine) as session, session.begin():
            session.add(Order(item="lamp"))
            await session.flush()
            await ship.enqueue(Ship(order_id=1))
            raise Boom
    assert counts(pg_url, schema) == (0, 0, 0)
    async with AsyncSession(async_engine) as session, session.begin():
        order = Order(item="lamp")
        session.add(order)
        await session.flush()
        await ship.enqueue(Ship(order_id=order.id))
        order_id = order.id
    assert counts(pg_url, schema) == (1, 1, 0)
    # The driver's pool opened on the portal (the fixture's migrate): the relay runs there, as
    # a separate relay process would have its own.
    assert await asyncio.to_thread(publish, outbox) == 1
    assert counts(pg_url, schema) == (1, 1, 1)
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(f'SELECT input FROM "{schema}".jobs').fetchone()
    assert row == ({"order_id": order_id},)
