"""Two sessions that wrote the same new message id before either committed never wedge the index."""

from __future__ import annotations

import sqlite3

import pytest

from store.indexing import index
from store.indexing.index import IndexRecord


@pytest.fixture
def conn(conn: sqlite3.Connection) -> sqlite3.Connection:
    """The shared fresh database (tests/dbkit.py) with sessions ``a`` and ``b``."""
    for sid in ("a", "b"):
        index.insert_session(conn, sid, now_ms=1)
    return conn


def _rec(mid: str, text: str) -> IndexRecord:
    return IndexRecord({"type": "message", "id": mid, "role": "user", "blocks": [{"type": "text", "text": text}]},
                       100, 50)


def _ids(conn: sqlite3.Connection, sid: str) -> list[str]:
    return [r[0] for r in conn.execute("SELECT id FROM messages WHERE session_id = ? ORDER BY seq", (sid,))]


def test_tail_index_of_a_colliding_id_takes_the_session_spelling(conn: sqlite3.Connection) -> None:
    index.index_messages(conn, "a", [_rec("x", "from a")], indexed_len=150, file_epoch="e", now_ms=2)
    refs = index.index_messages(conn, "b", [_rec("x", "from b")], indexed_len=150, file_epoch="e", now_ms=3)
    assert refs[0]["id"] == "b:x" and refs[0]["seq"] == 1
    assert _ids(conn, "a") == ["x"] and _ids(conn, "b") == ["b:x"]
    # the same line indexed again (catch-up after a crash) is a replacement, not a second row
    again = index.index_messages(conn, "b", [_rec("x", "from b, v2")], indexed_len=200, file_epoch="e", now_ms=4)
    assert again[0]["seq"] == 1 and _ids(conn, "b") == ["b:x"]


def test_full_reindex_with_a_colliding_id_succeeds(conn: sqlite3.Connection) -> None:
    index.index_messages(conn, "a", [_rec("x", "from a")], indexed_len=150, file_epoch="e", now_ms=2)
    index.reindex_session(conn, "b", [_rec("y", "one"), _rec("x", "two")], [], ["x"],
                          indexed_len=300, file_epoch="f", now_ms=5)
    assert _ids(conn, "b") == ["y", "b:x"]
    assert conn.execute("SELECT deleted FROM messages WHERE id = 'b:x'").fetchone()[0] == 1
    assert _ids(conn, "a") == ["x"]


def test_a_turn_of_another_session_is_never_linked(conn: sqlite3.Connection) -> None:
    """A message of session b naming a turn of session a keeps no turn in the index (usage, decisions and
    turn listings follow messages.turn_id); its own session's turn is linked."""
    conn.execute("INSERT INTO turns(id, session_id, started_at, status) VALUES ('ta', 'a', 1, 'running')")
    conn.execute("INSERT INTO turns(id, session_id, started_at, status) VALUES ('tb', 'b', 1, 'running')")
    foreign = IndexRecord({"type": "message", "id": "m1", "role": "user", "turnId": "ta",
                           "blocks": [{"type": "text", "text": "steer"}]}, 100, 50)
    own = IndexRecord({"type": "message", "id": "m2", "role": "user", "turnId": "tb",
                       "blocks": [{"type": "text", "text": "mine"}]}, 150, 50)
    refs = index.index_messages(conn, "b", [foreign, own], indexed_len=200, file_epoch="e", now_ms=2)
    assert [r["turnId"] for r in refs] == [None, "tb"]
    assert conn.execute("SELECT id, turn_id FROM messages ORDER BY seq").fetchall() == [("m1", None), ("m2", "tb")]
    index.reindex_session(conn, "b", [foreign, own], [], [], indexed_len=200, file_epoch="e", now_ms=3)
    assert conn.execute("SELECT id, turn_id FROM messages ORDER BY seq").fetchall() == [("m1", None), ("m2", "tb")]
