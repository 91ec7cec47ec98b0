"""Content-addressed attachment blobs and their budget (seed 000 §2.3, §5).

Bytes live in ``attachments/<sha256>`` (the name *is* the content hash, so a
second put of the same bytes writes nothing); ``attachment_blobs`` has one row
per blob (size, MIME type, last use, eviction mark) and ``attachment_refs``
records which session/message references it.

Budget eviction (default 200 MB, the app settings' ``attachmentBudgetBytes`` overrides)
removes the least recently used blobs **not referenced by the active session**
until usage is back under the budget, in three durable steps:

1. one transaction marks the victims (``marked_for_eviction = 1``) and deletes
   their references, so from here on nothing refers to them;
2. the bytes are unlinked (directory fsynced);
3. one transaction deletes the marked rows.

A crash after 1 leaves marked rows that every later GC finishes first (a marked
blob counts as gone: no new reference can be made to it); a crash in 2 or 3
leaves rows without bytes that are likewise marked. A reference therefore
never points at missing bytes. Writers (put/import/ref/gc) are serialized by
the caller (one lock per host), so a put of the same content cannot race an
eviction of it.

Synchronous: file functions run in a worker thread, SQL functions inside a DB
writer / reader call.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import orjson

from store.errors import InvalidInput, NotFound, PayloadTooLarge, PermissionDenied, SessionNotFound, classify_os_error
from store.faults import NO_FAULTS, Faults
from store.fsutil import TEMP_MARKER, fsync_dir, open_nofollow, remove_file_durable, write_all
from store.safe_open import check_path, is_under, open_under

__all__ = [
    "DEFAULT_BUDGET_BYTES",
    "MAX_PUT_BYTES",
    "WARN_FRACTION",
    "AttachmentFiles",
    "collect",
    "Estimate",
    "estimate",
    "finish_eviction",
    "mark_for_eviction",
    "pending_evictions",
    "plan_eviction",
    "record_blob",
    "record_ref",
    "validate_sha",
]

DEFAULT_BUDGET_BYTES = 200 * 1024 * 1024
MAX_PUT_BYTES = 4 * 1024 * 1024  # inline base64 puts; bigger files use importFile
WARN_FRACTION = 0.8
BUDGET_SETTING = ("app", "attachmentBudgetBytes")
_CHUNK = 1 << 20
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
T = TypeVar("T")


def validate_sha(value: object) -> str:
    if not isinstance(value, str) or not _SHA_RE.fullmatch(value):
        raise InvalidInput("sha256 must be 64 lowercase hex characters", data={"field": "sha256"})
    return value


def ref_for(sha: str) -> str:
    return f"attachments/{sha}"


class AttachmentFiles:
    """The ``attachments/`` directory."""

    def __init__(self, directory: str | os.PathLike[str], *, faults: Faults = NO_FAULTS) -> None:
        self.directory = Path(directory)
        self.faults = faults

    def path(self, sha: str) -> Path:
        return self.directory / validate_sha(sha)

    def put_bytes(self, data: bytes) -> tuple[str, int]:
        """Store ``data`` under its hash; a blob already present is not rewritten."""
        sha = hashlib.sha256(data).hexdigest()
        if self._present(sha, len(data)):
            return sha, len(data)
        tmp, fd = self._temp()
        try:
            try:
                write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            self._install(tmp, sha)
        except OSError as exc:
            _unlink_quietly(tmp)
            raise classify_os_error(exc, "store attachment") from exc
        return sha, len(data)

    def import_file(self, source: str | os.PathLike[str], *, max_bytes: int, roots: Iterable[str],
                    exclude: Iterable[str] = ()) -> tuple[str, int]:
        """Streaming copy of a regular file under an allowed root (hashing as it goes); never loads it whole.

        ``roots``: folders the file may be in (reached without following any
        symlink below them); ``exclude``: folders refused even inside a root (the
        data directory), unless the root itself lies inside one (its scratch).
        The file is opened non-blocking and ``fstat``-checked before a byte is
        read (a FIFO, a device or a directory is ``INVALID_PARAMS``), and it may
        not be larger than ``max_bytes`` (``PAYLOAD_TOO_LARGE``).
        """
        src = check_path(os.fspath(source))
        root_list = list(roots)
        excluded = is_under(src, exclude)
        base = is_under(src, root_list)
        if excluded is not None and (base is None or is_under(base, [excluded]) is None):
            raise PermissionDenied(f"{src} is inside the host's data directory; only its scratch folder may be "
                                   "imported from", data={"field": "path", "path": src})
        sfd = open_under(src, root_list, max_bytes=max_bytes)
        try:
            tmp, fd = self._temp()
            try:
                digest = hashlib.sha256()
                size = 0
                try:
                    while chunk := os.read(sfd, _CHUNK):
                        size += len(chunk)
                        if size > max_bytes:
                            raise PayloadTooLarge(f"{src} is larger than {max_bytes} bytes", data={"path": src})
                        digest.update(chunk)
                        write_all(fd, chunk)
                    self.faults.point("attachments.import.before_fsync")
                    os.fsync(fd)
                finally:
                    os.close(fd)
                sha = digest.hexdigest()
                if self._present(sha, size):
                    _unlink_quietly(tmp)
                else:
                    self._install(tmp, sha)
            except OSError as exc:
                _unlink_quietly(tmp)
                raise classify_os_error(exc, f"import {src}") from exc
            except BaseException:
                _unlink_quietly(tmp)
                raise
        finally:
            os.close(sfd)
        return sha, size

    def delete(self, sha: str) -> bool:
        return remove_file_durable(self.path(sha))

    def exists(self, sha: str) -> bool:
        return self.path(sha).is_file()

    def blob_names(self) -> list[str]:
        """Names of the blob files present (temp files and others ignored)."""
        return sorted(n for n in os.listdir(self.directory) if _SHA_RE.fullmatch(n))

    # -- helpers ---------------------------------------------------------
    def _present(self, sha: str, size: int) -> bool:
        try:
            return os.stat(self.path(sha), follow_symlinks=False).st_size == size
        except FileNotFoundError:
            return False

    def _temp(self) -> tuple[Path, int]:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.directory / f"blob{TEMP_MARKER}{secrets.token_hex(6)}"
        fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.fchmod(fd, 0o600)
        return tmp, fd

    def _install(self, tmp: Path, sha: str) -> None:
        os.replace(tmp, self.path(sha))  # same content under the same name: replacing is harmless
        fsync_dir(self.directory)


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # boot's temp sweep removes what is left


# -- SQL ---------------------------------------------------------------------


def budget_bytes(conn: sqlite3.Connection, default: int = DEFAULT_BUDGET_BYTES) -> int:
    """``attachmentBudgetBytes`` of the app settings blob (an older build's own row as a fallback)."""
    for key in ("settings", BUDGET_SETTING[1]):
        row = conn.execute("SELECT value_json FROM kv WHERE ns = ? AND key = ?", (BUDGET_SETTING[0], key)).fetchone()
        if row is None:
            continue
        try:
            value = orjson.loads(row[0])
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, dict):
            value = value.get(BUDGET_SETTING[1])
        if type(value) is int and value > 0:
            return value
    return default


