"""Bounded, read-only reading of source files: JSONL line by line, small JSON documents.

Memory is one read chunk plus at most one line of ``max_line_bytes``: a longer
line is skipped without being held (its bytes are still hashed), and an
incomplete last line is left unconsumed. A last line without its newline that is
one complete JSON object is a complete line (its writer or an editor dropped the
newline: a prefix of a line never parses as a whole object), as the native pi view
reads it; a UTF-8 byte order mark before the first line is not part of it. A file that several passes read
(a Claude Code subagent file) may be read once into a bounded :class:`Snapshot` the passes share.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from store.interchange.importers.report import FileReport

__all__ = ["PEEK_CHUNK", "Line", "LineReader", "Snapshot", "file_report", "lines_of", "open_source", "parse_counted",
           "parse_object", "peek_field", "read_bounded", "read_json_file", "read_snapshot", "read_span"]



@dataclass(frozen=True, slots=True)
class Line:
    offset: int
    data: bytes | None
    """The line without its newline; None when it was longer than the limit (skipped unread)."""
    length: int
    """Bytes of the line including its newline."""


def open_source(path: Path) -> int:
    """Open a source file read-only: no symlink at the last component, regular files only. A symlink is
    refused saying so (the kernel's word for it, "too many levels of symbolic links", reads as a loop)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            raise OSError(errno.ELOOP, f"{path} is a symbolic link, which an import does not follow: "
                                       "import the file it points to") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


class LineReader:
    """Iterate the complete lines of a file with a per-line byte bound.

    Memory is one read chunk plus at most one line of ``max_line_bytes``. After
    the iteration ``consumed`` is the offset just past the last complete line,
    ``sha256`` the digest of bytes ``[0, consumed)`` and ``torn_tail_bytes`` the
    incomplete rest. ``mark``: an offset whose prefix digest to keep on the way
    (:attr:`at_mark`), so a re-import learns what the file held where the last
    import stopped without reading it again. ``digest=False``: a pass that reports nothing of the file (a
    read-ahead) skips the hashing.
    """

    def __init__(self, path: Path, *, max_line_bytes: int, chunk: int = 1 << 20, start: int = 0,
                 end: int | None = None, unterminated_last_line: bool = True, mark: int | None = None,
                 digest: bool = True, snapshot: Snapshot | None = None) -> None:
        self.path = path
        self.snapshot = snapshot
        """The file's bytes as one earlier read took them (:func:`read_snapshot`): read from memory, not the disk."""
        self.unterminated_last_line = unterminated_last_line
        """A last line without its newline that parses as one JSON object is read (sources); the host's
        own files say False: there such a line is a torn tail."""
        self.start = start
        self.end = end
        """Stop at this offset (a line boundary): read ``[start, end)`` only."""
        self.max_line_bytes = max_line_bytes
        self.chunk = chunk
        self.consumed = start
        self.torn_tail_bytes = 0
        self.size = 0
        self.mtime_ns = 0
        self._hash = hashlib.sha256()
        self._digest = digest
        """False: no digest is taken (a pass that reports nothing of the file: :attr:`sha256` is of no bytes)."""
        self._hashed = start
        """The offset the digest has reached (bytes are hashed in file order)."""
        self._mark = mark if mark is not None and mark > 0 and start == 0 else None
        self._at_mark: str | None = None

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    @property
    def at_mark(self) -> tuple[int, str] | None:
        """``(mark, SHA-256 of bytes [0, mark))`` once the iteration hashed that far and consumed it (None: no
        mark, a reader that does not start at byte 0, or the file ends before the mark)."""
        if self._mark is None or self._at_mark is None or self._mark > self.consumed:
            return None
        return self._mark, self._at_mark

    def _feed(self, data: bytes | bytearray) -> None:
        """Hash the next bytes of the file, keeping the digest at the mark as it is passed."""
        end = self._hashed + len(data)
        if not self._digest:
            self._hashed = end
            return
        mark = self._mark
        if mark is not None and self._at_mark is None and self._hashed < mark <= end:
            cut = mark - self._hashed
            with memoryview(data) as view:  # released at once: ``data`` may be a bytearray cleared next
                self._hash.update(view[:cut])
                self._at_mark = self._hash.hexdigest()
                self._hash.update(view[cut:])
        else:
            self._hash.update(data)
        self._hashed = end

    def __iter__(self) -> Iterator[Line]:
        if self.snapshot is not None:
            data = self.snapshot.data
            self.size, self.mtime_ns = len(data), self.snapshot.mtime_ns
            at = [self.start]

            def take(want: int) -> bytes:
                piece = data[at[0]:at[0] + want]
                at[0] += len(piece)
                return piece

            yield from self._lines(take)
            return
        fd = open_source(self.path)
        try:
            st = os.fstat(fd)
            self.size, self.mtime_ns = st.st_size, st.st_mtime_ns
            if self.start:
                os.lseek(fd, self.start, os.SEEK_SET)
            yield from self._lines(functools.partial(os.read, fd))
        finally:
            os.close(fd)

    def _lines(self, read: Callable[[int], bytes]) -> Iterator[Line]:
        pending = bytearray()  # the current partial line (when not skipping)
        skipping = False  # the current line is over the limit: its bytes are hashed, not held
        skip_hash: Any = None  # the digest as it was where the skipped line began
        line_start = self.start
        pos = self.start
        while True:
            want = self.chunk if self.end is None else min(self.chunk, self.end - pos)
            chunk = read(want) if want > 0 else b""
            if not chunk:
                break
            start = 0
            while True:
                nl = chunk.find(b"\n", start)
                if nl < 0:
                    rest = chunk[start:]
                    if skipping:
                        self._feed(rest)
                    else:
                        pending += rest
                        if len(pending) > self.max_line_bytes:
                            skip_hash = self._hash.copy()
                            self._feed(pending)
                            pending.clear()
                            skipping = True
                    break
                piece = chunk[start : nl + 1]
                end = pos + nl + 1
                if skipping:
                    self._feed(piece)
                    skipping, skip_hash = False, None
                    yield Line(line_start, None, end - line_start)
                else:
                    if len(pending) + len(piece) - 1 > self.max_line_bytes:
                        self._feed(pending)
                        self._feed(piece)
                        pending.clear()
                        yield Line(line_start, None, end - line_start)
                    else:
                        if pending:
                            pending += piece
                            data = bytes(pending)
                            pending.clear()
                        else:
                            data = piece
                        self._feed(data)
                        yield Line(line_start, _unmarked(line_start, data[:-1]), end - line_start)
                self.consumed = end
                line_start = end
                start = nl + 1
            pos += len(chunk)
        if (pending and not skipping and self.end is None and self.unterminated_last_line
                and parse_object(_unmarked(line_start, bytes(pending))) is not None):
            data = bytes(pending)
            self._feed(data)
            yield Line(line_start, _unmarked(line_start, data), len(data))
            self.consumed = pos
        self.torn_tail_bytes = pos - self.consumed
        if skipping and skip_hash is not None:
            self._hash = skip_hash


