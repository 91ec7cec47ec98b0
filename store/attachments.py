"""Content-addressed attachment blobs, their metadata and their budget (seed 000 §2.3, §5; seed 003 §4.7, §8).

Bytes live in ``attachments/<sha256>`` (the name *is* the content hash, so a
second put of the same bytes writes nothing); ``attachment_blobs`` has one row
per blob: size, MIME type, last use, the seed 000 §2.3 metadata (kind, trust,
provenance, source, run reference, page/image metadata) and its deletion state
(``live`` → ``evicting`` → ``evicted``; an evicted blob keeps its row as a
tombstone, so what referred to it can say so). ``attachment_refs`` records
which session/message references a blob: references a client made
(``attachments.ref``, origin ``client``) and references the GC derived from the
session files and the queue (origin ``transcript``, ``revision``,
``checkpoint``, ``queue``: :func:`scan_references`).

What a put acknowledged is also kept beside the bytes, in ``attachments/<sha256>.meta``
(:meth:`AttachmentFiles.write_meta`, before the answer; removed with the blob): a database lost and rebuilt
from the files adopts each blob with it (``store.upgrade.attachment_adopt``), since the blocks that refer to
a blob hold only its name, a MIME type and ``image``/``file``.

Transcript lines never hold the bytes: an attachment block carries metadata and
``ref: "attachments/<sha256>"`` (``protocol.blocks`` refuses inline data).

Budget eviction (default 200 MB, the app settings' ``attachmentBudgetBytes`` overrides)
removes the least recently used blobs **not referenced by the active session**
until usage is back under the budget. Before that, whatever the budget, it
sweeps every live blob **nothing references any more** (seed 003 §8, seed 000
§3.3; :func:`plan_unreferenced`): no block of any session file (transcript,
revisions, in-flight checkpoint) or queued turn holds it, no reference row of an
existing session does (a deleted or purged session's rows cascade away with it,
a trashed one's stay), and its last use (put, import, ref) is older than the
grace (default 1 hour, the app settings' ``attachmentUnreferencedGraceMs``), so
a blob put for a message not yet appended stays. The sweep needs the scan (no
``sessions_dir``: no sweep) and goes through the same steps; in 1b a swept blob
that *any* session or queued turn came to reference is taken back. Both lists
are in the answer (``evicted``, ``unreferencedEvicted``). The durable steps:

0. the session files and queue entries are scanned for references (outside
   any transaction), and the derived references are brought up to date in the
   same transaction as step 1 (so the active session's blocks protect their
   blobs even when no client called ``attachments.ref``). A session whose files
   could not be read whole (a line over ``MAX_LINE_BYTES``, read past in bounded
   chunks and never held, a damaged line, an unreadable file: ``Scan.incomplete``)
   may reference any blob: its recorded references stay, nothing is swept in
   that GC, nothing is evicted over budget if it is the active session, and the
   answer names it (``scanIncomplete``);
1. one transaction marks the victims (``deletion_state = 'evicting'``) and
   **marks every reference to them** (``attachment_refs.evicted_at``): from
   here on every block that referred to them reads back ``"evicted": true``
   (:func:`evicted_marks`, the ``session.get`` projection; reads that are not
   transcript windows — ``session.context``, the streaming reply, the turn
   queue — use :func:`mark_evicted_blocks`; the transcript itself is never
   rewritten, seed 003 §8);
   1b. the tails the files grew by since step 0 are scanned again, and any new
   block referring to a victim is recorded, marked (one more transaction); a
   victim that the active session came to reference meanwhile (an append
   acknowledged after the scan, before the marks) is taken back in that same
   transaction, live with its marks cleared, and leaves the answer: its bytes
   are still there, and the active session's blobs are never evicted;
2. the bytes are unlinked (directory fsynced);
3. one transaction turns the marked rows into tombstones (``evicted``).

A blob file without a row (an interrupted put's leftover) is removed after step 1 only when the scan read
every session file whole and nothing it found refers to it; one a session file or queued turn names is kept,
and adopted in step 3 (a live row, its references recorded) when its bytes hash to its name (seed 003 §8);
so are the bytes of an evicted blob put back by hand (revived, as a re-put revives it).

A crash after 1 leaves ``evicting`` rows that every later GC finishes first (a
marked blob counts as gone: no new reference can be made to it), except those
the later GC's active session references while their bytes are still there:
taken back as in 1b; a crash in 2 or 3 leaves rows without bytes that are
likewise marked. A reference therefore
never points at missing bytes unmarked. Writers (put/import/ref/gc) are
serialized by the caller (one lock per host), so a put of the same content
cannot race an eviction of it; a re-put of an evicted blob's bytes revives it
(and clears its references' marks).

A GC with a command receipt key also writes, in step 1, its answer (victims,
freed bytes, orphans, the estimate after marking) as a pending row
``kv(pi-host/attachments.gc, [clientId, submissionId])`` (a namespace no
``settings.*`` call can name); step 3 drops it with the receipt row. A retry
after a crash between them finds the pending row, plans nothing new, finishes
the unlinking and tombstones, and answers what the first attempt would have:
the command has one effect and one answer wherever it died.

Synchronous: file functions run in a worker thread, SQL functions inside a DB
writer / reader call.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import orjson

from store.errors import (
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    SessionNotFound,
    classify_os_error,
    damaged_setting,
)
from store.faults import NO_FAULTS, Faults
from store.fsutil import (
    TEMP_MARKER,
    OwedSyncs,
    atomic_write,
    database_folder,
    fsync_dir,
    open_nofollow,
    remove_file_durable,
    write_all,
)
from store.jsonio import loads_stored
from store.receipts import ReceiptKey, conflict
from store.safe_open import check_path, is_under, open_under
from store.stamps import after_newest
from store.transcripts.transcript import MAX_LINE_BYTES, bounded_lines

__all__ = [
    "BLOB_KINDS",
    "BlobMeta",
    "BlobStream",
    "blob_refs",
    "DEFAULT_BUDGET_BYTES",
    "DEFAULT_GRACE_MS",
    "REF_ORIGINS",
    "Scan",
    "evicted_marks",
    "LostBlobs",
    "PresentBlobs",
    "reader_memo",
    "lost_blobs",
    "quoted_refs",
    "mark_evicted",
    "mark_evicted_blocks",
    "scan_references",
    "MAX_PUT_BYTES",
    "WARN_FRACTION",
    "AttachmentFiles",
    "collect",
    "Estimate",
    "estimate",
    "file_sha256",
    "finish_eviction",
    "mark_for_eviction",
    "pending_evictions",
    "pending_gc",
    "plan_eviction",
    "plan_unreferenced",
    "read_meta_file",
    "record_blob",
    "record_ref",
    "row_meta",
    "validate_sha",
]

DEFAULT_BUDGET_BYTES = 200 * 1024 * 1024
MAX_PUT_BYTES = 4 * 1024 * 1024  # inline base64 puts; bigger files use importFile
WARN_FRACTION = 0.8
BUDGET_SETTING = ("app", "attachmentBudgetBytes")
GRACE_SETTING = ("app", "attachmentUnreferencedGraceMs")
DEFAULT_GRACE_MS = 60 * 60 * 1000
"""An unreferenced blob is swept only when its last use (put, import, ref) is older than this."""
_CHUNK = 1 << 20
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_QUOTED_REF_RE = re.compile(rb'"attachments/([0-9a-f]{64})"')
REF_PREFIX = "attachments/"
ATTACHMENTS_DIR = "attachments"
"""The blobs' folder in the data directory (a block's ``ref`` names a blob by its path there)."""
BLOB_KINDS = ("image", "file", "screenshot", "pageSnapshot", "pageText")
"""Seed 000 §2: file, image, screenshot, page snapshot and page text blobs."""
REF_ORIGINS = ("client", "transcript", "revision", "checkpoint", "queue")
DELETION_STATES = ("live", "evicting", "evicted")
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
        self.owed = OwedSyncs()
        """A directory fsync that failed after a blob was installed (the call failed): a retry finds the
        blob present and writes nothing, so :meth:`put_bytes` and :meth:`import_file` are refused until the
        restart (``OwedSyncs``: RELIABILITY rule 7)."""

    def path(self, sha: str) -> Path:
        return self.directory / validate_sha(sha)

    def put_bytes(self, data: bytes) -> tuple[str, int]:
        """Store ``data`` under its hash; a blob already present is not rewritten."""
        sha = hashlib.sha256(data).hexdigest()
        self.owed.pay()  # NotDurable after a failed fsync here, until the restart: never answered on it
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
        self.owed.pay()  # as in put_bytes
        src = check_path(os.fspath(source))
        root_list = list(roots)
        excludes = list(exclude)
        base = is_under(src, root_list)
        # As written and as resolved: a root (a project path) may reach the data directory through a
        # symlink of its own (open_under follows none below the root, so resolving the root decides).
        for path, root, outs in ((src, base, excludes),
                                 (os.path.realpath(src), os.path.realpath(base) if base is not None else None,
                                  [os.path.realpath(e) for e in excludes])):
            excluded = is_under(path, outs)
            # a root strictly inside an excluded folder (its scratch) is allowed; one that is or holds it is not
            if excluded is not None and (root is None or is_under(root, [excluded]) is None
                                         or os.path.normpath(root) == excluded):
                raise PermissionDenied(f"{src} is inside the host's data directory; only its scratch folder may "
                                       "be imported from", data={"field": "path", "path": src})
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

    def stream(self) -> BlobStream:
        """A blob written in parts (an import's carried bytes, :class:`BlobStream`)."""
        self.owed.pay()  # as in put_bytes
        return BlobStream(self)

    def meta_path(self, sha: str) -> Path:
        return self.directory / f"{validate_sha(sha)}{META_SUFFIX}"

    def put_bytes_kept(self, data: bytes, mime_type: str | None) -> tuple[str, int]:
        """:meth:`put_bytes` and the MIME type in the blob's metadata file (a session import's images: the row
        it records holds only that, and the file keeps it through a lost database)."""
        sha, size = self.put_bytes(data)
        self.write_meta(sha, mime_type, NO_META, None)
        return sha, size

    def write_meta(self, sha: str, mime_type: str | None, meta: BlobMeta, now_ms: int | None,
                   prior: Mapping[str, Any] | None = None) -> bool:
        """Keep the put's metadata beside its blob (``<sha256>.meta``), before the put is acknowledged: the
        database row is not the only copy (a lost ``pi.sqlite`` is rebuilt from the files; boot's adoption reads
        this file, :func:`read_meta_file`). Merged as the row is (the first writer's values stay, a re-put fills
        what is missing); nothing is written when the file already holds all of it (a re-put of the same bytes
        costs one small read). ``prior``: what the blob's row already holds (:func:`row_meta`), which stays over
        the put's values as in the row; ``{}`` (no row): a file already there is an unanswered attempt's (its
        row never committed), so this put's values go first, as they do in the row; None: not known (the file's
        values stay). Atomic replace, fsynced with its directory; True if written."""
        self.owed.pay()
        path = self.meta_path(sha)
        old = read_meta_file(path)
        put = (_meta_fields(mime_type, meta), {"createdAt": now_ms})  # no createdAt: adoption takes the mtime
        order = (*put, old or {}) if prior is not None and not prior else (old or {}, prior or {}, *put)
        new: dict[str, Any] = {}
        for source in order:
            for key, value in source.items():
                if new.get(key) is None and value is not None:
                    new[key] = value
        if old is not None and new == old:
            return False
        atomic_write(path, orjson.dumps(new), faults=self.faults, point_prefix="attachments.meta",
                     owed=self.owed)
        return True

    def delete(self, sha: str) -> bool:
        """Remove the blob, then its metadata file (a blob present never lacks the metadata it had)."""
        gone = remove_file_durable(self.path(sha))
        remove_file_durable(self.meta_path(sha))
        return gone

    def meta_names(self) -> list[str]:
        """The blobs (sha256) that have a metadata file, whether or not their bytes are present."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(n[:-len(META_SUFFIX)] for n in names
                      if n.endswith(META_SUFFIX) and _SHA_RE.fullmatch(n[:-len(META_SUFFIX)]))

    def exists(self, sha: str) -> bool:
        return self.path(sha).is_file()

    def present(self, sha: str, size: int) -> bool:
        """The blob's bytes are here with that size (a second import of them writes nothing)."""
        return self._present(sha, size)

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
        try:
            fsync_dir(self.directory)
        except OSError:
            self.owed.owe(self.directory, self.path(sha))
            raise


class BlobStream:
    """Bytes that arrive in parts (a session export's ``blob`` lines) and must hash to a name given beforehand:
    written to a temp file as they come (never held whole), hashed on the way, and installed under the name only
    when the digest is that name (:meth:`finish`); otherwise the temp file is removed and nothing is stored."""

    def __init__(self, files: AttachmentFiles) -> None:
        self._files = files
        self._digest = hashlib.sha256()
        self.size = 0
        self._tmp: Path | None = None
        self._fd = -1
        try:
            self._tmp, self._fd = files._temp()
        except OSError as exc:
            raise classify_os_error(exc, "store attachment") from exc

    def write(self, data: bytes) -> None:
        self._digest.update(data)
        self.size += len(data)
        try:
            write_all(self._fd, data)
        except OSError as exc:
            self.abort()
            raise classify_os_error(exc, "store attachment") from exc

    def finish(self, sha: str) -> bool:
        """Install the bytes as ``attachments/<sha>`` if they hash to ``sha`` (True); else remove them (False).
        A blob already present is left as it is (content-addressed: nothing to write)."""
        if self._digest.hexdigest() != sha:
            self.abort()
            return False
        tmp, fd = self._tmp, self._fd
        assert tmp is not None
        self._tmp, self._fd = None, -1
        try:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            if self._files._present(sha, self.size):
                _unlink_quietly(tmp)
            else:
                self._files._install(tmp, sha)
        except OSError as exc:
            _unlink_quietly(tmp)
            raise classify_os_error(exc, "store attachment") from exc
        return True

    def abort(self) -> None:
        """Drop what was written (idempotent)."""
        tmp, fd = self._tmp, self._fd
        self._tmp, self._fd = None, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass
        if tmp is not None:
            _unlink_quietly(tmp)


META_SUFFIX = ".meta"
"""``attachments/<sha256>.meta``: the metadata a put acknowledged (:meth:`AttachmentFiles.write_meta`)."""
MAX_META_FILE_BYTES = 1 << 20
_META_KEYS = ("mimeType", "kind", "trust", "provenance", "source", "runId")


def _meta_fields(mime_type: str | None, meta: BlobMeta) -> dict[str, Any]:
    return {"mimeType": mime_type, "kind": meta.kind, "trust": meta.trust, "provenance": meta.provenance,
            "source": meta.source, "runId": meta.run_id,
            "meta": dict(meta.meta) if meta.meta is not None else None}


def read_meta_file(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A blob's metadata file, only the fields of the expected types kept (None: no file, or one that cannot be
    read or parsed: the blob is adopted without it, as before the file existed; doctor names a damaged one)."""
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        raw = os.read(fd, MAX_META_FILE_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) > MAX_META_FILE_BYTES:
        return None
    try:
        rec = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(rec, dict):
        return None
    out: dict[str, Any] = {}
    for key in _META_KEYS:
        if isinstance(rec.get(key), str):
            out[key] = rec[key]
    if isinstance(rec.get("meta"), dict):
        out["meta"] = rec["meta"]
    if type(rec.get("createdAt")) is int:
        out["createdAt"] = rec["createdAt"]
    return out


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # boot's temp sweep removes what is left


# -- SQL ---------------------------------------------------------------------


def _app_setting(conn: sqlite3.Connection, key: str) -> Any:
    """The value of ``kv(app, key)`` (None: unset); ``DamagedRecord`` (CORRUPT_DATA, data ns/key/repair) when it no
    longer parses, or for the blob ``settings`` is not an object (as ``store.config.settings.app_blob`` reads it: that
    module imports this one's importers)."""
    row = conn.execute("SELECT value_json FROM kv WHERE ns = 'app' AND key = ?", (key,)).fetchone()
    if row is None:
        return None
    try:
        value = orjson.loads(row[0])
    except orjson.JSONDecodeError as exc:
        raise damaged_setting("app", key, str(exc)) from None
    if key == "settings" and not isinstance(value, dict):
        raise damaged_setting("app", key, f"a JSON {type(value).__name__}, not an object")
    return value


def budget_bytes(conn: sqlite3.Connection, default: int = DEFAULT_BUDGET_BYTES) -> int:
    """``attachmentBudgetBytes`` of the app settings blob (an older build's own row as a fallback). A damaged
    blob (or own row) is ``DamagedRecord`` (CORRUPT_DATA): a GC never evicts by the default budget in place of
    the user's."""
    blob = _app_setting(conn, "settings")
    value = blob.get(BUDGET_SETTING[1]) if blob is not None else None
    if type(value) is int and value > 0:
        return value
    own = _app_setting(conn, BUDGET_SETTING[1])
    return own if type(own) is int and own > 0 else default


def grace_ms(conn: sqlite3.Connection, default: int = DEFAULT_GRACE_MS) -> int:
    """``attachmentUnreferencedGraceMs`` of the app settings blob (``settings.set`` validated it); a damaged blob
    is ``DamagedRecord``: a GC never sweeps by the default grace in place of the user's."""
    blob = _app_setting(conn, "settings")
    value = blob.get(GRACE_SETTING[1]) if blob is not None else None
    return value if type(value) is int and value >= 0 else default


@dataclass(frozen=True, slots=True)
class BlobMeta:
    """Seed 000 §2.3: what a blob is and where it came from (all optional; the first writer's values stay)."""

    kind: str | None = None
    """``image`` | ``file`` | ``screenshot`` | ``pageSnapshot`` | ``pageText``."""
    trust: str | None = None
    """Who vouches for the content, e.g. ``user`` (the user attached it) or ``untrusted`` (a page or tool)."""
    provenance: str | None = None
    """How it was obtained, e.g. ``upload``, ``import``, ``capture``, ``tool``."""
    source: str | None = None
    """Where it came from: a URL, a path or a tool name."""
    run_id: str | None = None
    """The run (turn) that produced it."""
    meta: Mapping[str, Any] | None = None
    """Page metadata (url, title, …) or image metadata (width, height, …)."""


NO_META = BlobMeta()


def use_stamp(conn: sqlite3.Connection, now_ms: int) -> int:
    """The ``last_used_at`` of a blob used now: ``now_ms``, or just after the most recent use when the
    clock is behind it (stepped back). Budget eviction takes least recently used blobs first: on a
    clock stepped back, a blob used this minute would otherwise go before ones untouched for days."""
    return after_newest(conn, "SELECT MAX(last_used_at) FROM attachment_blobs", (), now_ms, ties=True)


def record_blob(conn: sqlite3.Connection, sha: str, size: int, mime_type: str | None, now_ms: int,
                meta: BlobMeta = NO_META) -> None:
    """Upsert the blob row: a re-put refreshes ``last_used_at``, fills metadata the row lacks, and revives
    a blob that was being or had been evicted (its bytes are back, so its references resolve again)."""
    meta_json = orjson.dumps(dict(meta.meta)).decode() if meta.meta is not None else None
    revived = conn.execute("SELECT 1 FROM attachment_blobs WHERE sha256 = ? AND deletion_state != 'live'",
                           (sha,)).fetchone() is not None
    conn.execute(
        "INSERT INTO attachment_blobs(sha256, size_bytes, mime_type, created_at, last_used_at, kind, trust, "
        "provenance, source, run_id, meta_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT(sha256) DO UPDATE SET last_used_at = MAX(attachment_blobs.last_used_at, excluded.last_used_at), "
        "size_bytes = excluded.size_bytes, mime_type = COALESCE(attachment_blobs.mime_type, excluded.mime_type), "
        "kind = COALESCE(attachment_blobs.kind, excluded.kind), "
        "trust = COALESCE(attachment_blobs.trust, excluded.trust), "
        "provenance = COALESCE(attachment_blobs.provenance, excluded.provenance), "
        "source = COALESCE(attachment_blobs.source, excluded.source), "
        "run_id = COALESCE(attachment_blobs.run_id, excluded.run_id), "
        "meta_json = COALESCE(attachment_blobs.meta_json, excluded.meta_json), "
        "marked_for_eviction = 0, deletion_state = 'live', evicted_at = NULL",
        (sha, size, mime_type, now_ms, use_stamp(conn, now_ms), meta.kind, meta.trust, meta.provenance, meta.source,
         meta.run_id, meta_json),
    )
    if revived:
        conn.execute("UPDATE attachment_refs SET evicted_at = NULL WHERE sha256 = ?", (sha,))


_BLOB_COLUMNS = ("sha256, size_bytes, mime_type, created_at, last_used_at, marked_for_eviction, kind, trust, "
                 "provenance, source, run_id, meta_json, deletion_state, evicted_at")


def blob_row(conn: sqlite3.Connection, sha: str, *, meta: bool = False) -> dict[str, object] | None:
    """The blob's row; with ``meta`` its ``meta_json`` decoded (``DamagedRecord``, CORRUPT_DATA, when it no
    longer parses: ``attachments.get``). Without, ``meta`` is left out: a reference or a re-put of the blob
    needs none of it, and a damaged one never stops them."""
    row = conn.execute(f"SELECT {_BLOB_COLUMNS} FROM attachment_blobs WHERE sha256 = ?", (sha,)).fetchone()
    if row is None:
        return None
    out: dict[str, object] = {
        "sha256": row[0], "size": row[1], "mimeType": row[2], "createdAt": row[3], "lastUsedAt": row[4],
        "marked": bool(row[5]), "kind": row[6], "trust": row[7], "provenance": row[8], "source": row[9],
        "runId": row[10], "meta": None, "deletionState": row[12], "evictedAt": row[13]}
    if meta and row[11]:
        out["meta"] = loads_stored(row[11], f"attachment {row[0]}'s meta_json", dict)
    return out


def row_meta(conn: sqlite3.Connection, sha: str) -> dict[str, Any]:
    """The metadata fields the blob's row holds (any deletion state), keyed as in its metadata file; a damaged
    ``meta_json`` is left out (the put's own value, if any, then goes to the file)."""
    row = conn.execute("SELECT mime_type, kind, trust, provenance, source, run_id, meta_json, created_at "
                       "FROM attachment_blobs WHERE sha256 = ?", (sha,)).fetchone()
    if row is None:
        return {}
    out: dict[str, Any] = {key: value for key, value in zip(_META_KEYS, row[:6], strict=True) if value is not None}
    if row[6]:
        try:
            meta = orjson.loads(row[6])
        except orjson.JSONDecodeError:
            meta = None
        if isinstance(meta, dict):
            out["meta"] = meta
    out["createdAt"] = int(row[7])
    return out


def blob_wire(conn: sqlite3.Connection, sha: str) -> dict[str, Any] | None:
    """``attachments.get``: the row's metadata, its deletion state and its references (None keys left out).

    A ``live`` row whose bytes are gone (deleted behind the host's back: the next GC marks it,
    :func:`missing_bytes`) reads as what it is, ``evicted`` with every reference marked, never ``live``;
    without ``evictedAt``, which only an eviction sets."""
    row = blob_row(conn, validate_sha(sha), meta=True)
    if row is None:
        return None
    lost = row["deletionState"] == "live" and bytes_gone(conn, sha)
    if lost:
        row["deletionState"] = "evicted"
    out: dict[str, Any] = {"ref": ref_for(sha)}
    for key in ("sha256", "size", "mimeType", "kind", "trust", "provenance", "source", "runId", "meta",
                "createdAt", "lastUsedAt", "deletionState", "evictedAt"):
        if row[key] is not None:
            out[key] = row[key]
    refs = []
    for sid, mid, origin, evicted_at in conn.execute(
            "SELECT session_id, message_id, origin, evicted_at FROM attachment_refs WHERE sha256 = ? "
            "ORDER BY session_id, message_id, origin LIMIT ?", (sha, MAX_LISTED_REFS + 1)):
        ref: dict[str, Any] = {"sessionId": sid, "origin": origin, "evicted": lost or evicted_at is not None}
        if mid is not None:
            ref["messageId"] = mid
        refs.append(ref)
    out["references"] = refs[:MAX_LISTED_REFS]
    out["referencesTruncated"] = len(refs) > MAX_LISTED_REFS
    return out


MAX_LISTED_REFS = 200


def bytes_gone(conn: sqlite3.Connection, sha: str) -> bool:
    """Whether the blob's file is missing from ``attachments/`` beside ``conn``'s database (as the GC tells a
    lost blob: no entry of that name, :func:`missing_bytes`). False for a database in memory (no folder)."""
    return bool(lost_blobs(conn, (validate_sha(sha),)))


def lost_blobs(conn: sqlite3.Connection, shas: Iterable[str]) -> set[str]:
    """Those of ``shas`` whose file is missing from ``attachments/`` beside ``conn``'s database (deleted by hand
    or lost; the next GC marks their rows, :func:`missing_bytes`): one ``lstat`` per distinct blob. Empty for a
    database in memory (no folder). A read marks their blocks evicted as it marks an evicted blob's."""
    wanted = set(shas)
    if not wanted:
        return set()
    folder = database_folder(conn)
    if folder is None:
        return set()
    base = os.path.join(folder, ATTACHMENTS_DIR)
    return {sha for sha in wanted if not os.path.lexists(os.path.join(base, sha))}


def record_ref(conn: sqlite3.Connection, sha: str, session_id: str, message_id: str | None, now_ms: int) -> bool:
    """Reference a live blob from a session (message); True if the reference is new. A blob whose bytes are
    gone (deleted behind the host's back, not yet marked by a GC: :func:`bytes_gone`) is not live."""
    blob = blob_row(conn, validate_sha(sha))
    if blob is None or blob["deletionState"] != "live" or bytes_gone(conn, sha):
        raise NotFound(f"attachment {sha} not found (never stored, evicted, or its bytes are gone)",
                       data={"sha256": sha})
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
        raise SessionNotFound(f"session {session_id} not found", data={"sessionId": session_id})
    conn.execute("UPDATE attachment_blobs SET last_used_at = MAX(last_used_at, ?) WHERE sha256 = ?",
                 (use_stamp(conn, now_ms), sha))
    exists = conn.execute(
        "SELECT 1 FROM attachment_refs WHERE sha256 = ? AND session_id = ? AND message_id IS ?",
        (sha, session_id, message_id)).fetchone()
    if exists:
        return False
    conn.execute("INSERT INTO attachment_refs(sha256, session_id, message_id) VALUES (?, ?, ?)",
                 (sha, session_id, message_id))
    return True


def refs_of(conn: sqlite3.Connection, sha: str, *, evicted: bool = False) -> list[tuple[str, str | None]]:
    """The live references of a blob (``evicted=True``: the references eviction marked)."""
    cond = "IS NOT NULL" if evicted else "IS NULL"
    return [(r[0], r[1]) for r in conn.execute(
        "SELECT DISTINCT session_id, message_id FROM attachment_refs WHERE sha256 = ? AND evicted_at "
        f"{cond} ORDER BY session_id, message_id", (sha,))]


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


def estimate(conn: sqlite3.Connection, budget: int | None = None, *, check_bytes: bool = False) -> Estimate:
    """Usage of the live blobs. ``check_bytes`` (``attachments.estimate``): without the live rows whose file is
    gone (deleted by hand or lost; the next GC marks them, :func:`missing_bytes`), checked as a read checks them
    (:class:`LostBlobs`: one folder listing, or none while the reader's memo holds). The GC marks those rows
    before it estimates: it needs no check."""
    used, count = conn.execute(
        "SELECT COALESCE(SUM(size_bytes), 0), COUNT(*) FROM attachment_blobs WHERE deletion_state = 'live'"
    ).fetchone()
    if check_bytes and count:
        sizes = dict(conn.execute("SELECT sha256, size_bytes FROM attachment_blobs WHERE deletion_state = 'live'"))
        for sha in LostBlobs(conn, reader_memo(conn))(sizes):
            used -= int(sizes[sha])
            count -= 1
    return Estimate(int(used), budget if budget is not None else budget_bytes(conn), int(count))


def plan_eviction(conn: sqlite3.Connection, budget: int, active_session_id: str | None) -> list[str]:
    """Least recently used unmarked blobs, not referenced by the active session, until under budget."""
    used = estimate(conn, budget).used_bytes
    victims: list[str] = []
    if used <= budget:
        return victims
    rows = conn.execute(
        "SELECT b.sha256, b.size_bytes FROM attachment_blobs b WHERE b.deletion_state = 'live' "
        "AND NOT EXISTS (SELECT 1 FROM attachment_refs r WHERE r.sha256 = b.sha256 AND r.session_id IS ? "
        "AND r.evicted_at IS NULL) "
        "ORDER BY b.last_used_at, b.created_at, b.sha256",
        (active_session_id,),
    )
    for sha, size in rows:
        if used <= budget:
            break
        victims.append(sha)
        used -= int(size)
    return victims


def plan_unreferenced(conn: sqlite3.Connection, found: Iterable[Ref], now_ms: int, grace: int) -> list[str]:
    """Live blobs nothing references any more, last used (put, import, ref) more than ``grace`` ms ago.

    Referenced means: a block of any session file or queued turn (``found``, whether or not its session
    is indexed) or a recorded reference of a session that still exists (a deleted session's rows went
    with it, a trashed one's stay). The active session's blobs are always in ``found``."""
    held = {r[0] for r in found}
    rows = conn.execute(
        "SELECT b.sha256 FROM attachment_blobs b WHERE b.deletion_state = 'live' AND b.last_used_at < ? "
        "AND NOT EXISTS (SELECT 1 FROM attachment_refs r WHERE r.sha256 = b.sha256) "
        "ORDER BY b.last_used_at, b.created_at, b.sha256", (now_ms - grace,))
    return [sha for (sha,) in rows if sha not in held]


def mark_for_eviction(conn: sqlite3.Connection, shas: Iterable[str], now_ms: int = 0) -> int:
    """Step 1: mark the blobs ``evicting`` and every reference to them evicted (one transaction)."""
    count = 0
    for sha in shas:
        conn.execute("UPDATE attachment_refs SET evicted_at = ? WHERE sha256 = ? AND evicted_at IS NULL",
                     (now_ms, sha))
        count += conn.execute(
            "UPDATE attachment_blobs SET marked_for_eviction = 1, deletion_state = 'evicting' "
            "WHERE sha256 = ? AND deletion_state = 'live'", (sha,)).rowcount
    return count


def pending_evictions(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT sha256 FROM attachment_blobs WHERE deletion_state = 'evicting' ORDER BY sha256")]


def finish_eviction(conn: sqlite3.Connection, shas: Iterable[str], now_ms: int = 0) -> int:
    """Step 3: the marked blobs whose bytes are gone become tombstones (``evicted``; the row stays)."""
    return sum(conn.execute(
        "UPDATE attachment_blobs SET deletion_state = 'evicted', evicted_at = ? "
        "WHERE sha256 = ? AND deletion_state = 'evicting'", (now_ms, sha)).rowcount
        for sha in shas)


def known_blobs(conn: sqlite3.Connection) -> set[str]:
    """Blobs whose bytes belong on disk (live, or evicting until step 2 removes them)."""
    return {r[0] for r in conn.execute("SELECT sha256 FROM attachment_blobs WHERE deletion_state != 'evicted'")}


def missing_bytes(conn: sqlite3.Connection, present: set[str]) -> list[str]:
    """Live rows whose file is gone (a lost blob): they must be marked too."""
    return [r[0] for r in conn.execute("SELECT sha256 FROM attachment_blobs WHERE deletion_state = 'live'")
            if r[0] not in present]


# -- references derived from the session files and the queue (seed 003 §8) ---

Ref = tuple[str, str, "str | None", str]
"""(sha256, session id, message id, origin)."""


@dataclass
class Scan:
    """What one scan found, and where each file's complete lines ended (to rescan only what grew)."""

    refs: set[Ref] = field(default_factory=set)
    ends: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """file name → (device, inode, offset after its last complete line)."""
    incomplete: set[str] = field(default_factory=set)
    """Sessions a file of which could not be read whole: a line over ``MAX_LINE_BYTES`` (skipped as it
    streams past, never held), a damaged line (not JSON), a checkpoint too big or damaged, a file that
    failed to open or read. What such a session references is not known: it may reference any blob
    (:func:`collect` sweeps nothing then, and keeps its recorded references)."""


_FILE_ORIGINS = ((".revisions.jsonl", "revision"), (".inflight.json", "checkpoint"), (".jsonl", "transcript"))


def quoted_refs(blob: bytes | memoryview) -> set[str]:
    """The blobs (sha256) every ``"attachments/<sha256>"`` in these JSON bytes names (as the GC's scan reads
    them: a quote escaped inside a string does not count)."""
    return {m.group(1).decode() for m in _QUOTED_REF_RE.finditer(blob)}


def _classify(name: str) -> tuple[str, str] | None:
    for suffix, origin in _FILE_ORIGINS:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)], origin
    return None


def _line_refs(line: bytes, sid: str, origin: str) -> Iterator[Ref]:
    """The references of one line (or checkpoint); :class:`_Damaged` if it is not JSON."""
    if b'"attachments/' not in line:
        if line.strip(_BLANK) and not _is_json(line):
            raise _Damaged
        return
    try:
        rec = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise _Damaged from None  # it may have held references: its session's scan is incomplete
    if not isinstance(rec, dict):
        return
    if origin == "checkpoint":
        rec = rec.get("message") if isinstance(rec.get("message"), dict) else {}
    messages = rec.get("messages") if origin == "revision" else [rec]
    for msg in messages if isinstance(messages, list) else ():
        if not isinstance(msg, dict):
            continue
        mid = msg.get("id") if isinstance(msg.get("id"), str) else None
        for sha in quoted_refs(orjson.dumps(msg) if origin == "revision" else line):
            yield sha, sid, mid, origin


_BLANK = b" \t\r\n\x00"
"""A line of only these holds nothing (a crash's zero fill is a write never acknowledged)."""


class _Damaged(Exception):
    """A line (or checkpoint) that is not JSON: what it referenced is unknown."""


def _is_json(line: bytes) -> bool:
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return True


def scan_references(sessions_dir: str | os.PathLike[str], since: Scan | None = None) -> Scan:
    """Every ``"attachments/<sha>"`` a transcript, revision file or in-flight checkpoint holds, per message.

    With ``since``: only what each file grew by since that scan (a file replaced or shrunk is read whole).
    Reads line by line in bounded chunks (``bounded_lines``, as every reader of these files), never a whole
    file or a whole line over ``MAX_LINE_BYTES`` at once. A session whose file could not be read whole (an
    over-long or damaged line, an unreadable file; the doctor reports them) is in ``incomplete``: its
    references are not all known, so the GC keeps every blob it might reference (:func:`collect`).
    """
    out = Scan()
    directory = Path(sessions_dir)
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return out
    for name in names:
        kind = _classify(name)
        if kind is None:
            continue
        sid, origin = kind
        try:
            fd = open_nofollow(directory / name, os.O_RDONLY)
        except FileNotFoundError:
            continue  # gone since the listing (a checkpoint cleared, a session deleted)
        except OSError:
            out.incomplete.add(sid)
            continue
        try:
            st = os.fstat(fd)
            start = 0
            prev = since.ends.get(name) if since is not None else None
            if prev is not None and prev[:2] == (st.st_dev, st.st_ino) and prev[2] <= st.st_size:
                start = prev[2]
            end = start
            if origin == "checkpoint":  # one JSON object, replaced whole
                if st.st_size > MAX_PUT_BYTES * 4:
                    out.incomplete.add(sid)
                else:
                    _add_refs(out, os.read(fd, st.st_size + 1), sid, origin)
                end = 0
            else:
                for _, after, line, _ in bounded_lines(fd, start, st.st_size, limit=MAX_LINE_BYTES, chunk=_CHUNK):
                    if line is None:
                        break  # a torn tail: read again once it is whole
                    if line:
                        _add_refs(out, line, sid, origin)
                    else:  # over the limit: skipped unread, it may have held references
                        out.incomplete.add(sid)
                    end = after
            out.ends[name] = (st.st_dev, st.st_ino, end)
        except OSError:
            out.incomplete.add(sid)
            continue
        finally:
            os.close(fd)
    return out


def _add_refs(out: Scan, line: bytes, sid: str, origin: str) -> None:
    try:
        out.refs.update(_line_refs(line, sid, origin))
    except _Damaged:
        out.incomplete.add(sid)


def queue_references(conn: sqlite3.Connection) -> set[Ref]:
    """References held by queued turns' ``attachments_json`` (seed 003 §4.6b)."""
    return {(sha, sid, eid, "queue") for eid, sid, blob in conn.execute(
        "SELECT id, session_id, attachments_json FROM turn_queue WHERE attachments_json LIKE '%attachments/%'")
        for sha in quoted_refs(blob.encode())}


def sync_derived_refs(conn: sqlite3.Connection, found: set[Ref], now_ms: int, *, full: bool,
                      incomplete: Iterable[str] = ()) -> int:
    """Record the derived references of blobs this host knows (a reference to an already evicted blob is
    recorded marked); with ``full``, derived references no longer found (and not marked) are dropped,
    except those of the ``incomplete`` sessions (their scan could not read them whole: :class:`Scan`)."""
    sessions = {r[0] for r in conn.execute("SELECT id FROM sessions")}
    states = dict(conn.execute("SELECT sha256, deletion_state FROM attachment_blobs").fetchall())
    keep = {r for r in found if r[1] in sessions and r[0] in states}
    unread = set(incomplete)
    if full:
        for sha, sid, mid, origin in conn.execute(
                "SELECT sha256, session_id, message_id, origin FROM attachment_refs "
                "WHERE origin != 'client' AND evicted_at IS NULL").fetchall():
            if (sha, sid, mid, origin) not in keep and sid not in unread:
                conn.execute("DELETE FROM attachment_refs WHERE sha256 = ? AND session_id = ? AND message_id IS ? "
                             "AND origin = ?", (sha, sid, mid, origin))
    added = 0
    for sha, sid, mid, origin in sorted(keep, key=lambda r: (r[0], r[1], r[2] or "", r[3])):
        evicted_at = None if states[sha] == "live" else now_ms
        added += conn.execute(
            "INSERT INTO attachment_refs(sha256, session_id, message_id, origin, evicted_at) "
            "SELECT ?, ?, ?, ?, ? WHERE NOT EXISTS (SELECT 1 FROM attachment_refs "
            "WHERE sha256 = ? AND session_id = ? AND message_id IS ?)",
            (sha, sid, mid, origin, evicted_at, sha, sid, mid)).rowcount
    return added


def record_block_refs(conn: sqlite3.Connection, session_id: str, message_id: str, record: Mapping[str, Any],
                        now_ms: int) -> int:
    """A message indexed with attachment blocks: each block's 'transcript' reference is recorded at once (seed
    000 §2.3), so ``attachments.get`` lists it and the active-thread protection and the sweep see it before
    the next GC scan; one to an already evicted blob is recorded marked, so a window read
    (:func:`evicted_marks`, recorded references only) marks those blocks as every other read does. The row
    is the one the scan derives (:func:`sync_derived_refs`): a full scan that no longer finds it (the message
    rewritten or truncated away) drops it like its own. A blob this host does not know gets none; a message
    already referencing the blob (any origin) gets no second row. Cheap when the message holds no attachment
    block (the append path calls it for every message)."""
    blocks = record.get("blocks")
    if not isinstance(blocks, list):
        return 0
    shas = {m.group(1) for b in blocks if isinstance(b, Mapping) and b.get("type") == "attachment"
            and isinstance(b.get("ref"), str) and (m := _REF_TEXT_RE.fullmatch(b["ref"])) is not None}
    added = 0
    for sha in sorted(shas):
        added += conn.execute(
            "INSERT INTO attachment_refs(sha256, session_id, message_id, origin, evicted_at) "
            "SELECT ?, ?, ?, 'transcript', CASE WHEN b.deletion_state = 'live' THEN NULL ELSE ? END "
            "FROM attachment_blobs b WHERE b.sha256 = ? AND NOT EXISTS (SELECT 1 FROM attachment_refs "
            "WHERE sha256 = ? AND session_id = ? AND message_id IS ?)",
            (sha, session_id, message_id, now_ms, sha, sha, session_id, message_id)).rowcount
    return added


_REF_TEXT_RE = re.compile(r"attachments/([0-9a-f]{64})")


# -- the read projection -------------------------------------------------------


def evicted_marks(conn: sqlite3.Connection, sid: str, first_seq: int, last_seq: int) -> dict[int, frozenset[str]]:
    """seq → the evicted refs (``attachments/<sha>``) of the session's messages in ``first_seq..last_seq``.
    A blob whose file is gone though no GC marked it yet has no mark here: :class:`LostBlobs` finds it in the
    window's bytes."""
    out: dict[int, set[str]] = {}
    for seq, sha in conn.execute(
            # a line whose id another session held is indexed as {sessionId}:{id} (D444): either spelling
            "SELECT m.seq, r.sha256 FROM attachment_refs r JOIN messages m "
            "ON m.session_id = r.session_id AND m.id IN (r.message_id, r.session_id || ':' || r.message_id) "
            "WHERE r.session_id = ? AND r.evicted_at IS NOT NULL AND m.seq BETWEEN ? AND ?",
            (sid, first_seq, last_seq)):
        out.setdefault(int(seq), set()).add(ref_for(sha))
    return {seq: frozenset(refs) for seq, refs in out.items()}


REF_MARKER = b'"attachments/'
"""What every line holding a blob reference contains (a cheap test before :func:`quoted_refs`)."""


class PresentBlobs:
    """The blobs a connection's earlier reads found in ``attachments/``, kept while the folder is unchanged:
    its ``(device, inode, mtime, ctime)`` are the same (deleting, adding or renaming a file in it changes its
    mtime and ctime; ctime cannot be set back by hand) and were already :data:`SETTLE_NS` old when the names
    were checked (a change within the same timestamp tick as an earlier one would not show). Only presence is
    kept: a blob found missing is checked again by every read. ``ReaderConnection.blobs_memo``."""

    def __init__(self) -> None:
        self.stamp: tuple[int, int, int, int] | None = None
        self.names: set[str] = set()
        self.base: str | None = None
        """The folder (beside the connection's database, which never moves: asked once)."""


SETTLE_NS = 2_000_000_000
"""How old the folder's last change must be before what a read found in it is kept for later reads."""
_LIST_OVER = 64
"""More names than this to check at once (``attachments.estimate``): one listing of the folder, not a
``lstat`` each."""


class LostBlobs:
    """For one read: which blobs, of those it asks about, have a ``live`` row but no file (deleted by hand or
    lost; the next GC marks them, :func:`missing_bytes`). Each distinct blob is checked once per read (one
    ``lstat``; one folder listing for more than :data:`_LIST_OVER` at once), none when ``memo``
    (:class:`PresentBlobs`, the read connection's) already saw it in an unchanged folder: then a read costs one
    ``stat`` of the folder. The row is read only for a blob whose file is missing. A block referring to one
    reads ``"evicted": true``, as a block of an evicted blob does."""

    def __init__(self, conn: sqlite3.Connection, memo: PresentBlobs | None = None) -> None:
        self._conn = conn
        self._memo = memo
        self._known: dict[str, bool] = {}
        """sha → lost (this read's answers)."""
        self._base: str | None = None
        self._seen: set[str] | None = None
        """The names known present: the memo's when the folder is unchanged and settled, else this read's."""
        self._possible: bool | None = None

    def possible(self) -> bool:
        """Whether this read can find a lost blob at all. A lost blob is a ``live`` row without its file, so with
        no live row (no attachment ever stored, or every one evicted) there is none, and a caller about to look
        for references in many bytes may skip that scan (~3 GB/s: 20 us for a newest-50 page of 66 KB, 20 ms
        for a 60 MB whole history). One statement (~4.4 us), asked once per read; a scan of a few KiB costs
        less, so callers ask only before a larger one (``window_reply.LOST_SCAN_ASK``)."""
        if self._possible is None:
            self._possible = bool(self._conn.execute(
                "SELECT EXISTS (SELECT 1 FROM attachment_blobs WHERE deletion_state = 'live')").fetchone()[0])
        return self._possible

    def __call__(self, shas: Iterable[str]) -> set[str]:
        wanted = set(shas)
        new = [sha for sha in wanted if sha not in self._known]
        if new:
            missing = self._missing(new)
            for sha in new:
                self._known[sha] = False
            if missing:
                for sha in _live(self._conn, missing):
                    self._known[sha] = True
        return {sha for sha in wanted if self._known[sha]}

    def _missing(self, shas: list[str]) -> list[str]:
        if self._seen is None:
            memo = self._memo
            if memo is not None and memo.base is not None:
                self._base = memo.base
            else:
                folder = database_folder(self._conn)
                if folder is None:  # a database in memory: no blob folder to check
                    return []
                self._base = os.path.join(folder, ATTACHMENTS_DIR)
                if memo is not None:
                    memo.base = self._base
            self._seen = self._start(self._base)
        seen, base = self._seen, self._base
        assert base is not None
        todo = [sha for sha in shas if sha not in seen]
        if len(todo) > _LIST_OVER:
            try:
                names = set(os.listdir(base))
            except FileNotFoundError:
                names = set()
            seen.update(sha for sha in todo if sha in names)
        else:
            seen.update(sha for sha in todo if os.path.lexists(os.path.join(base, sha)))
        return [sha for sha in todo if sha not in seen]

    def _start(self, base: str) -> set[str]:
        memo = self._memo
        try:
            st = os.stat(base)
        except FileNotFoundError:
            if memo is not None:
                memo.stamp, memo.names = None, set()
            return set()
        stamp = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        settled = time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) >= SETTLE_NS
        if memo is None or not settled:
            if memo is not None:
                memo.stamp, memo.names = None, set()
            return set()
        if memo.stamp != stamp:
            memo.stamp, memo.names = stamp, set()
        return memo.names


