"""``pi-host doctor``: the database itself and what it keeps about files.

* ``PRAGMA integrity_check``: problems that are only about indexes (a row
  missing from an index, a wrong entry count) are repairable with ``REINDEX``;
  anything else is damage (the host would quarantine the file and rebuild the
  index from the transcripts, losing what only the database holds).
* text values that are not UTF-8 (every text column of every table): SQLite
  keeps such bytes with its pages well formed, so ``integrity_check`` passes,
  but the host writes only Python ``str`` and a read that meets one is index
  damage to it (``store.indexing.corruption``); damage, and no further check
  reads the file (its own reads would meet the bytes too).
* the search index: FTS5's own ``integrity-check``, then its rows against the
  searchable ``messages`` rows (and ``search_hazard`` against the rows that
  need it); repairable by rebuilding both from ``messages``. The same for tool
  output search (v28): ``tool_fts``'s ``integrity-check``, its rows against
  ``tool_output``, and ``tool_output`` rows whose message row is gone;
  repairable by dropping those and rebuilding ``tool_fts`` from ``tool_output``.
* attachments: every ``attachment_blobs`` row has its bytes, every file's bytes
  hash to its name, every file has a row (else the attachment GC would delete
  it as an orphan), every reference — an ``attachment_refs`` row or an
  attachment block in a transcript — has its bytes; a blob whose row holds
  metadata its ``<sha256>.meta`` file lacks (stored before that file existed)
  gets the file written from the row by repair, so a lost database keeps it.
* ``secrets_meta`` against the ``secrets/`` files (the rule boot applies), a
  file whose header does not match its name, the key file.
* command receipts whose effect is gone: a ``session.appendMessage`` receipt
  whose message is in neither its session's transcript nor its revisions
  file; a retry would be told it succeeded. Repair deletes the receipt, so a
  retry writes the message again. A receipt whose answer is kept in a file
  (``receipts/<sha256>.json``, ``store.receipts``) that is missing or does
  not hash to its name and size: damage (its retry answers ``CORRUPT_DATA``;
  deleting the receipt would run its effect a second time).
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import stat
from collections.abc import Callable
from pathlib import Path

import orjson

from store import receipts as command_receipts
from store.attachments import META_SUFFIX, NO_META, AttachmentFiles, file_sha256, read_meta_file, row_meta
from store.config.secrets import KEY_FILE
from store.config.secrets_meta_rebuild import rebuild_secrets_meta, scan_secret_files
from store.doctor.doctor_report import DoctorReport, Progress, Severity
from store.doctor.doctor_sessions import DataDirPaths, SessionFacts
from store.errors import CorruptData
from store.fsutil import remove_file_durable
from store.indexing.corruption import is_corruption
from store.revisions import read_revisions
from store.upgrade.attachment_adopt import adopt_blob, blob_files
from store.upgrade.schema import hazard_sql, searchable_sql

_INDEX_PROBLEM = re.compile(r"^(?:row \d+ missing from index|wrong # of entries in index|"
                            r"non-unique entry in index) (\S+)")


def _transaction(conn: sqlite3.Connection, statements: list[tuple[str, tuple[object, ...]]]) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        for sql, args in statements:
            conn.execute(sql, args)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def integrity(conn: sqlite3.Connection, report: DoctorReport, *, repair: bool) -> bool:
    """``PRAGMA integrity_check``; False when the file is too damaged for any further check."""
    try:
        rows = [str(r[0]) for r in conn.execute("PRAGMA integrity_check(200)")]
    except sqlite3.DatabaseError as exc:
        report.add("sqlite.integrity", "pi.sqlite", f"SQLite cannot read the file: {exc}; the next start "
                   "quarantines it and rebuilds the index from the transcripts (state only the database "
                   "held is then lost; see the pi.sqlite.v<n>.bak backups)", Severity.DAMAGED)
        return False
    if rows == ["ok"]:
        return True
    matches = [_INDEX_PROBLEM.match(r) for r in rows]
    indexes = [m.group(1) for m in matches if m is not None]
    if len(indexes) != len(rows):
        report.add("sqlite.integrity", "pi.sqlite", f"integrity_check: {'; '.join(rows[:5])}; the next start "
                   "quarantines the file and rebuilds the index from the transcripts", Severity.DAMAGED,
                   problems=rows[:20])
        return False
    names = sorted({str(i) for i in indexes})
    finding = report.add("sqlite.integrity", "pi.sqlite", f"{len(rows)} index problem(s) in {', '.join(names)} "
                         "(the tables are intact); repair rebuilds those indexes (REINDEX)", Severity.REPAIRABLE,
                         indexes=names, problems=rows[:20])
    if repair:
        for name in names:
            conn.execute(f'REINDEX "{name}"')
        after = [str(r[0]) for r in conn.execute("PRAGMA integrity_check(200)")]
        finding.repaired = after == ["ok"]
        if not finding.repaired:
            report.add("sqlite.integrity", "pi.sqlite", f"still after REINDEX: {'; '.join(after[:5])}",
                       Severity.DAMAGED)
    return True


def _valid_utf8(value: object) -> int:
    if not isinstance(value, bytes):
        return 1
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return 0
    return 1


def text_encoding(conn: sqlite3.Connection, report: DoctorReport) -> bool:
    """Every text value is UTF-8; False (damage reported) when one is not.

    The host meets such a value as "Could not decode to UTF-8 column" and treats it as a damaged index (it
    writes every text from a Python ``str``): the read answers CORRUPT_DATA, the file is quarantined and the
    index rebuilt. One scan per table, of the text values only (each passed as its bytes)."""
    conn.create_function("pi_doctor_utf8", 1, _valid_utf8, deterministic=True)
    bad: dict[str, int] = {}
    try:
        tables = [str(r[0]) for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND sql NOT LIKE 'CREATE VIRTUAL%' "
            "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        for table in tables:
            columns = [str(r[1]) for r in conn.execute(f'PRAGMA table_info("{table}")')]
            if not columns:
                continue
            counts = ", ".join(f'sum(CASE WHEN typeof("{c}") = \'text\' THEN 1 - pi_doctor_utf8(CAST("{c}" AS BLOB)) '
                               "ELSE 0 END)" for c in columns)
            row = conn.execute(f'SELECT {counts} FROM "{table}"').fetchone()
            bad.update({f"{table}.{c}": int(n) for c, n in zip(columns, row, strict=True) if n})
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        report.add("sqlite.integrity", "pi.sqlite", f"SQLite cannot read the file: {exc}; the next start "
                   "quarantines it and rebuilds the index from the transcripts", Severity.DAMAGED)
        return False
    if not bad:
        return True
    listed = ", ".join(f"{n} in {column}" for column, n in sorted(bad.items()))
    report.add("sqlite.text", "pi.sqlite", f"text values that are not UTF-8 ({listed}); the host never writes "
               "such bytes, so the index is damaged: the first read that meets one quarantines the file and "
               "rebuilds the index from the transcripts (state only the database held is then lost; see the "
               "pi.sqlite.v<n>.bak backups)", Severity.DAMAGED, columns=bad)
    return False


def _search_differences(conn: sqlite3.Connection) -> dict[str, int]:
    searchable = searchable_sql("m")
    diff = {
        "missing": conn.execute(f"SELECT count(*) FROM messages AS m WHERE {searchable} AND NOT EXISTS "
                                "(SELECT 1 FROM messages_fts_docsize AS d WHERE d.id = m.mid)").fetchone()[0],
        "stale": conn.execute(f"SELECT count(*) FROM messages_fts_docsize AS d WHERE NOT EXISTS "
                              f"(SELECT 1 FROM messages AS m WHERE m.mid = d.id AND {searchable})").fetchone()[0],
        "hazardMissing": conn.execute(
            f"SELECT count(*) FROM messages AS m WHERE {searchable} AND {hazard_sql('m')} AND NOT EXISTS "
            "(SELECT 1 FROM search_hazard AS h WHERE h.mid = m.mid)").fetchone()[0],
        "hazardStale": conn.execute(
            f"SELECT count(*) FROM search_hazard AS h WHERE NOT EXISTS (SELECT 1 FROM messages AS m "
            f"WHERE m.mid = h.mid AND {searchable} AND {hazard_sql('m')})").fetchone()[0],
    }
    return {k: int(v) for k, v in diff.items() if v}


def rebuild_search_index(conn: sqlite3.Connection) -> None:
    """Refill ``messages_fts`` and ``search_hazard`` from the searchable ``messages`` rows (one transaction)."""
    searchable = searchable_sql("m")
    _transaction(conn, [
        ("INSERT INTO messages_fts(messages_fts) VALUES ('delete-all')", ()),
        (f"INSERT INTO messages_fts(rowid, text) SELECT m.mid, m.text FROM messages AS m WHERE {searchable} "
         "ORDER BY m.mid", ()),
        ("DELETE FROM search_hazard", ()),
        (f"INSERT INTO search_hazard(mid) SELECT m.mid FROM messages AS m WHERE {searchable} AND "
         f"{hazard_sql('m')}", ()),
    ])


def fts_integrity_check(db_path: Path, table: str = "messages_fts") -> str | None:
    """FTS5's ``integrity-check`` of ``table`` (an INSERT by syntax, so it needs a writable connection):
    the check runs in a transaction that is rolled back, so nothing is written. None when it passes."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        conn.execute("PRAGMA trusted_schema = ON")
        conn.execute("BEGIN")
        try:
            conn.execute(f"INSERT INTO {table}({table}, rank) VALUES ('integrity-check', 0)")
        finally:
            conn.execute("ROLLBACK")
    except sqlite3.DatabaseError as exc:
        return str(exc)
    finally:
        conn.close()
    return None


