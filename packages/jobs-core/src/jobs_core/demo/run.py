"""The guided demo: enqueue a shop scenario, run a real worker over it, check the story.

:func:`run_demo` enqueues three checkouts and a welcome series of :mod:`jobs_core.demo.shop`,
runs a real :class:`~jobs_core.worker.Worker` on the given driver with the real clock, narrates
each step and each settled attempt as it happens (:class:`Narrator`, fed by the library's own
structured log records), then reads every job back through ``driver.introspect.get`` and checks
the ending each one was meant to have, and the effects in the external systems' ledger.

The scenario:

* ``A-1001`` checks out first time: charged, shipped, vendor paid.
* ``A-1002`` meets a warehouse that answers "busy" twice: two retries, and each replays the
  charge from storage instead of charging again.
* ``B-2001`` ships to a country the warehouse refuses (a ``terminal`` error): the run fails for
  good, the charge's compensation refunds it, and the row is dead-lettered.
* ``ada@acme.test`` gets a welcome e-mail, the run parks for 2 s (suspended, no attempt spent),
  then the nudge.
* ``A-1001`` is enqueued twice: the second enqueue answers the live row (``deduped``).
* The catalogue backfill passes over 40 products, five a page, one durable step per page, with
  a progress bar per page; enqueued again once it completed, it is a ``skipped`` pass (the
  ledger holds the completed one).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from rich.console import Console
from rich.table import Table
from rich.text import Text

from jobs_core import (
    LIVE_STATES,
    MAX_JOB_PAGE,
    EnqueueResult,
    Introspector,
    JobDriver,
    JobFilter,
    JobInfo,
    JobState,
    Worker,
    capability,
    require_capability,
    use_driver,
)
from jobs_core.demo.shop import (
    CATALOGUE,
    SYSTEMS,
    Delivery,
    Order,
    Signup,
    checkout,
    confirm_delivery,
    reprice_catalogue,
    stock_sync,
    welcome_series,
)
from jobs_core.events import publish_event
from jobs_core.outbox import Relay, use_outbox
from jobs_core.scheduler import Scheduler

SETTLE_BUDGET_S = 20.0
"""How long the demo waits for every job to finish before it reports failure."""

_NARRATED_LOGGERS = ("jobs.worker", "jobs_core.demo", "jobs.backfill")

PROGRESS_WIDTH = 20
"""Cells in a backfill's progress bar."""

_OUTCOMES = {
    "completed": ("→ done: acked, the row is finished", "bold green"),
    "suspended": ("→ suspended: parked until due, attempt not spent", "magenta"),
    "retried": ("→ retried: attempt spent, due again after the backoff", "yellow"),
    "dead-lettered": ("→ dead-lettered: failed for good, on the dead-letter queue", "bold red"),
}

_STEP_MARKS = {"completed": "✓", "failed": "✗", "waiting": "…", "started": "?"}


@dataclass(frozen=True, slots=True)
class Expected:
    """The ending one job of the scenario must reach.

    Attributes:
        label: how the demo names the job.
        state: its final state.
        attempts: attempts spent.
        code: the ``X_…`` code of its last error, when it must have one.
        story: what it shows, in words.
    """

    label: str
    state: JobState
    attempts: int
    code: str | None
    story: str


@dataclass(frozen=True, slots=True)
class Check:
    """One verified claim of the story.

    Attributes:
        claim: what should hold, in words.
        ok: whether it held.
        detail: what was found when it did not.
    """

    claim: str
    ok: bool
    detail: str = ""


ORDERS: tuple[tuple[Order, Expected], ...] = (
    (
        Order(order_id="A-1001", org_id="acme", amount_cents=4200, country="FR"),
        Expected("checkout A-1001", JobState.DONE, 1, None, "charged, shipped, vendor paid once"),
    ),
    (
        Order(order_id="A-1002", org_id="acme", amount_cents=1999, country="DE"),
        Expected(
            "checkout A-1002",
            JobState.DONE,
            3,
            None,
            "warehouse busy twice: retried, the charge replayed from storage",
        ),
    ),
    (
        Order(order_id="B-2001", org_id="globex", amount_cents=1300, country="AQ"),
        Expected(
            "checkout B-2001",
            JobState.DEAD,
            1,
            "X_SHOP_UNDELIVERABLE",
            "undeliverable: refunded by its compensation, dead-lettered",
        ),
    ),
)
"""The orders checked out, each with the ending it must reach."""

