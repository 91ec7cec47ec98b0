"""``pi-host doctor``: check a stopped host's data directory offline, and repair what can be.

Synchronous, no host and no trio: the CLI holds the data directory's lock
(so no host can start meanwhile) and calls :func:`run_doctor`. Without
``repair`` nothing is written (the read-only database connection's own
``-wal``/``-shm``, if it had to create them, are removed again). The checks and
what each repair does are described in ``store.doctor.doctor_db``,
``store.doctor.doctor_sessions`` and ``store.doctor.doctor_settings``; severities
and exit codes in ``store.doctor.doctor_report``.

A database at an older schema (a seed-era file, or one of this host's older
versions) is not migrated here — ``pi-host serve`` does that, behind its
backups; doctor checks its integrity and the files, and says so. When the guarded
seed step would refuse the file (seed §7: a malformed value, named by its row), doctor
reports that as damage nothing here repairs, instead of promising the migration.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from store.doctor.doctor_db import (
    attachments,
    integrity,
    receipts,
    search_index,
    secrets,
    text_encoding,
    tool_search_index,
)
from store.doctor.doctor_report import DoctorReport, Progress, Severity
from store.doctor.doctor_sessions import DataDirPaths, check_sessions, check_surroundings
from store.doctor.doctor_settings import kv_records
from store.indexing.database import apply_pragmas
from store.upgrade.migrations import OpenAction, classify, preflight_refusal
from store.upgrade.schema import SCHEMA_VERSION

__all__ = ["DataDirPaths", "DoctorReport", "run_doctor"]

_SIDECARS = ("-wal", "-shm")


def _connect(db_path: Path, *, repair: bool) -> sqlite3.Connection:
    if repair:
        conn = sqlite3.connect(db_path, isolation_level=None)
        apply_pragmas(conn)
        return conn
    conn = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
    conn.execute("PRAGMA query_only = ON")
    conn.execute("PRAGMA trusted_schema = ON")
    return conn


def _schema_note(report: DoctorReport, conn: sqlite3.Connection, version: int, has_schema: bool) -> bool:
    """A finding for a database at another version; True when it is this build's current layout."""
    action = classify(version, has_schema)
    if action is OpenAction.CURRENT:
        return True
    refusal = preflight_refusal(conn) if action is OpenAction.UPGRADE else None
    if refusal is not None:
        # seed §7: the guarded step fails closed on this value, so `serve` will not start until a person
        # corrects it (the file and its backup stay as they are); never call that clean
        report.add("schema.version", "pi.sqlite", f"schema v{version}: the next `pi-host serve` refuses to "
                   f"migrate it and exits, the file left as it is: {refusal.message}; correct that value (or "
                   "restore a copy you trust) and start again", Severity.DAMAGED, version=version)
    elif action is OpenAction.UPGRADE:
        report.add("schema.version", "pi.sqlite", f"schema v{version}: the next `pi-host serve` migrates it in "
                   f"place to v{SCHEMA_VERSION}, behind pi.sqlite.v<n>.bak backups; the index checks wait for "
                   "that", Severity.INFO, version=version)
    elif action is OpenAction.RESET:
        report.add("schema.version", "pi.sqlite", f"schema v{version} predates the seed's v7: the next start "
                   "archives it (pi.sqlite.v6.bak) and indexes the transcripts into a fresh file", Severity.INFO,
                   version=version)
    elif action is OpenAction.FRESH:
        report.add("schema.version", "pi.sqlite", "an empty database: the next start creates the schema",
                   Severity.INFO)
    else:
        report.add("schema.version", "pi.sqlite", f"schema v{version} is not one this build can open "
                   f"(it supports up to v{SCHEMA_VERSION}; 12 and 13 were never released)",
                   Severity.DAMAGED, version=version)
    return False


def _backups(paths: DataDirPaths, report: DoctorReport) -> None:
    db = paths.db_path
    for path in sorted(db.parent.glob(f"{db.name}.v*.bak")):
        size = path.stat().st_size
        report.add("backup.file", path.name, f"{size} bytes: an exact copy the migration took before it changed "
                   "the database; kept until you delete it", Severity.INFO, bytes=size)


def run_doctor(paths: DataDirPaths, *, repair: bool, now_ms: int, progress: Progress | None = None) -> DoctorReport:
    """Run every check (and, with ``repair``, every repair) on a stopped host's data directory."""
    report = DoctorReport(data_dir=str(paths.root), repair=repair)
    db = paths.db_path
    conn: sqlite3.Connection | None = None
    existed = {s: Path(f"{db}{s}").exists() for s in _SIDECARS}
    try:
        current = False
        if not db.exists():
            report.add("schema.missing", "pi.sqlite", "no database: the next start creates one and indexes every "
                       "transcript (state only a database holds is not in the files)", Severity.INFO)
        else:
            try:
                conn = _connect(db, repair=repair)
                version = int(conn.execute("PRAGMA user_version").fetchone()[0])
                has_schema = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] > 0
            except sqlite3.DatabaseError as exc:
                report.add("sqlite.integrity", "pi.sqlite", f"SQLite cannot read the file: {exc}; the next start "
                           "quarantines it and rebuilds the index from the transcripts", Severity.DAMAGED)
                if conn is not None:
                    conn.close()
                conn = None
            else:
                report.schema_version = version
                current = _schema_note(report, conn, version, has_schema)
                if not integrity(conn, report, repair=repair) or not text_encoding(conn, report):
                    conn.close()
                    conn = None
        usable = conn if current else None
        facts = check_sessions(usable, paths, report, repair=repair, now_ms=now_ms, progress=progress)
        check_surroundings(usable, paths, report, repair=repair, now_ms=now_ms)
        if usable is not None:
            search_index(usable, db, report, repair=repair)
            tool_search_index(usable, db, report, repair=repair)
            attachments(usable, paths, facts, report, repair=repair, now_ms=now_ms, progress=progress)
            secrets(usable, paths, report, repair=repair)
            kv_records(usable, paths, report, repair=repair, now_ms=now_ms)
            receipts(usable, paths, facts, report, repair=repair)
        _backups(paths, report)
    finally:
        if conn is not None:
            conn.close()
        for suffix, was_there in existed.items():
            if not was_there and not repair:
                Path(f"{db}{suffix}").unlink(missing_ok=True)
    return report
