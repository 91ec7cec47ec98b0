"""Upkeep of the trigram search index (``messages_fts``): leaf page size and merges.

FTS5 stores the index as segments (b-trees); every write transaction adds a
small one and its automerge folds them together level by level, leaving up to
``AUTOMERGE - 1`` segments per level. A phrase query reads the doclist of each
of its trigrams in every segment, so the same data costs more when it is
spread over more segments. Two measures, both FTS5's own documented knobs:

* :func:`tune_index` (applied whenever the writer opens the database, and by
  the bench that builds its own database): leaf pages of ``LEAF_PAGE_BYTES``
  instead of FTS5's default 4,050 bytes (fewer page reads per long doclist),
  ``automerge`` ``AUTOMERGE`` instead of 4 (the writes merge fewer times: a
  level is folded once it holds 8 segments, not 4, so while writes keep coming
  each indexed byte is rewritten log8 rather than log4 of the segments
  written: two thirds as often), and ``usermerge``
  2, so that an explicit ``merge`` folds any level that holds two segments.
* :func:`upkeep_step` (run by the DB writer when it has been idle, see
  ``actors.db_writer``): one bounded FTS5 ``merge`` of about ``MERGE_PAGES``
  leaf pages; it reports whether there was anything to do, so the caller stops
  when the work is done. Two kinds of merge, chosen from the index's structure
  record (:func:`read_structure`): when the segments other than the largest
  hold at least ``FULL_MERGE_FRACTION`` of the pages, a step of a merge of
  every segment into one (FTS5 ``merge`` with a negative budget, resumable
  across transactions); otherwise a step of folding any level that holds two
  segments (positive budget, ``usermerge`` 2). The fraction bounds the cost:
  the whole index is rewritten once per 2 % of growth, in idle time only.
* :func:`defer_merges` / :func:`resume_merges`: no automatic merge at all
  (``automerge`` 0, ``crisismerge`` at its largest) while boot catches the index
  up on a disk short of room, and after it while the disk stays so: an
  automatic merge folds a level in one transaction, which needs up to the
  index's size free; the idle steps above need about one step's pages.

What it buys, measured on the bench's 1,000,000 messages: a phrase of common
trigrams reads each trigram's doclist in every segment, and the per-row merge
across segments costs as much as the extra data; 3 segments (5 % of the pages
outside the largest) made such 8-character phrases 11–15 % slower than one
segment, 18 segments 25–30 % slower. The idle merges undo what the larger
``automerge`` leaves behind a burst of writes. Nothing here changes what a
query returns.

``automerge`` measured (batches of 64 ~1 KB messages through ``index_messages``,
fresh and on an index of 51,200 merged messages; the "automerge" variants of
``scripts/bench_index_variants.py``): 8 instead of 4 cuts the index SQL's CPU
per message by 9–15 % (instructions counted: 875k to 792k per message, the
trigram index's share 658k to 575k) and costs the idle merges nothing more;
16 or 0 (every merge left to FTS5's ``crisismerge``, 16 segments rewritten in
one transaction) cut no further. What stays: tokenizing and hashing ~1,000
trigrams per message (~31 µs of ~85 µs), whatever the options.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

LEAF_PAGE_BYTES = 32_000
"""FTS5 ``pgsz`` (its maximum is 64 KiB); only segments written after the change use it."""

AUTOMERGE = 8
"""FTS5 ``automerge``: a write transaction starts folding a level once it holds this many segments."""

USERMERGE = 2
"""FTS5 ``usermerge``: a ``merge`` command folds a level once it holds this many segments."""

MERGE_PAGES = 32
"""Leaf pages one :func:`upkeep_step` asks FTS5 to write (it finishes the doclist it is in)."""

CRISISMERGE = 16
"""FTS5's own ``crisismerge``: a write transaction folds a whole level at once when it holds this many segments."""

CRISISMERGE_DEFERRED = 1999
"""The largest ``crisismerge`` FTS5 takes (its segment limit less one): with ``automerge`` 0, merges deferred."""

_TUNING = {"pgsz": LEAF_PAGE_BYTES, "automerge": AUTOMERGE, "usermerge": USERMERGE}


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
    deferred = merges_deferred(conn)
    for key, value in _TUNING.items():
        if key == "automerge" and deferred:
            continue  # boot's catch-up left merges deferred (it was stopped): the next boot resumes them
        if current.get(key) != value:
            conn.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES (?, ?)", (key, value))
            changed = True
    return changed


def _set(conn: sqlite3.Connection, key: str, value: int) -> None:
    conn.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES (?, ?)", (key, value))