def _check_fts(conn: sqlite3.Connection, db_path: Path, report: DoctorReport, *, repair: bool, table: str,
               check: str, what: str, source: str, differences: Callable[[sqlite3.Connection], dict[str, int]],
               rebuild: Callable[[sqlite3.Connection], None]) -> None:
    """One FTS5 index: its ``integrity-check``, then its rows against what it indexes (``differences``);
    repairable by ``rebuild``."""
    problems: dict[str, object] = {}
    failed = fts_integrity_check(db_path, table)
    if failed is not None:
        problems["integrityCheck"] = failed
    try:
        problems.update(differences(conn))
    except sqlite3.DatabaseError as exc:
        problems["rows"] = str(exc)
    if not problems:
        return
    finding = report.add(check, table, f"{what} problems {problems}; repair rebuilds it from the {source} rows",
                         Severity.REPAIRABLE, **problems)
    if repair:
        try:
            rebuild(conn)
            finding.repaired = fts_integrity_check(db_path, table) is None and not differences(conn)
        except sqlite3.DatabaseError as exc:  # the table itself cannot be opened: its format record, its schema row
            if not is_corruption(exc):
                raise
            report.add(check, table, f"repair could not rebuild the {what} ({exc}); the next start quarantines "
                       "pi.sqlite and rebuilds the index from the transcripts (state only the database held is "
                       "then lost; see the pi.sqlite.v<n>.bak backups)", Severity.DAMAGED)


