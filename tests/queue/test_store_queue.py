"""store/queue.py: the queue rules, on a real SQLite file (no trio)."""

from __future__ import annotations

import sqlite3
from itertools import count

import orjson
import pytest

from store import queue
from store.errors import (
    Conflict,
    CorruptData,
    IdempotencyConflict,
    InvalidInput,
    LimitExceeded,
    NotFound,
    SessionNotFound,
)
from store.faults import Faults, InjectedFault
from tests.queue.conftest import NOW_MS

_ids = count(1)


def push(conn: sqlite3.Connection, sid: str = "s1", content: str = "do it", *, key: str | None = None,
         principal: str = "ui", mode: str = "ask", attachments: tuple = (), smid: str | None = None
         ) -> queue.Outcome:
    inp = queue.PushInput(principal=principal, content=content, permission_mode=mode, idempotency_key=key,
                          attachments=attachments, session_message_id=smid)
    return queue.push(conn, sid, inp, new_id=f"q{next(_ids)}", now_ms=NOW_MS)


def ids(conn: sqlite3.Connection, sid: str = "s1") -> list[str]:
    return [e.id for e in queue.list_entries(conn, sid)]


def positions(conn: sqlite3.Connection, sid: str = "s1") -> dict[str, int]:
    return {e.id: e.position for e in queue.list_entries(conn, sid)}


def test_input_hash_is_canonical_sha256_of_content_attachments_and_mode() -> None:
    a = queue.input_hash("x", [{"a": 1, "b": 2}], "ask")
    assert a == queue.input_hash("x", [{"b": 2, "a": 1}], "ask")  # key order does not matter
    assert len(a) == 64 and int(a, 16) >= 0
    assert queue.input_hash("x", None, "ask") == queue.input_hash("x", [], "ask")
    assert len({a, queue.input_hash("y", [{"a": 1, "b": 2}], "ask"),
                queue.input_hash("x", [{"a": 1}], "ask"), queue.input_hash("x", [{"a": 1, "b": 2}], "auto")}) == 4


def test_push_stores_a_row_with_growing_positions(db: sqlite3.Connection) -> None:
    first = push(db, content="one", attachments=({"path": "a.png"},))
    second = push(db, content="two")
    assert first.plan.changed and not first.plan.replayed
    e1, e2 = queue.list_entries(db, "s1")
    assert (e1.content, e1.position, e1.attachments) == ("one", 1, ({"path": "a.png"},))
    assert (e2.content, e2.position, e2.attachments) == ("two", 2, ())
    assert e1.input_hash == queue.input_hash("one", [{"path": "a.png"}], "ask")
    assert second.entries == (e1, e2)


def test_retried_push_with_same_key_returns_the_same_row_and_changes_nothing(db: sqlite3.Connection) -> None:
    first = push(db, key="k1")
    before = db.total_changes
    again = push(db, key="k1")
    assert again.plan.replayed and not again.plan.changed
    assert again.plan.entry == first.plan.entry
    assert db.total_changes == before
    assert len(queue.list_entries(db, "s1")) == 1
    # The key is scoped by principal and session.
    assert not push(db, key="k1", principal="other").plan.replayed
    assert not push(db, "s2", key="k1").plan.replayed


def test_same_key_with_different_input_is_idempotency_conflict(db: sqlite3.Connection) -> None:
    push(db, content="a", key="k1")
    before = db.total_changes
    for kwargs in ({"content": "b"}, {"mode": "auto"}, {"attachments": ({"p": 1},)}, {"smid": "m1"}):
        with pytest.raises(IdempotencyConflict) as info:
            push(db, **{"content": "a", "key": "k1", **kwargs})
        assert info.value.code == "IDEMPOTENCY_CONFLICT" and "k1" in info.value.message
    assert db.total_changes == before


def test_at_most_eight_entries_per_session(db: sqlite3.Connection) -> None:
    for i in range(queue.MAX_ENTRIES):
        push(db, content=f"p{i}", key=f"k{i}")
    before = db.total_changes
    with pytest.raises(LimitExceeded) as info:
        push(db, content="ninth")
    assert info.value.code == "LIMIT_EXCEEDED"
    assert "at most 8" in info.value.message and "s1" in info.value.message
    assert db.total_changes == before
    # A retry of an admitted push is still answered on a full queue; other sessions are unaffected.
    assert push(db, content="p3", key="k3").plan.replayed
    assert not push(db, "s2").plan.replayed


def test_position_never_reused_after_removing_or_taking_the_last_entry(db: sqlite3.Connection) -> None:
    a = push(db).plan.entry
    b = push(db).plan.entry
    assert a is not None and b is not None
    queue.remove(db, "s1", b.id, now_ms=NOW_MS)
    c = push(db).plan.entry
    assert c is not None and c.position == 3
    queue.take(db, "s1", now_ms=NOW_MS)
    queue.remove(db, "s1", c.id, now_ms=NOW_MS)
    assert queue.list_entries(db, "s1") == ()
    d = push(db).plan.entry
    assert d is not None and d.position == 4


