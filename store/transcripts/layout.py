"""Transcript layout: where every message and compaction line is (seed 003 §5).

The layout is derived data the session actor caches in memory so that serving
a window seeks to its lines instead of parsing the history before them. It is
valid for one file identity (header ``epoch``) and one length (``file_len``):

* a longer file with the same epoch is scanned from the previous end only;
* a shorter file, or a different epoch (the file was rewritten), is rescanned;
* a torn trailing line is excluded from both the offsets and ``file_len``, so a
  later refresh picks it up once complete.

Message lines are classified by :func:`classify_line`, a depth-aware scan of
the top-level keys that never builds the line's value. A classified line is
not validated: window readers still parse the spans they read.
"""

from __future__ import annotations

import os
import re
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

import orjson

from store.errors import classify_os_error
from store.fsutil import open_nofollow
from store.jsonio import loads_line
from store.transcripts.transcript import IMPORT_RECEIPT, open_error, parse_header, read_first_line

__all__ = ["Layout", "ScanStats", "classify_line", "scan_layout", "spans"]

_CHUNK = 1 << 20
_STR = rb'"([^"\\]*(?:\\.[^"\\]*)*)"'
# Our own lines: {"type":"<t>","id":"<i>", ... with no escapes in either value.
_FAST_RE = re.compile(rb'\{"type":"([^"\\]*)"(?:,"id":"([^"\\]*)")?([,}])')
_TOKEN_RE = re.compile(_STR + rb"|[{}\[\]]", re.DOTALL)
_COLON_RE = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*")
_STRING_AT_RE = re.compile(_STR, re.DOTALL)
_SPECIAL_KINDS = frozenset({"tombstone", "session_info"})


def _unescape(raw: bytes) -> str | None:
    try:
        if b"\\" not in raw:
            return raw.decode("utf-8")
        value = orjson.loads(b'"' + raw + b'"')
    except (UnicodeDecodeError, orjson.JSONDecodeError):
        return None
    return value if isinstance(value, str) else None


def classify_line(line: bytes) -> tuple[str | None, str | None]:
    """The top-level ``type`` and ``id`` string values of one line, without parsing it.

    Only keys of the outermost object count: a nested ``{"type": ...}`` inside a
    tool result does not. Non-string values give ``None``. A line that cannot be
    a JSON object (no leading ``{``, no closing ``}``, a NUL byte) gives
    ``(None, None)``.
    """
    body = line.rstrip(b" \t\r\n")
    if not body.endswith(b"}") or b"\x00" in body:
        return None, None
    fast = _FAST_RE.match(body)
    if fast is not None:
        kind = _unescape(fast.group(1))
        if fast.group(2) is not None:
            return kind, _unescape(fast.group(2))
        if fast.group(3) == b"}":
            return kind, None
    return _scan_top_level(body)


def _scan_top_level(body: bytes) -> tuple[str | None, str | None]:
    start = len(body) - len(body.lstrip(b" \t\r\n"))
    if body[start : start + 1] != b"{":
        return None, None
    found: dict[str, str | None] = {}
    depth = 0
    for token in _TOKEN_RE.finditer(body, start):
        text = token.group()
        first = text[0:1]
        if first == b'"':
            if depth != 1:
                continue
            colon = _COLON_RE.match(body, token.end())
            if colon is None:
                continue  # a value, not a key
            key = _unescape(token.group(1))
            if key not in ("type", "id") or key in found:
                continue
            value = _STRING_AT_RE.match(body, colon.end())
            found[key] = _unescape(value.group(1)) if value is not None else None
            if len(found) == 2:
                break
        elif first in (b"{", b"["):
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                break
    return found.get("type"), found.get("id")


@dataclass
class ScanStats:
    """What the last :func:`scan_layout` call read."""

    full: bool = True
    bytes_scanned: int = 0
    lines_scanned: int = 0


@dataclass
class Layout:
    """Byte offsets of a transcript's lines, valid for (``epoch``, ``file_len``)."""

    file_len: int = 0
    """End of the last complete line the offsets were measured against."""
    epoch: str | None = None
    header_len: int = 0
    ids: list[str] = field(default_factory=list)
    """Message ids in position order (deduped: first position, newest line)."""
    offsets: array[int] = field(default_factory=lambda: array("q"))
    lengths: array[int] = field(default_factory=lambda: array("q"))
    positions: dict[str, int] = field(default_factory=dict)
    compactions: list[tuple[str, int, int]] = field(default_factory=list)
    """(id, offset, length) in file order, deduped by id as the reader does (first position, newest line)."""
    compaction_positions: dict[str, int] = field(default_factory=dict)
    specials: list[tuple[str, int, int]] = field(default_factory=list)
    """(type, offset, length) of tombstone and session_info lines."""
    bad_offsets: list[int] = field(default_factory=list)
    unknown_lines: int = 0
    torn_tail: bool = False
    last_scan: ScanStats = field(default_factory=ScanStats)

    @property
    def message_count(self) -> int:
        return len(self.ids)