def search_index(conn: sqlite3.Connection, db_path: Path, report: DoctorReport, *, repair: bool) -> None:
    _check_fts(conn, db_path, report, repair=repair, table="messages_fts", check="fts.index", what="search index",
               source="messages", differences=_search_differences, rebuild=rebuild_search_index)


def _tool_search_differences(conn: sqlite3.Connection) -> dict[str, int]:
    diff = {
        "orphanOutput": conn.execute("SELECT count(*) FROM tool_output AS t WHERE NOT EXISTS "
                                     "(SELECT 1 FROM messages AS m WHERE m.mid = t.mid)").fetchone()[0],
        "missing": conn.execute("SELECT count(*) FROM tool_output AS t WHERE NOT EXISTS "
                                "(SELECT 1 FROM tool_fts_docsize AS d WHERE d.id = t.mid)").fetchone()[0],
        "stale": conn.execute("SELECT count(*) FROM tool_fts_docsize AS d WHERE NOT EXISTS "
                              "(SELECT 1 FROM tool_output AS t WHERE t.mid = d.id)").fetchone()[0],
    }
    return {k: int(v) for k, v in diff.items() if v}


def rebuild_tool_search_index(conn: sqlite3.Connection) -> None:
    """Refill ``tool_fts`` from ``tool_output``, then drop the ``tool_output`` rows whose message is gone
    (one transaction). In that order: ``tool_fts`` is contentless, so ``delete-all`` empties it, and the
    delete trigger of an output row may only remove what the index holds (removing a row it never held
    drives FTS5's totals negative: "database disk image is malformed")."""
    _transaction(conn, [
        ("INSERT INTO tool_fts(tool_fts) VALUES ('delete-all')", ()),
        ("INSERT INTO tool_fts(rowid, text) SELECT mid, text FROM tool_output ORDER BY mid", ()),
        ("DELETE FROM tool_output WHERE NOT EXISTS (SELECT 1 FROM messages AS m WHERE m.mid = tool_output.mid)",
         ()),
    ])