def test_remove_keeps_remaining_positions(db: sqlite3.Connection) -> None:
    entries = [push(db, content=f"p{i}").plan.entry for i in range(4)]
    before = positions(db)
    out = queue.remove(db, "s1", entries[1].id, now_ms=NOW_MS)  # type: ignore[union-attr]
    after = positions(db)
    assert entries[1].id not in after  # type: ignore[union-attr]
    assert after == {k: v for k, v in before.items() if k != entries[1].id}  # type: ignore[union-attr]
    assert [e.id for e in out.entries] == ids(db)
    with pytest.raises(NotFound) as info:
        queue.remove(db, "s1", entries[1].id, now_ms=NOW_MS)  # type: ignore[union-attr]
    assert info.value.code == "NOT_FOUND"
    with pytest.raises(NotFound):  # another session's entry is not reachable
        queue.remove(db, "s2", entries[0].id, now_ms=NOW_MS)  # type: ignore[union-attr]


def test_prioritize_sets_max_plus_one_and_promotes_in_click_order(db: sqlite3.Connection) -> None:
    a, b, c, d = (push(db, content=x).plan.entry for x in "abcd")
    assert a and b and c and d
    queue.prioritize(db, "s1", c.id, now_ms=NOW_MS)
    queue.prioritize(db, "s1", b.id, now_ms=NOW_MS)
    got = {e.id: e.priority for e in queue.list_entries(db, "s1")}
    assert got == {a.id: None, b.id: 2, c.id: 1, d.id: None}
    assert ids(db) == [c.id, b.id, a.id, d.id]
    # Clicking "send now" again on a promoted entry keeps its place and writes nothing.
    before = db.total_changes
    again = queue.prioritize(db, "s1", c.id, now_ms=NOW_MS)
    assert not again.plan.changed and db.total_changes == before
    assert ids(db) == [c.id, b.id, a.id, d.id]
    # Positions never changed.
    assert positions(db) == {a.id: 1, b.id: 2, c.id: 3, d.id: 4}


def test_reorder_swaps_adjacent_unpromoted_entries(db: sqlite3.Connection) -> None:
    a, b, c, d = (push(db, content=x).plan.entry for x in "abcd")
    assert a and b and c and d
    queue.prioritize(db, "s1", b.id, now_ms=NOW_MS)
    # c's unpromoted neighbour above is a (b is promoted and skipped): positions swap.
    queue.reorder(db, "s1", c.id, "up", now_ms=NOW_MS)
    assert positions(db) == {a.id: 3, b.id: 2, c.id: 1, d.id: 4}
    assert ids(db) == [b.id, c.id, a.id, d.id]
    queue.reorder(db, "s1", a.id, "down", now_ms=NOW_MS)
    assert ids(db) == [b.id, c.id, d.id, a.id]


def test_reorder_refuses_promoted_entries_and_moves_past_the_ends(db: sqlite3.Connection) -> None:
    a, b, c = (push(db, content=x).plan.entry for x in "abc")
    assert a and b and c
    queue.prioritize(db, "s1", b.id, now_ms=NOW_MS)
    before = db.total_changes
    with pytest.raises(Conflict) as info:
        queue.reorder(db, "s1", b.id, "up", now_ms=NOW_MS)
    assert info.value.code == "CONFLICT" and "promoted" in info.value.message
    with pytest.raises(Conflict) as info:
        queue.reorder(db, "s1", a.id, "up", now_ms=NOW_MS)
    assert "first" in info.value.message
    with pytest.raises(Conflict) as info:
        queue.reorder(db, "s1", c.id, "down", now_ms=NOW_MS)
    assert "last" in info.value.message
    with pytest.raises(InvalidInput):
        queue.reorder(db, "s1", a.id, "sideways", now_ms=NOW_MS)
    assert db.total_changes == before


def test_take_hands_out_in_delivery_order_and_the_next_take_removes_the_row(db: sqlite3.Connection) -> None:
    a, b, c = (push(db, content=x).plan.entry for x in "abc")
    assert a and b and c
    queue.prioritize(db, "s1", c.id, now_ms=NOW_MS)
    taken = [queue.take(db, "s1", now_ms=NOW_MS).plan.entry for _ in range(3)]
    assert [e.id for e in taken if e] == [c.id, a.id, b.id]
    assert ids(db) == [] and [e.id for e in queue.list_leased(db, "s1")] == [b.id]  # handed out, kept
    empty = queue.take(db, "s1", now_ms=NOW_MS)  # the controller moved on: b is consumed
    assert empty.plan.entry is None and empty.entries == ()
    assert db.execute("SELECT COUNT(*) FROM turn_queue").fetchone()[0] == 0
    again = queue.take(db, "s1", now_ms=NOW_MS)
    assert again.plan.entry is None and not again.plan.changed


