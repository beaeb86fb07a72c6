"""The worker app of the kill tests: the test schema's subject, its erase and its export.

``SUBJECT_APP_SCHEMA`` names the app tables' schema and ``SUBJECT_APP_EXPORTS`` the local
folder exports go to. With ``SUBJECT_STALL_STEP=<step name>`` a fault hook (``jobs_core.
faults``) stops the worker at that step's ``returned`` boundary: the step's write has committed
and its output is not yet stored, the worst moment to die. It writes ``SUBJECT_STALL_MARK`` and
waits; the test SIGKILLs the process there.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pydantic import BaseModel

import subject_world
from jobs_core import Retry
from jobs_core.faults import Boundary, install_fault_hook
from jobs_import_export import local_sink
from jobs_subject import subject_erase, subject_export

SCHEMA = os.environ.get("SUBJECT_APP_SCHEMA", "public")
EXPORTS = os.environ.get("SUBJECT_APP_EXPORTS", "/nonexistent")
STALL_STEP = os.environ.get("SUBJECT_STALL_STEP", "")
MARK = os.environ.get("SUBJECT_STALL_MARK", "")

BATCH = 2
"""Parent keys per page: a handful of users' rows make dozens of steps."""


class Person(BaseModel):
    user_id: int


user = subject_world.declare(SCHEMA, name="user", batch=BATCH)

erase_user = subject_erase(
    name="subject.kill.erase",
    input=Person,
    tenant="none",
    subject=user,
    retry=Retry(attempts=3, delay="100ms"),
)

export_user = subject_export(
    name="subject.kill.export",
    input=Person,
    tenant="none",
    subject=user,
    sink=lambda: local_sink(EXPORTS),
    prefix=lambda i: f"subjects/{i.user_id}",
    retry=Retry(attempts=3, delay="100ms"),
)


async def _stall(boundary: Boundary) -> None:
    if boundary.point == "returned" and boundary.step == STALL_STEP:
        Path(MARK).write_text(boundary.step)  # noqa: ASYNC240 - one small write, then death
        await asyncio.sleep(3600)  # the test SIGKILLs the process here


if STALL_STEP:
    install_fault_hook(_stall)
