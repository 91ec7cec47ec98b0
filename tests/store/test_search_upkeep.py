"""Search index upkeep: FTS5 options and idle merge steps never change what search returns."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from store.database import open_reader, open_writer
from store.search import search_messages, search_sessions
from store.search_upkeep import LEAF_PAGE_BYTES, USERMERGE, merge_step, segment_count, tune_index
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


def test_tune_index_sets_fts5_options_once(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "t.sqlite")
    assert "pgsz" not in _config(conn)
    assert tune_index(conn) is True
    assert _config(conn)["pgsz"] == LEAF_PAGE_BYTES and _config(conn)["usermerge"] == USERMERGE
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


def test_merge_steps_fold_segments_and_change_no_result(tmp_path: Path) -> None:
    conn = _fragmented(tmp_path)
    before = _everything(conn)
    segments_before = segment_count(conn)
    assert segments_before is not None and segments_before >= 4
    tune_index(conn)
    steps = 0
    while True:
        conn.execute("BEGIN IMMEDIATE")
        merged = merge_step(conn, pages=2)
        conn.execute("COMMIT")
        if not merged:
            break
        steps += 1
        assert steps < 10_000
    segments_after = segment_count(conn)
    assert steps >= 2  # small steps: the work really was split
    assert segments_after is not None and segments_after < segments_before
    conn.execute("BEGIN IMMEDIATE")
    assert merge_step(conn) is False  # nothing left to do
    conn.execute("COMMIT")
    conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")  # raises if damaged
    assert _everything(conn) == before
    reader = open_reader(tmp_path / "frag.sqlite")
    try:
        assert _everything(reader) == before
    finally:
        reader.close()


def test_a_rolled_back_merge_step_leaves_the_index_as_it_was(tmp_path: Path) -> None:
    conn = _fragmented(tmp_path)
    tune_index(conn)
    before = _everything(conn)
    segments = segment_count(conn)
    conn.execute("BEGIN IMMEDIATE")
    assert merge_step(conn, pages=4) is True
    conn.execute("ROLLBACK")
    assert segment_count(conn) == segments
    assert _everything(conn) == before


def test_merge_step_refuses_a_non_positive_budget(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "t.sqlite")
    with pytest.raises(ValueError, match="pages must be >= 1"):
        merge_step(conn, pages=0)


def test_segment_count_of_an_empty_index_and_an_unknown_layout(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "t.sqlite")
    assert segment_count(conn) == 0
    conn.execute("UPDATE messages_fts_data SET block = X'00000000FF000001' WHERE id = 10")
    assert segment_count(conn) is None
