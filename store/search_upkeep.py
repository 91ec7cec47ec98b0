"""Upkeep of the trigram search index (``messages_fts``): leaf page size and merges.

FTS5 stores the index as segments (b-trees); every write transaction adds a
small one and its automerge folds them together level by level, leaving up to
three segments per level (``usermerge``/``automerge`` 4). A phrase query reads
the doclist of each of its trigrams in every segment, so the same data costs
more when it is spread over more segments. Two measures, both FTS5's own
documented knobs:

* :func:`tune_index` (applied whenever the writer opens the database, and by
  the bench that builds its own database): leaf pages of ``LEAF_PAGE_BYTES``
  instead of FTS5's default 4,050 bytes (fewer page reads per long doclist)
  and ``usermerge`` 2, so that an explicit ``merge`` folds any level that
  holds two segments.
* :func:`merge_step` (run by the DB writer when it has been idle, see
  ``actors.db_writer``): one bounded FTS5 ``merge`` of at most about
  ``MERGE_PAGES`` leaf pages; it reports whether there was anything to do,
  so the caller stops once the index holds at most one segment per level.

Measured at 1,000,000 messages (``docs/bench/report.md``): 8-character phrase
queries made only of the most common trigrams cost about 10 % less after the
idle merges, and the larger leaves take another 5–15 % off. Neither changes
what a query returns.
"""

from __future__ import annotations

import sqlite3

LEAF_PAGE_BYTES = 32_000
"""FTS5 ``pgsz`` (its maximum is 64 KiB); only segments written after the change use it."""

USERMERGE = 2
"""FTS5 ``usermerge``: a ``merge`` command folds a level once it holds this many segments."""

MERGE_PAGES = 32
"""Leaf pages one :func:`merge_step` writes at most (FTS5 finishes the doclist it is in)."""

_TUNING = {"pgsz": LEAF_PAGE_BYTES, "usermerge": USERMERGE}


def tune_index(conn: sqlite3.Connection) -> bool:
    """Set the index's FTS5 options (persisted in ``messages_fts_config``); True if any changed.

    Idempotent. Runs in its own statement(s); the caller commits (autocommit
    connections commit each statement).
    """
    current = dict(
        conn.execute(
            "SELECT k, v FROM messages_fts_config WHERE k IN (" + ",".join("?" for _ in _TUNING) + ")",
            tuple(_TUNING),
        ).fetchall()
    )
    changed = False
    for key, value in _TUNING.items():
        if current.get(key) != value:
            conn.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES (?, ?)", (key, value))
            changed = True
    return changed


def merge_step(conn: sqlite3.Connection, pages: int = MERGE_PAGES) -> bool:
    """One incremental FTS5 merge of at most about ``pages`` leaf pages.

    Returns True when it merged something (call again), False when no level
    holds ``USERMERGE`` segments (nothing to do). FTS5 documents the test: a
    ``merge`` that did work changes more than one row (``total_changes``).
    Must run inside the caller's write transaction; a rollback undoes it.
    """
    if pages < 1:
        raise ValueError(f"pages must be >= 1, got {pages}")
    before = conn.total_changes
    conn.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES ('merge', ?)", (pages,))
    return conn.total_changes - before >= 2


def segment_count(conn: sqlite3.Connection) -> int | None:
    """How many segments the index holds, read from FTS5's structure record.

    For reports and tests only (nothing decides on it). ``None`` when the
    record has a layout this reader does not know (newer FTS5 versions).
    """
    row = conn.execute("SELECT block FROM messages_fts_data WHERE id = 10").fetchone()
    if row is None or not isinstance(row[0], bytes) or len(row[0]) < 5:
        return None
    block: bytes = row[0]
    if block[4:8] == b"\xff\x00\x00\x01":  # FTS5_STRUCTURE_V2 marker (SQLite 3.45+)
        return None
    try:
        _levels, pos = _varint(block, 4)
        segments, _ = _varint(block, pos)
    except IndexError:
        return None
    return segments


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """SQLite's big-endian varint (1–9 bytes) at ``pos``: (value, next position)."""
    value = 0
    for i in range(9):
        byte = buf[pos]
        pos += 1
        if i == 8:
            return (value << 8) | byte, pos
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value, pos
    raise AssertionError("unreachable")
