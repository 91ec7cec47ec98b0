"""store/queue.py leases: a handed-out entry leaves the queue only once its turn ran (no trio).

Before leases ``take`` deleted the entry it handed out: a controller (or the host) that died between the
take and the prompt's line lost the person's acknowledged prompt for good.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from store import collab, fence, queue, turns
from store.upgrade.migrations import migrate
from store.upgrade.schema import message_mid
from tests.queue.conftest import NOW_MS, add_session, open_queue_db
from tests.queue.test_store_queue import ids, push


def start(conn: sqlite3.Connection, turn_id: str, sid: str = "s1", client: str | None = None) -> None:
    turns.start_turn(conn, session_id=sid, turn_id=turn_id, provider_id=None, model_id=None, snapshot=None,
                     now_ms=NOW_MS, client_id=client)


def end(conn: sqlite3.Connection, turn_id: str, status: str, sid: str = "s1") -> None:
    turns.end_turn(conn, session_id=sid, turn_id=turn_id, status=status, error_code=None, usage=None,
                   create_notification=False, now_ms=NOW_MS)


def message(conn: sqlite3.Connection, seq: int, role: str, turn_id: str | None, sid: str = "s1") -> None:
    ordinal = conn.execute("SELECT ordinal FROM sessions WHERE id = ?", (sid,)).fetchone()[0]
    conn.execute("INSERT INTO messages(mid, id, session_id, turn_id, seq, role, text, created_at) "
                 "VALUES (?,?,?,?,?,?,?,?)",
                 (message_mid(ordinal, seq), f"m{seq}", sid, turn_id, seq, role, "hi", NOW_MS))
    conn.execute("UPDATE sessions SET last_seq = ? WHERE id = ?", (seq, sid))


def lease(conn: sqlite3.Connection, entry_id: str) -> tuple[str | None, str | None]:
    row = conn.execute("SELECT lease, lease_turn_id FROM turn_queue WHERE id = ?", (entry_id,)).fetchone()
    return (row[0], row[1]) if row else ("gone", None)


def test_a_taken_entry_is_hidden_but_kept_and_the_next_turn_carries_it(db: sqlite3.Connection) -> None:
    a = push(db, content="a", key="k").plan.entry
    assert a is not None
    out = queue.take(db, "s1", now_ms=NOW_MS)
    assert out.plan.entry is not None and out.plan.entry.id == a.id and out.entries == ()
    assert lease(db, a.id) == ("taken", None)
    assert push(db, content="a", key="k").plan.replayed  # its key still answers a retried push
    start(db, "t1")
    assert lease(db, a.id) == ("started", "t1")


def test_a_restart_offers_the_taken_entry_again_first_and_listed(db: sqlite3.Connection) -> None:
    a, b = (push(db, content=x).plan.entry for x in "ab")
    assert a and b
    queue.take(db, "s1", now_ms=NOW_MS)
    report = fence.interruption_fence(db, now_ms=NOW_MS, boot_id="b1")
    assert report["offeredQueueEntries"] == 1
    assert ids(db) == [a.id, b.id]  # the person sees it waiting again, first
    again = queue.take(db, "s1", now_ms=NOW_MS)
    assert again.plan.entry is not None and again.plan.entry.id == a.id
    nxt = queue.take(db, "s1", now_ms=NOW_MS)  # the controller moved on: a is consumed
    assert nxt.plan.entry is not None and nxt.plan.entry.id == b.id and lease(db, a.id)[0] == "gone"


def test_a_turn_that_ran_consumes_its_entry(db: sqlite3.Connection) -> None:
    for status in ("completed", "error"):
        a = push(db, content=status, key=status).plan.entry
        assert a is not None
        queue.take(db, "s1", now_ms=NOW_MS)
        start(db, f"t-{status}")
        end(db, f"t-{status}", status)
        assert queue.take(db, "s1", now_ms=NOW_MS).plan.entry is None
        assert lease(db, a.id)[0] == "gone"
        assert push(db, content=status, key=status).plan.replayed  # the ledger remembers the delivered key


def test_an_aborted_turn_whose_prompt_landed_consumes_its_entry(db: sqlite3.Connection) -> None:
    a = push(db, content="a").plan.entry
    assert a is not None
    queue.take(db, "s1", now_ms=NOW_MS)
    start(db, "t1")
    message(db, 1, "user", "t1")
    turns.abort_running(db, "s1", NOW_MS)
    assert queue.take(db, "s1", now_ms=NOW_MS).plan.entry is None and lease(db, a.id)[0] == "gone"
    # a prompt appended without its turn id, after the hand-out, counts too
    b = push(db, content="b").plan.entry
    assert b is not None
    queue.take(db, "s1", now_ms=NOW_MS)
    start(db, "t2")
    message(db, 2, "user", None)
    turns.abort_running(db, "s1", NOW_MS)
    assert queue.take(db, "s1", now_ms=NOW_MS).plan.entry is None and lease(db, b.id)[0] == "gone"


def test_an_aborted_turn_whose_prompt_never_landed_puts_its_entry_back_under_a_new_id(
        db: sqlite3.Connection) -> None:
    message(db, 1, "user", None)  # older history does not count
    a, b = (push(db, content=x, key=x).plan.entry for x in "ab")
    assert a and b
    queue.prioritize(db, "s1", b.id, now_ms=NOW_MS)
    queue.take(db, "s1", now_ms=NOW_MS)  # b (promoted)
    start(db, "t1")
    fence.interruption_fence(db, now_ms=NOW_MS, boot_id="b1")  # the host died before the prompt's line
    assert lease(db, b.id) == ("started", "t1")
    out = queue.take(db, "s1", now_ms=NOW_MS)
    assert out.plan.entry is not None and out.plan.entry.content == "b"  # first again: it keeps its priority
    again = out.plan.entry.id
    assert again != b.id and again.startswith("q_") and lease(db, b.id)[0] == "gone"
    back = db.execute("SELECT content, idempotency_key, position, priority FROM turn_queue WHERE id = ?",
                      (again,)).fetchone()
    assert back == ("b", "b", b.position, 1)
    assert push(db, content="b", key="b").plan.entry.id == again  # type: ignore[union-attr]
    assert ids(db) == [a.id]


def test_another_controller_is_offered_what_the_last_one_took(db: sqlite3.Connection) -> None:
    a = push(db, content="a").plan.entry
    assert a is not None
    queue.take(db, "s1", now_ms=NOW_MS)
    assert queue.offer_again(db, "s2") == 0 and queue.offer_again(db, "s1") == 1
    assert queue.take(db, "s1", now_ms=NOW_MS).plan.entry.id == a.id  # type: ignore[union-attr]
    start(db, "t1")
    assert queue.offer_again(db, "s1") == 0  # a started entry stays with its turn


def test_a_collaboration_admission_handed_out_is_dropped_when_its_delivery_begins(db: sqlite3.Connection) -> None:
    collab.deliver(db, delivery_id="d1", entry_id="q-d1", plugin_id="team", source_session_id="s2",
                   target_session_id="s1", kind="task", content="a", notify_on_completion=False,
                   idempotency_key="k1", remaining_hops=None, permission_ceiling=None, now_ms=NOW_MS)
    (a,) = queue.list_entries(db, "s1")
    assert a.session_message_id == "d1"
    queue.take(db, "s1", now_ms=NOW_MS)
    out = queue.drop(db, "s1", a.id, now_ms=NOW_MS)
    assert out.plan.entry is not None and lease(db, a.id)[0] == "gone"


def test_the_v30_step_leaves_every_entry_waiting(tmp_path: Path) -> None:
    conn = open_queue_db(tmp_path / "pi.sqlite")
    add_session(conn, "s1")
    a = push(conn, content="a").plan.entry
    assert a is not None
    for column in ("lease", "lease_turn_id", "lease_seq", "lease_client"):
        conn.execute(f"ALTER TABLE turn_queue DROP COLUMN {column}")
    conn.execute("DROP INDEX idx_messages_window")  # v32
    conn.execute("PRAGMA user_version = 29")
    assert migrate(conn, tmp_path / "pi.sqlite", now_ms=NOW_MS).applied == [30, 31, 32]
    assert ids(conn) == [a.id] and lease(conn, a.id) == (None, None)
    assert queue.take(conn, "s1", now_ms=NOW_MS).plan.entry.id == a.id  # type: ignore[union-attr]


def test_boot_settles_the_entries_whose_turn_the_fence_ended(db: sqlite3.Connection) -> None:
    a = push(db, content="a").plan.entry
    b = push(db, content="b", sid="s2").plan.entry
    assert a and b
    for sid, turn in (("s1", "t1"), ("s2", "t2")):
        queue.take(db, sid, now_ms=NOW_MS)
        start(db, turn, sid)
    message(db, 1, "user", "t2", sid="s2")  # s2's prompt landed, s1's did not
    fence.interruption_fence(db, now_ms=NOW_MS, boot_id="b1")
    assert queue.settle_after_restart(db, now_ms=NOW_MS) == {"consumed": 1, "waitingAgain": 1}
    (again,) = queue.list_entries(db, "s1")
    assert again.content == "a" and again.id != a.id and again.lease is None  # listed: a sidecar's scan sees it
    assert queue.list_entries(db, "s2") == () and lease(db, b.id)[0] == "gone"
    assert queue.settle_after_restart(db, now_ms=NOW_MS) == {"consumed": 0, "waitingAgain": 0}


def test_only_the_client_that_took_an_entry_starts_a_turn_with_it(db: sqlite3.Connection) -> None:
    """Another client's turn in the session does not carry the prompt the controller took: were it to,
    that turn's end would consume a prompt that never ran."""
    a = push(db, content="a").plan.entry
    assert a is not None
    queue.take(db, "s1", now_ms=NOW_MS, client="sidecar")
    start(db, "t-ui", client="ui")
    assert lease(db, a.id) == ("taken", None)
    end(db, "t-ui", "completed")
    start(db, "t1", client="sidecar")
    assert lease(db, a.id) == ("started", "t1")
    fence.interruption_fence(db, now_ms=NOW_MS, boot_id="b1")  # t1 aborted by a restart, before its prompt
    queue.settle_after_restart(db, now_ms=NOW_MS)
    assert [e.content for e in queue.list_entries(db, "s1")] == ["a"]  # waits again: it never ran


