"""The per-session JSONL transcript file (seed 003 §2.1, docs/DESIGN.md).

Paths are passed in: this module never builds a path from an id. Synchronous;
the session actor calls it from its worker thread and owns the only
:class:`TranscriptWriter` of its file.

Durability protocol (RELIABILITY.md §2):

* create: temp file (0600) with the header and first lines, fsync, published with
  ``link`` (never overwrites), fsync directory;
* append: one ``O_APPEND`` writer, loop over short writes, ``fdatasync``; on a
  write error truncate back to the pre-append length; a failed fsync is never
  retried (fsyncgate) and poisons the writer until the file is reopened;
* open for append: repair the tail first, quarantining torn bytes in
  ``<name>.torn-<ms>`` so the next append never lands on garbage;
* rewrite: :func:`store.fsutil.atomic_write` (old or new file, never a mix).

Fault points: ``create.after_tmp_write``, ``create.after_tmp_fsync``,
``create.after_rename``, ``create.before_dirsync``,
``repair.after_quarantine``, ``append.before_write``, ``append.after_write``,
``append.after_fsync``, ``rewrite.after_tmp_write``, ``rewrite.after_tmp_fsync``,
``rewrite.after_rename``, ``rewrite.before_dirsync``.
"""

from __future__ import annotations

import errno
import os
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from store.errors import (
    Conflict,
    CorruptData,
    InvalidInput,
    IOFailure,
    NotFound,
    StoreError,
    TranscriptChanged,
    classify_os_error,
)
from store.faults import NO_FAULTS, Faults
from store.fsutil import atomic_write, fsync_dir, open_nofollow, owner_only_fd, write_all
from store.ids import validate_session_id
from store.jsonio import dumps_line, loads_line, now_rfc3339
from store.transcripts.records import Root, root_named

__all__ = [
    "DROPPED_MARKER",
    "HEADER_ARTIFACTS",
    "HEADER_DELIVERED",
    "IMPORT_RECEIPT",
    "MAX_LINE_BYTES",
    "SCHEMA",
    "CompactionEntry",
    "MessageEntry",
    "ReadStats",
    "TailRepair",
    "Tombstone",
    "Transcript",
    "TranscriptHeader",
    "TranscriptWriter",
    "bounded_lines",
    "create_transcript",
    "header_artifacts",
    "header_delivered",
    "header_line",
    "keep_dropped_lines",
    "lines_naming",
    "open_error",
    "parse_header",
    "read_first_line",
    "read_header",
    "read_spans",
    "read_transcript",
    "rewrite_transcript",
]

SCHEMA = 1
_BLOCK = 64 * 1024
MAX_LINE_BYTES = 64 << 20
"""A transcript line longer than this (its newline not counted) is unreadable damage for every reader: the
boot scan counts it as a bad line without buffering it whole, a full read skips it as one, and a rewrite
keeps it aside (:func:`keep_dropped_lines`) instead of writing it back. No writer makes such a line (a
request's params are at most 8 MiB), and no reply could carry it (16 MiB)."""
_MAX_HEADER = 1024 * 1024