def reader_memo(conn: sqlite3.Connection) -> PresentBlobs | None:
    """``conn``'s :class:`PresentBlobs` when it is a pooled reader (``store.indexing.database.ReaderConnection``,
    which imports this module: read by name), else None."""
    memo = getattr(conn, "blobs_memo", None)
    return memo if isinstance(memo, PresentBlobs) else None


def _live(conn: sqlite3.Connection, shas: Iterable[str]) -> set[str]:
    ordered = sorted(shas)
    out: set[str] = set()
    for start in range(0, len(ordered), 500):
        chunk = ordered[start:start + 500]
        out.update(r[0] for r in conn.execute(
            f"SELECT sha256 FROM attachment_blobs WHERE deletion_state = 'live' "
            f"AND sha256 IN ({','.join('?' * len(chunk))})", chunk))
    return out


def mark_evicted(value: Any, refs: frozenset[str], _depth: int = 0) -> Any:
    """Mark (in place) every object whose ``ref`` is one of ``refs``: ``"evicted": true``."""
    if _depth > 64:
        return value
    if isinstance(value, dict):
        if value.get("ref") in refs:
            value["evicted"] = True
        for item in value.values():
            if isinstance(item, (dict, list)):
                mark_evicted(item, refs, _depth + 1)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, (dict, list)):
                mark_evicted(item, refs, _depth + 1)
    return value