def record_blob(conn: sqlite3.Connection, sha: str, size: int, mime_type: str | None, now_ms: int) -> None:
    """Upsert the blob row (a re-put refreshes ``last_used_at`` and clears an eviction mark)."""
    conn.execute(
        "INSERT INTO attachment_blobs(sha256, size_bytes, mime_type, created_at, last_used_at) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT(sha256) DO UPDATE SET last_used_at = excluded.last_used_at, "
        "size_bytes = excluded.size_bytes, mime_type = COALESCE(attachment_blobs.mime_type, excluded.mime_type), "
        "marked_for_eviction = 0",
        (sha, size, mime_type, now_ms, now_ms),
    )


def blob_row(conn: sqlite3.Connection, sha: str) -> dict[str, object] | None:
    row = conn.execute(
        "SELECT sha256, size_bytes, mime_type, created_at, last_used_at, marked_for_eviction "
        "FROM attachment_blobs WHERE sha256 = ?", (sha,)).fetchone()
    if row is None:
        return None
    return {"sha256": row[0], "size": row[1], "mimeType": row[2], "createdAt": row[3], "lastUsedAt": row[4],
            "marked": bool(row[5])}


def record_ref(conn: sqlite3.Connection, sha: str, session_id: str, message_id: str | None, now_ms: int) -> bool:
    """Reference a live blob from a session (message); True if the reference is new."""
    blob = blob_row(conn, validate_sha(sha))
    if blob is None or blob["marked"]:
        raise NotFound(f"attachment {sha} not found (never stored or evicted)", data={"sha256": sha})
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
        raise SessionNotFound(f"session {session_id} not found", data={"sessionId": session_id})
    conn.execute("UPDATE attachment_blobs SET last_used_at = MAX(last_used_at, ?) WHERE sha256 = ?", (now_ms, sha))
    exists = conn.execute(
        "SELECT 1 FROM attachment_refs WHERE sha256 = ? AND session_id = ? AND message_id IS ?",
        (sha, session_id, message_id)).fetchone()
    if exists:
        return False
    conn.execute("INSERT INTO attachment_refs(sha256, session_id, message_id) VALUES (?, ?, ?)",
                 (sha, session_id, message_id))
    return True


def refs_of(conn: sqlite3.Connection, sha: str) -> list[tuple[str, str | None]]:
    return [(r[0], r[1]) for r in conn.execute(
        "SELECT session_id, message_id FROM attachment_refs WHERE sha256 = ? ORDER BY session_id, message_id",
        (sha,))]