SIGNUP = Signup(email="ada@acme.test", org_id="acme")
"""The user welcomed."""

DELIVERY = Delivery(order_id="A-1001", org_id="acme", email="grace@acme.test")
"""The delivery the customer confirms."""

DELIVERY_EXPECTED = Expected(
    "confirm A-1001",
    JobState.DONE,
    1,
    None,
    "parked until the customer's delivery.confirmed event, then closed the order",
)

ROLLED_BACK = Order(order_id="C-3001", org_id="acme", amount_cents=2500, country="NL")
"""Enqueued inside a transaction that rolls back: no job may exist for it."""

COMMITTED = Order(order_id="C-3002", org_id="acme", amount_cents=3100, country="GB")
"""Enqueued inside a transaction that commits: the relay publishes it and it runs."""

COMMITTED_EXPECTED = Expected(
    "checkout C-3002",
    JobState.DONE,
    1,
    None,
    "staged in a committed transaction, published by the relay, then run",
)

DEMO_TIME_SPEED = 60.0
"""How much faster than real time the scheduler's clock runs in the demo."""

MIN_STOCK_SYNCS = 2
"""How many occurrences of the stock sync the demo waits for."""


class DemoClock:
    """A clock running :data:`DEMO_TIME_SPEED` times faster than real time (for the scheduler).

    ``*/2 * * * *`` then fires every 2 real seconds, so the demo can show a cron task in a named
    zone firing without making anyone wait minutes. Intervals (``monotonic``) stay real.
    """

    def __init__(self) -> None:
        self._start = datetime.now(UTC)
        self._m0 = time.monotonic()

    def now(self) -> datetime:
        """Answer the accelerated instant, UTC."""
        return self._start + timedelta(seconds=(time.monotonic() - self._m0) * DEMO_TIME_SPEED)

    def monotonic(self) -> float:
        """Answer real monotonic seconds."""
        return time.monotonic()


class PaymentDeclinedError(Exception):
    """The simulated business transaction fails after staging the job: it rolls back."""


BACKFILL_EXPECTED = Expected(
    "reprice catalogue",
    JobState.DONE,
    1,
    None,
    f"one pass over {len(CATALOGUE)} products, a durable step per page of five",
)

SIGNUP_EXPECTED = Expected(
    "welcome ada@acme.test",
    JobState.DONE,
    1,
    None,
    "parked 2 s between the e-mails without holding a process or an attempt",
)

BUSY_ORDER = "A-1002"
"""The order the warehouse answers "busy" for, twice."""

EXPECTED_EFFECTS: Counter[tuple[str, str]] = Counter(
    {
        ("charge", "A-1001"): 1,
        ("ship", "A-1001"): 1,
        ("payout", "A-1001"): 1,
        ("charge", "A-1002"): 1,
        ("ship", "A-1002"): 1,
        ("payout", "A-1002"): 1,
        ("charge", "B-2001"): 1,
        ("refund", "B-2001"): 1,
        ("email", "ada@acme.test"): 2,
        ("email", "grace@acme.test"): 1,
        ("close", "A-1001"): 1,
    }
)
"""Every effect the external systems must have performed, each exactly this often."""

OUTBOX_EFFECTS: Counter[tuple[str, str]] = Counter(
    {("charge", "C-3002"): 1, ("ship", "C-3002"): 1, ("payout", "C-3002"): 1}
)
"""The effects of the order committed through the outbox (when the outbox part runs)."""


