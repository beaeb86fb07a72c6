r"""Record boundaries, found on bytes.

A page is a byte window of the object. Its complete records end at the last ``\n`` that lies
outside quotes; whatever follows is left for the next page, which re-reads it (nothing is carried
between steps, so a page's checkpoint is a byte offset and nothing else). ``0x0A`` and ``0x22``
never occur inside a multi-byte UTF-8 sequence, so the scan needs no decoding and a record is
decoded on its own: one bad byte refuses one row, never the page.

Quote state is parity: from a record boundary, a ``\n`` is outside quotes exactly when an even
number of ``"`` precede it (a doubled ``""`` counts two). NDJSON has no quoting (a JSON string
cannot hold a raw newline), so every ``\n`` ends a record there.
"""

from __future__ import annotations

from collections.abc import Iterator

BOM = b"\xef\xbb\xbf"
"""The UTF-8 byte-order mark a spreadsheet's "CSV UTF-8" puts at the start of a file."""

_QUOTE = b'"'
_NL = b"\n"


def complete_length(data: bytes, *, at_eof: bool, quoted: bool) -> int:
    r"""Answer how many leading bytes of ``data`` are complete records (``0``: not one).

    Args:
        data: the page's bytes, starting at a record boundary.
        at_eof: ``data`` runs to the object's end, so its last record needs no ``\n``.
        quoted: CSV (``"`` quotes newlines) rather than NDJSON.
    """
    if at_eof:
        return len(data)
    if not quoted:
        return data.rfind(_NL) + 1
    total = data.count(_QUOTE)
    after = 0
    pos = len(data)
    while True:
        newline = data.rfind(_NL, 0, pos)
        if newline < 0:
            return 0
        # Quotes between this newline and the previous candidate, accumulated, so the scan is
        # linear however many quoted newlines the tail holds.
        after += data.count(_QUOTE, newline, pos)
        if (total - after) % 2 == 0:
            return newline + 1
        pos = newline


def split_records(region: bytes, *, quoted: bool) -> Iterator[tuple[int, bytes]]:
    r"""Yield ``(first_line, record)`` for every record of ``region``.

    ``first_line`` is the 0-based index of the record's first physical line within ``region``;
    ``record`` excludes its terminating ``\n`` (a CRLF file's records end in ``\r``). Blank
    records are yielded too (the caller skips them). A CSV record whose quotes never close (only
    possible at the object's end) runs to the end of ``region``.
    """
    lines = region.split(_NL)
    if region.endswith(_NL):
        lines.pop()
    count = len(lines)
    index = 0
    while index < count:
        first = index
        line = lines[index]
        index += 1
        if quoted and line.count(_QUOTE) & 1:
            parts = [line]
            while index < count:
                following = lines[index]
                index += 1
                parts.append(following)
                if following.count(_QUOTE) & 1:
                    break
            line = _NL.join(parts)
        yield first, line


__all__ = ["BOM", "complete_length", "split_records"]