def _refs_in(value: Any, out: set[str], depth: int = 0) -> None:
    if depth > 64:
        return
    if isinstance(value, dict):
        ref = value.get("ref")
        if isinstance(ref, str) and ref.startswith(REF_PREFIX) and _SHA_RE.fullmatch(ref[len(REF_PREFIX):]):
            out.add(ref[len(REF_PREFIX):])
        items: Iterable[Any] = value.values()
    elif isinstance(value, list):
        items = value
    else:
        return
    for item in items:
        if isinstance(item, (dict, list)):
            _refs_in(item, out, depth + 1)


def blob_refs(value: Any) -> set[str]:
    """The blobs (sha256) every ``ref: "attachments/<sha256>"`` inside ``value`` names."""
    out: set[str] = set()
    _refs_in(value, out)
    return out


def mark_evicted_blocks(conn: sqlite3.Connection, value: T) -> T:
    """Mark (in place) every block of ``value`` whose blob is evicted, being evicted, or whose bytes are gone
    though its row is ``live`` (deleted by hand or lost, not yet marked by a GC: :func:`lost_blobs`, one
    ``lstat`` per distinct live blob): ``"evicted": true``.

    For reads that are not transcript windows (``session.context``, the turn
    queue): a blob leaves ``live`` in the transaction that marks its references
    (step 1 of :func:`collect`) and comes back only with its bytes (a re-put
    clears the marks), so its deletion state says what those marks say.
    """
    shas: set[str] = set()
    _refs_in(value, shas)
    if not shas:
        return value
    gone: set[str] = set()
    live: set[str] = set()
    ordered = sorted(shas)
    for start in range(0, len(ordered), 500):
        chunk = ordered[start:start + 500]
        for sha, state in conn.execute(
                f"SELECT sha256, deletion_state FROM attachment_blobs "
                f"WHERE sha256 IN ({','.join('?' * len(chunk))})", chunk):
            (live if state == "live" else gone).add(sha)
    gone |= lost_blobs(conn, live)
    if gone:
        mark_evicted(value, frozenset(ref_for(sha) for sha in gone))
    return value