class Narrator(logging.Handler):
    """Tells the story live: one line per step outcome and per settled attempt.

    It reads the library's structured records (``jobs.attempt.settled`` from the worker) and the
    shop's (``shop.step.*``); every other record is left to the other handlers.

    Args:
        console: where the story is printed.
        labels: the demo's name for each job, by job id text.
    """

    def __init__(self, console: Console, labels: dict[str, str]) -> None:
        super().__init__(logging.INFO)
        self.console = console
        self.labels = labels
        self.started = time.time()

    def say(self, label: str, text: str, style: str = "") -> None:
        """Print one story line, outside any attempt, for the job called ``label``."""
        self.console.print(self._line(time.time(), label, None, text, style), soft_wrap=True)

    def emit(self, record: logging.LogRecord) -> None:
        """Print the story line for ``record``, if it is one the story tells."""
        try:
            told = self._describe(record)
            if told is None:
                return
            fields = record.__dict__
            label = self.labels.get(str(fields.get("job_id")), str(fields.get("job", "?")))
            attempt = fields.get("attempt")
            line = self._line(
                record.created, label, attempt if isinstance(attempt, int) else None, *told
            )
            self.console.print(line, soft_wrap=True)
        except Exception:
            self.handleError(record)

    @contextmanager
    def attached(self) -> Iterator[Narrator]:
        """Listen to the worker's and the shop's loggers (at INFO) while the block runs."""
        loggers = [logging.getLogger(name) for name in _NARRATED_LOGGERS]
        levels = [logger.level for logger in loggers]
        for logger in loggers:
            logger.addHandler(self)
            if logger.getEffectiveLevel() > logging.INFO:
                logger.setLevel(logging.INFO)
        try:
            yield self
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.removeHandler(self)
                logger.setLevel(level)

    def _line(self, at: float, label: str, attempt: int | None, text: str, style: str) -> Text:
        return Text.assemble(
            (f"{at - self.started:6.2f}s  ", "dim"),
            (f"{label:<22}", "bold"),
            (f"{'' if attempt is None else f'attempt {attempt}':<11}", "dim"),
            (text, style),
        )

    @staticmethod
    def _describe(record: logging.LogRecord) -> tuple[str, str] | None:
        fields = record.__dict__
        event = fields.get("event")
        step = fields.get("step")
        if event == "jobs.attempt.settled":
            outcome = str(fields.get("outcome"))
            return _OUTCOMES.get(outcome, (f"→ {outcome}", "bold"))
        if event == "shop.step.ran":
            once = " (once: 'started' was stored first)" if fields.get("once") else ""
            return f"{step}: ran now{once} → {_compact(fields.get('output'))}", "green"
        if event == "shop.step.replayed":
            output = _compact(fields.get("output"))
            return f"{step}: replayed from storage, not called again → {output}", "cyan"
        if event == "shop.step.failed":
            return f"{step}: failed: {fields.get('error')}", "red"
        if event == "shop.step.parked":
            wake = datetime.fromisoformat(str(fields.get("wake_at"))).astimezone()
            return f"{step}: parked until {wake:%H:%M:%S}, no process waits for it", "magenta"
        if event == "shop.step.slept":
            return f"{step}: over, the run was handed back when due", "magenta"
        if event == "shop.step.waiting":
            until = datetime.fromisoformat(str(fields.get("until"))).astimezone()
            return (
                f"{step}: waiting for {fields.get('on')} (parked; looks again by {until:%H:%M:%S})",
                "magenta",
            )
        if event == "shop.step.answered":
            return f"{step}: answered → {_compact(fields.get('answer'))}", "cyan"
        if event == "shop.step.compensated":
            return f"{step}: compensation ran ({fields.get('undo')})", "yellow"
        if event == "jobs.backfill.page":
            return _progress_bar(fields), "cyan"
        return None


def _progress_bar(fields: dict[str, Any]) -> str:
    """Draw one backfill page as a bar: rows done of the pass's total, and the cursor."""
    done, total = int(fields.get("rows") or 0), fields.get("total")
    if isinstance(total, int) and total > 0:
        filled = min(PROGRESS_WIDTH, round(PROGRESS_WIDTH * done / total))
        bar = "█" * filled + "░" * (PROGRESS_WIDTH - filled)
        share = f"{done}/{total} rows"
    else:
        bar, share = "", f"{done} rows"
    page = int(fields.get("page") or 0)
    cursor = json.dumps(fields.get("cursor"))
    return f"batch:{page} {bar} {share}, checkpoint {{cursor: {cursor}}}"


