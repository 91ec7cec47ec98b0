"""Looking at database files from the outside: layouts, logical dumps, the sqlite3 CLI."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from store.upgrade.schema_rebuild import normalize_sql

Layout = dict[str, Any]


def layout(conn: sqlite3.Connection) -> Layout:
    """Tables with their columns (name, type, not null, default, pk; order-free), indexes, triggers.

    Two files with the same layout hold the same schema version's structure,
    whichever way each got there (a fresh install puts ``deleted_at`` where
    §4 prints it, an ALTER TABLE at the end).
    """
    tables: dict[str, Any] = {}
    indexes: dict[str, Any] = {}
    triggers: set[str] = set()
    for kind, name, table, sql in conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"):
        if name.startswith("sqlite_") or (kind == "table" and name.startswith("messages_fts_")):
            continue
        if kind == "table":
            cols = conn.execute(f'PRAGMA table_info("{name}")').fetchall()
            tables[name] = frozenset((c[1], c[2].upper(), c[3], c[4], c[5]) for c in cols)
        elif kind == "index":
            cols = tuple(r[2] for r in conn.execute(f'PRAGMA index_info("{name}")'))
            parts = re.split(r"\bWHERE\b", normalize_sql(sql or ""), maxsplit=1, flags=re.IGNORECASE)
            where = parts[1].strip() if len(parts) == 2 else None
            indexes[name] = (table, cols, where)
        elif kind == "trigger":
            triggers.add(name)
    return {"tables": tables, "indexes": indexes, "triggers": triggers}


def file_layout(path: Path) -> Layout:
    with open_copy(path) as conn:
        return layout(conn)


def seed_layout(version: int) -> Layout:
    """The layout of ``seed_sql/v<version>.sql`` (an in-memory database)."""
    from tests.migrations.seedkit import seed_sql

    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(seed_sql(version))
        return layout(conn)
    finally:
        conn.close()


def host_layout(version: int) -> Layout:
    from store.upgrade.migrations import ddl_for_version

    conn = sqlite3.connect(":memory:")
    try:
        for statement in ddl_for_version(version):
            conn.execute(statement)
        return layout(conn)
    finally:
        conn.close()


@contextmanager
def open_copy(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection to a private copy of ``path`` (+ its -wal), so looking never writes the original; the
    copy is removed when the connection is done with."""
    with tempfile.TemporaryDirectory(prefix="dbcheck-") as name:
        tmp = Path(name)
        for suffix in ("", "-wal"):
            if Path(f"{path}{suffix}").exists():
                shutil.copyfile(f"{path}{suffix}", tmp / f"db{suffix}")
        conn = sqlite3.connect(tmp / "db")
        try:
            conn.execute("PRAGMA trusted_schema = ON")
            yield conn
        finally:
            conn.close()


def user_version(path: Path) -> int:
    with open_copy(path) as conn:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])


def dump(path: Path) -> list[str]:
    """A logical dump (every schema object and row) of the file at ``path``."""
    with open_copy(path) as conn:
        return list(conn.iterdump())


def sqlite3_cli(path: Path, sql: str) -> list[str]:
    """Run ``sql`` with the ``sqlite3`` command-line shell, read-only (``immutable``: it creates no -wal/-shm)."""
    uri = f"{path.resolve().as_uri()}?immutable=1"
    out = subprocess.run(["sqlite3", "-readonly", uri, sql], capture_output=True, text=True, timeout=60,
                         check=True)
    return out.stdout.splitlines()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def boot_report(db: Path) -> dict[str, Any]:
    """The newest boot's report (``boot_reports``) of the database at ``db``."""
    conn = sqlite3.connect(db)
    try:
        row = conn.execute("SELECT report_json FROM boot_reports ORDER BY started_at DESC LIMIT 1").fetchone()
        return dict(json.loads(row[0]))
    finally:
        conn.close()
