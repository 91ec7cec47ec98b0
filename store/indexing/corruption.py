"""Whether an SQLite error means the index database is damaged (RELIABILITY.md row 7).

One answer for every place that meets the index: the boot probe, the DB writer and the read pool.
Damage shows in more ways than ``SQLITE_CORRUPT``: a stretch of random bytes over ``pi.sqlite`` can leave
its b-tree pages well formed and still break what they hold, so the error a read meets is one of

- ``SQLITE_CORRUPT`` (and its extended codes) or ``SQLITE_NOTADB``, or their messages;
- "vtable constructor failed", "invalid fts5 file format", "no such tokenizer": the FTS5 table's shadow tables,
  its record of its own format or its schema row are unreadable or changed. The host creates ``messages_fts``
  with the trigram tokenizer only after checking at boot that this SQLite has it, so its absence later is
  damage to the schema row;
- "Could not decode to UTF-8 column": a text value that is not UTF-8. The host writes every text through
  ``sqlite3``'s binding of a Python ``str`` (always valid UTF-8), so such a value is damage, never data;
- a ``UnicodeDecodeError`` whose bytes are one of these messages: SQLite's message quotes a damaged schema
  row's name ("malformed database schema (kv\\xff)"), which ``sqlite3`` cannot decode into its error; or a
  constraint's message quoting a damaged CHECK expression ("CHECK constraint failed: status IN (...,
  'complet\\xe7d', ...)": a byte changed inside a string literal leaves the schema parseable);
- "no such column: X" / "no such table: X" / "table T has no column named X" for a table or column the
  host's own schema (``store/upgrade/schema.py``) defines: a damaged byte in its CREATE statement left it
  parseable under another name. Boot checked the schema version, so the file had it; a name the schema does
  not define is a host bug (INTERNAL), never a reason to quarantine;
- a stored definition that is not the host's (:func:`altered_definition`): a byte changed into another
  readable one inside a CHECK's string literal (``'completed'`` read ``'complebed'``) leaves the schema
  parseable and its messages decodable, and SQLite refuses a valid value with a plain "CHECK constraint
  failed". Only a constraint failure on a value the host wrote asks it (``group_commit.attempt``).

Anything else (busy, I/O, a full disk, a constraint, a host bug) is not damage: a healthy index is never
quarantined for it.
"""

from __future__ import annotations

import re
import sqlite3

from store.upgrade.schema import DDL, apply_schema
from store.upgrade.schema_rebuild import normalize_sql, parse_statement

__all__ = ["altered_definition", "is_corruption"]

_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26
_MARKERS = ("malformed", "not a database", "disk image", "corrupt", "vtable constructor failed",
            "invalid fts5 file format", "no such tokenizer", "could not decode to utf-8")
# Messages that quote the schema (a CHECK's expression, a constraint's columns): undecodable, they quote
# damaged schema bytes, since the host's schema is UTF-8 (decodable, such a failure is told apart elsewhere:
# ``group_commit.attempt``)
_QUOTING_SCHEMA = ("constraint failed",)


def is_corruption(exc: BaseException) -> bool:
    """``exc`` is an ``sqlite3.DatabaseError`` that a damaged database file raises (or the
    ``UnicodeDecodeError`` of such an error's message)."""
    if isinstance(exc, UnicodeDecodeError):
        message = bytes(exc.object).decode("utf-8", "replace").lower()
        return any(marker in message for marker in (*_MARKERS, *_QUOTING_SCHEMA))
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and (code & 0xFF) in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return True
    text = str(exc).lower()
    if any(marker in text for marker in _MARKERS):
        return True
    missing = _MISSING.search(text)
    return missing is not None and (missing.group(1) or missing.group(2)) in _schema_names()


_MISSING = re.compile(r"no such (?:table|column): (?:\w+\.)*(\w+)|has no column named (\w+)")


def _schema_names() -> frozenset[str]:
    """Every table and column name the host's schema defines (built in memory: such errors are rare)."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        apply_schema(conn)
        tables = [str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        names = {t.lower() for t in tables}
        for table in tables:
            names.update(str(r[1]).lower() for r in conn.execute(f'PRAGMA table_info("{table}")'))
        return frozenset(names)
    finally:
        conn.close()


def altered_definition(conn: sqlite3.Connection) -> str | None:
    """The first object of the host's schema (``store/upgrade/schema.py``) whose stored definition in
    ``sqlite_master`` is not the one the host creates (up to layout, :func:`normalize_sql`), or that is
    missing; ``None`` when every one is the host's. Every layout the host migrates from ends in exactly the
    fresh definitions (tests/migrations), and nothing drops or alters an object at runtime, so a difference
    is damage. Objects the host's schema does not name (FTS5 shadow tables, autoindexes) are not compared.
    Built in memory each time, like :func:`_schema_names`: asked only after a constraint failed."""
    stored = {str(name): str(sql or "") for name, sql in conn.execute("SELECT name, sql FROM sqlite_master")}
    for name, sql in _host_definitions().items():
        if name not in stored:
            return f"{name} is missing"
        if normalize_sql(stored[name]) != sql:
            return f"the stored definition of {name} is not the host's"
    return None


def _host_definitions() -> dict[str, str]:
    """Every schema object the host's DDL creates, by name: its definition as ``sqlite_master`` holds it once
    the DDL ran (an ``ALTER TABLE ... ADD COLUMN`` rewrites its table's), normalized."""
    named = {parse_statement(s).name for s in DDL if s.lstrip().upper().startswith("CREATE")}
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        apply_schema(conn)
        return {str(name): normalize_sql(str(sql or "")) for name, sql in
                conn.execute("SELECT name, sql FROM sqlite_master") if name in named}
    finally:
        conn.close()