def defer_merges(conn: sqlite3.Connection) -> None:
    """No FTS5 merge in the write transactions that follow (``automerge`` 0, ``crisismerge`` at its largest), until
    :func:`resume_merges`: each writes its own new segment and nothing more. For boot's catch-up of transcript
    lines the index lacks on a disk that was full: a merge folds a level's segments in one transaction (measured:
    a 70 KB tail's commit wrote 8.2 MB of WAL with merges, 0.56 MB without), and that room is what a start on a
    full disk lacks. Persisted in ``messages_fts_config``; the caller commits."""
    _set(conn, "automerge", 0)
    _set(conn, "crisismerge", CRISISMERGE_DEFERRED)


def merges_deferred(conn: sqlite3.Connection) -> bool:
    """:func:`defer_merges` is in force (a boot stopped before it resumed them leaves it so)."""
    row = conn.execute("SELECT v FROM messages_fts_config WHERE k = 'crisismerge'").fetchone()
    return row is not None and row[0] == CRISISMERGE_DEFERRED


def resume_merges(conn: sqlite3.Connection) -> bool:
    """Undo :func:`defer_merges` (``automerge`` back to :data:`AUTOMERGE`, ``crisismerge`` to FTS5's own); True if
    they were deferred. The segments written meanwhile are folded by later writes and the idle merges
    (:func:`upkeep_step`). The caller commits."""
    if not merges_deferred(conn):
        return False
    _set(conn, "automerge", AUTOMERGE)
    _set(conn, "crisismerge", CRISISMERGE)
    return True


FULL_MERGE_FRACTION = 0.02
"""Merge every segment into one once the others hold this share of the index's pages."""

@dataclass(frozen=True)
class Structure:
    """The index's segments, as FTS5's structure record lists them."""

    levels: tuple[tuple[int, tuple[int, ...]], ...]
    """Per level: (segments of an unfinished merge, leaf pages of each segment)."""

    @property
    def segments(self) -> int:
        return sum(len(pages) for _, pages in self.levels)

    @property
    def pages(self) -> int:
        return sum(sum(pages) for _, pages in self.levels)

    @property
    def largest(self) -> int:
        return max((max(pages) for _, pages in self.levels if pages), default=0)

    @property
    def merging(self) -> bool:
        return any(n for n, _ in self.levels)


def read_structure(conn: sqlite3.Connection) -> Structure | None:
    """Decode FTS5's structure record (``messages_fts_data`` row 10).

    The layout (fts5_index.c, ``fts5StructureDecode``): a 4-byte cookie, then
    varints: levels, segments, write counter; per level: segments being
    merged, segments; per segment: id, first page, last page. ``None`` when
    the record does not decode exactly to that layout (a newer FTS5 writes a
    version marker and more fields per segment): callers then only use the
    merges FTS5 plans itself.
    """
    row = conn.execute("SELECT block FROM messages_fts_data WHERE id = 10").fetchone()
    if row is None or not isinstance(row[0], bytes):
        return None
    buf: bytes = row[0]
    if len(buf) < 7 or buf[4:8] == b"\xff\x00\x00\x01":  # too short / FTS5_STRUCTURE_V2
        return None
    try:
        n_levels, pos = _varint(buf, 4)
        n_segments, pos = _varint(buf, pos)
        _writes, pos = _varint(buf, pos)
        levels = []
        for _ in range(n_levels):
            n_merge, pos = _varint(buf, pos)
            n_seg, pos = _varint(buf, pos)
            pages = []
            for _ in range(n_seg):
                _segid, pos = _varint(buf, pos)
                first, pos = _varint(buf, pos)
                last, pos = _varint(buf, pos)
                if last < first:
                    return None
                pages.append(last - first + 1)
            if n_merge > n_seg:
                return None
            levels.append((n_merge, tuple(pages)))
    except IndexError:
        return None
    structure = Structure(tuple(levels))
    if pos != len(buf) or structure.segments != n_segments:
        return None
    return structure


def segment_count(conn: sqlite3.Connection) -> int | None:
    """How many segments the index holds (None: unknown structure layout)."""
    structure = read_structure(conn)
    return structure.segments if structure is not None else None


def wants_full_merge(structure: Structure) -> bool:
    """True when the segments other than the largest are worth merging into it."""
    if structure.segments <= 1:
        return False
    outside = structure.pages - structure.largest
    return outside >= FULL_MERGE_FRACTION * structure.pages


def upkeep_step(conn: sqlite3.Connection, pages: int = MERGE_PAGES) -> bool:
    """One bounded merge step (see the module docstring); True when it merged something.

    Must run inside the caller's write transaction; a rollback undoes it. An
    unfinished merge is always continued first (FTS5 resumes it whatever the
    sign of the budget).
    """
    if pages < 1:
        raise ValueError(f"pages must be >= 1, got {pages}")
    structure = read_structure(conn)
    full = structure is not None and not structure.merging and wants_full_merge(structure)
    before = conn.total_changes
    conn.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES ('merge', ?)", (-pages if full else pages,))
    # FTS5 documents the test: a 'merge' that did work changes more than one row.
    return conn.total_changes - before >= 2


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