def _compact(value: object, limit: int = 70) -> str:
    text = json.dumps(value, separators=(", ", ": "))
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def run_demo(driver: JobDriver, console: Console) -> bool:
    """Run the shop scenario on ``driver`` with a real worker; answer whether every check held.

    Args:
        driver: an open driver with the ``introspect`` capability (``memory://`` by default).
        console: where the story, the ledger, the outcomes and the checks are printed.

    Returns:
        ``True`` when every job ended as expected and every effect happened exactly as often as
        it should.

    Raises:
        NotImplementedByDriverError: ``X_NOT_IMPLEMENTED`` when the driver has no introspection.
    """
    introspect: Introspector = require_capability(driver, "introspect")
    SYSTEMS.reset()
    SYSTEMS.warehouse_busy[BUSY_ORDER] = 2
    console.rule(f"[bold]jobsctl demo[/]: a shop on the {driver.name} driver")
    console.print(
        "Three checkouts, a welcome series and a delivery confirmation are enqueued, two more "
        "checkouts go through the transactional outbox (one transaction rolls back, one "
        "commits), and a cron task syncs stock every 2 minutes, Paris time. A real worker, a "
        "relay and a scheduler run them; the scheduler's clock runs "
        f"{DEMO_TIME_SPEED:.0f}× faster than real time so the task fires every 2 s. The "
        f"warehouse will answer [italic]busy[/] twice for {BUSY_ORDER}.\n"
    )
    labels: dict[str, str] = {}
    expected: dict[UUID, Expected] = {}
    started = time.monotonic()
    with use_driver(driver), Narrator(console, labels).attached() as narrator:
        for order, expect in ORDERS:
            result = await checkout.enqueue(order)
            _enqueued(narrator, labels, expect.label, result, f"checkout:{order.order_id}")
            expected[result.id] = expect
        result = await welcome_series.enqueue(SIGNUP)
        _enqueued(narrator, labels, SIGNUP_EXPECTED.label, result, f"welcome:{SIGNUP.email}")
        expected[result.id] = SIGNUP_EXPECTED
        result = await confirm_delivery.enqueue(DELIVERY)
        _enqueued(narrator, labels, DELIVERY_EXPECTED.label, result, "confirm:A-1001")
        expected[result.id] = DELIVERY_EXPECTED
        confirm_id = result.id
        result = await reprice_catalogue.enqueue()
        _enqueued(narrator, labels, BACKFILL_EXPECTED.label, result, reprice_catalogue.name)
        expected[result.id] = BACKFILL_EXPECTED
        backfill_id = result.id
        first, again = ORDERS[0]
        repeat = await checkout.enqueue(first)
        narrator.say(
            again.label,
            f"enqueued again → job {_short(repeat.id)}, deduped={repeat.deduped}: "
            "one live row per idempotency key",
            "cyan",
        )
        store = capability(driver, "outbox")
        # The outbox part needs a transaction the demo can open without an app database: the
        # memory store's own. On Postgres the transaction is the app's psycopg connection
        # (jobs_pg.transaction(conn)), which a demo with no tables of its own does not have.
        outbox = store if hasattr(store, "transaction") else None
        rolled_back = committed = None
        if outbox is not None:
            rolled_back, committed = await _through_the_outbox(driver, outbox, narrator, labels)
            expected[committed] = COMMITTED_EXPECTED
        else:
            narrator.say(
                "outbox",
                f"skipped: the {driver.name} outbox stages on the app's own database transaction",
                "dim",
            )
        cron = capability(driver, "scheduler_state") is not None
        if not cron:
            narrator.say(
                "stock sync", f"skipped: the {driver.name} driver keeps no scheduler state", "dim"
            )
        console.print()
        worker = Worker(
            driver,
            queues=["orders", "emails", "maintenance"],
            concurrency=4,
            poll_interval="50ms",
            idle_poll_max="250ms",
        )
        relay = Relay(outbox, driver, poll_interval="100ms") if outbox is not None else None
        scheduler = (
            Scheduler(driver, tasks=[stock_sync], clock=DemoClock(), tick="100ms") if cron else None
        )
        roles = [asyncio.create_task(r.run()) for r in (worker, relay, scheduler) if r is not None]
        customer = asyncio.create_task(_customer(introspect, narrator, confirm_id))
        syncs: list[JobInfo] = []
        skipped: JobInfo | None = None
        try:
            infos = await _wait_settled(introspect, list(expected), roles[0])
            rerun = await reprice_catalogue.enqueue()
            labels[str(rerun.id)] = BACKFILL_EXPECTED.label
            skipped = (await _wait_settled(introspect, [rerun.id], roles[0])).get(rerun.id)
            narrator.say(
                BACKFILL_EXPECTED.label,
                "enqueued again after the pass completed → "
                f"{(skipped.result or {}).get('status') if skipped else 'unfinished'}: the "
                "ledger holds the completed pass",
                "cyan",
            )
            if scheduler is not None:
                await _wait_for_syncs(roles[0])
                await scheduler.stop()
                syncs = await _sync_jobs(introspect, roles[0])
            await customer
        finally:
            for role in (scheduler, relay):
                if role is not None:
                    await role.stop()
            await worker.stop()
            await asyncio.gather(*roles, return_exceptions=True)
    elapsed = time.monotonic() - started
    console.print()
    console.print(_ledger_table())
    console.print(_outcome_table(expected, infos))
    wanted = EXPECTED_EFFECTS + (OUTBOX_EFFECTS if outbox is not None else Counter())
    checks = _checks(expected, infos, wanted)
    checks.append(await _backfill_check(driver, infos.get(backfill_id), skipped))
    if rolled_back is not None:
        checks.append(
            Check(
                f"the rolled-back transaction left no job for {ROLLED_BACK.order_id} "
                "(the id it answered names no row, and nothing was charged)",
                await introspect.get(rolled_back) is None
                and all(e.ref != ROLLED_BACK.order_id for e in SYSTEMS.ledger),
                "a row or an effect exists",
            )
        )
    occurrences = [e.ref for e in SYSTEMS.ledger if e.action == "stock"]
    if cron:
        checks.append(
            Check(
                f"the stock sync fired {len(occurrences)} occurrences (at least "
                f"{MIN_STOCK_SYNCS}), each exactly once, every 2 minutes of Paris time, and "
                "each job finished",
                len(occurrences) >= MIN_STOCK_SYNCS
                and len(set(occurrences)) == len(occurrences)
                and all(info.state == JobState.DONE for info in syncs)
                and len(syncs) == len(occurrences)
                and _two_minutes_apart(occurrences),
                f"occurrences {occurrences}, job states {[str(i.state) for i in syncs]}",
            )
        )
        checks.append(
            Check(
                f"enqueueing {first.order_id} twice queued one job (the second answer was deduped)",
                repeat.deduped and expected.get(repeat.id) is again,
                f"deduped={repeat.deduped}, same job={expected.get(repeat.id) is again}",
            )
        )
    for check in checks:
        mark = Text("✓ ", "bold green") if check.ok else Text("✗ ", "bold red")
        tail = Text("" if check.ok else f": {check.detail}", "red")
        console.print(Text.assemble(mark, check.claim, tail), soft_wrap=True)
    failed = sum(not check.ok for check in checks)
    if failed:
        console.print(f"\n[bold red]{failed} of {len(checks)} checks failed[/] ({elapsed:.1f} s)")
    else:
        console.print(f"\n[bold green]All {len(checks)} checks held[/] in {elapsed:.1f} s.")
    return failed == 0