class WriteTx(Protocol):
    """Runs ``fn(conn)`` in one committed write transaction and returns its value."""

    def __call__(self, fn: Callable[[sqlite3.Connection], T], /) -> T: ...


PENDING_GC_NS = "pi-host/attachments.gc"
"""kv namespace of the GC answers recorded in step 1 (``/`` keeps it out of every ``settings.*`` call)."""


def _pending_key(key: ReceiptKey) -> str:
    return orjson.dumps([key.client_id, key.submission_id]).decode()


def pending_gc(conn: sqlite3.Connection, key: ReceiptKey) -> dict[str, Any] | None:
    """The answer a GC with this receipt key recorded when it marked its victims (its retry's answer);
    IDEMPOTENCY_CONFLICT when the key was used for a different request."""
    row = conn.execute("SELECT value_json FROM kv WHERE ns = ? AND key = ?",
                       (PENDING_GC_NS, _pending_key(key))).fetchone()
    if row is None:
        return None
    rec = orjson.loads(row[0])
    if rec.get("fingerprint") != key.fingerprint or rec.get("method") != key.method:
        raise conflict(key, str(rec.get("method")))
    answer: dict[str, Any] = rec["answer"]
    return answer


def _record_pending_gc(conn: sqlite3.Connection, key: ReceiptKey, answer: Mapping[str, Any], now_ms: int) -> None:
    value = {"method": key.method, "fingerprint": key.fingerprint, "answer": dict(answer)}
    conn.execute("INSERT OR REPLACE INTO kv(ns, key, value_json, updated_at) VALUES (?, ?, ?, ?)",
                 (PENDING_GC_NS, _pending_key(key), orjson.dumps(value).decode(), now_ms))


