"""A fresh current-schema database, copied from an image built once per process.

``apply_schema`` on an empty database costs about 17 ms of CPU (the whole DDL: every table, index,
trigger and the FTS5 tables, about 460 KB of pages), and the property tests build a fresh database for
every hypothesis example (thousands per run). A copy of a database that ``apply_schema`` built is the
same database (the same pages, ``user_version``, ``auto_vacuum`` and journal mode), for about 0.5 ms.
``tests/store/test_schema_image.py`` holds the copies to a database built directly.

Only for databases a test creates empty; the schema's own tests (tests/store/test_schema.py) and the
migration tests still build theirs statement by statement.
"""

from __future__ import annotations

import functools
import sqlite3
import tempfile
from pathlib import Path

from store.indexing.database import apply_pragmas
from store.upgrade.schema import apply_schema


@functools.cache
def memory_image() -> bytes:
    """``apply_schema`` on a ``:memory:`` database, serialized."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        apply_schema(conn)
        return conn.serialize()
    finally:
        conn.close()


@functools.cache
def file_image() -> bytes:
    """``apply_pragmas`` then ``apply_schema`` on a new file, closed (its WAL checkpointed): the file's bytes."""
    with tempfile.TemporaryDirectory(prefix="pihost-schema-image-") as tmp:
        path = Path(tmp) / "pi.sqlite"
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            apply_pragmas(conn)
            apply_schema(conn)
        finally:
            conn.close()
        return path.read_bytes()


def fresh_memory_db() -> sqlite3.Connection:
    """A ``:memory:`` database (autocommit) holding what ``apply_schema`` creates."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.deserialize(memory_image())
    return conn


def fresh_file_db(path: Path) -> sqlite3.Connection:
    """A new database file at ``path`` with the host's pragmas and the whole schema, open in autocommit:
    what ``apply_pragmas`` + ``apply_schema`` leave there. A file already at ``path`` gets exactly those
    two calls (``apply_schema`` refuses one that holds a schema)."""
    try:
        with open(path, "xb") as out:
            out.write(file_image())
    except FileExistsError:
        conn = sqlite3.connect(path, isolation_level=None)
        apply_pragmas(conn)
        apply_schema(conn)
        return conn
    conn = sqlite3.connect(path, isolation_level=None)
    apply_pragmas(conn)
    return conn
