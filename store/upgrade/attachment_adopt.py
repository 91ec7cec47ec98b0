"""Give every attachment file that has no ``attachment_blobs`` row one (seed-era data directories).

A seed-era pi-desktop keeps content-addressed blobs in ``attachments/<sha256>``
and refers to them from transcript blocks, but its database has no
``attachment_blobs`` table (seed 003 §2, §4.7). Without a row, this host's
attachment GC takes such a file for an orphan of an interrupted put and deletes
it. Boot runs :func:`adopt_unindexed_blobs` once, right after the migration
from a seed version; ``pi-host doctor --repair`` runs it for any file it finds
without a row. A file whose bytes do not hash to its name is left alone (and
reported by doctor). Runs inside the caller's transaction.

A database created anew or rebuilt from the files has also lost the marks of evicted blobs (seed 000
§2.3: "Eviction marks references before deleting bytes"): a block of a session file that names a blob
whose bytes are gone would read back unmarked. :func:`adopt_pending` gives each such blob a tombstone row
(``evicted``, size unknown: 0) and records the references to it marked, so every read marks those blocks
again; storing the bytes again revives the blob as after any eviction.
"""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path

import orjson

from store.attachments import (
    META_SUFFIX,
    NO_META,
    AttachmentFiles,
    file_sha256,
    read_meta_file,
    row_meta,
    scan_references,
    sync_derived_refs,
)

_SHA_NAME = re.compile(r"^[0-9a-f]{64}$")


def blob_files(directory: Path) -> list[str]:
    try:
        return sorted(n for n in os.listdir(directory) if _SHA_NAME.fullmatch(n) and (directory / n).is_file())
    except FileNotFoundError:
        return []


def adopt_blob(conn: sqlite3.Connection, directory: Path, sha: str, now_ms: int) -> bool:
    """Insert the row of one verified file (``last_used_at`` = its mtime), with the metadata its put
    acknowledged from the file beside it (``<sha256>.meta``: MIME type, kind, trust, provenance, source, run,
    page/image metadata, first stored; none for a seed-era blob); True if a row was added."""
    st = os.stat(directory / sha, follow_symlinks=False)
    used = min(now_ms, st.st_mtime_ns // 1_000_000)
    kept = read_meta_file(directory / f"{sha}{META_SUFFIX}") or {}
    created = kept.get("createdAt")
    created = min(created, now_ms) if isinstance(created, int) else used
    used = max(used, created)
    meta = kept.get("meta")
    return conn.execute(
        "INSERT OR IGNORE INTO attachment_blobs(sha256, size_bytes, mime_type, created_at, last_used_at, kind, "
        "trust, provenance, source, run_id, meta_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (sha, st.st_size, kept.get("mimeType"), created, used, kept.get("kind"), kept.get("trust"),
         kept.get("provenance"), kept.get("source"), kept.get("runId"),
         orjson.dumps(meta).decode() if meta is not None else None)).rowcount == 1


def adopt_unindexed_blobs(conn: sqlite3.Connection, directory: Path, *, now_ms: int) -> dict[str, int]:
    known = {r[0] for r in conn.execute("SELECT sha256 FROM attachment_blobs")}
    adopted = mismatched = 0
    for sha in blob_files(directory):
        if sha in known:
            continue
        if file_sha256(directory / sha) != sha:
            mismatched += 1
            continue
        adopted += int(adopt_blob(conn, directory, sha, now_ms))
    return {"adopted": adopted, "mismatched": mismatched}


PENDING_KEY = ("pi-host", "adoptSeedAttachments")
"""kv row the seed v17 → v20 migration step writes; boot adopts the files and removes it in one transaction,
so a crash between the migration and the adoption only delays the adoption to the next boot."""


def mark_pending(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT OR REPLACE INTO kv(ns, key, value_json, updated_at) VALUES (?, ?, 'true', 0)", PENDING_KEY)


def mark_lost_blobs(conn: sqlite3.Connection, directory: Path, sessions_dir: Path, *, now_ms: int) -> int:
    """Tombstone rows for the blobs the session files refer to whose bytes are gone and which have no row,
    and the references to every evicted blob recorded marked; the number of tombstones added."""
    scan = scan_references(sessions_dir)
    present = set(blob_files(directory))
    known = {r[0] for r in conn.execute("SELECT sha256 FROM attachment_blobs")}
    added = 0
    for sha in sorted({r[0] for r in scan.refs} - present - known):
        added += conn.execute(
            "INSERT OR IGNORE INTO attachment_blobs(sha256, size_bytes, mime_type, created_at, last_used_at, "
            "deletion_state, evicted_at) VALUES (?, 0, NULL, ?, ?, 'evicted', ?)",
            (sha, now_ms, now_ms, now_ms)).rowcount
    sync_derived_refs(conn, scan.refs, now_ms, full=False)
    return added


def adopt_pending(conn: sqlite3.Connection, directory: Path, *, now_ms: int,
                  sessions_dir: Path | None = None) -> dict[str, int] | None:
    """At boot: adopt the seed-era attachment files if the migration asked for it (one transaction); with
    ``sessions_dir``, also mark the blobs its files refer to whose bytes are gone (:func:`mark_lost_blobs`)."""
    if conn.execute("SELECT 1 FROM kv WHERE ns = ? AND key = ?", PENDING_KEY).fetchone() is None:
        return None
    conn.execute("BEGIN IMMEDIATE")
    try:
        out = adopt_unindexed_blobs(conn, directory, now_ms=now_ms)
        if sessions_dir is not None:
            out["lostMarked"] = mark_lost_blobs(conn, directory, sessions_dir, now_ms=now_ms)
        conn.execute("DELETE FROM kv WHERE ns = ? AND key = ?", PENDING_KEY)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return out



META_BACKFILL_BATCH = 128
"""Metadata files boot writes at most per start: each one small fsynced write, once per blob stored before the
file existed; a large data directory's first start is not held up by all of them (the next boot goes on)."""


def backfill_meta_files(conn: sqlite3.Connection, files: AttachmentFiles, *, limit: int = META_BACKFILL_BATCH) -> int:
    """At boot: write the metadata file of up to ``limit`` live blobs whose row holds metadata, whose bytes are
    present and that have no metadata file (stored before the file existed: only a re-put wrote it), from the
    row (merged as a re-put's), so a later loss of the database keeps what the put acknowledged. Finding them
    costs one query and one directory listing (no marker: nothing to keep in step with the rows). The number
    of files written."""
    try:
        names = set(os.listdir(files.directory))
    except FileNotFoundError:
        return 0
    written = 0
    for (sha,) in conn.execute(
            "SELECT sha256 FROM attachment_blobs WHERE deletion_state = 'live' AND marked_for_eviction = 0 "
            "AND COALESCE(mime_type, kind, trust, provenance, source, run_id, meta_json) IS NOT NULL "
            "ORDER BY sha256").fetchall():
        if written >= limit:
            break
        if sha in names and f"{sha}{META_SUFFIX}" not in names:
            written += files.write_meta(sha, None, NO_META, None, prior=row_meta(conn, sha))
    return written
