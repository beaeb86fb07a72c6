r"""Record boundaries, found on bytes.

A page is a byte window of the object. Its complete records end at the last ``\n`` that lies
outside quotes; whatever follows is left for the next page, which re-reads it (nothing is carried
between steps, so a page's checkpoint is a byte offset and nothing else). ``0x0A`` and ``0x22``
never occur inside a multi-byte UTF-8 sequence, so the scan needs no decoding and a record is
decoded with the page and a bad byte, kept by ``surrogateescape``, refuses its own row only.

Quote state is parity: from a record boundary, a ``\n`` is outside quotes exactly when an even
number of ``"`` precede it (a doubled ``""`` counts two). NDJSON has no quoting (a JSON string
cannot hold a raw newline), so every ``\n`` ends a record there.
"""

from __future__ import annotations

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


def split_records(text: str, *, quoted: bool) -> tuple[list[str], list[int] | None]:
    r"""Split a page's decoded text into records; answer them and their first lines.

    Args:
        text: the page's complete records, decoded (a bad byte as a lone surrogate, by
            ``surrogateescape``, so encoding a record back gives its exact bytes).
        quoted: CSV (a ``\n`` inside ``"`` does not end a record) rather than NDJSON.

    Returns:
        ``(records, first_lines)``: each record without its ``\n`` (a CRLF file's records end
        in ``\r``), and the 0-based index within ``text`` of the physical line each starts on,
        or ``None`` when every record is one line (record ``i`` starts on line ``i``). Blank
        records are included (the caller skips them). A CSV record whose quotes never close
        (possible only at the object's end) runs to the end of ``text``.
    """
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    if not quoted or '"' not in text:
        return lines, None
    # Parity: a line with an odd number of quotes opens a quoted newline, and the next such line
    # closes it; the lines between hold an even number. Only these lines are looked at twice.
    odd = [index for index, line in enumerate(lines) if '"' in line and line.count('"') & 1]
    if not odd:
        return lines, None
    records: list[str] = []
    firsts: list[int] = []
    done = 0
    for pair in range(0, len(odd), 2):
        opens = odd[pair]
        closes = odd[pair + 1] if pair + 1 < len(odd) else len(lines) - 1
        records += lines[done:opens]
        firsts += range(done, opens)
        records.append("\n".join(lines[opens : closes + 1]))
        firsts.append(opens)
        done = closes + 1
    records += lines[done:]
    firsts += range(done, len(lines))
    return records, firsts


__all__ = ["BOM", "complete_length", "split_records"]