@dataclass(frozen=True)
class Estimate:
    used_bytes: int
    budget_bytes: int
    blobs: int

    @property
    def percent(self) -> float:
        return round(100.0 * self.used_bytes / self.budget_bytes, 2)

    @property
    def warning(self) -> bool:
        return self.used_bytes > WARN_FRACTION * self.budget_bytes

    def to_wire(self) -> dict[str, object]:
        return {"usedBytes": self.used_bytes, "budgetBytes": self.budget_bytes, "percent": self.percent,
                "warning": self.warning, "blobs": self.blobs}


def estimate(conn: sqlite3.Connection, budget: int | None = None) -> Estimate:
    used, count = conn.execute(
        "SELECT COALESCE(SUM(size_bytes), 0), COUNT(*) FROM attachment_blobs WHERE marked_for_eviction = 0"
    ).fetchone()
    return Estimate(int(used), budget if budget is not None else budget_bytes(conn), int(count))


def plan_eviction(conn: sqlite3.Connection, budget: int, active_session_id: str | None) -> list[str]:
    """Least recently used unmarked blobs, not referenced by the active session, until under budget."""
    used = estimate(conn, budget).used_bytes
    victims: list[str] = []
    if used <= budget:
        return victims
    rows = conn.execute(
        "SELECT b.sha256, b.size_bytes FROM attachment_blobs b WHERE b.marked_for_eviction = 0 "
        "AND NOT EXISTS (SELECT 1 FROM attachment_refs r WHERE r.sha256 = b.sha256 AND r.session_id IS ?) "
        "ORDER BY b.last_used_at, b.created_at, b.sha256",
        (active_session_id,),
    )
    for sha, size in rows:
        if used <= budget:
            break
        victims.append(sha)
        used -= int(size)
    return victims


def mark_for_eviction(conn: sqlite3.Connection, shas: Iterable[str]) -> int:
    """Step 1: mark the blobs and drop every reference to them (one transaction)."""
    count = 0
    for sha in shas:
        conn.execute("DELETE FROM attachment_refs WHERE sha256 = ?", (sha,))
        count += conn.execute(
            "UPDATE attachment_blobs SET marked_for_eviction = 1 WHERE sha256 = ?", (sha,)).rowcount
    return count


def pending_evictions(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT sha256 FROM attachment_blobs WHERE marked_for_eviction = 1 ORDER BY sha256")]


def finish_eviction(conn: sqlite3.Connection, shas: Iterable[str]) -> int:
    """Step 3: delete the rows of marked blobs whose bytes are gone."""
    return sum(conn.execute(
        "DELETE FROM attachment_blobs WHERE sha256 = ? AND marked_for_eviction = 1", (sha,)).rowcount
        for sha in shas)


def known_blobs(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT sha256 FROM attachment_blobs")}


def missing_bytes(conn: sqlite3.Connection, present: set[str]) -> list[str]:
    """Unmarked rows whose file is gone (a lost blob): they must be marked too."""
    return [r[0] for r in conn.execute("SELECT sha256 FROM attachment_blobs WHERE marked_for_eviction = 0")
            if r[0] not in present]


class WriteTx(Protocol):
    """Runs ``fn(conn)`` in one committed write transaction and returns its value."""

    def __call__(self, fn: Callable[[sqlite3.Connection], T], /) -> T: ...


def collect(files: AttachmentFiles, write: WriteTx, *, budget: int | None,
            active_session_id: str | None,
            finalize: Callable[[sqlite3.Connection, dict[str, object]], object] | None = None) -> object:
    """Budget eviction + repair, in the durable order described in the module doc.

    ``write(fn)`` runs ``fn(conn)`` in one committed transaction (the DB writer
    in the host, a plain ``with conn:`` in tests). Callers serialize it with
    every other attachment writer. ``finalize(conn, result)`` runs in the last
    transaction (e.g. to store a command receipt) and its value is returned.
    """
    faults = files.faults
    present = set(files.blob_names())

    def step1(conn: sqlite3.Connection) -> tuple[list[str], list[str], list[str], int]:
        limit = budget if budget is not None else budget_bytes(conn)
        lost = missing_bytes(conn, present)
        mark_for_eviction(conn, lost)
        victims = plan_eviction(conn, limit, active_session_id)
        sizes = {sha: int(size) for sha, size in conn.execute(
            "SELECT sha256, size_bytes FROM attachment_blobs WHERE marked_for_eviction = 0")}
        freed = sum(sizes[s] for s in victims)
        mark_for_eviction(conn, victims)
        orphans = sorted(present - known_blobs(conn))
        return victims, pending_evictions(conn), orphans, freed

    victims, marked, orphans, freed = write(step1)
    faults.point("attachments.gc.after_mark")
    for sha in [*marked, *orphans]:
        files.delete(sha)
        faults.point("attachments.gc.after_unlink")
    result: dict[str, object] = {"evicted": victims, "freedBytes": freed, "orphansRemoved": len(orphans)}

    def step3(conn: sqlite3.Connection) -> object:
        result["finished"] = finish_eviction(conn, marked)
        return finalize(conn, result) if finalize is not None else result

    return write(step3)
