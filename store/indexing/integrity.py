"""The index checked table by table: the idle integrity sweep's step (``actors/integrity_sweep.py``) and
the salvage's view of rows whose index entries disagree with them.

Boot runs ``PRAGMA quick_check``, which walks every b-tree page but does not compare a table with its
indexes. Damage that leaves the pages well formed (a byte changed inside a row, so its key no longer
matches its index entry) is then found only by a read that trips over it, and until then a wrong value is
served. ``PRAGMA integrity_check(<table>)`` (SQLite 3.33+) checks one table's b-tree and its indexes, so a
sweep can cover the database in steps while the host is idle.

An FTS5 index is more than its shadow tables' b-trees: a leaf that is gone from ``<fts>_data``, or whose
terms no longer agree with ``<fts>_idx``, passes ``integrity_check`` and breaks only the searches that reach
it. FTS5's own ``integrity-check`` command walks the whole index (both search indexes are contentless, so
there is no content table to compare with; the check is of the index's own consistency). Before SQLite
3.44 (whose ``integrity_check`` runs it) the command is an INSERT: it needs a writable connection and
holds the write lock while it runs (:func:`check_fts`). Synchronous, no trio.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from store.indexing.corruption import is_corruption

__all__ = ["check_fts", "check_table", "fts_tables", "TableDamage", "table_damage", "open_fts_checker", "sweep_tables"]

_ROW_MISSING: Final = re.compile(r"^row (\d+) missing from index ")
_PROBLEMS_PER_TABLE: Final = 100
_PARTIAL: Final = re.compile(r"\sWHERE\s(.*)$", re.IGNORECASE | re.DOTALL)


def sweep_tables(conn: sqlite3.Connection) -> list[str]:
    """The ordinary tables (an FTS5 table is checked through its shadow tables), smallest first by name
    length then name: a stable order, so a sweep interrupted by a restart starts over the same way."""
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND sql NOT LIKE 'CREATE VIRTUAL%' "
                        "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'").fetchall()
    return sorted((str(r[0]) for r in rows), key=lambda n: (len(n), n))


def check_table(conn: sqlite3.Connection, table: str) -> list[str]:
    """What ``PRAGMA integrity_check`` finds in ``table`` and its indexes (empty: none). SQLite errors (a
    page that does not read at all) propagate: the caller's read maps them to damage."""
    cur = conn.execute(f"PRAGMA integrity_check({_quoted(table)})")
    try:
        problems = [_text(r[0]) for r in cur.fetchmany(_PROBLEMS_PER_TABLE)]
    finally:
        cur.close()
    return [] if problems == ["ok"] else problems


def fts_tables(conn: sqlite3.Connection) -> list[str]:
    """The FTS5 tables, by name: the sweep's last steps (:func:`check_fts`)."""
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                        "AND sql LIKE 'CREATE VIRTUAL TABLE%USING fts5%'").fetchall()
    return sorted(str(r[0]) for r in rows)


def open_fts_checker(db_path: Path) -> sqlite3.Connection:
    """A writable connection for :func:`check_fts` (its command is an INSERT by syntax; a ``mode=ro``
    reader is refused it). ``busy_timeout`` 0: the check never waits for the DB writer, whose
    transaction holds the write lock; the caller tries again once the writer is idle."""
    conn = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False, timeout=0)
    try:
        conn.execute("PRAGMA busy_timeout = 0")
        conn.execute("PRAGMA trusted_schema = ON")
    except BaseException:
        conn.close()
        raise
    return conn


def check_fts(conn: sqlite3.Connection, table: str) -> list[str]:
    """What FTS5's ``integrity-check`` finds in ``table`` (empty: none), run in a transaction that is
    rolled back: nothing is written. Damage is what the command raises (``SQLITE_CORRUPT_VTAB``, "database
    disk image is malformed"); any other error (busy, interrupted) propagates."""
    name = _quoted(table)
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(f"INSERT INTO {name}({name}, rank) VALUES ('integrity-check', 0)")
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:  # the latter: a message quoting damaged bytes
        if not is_corruption(exc):
            raise
        return [f"fts5 integrity-check: {exc}"]
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    return []


@dataclass(frozen=True, slots=True)
class TableDamage:
    """What ``integrity_check`` of one rowid table says about its rows (:func:`table_damage`)."""

    inconsistent: frozenset[int] = frozenset()
    """Rowids named as missing from one of the table's indexes: a row whose indexed value no longer matches
    its index entry (a byte changed inside it)."""
    hidden: int = 0
    """How many rowids a full index of the table names that no scan of the table finds (the most of any such
    index): rows a damaged page hides from every read of the table, with the pages otherwise well formed. A
    leaf's cell count lowered by a changed byte leaves its last rows out; a child pointer of an interior page,
    or a cell pointer of a leaf, that now names another leaf or cell of the table hides that leaf's rows (or
    that cell's row) and shows others twice, so the scan's count can match the index's. Their bytes cannot be
    read back through SQLite."""


