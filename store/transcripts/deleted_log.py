"""The deleted-sessions log: ``sessions/deleted-sessions.log``, the ids the user deleted, outside the database.

``known_sessions`` (``store/orphans.py``) keeps every deleted id, but only in
the database: after a loss, a retry of the ``session.create`` that made a
session deleted since (its receipt gone with the database) created it again,
and its retried appends landed in it. This log survives the database: a
rebuilt one reads it back (:func:`store.indexing.reconcile.forget_logged`), so
the id stays deleted, the delete's retry answers as before, and so does the
retry of the create that made the session (the create's receipt rides along).

Format: one JSON object per line, UTF-8, ``\\n`` terminated::

    {"type": "session_deleted", "sessionId": "s1", "deletedAt": <ms>,
     "receipt"?: {clientId, submissionId, fingerprint, method},          # the delete's (its marker's)
     "created"?: [{clientId, submissionId, fingerprint, method, response}]}  # what made the session

Crash safety: :func:`store.transcripts.session_files.finish_delete` appends the
line (written, fsynced; the directory fsynced when the file is new) *before* it
removes any file of the session, and the delete marker goes last. A kill before
the line is durable leaves the marker, and whoever finishes the delete (boot,
the session's next call) appends it then; a kill after it leaves a line that
may be appended again (harmless: the newest line of an id wins). A torn last
line (a kill mid-write) is skipped by readers, and the next append starts on a
line of its own.

Bounded: a boot that finds the file over :data:`COMPACT_AT_BYTES` rewrites it
whole (:func:`compact`, atomic) with the newest line of each id, the newest
:data:`KEEP_ENTRIES` of them; between boots it grows by one line per delete.
An id dropped that way (deleted more than 10,000 deletes ago) loses only this
protection, and only if the database is lost as well.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from store.errors import classify_os_error
from store.faults import NO_FAULTS, Faults
from store.fsutil import atomic_write, fsync_dir, open_nofollow, write_all
from store.rules import SESSION_ID_RE

__all__ = [
    "COMPACT_AT_BYTES",
    "FILE_NAME",
    "KEEP_ENTRIES",
    "LoggedDelete",
    "append",
    "compact",
    "entry_of_marker",
    "newest",
    "read",
]

FILE_NAME: Final = "deleted-sessions.log"
COMPACT_AT_BYTES: Final = 8 << 20
KEEP_ENTRIES: Final = 10_000
MAX_READ_BYTES: Final = 64 << 20
"""A file larger than this (written by hand?) is read up to here: its newest lines past it are not seen."""
MAX_CREATED: Final = 8
_MAX_LINE: Final = 256 << 10


@dataclass(frozen=True, slots=True)
class LoggedDelete:
    """One line: a deleted session id, when, the delete's receipt record and the receipts (with their
    answers) of the requests that made the session."""

    session_id: str
    deleted_at: int
    receipt: Mapping[str, Any] | None = None
    created: tuple[Mapping[str, Any], ...] = field(default=())

    def line(self) -> bytes:
        body: dict[str, Any] = {"type": "session_deleted", "sessionId": self.session_id, "deletedAt": self.deleted_at}
        if self.receipt is not None:
            body["receipt"] = dict(self.receipt)
        if self.created:
            body["created"] = [dict(r) for r in self.created]
        return orjson.dumps(body) + b"\n"


def _entry(body: Any) -> LoggedDelete | None:
    if not isinstance(body, dict) or body.get("type") != "session_deleted":
        return None
    sid, at = body.get("sessionId"), body.get("deletedAt")
    if not (isinstance(sid, str) and SESSION_ID_RE.fullmatch(sid) and type(at) is int and at >= 0):
        return None
    receipt = body.get("receipt")
    created = body.get("created")
    return LoggedDelete(sid, at, receipt if isinstance(receipt, dict) else None,
                        tuple(r for r in created[:MAX_CREATED] if isinstance(r, dict))
                        if isinstance(created, list) else ())


def entry_of_marker(marker: Any, session_id: str, deleted_at: int) -> LoggedDelete:
    """The line of a delete whose marker body is ``marker`` (``None``: an older build's delete, no marker)."""
    body = marker if isinstance(marker, dict) else {}
    receipt = body.get("receipt")
    created = body.get("created")
    return LoggedDelete(session_id, deleted_at, receipt if isinstance(receipt, dict) else None,
                        tuple(r for r in created[:MAX_CREATED] if isinstance(r, dict))
                        if isinstance(created, list) else ())


def append(sessions_dir: Path, entry: LoggedDelete) -> None:
    """Append ``entry``'s line and fsync it (and the directory, when the file is new)."""
    path = sessions_dir / FILE_NAME
    line = entry.line()
    if len(line) > _MAX_LINE:
        line = LoggedDelete(entry.session_id, entry.deleted_at, entry.receipt).line()
    try:
        fd = open_nofollow(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line  # a torn last line stays a line of its own (readers skip it)
            write_all(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        if size == 0:
            fsync_dir(sessions_dir)
    except OSError as exc:
        raise classify_os_error(exc, f"appending to {path}") from exc


def _read_fd(fd: int) -> bytes:
    size = min(os.fstat(fd).st_size, MAX_READ_BYTES)
    chunks: list[bytes] = []
    pos = 0
    while pos < size:
        chunk = os.pread(fd, min(1 << 20, size - pos), pos)
        if not chunk:
            break
        chunks.append(chunk)
        pos += len(chunk)
    return b"".join(chunks)


def read(sessions_dir: Path) -> list[LoggedDelete]:
    """Every well-formed line, in file order (bad and torn lines skipped); none without a file."""
    try:
        fd = open_nofollow(sessions_dir / FILE_NAME, os.O_RDONLY)
    except FileNotFoundError:
        return []
    try:
        raw = _read_fd(fd)
    finally:
        os.close(fd)
    out: list[LoggedDelete] = []
    for chunk in raw.split(b"\n"):
        if not chunk.strip():
            continue
        try:
            entry = _entry(orjson.loads(chunk))
        except orjson.JSONDecodeError:
            continue
        if entry is not None:
            out.append(entry)
    return out


def newest(entries: Iterable[LoggedDelete]) -> list[LoggedDelete]:
    """The newest line of each id (the last one), in the order of those lines."""
    last: dict[str, LoggedDelete] = {}
    for entry in entries:
        last.pop(entry.session_id, None)
        last[entry.session_id] = entry
    return list(last.values())


def compact(sessions_dir: Path, *, live: Sequence[str] = (), over: int = COMPACT_AT_BYTES,
            keep: int = KEEP_ENTRIES, faults: Faults = NO_FAULTS) -> int | None:
    """Boot: a file over ``over`` bytes is replaced whole (atomic) by the newest line of each id not in
    ``live`` (a session created again since; its next delete logs it again), the newest ``keep`` of them.
    Returns the number of lines kept, ``None`` when the file was left as it is."""
    path = sessions_dir / FILE_NAME
    try:
        if os.lstat(path).st_size <= over:
            return None
    except FileNotFoundError:
        return None
    alive = set(live)
    kept = [e for e in newest(read(sessions_dir)) if e.session_id not in alive][-keep:] if keep > 0 else []
    atomic_write(path, b"".join(e.line() for e in kept), faults=faults, point_prefix="deleted_log.compact")
    return len(kept)