def test_a_closed_connection_offers_again_what_its_client_took_and_began_no_turn_with(db: sqlite3.Connection) -> None:
    a, b = (push(db, content=x).plan.entry for x in "ab")
    assert a and b
    queue.take(db, "s1", now_ms=NOW_MS, client="sidecar")
    assert ids(db) == [b.id]
    assert queue.offer_again_taken_by(db, "another") == []
    assert queue.offer_again_taken_by(db, "sidecar") == ["s1"]
    assert ids(db) == [a.id, b.id]  # listed again, first
    start(db, "t1", client="sidecar")  # its flow went on after a reconnect: the turn still carries it
    assert lease(db, a.id) == ("started", "t1")
    assert queue.offer_again_taken_by(db, "sidecar") == []  # a started entry stays with its turn


def test_the_v31_step_keeps_an_entry_handed_out_before_it_bindable_by_any_turn(tmp_path: Path) -> None:
    conn = open_queue_db(tmp_path / "pi.sqlite")
    add_session(conn, "s1")
    a = push(conn, content="a").plan.entry
    assert a is not None
    queue.take(conn, "s1", now_ms=NOW_MS)
    conn.execute("ALTER TABLE turn_queue DROP COLUMN lease_client")
    conn.execute("DROP INDEX idx_messages_window")  # v32
    conn.execute("PRAGMA user_version = 30")
    assert migrate(conn, tmp_path / "pi.sqlite", now_ms=NOW_MS).applied == [31, 32]
    assert lease(conn, a.id) == ("taken", None)
    start(conn, "t1", client="whoever")
    assert lease(conn, a.id) == ("started", "t1")