def table_damage(conn: sqlite3.Connection, table: str) -> TableDamage:
    """``integrity_check`` of ``table``, read for its rows (nothing when the check itself cannot run)."""
    try:
        problems = check_table(conn, table)
    except sqlite3.Error:
        return TableDamage()
    missing: dict[str, set[int]] = {}
    tree_damaged = False  # a problem of the table's b-tree or an index's count, not of one row's index entry
    for problem in problems:
        if m := _ROW_MISSING.match(problem):
            missing.setdefault(problem[m.end():], set()).add(int(m.group(1)))
        else:
            tree_damaged = True
    rows: set[int] = set()
    for index, named in missing.items():
        rows |= named - _index_damaged(conn, table, index, named)
    return TableDamage(frozenset(rows), _hidden_rows(conn, table) if tree_damaged else 0)


def _index_damaged(conn: sqlite3.Connection, table: str, index: str, rows: set[int]) -> set[int]:
    """Of ``rows`` (named missing from ``index``), those whose mismatch is the index's damage, not the row's:
    all of them when the index's own b-tree no longer reads (a page of it damaged: its entries cannot testify
    against a row that reads back whole), else those whose entry in it holds text that is not UTF-8 where the
    row's value is (the byte changed in the entry), or, for rows that have no entry at all, as many garbled
    entries naming no row as there are such rows (the changed bytes took the entry's rowid too). Any other
    mismatch cannot tell which side changed: the row stays suspect. A partial index whose condition cannot be
    read is left to testify."""
    try:
        info = conn.execute(f"PRAGMA index_info({_quoted(index)})").fetchall()
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?", (index,)).fetchone()
    except sqlite3.Error:
        return set()
    columns = [_text(r[2]) for r in info if r[2] is not None]
    if not columns or len(columns) != len(info):  # an expression index: nothing here to compare
        return set()
    where = ""
    if sql is not None and sql[0] is not None:
        found = _PARTIAL.search(_text(sql[0]))
        where = f" WHERE {found.group(1)}" if found else ""
    names = ", ".join(_quoted(c) for c in columns)
    entries: dict[int, tuple[object, ...]] = {}
    stray: list[int] = []
    try:
        for row in conn.execute(f"SELECT rowid, {names} FROM {_quoted(table)} INDEXED BY {_quoted(index)}{where} "
                                f"ORDER BY {names}"):
            if row[0] in rows:
                entries[int(row[0])] = tuple(row[1:])
            elif _garbled(tuple(row[1:])):
                stray.append(int(row[0]))
        # a garbled entry whose rowid names no row had its rowid changed with it: it stands for a row named missing
        stray = [r for r in stray if conn.execute(f"SELECT 1 FROM {_quoted(table)} WHERE rowid = ?",
                                                  (r,)).fetchone() is None]
    except sqlite3.DatabaseError as exc:
        # no plan over the index (its condition read back wrong) is no damage of it: it testifies as before
        return set(rows) if is_corruption(exc) else set()
    damaged = {rowid for rowid, entry in entries.items() if _garbled(entry)}
    unmatched = rows - entries.keys()
    if unmatched and len(unmatched) <= len(stray):
        damaged |= unmatched
    return damaged


def _garbled(values: tuple[object, ...]) -> bool:
    """True when a text value is not UTF-8 (read with ``text_factory=bytes``: every text is bytes)."""
    for value in values:
        if isinstance(value, bytes):
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                return True
    return False


def _hidden_rows(conn: sqlite3.Connection, table: str) -> int:
    """The most rowids one of the table's full indexes (a partial index holds fewer by design) names that a scan
    of ``table`` does not find. Not a difference of counts: rows a damaged pointer shows twice (a leaf named by
    two interior cells, a cell pointer naming another cell) would make up for the rows it hides."""
    try:
        scanned = {r[0] for r in conn.execute(f"SELECT rowid FROM {_quoted(table)} NOT INDEXED")}
        full = [_text(r[1]) for r in conn.execute(f"PRAGMA index_list({_quoted(table)})") if not r[4]]
    except sqlite3.Error:
        return 0
    most = 0
    for name in full:
        try:
            named = {r[0] for r in conn.execute(f"SELECT rowid FROM {_quoted(table)} INDEXED BY {_quoted(name)}")}
        except sqlite3.Error:
            continue
        most = max(most, len(named - scanned))
    return most


def _text(value: object) -> str:
    """A problem line as text (a connection reading with ``text_factory=bytes`` gets bytes)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