_BOM = b"\xef\xbb\xbf"


def _unmarked(offset: int, data: bytes) -> bytes:
    """The first line without a UTF-8 byte order mark (an editor's), so its record parses."""
    return data[len(_BOM):] if offset == 0 and data.startswith(_BOM) else data


_SURROGATE_ESCAPE = re.compile(
    rb"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
"""An escaped backslash, an escaped surrogate pair, or a lone surrogate escape (scanned left to right,
so the ``u`` after an escaped backslash is never taken for an escape)."""


def _lone_to_replacement(match: re.Match[bytes]) -> bytes:
    token = match.group()
    return token if len(token) != 6 else b"\\ufffd"


def parse_object(data: bytes) -> dict[str, Any] | None:
    """One JSON object (orjson: no NaN, 64-bit integers); None otherwise.

    A lone surrogate escape (``"\\ud83d"``) reads as U+FFFD: JavaScript's ``JSON.stringify`` writes one
    for half of a pair (a text a tool cut at a UTF-16 unit), and the rest of that line is the person's
    data; the host's own files hold valid UTF-8 only. So does a byte sequence that is not UTF-8 (a damaged
    byte, a text a tool wrote in another encoding): the tools that wrote these files read them as Node's
    ``fs.readFile(path, "utf8")`` does, each bad sequence as U+FFFD and the rest of the line as written,
    so one bad byte does not cost the line's whole message (:func:`parse_counted` counts such repairs)."""
    return _parse(data)[0]


def parse_counted(data: bytes, report: FileReport) -> dict[str, Any] | None:
    """:func:`parse_object`, counting a line that only parsed once repaired (``repairedLines``)."""
    value, repaired = _parse(data)
    if repaired:
        report.repaired_lines += 1
    return value


def _parse(data: bytes) -> tuple[dict[str, Any] | None, bool]:
    """The object of a line and whether it needed a repair (bytes that are not UTF-8, a lone surrogate)."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        fixed = data
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            fixed = data.decode("utf-8", "replace").encode("utf-8")
        if b"\\u" in fixed:
            fixed = _SURROGATE_ESCAPE.sub(_lone_to_replacement, fixed)
        if fixed == data:
            return None, False
        try:
            value = orjson.loads(fixed)
        except orjson.JSONDecodeError:
            return None, False
        return (value, True) if isinstance(value, dict) else (None, False)
    return (value, False) if isinstance(value, dict) else (None, False)


@dataclass(frozen=True)
class Snapshot:
    """A source file's bytes and modification time, read once for several passes over it."""

    data: bytes
    mtime_ns: int


def read_snapshot(path: Path, max_bytes: int) -> Snapshot | None:
    """The bytes of ``path`` read once (:func:`open_source`), for passes that would each read it again; None when
    it holds more than ``max_bytes`` (the passes then read the file, each its own time). Raises OSError."""
    fd = open_source(path)
    try:
        st = os.fstat(fd)
        data = read_bounded(fd, max_bytes) if st.st_size <= max_bytes else None
        return None if data is None else Snapshot(data, st.st_mtime_ns)
    finally:
        os.close(fd)


def read_bounded(fd: int, max_bytes: int) -> bytes | None:
    """The rest of the open file ``fd`` (read in 1 MiB steps); None once it holds more than ``max_bytes`` (a
    file that grew past its ``fstat`` size included). Raises OSError."""
    chunks: list[bytes] = []
    total = 0
    while chunk := os.read(fd, 1 << 20):
        total += len(chunk)
        if total > max_bytes:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def read_span(path: Path, offset: int, end: int, snapshot: Snapshot | None = None) -> bytes:
    """The bytes ``offset``..``end`` of ``path`` (fewer at its end): from ``snapshot`` when given, else read alone
    (:func:`open_source`). Raises OSError."""
    if snapshot is not None:
        return snapshot.data[offset:end]
    fd = open_source(path)
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        chunks: list[bytes] = []
        left = end - offset
        while left > 0 and (chunk := os.read(fd, left)):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def file_report(reader: LineReader, report: FileReport) -> None:
    report.size = reader.size
    report.consumed = reader.consumed
    report.sha256 = reader.sha256
    report.at_mark = reader.at_mark
    report.mtime_ns = reader.mtime_ns
    report.torn_tail_bytes = reader.torn_tail_bytes


def read_json_file(path: Path, max_bytes: int) -> dict[str, Any] | None:
    """A small JSON document (opencode storage): bounded, read-only, None if unusable."""
    fd = open_source(path)
    try:
        data = read_bounded(fd, max_bytes) if os.fstat(fd).st_size <= max_bytes else None
    finally:
        os.close(fd)
    return None if data is None else parse_object(data)


PEEK_CHUNK = 1 << 13
"""Bytes :func:`peek_field` reads at a time: a peek usually ends in the first lines, a few KiB (a chunk of 64 KiB
read up to 64 KiB of a file that a parse reads in full again)."""


def peek_field(path: Path, keys: tuple[str, ...], *, max_lines: int = 64, max_bytes: int = 8 << 20,
               snapshot: Snapshot | None = None) -> str | None:
    """The first string value of one of ``keys`` in the first lines of a JSONL file (bounded)."""
    try:
        reader = LineReader(path, max_line_bytes=max_bytes, chunk=PEEK_CHUNK, digest=False, snapshot=snapshot)
        for n, line in enumerate(reader):
            if n >= max_lines:
                break
            if line.data is None:
                continue
            rec = parse_object(line.data)
            if rec is None:
                continue
            for key in keys:
                value = rec.get(key)
                if isinstance(value, str) and value:
                    return value
    except OSError:
        return None
    return None


def lines_of(data: bytes, *, max_line_bytes: int) -> Iterator[Line]:
    """The complete lines of an in-memory byte snapshot (same contract as :class:`LineReader`)."""
    pos = 0
    end = len(data)
    while pos < end:
        nl = data.find(b"\n", pos)
        if nl < 0:
            return
        length = nl + 1 - pos
        yield Line(pos, data[pos:nl] if length - 1 <= max_line_bytes else None, length)
        pos = nl + 1
