"""The filter of indexed message ids (``store/indexing/message_ids.py``) and the append's id lookup that
it lets skip (``store.indexing.appends.gather``): never a false negative, fed by every write of a
``messages`` row through the writer's connection."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

from store.indexing import index
from store.indexing.appends import AppendRequest, Held, gather, known_without_reads
from store.indexing.database import open_reader, open_writer
from store.indexing.message_ids import MessageIds
from store.indexing.reconcile import apply_plan, plan_reconcile
from store.jsonio import dumps_line
from store.receipts import ReceiptKey
from store.transcripts.transcript import TranscriptWriter, create_transcript

SID = "s1"
NOW = 1_700_000_000_000


def message(mid: str, text: str = "x", role: str = "user") -> dict[str, Any]:
    return {"type": "message", "id": mid, "role": role, "blocks": [{"type": "text", "text": text}]}


def writer(tmp_path: Path) -> sqlite3.Connection:
    conn, _ = open_writer(tmp_path / "pi.sqlite", quarantine_dir=tmp_path / "q", now_ms=NOW)
    conn.execute("BEGIN")
    index.insert_session(conn, SID, now_ms=NOW)
    index.insert_session(conn, "other", now_ms=NOW)
    conn.execute("COMMIT")
    return conn


def attached(tmp_path: Path) -> tuple[sqlite3.Connection, MessageIds]:
    """A writer connection and a filter built on it (its trigger feeding it)."""
    conn = writer(tmp_path)
    ids = MessageIds()
    ids.attach(conn)
    return conn, ids

def put(conn: sqlite3.Connection, sid: str, *mids: str, pending: index.PendingRows | None = None) -> None:
    items = [index.IndexRecord(message(mid), i * 10, 10) for i, mid in enumerate(mids)]
    index.index_messages(conn, sid, items, indexed_len=None, file_epoch=None, now_ms=NOW, pending=pending)


# ---------------------------------------------------------------------- the filter and its feed


def test_before_it_is_built_every_id_may_exist(tmp_path: Path) -> None:
    ids = MessageIds()
    assert ids.might_hold("anything") and not ids.ready


def test_it_is_built_from_the_rows_already_indexed(tmp_path: Path) -> None:
    conn = writer(tmp_path)
    put(conn, SID, "m1", "m2")
    put(conn, "other", "m1")  # D444: the row takes the other session's spelling
    ids = MessageIds()
    ids.attach(conn)
    assert ids.ready and ids.attached_to(conn)
    for mid in ("m1", "m2", "other:m1"):
        assert ids.might_hold(mid)
    assert not ids.might_hold("new-id") and not ids.might_hold(f"{SID}:new-id")
    conn.close()


def test_every_insert_through_index_messages_makes_the_id_maybe(tmp_path: Path) -> None:
    conn, ids = attached(tmp_path)
    assert not ids.might_hold("m1")
    conn.execute("BEGIN")
    put(conn, SID, "m1")
    assert ids.might_hold("m1"), "added by the statement, before its commit"
    conn.execute("COMMIT")
    put(conn, "other", "m1")  # a D444 remap: its own spelling
    assert ids.might_hold("other:m1")
    conn.close()


def test_the_batched_insert_of_several_sessions_feeds_it_too(tmp_path: Path) -> None:
    conn, ids = attached(tmp_path)
    pending = index.PendingRows()
    conn.execute("BEGIN")
    put(conn, SID, "b1", "b2", pending=pending)
    put(conn, "other", "b3", pending=pending)
    pending.flush(conn)  # one multi-row INSERT
    conn.execute("COMMIT")
    assert all(ids.might_hold(m) for m in ("b1", "b2", "b3"))
    conn.close()


def test_an_update_of_an_id_feeds_it(tmp_path: Path) -> None:
    """The feed is the connection's trigger, not the store functions: any statement that writes an id."""
    conn = writer(tmp_path)
    put(conn, SID, "m1")
    ids = MessageIds()
    ids.attach(conn)
    assert not ids.might_hold("renamed")
    conn.execute("UPDATE messages SET id = 'renamed' WHERE id = 'm1'")
    assert ids.might_hold("renamed")
    conn.close()