def _drop_pending_gc(conn: sqlite3.Connection, key: ReceiptKey) -> None:
    conn.execute("DELETE FROM kv WHERE ns = ? AND key = ?", (PENDING_GC_NS, _pending_key(key)))


@dataclass(frozen=True, slots=True)
class _Marked:
    """What step 1 decided: the answer, the blobs whose bytes go (this GC's and earlier ones') and orphans."""

    answer: dict[str, Any]
    marked: list[str]
    orphans: list[str]
    held: list[str] = field(default_factory=list)
    """Files without a row that a session file or queued turn refers to: not orphans (seed 003 §8), adopted."""


def _spare(conn: sqlite3.Connection, shas: Iterable[str]) -> dict[str, int]:
    """Take blobs marked in step 1 back (their bytes are still there): live again, their references'
    marks cleared, as a re-put would. sha → size of each blob taken back."""
    out: dict[str, int] = {}
    for sha in shas:
        row = conn.execute("SELECT size_bytes FROM attachment_blobs WHERE sha256 = ? AND deletion_state = 'evicting'",
                           (sha,)).fetchone()
        if row is None:
            continue
        conn.execute("UPDATE attachment_blobs SET marked_for_eviction = 0, deletion_state = 'live', evicted_at = NULL "
                     "WHERE sha256 = ?", (sha,))
        conn.execute("UPDATE attachment_refs SET evicted_at = NULL WHERE sha256 = ?", (sha,))
        out[sha] = int(row[0])
    return out


