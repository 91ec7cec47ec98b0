"""What a failed constraint in a DB-writer op answers (store/indexing/group_commit.py).

Every ``sqlite3.IntegrityError`` was CONFLICT. A key constraint is one a request can meet on a healthy index
(a taken id, a row another request removed) and stays CONFLICT. NOT NULL and CHECK only refuse a value the
host itself wrote (requests are validated before any op runs), so they never meant a client's conflict: on a
healthy index such an error is a host bug (INTERNAL); when the row it copied breaks its table's constraints
(``PRAGMA quick_check`` finds it) the index is damaged, and the batch fails as a corrupt index does, so the
DB writer quarantines it and the host rebuilds (RELIABILITY.md row 7)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.db_writer import DbOp
from protocol.errors import error_object
from store.indexing import index
from store.indexing.corruption import altered_definition, is_corruption
from store.indexing.database import open_writer
from store.indexing.group_commit import GroupCommit, index_corrupt
from tests.dbkit import NOW


@pytest.fixture
def db(tmp_path: Path) -> Iterator[tuple[sqlite3.Connection, Path]]:
    path = tmp_path / "pi.sqlite"
    conn, _ = open_writer(path, quarantine_dir=tmp_path / "quarantine", now_ms=NOW)
    conn.execute("BEGIN")
    index.insert_session(conn, "s1", now_ms=NOW, title="one")
    index.insert_session(conn, "s2", now_ms=NOW, title="two")
    conn.execute("COMMIT")
    try:
        yield conn, path
    finally:
        conn.close()


def _code(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], Any]) -> str:
    outcome = GroupCommit(conn).run([DbOp(fn)])
    assert isinstance(outcome, list), outcome
    [(ok, error)] = outcome
    assert not ok
    return str(error_object(error)["data"]["code"])


@pytest.mark.parametrize("statement", [
    "INSERT INTO sessions(id, title, created_at, updated_at) VALUES ('s1', 'again', 1, 1)",  # PRIMARY KEY
    "INSERT INTO turns(id, session_id, started_at) VALUES ('t1', 'gone', 1)",  # FOREIGN KEY: removed meanwhile
])
def test_a_key_constraint_is_a_conflict(db: tuple[sqlite3.Connection, Path], statement: str) -> None:
    conn, _ = db
    assert _code(conn, lambda c: c.execute(statement)) == "CONFLICT"


@pytest.mark.parametrize("statement", [
    "UPDATE sessions SET title = NULL WHERE id = 's1'",  # NOT NULL
    "UPDATE sessions SET permission_mode = 'sometimes' WHERE id = 's1'",  # CHECK
])
def test_a_value_the_host_wrote_against_the_schema_is_a_host_bug(db: tuple[sqlite3.Connection, Path],
                                                                   statement: str) -> None:
    conn, _ = db
    assert _code(conn, lambda c: c.execute(statement)) == "INTERNAL"
    assert conn.execute("SELECT title, permission_mode FROM sessions WHERE id = 's1'").fetchone() == (
        "one", "inherit")  # rolled back alone


def test_a_damaged_value_the_host_copies_is_a_corrupt_index(db: tuple[sqlite3.Connection, Path]) -> None:
    conn, path = db
    other = sqlite3.connect(path, isolation_level=None)  # bytes the host never wrote, as damage leaves them
    other.execute("PRAGMA ignore_check_constraints = ON")
    other.execute("UPDATE sessions SET thinking_level = 'hihg' WHERE id = 's2'")
    other.close()
    outcome = GroupCommit(conn).run([DbOp(lambda c: c.execute(
        "UPDATE sessions SET thinking_level = (SELECT thinking_level FROM sessions WHERE id = 's2') "
        "WHERE id = 's1'"))])
    assert isinstance(outcome, sqlite3.DatabaseError) and is_corruption(outcome), outcome
    assert error_object(index_corrupt(outcome))["data"]["code"] == "CORRUPT_DATA"



def test_tasks_say_already_exists_only_for_a_taken_id(db: tuple[sqlite3.Connection, Path]) -> None:
    """``store.tasks`` turned every constraint of its INSERT into "task ... already exists" (CONFLICT)."""
    from store.tasks import create_task

    conn, _ = db
    conn.execute("BEGIN")
    create_task(conn, task_id="k1", title="t", prompt="p", now_ms=NOW)
    conn.execute("COMMIT")
    assert _code(conn, lambda c: create_task(c, task_id="k1", title="t", prompt="p", now_ms=NOW)) == "CONFLICT"
    # a value the host got wrong (None where the schema says NOT NULL) is not "already exists"
    assert _code(conn, lambda c: create_task(c, task_id="k2", title=None, prompt="p",  # type: ignore[arg-type]
                                             now_ms=NOW)) == "INTERNAL"


def test_a_check_constraint_whose_schema_text_is_damaged_is_a_corrupt_index(tmp_path: Path) -> None:
    """Corrupt mode (seed 151906): a random byte landed inside a CHECK's string literal in the ledger's
    ``CREATE TABLE`` (``'completed'`` read ``'complet\\xe7d'``). The schema still parses, so nothing noticed it
    until ``collab.settle`` wrote ``completed``: the CHECK refused it, and SQLite's message quoting the
    damaged expression could not be decoded, so ``sqlite3`` raised a ``UnicodeDecodeError`` that no marker
    named as damage: the settle answered INTERNAL on a damaged index, and so would every retry. A constraint
    message that is not UTF-8 quotes damaged schema bytes (the host's schema is UTF-8): a corrupt index."""
    conn = altered_schema(tmp_path, "sessions", "?, '''accept-' || CAST(X'E7' AS TEXT) || 'dits'''",
                          ("'accept-edits'",))
    try:
        with pytest.raises(UnicodeDecodeError) as raised:
            conn.execute("UPDATE sessions SET permission_mode = 'accept-edits' WHERE id = 's1'")
        assert b"CHECK constraint failed" in bytes(raised.value.object)
        outcome = GroupCommit(conn).run([DbOp(lambda c: c.execute(
            "UPDATE sessions SET permission_mode = 'accept-edits' WHERE id = 's1'"))])
        assert isinstance(outcome, UnicodeDecodeError) and is_corruption(outcome), outcome
        assert error_object(index_corrupt(outcome))["data"]["code"] == "CORRUPT_DATA"
    finally:
        conn.close()


@pytest.mark.parametrize(("table", "literal", "damaged", "statement"), [
    # what session.update writes: a session's permission mode, its thinking level
    ("sessions", "'accept-edits'", "'accept-edibs'",
     "UPDATE sessions SET permission_mode = 'accept-edits' WHERE id = 's1'"),
    ("sessions", "'high'", "'higt'", "UPDATE sessions SET thinking_level = 'high' WHERE id = 's1'"),
])
def test_a_check_whose_schema_literal_changed_into_readable_bytes_is_a_corrupt_index(
        tmp_path: Path, table: str, literal: str, damaged: str, statement: str) -> None:
    """The readable twin of the case above: the byte changed into another readable character (``'complebed'``),
    so SQLite's message decodes and is a plain "CHECK constraint failed" on a valid value, and no row breaks a
    constraint (``quick_check`` says ok): the write answered INTERNAL, and so did every retry on that index.
    The stored ``CREATE TABLE`` is not the host's: a corrupt index (CORRUPT_DATA, the host rebuilds)."""
    conn = altered_schema(tmp_path, table, "?, ?", (literal, damaged))
    try:
        assert conn.execute("PRAGMA quick_check").fetchall() == [("ok",)]
        with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint failed"):
            conn.execute(statement)  # decodable: not a UnicodeDecodeError, nothing names it damage by itself
        outcome = GroupCommit(conn).run([DbOp(lambda c: c.execute(statement))])
        assert isinstance(outcome, sqlite3.DatabaseError) and is_corruption(outcome), outcome
        assert f"the stored definition of {table} is not the host's" in str(outcome)
        assert error_object(index_corrupt(outcome))["data"]["code"] == "CORRUPT_DATA"
    finally:
        conn.close()


def test_an_intact_schema_compares_equal_and_a_missing_object_does_not(
        db: tuple[sqlite3.Connection, Path]) -> None:
    """What the constraint failure above asks of the stored schema: the host's own (fresh here; every migrated
    layout ends in the same definitions, tests/migrations) is not damage, a definition gone is."""
    conn, path = db
    assert altered_definition(conn) is None
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("PRAGMA writable_schema = ON")
    other.execute("UPDATE sqlite_master SET name = 'messages_ax', sql = replace(sql, 'messages_ai', 'messages_ax') "
                  "WHERE name = 'messages_ai'")  # a readable byte in a trigger's name
    other.close()
    again = sqlite3.connect(path, isolation_level=None)
    try:
        assert altered_definition(again) == "messages_ai is missing"
    finally:
        again.close()


def altered_schema(tmp_path: Path, table: str, replace_args: str, params: tuple[str, ...]) -> sqlite3.Connection:
    """A writer on a database holding session ``s1`` whose stored ``CREATE`` of ``table`` went through
    ``replace(sql, <replace_args>)`` (``params`` bound): bytes the host never wrote, as damage leaves them."""
    path = tmp_path / "pi.sqlite"
    conn, _ = open_writer(path, quarantine_dir=tmp_path / "quarantine", now_ms=NOW)
    conn.execute("BEGIN")
    index.insert_session(conn, "s1", now_ms=NOW, title="one")
    conn.execute("COMMIT")
    conn.close()
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("PRAGMA writable_schema = ON")
    other.execute(f"UPDATE sqlite_master SET sql = replace(sql, {replace_args}) WHERE name = ?", (*params, table))
    other.close()
    conn, _ = open_writer(path, quarantine_dir=tmp_path / "quarantine", now_ms=NOW)
    return conn