async def _through_the_outbox(
    driver: JobDriver, store: Any, narrator: Narrator, labels: dict[str, str]
) -> tuple[UUID, UUID]:
    """Enqueue one order in a transaction that rolls back and one in one that commits."""
    with use_outbox(store, driver):
        staged = None
        try:
            async with store.transaction():
                staged = await checkout.enqueue(ROLLED_BACK)
                narrator.say(
                    f"checkout {ROLLED_BACK.order_id}",
                    f"staged in a transaction → job {_short(staged.id)}; the payment is "
                    "declined and the transaction rolls back",
                    "blue",
                )
                raise PaymentDeclinedError(ROLLED_BACK.order_id)
        except PaymentDeclinedError:
            pass
        assert staged is not None
        async with store.transaction():
            kept = await checkout.enqueue(COMMITTED)
        labels[str(kept.id)] = COMMITTED_EXPECTED.label
        narrator.say(
            COMMITTED_EXPECTED.label,
            f"staged in a transaction that commits → job {_short(kept.id)}; the relay publishes it",
            "blue",
        )
    return staged.id, kept.id


async def _customer(introspect: Introspector, narrator: Narrator, confirm_id: UUID) -> None:
    """The simulated customer: answers the delivery request once the job is waiting."""
    deadline = time.monotonic() + SETTLE_BUDGET_S
    while time.monotonic() < deadline:
        info = await introspect.get(confirm_id)
        if info is not None and info.state == JobState.SUSPENDED:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)
    await publish_event("delivery.confirmed", {"order_id": "Z-9999", "received": False})
    await publish_event("delivery.confirmed", {"order_id": DELIVERY.order_id, "received": True})
    narrator.say(
        DELIVERY_EXPECTED.label,
        "the customer confirms: delivery.confirmed for A-1001 published (and one for another "
        "order, which the wait's match ignores)",
        "blue",
    )


