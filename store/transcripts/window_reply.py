"""The ``session.get`` reply, encoded once from the transcript's own bytes (seed 003 §5).

A window's message lines are already JSON: the host wrote them with orjson, and
the index knows each one's offset and length. When a row is indexed from its
line's bytes, :func:`describe_line` records two numbers with it
(``messages.wire_cut``, ``messages.line_crc``): how many leading bytes of the
line the client sees as they are — everything but a trailing
``"meta":{"receipt":…}`` (the receipt is the host's; ``records.wire_record``
strips it) and the closing brace — and the line's CRC-32. A reply then sends
each line's first ``wire_cut`` bytes, closes ``meta`` where only the receipt
was cut from it, and appends the index's ``seq`` (and ``turnId`` when the line
has none): no parse, no scan, one CRC per line.

A line takes the parsing path (:func:`project_line`, the projection clients
always got) when its row has no description (indexed before v24, or without
its bytes at hand), when the bytes no longer match the CRC (the file changed
under the index: the parser shows what is there, or a ``corrupt`` placeholder),
for a deleted row, for a line longer than the content cap, and for the
``messageAround`` target. :func:`describe_line` itself refuses lines whose
wire form it cannot prove to be a prefix of the bytes (a top-level ``seq``, a
receipt not last in a last ``meta``, bytes another encoder wrote).

Reads go in chunks of at most :data:`MAX_CHUNK` bytes; the reply is joined
once. Synchronous and pure of trio: it runs in a read-pool thread.
"""

from __future__ import annotations

import os
import zlib
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any, Final, Protocol

import orjson

from store.attachments import REF_MARKER, mark_evicted, quoted_refs
from store.compaction import normalize_on_read
from store.errors import CorruptData
from store.fsutil import open_nofollow
from store.jsonio import loads_line
from store.transcripts.big_line import BIG_STRING, parse_capped
from store.transcripts.records import INTERNAL_META, cap_content, projects_new_keys, wire_record
from store.transcripts.transcript import open_error

__all__ = ["MAX_CHUNK", "Row", "describe_line", "encode_window", "project_line", "with_field"]

MAX_CHUNK = 4 * 1024 * 1024
LOST_SCAN_ASK = 16 * 1024
"""A run of at least this many bytes asks first whether any blob is live (``LostBlobs.possible``) before it is
scanned for references: the statement costs ~4.4 us, the scan ~1.4 us per 4 KiB (20 us for a newest-50 page of
66 KB, 20 ms for a whole 60 MB history), so a smaller run is scanned without asking."""

Row = tuple[int, int, int, int, "str | None", "int | None", "int | None"]
"""``index.window_spans``: seq, line offset, line length, deleted, turn id, wire cut, line CRC."""

SEQ: Final = 0
OFFSET: Final = 1
LENGTH: Final = 2
DELETED: Final = 3
TURN: Final = 4
WIRE: Final = 5
CRC: Final = 6

class Lost(Protocol):
    """Of the blobs (sha256) a window's bytes name, those whose file is gone (``store.attachments.LostBlobs``)."""

    def __call__(self, shas: set[str], /) -> set[str]: ...

    def possible(self) -> bool:
        """False when no blob can be lost (none is live): the bytes need no scan for references."""
        ...

_HAS_TURN = 1  # wire_cut flags (low bits): the line has its own top-level turnId
_CLOSE_META = 2  # only the receipt was cut out of meta: close meta again
_FLAG_BITS = 2
_SEQ_TAILS = {0: b',"seq":%d},', _CLOSE_META: b'},"seq":%d},'}
_TURN_TAILS = {0: b',"seq":%d,"turnId":%b},', _CLOSE_META: b'},"seq":%d,"turnId":%b},'}
"""What follows a described line's cut, by its close-meta flag (each message ends with a comma)."""
_NL = ord("\n")
_CORRUPT: dict[str, Any] = {"type": "message", "id": None, "corrupt": True}


