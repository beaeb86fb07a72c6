"""Showing text that came from a file or an input inside a message.

A header cell or a key is untrusted content: printed raw it can forge a log line (a newline),
restyle a terminal (an escape sequence), reorder what a reader sees (a bidirectional override) or
carry instructions to whoever reads ``jobsctl show``. :func:`shown` renders it as an ASCII-only
Python literal, cut to a bound, so none of that survives.
"""

from __future__ import annotations

SHOWN_CHARS = 40
"""How many characters of an untrusted name a message shows before cutting it."""


def shown(text: str, limit: int = SHOWN_CHARS) -> str:
    r"""Answer ``text`` as an ASCII-only quoted literal of at most ``limit`` characters.

    Every non-ASCII and control character becomes an escape (``\x1b``, ``\u202e``); past
    ``limit`` characters the rest is replaced by ``...`` after the closing quote.

    Args:
        text: the untrusted text.
        limit: how many characters of it to keep.
    """
    cut = text[:limit]
    return ascii(cut) + ("..." if len(text) > limit else "")
