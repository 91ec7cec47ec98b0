"""A fresh schema database for the pure store tests of each capability (``conn`` fixture, helpers)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from store.indexing.database import in_transaction
from tests.schema_image import fresh_file_db

T = TypeVar("T")
NOW = 1_785_056_400_000


def fresh_db(path: Path) -> sqlite3.Connection:
    """A new database at ``path`` with the host's pragmas and the whole schema (autocommit)."""
    return fresh_file_db(path)  # a copy of one built once (tests/schema_image.py)


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    c = fresh_db(tmp_path / "pi.sqlite")
    try:
        yield c
    finally:
        c.close()


def tx(conn: sqlite3.Connection) -> Callable[[Callable[[sqlite3.Connection], T]], T]:
    """``write(fn)``: run ``fn`` in one committed transaction (what the DB writer does)."""
    def write(fn: Callable[[sqlite3.Connection], T]) -> T:
        return in_transaction(conn, fn)

    return write


def add_session(conn: sqlite3.Connection, sid: str, *, mode: str = "agent", project_id: Any = None) -> None:
    conn.execute("INSERT INTO sessions(id, title, mode, project_id, created_at, updated_at) VALUES (?,?,?,?,?,?)",
                 (sid, sid, mode, project_id, NOW, NOW))


def rows(root: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """``sql`` against a data directory's pi.sqlite, read-only (a host may be running on it)."""
    conn = sqlite3.connect(f"file:{root / 'pi.sqlite'}?mode=ro", uri=True)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


@contextmanager
def index_leaf(path: Path, index: str) -> Iterator[bytearray]:
    """The root page of index ``index`` (a leaf, for a small index) of the closed database file at ``path``, as
    bytes to edit in place: written back as the block leaves it (page damage for the salvage and prune tests)."""
    conn = sqlite3.connect(path)
    try:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        leaf = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (index,)).fetchone()[0]
    finally:
        conn.close()
    with open(path, "r+b") as f:
        f.seek((leaf - 1) * page_size)
        page = bytearray(f.read(page_size))
        yield page
        f.seek((leaf - 1) * page_size)
        f.write(page)
