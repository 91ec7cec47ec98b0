"""Command receipts (seed 000 §2.4): keys, fingerprints, rows, and receipts carried in files.

A receipt is keyed by ``(clientId, submissionId)`` and stores the terminal
response of one mutating request plus a SHA-256 fingerprint of the request
(method + params, without the submission id or any transport identity). A
completed receipt is never overwritten.

A receipt is as durable as its effect and never later (ARCHITECTURE.md
"Receipts ride with their effect"):

* an effect that is a database transaction stores the row in that
  transaction (:func:`store`);
* an effect that is a file carries the receipt in that file, as a
  :func:`file_record` — in an appended line's ``meta.receipt``, in the
  ``receipt`` of a (re)written transcript header, in the delete marker — and
  ``store.indexing.reconcile.restore_receipt`` rebuilds the row from it when the
  database lost it (boot, or an actor's catch-up), computing the response
  from the state the file left behind.

The database stores no large payloads (seed 003 §1.3): an answer whose JSON is
over :data:`FILE_BYTES` is written to ``receipts/<sha256>.json`` beside the
index (content-addressed, temp + fsync + rename + directory fsync) inside the
transaction that stores the row, so before it commits; the row holds a small
stand-in (:data:`FILE_KEY`: the file's SHA-256 and size). A retry reads the
file back, checks both, and answers its bytes; a file gone or damaged is
``CORRUPT_DATA``, never another answer. A file no row names (a rollback, a kill
before the commit) is removed at boot (:func:`sweep_files`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import sqlite3
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from store.errors import CorruptData, IdempotencyConflict, IOFailure, classify_os_error
from store.fsutil import atomic_write, database_folder, fsync_dir, is_temp_name, open_nofollow

__all__ = [
    "FILE_BYTES",
    "FILE_KEY",
    "RECEIPTS_DIR",
    "ReceiptKey",
    "check",
    "exists",
    "file_record",
    "file_ref",
    "fingerprint",
    "get",
    "key_of_record",
    "keys_of_session",
    "method_of",
    "read_file_answer",
    "receipts_dir",
    "referenced_files",
    "store",
    "stored_answer",
    "sweep_files",
]

FILE_BYTES: Final = 64 * 1024
"""An answer whose JSON is larger than this is kept in a file under :data:`RECEIPTS_DIR`, not in its row."""
RECEIPTS_DIR: Final = "receipts"
"""The folder of the data directory (beside the index file) that holds the answers kept in files."""
FILE_KEY: Final = "$receiptFile"
"""The stand-in a row holds for an answer kept in a file: ``{"$receiptFile": {"sha256": hex, "bytes": n}}``
(no answer of the protocol is an object with this one member)."""
_STAND_IN_PREFIX: Final = '{"' + FILE_KEY + '"'
_FILE_NAME = re.compile(r"([0-9a-f]{64})\.json\Z")
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")


@dataclass(frozen=True, slots=True)
class ReceiptKey:
    """Command receipt identity + request fingerprint.

    ``legacy_fingerprint``: the fingerprint an earlier build stored for the same request, where it
    differs from today's (``secrets.set``: before its keyed MAC without the value, builds fingerprinted
    the request with a MAC of the value in its place); a retry of a request that build answered must
    still find its receipt after an in-place upgrade. Only matched, never stored."""

    client_id: str
    submission_id: str
    method: str
    fingerprint: str
    legacy_fingerprint: str | None = field(default=None, compare=False)


def fingerprint(method: str, params: Mapping[str, Any]) -> str:
    """SHA-256 of method + params without transport identity or the submission id."""
    clean = {k: v for k, v in params.items() if k not in ("submissionId", "submission_id")}
    try:
        body = orjson.dumps([method, clean], option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        # integers beyond 64 bits: the strict decoder refuses them, but stay total here
        body = json.dumps([method, clean], sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return hashlib.sha256(body).hexdigest()


def _row(conn: sqlite3.Connection, client_id: str, submission_id: str) -> tuple[Any, ...] | None:
    row: tuple[Any, ...] | None = conn.execute(
        "SELECT method, status, response_json, fingerprint FROM command_receipts "
        "WHERE client_id = ? AND submission_id = ?",
        (client_id, submission_id),
    ).fetchone()
    return row


def _found(conn: sqlite3.Connection, client_id: str, submission_id: str, row: tuple[Any, ...]) -> dict[str, Any]:
    return {
        "method": row[0],
        "status": row[1],
        "response": stored_answer(conn, row[2], what=f"{client_id}/{submission_id}"),
        "fingerprint": row[3],
    }


def get(conn: sqlite3.Connection, client_id: str, submission_id: str) -> dict[str, Any] | None:
    """The stored receipt with its answer (read back from its file when the row holds a stand-in)."""
    row = _row(conn, client_id, submission_id)
    return None if row is None else _found(conn, client_id, submission_id, row)


def exists(conn: sqlite3.Connection, client_id: str, submission_id: str) -> bool:
    """Whether a receipt is stored under the key (its answer not read: a file it names is not opened)."""
    return conn.execute("SELECT 1 FROM command_receipts WHERE client_id = ? AND submission_id = ?",
                        (client_id, submission_id)).fetchone() is not None


def method_of(conn: sqlite3.Connection, client_id: str, submission_id: str) -> str | None:
    """The method of the receipt stored under the key (``None``: none), its answer not read."""
    row = conn.execute("SELECT method FROM command_receipts WHERE client_id = ? AND submission_id = ?",
                       (client_id, submission_id)).fetchone()
    return None if row is None else str(row[0])


def session_of(conn: sqlite3.Connection, client_id: str, submission_id: str) -> str | None:
    """The session a stored receipt was recorded for (``None``: no such receipt, or none named)."""
    row = conn.execute("SELECT session_id FROM command_receipts WHERE client_id = ? AND submission_id = ?",
                       (client_id, submission_id)).fetchone()
    return str(row[0]) if row is not None and row[0] is not None else None


def keys_of_session(conn: sqlite3.Connection, session_id: str) -> set[tuple[str, str]]:
    """``(clientId, submissionId)`` of every receipt recorded for the session (a full scan: no index on
    ``session_id``; only a session whose storage failed asks, around a catch-up)."""
    return {(str(c), str(s)) for c, s in conn.execute(
        "SELECT client_id, submission_id FROM command_receipts WHERE session_id = ?", (session_id,))}


def conflict(key: ReceiptKey, stored_method: str) -> IdempotencyConflict:
    return IdempotencyConflict(
        f"submissionId {key.submission_id} was already used for a different request",
        data={"submissionId": key.submission_id, "method": stored_method},
    )


def check(conn: sqlite3.Connection, key: ReceiptKey) -> dict[str, Any] | None:
    """The stored row for a matching retry; raise IDEMPOTENCY_CONFLICT for a different request; else None."""
    row = _row(conn, key.client_id, key.submission_id)
    if row is None:
        return None
    if row[3] not in (key.fingerprint, key.legacy_fingerprint) or row[0] != key.method:
        raise conflict(key, str(row[0]))  # a different request: its answer (maybe a file) is not read
    return _found(conn, key.client_id, key.submission_id, row)


def landed(conn: sqlite3.Connection, key: ReceiptKey | None, effect: Callable[[sqlite3.Connection], bool]) -> bool:
    """After a commit raised (an error once it may have taken place): whether its transaction took place
    all the same. With a receipt, its row says (it rides in the effect's transaction); else ``effect(conn)``,
    a read of the effect's own rows."""
    if key is not None:
        return check(conn, key) is not None
    return effect(conn)


def store(
    conn: sqlite3.Connection,
    key: ReceiptKey,
    response: Any,
    *,
    session_id: str | None,
    now_ms: int,
    status: str = "completed",
) -> None:
    """Insert a completed receipt in the caller's transaction; an existing one is never overwritten.

    An answer over :data:`FILE_BYTES` of JSON is written to its file first (durably, before the caller's
    transaction commits) and the row holds its stand-in; in a database with no file (in memory) it stays
    in the row."""
    body = orjson.dumps(response)
    if len(body) > FILE_BYTES:
        directory = receipts_dir(conn)
        if directory is not None:
            if exists(conn, key.client_id, key.submission_id):
                return  # never overwritten: no file for a row that is not written
            body = orjson.dumps(_write_file(directory, body))
    conn.execute(
        "INSERT OR IGNORE INTO command_receipts(client_id, submission_id, method, status, response_json, "
        "fingerprint, session_id, created_at) VALUES (?,?,?,?,?,?,?,?)",
        (key.client_id, key.submission_id, key.method, status, body.decode(), key.fingerprint,
         session_id, now_ms),
    )


# ---------------------------------------------------------------------------
# answers kept in files


def receipts_dir(conn: sqlite3.Connection) -> Path | None:
    """``<data dir>/receipts``, beside the index file (``None``: a database in memory)."""
    folder = database_folder(conn)
    return None if folder is None else Path(folder) / RECEIPTS_DIR


def _ensure_dir(directory: Path) -> None:
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        st = os.lstat(directory)
        if not stat.S_ISDIR(st.st_mode):
            raise IOFailure(f"{directory} is not a folder: answers of command receipts cannot be kept there",
                            data={"path": str(directory)}) from None
        return
    except OSError as exc:
        raise classify_os_error(exc, f"create {directory}") from exc
    try:
        fsync_dir(directory.parent)
    except OSError as exc:
        raise classify_os_error(exc, f"fsync {directory.parent}") from exc


def _write_file(directory: Path, body: bytes) -> dict[str, Any]:
    """Write ``body`` to ``<directory>/<sha256>.json`` durably; its stand-in."""
    digest = hashlib.sha256(body).hexdigest()
    _ensure_dir(directory)
    atomic_write(directory / f"{digest}.json", body)
    return {FILE_KEY: {"sha256": digest, "bytes": len(body)}}


def file_ref(value: Any) -> tuple[str, int] | None:
    """``(sha256, bytes)`` when ``value`` is a stand-in for an answer kept in a file; ``None`` when it is an
    answer. A stand-in that is not well formed is :class:`~store.errors.CorruptData`."""
    if not isinstance(value, dict) or len(value) != 1 or FILE_KEY not in value:
        return None
    ref = value[FILE_KEY]
    if (isinstance(ref, dict) and isinstance(ref.get("sha256"), str) and _SHA256.match(ref["sha256"])
            and type(ref.get("bytes")) is int and ref["bytes"] > FILE_BYTES):
        return ref["sha256"], ref["bytes"]
    raise CorruptData("a command receipt's stand-in for its answer file is damaged", data={"reason": "receiptFile"})


def read_file_answer(directory: Path | None, sha256: str, size: int, *, what: str = "") -> bytes:
    """The bytes of the answer file ``<sha256>.json`` after checking its size and SHA-256:
    :class:`~store.errors.CorruptData` (``data.reason: "receiptFile"``) when it is missing or damaged."""
    name = f"{sha256}.json"
    data: dict[str, Any] = {"reason": "receiptFile", "file": f"{RECEIPTS_DIR}/{name}"}
    if what:
        data["receipt"] = what
    if directory is None:
        raise CorruptData(f"the answer of command receipt {what} is kept in a file, and this database has no "
                          "data directory", data=data)
    try:
        fd = open_nofollow(directory / name, os.O_RDONLY)
    except FileNotFoundError:
        raise CorruptData(f"the answer of command receipt {what} is kept in {RECEIPTS_DIR}/{name}, which is "
                          "missing", data=data) from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):
            raise CorruptData(f"{RECEIPTS_DIR}/{name} (the answer of command receipt {what}) is not a regular "
                              "file", data=data) from None
        raise classify_os_error(exc, f"read {directory / name}") from exc
    try:
        chunks: list[bytes] = []
        left = size + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise classify_os_error(exc, f"read {directory / name}") from exc
    finally:
        os.close(fd)
    body = b"".join(chunks)
    if len(body) != size or hashlib.sha256(body).hexdigest() != sha256:
        raise CorruptData(f"{RECEIPTS_DIR}/{name}, the answer of command receipt {what}, is damaged (its size or "
                          "SHA-256 is not the one its receipt recorded)", data=data)
    return body