def describe_line(line: bytes, record: Mapping[str, Any]) -> tuple[int | None, int]:
    """``(wire_cut, crc)`` of one message line as written (``record`` parsed from it).

    ``wire_cut`` packs the count of leading bytes a reply sends as they are with two flags
    (:data:`_HAS_TURN`, :data:`_CLOSE_META`); ``None`` when the wire form is not such a prefix
    (the reply parses that line). The cut is proven, not guessed: the bytes after it must be
    exactly what orjson writes for the cut-off part.
    """
    crc = zlib.crc32(line)
    if "seq" in record or not line.endswith(b"}\n"):
        return None, crc
    flags = _HAS_TURN if "turnId" in record else 0
    meta = record.get("meta")
    if projects_new_keys(record):
        return None, crc  # wire_record projects something to the top level (provenance, steering): parsed
    if isinstance(meta, Mapping) and any(k in meta for k in INTERNAL_META[1:]):
        return None, crc  # host-only meta besides the receipt (a collaboration input's deliver answer): parsed
    if not isinstance(meta, Mapping) or "receipt" not in meta:
        return (len(line) - 2) << _FLAG_BITS | flags, crc
    if list(record)[-1] != "meta" or list(meta)[-1] != "receipt":  # the host writes both last
        return None, crc
    try:
        if len(meta) == 1:
            tail = b',"meta":' + orjson.dumps(meta) + b"}\n"
        else:
            tail = b',"receipt":' + orjson.dumps(meta["receipt"]) + b"}}\n"
            flags |= _CLOSE_META
    except orjson.JSONEncodeError:
        return None, crc
    if not line.endswith(tail):
        return None, crc
    return (len(line) - len(tail)) << _FLAG_BITS | flags, crc


def project_line(line: bytes | memoryview, row: Row, content_limit: int | None, *,
                 target: bool = False) -> dict[str, Any]:
    """The slow path: one line parsed and projected as a ``session.get`` message (``line``: its bytes, not
    copied). A line with strings over ``big_line.BIG_STRING`` bytes, read cut, is parsed without them
    (``big_line.parse_capped``): a line of tens of MiB costs its bytes, not a parse of them."""
    capped = None
    if content_limit and not target and len(line) >= BIG_STRING:
        capped = parse_capped(line, content_limit)
    try:
        rec = wire_record(loads_line(line) if capped is None else capped[0])
    except ValueError:
        rec = dict(_CORRUPT)
    if row[DELETED]:
        rec["deleted"] = True
    rec["seq"] = row[SEQ]
    if row[TURN] is not None:
        rec.setdefault("turnId", row[TURN])
    out = cap_content(rec, content_limit, selected=target)  # the messageAround target's text is shown whole
    if capped is not None and capped[1]:
        out["truncated"] = True  # a text block parse_capped cut already
    return out


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


def _runs(rows: Sequence[Row]) -> list[tuple[int, int, int, int]]:
    """:func:`_chunks`, without a step per row for the usual window: its lines lie back to back in seq order,
    so the bytes from the first line's offset to the last line's end are exactly the lines' (``lengths``), and
    a window over :data:`MAX_CHUNK` (a whole-history page) is cut where a line's end passes each chunk's limit
    (a binary search over the rows' ends: the same runs :func:`_chunks` finds)."""
    first, last = rows[0], rows[-1]
    size = last[OFFSET] + last[LENGTH] - first[OFFSET]
    if not 0 < size or size != sum(map(itemgetter(LENGTH), rows)):
        return _chunks(rows)
    if size <= MAX_CHUNK:
        return [(0, len(rows), first[OFFSET], size)]
    out: list[tuple[int, int, int, int]] = []
    i, n = 0, len(rows)
    while i < n:
        base = rows[i][OFFSET]
        j = max(bisect_right(rows, base + MAX_CHUNK, lo=i, key=_line_end), i + 1)  # a line over the limit: alone
        out.append((i, j, base, _line_end(rows[j - 1]) - base))
        i = j
    return out


