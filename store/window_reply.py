"""The ``session.get`` reply, encoded once from the transcript's own bytes (seed 003 §5).

A window's message lines are already JSON: the host wrote them with orjson, and
the index knows each one's offset and length. Most lines reach the client as
they are, with the index's ``seq`` (and ``turnId``) appended, so a whole-history
read costs one sequential read of the lines and a few byte scans per line, not
a parse and a re-encode of every message. The one part of a line that may need
a change is its top-level ``meta`` (the receipt is stripped from it, as
``records.wire_record`` does): the host writes ``meta`` last, so only that tail
is parsed and re-encoded (:func:`_splice_into`).

A line takes the parsing path (:func:`project_line`, exactly the old
projection) when the bytes do not prove the splice right: a deleted row, a line
longer than the content cap, the ``messageAround`` target, a line that does not
start like the host's own message lines, a ``seq`` (or, with a turn, a
``turnId``) key anywhere before the tail, a tail that does not parse on its
own. Every check can only send a line to the slow path: a key the change would
touch shows up as its quoted name in the bytes (string contents have their
quotes escaped).

Damage: the index vouches for the lines it points at (they parsed when they
were indexed). The byte path still refuses the damage a crash or a disk leaves
behind — a zeroed block (NUL bytes), a line cut short (no closing brace), lines
broken apart or run together (newline count, ``}{"type":``) — and sends those
lines through the parser, which shows an unreadable one as a ``corrupt``
placeholder like before. A same-length overwrite with other printable bytes is
outside what these checks see; ``pi-host doctor`` finds it (every line parsed
against its index row) and repairs the index.

Reads go in chunks of at most :data:`MAX_CHUNK` bytes and the reply grows in
one buffer, so the memory of a whole-history read is about the reply's size.
Synchronous and pure of trio: it runs in a read-pool thread.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import orjson

from .compaction import normalize_on_read
from .errors import CorruptData
from .fsutil import open_nofollow
from .jsonio import loads_line
from .records import cap_content, wire_record
from .transcript import open_error

__all__ = ["MAX_CHUNK", "Row", "encode_window", "project_line", "with_field"]

MAX_CHUNK = 4 * 1024 * 1024

Row = tuple[int, int, int, int, "str | None"]
"""``index.window_spans``: seq, line offset, line length, deleted, turn id."""

SEQ: Final = 0
OFFSET: Final = 1
LENGTH: Final = 2
DELETED: Final = 3
TURN: Final = 4

_MESSAGE_PREFIX = b'{"type":"message"'
_CORRUPT: dict[str, Any] = {"type": "message", "id": None, "corrupt": True}


def project_line(line: bytes, row: Row, content_limit: int | None, *, target: bool = False) -> dict[str, Any]:
    """The slow path: one line parsed and projected as a ``session.get`` message."""
    try:
        rec = wire_record(loads_line(line))
    except ValueError:
        rec = dict(_CORRUPT)
    if row[DELETED]:
        rec["deleted"] = True
    rec["seq"] = row[SEQ]
    if row[TURN] is not None:
        rec.setdefault("turnId", row[TURN])
    if target and rec.get("role") in ("user", "assistant"):
        return rec  # the messageAround target is shown whole
    return cap_content(rec, content_limit)


def _splice(buf: bytes, view: memoryview, begin: int, stop: int, row: Row,
            content_limit: int | None) -> list[Any] | None:
    """The pieces of ``buf[begin:stop]`` (one line, no newline) as the client sees it, from its bytes.

    ``None`` when the line needs the parsing path. A top-level ``meta`` is the only part that may
    need a change (its receipt): the host writes it last, so the line's tail from the last
    ``,"meta":{`` is parsed on its own; it parses as one object only if that comma is a top-level
    one (a nested one leaves closing brackets over, and a string cannot hold the unescaped
    quotes). Everything before it goes out as it is.
    """
    if row[DELETED] or stop - begin < len(_MESSAGE_PREFIX) + 1 or buf[stop - 1] != 0x7D:  # "}"
        return None
    if content_limit is not None and stop - begin > content_limit:
        return None  # a text longer than the cap could be inside
    if not buf.startswith(_MESSAGE_PREFIX, begin) or buf.find(b'}{"type":', begin, stop) >= 0:
        return None  # not one of the host's message lines, or two lines run together
    turn = row[TURN]
    head_end = stop - 1  # before the record's closing brace
    pieces: list[Any] = []
    at = buf.rfind(b',"meta":{', begin, stop)
    if at >= 0:
        try:
            tail = orjson.loads(b"{" + buf[at + 1:stop])
        except orjson.JSONDecodeError:
            return None  # the last one is nested: a top-level meta may sit before it
        if not isinstance(tail, dict) or "seq" in tail or (turn is not None and "turnId" in tail):
            return None
        head_end = at
        rest = wire_record(tail)
        if rest:
            pieces.append(b"," + orjson.dumps(rest)[1:-1])
    if buf.find(b'"seq"', begin, head_end) >= 0 or (turn is not None and buf.find(b'"turnId"', begin, head_end) >= 0):
        return None  # the key may be a top-level one: let the parser decide
    pieces.insert(0, view[begin:head_end])
    if turn is None:
        pieces.append(b',"seq":%d}' % row[SEQ])
    else:
        pieces.append(b',"seq":%d,"turnId":%b}' % (row[SEQ], orjson.dumps(turn)))
    return pieces


def _chunks(rows: Sequence[Row]) -> list[tuple[int, int, int, int]]:
    """Runs of rows whose lines lie back to back: (first row, end row, offset, bytes)."""
    out: list[tuple[int, int, int, int]] = []
    for i, row in enumerate(rows):
        offset, length = row[OFFSET], row[LENGTH]
        if out:
            first, _, off, size = out[-1]
            if off + size == offset and size + length <= MAX_CHUNK:
                out[-1] = (first, i + 1, off, size + length)
                continue
        out.append((i, i + 1, offset, length))
    return out


def _pread_exactly(fd: int, length: int, offset: int, path: str) -> bytes:
    got = os.pread(fd, length, offset)
    while len(got) < length:
        more = os.pread(fd, length - len(got), offset + len(got))
        if not more:
            raise CorruptData(f"{path}: index points past the end of the file ({offset}+{length})",
                              data={"path": path})
        got += more
    return got


def encode_window(path: Path, session: Mapping[str, Any], rows: Sequence[Row], compaction_lines: Sequence[bytes],
                  *, start: int, end: int, total: int, content_limit: int | None,
                  target_pos: int | None = None) -> tuple[bytes, dict[str, Any] | None]:
    """The whole ``session.get`` result as JSON, and the projected ``messageAround`` target (if any)."""
    pieces: list[Any] = [b'{"session":', orjson.dumps(dict(session)), b',"messages":[']
    target = _encode_messages(pieces, path, rows, content_limit, target_pos)
    compactions = [wire_record(normalize_on_read(_loads_or_corrupt(b))) for b in compaction_lines]
    tail = orjson.dumps({
        "compactions": compactions, "messageStart": start, "messageEnd": end,
        "hasMoreBefore": start > 0, "hasMoreAfter": end < total, "totalMessages": total,
    })
    pieces.append(b"],")
    pieces.append(memoryview(tail)[1:])
    return b"".join(pieces), target


def with_field(reply: bytes, key: str, value: Any) -> bytes:
    """``reply`` (an encoded JSON object) with one more top-level field."""
    return reply[:-1] + b"," + orjson.dumps(key) + b":" + orjson.dumps(value) + b"}"


def _encode_messages(pieces: list[Any], path: Path, rows: Sequence[Row], content_limit: int | None,
                     target_pos: int | None) -> dict[str, Any] | None:
    """Append the messages' pieces (comma-separated) to ``pieces``; the projected target, if any."""
    if not rows:
        return None
    target: dict[str, Any] | None = None
    name = os.fspath(path)
    try:
        fd = open_nofollow(name, os.O_RDONLY)
    except OSError as exc:
        raise open_error(exc, name, "read transcript") from exc
    try:
        comma = False
        for lo, hi, offset, size in _chunks(rows):
            buf = _pread_exactly(fd, size, offset, name)
            # Damage the per-line checks could miss (a zeroed block, a line broken in two)
            # sends the whole chunk down the parsing path.
            newlines = (hi - lo) - (0 if buf.endswith(b"\n") else 1)
            intact = buf.find(b"\x00") < 0 and buf.count(b"\n") == newlines
            view = memoryview(buf)  # slices of it stay in ``pieces`` until the reply is joined
            pos = 0
            for row in rows[lo:hi]:
                begin, stop = pos, pos + row[LENGTH]
                pos = stop
                if stop > begin and buf[stop - 1] == 0x0A:  # "\n"
                    stop -= 1
                if comma:
                    pieces.append(b",")
                comma = True
                is_target = target_pos is not None and row[SEQ] - 1 == target_pos
                spliced = _splice(buf, view, begin, stop, row, content_limit) if intact and not is_target else None
                if spliced is not None:
                    pieces.extend(spliced)
                    continue
                rec = project_line(buf[begin:stop], row, content_limit, target=is_target)
                if is_target:
                    target = rec
                pieces.append(orjson.dumps(rec))
    finally:
        os.close(fd)
    return target


def _loads_or_corrupt(blob: bytes) -> dict[str, Any]:
    try:
        return loads_line(blob)
    except ValueError:
        return dict(_CORRUPT)
