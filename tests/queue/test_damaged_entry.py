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
from store import queue
from store.errors import DamagedRecord
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