def _line_end(row: Row) -> int:
    return row[OFFSET] + row[LENGTH]


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
                  target_pos: int | None = None,
                  evicted: Mapping[int, frozenset[str]] | None = None,
                  fd: int | None = None, cut_target: bool = False,
                  lost: Lost | None = None) -> tuple[bytes, dict[str, Any] | None]:
    """The whole ``session.get`` result as JSON, and the projected ``messageAround`` target (if any).

    ``evicted``: seq → evicted attachment refs its line holds (``store.attachments.evicted_marks``);
    those lines take the parsing path and their referring blocks read back marked. ``lost``: which of the
    blobs the window's bytes name are gone though no GC marked them (``store.attachments.LostBlobs``); the
    lines naming one are marked as ``evicted`` ones. ``fd``: ``path``
    open already (the caller closes it); otherwise it is opened here for the read. ``cut_target``: the
    ``messageAround`` target is capped like any message (its line alone is over the page's budget)."""
    pieces: list[Any] = [b'{"session":', orjson.dumps(dict(session)), b',"messages":[']
    target = _encode_messages(pieces, path, rows, content_limit, target_pos, evicted or {}, fd, cut_target, lost)
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
                     target_pos: int | None, evicted: Mapping[int, frozenset[str]],
                     given: int | None = None, cut_target: bool = False,
                     lost: Lost | None = None) -> dict[str, Any] | None:
    """Append the messages' pieces (comma-separated) to ``pieces``; the projected target, if any.
    ``given``: ``path`` open already (left open). ``lost``: as in :func:`encode_window`, asked once per run of
    bytes that names a blob (one ``bytes in`` test per run otherwise)."""
    if not rows:
        return None
    target: dict[str, Any] | None = None
    name = os.fspath(path)
    if given is not None:
        fd = given
    else:
        try:
            fd = open_nofollow(name, os.O_RDONLY)
        except OSError as exc:
            raise open_error(exc, name, "read transcript") from exc
    append = pieces.append
    crc32 = zlib.crc32
    seq_tails = _SEQ_TAILS
    no_target = -1 if target_pos is None else target_pos + 1  # the target's seq (never a real one: -1)
    cap = content_limit
    any_evicted = bool(evicted)
    try:
        for lo, hi, base, size in _runs(rows):
            buf = _pread_exactly(fd, size, base, name)
            view = memoryview(buf)  # slices of it are not copies: the reply's join copies each byte once
            if lost is not None and size >= LOST_SCAN_ASK and not lost.possible():
                lost = None  # no live blob: no reference in these bytes can name a lost one
            if lost is not None and REF_MARKER in buf and (gone := lost(quoted_refs(buf))):
                evicted = _with_lost(evicted, rows[lo:hi], buf, base, gone)
                any_evicted = True
            for row in rows[lo:hi] if lo or hi < len(rows) else rows:
                seq, offset, length, deleted, turn, wire, crc = row
                begin = offset - base
                if 0 <= begin and begin + length <= size:
                    span = view[begin:begin + length]
                else:  # not in the run's bytes (a line out of seq order, which the host never writes): alone
                    alone = _pread_exactly(fd, length, offset, name)
                    span = memoryview(alone)
                    if lost is not None and REF_MARKER in alone and (gone := lost(quoted_refs(alone))):
                        evicted = _with_lost(evicted, [row], alone, offset, gone)
                        any_evicted = True
                # the fast path: a described line, its bytes intact, shown whole (a whole-history read
                # takes it for every line: the loop is kept to what it must check)
                if (wire is not None and not deleted and seq != no_target and (cap is None or length <= cap)
                        and (not any_evicted or seq not in evicted)):
                    if crc32(span) == crc:
                        append(span[:wire >> _FLAG_BITS])
                        if turn is None or wire & _HAS_TURN:
                            append(seq_tails[wire & _CLOSE_META] % seq)
                        else:
                            append(_TURN_TAILS[wire & _CLOSE_META] % (seq, orjson.dumps(turn)))
                        continue
                rec = project_line(span[:-1] if length and span[-1] == _NL else span, row, content_limit,
                                   target=seq == no_target and not cut_target)
                if seq in evicted:
                    mark_evicted(rec, evicted[seq])
                if seq == no_target:
                    target = rec
                append(orjson.dumps(rec) + b",")
        pieces[-1] = pieces[-1][:-1]  # every message ends with a comma: not the last one
    finally:
        if given is None:
            os.close(fd)
    return target


def _with_lost(evicted: Mapping[int, frozenset[str]], rows: Sequence[Row], buf: bytes, base: int,
               gone: set[str]) -> dict[int, frozenset[str]]:
    """``evicted`` and, for each row whose line (in ``buf``, read from offset ``base``) names a ``gone`` blob,
    that blob's ref."""
    out = dict(evicted)
    needles = [(f"attachments/{sha}", f'"attachments/{sha}"'.encode()) for sha in sorted(gone)]
    for row in rows:
        begin = row[OFFSET] - base
        if begin < 0 or begin + row[LENGTH] > len(buf):
            continue  # read alone: checked there
        refs = {ref for ref, needle in needles if buf.find(needle, begin, begin + row[LENGTH]) >= 0}
        if refs:
            out[row[SEQ]] = out.get(row[SEQ], frozenset()) | refs
    return out


def _loads_or_corrupt(blob: bytes) -> dict[str, Any]:
    try:
        return loads_line(blob)
    except ValueError:
        return dict(_CORRUPT)