def _without(conn: sqlite3.Connection, answer: Mapping[str, Any], spared: Mapping[str, int]) -> dict[str, Any]:
    """A GC's answer without the blobs it took back (:func:`_spare`)."""
    out = dict(answer)
    swept = list(answer.get("unreferencedEvicted", []))
    gone = [sha for sha in [*answer["evicted"], *swept] if sha in spared]
    out["evicted"] = [sha for sha in answer["evicted"] if sha not in spared]
    out["unreferencedEvicted"] = [sha for sha in swept if sha not in spared]
    out["freedBytes"] = int(answer["freedBytes"]) - sum(spared[sha] for sha in gone)
    out["estimate"] = estimate(conn, int(answer["estimate"]["budgetBytes"])).to_wire()
    return out


def file_sha256(path: str | os.PathLike[str], *, follow_symlinks: bool = True) -> str:
    """The SHA-256 of a file's bytes, read a part at a time (``OSError`` when it cannot be read)."""
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY) if follow_symlinks else open_nofollow(path, os.O_RDONLY)
    try:
        while chunk := os.read(fd, _CHUNK):
            digest.update(chunk)
    finally:
        os.close(fd)
    return digest.hexdigest()


def _hashes_to(path: Path, sha: str) -> bool:
    """Whether the file's bytes (not a symlink's target) hash to ``sha``; False if it cannot be read."""
    try:
        return file_sha256(path, follow_symlinks=False) == sha
    except OSError:
        return False