def test_the_running_turns_a_gone_client_began_with_its_entries_are_named(db: sqlite3.Connection) -> None:
    a, b = (push(db, content=x).plan.entry for x in "ab")
    assert a and b
    queue.take(db, "s1", now_ms=NOW_MS, client="sidecar")
    assert queue.running_turns_started_by(db, "sidecar") == []  # taken, no turn yet
    start(db, "t1", client="sidecar")
    assert queue.running_turns_started_by(db, "sidecar") == [("s1", "t1")]
    assert queue.running_turns_started_by(db, "another") == []
    end(db, "t1", "completed")
    assert queue.running_turns_started_by(db, "sidecar") == []  # ended: nothing to recover


def test_an_entry_handed_to_two_clients_goes_with_the_turn_of_either(db: sqlite3.Connection) -> None:
    """Found by a probe with two live sidecars: A took a prompt, B attached (offered again) and took it
    too, A's turn ran it but did not carry it (B was its taker), and the next attach and take handed the
    delivered prompt out a second time."""
    a, b = (push(db, content=x).plan.entry for x in "ab")
    assert a and b
    queue.take(db, "s1", now_ms=NOW_MS, client="A")
    queue.offer_again(db, "s1")  # B attaches
    assert queue.take(db, "s1", now_ms=NOW_MS, client="B").plan.entry.id == a.id  # type: ignore[union-attr]
    assert queue.offer_again_taken_by(db, "A") == []  # B holds it now: A gone changes nothing
    start(db, "t1", client="A")  # A's flow goes on with the prompt it took first
    assert lease(db, a.id) == ("started", "t1")
    message(db, 1, "user", "t1")
    end(db, "t1", "completed")
    queue.offer_again(db, "s1")  # A attaches again
    again = queue.take(db, "s1", now_ms=NOW_MS, client="A").plan.entry
    assert again is not None and again.id == b.id and lease(db, a.id)[0] == "gone"


def test_the_last_taker_gone_offers_an_entry_two_clients_took(db: sqlite3.Connection) -> None:
    a = push(db, content="a").plan.entry
    assert a is not None
    queue.take(db, "s1", now_ms=NOW_MS, client="A")
    queue.offer_again(db, "s1")
    queue.take(db, "s1", now_ms=NOW_MS, client="B")
    assert queue.offer_again_taken_by(db, "B") == ["s1"] and ids(db) == [a.id]
