"""Shared fixtures for the turn-queue tests: a real schema'd SQLite file."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from store.indexing.database import apply_pragmas
from store.upgrade.schema import apply_schema

NOW_MS = 1_700_000_000_000


def open_queue_db(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    apply_pragmas(conn)
    apply_schema(conn)
    return conn


def add_session(conn: sqlite3.Connection, sid: str) -> None:
    conn.execute("INSERT INTO sessions(id, title, created_at, updated_at) VALUES (?, ?, ?, ?)",
                 (sid, sid, NOW_MS, NOW_MS))


@pytest.fixture
def db(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    conn = open_queue_db(tmp_path / "pi.sqlite")
    add_session(conn, "s1")
    add_session(conn, "s2")
    try:
        yield conn
    finally:
        conn.close()