def _adopt_held(conn: sqlite3.Connection, files: AttachmentFiles, shas: Iterable[str], now_ms: int,
                refs: set[Ref]) -> int:
    """Rows for blob files the session files refer to that have none, or only a tombstone (their bytes came
    back): live, as a re-put makes them (:func:`record_blob`: an evicted one's marks cleared), with the
    metadata their ``.meta`` file kept, last used now; their references recorded. The number adopted."""
    adopted: set[str] = set()
    for sha in shas:
        state = conn.execute("SELECT deletion_state FROM attachment_blobs WHERE sha256 = ?", (sha,)).fetchone()
        if state is not None and state[0] != "evicted":
            continue
        try:
            size = os.stat(files.path(sha), follow_symlinks=False).st_size
        except OSError:
            continue
        kept = read_meta_file(files.meta_path(sha)) or {}
        meta = kept.get("meta")
        mime = kept.get("mimeType")
        record_blob(conn, sha, size, mime if isinstance(mime, str) else None, now_ms, BlobMeta(
            **{k: v for k, v in (("kind", kept.get("kind")), ("trust", kept.get("trust")),
                                 ("provenance", kept.get("provenance")), ("source", kept.get("source")),
                                 ("run_id", kept.get("runId"))) if isinstance(v, str)},
            meta=meta if isinstance(meta, dict) else None))
        adopted.add(sha)
    if adopted:
        sync_derived_refs(conn, {r for r in refs | queue_references(conn) if r[0] in adopted}, now_ms, full=False)
    return len(adopted)