async def _wait_for_syncs(running: asyncio.Task[None]) -> None:
    """Wait until the stock sync fired :data:`MIN_STOCK_SYNCS` times (or the budget ran out)."""
    deadline = time.monotonic() + SETTLE_BUDGET_S
    while time.monotonic() < deadline:
        if running.done():
            running.result()
        if sum(e.action == "stock" for e in SYSTEMS.ledger) >= MIN_STOCK_SYNCS:
            return
        await asyncio.sleep(0.05)


async def _sync_jobs(introspect: Introspector, running: asyncio.Task[None]) -> list[JobInfo]:
    """Answer every stock-sync job once none is live any more."""
    deadline = time.monotonic() + SETTLE_BUDGET_S
    while True:
        page = await introspect.list(JobFilter(name="shop.sync_stock", limit=MAX_JOB_PAGE))
        if time.monotonic() > deadline or all(r.state not in LIVE_STATES for r in page.rows):
            return list(page.rows)
        if running.done():
            running.result()
        await asyncio.sleep(0.05)


async def _backfill_check(
    driver: JobDriver, info: JobInfo | None, skipped: JobInfo | None
) -> Check:
    """The catalogue pass: every product repriced once, its ledger row completed, then a skip."""
    ledger = capability(driver, "backfills")
    done = None if ledger is None else await ledger.completed(reprice_catalogue.name, "")
    pages = [s for s in (info.steps if info else ()) if s.name.startswith("batch:")]
    ok = (
        SYSTEMS.repriced == dict.fromkeys(CATALOGUE, 1)
        and done is not None
        and done.rows == len(CATALOGUE)
        and len(pages) == len(CATALOGUE) // 5
        and skipped is not None
        and (skipped.result or {}).get("status") == "skipped"
    )
    return Check(
        f"the catalogue backfill repriced each of the {len(CATALOGUE)} products once in "
        f"{len(CATALOGUE) // 5} page steps, its ledger row completed, and the next enqueue was a "
        "skipped pass",
        ok,
        f"repriced {sum(SYSTEMS.repriced.values())}, pages {len(pages)}, ledger {done}, "
        f"again {None if skipped is None else skipped.result}",
    )


def _two_minutes_apart(occurrences: list[str]) -> bool:
    instants = sorted(datetime.fromisoformat(at) for at in occurrences)
    return all(
        later - earlier == timedelta(minutes=2) for earlier, later in itertools.pairwise(instants)
    ) and all(at.minute % 2 == 0 and at.second == 0 for at in instants)


def _enqueued(
    narrator: Narrator, labels: dict[str, str], label: str, result: EnqueueResult, key: str
) -> None:
    labels[str(result.id)] = label
    state = "deduped" if result.deduped else "new row"
    narrator.say(label, f"enqueued: key {key} → job {_short(result.id)} ({state})", "blue")


def _short(job_id: UUID) -> str:
    # Ids are UUIDv7: the leading digits are a timestamp shared by ids minted together.
    return f"…{str(job_id)[-8:]}"