def bounded_lines(fd: int, start: int, size: int, *, limit: int = MAX_LINE_BYTES,
                  chunk: int = 1 << 20) -> Iterator[tuple[int, int, bytes | None, bool]]:
    """``(offset, end, line, rest_is_blank)`` for each complete line of ``fd`` in ``[start, size)`` (``line``
    with its newline), read in chunks of ``chunk`` bytes; finally ``(offset, size, None, ...)`` for a torn
    tail. A line over ``limit`` (its newline not counted; :data:`MAX_LINE_BYTES` for every JSONL file the
    host keeps) is yielded as ``b""`` (a bad line, with its own offset and end) without being held whole:
    memory stays under ``limit`` plus two chunks whatever the file holds. The boot scan of a transcript
    (``store/indexing/reconcile.py``), the revisions file's reader (``store/revisions.py``) and the attachment
    GC's reference scan (``store/attachments.py``) read so."""
    pos = start
    # the line read so far (no newline in it yet), in pieces joined once, when its newline comes: a long line
    # read as carry + chunk each time was copied (and searched for a newline) whole for every chunk, quadratic
    # in its length (a 65 MiB line in 1 MiB chunks: some 2 GiB copied)
    parts: list[bytes] = []
    held = 0
    skipping: int | None = None  # the offset of the over-long line being skipped
    os.lseek(fd, start, os.SEEK_SET)
    while pos < size:
        got = os.read(fd, min(chunk, size - pos))
        if not got:
            break
        base = pos - held
        pos += len(got)
        if b"\n" not in got:  # no line ends in this chunk: the open line grows, or is still being skipped
            if skipping is None:
                parts.append(got)
                held += len(got)
                if held > limit:
                    skipping, parts, held = base, [], 0
            continue
        data = b"".join((*parts, got)) if parts else got
        parts, held = [], 0
        at = 0
        # where the last chunk's trailing blank (NUL / newline) run starts: a line ending at or past it has
        # nothing but blank after it (one rstrip per chunk, not a copy of the chunk's rest per line)
        blank_from = len(data.rstrip(b"\x00\n")) if pos >= size else -1
        while True:
            nl = data.find(b"\n", at)
            if nl < 0:
                break
            if skipping is not None:
                yield skipping, base + nl + 1, b"", False
                skipping = None
            elif nl - at > limit:  # the limit holds exactly, wherever the chunks end
                yield base + at, base + nl + 1, b"", False
            else:
                yield base + at, base + nl + 1, data[at : nl + 1], 0 <= blank_from <= nl + 1
            at = nl + 1
        # a newline was found: no line is being skipped now
        if len(data) - at > limit:
            skipping = base + at
        elif at < len(data):
            parts, held = [data[at:]], len(data) - at
    if skipping is not None:
        yield skipping, size, None, False
    elif held:
        yield size - held, size, None, False


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


# --------------------------------------------------------------------------- header


@dataclass(frozen=True)
class TranscriptHeader:
    session_id: str
    created_at: str
    epoch: str | None
    """Fresh random token per whole-file (re)write; ``None`` only for legacy files."""
    schema: int
    length: int
    """Bytes of the header line, newline included (= offset of the first body line)."""
    receipts: tuple[dict[str, Any], ...] = field(default=(), compare=False)
    """Every receipt the header carries, oldest first (:func:`header_receipts`)."""
    delivered: tuple[dict[str, Any], ...] = field(default=(), compare=False)
    """The deliver answers of collaboration input lines earlier rewrites dropped (:func:`header_delivered`)."""


IMPORT_RECEIPT = "import_receipt"
"""The line kind that ends a keyed ``import.sessions`` write of one session (``store.interchange.import_write``):
``{"type":"import_receipt","receipt":{clientId,submissionId,fingerprint,method},"answer":{...}}``. Readers
skip it; reconcile copies it into the session's import record, where the request's retry finds its own write."""


def header_receipts(header: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Every receipt a transcript header carries, oldest first: those earlier rewrites left
    (``receipts``) and then the header's own (``receipt``: the request that wrote this file; a header
    written before the carry holds only that one). Malformed entries are skipped here; the caller
    validates each (``store.receipts.key_of_record``)."""
    if not header:
        return []
    raw = header.get("receipts")
    out = [dict(r) for r in raw if isinstance(r, Mapping)] if isinstance(raw, list) else []
    own = header.get("receipt")
    if isinstance(own, Mapping):
        out.append(dict(own))
    return out


HEADER_DELIVERED: Final = "collabDelivered"
"""The header's list of collaboration deliveries whose input line a rewrite dropped from the live transcript
(cut, or archived into the revisions file): ``{"deliveryId", "response", "receipt"?}`` each, what the line's
``meta.collabDelivered`` held (``store.collab.DELIVERED_META``). Internal: never on the wire."""


def header_delivered(header: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The header's :data:`HEADER_DELIVERED` entries, oldest first (malformed ones skipped)."""
    raw = header.get(HEADER_DELIVERED) if header else None
    if not isinstance(raw, list):
        return []
    return [dict(r) for r in raw if isinstance(r, Mapping) and isinstance(r.get("deliveryId"), str)]


HEADER_ARTIFACTS: Final = "artifacts"
"""The header's list of the session's artifact rows as the index held them when an older host's rewrite wrote
the file (``{"path", "op", "turnId", "updatedAt"}`` each, its newest 256 within 64 KiB): an index rebuilt from
such a file lists them again (``store.artifacts.restore_carried``). This host writes none: a rewrite carries
the rows its cut takes the lines of in the revisions file (``store.revisions.ARTIFACT``), any number of them,
and those the old header held with them (they are no line's any more). Internal: never on the wire."""