def tool_search_index(conn: sqlite3.Connection, db_path: Path, report: DoctorReport, *, repair: bool) -> None:
    """Tool output search (v28): ``tool_fts`` against ``tool_output``, ``tool_output`` against ``messages``."""
    _check_fts(conn, db_path, report, repair=repair, table="tool_fts", check="fts.toolIndex",
               what="tool output search index", source="tool_output", differences=_tool_search_differences,
               rebuild=rebuild_tool_search_index)


def attachments(conn: sqlite3.Connection, paths: DataDirPaths, facts: SessionFacts, report: DoctorReport, *,
                repair: bool, now_ms: int, progress: Progress | None) -> None:
    directory = paths.attachments_dir
    names = blob_files(directory)
    rows = {r[0]: (int(r[1]), bool(r[2])) for r in conn.execute(
        "SELECT sha256, size_bytes, marked_for_eviction FROM attachment_blobs")}
    present: set[str] = set()
    for done, sha in enumerate(names, start=1):
        path = directory / sha
        report.count("attachments")
        if progress is not None:
            progress("attachments", done, len(names))
        if file_sha256(path) != sha:
            report.add("attachments.corrupt", f"attachments/{sha}", "the bytes do not hash to the file's name "
                       "(changed on disk); nothing here holds the original", Severity.DAMAGED)
            continue
        present.add(sha)
        if sha not in rows:
            finding = report.add("attachments.unindexed", f"attachments/{sha}", "no attachment_blobs row (the "
                                 "attachment GC would delete the file as an orphan); repair records it",
                                 Severity.REPAIRABLE)
            if repair:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    adopt_blob(conn, directory, sha, now_ms)
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                finding.repaired = True
    files = AttachmentFiles(directory)
    for sha in sorted(present & rows.keys()):
        if rows[sha][1]:
            continue  # being evicted: its file goes with its bytes
        held = row_meta(conn, sha)
        kept = read_meta_file(files.meta_path(sha)) or {}
        lacking = sorted(k for k in held if k != "createdAt" and kept.get(k) is None)
        if not lacking:
            continue  # nothing but times in the row (adoption takes the mtime), or the file holds it all
        finding = report.add("attachments.meta_missing", f"attachments/{sha}{META_SUFFIX}", "the blob's row "
                             f"holds {', '.join(lacking)} but its metadata file does not (stored before the file "
                             "existed): a lost pi.sqlite would lose them; repair writes the file from the row",
                             Severity.REPAIRABLE)
        if repair:
            files.write_meta(sha, None, NO_META, None, prior=held)  # the row's values, merged as a re-put's
            finding.repaired = True
    for sha in files.meta_names():
        if (directory / sha).exists():
            continue
        finding = report.add("attachments.orphan_meta", f"attachments/{sha}{META_SUFFIX}", "a blob's metadata "
                             "file without its blob (a delete cut short); the next attachment GC removes it, "
                             "so does repair", Severity.REPAIRABLE)
        if repair:
            remove_file_durable(directory / f"{sha}{META_SUFFIX}")
            finding.repaired = True
    for sha, (_size, marked) in sorted(rows.items()):
        if sha not in present and not marked and not (directory / sha).exists():
            report.add("attachments.missing_bytes", f"attachments/{sha}", "an attachment_blobs row whose bytes "
                       "are gone", Severity.DAMAGED)
    for sha, sid, mid in conn.execute("SELECT r.sha256, r.session_id, r.message_id FROM attachment_refs AS r "
                                      "WHERE NOT EXISTS (SELECT 1 FROM attachment_blobs AS b "
                                      "WHERE b.sha256 = r.sha256)").fetchall():
        if sha in present:
            continue  # its blob row is added above (repairable) or stays reported there
        report.add("attachments.ref_without_bytes", f"attachments/{sha}", f"referenced by session {sid} "
                   f"(message {mid}) but neither its row nor its bytes exist", Severity.DAMAGED)
    for sha, users in sorted(facts.attachment_refs.items()):
        if sha in rows and rows[sha][1]:
            continue  # evicted (or being evicted): its blocks read back marked, nothing is damaged
        if sha not in present and not (directory / sha).exists():
            report.add("attachments.block_without_bytes", f"attachments/{sha}",
                       f"an attachment block in {len(users)} transcript message(s) (first: session {users[0][0]}, "
                       f"message {users[0][1]}) refers to bytes that are gone", Severity.DAMAGED,
                       messages=[list(u) for u in users[:10]])