def test_a_reindex_from_the_transcript_feeds_it(tmp_path: Path) -> None:
    """Reconcile (boot, repairs, rewrites, foreign lines) indexes through the same connection."""
    conn, ids = attached(tmp_path)
    path = tmp_path / f"{SID}.jsonl"
    create_transcript(path, SID, NOW)
    with TranscriptWriter.open(path) as w:
        w.append([dumps_line({**message("r1"), "createdAt": "2026-01-01T00:00:00.000Z"})])
    conn.execute("BEGIN")
    apply_plan(conn, SID, plan_reconcile(path, 0, None), now_ms=NOW)
    conn.execute("COMMIT")
    assert conn.execute("SELECT count(*) FROM messages WHERE id = 'r1'").fetchone()[0] == 1
    assert ids.might_hold("r1")
    conn.close()


def test_a_rolled_back_insert_stays_maybe_a_false_positive_only(tmp_path: Path) -> None:
    conn, ids = attached(tmp_path)
    conn.execute("BEGIN")
    put(conn, SID, "gone")
    conn.execute("ROLLBACK")
    assert ids.might_hold("gone")
    conn.close()


def test_it_grows_past_its_capacity_without_a_false_negative_and_a_bounded_rate() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("CREATE TABLE messages(id TEXT PRIMARY KEY)")
    conn.executemany("INSERT INTO messages VALUES (?)", [(f"old{i}",) for i in range(100)])
    ids = MessageIds(min_capacity=64)
    ids.attach(conn)
    assert ids.layers == 1 and ids.capacity == 200
    conn.executemany("INSERT INTO messages VALUES (?)", [(f"new{i}",) for i in range(20_000)])
    assert ids.layers > 1 and ids.capacity >= 20_100
    assert all(ids.might_hold(f"old{i}") for i in range(100))
    assert all(ids.might_hold(f"new{i}") for i in range(20_000))
    false = sum(ids.might_hold(f"absent{i}") for i in range(20_000))
    assert false < 20_000 * 0.03  # stated: below 2 x 0.5 %
    conn.close()


def test_a_reopened_writer_is_not_trusted_until_it_is_built_on_the_new_connection(tmp_path: Path) -> None:
    """A TEMP trigger lives with its connection: rows another connection wrote meanwhile are found by the
    rebuild on the new one; until then every id is "maybe"."""
    conn, ids = attached(tmp_path)
    conn.close()
    other, _ = open_writer(tmp_path / "pi.sqlite", quarantine_dir=tmp_path / "q", now_ms=NOW)
    put(other, SID, "written-elsewhere")
    assert not ids.attached_to(other)
    ids.attach(other)
    assert ids.attached_to(other) and ids.might_hold("written-elsewhere")
    ids.attach(other)  # already built on it: nothing to do
    ids.detach()
    assert not ids.ready and ids.might_hold("anything")
    other.close()


def test_a_tester_thread_never_misses_an_id_added_before_its_test() -> None:
    """The DB writer's thread adds while worker threads test (one native call each, under the GIL)."""
    conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    conn.execute("CREATE TABLE messages(id TEXT PRIMARY KEY)")
    ids = MessageIds(min_capacity=64)  # grows many times under the testers
    ids.attach(conn)
    done = threading.Event()
    added: list[str] = []
    misses: list[str] = []
    errors: list[BaseException] = []

    def test() -> None:
        try:
            while not done.is_set():
                for mid in added[-200:]:
                    if not ids.might_hold(mid):
                        misses.append(mid)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    testers = [threading.Thread(target=test) for _ in range(2)]
    for t in testers:
        t.start()
    for i in range(20_000):
        conn.execute("INSERT INTO messages VALUES (?)", (f"t{i}",))
        added.append(f"t{i}")
    done.set()
    for t in testers:
        t.join()
    assert not errors and not misses
    conn.close()


