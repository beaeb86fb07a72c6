"""The Lua scripts, one per operation, shipped as ``.lua`` files beside this module.

Each file opens with a comment listing its KEYS, ARGV and reply. A script is sent by SHA1
(``EVALSHA``); the SHA is computed here from the shipped text, so nothing is sent until the first
call, and a server that answers ``NOSCRIPT`` (a fresh or restarted one: scripts are not
persisted) is given the text with ``SCRIPT LOAD`` once and asked again
(:meth:`jobs_redis._connection.Connection.run`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources import files


@dataclass(frozen=True, slots=True)
class Script:
    """One shipped Lua script.

    Attributes:
        name: the file's stem (``"claim"``).
        text: its source.
        sha: the SHA1 hex digest ``EVALSHA`` names it by.
    """

    name: str
    text: str
    sha: str


def _load_all() -> dict[str, Script]:
    found: dict[str, Script] = {}
    for entry in files("jobs_redis").joinpath("lua").iterdir():
        if entry.name.endswith(".lua"):
            text = entry.read_text(encoding="utf-8")
            name = entry.name.removesuffix(".lua")
            found[name] = Script(name, text, hashlib.sha1(text.encode("utf-8")).hexdigest())
    return found


SCRIPTS: dict[str, Script] = _load_all()
"""Every shipped script by name (a test checks each one is called by the driver)."""
