"""Search index upkeep: FTS5 options and idle merge steps never change what search returns."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from store.indexing.database import open_reader, open_writer
from store.search.search import search_messages, search_sessions
from store.search.search_upkeep import (
    AUTOMERGE,
    CRISISMERGE,
    CRISISMERGE_DEFERRED,
    FULL_MERGE_FRACTION,
    LEAF_PAGE_BYTES,
    USERMERGE,
    Structure,
    defer_merges,
    merges_deferred,
    read_structure,
    resume_merges,
    segment_count,
    tune_index,
    upkeep_step,
    wants_full_merge,
)
from tests.store.search_corpus import Corpus, open_db

WORDS = ["alpha", "beta", "gamma", "delta", "the", "to", "of", "search", "index", "merge", "日本語", "検索"]
QUERIES = ["the", "alp", "a the", "to the", "日本", "検索", "mma del", "xyzzy", "merge ind"]


def _config(conn: sqlite3.Connection) -> dict[str, object]:
    return dict(conn.execute("SELECT k, v FROM messages_fts_config").fetchall())


def _fragmented(tmp_path: Path) -> sqlite3.Connection:
    """One message per transaction: FTS5 leaves many small segments behind."""
    conn = open_db(tmp_path / "frag.sqlite")
    rng = random.Random(5)
    corpus = Corpus(conn)
    sessions = [corpus.session(title=f"session {i}") for i in range(12)]
    mids = []
    for _ in range(400):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30)))
        mids.append(corpus.message(rng.choice(sessions), text, role=rng.choice(["user", "assistant"]))[1])
    for mid in rng.sample(mids, 40):  # tombstones: their 'delete' entries must survive merges
        conn.execute("UPDATE messages SET deleted = 1 WHERE mid = ?", (mid,))
    conn.execute("UPDATE sessions SET deleted_at = 1 WHERE id = ?", (sessions[0],))
    return conn


def _everything(conn: sqlite3.Connection) -> list[object]:
    out: list[object] = []
    for q in QUERIES:
        out.append(search_sessions(conn, q, limit=100, snippets_per_session=10))
        out.append(search_messages(conn, q, limit=500))
    return out


def _upkeep_until_done(conn: sqlite3.Connection) -> int:
    steps = 0
    while True:
        conn.execute("BEGIN IMMEDIATE")
        merged = upkeep_step(conn, pages=4)
        conn.execute("COMMIT")
        if not merged:
            return steps
        steps += 1
        assert steps < 100_000


def test_tune_index_sets_fts5_options_once(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "t.sqlite")
    assert "pgsz" not in _config(conn)
    assert tune_index(conn) is True
    assert _config(conn)["pgsz"] == LEAF_PAGE_BYTES and _config(conn)["usermerge"] == USERMERGE
    assert _config(conn)["automerge"] == AUTOMERGE == 8
    assert tune_index(conn) is False  # idempotent


def test_the_writer_tunes_new_and_existing_databases(tmp_path: Path) -> None:
    conn, _ = open_writer(tmp_path / "pi.sqlite", quarantine_dir=tmp_path / "q", now_ms=1)
    try:
        assert _config(conn)["pgsz"] == LEAF_PAGE_BYTES
        conn.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES ('usermerge', 4)")  # an older file
    finally:
        conn.close()
    conn, _ = open_writer(tmp_path / "pi.sqlite", quarantine_dir=tmp_path / "q", now_ms=2)
    try:
        assert _config(conn)["usermerge"] == USERMERGE
    finally:
        conn.close()


def test_an_older_file_gets_the_writers_automerge_at_open(tmp_path: Path) -> None:
    """``automerge`` lives in the file (``messages_fts_config``): a file written before it was tuned, with
    FTS5's default (no row: 4) or any other value, has the writer's at its next open."""
    for older in (None, 4):
        path = tmp_path / f"pi-{older}.sqlite"
        conn, _ = open_writer(path, quarantine_dir=tmp_path / "q", now_ms=1)
        try:
            conn.execute("DELETE FROM messages_fts_config WHERE k = 'automerge'")
            if older is not None:
                conn.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES ('automerge', ?)", (older,))
            assert _config(conn).get("automerge") == older
        finally:
            conn.close()
        conn, _ = open_writer(path, quarantine_dir=tmp_path / "q", now_ms=2)
        try:
            assert _config(conn)["automerge"] == AUTOMERGE
        finally:
            conn.close()


def test_deferred_merges_leave_each_commit_its_own_segment_until_resumed(tmp_path: Path) -> None:
    """``defer_merges`` (boot's catch-up on a disk short of room): each write transaction adds its own segment
    and folds none, not even past FTS5's ``crisismerge`` of 16; the writer's ``tune_index`` at open leaves them
    deferred. ``resume_merges`` puts ``automerge`` and ``crisismerge`` back, and the next write folds the
    level. Search returns the same throughout."""
    conn = open_db(tmp_path / "d.sqlite")
    tune_index(conn)
    corpus = Corpus(conn)
    sid = corpus.session(title="deferred")
    corpus.message(sid, "alpha beta gamma")
    conn.execute("BEGIN IMMEDIATE")
    defer_merges(conn)
    conn.execute("COMMIT")
    assert merges_deferred(conn)
    assert _config(conn)["automerge"] == 0 and _config(conn)["crisismerge"] == CRISISMERGE_DEFERRED
    start = segment_count(conn)
    assert start is not None
    for i in range(CRISISMERGE + 4):  # one autocommit transaction each
        corpus.message(sid, f"delta epsilon {i} the merge index")
    assert segment_count(conn) == start + CRISISMERGE + 4
    assert tune_index(conn) is False and merges_deferred(conn)  # as the writer's open finds them
    before = _everything(conn)

    conn.execute("BEGIN IMMEDIATE")
    assert resume_merges(conn) is True
    conn.execute("COMMIT")
    assert _config(conn)["automerge"] == AUTOMERGE and _config(conn)["crisismerge"] == CRISISMERGE
    assert not merges_deferred(conn) and resume_merges(conn) is False
    assert _everything(conn) == before
    corpus.message(sid, "zeta")
    after = segment_count(conn)
    assert after is not None and after < start + CRISISMERGE  # the level was folded
    conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")


def test_upkeep_merges_a_fragmented_index_into_one_segment_and_changes_no_result(tmp_path: Path) -> None:
    conn = _fragmented(tmp_path)
    before = _everything(conn)
    segments_before = segment_count(conn)
    assert segments_before is not None and segments_before >= 4
    tune_index(conn)
    assert _upkeep_until_done(conn) >= 1
    assert segment_count(conn) == 1  # everything merged into one segment
    conn.execute("BEGIN IMMEDIATE")
    assert upkeep_step(conn) is False  # nothing left to do
    conn.execute("COMMIT")
    conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")  # raises if damaged
    assert _everything(conn) == before
    reader = open_reader(tmp_path / "frag.sqlite")
    try:
        assert _everything(reader) == before
    finally:
        reader.close()


def test_a_rolled_back_upkeep_step_leaves_the_index_as_it_was(tmp_path: Path) -> None:
    conn = _fragmented(tmp_path)
    tune_index(conn)
    before = _everything(conn)
    segments = segment_count(conn)
    conn.execute("BEGIN IMMEDIATE")
    assert upkeep_step(conn, pages=4) is True
    conn.execute("ROLLBACK")
    assert segment_count(conn) == segments
    assert _everything(conn) == before


def test_upkeep_step_refuses_a_non_positive_budget(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "t.sqlite")
    with pytest.raises(ValueError, match="pages must be >= 1"):
        upkeep_step(conn, pages=0)


def test_segment_count_of_an_empty_index_and_an_unknown_layout(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "t.sqlite")
    assert segment_count(conn) == 0
    conn.execute("UPDATE messages_fts_data SET block = X'00000000FF000001' WHERE id = 10")
    assert segment_count(conn) is None


def test_writes_after_a_full_merge_are_merged_again(tmp_path: Path) -> None:
    conn = _fragmented(tmp_path)
    tune_index(conn)
    _upkeep_until_done(conn)
    assert segment_count(conn) == 1
    corpus = Corpus(conn)
    sid = corpus.session("late-session", title="late")
    for i in range(30):  # one transaction each: new small segments
        corpus.message(sid, f"late message {i} about gamma", msg_id=f"late-{i}")
    assert (segment_count(conn) or 0) > 1
    before = _everything(conn)
    assert _upkeep_until_done(conn) > 0
    assert segment_count(conn) == 1
    assert _everything(conn) == before
    assert _upkeep_until_done(conn) == 0  # and then nothing is left to do


def test_full_merge_policy() -> None:
    one = Structure(((0, (1000,)),))
    assert not wants_full_merge(one)
    small = Structure(((0, (1,)), (0, ()), (0, (1000,))))
    assert not wants_full_merge(small)  # 0.1 % outside the largest
    outside = int(1000 * FULL_MERGE_FRACTION / (1 - FULL_MERGE_FRACTION)) + 1
    grown = Structure(((0, (outside,)), (0, (1000,))))
    assert wants_full_merge(grown)
    below = Structure(((0, (1, 1)), (0, (3,)), (0, (1000,))))
    assert not wants_full_merge(below)  # 0.5 %: level merges only (the level holding two segments)
    assert grown.segments == 2 and grown.largest == 1000 and not grown.merging
    assert Structure(((2, (5, 5)),)).merging


def test_read_structure_refuses_a_record_it_cannot_decode_exactly(tmp_path: Path) -> None:
    conn = _fragmented(tmp_path)
    good = conn.execute("SELECT block FROM messages_fts_data WHERE id = 10").fetchone()[0]
    assert read_structure(conn) is not None
    for bad in (good + b"\x00", good[:-1], good[:4] + b"\xff\x00\x00\x01" + good[4:]):
        conn.execute("UPDATE messages_fts_data SET block = ? WHERE id = 10", (bad,))
        assert read_structure(conn) is None
