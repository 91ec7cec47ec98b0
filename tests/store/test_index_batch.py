"""One index op of many messages: the seqs, mids, turns and refs of a row per message, with the session's row
and each turn read once per op, not once per message (``store.indexing.index.index_messages``)."""

from __future__ import annotations

import sqlite3

import pytest

from store.errors import CorruptData
from store.indexing import index
from store.indexing.index import IndexRecord
from store.upgrade.schema import message_mid


@pytest.fixture
def conn(conn: sqlite3.Connection) -> sqlite3.Connection:
    """The shared fresh database (tests/dbkit.py) with sessions ``a`` and ``b``."""
    for sid in ("a", "b"):
        index.insert_session(conn, sid, now_ms=1)
    conn.execute("INSERT INTO turns(id, session_id, started_at, status) VALUES ('ta', 'a', 1, 'running')")
    conn.execute("INSERT INTO turns(id, session_id, started_at, status) VALUES ('tb', 'b', 1, 'running')")
    return conn


def _rec(mid: str, text: str, offset: int, *, turn: str | None = None, seq: int | None = None) -> IndexRecord:
    record = {"type": "message", "id": mid, "role": "user", "createdAt": "2026-01-02T03:04:05.678Z",
              "blocks": [{"type": "text", "text": text}]}
    if turn is not None:
        record["turnId"] = turn
    return IndexRecord(record, offset, 10, seq)


def _statements(conn: sqlite3.Connection) -> list[str]:
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    return seen


def test_a_batch_gives_each_new_message_the_next_seq_and_counts_them_in_one_statement(
        conn: sqlite3.Connection) -> None:
    index.index_messages(conn, "b", [_rec("x", "b holds x", 0)], indexed_len=10, file_epoch="e", now_ms=2)
    index.index_messages(conn, "a", [_rec("a0", "first", 0)], indexed_len=10, file_epoch="e", now_ms=2)
    items = [_rec(f"m{i}", f"text {i}", 10 + 10 * i, turn=("ta", "tb", None)[i % 3]) for i in range(40)]
    items[5] = _rec("x", "a writes x too", 60)  # b holds x: this row takes the D444 spelling a:x
    items[9] = _rec("a0", "first, again", 100)  # a replacement: the row keeps seq 1 and takes no new seq
    seen = _statements(conn)
    refs = index.index_messages(conn, "a", items, indexed_len=410, file_epoch="e", now_ms=3)
    conn.set_trace_callback(None)
    assert [r["seq"] for r in refs] == [2 + i for i in range(9)] + [1] + [11 + i for i in range(30)]
    assert refs[5]["id"] == "a:x" and refs[9]["id"] == "a0"
    assert all(r["sessionId"] == "a" and r["createdAt"] == 1767323045678 for r in refs)
    assert conn.execute("SELECT last_seq FROM sessions WHERE id = 'a'").fetchone()[0] == 40
    ordinal = conn.execute("SELECT ordinal FROM sessions WHERE id = 'a'").fetchone()[0]
    rows = {mid: (seq, m, turn) for mid, seq, m, turn in conn.execute(
        "SELECT id, seq, mid, turn_id FROM messages WHERE session_id = 'a'")}
    assert len(rows) == 40 and rows["a0"][0] == 1 and rows["a:x"][0] == 7
    assert all(m == message_mid(ordinal, seq) for seq, m, _ in rows.values())
    # its own session's turn is linked, another session's never; the ref says what the row holds
    assert [rows[r["id"]][2] for r in refs[:4]] == ["ta", None, None, "ta"]
    assert [r["turnId"] for r in refs[:4]] == ["ta", None, None, "ta"]
    # the session's row: its seqs read once and written once, its time and index mark; each turn read once
    assert len([s for s in seen if s.startswith("UPDATE sessions")]) == 3
    assert len([s for s in seen if "FROM turns" in s and not s.startswith("--")]) == 2
    # the next op goes on from there
    more = index.index_messages(conn, "a", [_rec("m99", "later", 410)], indexed_len=420, file_epoch="e", now_ms=4)
    assert more[0]["seq"] == 41


def test_a_seq_acknowledged_otherwise_than_the_index_would_give_is_refused(conn: sqlite3.Connection) -> None:
    index.index_messages(conn, "a", [_rec("a0", "first", 0)], indexed_len=10, file_epoch="e", now_ms=2)
    items = [_rec("a1", "second", 10, seq=2), _rec("a2", "third", 20, seq=4)]
    with pytest.raises(CorruptData, match="acknowledged as seq 4") as caught:
        index.index_messages(conn, "a", items, indexed_len=None, file_epoch="e", now_ms=3)
    assert caught.value.data == {"sessionId": "a", "seq": 4, "indexSeq": 3}