# ---------------------------------------------------------------------- the lookup it lets skip


def _message_selects(conn: sqlite3.Connection) -> list[str]:
    seen: list[str] = []
    conn.set_trace_callback(lambda sql: seen.append(sql) if "FROM messages" in sql else None)
    return seen


def _taken_elsewhere(tmp_path: Path) -> tuple[sqlite3.Connection, Path, MessageIds]:
    """A writer with session ``other`` holding message ``taken``, SID's transcript, and a filter attached."""
    conn = writer(tmp_path)
    path = tmp_path / f"{SID}.jsonl"
    create_transcript(path, SID, NOW)
    put(conn, "other", "taken")
    ids = MessageIds()
    ids.attach(conn)
    return conn, path, ids


def test_a_new_id_is_not_looked_up_and_a_held_one_is(tmp_path: Path) -> None:
    conn, path, ids = _taken_elsewhere(tmp_path)
    reader = open_reader(tmp_path / "pi.sqlite")
    seen = _message_selects(reader)
    known = gather(reader, path, SID, [AppendRequest(message("brand-new"))], ids=ids)
    assert known.held == {} and seen == []  # both spellings certainly absent: no SQL
    known = gather(reader, path, SID, [AppendRequest(message("taken"))], ids=ids)
    assert known.held["taken"].session_id == "other" and len(seen) == 1  # D444 still sees the other session
    seen.clear()
    known = gather(reader, path, SID, [AppendRequest(message("brand-new"))])
    assert seen, "without the filter the id is looked up"
    reader.close()
    conn.close()


def test_an_id_acknowledged_but_not_indexed_is_still_held_on_the_filter_path(tmp_path: Path) -> None:
    """The index log's held ids (another session's append not indexed yet) win where the filter says no."""
    conn = writer(tmp_path)
    path = tmp_path / f"{SID}.jsonl"
    create_transcript(path, SID, NOW)
    ids = MessageIds()
    ids.attach(conn)
    held = {"m1": Held("other", {"id": "m1", "sessionId": "other", "seq": 1, "turnId": None, "role": "user",
                                 "createdAt": 1})}
    assert not ids.might_hold("m1")
    known = gather(conn, path, SID, [AppendRequest(message("m1"))], pending=held, ids=ids)
    assert known.held["m1"].session_id == "other"
    conn.close()


def test_an_append_that_needs_no_read_is_answered_without_a_connection(tmp_path: Path) -> None:
    """``known_without_reads`` (the append's write hop then takes no read connection): only for new ids the
    filter rules out, with no receipt, named turn or revision root; then exactly what ``gather`` finds,
    the index log's held ids included. Anything that must read declines (None)."""
    conn, path, ids = _taken_elsewhere(tmp_path)
    held = {"m1": Held("other", {"id": "m1", "sessionId": "other", "seq": 1, "turnId": None, "role": "user",
                                 "createdAt": 1})}
    quiet = [AppendRequest(message("m1")), AppendRequest(message("brand-new"))]
    for pending in (held, {}, None):
        quick = known_without_reads(SID, quiet, pending=pending, ids=ids)
        assert quick is not None
        assert quick == gather(conn, path, SID, quiet, pending=pending, ids=ids)
    assert known_without_reads(SID, quiet, pending=held, ids=ids).held["m1"].session_id == "other"  # type: ignore[union-attr]
    key = ReceiptKey("client", "sub-1", "session.appendMessage", "fp")
    revising = {**message("e1"), "meta": {"revisionRootId": "m0"}}
    for reads in ([AppendRequest(message("taken"))],  # the filter holds it: D444 must look it up
                  [AppendRequest(message("n1"), receipt=key)],
                  [AppendRequest(message("n1"), turn_id="t1")],
                  [AppendRequest({**message("n1"), "turnId": "t1"})],
                  [AppendRequest(revising)]):
        assert known_without_reads(SID, reads, pending=held, ids=ids) is None
    assert known_without_reads(SID, quiet, pending=held, ids=None) is None  # no filter: every id is looked up
    conn.close()