def test_retry_of_a_push_whose_entry_was_already_delivered_is_a_replay(db: sqlite3.Connection) -> None:
    first = push(db, content="x", key="k1").plan.entry
    queue.take(db, "s1", now_ms=NOW_MS)
    again = push(db, content="x", key="k1")
    assert again.plan.replayed and not again.plan.changed
    assert again.plan.entry is not None and again.plan.entry.id == first.id  # type: ignore[union-attr]
    assert queue.list_entries(db, "s1") == ()
    with pytest.raises(IdempotencyConflict):
        push(db, content="changed", key="k1")


def test_refused_operations_write_nothing_and_faults_roll_back_with_the_transaction(
    db: sqlite3.Connection,
) -> None:
    push(db, content="a")
    faults = Faults()
    faults.add("queue.between_effects", nth=1, action="raise")
    db.execute("BEGIN IMMEDIATE")
    db.execute("SAVEPOINT op")
    inp = queue.PushInput(principal="ui", content="b", permission_mode="ask")
    with pytest.raises(InjectedFault):
        queue.push(db, "s1", inp, new_id="qx", now_ms=NOW_MS, faults=faults)
    db.execute("ROLLBACK TO op")
    db.execute("COMMIT")
    assert [e.content for e in queue.list_entries(db, "s1")] == ["a"]
    assert queue.load(db, "s1").high_water == 1


def test_transition_table_names_every_allowed_move() -> None:
    entry = queue.Entry("q", "s", "ui", None, "h", "c", (), "ask", 1, None, None, NOW_MS)
    promoted = queue.Entry("q", "s", "ui", None, "h", "c", (), "ask", 1, 3, None, NOW_MS)
    assert queue.transition(entry, "prioritize") == "promoted"
    assert queue.transition(entry, "reorder") == "queued"
    assert queue.transition(promoted, "take") == queue.GONE
    with pytest.raises(Conflict):
        queue.transition(promoted, "reorder")


def test_invalid_push_input_is_refused_before_any_write(db: sqlite3.Connection) -> None:
    before = db.total_changes
    for inp in (queue.PushInput(principal="", content="x", permission_mode="ask"),
                queue.PushInput(principal="ui", content="x", permission_mode="yolo"),
                queue.PushInput(principal="ui", content=3, permission_mode="ask"),  # type: ignore[arg-type]
                queue.PushInput(principal="ui", content="x", permission_mode="ask", attachments=(1,))):  # type: ignore[arg-type]
        with pytest.raises(InvalidInput):
            queue.push(db, "s1", inp, new_id="qz", now_ms=NOW_MS)
    assert db.total_changes == before


def test_deleting_the_session_cascades_its_entries(db: sqlite3.Connection) -> None:
    push(db, content="a")
    push(db, "s2", content="b")
    db.execute("DELETE FROM sessions WHERE id = 's1'")
    assert queue.list_entries(db, "s1") == ()
    assert db.execute("SELECT count(*) FROM turn_queue WHERE session_id = 's1'").fetchone()[0] == 0
    assert [e.content for e in queue.list_entries(db, "s2")] == ["b"]
    queue.forget_session(db, "s1")
    assert db.execute("SELECT count(*) FROM kv WHERE ns = 'queue' AND key = 's1'").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM kv WHERE ns = 'queue' AND key = 's2'").fetchone()[0] == 1


def test_a_recreated_session_id_does_not_inherit_the_old_ledger(db: sqlite3.Connection) -> None:
    push(db, content="a", key="k1")
    push(db, content="b")
    queue.take(db, "s1", now_ms=NOW_MS)
    db.execute("DELETE FROM sessions WHERE id = 's1'")  # the kv ledger stays behind (no FK)
    db.execute("INSERT INTO sessions(id, title, created_at, updated_at) VALUES ('s1', 'again', ?, ?)",
               (NOW_MS + 1, NOW_MS + 1))
    fresh = push(db, content="a", key="k1")
    assert not fresh.plan.replayed and fresh.plan.entry is not None and fresh.plan.entry.position == 1


def test_unknown_session_is_refused_before_any_write(db: sqlite3.Connection) -> None:
    before = db.total_changes
    with pytest.raises(SessionNotFound):
        push(db, "ghost")
    assert db.total_changes == before


def test_unreadable_ledger_is_corrupt_data(db: sqlite3.Connection) -> None:
    db.execute("INSERT INTO kv(ns, key, value_json, updated_at) VALUES ('queue', 's1', ?, 0)",
               (orjson.dumps({"highWater": "x"}).decode(),))
    with pytest.raises(CorruptData):
        queue.load(db, "s1")


def test_has_running_turn_reads_the_turns_table(db: sqlite3.Connection) -> None:
    assert not queue.has_running_turn(db, "s1")
    db.execute("INSERT INTO turns(id, session_id, status, started_at) VALUES ('t1', 's1', 'running', 0)")
    assert queue.has_running_turn(db, "s1") and not queue.has_running_turn(db, "s2")
    db.execute("UPDATE turns SET status = 'completed' WHERE id = 't1'")
    assert not queue.has_running_turn(db, "s1")
