"""What both factories need at declaration: the duplicate-name check a factory cannot inherit.

:func:`jobs_core.job` tells a module reload (the same function declared again, which replaces the
old handle) from a second job of the same name (``X_JOB_DUPLICATE``) by the body's source
location. Every job a factory declares has the factory's own body, so that test would take two
webhooks of one name for a reload and let the second replace the first. Here the location that
counts is the factory's caller: the same call site again is a reload, any other is a duplicate.
"""

from __future__ import annotations

import sys

from jobs_core import REGISTRY
from jobs_core.errors import JobDuplicateError
from jobs_core.job import JobRegistry

_CALL_SITES: dict[tuple[int, str], tuple[str, int]] = {}


def claim_name(registry: JobRegistry | None, name: str, factory: str) -> None:
    """Refuse ``name`` if another declaration holds it, unless this is the same call site again.

    Called by the factory itself, so its caller is two frames up.

    Raises:
        JobDuplicateError: ``X_JOB_DUPLICATE`` naming both declarations' sites.
    """
    reg = registry if isinstance(registry, JobRegistry) else REGISTRY
    caller = sys._getframe(2)
    site = (caller.f_code.co_filename, caller.f_lineno)
    key = (id(reg), name)
    if reg.get(name) is not None and _CALL_SITES.get(key) != site:
        held = _CALL_SITES.get(key)
        where = f"{held[0]}:{held[1]}" if held else "a job() declaration"
        raise JobDuplicateError(
            f"two jobs are named {name!r}: {where} and the {factory}() at {site[0]}:{site[1]}; "
            "give one of them another name=",
            name=name,
        )
    _CALL_SITES[key] = site
