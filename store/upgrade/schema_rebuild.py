"""Bring an existing schema to a target DDL without losing a row (migration helper).

Used by the migration steps that change a table's definition (seed 003 §7's
guarded v8→v11 step for ``plan_approvals``, and the seed v17 → host v20 step).
SQLite cannot alter a column's constraints in place, so a table whose
definition differs is rebuilt: the old table is renamed aside, the target
``CREATE TABLE`` runs under the real name (so ``sqlite_master`` holds exactly
the target text, as a fresh install would), every column both tables have is
copied, and the old table is dropped. Columns only the target has take their
``DEFAULT``. A column only the old table has would be lost: that is refused
(:class:`SchemaDrift`), never done silently.

The rename runs with ``legacy_alter_table = ON`` so that other tables'
``REFERENCES <name>`` clauses are not rewritten to the temporary name (with it
OFF, SQLite ≥ 3.26 follows the rename and the references would dangle once the
old table is dropped). Foreign key enforcement must be off (the migration
engine turns it off around destructive steps): with it on, ``DROP TABLE``
would run an implicit ``DELETE`` and cascade. The caller checks
``PRAGMA foreign_key_check`` before it commits.

Objects of the current schema the target does not mention (tables a build we
never saw added) are left alone. Synchronous, runs inside the caller's
transaction; never commits.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from store.errors import StoreError

_CREATE_RE = re.compile(
    r"^\s*CREATE\s+(?:UNIQUE\s+)?(?P<kind>VIRTUAL\s+TABLE|TABLE|INDEX|TRIGGER)\s+"
    r"(?:IF\s+NOT\s+EXISTS\s+)?\"?(?P<name>\w+)\"?",
    re.IGNORECASE,
)
_COMMENT_RE = re.compile(r"--[^\n]*")
_SPACE_RE = re.compile(r"\s+")
_PUNCT_SPACE_RE = re.compile(r"\s*([(),;])\s*")
_QUOTED_NAME_RE = re.compile(r'"(\w+)"')

REBUILD_SUFFIX = "__rebuild"


class SchemaDrift(StoreError):
    """The existing schema has something the target would drop; nothing was changed."""

    code = "MIGRATION_FAILED"


@dataclass(frozen=True)
class Statement:
    kind: str  # "table" | "virtual" | "index" | "trigger"
    name: str
    sql: str


def parse_statement(sql: str) -> Statement:
    """Kind and name of one ``CREATE`` statement."""
    match = _CREATE_RE.match(_COMMENT_RE.sub("", sql))
    if match is None:
        raise ValueError(f"not a CREATE TABLE/INDEX/TRIGGER statement: {sql[:80]!r}")
    kind = match.group("kind").upper()
    short = "virtual" if kind.startswith("VIRTUAL") else kind.lower()
    return Statement(short, match.group("name"), sql)


def normalize_sql(sql: str) -> str:
    """The SQL text with comments, layout and identifier quotes taken out (for comparison)."""
    text = _COMMENT_RE.sub("", sql)
    text = _SPACE_RE.sub(" ", text)
    text = _PUNCT_SPACE_RE.sub(r"\1", text)
    text = _QUOTED_NAME_RE.sub(r"\1", text)
    return text.strip().rstrip(";")


def same_definition(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and normalize_sql(a) == normalize_sql(b)


def schema_sql(conn: sqlite3.Connection) -> dict[str, tuple[str, str | None]]:
    """``name → (type, sql)`` of every schema object (autoindexes have no SQL)."""
    return {row[1]: (row[0], row[2]) for row in conn.execute("SELECT type, name, sql FROM sqlite_master")}


def table_columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [str(row[1]) for row in conn.execute(f'PRAGMA table_info("{table}")')]


def _foreign_keys_off(conn: sqlite3.Connection) -> None:
    if conn.execute("PRAGMA foreign_keys").fetchone()[0]:
        raise RuntimeError("rebuilding a table needs PRAGMA foreign_keys = OFF (DROP TABLE would cascade)")


def rebuild_table(conn: sqlite3.Connection, name: str, create_sql: str) -> int:
    """Replace table ``name`` by ``create_sql``, copying every shared column; returns rows copied.

    Indexes and triggers of the old table go with it; the caller recreates
    the target's (see :func:`converge`).
    """
    _foreign_keys_off(conn)
    old_columns = table_columns(conn, name)
    aside = f"{name}{REBUILD_SUFFIX}"
    conn.execute("PRAGMA legacy_alter_table = ON")
    try:
        conn.execute(f'ALTER TABLE "{name}" RENAME TO "{aside}"')
    finally:
        conn.execute("PRAGMA legacy_alter_table = OFF")
    conn.execute(create_sql)
    new_columns = table_columns(conn, name)
    lost = [c for c in old_columns if c not in new_columns]
    if lost:
        holding = [c for c in lost if conn.execute(f'SELECT 1 FROM "{aside}" WHERE "{c}" IS NOT NULL LIMIT 1')
                   .fetchone()]
        if holding:
            raise SchemaDrift(
                f"table {name} has column(s) {', '.join(holding)} holding data that the target layout "
                f"does not have; refusing to drop them",
                data={"table": name, "columns": holding},
            )
    shared = ", ".join(f'"{c}"' for c in new_columns if c in old_columns)
    copied = conn.execute(f'INSERT INTO "{name}" ({shared}) SELECT {shared} FROM "{aside}"').rowcount
    conn.execute(f'DROP TABLE "{aside}"')
    return int(copied)


@dataclass
class ConvergeReport:
    created: list[str]
    rebuilt: dict[str, int]
    replaced: list[str]


def converge(conn: sqlite3.Connection, statements: Sequence[str]) -> ConvergeReport:
    """Make every object ``statements`` define exist with exactly that definition.

    Tables first (created when missing, rebuilt when their definition differs,
    kept when it is the same up to comments and layout), then virtual tables,
    indexes and triggers (created when missing, dropped and recreated when
    different). A virtual table created or replaced here is an external-content
    FTS index and gets a ``'rebuild'``.
    """
    report = ConvergeReport(created=[], rebuilt={}, replaced=[])
    parsed = [parse_statement(s) for s in statements]
    current = schema_sql(conn)
    for st in parsed:
        if st.kind != "table":
            continue
        found = current.get(st.name)
        if found is None:
            conn.execute(st.sql)
            report.created.append(st.name)
        elif not same_definition(found[1], st.sql):
            report.rebuilt[st.name] = rebuild_table(conn, st.name, st.sql)
    for st in parsed:
        if st.kind == "table":
            continue
        current = schema_sql(conn)
        found = current.get(st.name)
        if found is not None and same_definition(found[1], st.sql):
            continue
        if found is not None:
            drop = {"virtual": "TABLE", "index": "INDEX", "trigger": "TRIGGER"}[st.kind]
            conn.execute(f'DROP {drop} "{st.name}"')
            report.replaced.append(st.name)
        else:
            report.created.append(st.name)
        conn.execute(st.sql)
        if st.kind == "virtual":
            conn.execute(f"INSERT INTO \"{st.name}\"(\"{st.name}\") VALUES ('rebuild')")
    return report