def _iter_lines(fd: int, start: int, size: int, stats: ScanStats) -> Iterator[tuple[int, bytes]]:
    """(offset, line without newline) for each complete line in [start, size)."""
    carry = b""
    carry_at = start
    pos = start
    while pos < size:
        chunk = os.pread(fd, min(_CHUNK, size - pos), pos)
        if not chunk:
            break
        pos += len(chunk)
        stats.bytes_scanned += len(chunk)
        buf = carry + chunk if carry else chunk
        begin = 0
        while True:
            nl = buf.find(b"\n", begin)
            if nl < 0:
                break
            stats.lines_scanned += 1
            yield carry_at + begin, buf[begin:nl]
            begin = nl + 1
        carry = buf[begin:]
        carry_at += begin


_Entry = tuple[str, str | None, int, int]  # (kind, id, offset, length)


def _classify_region(fd: int, start: int, size: int, stats: ScanStats) -> tuple[list[_Entry], int]:
    """Classify every complete line in [start, size); returns entries and the end offset."""
    entries: list[_Entry] = []
    end = start
    for offset, line in _iter_lines(fd, start, size, stats):
        length = len(line) + 1
        end = offset + length
        kind, ident = classify_line(line)
        if kind is None:
            entries.append(("", None, offset, length))
        elif kind in _SPECIAL_KINDS or (kind == "session" and offset == 0):
            # Rare lines: parse fully so a garbled one is reported, not trusted.
            try:
                loads_line(line)
            except ValueError:
                kind = ""
            entries.append((kind, ident, offset, length))
        else:
            entries.append((kind, ident, offset, length))
    return entries, end


def _apply(layout: Layout, entries: list[_Entry]) -> None:
    for kind, ident, offset, length in entries:
        if kind == "message":
            if not ident:
                layout.bad_offsets.append(offset)
                continue
            pos = layout.positions.get(ident)
            if pos is None:
                layout.positions[ident] = len(layout.ids)
                layout.ids.append(ident)
                layout.offsets.append(offset)
                layout.lengths.append(length)
            else:
                layout.offsets[pos] = offset
                layout.lengths[pos] = length
        elif kind == "compaction":
            if not ident:
                layout.bad_offsets.append(offset)
                continue
            at = layout.compaction_positions.get(ident)
            if at is None:
                layout.compaction_positions[ident] = len(layout.compactions)
                layout.compactions.append((ident, offset, length))
            else:
                layout.compactions[at] = (ident, offset, length)
        elif kind in _SPECIAL_KINDS:
            layout.specials.append((kind, offset, length))
        elif kind == "session" and offset == 0:
            layout.header_len = length
        elif kind == IMPORT_RECEIPT:  # an import's receipt: nothing a window shows
            pass
        elif kind == "":
            layout.bad_offsets.append(offset)
        else:
            layout.unknown_lines += 1


def scan_layout(path: str | os.PathLike[str], prev: Layout | None = None) -> Layout:
    """Build or refresh the layout of the transcript at ``path``.

    With ``prev`` for the same file (same header epoch, file not shorter), only
    the bytes after ``prev.file_len`` are scanned and ``prev`` is updated in
    place and returned; it is left untouched if the scan fails. Otherwise a new
    layout is built from a full scan.
    """
    target = os.fspath(path)
    try:
        fd = open_nofollow(target, os.O_RDONLY)
    except OSError as exc:
        raise open_error(exc, target, "scan transcript") from exc
    try:
        size = os.fstat(fd).st_size
        epoch = _epoch_of(fd)
        stats = ScanStats()
        if prev is not None and _same_file(fd, prev, epoch, size):
            stats.full = False
            entries, end = _classify_region(fd, prev.file_len, size, stats)
            _apply(prev, entries)
            if entries:
                prev.file_len = end
            prev.torn_tail = prev.file_len < size
            prev.last_scan = stats
            return prev
        layout = Layout(epoch=epoch)
        entries, end = _classify_region(fd, 0, size, stats)
        _apply(layout, entries)
        layout.file_len = end
        layout.torn_tail = end < size
        layout.last_scan = stats
        return layout
    except OSError as exc:
        raise classify_os_error(exc, f"scan transcript {target}") from exc
    finally:
        os.close(fd)


def _epoch_of(fd: int) -> str | None:
    first = read_first_line(fd)
    if first is None:
        return None
    try:
        header = parse_header(loads_line(first), len(first))
    except ValueError:
        return None
    return None if header is None else header.epoch


def _same_file(fd: int, prev: Layout, epoch: str | None, size: int) -> bool:
    if prev.file_len == 0 or prev.epoch != epoch or size < prev.file_len:
        return False
    # The previous end must still be a line boundary, or this is another file.
    return os.pread(fd, 1, prev.file_len - 1) == b"\n"


def spans(layout: Layout, start: int, end: int) -> list[tuple[int, int]]:
    """(offset, length) of the message lines at positions ``start <= p < end`` (clipped)."""
    lo = max(0, start)
    hi = min(end, len(layout.ids))
    return [(layout.offsets[p], layout.lengths[p]) for p in range(lo, hi)]
