"""One damaged queue entry (a column holding what the host never writes there: attachments that no longer
parse, a lease outside its set) no longer fails the whole session's queue. ``session.queueList`` lists the
entries that read and names the damaged one in ``unreadable``; ``session.queueTake`` hands nothing out
(CORRUPT_DATA naming it) while it is there, so no prompt is skipped or handed out twice unseen; a push retried
with its idempotency key is refused rather than queued again; ``session.queueRemove`` of its id is the way out.
Before, every queue operation of the session answered CORRUPT_DATA (and a lease outside its set left the entry
out of every query, unseen)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from protocol.models_queue import QueueState
from runtime.client import RpcError
from store import collab, queue
from store.errors import DamagedRecord, IdempotencyConflict, InvalidInput
from tests.collab.test_collab_host import deliver
from tests.dbkit import NOW, add_session, fresh_db
from tests.hostkit import client_for, inprocess_host
from tests.integrity.test_damaged_listings import damage
from tests.queue.test_queue_host import new_session, push


async def test_a_damaged_entry_is_named_blocks_take_and_can_be_removed(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as ui, \
                client_for(host, "sidecar", kind="agent") as agent:
            sid = await new_session(ui)
            ids = [(await push(ui, sid, f"p{i}", idempotencyKey=f"k{i}"))["entry"]["id"] for i in range(3)]
            damage(tmp_path, "UPDATE turn_queue SET attachments_json = '[{\"cut' WHERE id = ?", ids[0])
            state = QueueState.model_validate(await ui.call("session.queueList", {"sessionId": sid}))
            assert [e.id for e in state.entries] == ids[1:] and state.unreadable == [ids[0]]
            await agent.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl"})
            with pytest.raises(RpcError) as refused:  # it may be the next prompt: nothing is skipped
                await agent.call("session.queueTake", {"sessionId": sid, "controllerId": "ctl"})
            assert refused.value.data_code == "CORRUPT_DATA" and refused.value.data["entryIds"] == [ids[0]]
            with pytest.raises(RpcError) as again:  # its push retried: not queued a second time
                await push(ui, sid, "p0", idempotencyKey="k0")
            assert again.value.data_code == "CORRUPT_DATA" and again.value.data["entryId"] == ids[0]
            assert (await push(ui, sid, "p3"))["entry"]["position"] == 4  # its position is not reused
            removed = QueueState.model_validate(
                await ui.call("session.queueRemove", {"sessionId": sid, "entryId": ids[0]}))
            assert removed.unreadable is None and [e.content for e in removed.entries] == ["p1", "p2", "p3"]
            taken = await agent.call("session.queueTake", {"sessionId": sid, "controllerId": "ctl"})
            assert taken["entry"]["id"] == ids[1]


def test_a_lease_outside_its_set_is_named_not_left_out_unseen(tmp_path: Path) -> None:
    conn = fresh_db(tmp_path / "pi.sqlite")
    add_session(conn, "s")
    for i in range(2):
        queue.push(conn, "s", queue.PushInput("ui", f"p{i}", "ask"), new_id=f"q{i}", now_ms=NOW + i)
    conn.execute("PRAGMA ignore_check_constraints = ON")
    conn.execute("UPDATE turn_queue SET lease = 'tekan' WHERE id = 'q0'")
    queue.push(conn, "s", queue.PushInput("ui", "p2", "ask"), new_id="q2", now_ms=NOW + 2)
    conn.execute("UPDATE turn_queue SET attachments_json = '5' WHERE id = 'q2'")  # JSON, not a list
    assert queue.read_rows(conn, "s").unreadable == ("q0", "q2")
    queue.remove(conn, "s", "q2", now_ms=NOW + 3)
    with pytest.raises(DamagedRecord):  # before, q0 was in no query and q1 was handed out past it
        queue.take(conn, "s", now_ms=NOW + 5)
    rows = queue.read_rows(conn, "s")
    assert [e.id for e in rows.entries] == ["q1"] and rows.unreadable == ("q0",) and rows.leased == ()
    assert queue.list_entries(conn, "s")[0].lease is None  # the refused take wrote nothing
    out = queue.drop(conn, "s", "q0", now_ms=NOW + 6)  # a collaboration delivery that began: its admission goes
    assert out.unreadable == () and [e.id for e in out.entries] == ["q1"]
    assert queue.take(conn, "s", now_ms=NOW + 7).plan.entry is not None


def test_a_damaged_lease_client_fails_neither_a_gone_client_nor_a_turn_start(tmp_path: Path) -> None:
    """Before, ``json_each``/``json_extract`` of a ``lease_client`` that is not JSON failed the statement: a
    controller client gone could offer nothing again in any session (its entries stayed hidden), and a turn
    starting in that session failed."""
    conn = fresh_db(tmp_path / "pi.sqlite")
    for sid in ("s1", "s2", "s3"):
        add_session(conn, sid)
        queue.push(conn, sid, queue.PushInput("ui", f"p-{sid}", "ask"), new_id=f"q-{sid}", now_ms=NOW)
        assert queue.take(conn, sid, now_ms=NOW + 1, client="c").plan.entry is not None
    conn.execute("UPDATE turn_queue SET lease_client = '[\"c' WHERE id = 'q-s1'")  # damaged
    conn.execute("UPDATE turn_queue SET lease_client = 'c' WHERE id = 'q-s3'")  # the first v31 build's form
    assert queue.offer_again_taken_by(conn, "c") == ["s2", "s3"]
    assert queue.running_turns_started_by(conn, "c") == []
    queue.bind_lease(conn, "s1", "t1", "c")  # the turn starts; the damaged entry is not carried by it
    queue.bind_lease(conn, "s3", "t3", "c")
    leases = dict(conn.execute("SELECT id, lease FROM turn_queue").fetchall())
    assert leases == {"q-s1": "taken", "q-s2": "offered", "q-s3": "started"}
    assert queue.read_rows(conn, "s1").unreadable == ("q-s1",)


def test_removing_a_damaged_admission_cancels_its_delivery(tmp_path: Path) -> None:
    """A damaged entry that admitted a collaboration delivery (its ``session_message_id`` still reads):
    ``session.queueRemove`` of it cancels that queued delivery, as removing a healthy admission does.
    Before, the delivery stayed ``queued`` with no admission until the next boot interrupted it."""
    conn = fresh_db(tmp_path / "pi.sqlite")
    for sid in ("src", "tgt"):
        add_session(conn, sid)
    collab.deliver(conn, delivery_id="col_1", entry_id="q_1", plugin_id="team", source_session_id="src",
                   target_session_id="tgt", kind="task", content="do", notify_on_completion=False,
                   idempotency_key="k1", remaining_hops=None, permission_ceiling=None, now_ms=NOW)
    conn.execute("UPDATE turn_queue SET attachments_json = '[{\"cut' WHERE id = 'q_1'")
    assert queue.read_rows(conn, "tgt").unreadable == ("q_1",)
    with pytest.raises(InvalidInput) as second:  # while it is there, no second admission of its delivery
        queue.push(conn, "tgt", queue.PushInput("ui", "again", "ask", session_message_id="col_1"), new_id="q_2",
                   now_ms=NOW + 1)
    assert second.value.data["entryId"] == "q_1"
    out, changed = collab.remove_admission(conn, "tgt", "q_1", now_ms=NOW + 1)
    assert out.plan.changed and out.unreadable == () and out.entries == ()
    assert [(d["id"], d["status"]) for d in changed.deliveries] == [("col_1", "cancelled")]
    assert collab.get(conn, "col_1")["status"] == "cancelled"


def test_a_removed_damaged_entry_keeps_its_key_a_late_push_retry_replays(tmp_path: Path) -> None:
    """A push retried with its idempotency key after its damaged entry was removed is answered as a
    replay of that entry (as after a healthy entry's removal), not queued a second time."""
    conn = fresh_db(tmp_path / "pi.sqlite")
    add_session(conn, "s")
    first = queue.PushInput("ui", "p0", "ask", idempotency_key="k0", attachments=({"type": "image"},))
    queue.push(conn, "s", first, new_id="q0", now_ms=NOW)
    queue.push(conn, "s", queue.PushInput("ui", "p1", "ask", idempotency_key="k1"), new_id="q1", now_ms=NOW + 1)
    for sql in ("UPDATE turn_queue SET attachments_json = '[{\"cut' WHERE id = 'q0'",
                "UPDATE turn_queue SET position = 'x', created_at = 'y' WHERE id = 'q1'"):
        conn.execute(sql)
    queue.remove(conn, "s", "q0", now_ms=NOW + 2)
    queue.remove(conn, "s", "q1", now_ms=NOW + 3)
    again = queue.push(conn, "s", first, new_id="q2", now_ms=NOW + 4)
    assert again.plan.replayed and not again.plan.changed and again.entries == ()
    assert again.plan.entry is not None and (again.plan.entry.id, again.plan.entry.position) == ("q0", 1)
    assert again.plan.entry.attachments == ({"type": "image"},)
    later = queue.push(conn, "s", queue.PushInput("ui", "p1", "ask", idempotency_key="k1"), new_id="q3",
                       now_ms=NOW + 5)  # its position and time did not read: answered without them
    assert later.plan.replayed and later.plan.entry is not None and later.plan.entry.id == "q1"
    assert later.entries == ()
    with pytest.raises(IdempotencyConflict):  # the same key for another prompt
        queue.push(conn, "s", queue.PushInput("ui", "other", "ask", idempotency_key="k0"), new_id="q4",
                   now_ms=NOW + 6)


async def test_removing_a_damaged_admission_over_the_wire(tmp_path: Path) -> None:
    """The host path of both: ``session.queueRemove`` of a damaged collaboration admission cancels its
    delivery (``collab.get``), and the admission's push retried with its key afterwards replays it."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as ui:
            src, tgt = await new_session(ui), await new_session(ui)
            out = await deliver(ui, src, tgt)
            d, entry = out["delivery"], out["entry"]
            damage(tmp_path, "UPDATE turn_queue SET lease = 'tekan' WHERE id = ?", entry["id"])
            await ui.call("session.queueRemove", {"sessionId": tgt, "entryId": entry["id"]})
            assert (await ui.call("collab.get", {"deliveryId": d["id"]}))["status"] == "cancelled"
            again = await ui.call("session.queuePush", {
                "sessionId": tgt, "principal": entry["principal"], "idempotencyKey": entry["idempotencyKey"],
                "content": entry["content"], "permissionMode": entry["permissionMode"], "sessionMessageId": d["id"]})
            assert again["replayed"] is True and again["entry"]["id"] == entry["id"]
            assert (await ui.call("session.queueList", {"sessionId": tgt}))["entries"] == []
            # a prompt pushed with a submissionId: its receipt outlives the removal, its key is remembered
            first = await push(ui, tgt, "p", idempotencyKey="k-p", submissionId="sub-p")
            damage(tmp_path, "UPDATE turn_queue SET attachments_json = '[{\"cut' WHERE id = ?", first["entry"]["id"])
            await ui.call("session.queueRemove", {"sessionId": tgt, "entryId": first["entry"]["id"]})
            assert await push(ui, tgt, "p", idempotencyKey="k-p", submissionId="sub-p") == first
            late = await push(ui, tgt, "p", idempotencyKey="k-p", submissionId="sub-p2")
            assert late["replayed"] is True and late["entry"] == first["entry"]
            assert (await ui.call("session.queueList", {"sessionId": tgt}))["entries"] == []
