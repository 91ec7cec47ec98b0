"""Boot: rebuild ``secrets_meta`` bookkeeping from the ``secrets/*.sec`` files (seed 003 §4.12).

The encrypted files are the source of truth for *which* secrets exist; the
table is only an enumerable registry of them. Each file's cleartext header
names its ref (``store/config/secrets.py``: MAGIC | version | ref_len | ref | ..., every format),
and the file name must be ``sha256(ref).sec`` - a file whose header names
another ref (swapped or renamed) is skipped and counted, never trusted. No key
is needed and no value is read: this runs before anything is served.

Owner and kind are not stored in the files, so a rebuilt row gets the table
defaults (``provider`` / ``api_key``); ``updated_at`` is the time the write
that made the file answered, from the header's ``written_at`` (format 3: the
``updatedAt`` ``secrets.set`` answered and stored), so ``secrets.list`` shows
after the rebuild what it showed before the loss; a file of an earlier format
(or one without that time) gives its mtime instead. Like the ref, the time is
read from the cleartext header without the key (``secrets.get`` authenticates it).

A keyed ``secrets.delete`` leaves a trace (``<name>.sec.deleting-<mac>``, holding
its receipt record, never a value) until its receipt commits; a crash after
the commit leaves it behind, and :func:`sweep_delete_traces` removes it once
its receipt row is there (one without its row is kept: the retry needs it).

Two uses at boot:

* full rebuild - the index was rebuilt or ``secrets_meta`` is empty while
  ciphertext files exist: one row per valid file;
* repair (every other boot) - a crash between ``secrets.set``'s file write and
  its row leaves a file without a row (added); one between ``secrets.delete``'s
  unlink and its row delete leaves a row without a file (removed). Rows of
  another backend are never touched, and neither is a row whose ciphertext
  is still in the seed's own layout (``secrets/<sha256(ref)>``, no suffix: a
  data directory a seed-era pi-desktop wrote): this store cannot read that
  format, but the bytes are there, so the bookkeeping stays with them.

Pure file + SQL code on a connection the caller owns; no trio.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from store import receipts
from store.config.secrets import BACKEND, DELETING, MAGIC, MAGICS, MAX_REF_BYTES, RECEIPT_BYTES

__all__ = ["SecretFile", "rebuild_secrets_meta", "scan_secret_files", "sweep_delete_traces"]

_NAME_RE = re.compile(r"^([0-9a-f]{64})\.sec$")
_TRACE_RE = re.compile(r"^[0-9a-f]{64}\.sec" + re.escape(DELETING) + r"[0-9a-f]{64}$")
_MAX_TRACE = 1 << 16
_HEADER = struct.Struct(">IH")
_WRITTEN_AT = struct.Struct(">Q")  # format 3: after the receipt
_MAX_MS = 2**53 - 1  # a time the wire (and SQLite) can carry


@dataclass(frozen=True)
class SecretFile:
    ref: str
    version: int
    mtime_ms: int
    written_at: int = 0
    """When the write that made the file answered (format 3 header; 0: not recorded)."""

    @property
    def updated_at(self) -> int:
        """``secrets_meta.updated_at`` for the file: the time its write answered, else its mtime."""
        return self.written_at or self.mtime_ms


def _read_header(path: Path) -> tuple[int, str, int] | None:
    """``(version, ref, written_at)`` from a file's cleartext header (``written_at`` 0 unless a format-3
    header holds a usable time), or ``None`` if it is not one of ours."""
    fixed = len(MAGIC) + _HEADER.size
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        head = os.read(fd, fixed + MAX_REF_BYTES + RECEIPT_BYTES + _WRITTEN_AT.size)
    finally:
        os.close(fd)
    if len(head) < fixed or head[: len(MAGIC)] not in MAGICS:
        return None
    version, ref_len = _HEADER.unpack_from(head, len(MAGIC))
    raw = head[fixed : fixed + ref_len]
    if ref_len == 0 or ref_len > MAX_REF_BYTES or len(raw) != ref_len:
        return None
    try:
        ref = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    written_at = 0
    at = fixed + ref_len + RECEIPT_BYTES
    if head[: len(MAGIC)] == MAGIC and len(head) >= at + _WRITTEN_AT.size:
        (found,) = _WRITTEN_AT.unpack_from(head, at)
        written_at = found if 0 < found <= _MAX_MS else 0
    return version, ref, written_at


def scan_secret_files(directory: str | os.PathLike[str]) -> tuple[list[SecretFile], int]:
    """Valid secret files (header ref hashes to the file name) and the number skipped."""
    root = Path(directory)
    found: list[SecretFile] = []
    skipped = 0
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return [], 0
    for name in names:
        match = _NAME_RE.fullmatch(name)
        if match is None:
            continue  # key file, temp files, *.tampered-* kept for inspection, deletes' traces, .receipts
        path = root / name
        header = _read_header(path)
        if header is None or hashlib.sha256(header[1].encode("utf-8")).hexdigest() != match.group(1):
            skipped += 1
            continue
        try:
            mtime_ms = os.stat(path, follow_symlinks=False).st_mtime_ns // 1_000_000
        except OSError:
            skipped += 1
            continue
        found.append(SecretFile(ref=header[1], version=header[0], mtime_ms=mtime_ms, written_at=header[2]))
    return found, skipped


def rebuild_secrets_meta(conn: sqlite3.Connection, directory: str | os.PathLike[str], *,
                         db_rebuilt: bool) -> dict[str, Any]:
    """Bring ``secrets_meta`` in line with the files (call inside a transaction); returns a report."""
    files, skipped = scan_secret_files(directory)
    rows = {r[0] for r in conn.execute("SELECT secret_ref FROM secrets_meta WHERE backend = ?", (BACKEND,))}
    empty = conn.execute("SELECT 1 FROM secrets_meta LIMIT 1").fetchone() is None
    on_disk = {f.ref for f in files}
    added = 0
    for f in files:
        if f.ref not in rows:
            added += conn.execute(
                "INSERT OR IGNORE INTO secrets_meta(secret_ref, owner_kind, owner_id, kind, backend, updated_at) "
                "VALUES (?, 'provider', NULL, 'api_key', ?, ?)", (f.ref, BACKEND, f.updated_at)).rowcount
    removed = 0
    for ref in sorted(rows - on_disk):
        digest = hashlib.sha256(ref.encode("utf-8")).hexdigest()
        if (Path(directory) / f"{digest}.sec").exists():
            continue  # its file is there but unreadable/tampered: keep the row, secrets.get reports it
        if (Path(directory) / digest).exists():
            continue  # a seed-layout ciphertext: kept with its row (see the module docstring)
        removed += conn.execute("DELETE FROM secrets_meta WHERE secret_ref = ?", (ref,)).rowcount
    out: dict[str, Any] = {"rebuilt": bool(files) and (db_rebuilt or empty), "files": len(files), "added": added,
                           "removed": removed, "skipped": skipped}
    traces = sweep_delete_traces(conn, directory)
    if traces:
        out["tracesRemoved"] = traces
    return out


def sweep_delete_traces(conn: sqlite3.Connection, directory: str | os.PathLike[str]) -> int:
    """Remove keyed deletes' traces whose receipt row exists (their retries are answered from it), and
    those whose secret file is still there (cut before the file went: nothing happened, and a retry
    starts the delete again)."""
    root = Path(directory)
    try:
        names = sorted(n for n in os.listdir(root) if _TRACE_RE.fullmatch(n))
    except FileNotFoundError:
        return 0
    removed = 0
    for name in names:
        key = _trace_key(root / name)
        method = receipts.method_of(conn, key.client_id, key.submission_id) if key is not None else None
        undone = os.path.lexists(root / name.split(DELETING, 1)[0])
        if not undone and (key is None or method != key.method):
            continue  # its file went and its receipt never committed: the retry answers from it
        try:
            os.unlink(root / name)
        except FileNotFoundError:
            continue
        removed += 1
    return removed


def _trace_key(path: Path) -> receipts.ReceiptKey | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        blob = os.read(fd, _MAX_TRACE)
    finally:
        os.close(fd)
    try:
        return receipts.key_of_record(orjson.loads(blob))
    except orjson.JSONDecodeError:
        return None