async def _wait_settled(
    introspect: Introspector, ids: Sequence[UUID], running: asyncio.Task[None]
) -> dict[UUID, JobInfo]:
    """Poll until no job of ``ids`` is live, the budget is spent, or the worker died."""
    deadline = time.monotonic() + SETTLE_BUDGET_S
    while True:
        if running.done():
            running.result()
        infos: dict[UUID, JobInfo] = {}
        for job_id in ids:
            info = await introspect.get(job_id)
            if info is not None:
                infos[job_id] = info
        settled = all(job_id in infos and infos[job_id].state not in LIVE_STATES for job_id in ids)
        if settled or time.monotonic() > deadline:
            return infos
        await asyncio.sleep(0.05)


def _ledger_table() -> Table:
    table = Table(title="External systems: every effect, in order", title_justify="left")
    for column in ("#", "system", "action", "for", "detail"):
        table.add_column(column)
    for n, effect in enumerate(SYSTEMS.ledger, start=1):
        table.add_row(str(n), effect.system, effect.action, effect.ref, effect.detail)
    return table


def _outcome_table(expected: dict[UUID, Expected], infos: dict[UUID, JobInfo]) -> Table:
    table = Table(
        title="Outcomes, read back through driver.introspect.get(id)", title_justify="left"
    )
    for column in ("job", "tenant", "state", "attempts", "steps", "last error"):
        table.add_column(column)
    styles = {JobState.DONE: "green", JobState.DEAD: "red"}
    for job_id, expect in expected.items():
        info = infos.get(job_id)
        if info is None:
            table.add_row(expect.label, "", "[red]missing[/]", "", "", "")
            continue
        error = info.last_error or ""
        if info.last_error_code:
            error = f"{info.last_error_code}: {error}"
        table.add_row(
            expect.label,
            info.tenant_id or "",
            Text(str(info.state), styles.get(info.state, "yellow")),
            str(info.attempt),
            "\n".join(_step_text(step.name, step.status, step.attempts) for step in info.steps),
            error,
        )
    return table


def _step_text(name: str, status: str, failures: int) -> str:
    text = f"{name} {_STEP_MARKS.get(status, status)}"
    if status == "completed" and failures:
        text += f" (after {failures} failed {'call' if failures == 1 else 'calls'})"
    return text


def _checks(
    expected: dict[UUID, Expected],
    infos: dict[UUID, JobInfo],
    wanted: Counter[tuple[str, str]],
) -> list[Check]:
    checks: list[Check] = []
    for job_id, expect in expected.items():
        info = infos.get(job_id)
        claim = (
            f"{expect.label} is {expect.state} after {expect.attempts} "
            f"{'attempt' if expect.attempts == 1 else 'attempts'}: {expect.story}"
        )
        if info is None:
            checks.append(Check(claim, False, "no such job"))
            continue
        found = f"{info.state} after {info.attempt}, last error {info.last_error_code}"
        ok = info.state == expect.state and info.attempt == expect.attempts
        if expect.code is not None:
            ok = ok and info.last_error_code == expect.code
        checks.append(Check(claim, ok, found))
    # Stock syncs are checked on their own: how many fire depends on the clock.
    effects = Counter((e.action, e.ref) for e in SYSTEMS.ledger if e.action != "stock")
    diff = {
        f"{action} {ref}": f"{effects[(action, ref)]}x, expected {wanted[(action, ref)]}x"
        for action, ref in sorted(set(effects) | set(wanted))
        if effects[(action, ref)] != wanted[(action, ref)]
    }
    checks.append(
        Check(
            "the ledger holds exactly the expected effects: one charge per order despite the "
            "retries, one refund for the dead-lettered order, payouts only for shipped orders",
            not diff,
            "; ".join(f"{k}: {v}" for k, v in diff.items()),
        )
    )
    calls = SYSTEMS.warehouse_calls.get(BUSY_ORDER, 0)
    checks.append(
        Check(
            f"the warehouse was called 3 times for {BUSY_ORDER} (busy, busy, shipped)",
            calls == 3,
            f"{calls} calls",
        )
    )
    mails = [e.at for e in SYSTEMS.ledger if e.action == "email" and e.ref == SIGNUP.email]
    gap = mails[1] - mails[0] if len(mails) == 2 else 0.0
    checks.append(
        Check(
            f"the nudge went out at least 2 s after the welcome e-mail ({gap:.2f} s)",
            gap >= 2.0,
            f"{len(mails)} e-mails",
        )
    )
    return checks