def collect(files: AttachmentFiles, write: WriteTx, *, budget: int | None,
            active_session_id: str | None,
            finalize: Callable[[sqlite3.Connection, dict[str, object]], object] | None = None,
            sessions_dir: str | os.PathLike[str] | None = None, now_ms: int = 0,
            receipt: ReceiptKey | None = None, grace: int | None = None) -> object:
    """Unreferenced sweep + budget eviction + repair, in the durable order described in the module doc.

    ``write(fn)`` runs ``fn(conn)`` in one committed transaction (the DB writer
    in the host, a plain ``with conn:`` in tests). Callers serialize it with
    every other attachment writer. ``sessions_dir``: where the session files
    are scanned for references (none: only recorded references count).
    ``finalize(conn, result)`` runs in the last transaction (e.g. to store a
    command receipt) and its value is returned. ``receipt``: the command's
    receipt key; its answer is recorded with the marks, so a retry after a
    crash finishes this GC (nothing new planned) and answers the same. ``grace``: how long an
    unreferenced blob stays after its last use (none: the app setting); the sweep needs ``sessions_dir``
    (without a scan no blob is known to be unreferenced).
    """
    faults = files.faults
    present = set(files.blob_names())
    scan = scan_references(sessions_dir) if sessions_dir is not None else None
    unread_active = scan is not None and active_session_id in scan.incomplete

    def step1(conn: sqlite3.Connection) -> _Marked:
        spared: dict[str, int] = {}
        found: set[Ref] = set()
        if scan is not None:
            found = scan.refs | queue_references(conn)
            sync_derived_refs(conn, found, now_ms, full=True, incomplete=scan.incomplete)
            # marks an earlier GC left (cut short before its bytes went): the active session's stay
            spared = _spare(conn, sorted({r[0] for r in found if r[1] == active_session_id} & present))
        limit = budget if budget is not None else budget_bytes(conn)
        lost = missing_bytes(conn, present)
        mark_for_eviction(conn, lost, now_ms)
        answer = pending_gc(conn, receipt) if receipt is not None else None
        if answer is not None and spared.keys() & {*answer["evicted"], *answer.get("unreferencedEvicted", ())}:
            answer = _without(conn, answer, spared)
            if receipt is not None:
                _record_pending_gc(conn, receipt, answer, now_ms)
        rowless = present - known_blobs(conn)
        # a file without a row that a session file or queued turn names is no orphan (seed 003 §8: the sweep
        # takes only hashes nothing references); unknown while a session's files were read incompletely
        held = sorted(rowless & {r[0] for r in found})
        orphans = [] if scan is not None and scan.incomplete else sorted(rowless - set(held))
        if answer is None:  # a first attempt (a retry only finishes what its first attempt marked)
            sizes = {sha: int(size) for sha, size in conn.execute(
                "SELECT sha256, size_bytes FROM attachment_blobs WHERE deletion_state = 'live'")}
            swept: list[str] = []
            # nothing references them any more: gone whatever the budget. Not when a session's files could
            # not be read whole: it may reference any blob (the next GC that reads them whole sweeps)
            if scan is not None and not scan.incomplete:
                swept = plan_unreferenced(conn, found, now_ms, grace if grace is not None else grace_ms(conn))
                mark_for_eviction(conn, swept, now_ms)
            victims: list[str] = []
            if not unread_active:  # the active session's blobs are never evicted: unknown, none is
                victims = plan_eviction(conn, limit, active_session_id)
                mark_for_eviction(conn, victims, now_ms)
            answer = {"evicted": victims, "unreferencedEvicted": swept,
                      "freedBytes": sum(sizes[s] for s in [*swept, *victims]),
                      "orphansRemoved": len(orphans), "estimate": estimate(conn, limit).to_wire()}
            if scan is not None and scan.incomplete:
                answer["scanIncomplete"] = sorted(scan.incomplete)
            if receipt is not None:
                _record_pending_gc(conn, receipt, answer, now_ms)
        return _Marked(answer, pending_evictions(conn), orphans, held)

    step = write(step1)
    faults.point("attachments.gc.after_mark")
    if scan is not None and step.marked:
        late = scan_references(sessions_dir, since=scan) if sessions_dir is not None else Scan()
        active_late = {r[0] for r in late.refs if r[1] == active_session_id}
        if active_session_id in late.incomplete:  # what the active session came to reference is unknown
            active_late |= set(step.answer["evicted"])

        def step1b(conn: sqlite3.Connection) -> _Marked:
            late_refs = late.refs | queue_references(conn)
            sync_derived_refs(conn, late_refs, now_ms, full=False)
            # a blob swept as unreferenced that something came to reference meanwhile (any session) stays too
            swept = set(step.answer.get("unreferencedEvicted", ()))
            held = swept if late.incomplete else {r[0] for r in late_refs} & swept  # unknown: any of them
            spared = sorted((active_late & set(step.marked)) | held)
            if not spared and not late.incomplete:
                return step
            # an append into the active session that landed after the scan, before the marks: its blobs stay
            answer = _without(conn, step.answer, _spare(conn, spared))
            if late.incomplete:
                answer["scanIncomplete"] = sorted({*answer.get("scanIncomplete", ()), *late.incomplete})
            if receipt is not None:
                _record_pending_gc(conn, receipt, answer, now_ms)
            return _Marked(answer, pending_evictions(conn), step.orphans, step.held)

        step = write(step1b)
    for sha in [*step.marked, *step.orphans]:
        files.delete(sha)
        faults.point("attachments.gc.after_unlink")
    for sha in files.meta_names():  # a metadata file whose blob is gone (a delete cut short between the two)
        if not files.exists(sha):
            remove_file_durable(files.meta_path(sha))
    result: dict[str, object] = dict(step.answer)
    # the held files whose bytes are their name's are adopted (hashed here, outside any transaction)
    adopt = [sha for sha in step.held if _hashes_to(files.path(sha), sha)]

    def step3(conn: sqlite3.Connection) -> object:
        result["finished"] = finish_eviction(conn, step.marked, now_ms)
        if adopt and _adopt_held(conn, files, adopt, now_ms, (scan.refs if scan is not None else set())):
            result["estimate"] = estimate(conn, budget if budget is not None else budget_bytes(conn)).to_wire()
        if receipt is not None:
            _drop_pending_gc(conn, receipt)
        return finalize(conn, result) if finalize is not None else result

    return write(step3)