def stored_answer(conn: sqlite3.Connection, response_json: str | bytes | None, *, what: str = "") -> Any:
    """A row's ``response_json`` as the answer: its file's, read back and checked, when it holds a stand-in."""
    if not response_json:
        return None
    value = orjson.loads(response_json)
    ref = file_ref(value)
    if ref is None:
        return value
    return orjson.loads(read_file_answer(receipts_dir(conn), *ref, what=what))


def referenced_files(conn: sqlite3.Connection) -> dict[str, tuple[int, list[tuple[str, str]]]]:
    """Every answer file a row names: ``sha256 -> (bytes, [(clientId, submissionId), ...])``."""
    out: dict[str, tuple[int, list[tuple[str, str]]]] = {}
    for client_id, submission_id, raw in conn.execute(
            "SELECT client_id, submission_id, response_json FROM command_receipts "
            "WHERE substr(response_json, 1, ?) = ?",
            (len(_STAND_IN_PREFIX), _STAND_IN_PREFIX)):
        try:
            ref = file_ref(orjson.loads(raw))
        except (orjson.JSONDecodeError, CorruptData):
            continue
        if ref is not None:
            out.setdefault(ref[0], (ref[1], []))[1].append((str(client_id), str(submission_id)))
    return out


def sweep_files(conn: sqlite3.Connection) -> int:
    """Remove the answer files no row names (a transaction rolled back, or killed before its commit, after its
    file was written) and stray temp files; how many went. Boot only: nothing writes meanwhile."""
    directory = receipts_dir(conn)
    if directory is None:
        return 0
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise classify_os_error(exc, f"list {directory}") from exc
    candidates = [n for n in names if _FILE_NAME.match(n) or is_temp_name(n)]
    if not candidates:
        return 0
    keep = referenced_files(conn)
    removed = 0
    for name in candidates:
        match = _FILE_NAME.match(name)
        if match is not None and match.group(1) in keep:
            continue
        try:
            os.unlink(directory / name)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise classify_os_error(exc, f"remove {directory / name}") from exc
        removed += 1
    if removed:
        fsync_dir(directory)
    return removed


# ---------------------------------------------------------------------------
# receipts carried in files


def file_record(key: ReceiptKey, **extra: Any) -> dict[str, Any]:
    """The receipt as written into a file (a header, a marker, a line's meta).

    ``extra`` holds what :func:`rebuild_response` needs beyond the state the
    file leaves behind (for a truncate: how many messages it removed).
    """
    rec: dict[str, Any] = {"clientId": key.client_id, "submissionId": key.submission_id,
                           "fingerprint": key.fingerprint, "method": key.method}
    if extra:
        rec["extra"] = extra
    return rec


def key_of_record(rec: Any, *, default_method: str | None = None) -> ReceiptKey | None:
    """Parse a receipt record found in a file (``None`` if it is not a well-formed one)."""
    if not isinstance(rec, Mapping):
        return None
    client_id, submission_id, fp = rec.get("clientId"), rec.get("submissionId"), rec.get("fingerprint")
    method = rec.get("method", default_method)
    if not all(isinstance(v, str) and v for v in (client_id, submission_id, fp, method)):
        return None
    return ReceiptKey(str(client_id), str(submission_id), str(method), str(fp))