def secrets(conn: sqlite3.Connection, paths: DataDirPaths, report: DoctorReport, *, repair: bool) -> None:
    directory = paths.secrets_dir
    files, skipped = scan_secret_files(directory)
    on_disk = {f.ref for f in files}
    rows = {r[0] for r in conn.execute("SELECT secret_ref FROM secrets_meta WHERE backend = 'file_fallback'")}
    report.count("secrets", len(rows | {f.ref for f in files}))
    names = set(os.listdir(directory)) if directory.is_dir() else set()
    changes = 0
    for ref in sorted(rows - on_disk):
        digest = hashlib.sha256(ref.encode("utf-8")).hexdigest()
        if digest in names:
            report.add("secrets.seed_format", f"secrets/{digest}", f"the ciphertext of {ref!r} is in the seed's "
                       "own format, which this host cannot read; its bookkeeping row is kept (set the secret "
                       "again to re-encrypt it)", Severity.INFO, ref=ref)
        elif f"{digest}.sec" not in names:
            changes += 1
            report.add("secrets.row_without_file", f"secrets_meta {ref!r}", "a bookkeeping row whose ciphertext "
                       "is gone; repair removes the row (as boot does)", Severity.REPAIRABLE, ref=ref)
    for ref in sorted(on_disk - rows):
        changes += 1
        report.add("secrets.file_without_row", f"secrets/{hashlib.sha256(ref.encode()).hexdigest()}.sec",
                   f"the ciphertext of {ref!r} has no secrets_meta row; repair adds it", Severity.REPAIRABLE,
                   ref=ref)
    if skipped:
        report.add("secrets.unreadable", "secrets/", f"{skipped} .sec file(s) whose header does not name the "
                   "secret their file name is for (swapped or damaged); kept, never trusted", Severity.DAMAGED)
    key = directory / KEY_FILE
    if files:
        try:
            st = os.stat(key, follow_symlinks=False)
        except FileNotFoundError:
            report.add("secrets.key", f"secrets/{KEY_FILE}", "the machine key is gone: no secret can be "
                       "decrypted", Severity.DAMAGED)
        else:
            if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077:
                report.add("secrets.key", f"secrets/{KEY_FILE}", f"mode {oct(st.st_mode & 0o777)}: secrets refuse "
                           "a key others can read (it may have leaked); chmod 600 it or rotate the secrets",
                           Severity.DAMAGED)
    if repair and changes:
        conn.execute("BEGIN IMMEDIATE")
        try:
            rebuild_secrets_meta(conn, directory, db_rebuilt=False)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        after = {r[0] for r in conn.execute("SELECT secret_ref FROM secrets_meta WHERE backend = 'file_fallback'")}
        for finding in report.findings:
            if finding.check in ("secrets.row_without_file", "secrets.file_without_row"):
                finding.repaired = (finding.data["ref"] in after) == (finding.check == "secrets.file_without_row")