def header_artifacts(header: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The header's :data:`HEADER_ARTIFACTS` entries (malformed ones skipped: the caller checks each field)."""
    raw = header.get(HEADER_ARTIFACTS) if header else None
    if not isinstance(raw, list):
        return []
    return [dict(r) for r in raw if isinstance(r, Mapping)]


def header_line(
    session_id: str, created_at_ms: int, *, receipt: Mapping[str, Any] | None = None,
    receipts: Sequence[Mapping[str, Any]] = (), written_at_ms: int | None = None,
    delivered: Sequence[Mapping[str, Any]] = (),
) -> tuple[bytes, TranscriptHeader]:
    """A new header line with a fresh epoch, and its parsed form.

    ``receipt`` is the command receipt of the request that (re)wrote the whole
    file (``store.receipts.file_record``): it rides in the header so boot can
    restore it with the file (ARCHITECTURE.md "Receipts ride with their effect").
    ``receipts``: those of earlier rewrites, carried forward (``store.transcripts.rewrite``).
    ``written_at_ms``: when a rewrite wrote the file (``writtenAt``): the session's ``updatedAt`` as that
    rewrite's commit sets it, which a reindex after a crash before the commit restores from here.
    ``delivered``: :data:`HEADER_DELIVERED`, carried forward by a rewrite (``store.transcripts.rewrite``).
    """
    validate_session_id(session_id)
    created_at = now_rfc3339(created_at_ms)
    epoch = secrets.token_hex(8)
    record: dict[str, Any] = {
        "type": "session",
        "schema": SCHEMA,
        "sessionId": session_id,
        "createdAt": created_at,
        "epoch": epoch,
    }
    if receipt is not None:
        record["receipt"] = dict(receipt)
    if receipts:
        record["receipts"] = [dict(r) for r in receipts]
    if written_at_ms is not None:
        record["writtenAt"] = written_at_ms
    if delivered:
        record[HEADER_DELIVERED] = [dict(r) for r in delivered]
    line = dumps_line(record)
    return line, TranscriptHeader(session_id, created_at, epoch, SCHEMA, len(line))


def parse_header(record: dict[str, Any], length: int) -> TranscriptHeader | None:
    """The header of a parsed first line, or ``None`` if it is not a session header."""
    if record.get("type") != "session":
        return None
    session_id = record.get("sessionId")
    if not isinstance(session_id, str):
        return None
    epoch = record.get("epoch")
    schema = record.get("schema", SCHEMA)
    created_at = record.get("createdAt")
    return TranscriptHeader(
        session_id=session_id,
        created_at=created_at if isinstance(created_at, str) else "",
        epoch=epoch if isinstance(epoch, str) else None,
        schema=schema if isinstance(schema, int) else SCHEMA,
        length=length,
        receipts=tuple(header_receipts(record)),
        delivered=tuple(header_delivered(record)),
    )


def read_first_line(fd: int, *, limit: int = _MAX_HEADER) -> bytes | None:
    """The first newline-terminated line of an open file (newline included), or None."""
    buf = b""
    while len(buf) < limit:
        chunk = os.pread(fd, _BLOCK, len(buf))
        if not chunk:
            return None
        nl = chunk.find(b"\n")
        if nl >= 0:
            return buf + chunk[: nl + 1]
        buf += chunk
    return None


def read_header(path: str | os.PathLike[str]) -> TranscriptHeader:
    """The header of the transcript at ``path`` (its first line only)."""
    target = os.fspath(path)
    try:
        fd = open_nofollow(target, os.O_RDONLY)
    except OSError as exc:
        raise open_error(exc, target, "read transcript") from exc
    try:
        return _read_header(fd, target)
    finally:
        os.close(fd)


def _read_header(fd: int, path: str) -> TranscriptHeader:
    line = read_first_line(fd)
    header = None
    if line is not None:
        try:
            header = parse_header(loads_line(line), len(line))
        except ValueError:
            header = None
    if header is None:
        raise CorruptData(f"transcript {path} does not start with a session header", data={"path": path})
    return header


# --------------------------------------------------------------------------- errors


def open_error(exc: OSError, path: str, what: str) -> StoreError:
    """Map an OSError from opening a transcript: missing → NotFound, symlink → CorruptData."""
    if isinstance(exc, FileNotFoundError):
        return NotFound(f"transcript not found: {path}", data={"path": path})
    if exc.errno == errno.ELOOP:
        return CorruptData(f"transcript path is a symlink, refusing to follow: {path}", data={"path": path})
    return classify_os_error(exc, f"{what} {path}")


# --------------------------------------------------------------------------- create / rewrite


def _check_lines(lines: Sequence[bytes]) -> None:
    for line in lines:
        if not line.endswith(b"\n") or line.find(b"\n") != len(line) - 1:
            raise InvalidInput("each transcript line must end with exactly one newline")


def create_transcript(
    path: str | os.PathLike[str],
    session_id: str,
    created_at_ms: int,
    *,
    body_lines: Sequence[bytes] = (),
    receipt: Mapping[str, Any] | None = None,
    faults: Faults = NO_FAULTS,
) -> TranscriptHeader:
    """Create a new transcript: header (with ``receipt``) + ``body_lines``. Never overwrites (``Conflict``).

    The file is written under a temporary name, fsynced and published with a
    hard link (then the directory is fsynced), so it appears whole — header and
    first lines together — or not at all. Fault points ``create.after_tmp_write``,
    ``create.after_tmp_fsync``, ``create.after_rename``, ``create.before_dirsync``.
    """
    _check_lines(body_lines)
    target = os.fspath(path)
    if os.path.lexists(target):
        raise Conflict(f"transcript already exists: {target}", data={"path": target})
    line, header = header_line(session_id, created_at_ms, receipt=receipt)
    atomic_write(target, b"".join([line, *body_lines]), faults=faults, point_prefix="create", exclusive=True)
    return header


def rewrite_transcript(
    path: str | os.PathLike[str],
    session_id: str,
    created_at_ms: int,
    body_lines: Sequence[bytes],
    *,
    receipt: Mapping[str, Any] | None = None,
    receipts: Sequence[Mapping[str, Any]] = (),
    faults: Faults = NO_FAULTS,
    written_at_ms: int | None = None,
    delivered: Sequence[Mapping[str, Any]] = (),
) -> TranscriptHeader:
    """Atomically replace the whole file: new header (new epoch, ``receipt``, the carried ``receipts``,
    ``writtenAt``, the carried ``delivered``) + ``body_lines``.

    Any open :class:`TranscriptWriter` on the old file must be closed first and
    a new one opened afterwards (appends through the old one are refused).
    """
    _check_lines(body_lines)
    line, header = header_line(session_id, created_at_ms, receipt=receipt, receipts=receipts,
                               written_at_ms=written_at_ms, delivered=delivered)
    atomic_write(path, b"".join([line, *body_lines]), faults=faults, point_prefix="rewrite")
    return header


# --------------------------------------------------------------------------- tail repair


@dataclass(frozen=True)
class TailRepair:
    """What :meth:`TranscriptWriter.open` cut off the end of the file."""

    original_length: int
    valid_length: int
    quarantine_path: str

    @property
    def torn_length(self) -> int:
        return self.original_length - self.valid_length


def _parses(line: bytes) -> bool:
    try:
        loads_line(line)
    except ValueError:
        return False
    return True


def _valid_end(fd: int, size: int) -> int:
    """Offset just past the last newline-terminated line that parses; 0 if none.

    Scans backwards in blocks, so a healthy file costs one read and one parse.
    """
    buf = b""
    start = size  # file offset of buf[0]

    def extend() -> bool:
        nonlocal buf, start
        if start == 0:
            return False
        take = min(_BLOCK, start)
        start -= take
        buf = os.pread(fd, take, start) + buf
        return True

    end = size  # candidate lines lie in [start, end)
    while True:
        nl = buf.rfind(b"\n", 0, end - start)
        while nl < 0:
            if not extend():
                return 0
            nl = buf.rfind(b"\n", 0, end - start)
        prev = buf.rfind(b"\n", 0, nl)
        while prev < 0 and start > 0:
            before = start
            extend()
            nl += before - start
            prev = buf.rfind(b"\n", 0, nl)
        if _parses(buf[prev + 1 : nl]):
            return start + nl + 1
        end = start + prev + 1  # this line is garbage too: look at the one before


def _quarantine(fd: int, path: str, begin: int, end: int, clock_ms: Callable[[], int]) -> str:
    torn = b""
    while len(torn) < end - begin:
        chunk = os.pread(fd, end - begin - len(torn), begin + len(torn))
        if not chunk:
            break
        torn += chunk
    return _write_aside(f"{path}.torn-{clock_ms()}", torn)


def _write_aside(base: str, data: bytes) -> str:
    """``data`` in a new file named ``base`` (or ``base-N``), durable; its name."""
    name = base
    for n in range(1, 1000):
        try:
            qfd = open_nofollow(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            break
        except FileExistsError:
            name = f"{base}-{n}"
    else:  # pragma: no cover - a thousand repairs in one millisecond
        raise IOFailure(f"cannot pick a quarantine file name for {base}")
    try:
        os.fchmod(qfd, 0o600)
        write_all(qfd, data)
        os.fsync(qfd)
    finally:
        os.close(qfd)
    fsync_dir(os.path.dirname(os.path.abspath(base)))
    return name


DROPPED_MARKER = ".jsonl.dropped-"
"""``<sid>.jsonl.dropped-<ms>``: lines a rewrite could not carry over, kept beside the transcript."""


def keep_dropped_lines(path: str | os.PathLike[str], offsets: Sequence[int], now_ms: int) -> str | None:
    """Copy the lines starting at ``offsets`` (lines readers skip: not JSON objects, known kinds missing
    their ids, kinds this version does not know) into ``<path>.dropped-<now_ms>`` before a rewrite that
    cannot carry them over; its name, or None when there is nothing to keep. Nothing is lost: a newer
    version's lines and damaged bytes stay on disk for inspection (``pi-host doctor`` lists the file)."""
    if not offsets:
        return None
    path = os.fspath(path)
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except OSError as exc:
        raise open_error(exc, path, "read transcript") from exc
    kept: list[bytes] = []
    try:
        for offset in sorted(set(offsets)):
            line = bytearray()  # grown in place: a line past MAX_LINE_BYTES is copied aside too, in linear time
            while not line.endswith(b"\n"):
                chunk = os.pread(fd, 1 << 16 if len(line) < 1 << 16 else 1 << 22, offset + len(line))
                if not chunk:
                    break
                nl = chunk.find(b"\n")
                line += chunk if nl < 0 else chunk[: nl + 1]
            kept.append(bytes(line) if line.endswith(b"\n") else bytes(line) + b"\n")
    finally:
        os.close(fd)
    return _write_aside(f"{path}.dropped-{now_ms}", b"".join(kept))


def lines_naming(path: str | os.PathLike[str], needle: bytes) -> Iterator[dict[str, Any]]:
    """The complete lines of a transcript whose bytes hold ``needle``, parsed (unreadable ones skipped); a
    missing file has none. A whole-file scan for boot's recoveries, never a request path."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return
    with fh:
        for line in fh:
            if not line.endswith(b"\n") or needle not in line:
                continue
            try:
                yield loads_line(line)
            except ValueError:
                continue


# --------------------------------------------------------------------------- writer


class TranscriptWriter:
    """The single appender of one transcript file.

    States: open → (failed) → closed. A write error rolls the file back and
    leaves the writer usable (space may come back); a failed fsync, a failed
    rollback or any unexpected exception marks it failed, and every later
    append raises :class:`IOFailure` until a new writer is opened, which
    re-validates the tail.

    A failure after the fsync succeeded (``append.after_fsync``) also stops
    this writer, but the lines it wrote are durable and the file ends where it
    says: :attr:`storage_failed` stays False, so its owner may open a new
    writer at once (never true after a failed fsync: rule 7, no retry).
    """

    def __init__(
        self,
        path: str,
        fd: int,
        length: int,
        header: TranscriptHeader,
        faults: Faults,
        last_repair: TailRepair | None,
    ) -> None:
        self._path = path
        self._fd: int | None = fd
        self._length = length
        self._header = header
        self._faults = faults
        self._last_repair = last_repair
        self._failure: str | None = None
        self._durable_failure = False
        st = os.fstat(fd)
        self._identity = (st.st_dev, st.st_ino)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        faults: Faults = NO_FAULTS,
        clock_ms: Callable[[], int] = _wall_ms,
    ) -> TranscriptWriter:
        """Open for appending, repairing a torn tail first (quarantined, never dropped)."""
        target = os.fspath(path)
        try:
            wfd = open_nofollow(target, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            raise open_error(exc, target, "open transcript") from exc
        try:
            owner_only_fd(wfd, target)  # an earlier app's file may be 0644: the host's files are 0600
            rfd = open_nofollow(target, os.O_RDONLY)
            try:
                size = os.fstat(wfd).st_size
                valid = _valid_end(rfd, size)
                repair = None
                if valid < size:
                    qpath = _quarantine(rfd, target, valid, size, clock_ms)
                    faults.point("repair.after_quarantine")
                    os.ftruncate(wfd, valid)
                    os.fsync(wfd)
                    repair = TailRepair(size, valid, qpath)
                header = _read_header(rfd, target)
            finally:
                os.close(rfd)
            return cls(target, wfd, valid, header, faults, repair)
        except BaseException as exc:
            os.close(wfd)
            if isinstance(exc, OSError):
                raise classify_os_error(exc, f"open transcript {target}") from exc
            raise

    # -- introspection
    @property
    def path(self) -> str:
        return self._path

    @property
    def length(self) -> int:
        """File length after the last successful append (always a line boundary)."""
        return self._length

    @property
    def header(self) -> TranscriptHeader:
        return self._header

    @property
    def epoch(self) -> str | None:
        return self._header.epoch

    @property
    def last_repair(self) -> TailRepair | None:
        return self._last_repair

    @property
    def failed(self) -> bool:
        return self._failure is not None

    @property
    def storage_failed(self) -> bool:
        """Failed with what the file holds in doubt (a failed fsync or rollback, an unexpected error
        before the lines were durable). False for a writer stopped after its lines were durable."""
        return self._failure is not None and not self._durable_failure

    @property
    def closed(self) -> bool:
        return self._fd is None

    # -- operations
    def _usable_fd(self) -> int:
        if self._fd is None:
            raise IOFailure(f"transcript writer is closed: {self._path}", data={"path": self._path})
        if self._failure is not None:
            raise IOFailure(
                f"transcript storage failed ({self._failure}); no write is accepted "
                f"until the file is reopened: {self._path}",
                data={"path": self._path},
            )
        return self._fd

    def _fail(self, reason: str, *, durable: bool = False) -> None:
        self._failure = reason
        self._durable_failure = durable

    def append(self, lines: Sequence[bytes]) -> tuple[int, int]:
        """Append complete lines durably. Returns (offset of the first new line, new length).

        Nothing is durable-and-reported unless this returns. On ``StorageFull``
        or a write ``IOFailure`` the file is back at its previous length.
        """
        fd = self._usable_fd()
        _check_lines(lines)
        if not lines:
            return self._length, self._length
        data = b"".join(lines)
        durable = False
        try:
            pre = self._check_identity()
            try:
                self._faults.point("append.before_write")
                write_all(fd, data)
                self._faults.point("append.after_write")
            except OSError as exc:
                self._rollback(fd, pre)
                raise classify_os_error(exc, f"append to {self._path}") from exc
            try:
                self._faults.point("append.fsync")  # an error injected here is the fsync's own
                os.fdatasync(fd)
            except OSError as exc:
                # fsyncgate: the kernel may have dropped the dirty pages and will
                # not report it again. Never retry; poison until reopened.
                self._fail(f"fdatasync failed: {exc.strerror or exc}")
                try:
                    os.ftruncate(fd, pre)
                except OSError:
                    pass
                raise IOFailure(
                    f"fsync of {self._path} failed ({exc.strerror or exc}); "
                    "the append is not durable and the file is marked failed",
                    data={"path": self._path, "errno": exc.errno},
                ) from exc
            self._length = pre + len(data)
            durable = True
            self._faults.point("append.after_fsync")
            return pre, self._length
        except StoreError:
            raise
        except OSError as exc:
            # After the fsync the lines are durable and the file ends at ``self._length``: this writer
            # stops, the file is sound (``storage_failed`` stays False). Before it: state unknown.
            self._fail(f"unexpected I/O error: {exc.strerror or exc}", durable=durable)
            raise classify_os_error(exc, f"append to {self._path}") from exc
        except BaseException:
            # Unexpected (an injected crash, a bug): stop writing; the file is in doubt unless durable.
            if self._failure is None:
                self._fail("unexpected error during append", durable=durable)
            raise

    def _check_identity(self) -> int:
        """Return the current length; refuse if the path now names another file, or if the file is
        not the length this writer left it at (another program wrote to it, or cut it): the lines
        about to be written were planned on what the writer knew, and their offsets and sequence
        numbers would not be theirs.

        One ``stat`` of the path answers both: when it names this writer's file (same device and
        inode), its size is the size ``fstat(fd)`` would report (the same inode)."""
        try:
            st = os.stat(self._path, follow_symlinks=False)
            same = (st.st_dev, st.st_ino) == self._identity
        except FileNotFoundError:
            same = False
        if not same:
            self._fail("file replaced or removed under the writer")
            raise TranscriptChanged(
                f"transcript was replaced or removed under its writer; reopen: {self._path}",
                data={"path": self._path},
            )
        if st.st_size != self._length:
            self._fail("file changed under the writer")
            raise TranscriptChanged(
                f"transcript changed under its writer ({st.st_size} bytes, {self._length} written through it: "
                f"another program wrote to it); reopen: {self._path}",
                data={"path": self._path},
            )
        return st.st_size

    def _rollback(self, fd: int, pre: int) -> None:
        try:
            os.ftruncate(fd, pre)
            os.fsync(fd)
        except OSError as exc:
            self._fail(f"rollback after a failed write failed: {exc.strerror or exc}")

    def close(self) -> None:
        """Close the file descriptor. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> TranscriptWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# --------------------------------------------------------------------------- full read


@dataclass(frozen=True)
class MessageEntry:
    id: str
    record: dict[str, Any]
    """Content of the newest line holding this id."""
    offset: int
    length: int


@dataclass(frozen=True)
class CompactionEntry:
    id: str
    record: dict[str, Any]
    offset: int
    length: int


@dataclass(frozen=True)
class Tombstone:
    id: str
    message_id: str
    deleted: bool
    offset: int


@dataclass
class Transcript:
    """A whole transcript as readers see it (a full read never modifies the file)."""

    header: TranscriptHeader | None
    messages: list[MessageEntry] = field(default_factory=list)
    """Deduped by id: keep-last content at the first line's position."""
    positions: dict[str, int] = field(default_factory=dict)
    compactions: list[CompactionEntry] = field(default_factory=list)
    """In file order, deduped by id like messages (keep-last content at the first line's position: a
    re-import writes a checkpoint again when it learned more, e.g. its request's usage). Dropping
    records whose anchor is gone is the caller's job."""
    compaction_positions: dict[str, int] = field(default_factory=dict)
    tombstones: dict[str, Tombstone] = field(default_factory=dict)
    """Last tombstone per messageId."""
    session_info: dict[str, Any] | None = None
    roots: dict[str, Root | None] = field(default_factory=dict)
    """Per message id, the project root its newest line stands under (``records.Root``; None: no line
    before it names one): what a rewrite keeps in position (``rewrite.plan_rewrite``)."""
    root: Root | None = None
    """The root the file's lines leave in effect at its end (None: none names one)."""
    info_receipts: list[dict[str, Any]] = field(default_factory=list)
    """The receipts the ``session_info`` lines carry (a rename's, a trash's...), in file order: a rewrite,
    which keeps only the newest line, carries them forward in its header."""
    decisions: list[tuple[str | None, dict[str, Any]]] = field(default_factory=list)
    """``approval_decision`` lines (deduped by id, keep-last), each with the id of the message
    line before it (``None``: before the first message)."""
    bad_line_offsets: list[int] = field(default_factory=list)
    """Complete lines that are not JSON objects, or known kinds missing their ids."""
    unknown_line_offsets: list[int] = field(default_factory=list)
    """Lines of a kind this version does not know (a newer version's, say): skipped by readers."""
    unknown: list[tuple[str | None, int, bytes]] = field(default_factory=list)
    """The JSON-object lines among those whose ``type`` names a kind this version does not know (seed 003
    §9: a new line kind needs no migration), each as ``(id of the message line before it, offset, the
    line's bytes)``: a rewrite writes them again, byte for byte, after that message while it survives."""
    unknown_lines: int = 0
    torn_tail: bool = False
    valid_length: int = 0
    """End of the last complete line."""
    file_length: int = 0

    @property
    def bad_lines(self) -> int:
        return len(self.bad_line_offsets)

    @property
    def deleted_ids(self) -> frozenset[str]:
        return frozenset(mid for mid, t in self.tombstones.items() if t.deleted)

    def message(self, message_id: str) -> MessageEntry | None:
        pos = self.positions.get(message_id)
        return None if pos is None else self.messages[pos]


def _read_all(path: str) -> bytes:
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except OSError as exc:
        raise open_error(exc, path, "read transcript") from exc
    try:
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    except OSError as exc:
        raise classify_os_error(exc, f"read transcript {path}") from exc
    finally:
        os.close(fd)


def read_transcript(path: str | os.PathLike[str]) -> Transcript:
    """Read and interpret the whole file (rebuilds, full reads)."""
    target = os.fspath(path)
    data = _read_all(target)
    out = Transcript(header=None, file_length=len(data))
    pos = 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        _take_line(out, data[pos:nl], pos, nl + 1 - pos)
        pos = nl + 1
    out.valid_length = pos
    out.torn_tail = pos < len(data)
    return out


def _take_line(out: Transcript, line: bytes, offset: int, length: int) -> None:
    if len(line) > MAX_LINE_BYTES:  # what the boot scan skips and counts (store/indexing/reconcile.py)
        out.bad_line_offsets.append(offset)
        return
    try:
        record = loads_line(line)
    except ValueError:
        out.bad_line_offsets.append(offset)
        return
    kind = record.get("type")
    if kind == "message":
        mid = record.get("id")
        if not isinstance(mid, str) or not mid:
            out.bad_line_offsets.append(offset)
            return
        entry = MessageEntry(mid, record, offset, length)
        out.roots[mid] = out.root
        existing = out.positions.get(mid)
        if existing is None:
            out.positions[mid] = len(out.messages)
            out.messages.append(entry)
        else:
            out.messages[existing] = entry
    elif kind == "compaction":
        cid = record.get("id")
        if not isinstance(cid, str) or not cid:
            out.bad_line_offsets.append(offset)
            return
        comp = CompactionEntry(cid, record, offset, length)
        at = out.compaction_positions.get(cid)
        if at is None:
            out.compaction_positions[cid] = len(out.compactions)
            out.compactions.append(comp)
        else:
            out.compactions[at] = comp
    elif kind == "tombstone":
        mid = record.get("messageId")
        deleted = record.get("deleted", True)
        if not isinstance(mid, str) or not isinstance(deleted, bool):
            out.bad_line_offsets.append(offset)
            return
        tid = record.get("id")
        out.tombstones[mid] = Tombstone(tid if isinstance(tid, str) else "", mid, deleted, offset)
    elif kind == "session_info":
        out.session_info = record
        out.root = root_named(record) or out.root
        receipt = record.get("receipt")
        if isinstance(receipt, Mapping):
            out.info_receipts.append(dict(receipt))
    elif kind == IMPORT_RECEIPT:  # an import's receipt (reconcile's): nothing a reader shows, no rewrite keeps
        pass
    elif kind == "approval_decision" and isinstance(record.get("id"), str):
        anchor = out.messages[-1].id if out.messages else None
        out.decisions = [(a, d) for a, d in out.decisions if d.get("id") != record["id"]]
        out.decisions.append((anchor, record))
    elif kind == "session" and offset == 0:
        out.header = parse_header(record, length)
        if out.header is None:
            out.bad_line_offsets.append(offset)
    else:
        out.unknown_lines += 1
        out.unknown_line_offsets.append(offset)
        if isinstance(kind, str) and kind != "session":  # a newer version's line, whole: rewrites carry it
            out.unknown.append((out.messages[-1].id if out.messages else None, offset, bytes(line) + b"\n"))


# --------------------------------------------------------------------------- span reads


@dataclass
class ReadStats:
    """Counters for span reads (what a window really cost)."""

    opens: int = 0
    reads: int = 0
    bytes_read: int = 0


def read_spans(
    path: str | os.PathLike[str],
    spans: Sequence[tuple[int, int]],
    *,
    stats: ReadStats | None = None,
    fd: int | None = None,
) -> list[bytes]:
    """Read exactly the byte ranges ``(offset, length)``: one open, one pread each.

    A range past the end of the file means the caller's layout is stale:
    :class:`CorruptData` (refresh the layout and retry). ``fd``: ``path`` open already
    (the caller's descriptor is read and left open; the bytes are that file's, even if
    ``path`` was replaced since).
    """
    target = os.fspath(path)
    given = fd
    if fd is None:
        try:
            fd = open_nofollow(target, os.O_RDONLY)
        except OSError as exc:
            raise open_error(exc, target, "read transcript") from exc
        if stats is not None:
            stats.opens += 1
    out: list[bytes] = []
    try:
        for offset, length in spans:
            got = os.pread(fd, length, offset)
            while len(got) < length:
                more = os.pread(fd, length - len(got), offset + len(got))
                if not more:
                    raise CorruptData(
                        f"span {offset}+{length} is past the end of {target}; layout is stale",
                        data={"path": target, "offset": offset, "length": length},
                    )
                got += more
            if stats is not None:
                stats.reads += 1
                stats.bytes_read += len(got)
            out.append(got)
    except OSError as exc:
        raise classify_os_error(exc, f"read transcript {target}") from exc
    finally:
        if given is None:
            os.close(fd)
    return out