def receipts(conn: sqlite3.Connection, paths: DataDirPaths, facts: SessionFacts, report: DoctorReport, *,
             repair: bool) -> None:
    _receipt_files(conn, paths, report)
    live = {r[0] for r in conn.execute("SELECT id FROM sessions")}
    revisions: dict[str, set[str]] = {}
    for client, submission, sid, response in conn.execute(
            "SELECT client_id, submission_id, session_id, response_json FROM command_receipts "
            "WHERE method = 'session.appendMessage'").fetchall():
        report.count("receipts")
        if sid not in live or sid not in facts.message_ids:
            continue  # the session was deleted (its receipts outlive it) or has no transcript (reported above)
        try:
            message_id = orjson.loads(response or b"null")["message"]["id"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue
        if message_id in facts.message_ids[sid]:
            continue
        if sid not in revisions:
            archived = read_revisions(paths.sessions_dir / f"{sid}.revisions.jsonl")
            revisions[sid] = {m["id"] for e in archived.entries.values() for m in e.messages}
        if message_id in revisions[sid]:
            continue
        finding = report.add("receipts.effect_gone", f"receipt {client}/{submission}",
                             f"acknowledges message {message_id} of session {sid}, which neither its transcript "
                             "nor its revisions hold; a retry would be told it succeeded. Repair deletes the "
                             "receipt so a retry writes the message again", Severity.REPAIRABLE,
                             sessionId=sid, messageId=message_id)
        if repair:
            _transaction(conn, [("DELETE FROM command_receipts WHERE client_id = ? AND submission_id = ?",
                                 (client, submission))])
            finding.repaired = True


def _receipt_files(conn: sqlite3.Connection, paths: DataDirPaths, report: DoctorReport) -> None:
    """Every answer file a receipt row names is there, its size and SHA-256 the row's."""
    directory = paths.root / command_receipts.RECEIPTS_DIR
    for digest, (size, keys) in sorted(command_receipts.referenced_files(conn).items()):
        report.count("receiptFiles")
        try:
            command_receipts.read_file_answer(directory, digest, size)
        except CorruptData as exc:
            client, submission = keys[0]
            report.add("receipts.file_damaged", f"{command_receipts.RECEIPTS_DIR}/{digest}.json",
                       f"the answer of receipt {client}/{submission} ({len(keys)} receipt(s) in all) does not read "
                       f"back: {exc}. A retry of it answers CORRUPT_DATA; the receipt stays, so its effect never "
                       "runs twice", Severity.DAMAGED, receipts=[f"{c}/{s}" for c, s in keys[:20]])
