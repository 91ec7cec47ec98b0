"""Audit fixes in the collaboration ledger (seed 003 §4.6c): queue bindings, hop budgets, trashed ends.

Each test names the hole it closes: a queue entry that binds a delivery it does not hold, a hop
budget a turn regained by cancelling or settling the delivery it runs, a delivery into the trash.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from store import collab, fence, queue
from store.errors import InvalidInput
from tests.collab.test_collab_host import begin, deliver, rows, session
from tests.hostkit import client_for, inprocess_host
from tests.queue.conftest import NOW_MS, add_session, open_queue_db
from tests.turns.turnkit import end, rpc_error, start


def push_params(sid: str, content: str, **extra: Any) -> dict[str, Any]:
    return {"sessionId": sid, "principal": "ui", "content": content, "permissionMode": "ask", **extra}


# ---------------------------------------------------------------------------
# 1. queue bindings


async def test_a_queue_push_binding_a_delivery_addressed_to_another_session_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as c:
            src, tgt, other = await session(c, "a"), await session(c, "b"), await session(c, "c")
            d = (await deliver(c, src, tgt))["delivery"]
            err = await rpc_error(c.call("session.queuePush", push_params(other, "x", sessionMessageId=d["id"])))
            assert err.data_code == "INVALID_PARAMS" and err.data["field"] == "sessionMessageId"
            assert rows(tmp_path, "SELECT COUNT(*) FROM turn_queue WHERE session_id = ?", other) == [(0,)]
            # an id that names no delivery stays a loose reference: accepted, and it can change no delivery
            loose = await c.call("session.queuePush", push_params(other, "y", sessionMessageId="col_nothing"))
            await c.call("session.queueRemove", {"sessionId": other, "entryId": loose["entry"]["id"]})
            assert (await c.call("collab.get", {"deliveryId": d["id"]}))["status"] == "queued"
            assert rows(tmp_path, "SELECT session_id, session_message_id FROM turn_queue") == [(tgt, d["id"])]


async def test_a_second_admission_of_a_delivery_is_refused_and_a_retried_first_one_replays(
        tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as c:
            src, tgt = await session(c, "a"), await session(c, "b")
            out = await deliver(c, src, tgt)
            d, entry = out["delivery"], out["entry"]
            err = await rpc_error(c.call("session.queuePush", push_params(tgt, "x", sessionMessageId=d["id"])))
            assert err.data_code == "INVALID_PARAMS" and err.data["entryId"] == entry["id"]
            # the push that made the admission, retried: answered as a replay, not refused as a second one
            again = await c.call("session.queuePush", {
                "sessionId": tgt, "principal": entry["principal"], "idempotencyKey": entry["idempotencyKey"],
                "content": entry["content"], "permissionMode": entry["permissionMode"], "sessionMessageId": d["id"]})
            assert again["replayed"] is True and again["entry"]["id"] == entry["id"]
            assert rows(tmp_path, "SELECT id FROM turn_queue WHERE session_message_id = ?", d["id"]) == \
                [(entry["id"],)]


def test_removing_an_entry_elsewhere_that_names_a_delivery_does_not_cancel_it(tmp_path: Path) -> None:
    """A binding written into another session's queue before pushes were checked (or by any other
    path): removing it must not cancel the delivery its own target still holds."""
    conn = open_queue_db(tmp_path / "pi.sqlite")
    try:
        for sid in ("src", "tgt", "other"):
            add_session(conn, sid)
        row, _, _ = collab.deliver(conn, delivery_id="col_1", entry_id="q_1", plugin_id="team",
                                   source_session_id="src", target_session_id="tgt", kind="task", content="do",
                                   notify_on_completion=False, idempotency_key="k1", remaining_hops=None,
                                   permission_ceiling=None, now_ms=NOW_MS)
        inp = queue.PushInput(principal="ui", content="forged", permission_mode="ask", session_message_id="col_1")
        with pytest.raises(InvalidInput):  # refused at the push ...
            queue.push(conn, "other", inp, new_id="q_forged", now_ms=NOW_MS)
        forged = queue.plan_push(queue.load(conn, "other"), inp, new_id="q_forged", now_ms=NOW_MS)
        queue.apply(conn, "other", forged, now_ms=NOW_MS)  # ... so write it as an older host could have
        out, changed = collab.remove_admission(conn, "other", "q_forged", now_ms=NOW_MS + 1)
        assert out.plan.changed and changed.deliveries == []
        assert collab.get(conn, "col_1")["status"] == "queued"
        assert [e.id for e in queue.list_entries(conn, "tgt")] == ["q_1"]
        # its own admission still cancels it
        _, changed = collab.remove_admission(conn, "tgt", "q_1", now_ms=NOW_MS + 2)
        assert [d["status"] for d in changed.deliveries] == ["cancelled"]
    finally:
        conn.close()


def test_a_restart_does_not_count_a_binding_in_another_queue_as_the_admission(tmp_path: Path) -> None:
    """Boot's fence keeps a queued delivery held only while its own target queue admits it: a binding
    another session's queue holds (written before pushes were checked) is no admission."""
    conn = open_queue_db(tmp_path / "pi.sqlite")
    try:
        for sid in ("src", "tgt", "other"):
            add_session(conn, sid)
        collab.deliver(conn, delivery_id="col_1", entry_id="q_1", plugin_id="team", source_session_id="src",
                       target_session_id="tgt", kind="task", content="do", notify_on_completion=False,
                       idempotency_key="k1", remaining_hops=None, permission_ceiling=None, now_ms=NOW_MS)
        inp = queue.PushInput(principal="ui", content="forged", permission_mode="ask", session_message_id="col_1")
        queue.apply(conn, "other", queue.plan_push(queue.load(conn, "other"), inp, new_id="q_forged",
                                                   now_ms=NOW_MS), now_ms=NOW_MS)
        assert fence.interrupt_deliveries(conn, now_ms=NOW_MS + 1, running=True) == 0  # its own admission holds it
        queue.remove(conn, "tgt", "q_1", now_ms=NOW_MS + 2)
        assert fence.interrupt_deliveries(conn, now_ms=NOW_MS + 3, running=True) == 1
        assert collab.get(conn, "col_1")["status"] == "interrupted"
    finally:
        conn.close()


# ---------------------------------------------------------------------------
# 2. hop budget of a running turn


@pytest.mark.parametrize("ending", ["cancel", "settle"])
async def test_a_turn_keeps_its_hop_budget_after_its_delivery_is_cancelled_or_settled(
        tmp_path: Path, ending: str) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "plugin") as c:
            a, b, x = await session(c, "a"), await session(c, "b"), await session(c, "x")
            d = (await deliver(c, a, b, remainingHops=0))["delivery"]
            await start(c, b, "tb")
            await begin(c, b, d["id"], "tb")
            assert (await rpc_error(deliver(c, b, x, "f1"))).data_code == "LIMIT_EXCEEDED"
            if ending == "cancel":
                await c.call("collab.cancel", {"deliveryId": d["id"]})
            else:
                await c.call("collab.settle", {"sessionId": b, "deliveryId": d["id"], "turnId": "tb",
                                               "status": "completed", "result": "done early"})
            # tb still runs the delivery's input: it forwards on the same (spent) budget
            err = await rpc_error(deliver(c, b, x, "f2", remainingHops=16))
            assert (err.data_code, err.data["parentDeliveryId"], err.data["reason"]) == \
                ("LIMIT_EXCEEDED", d["id"], "HOPS")
            assert rows(tmp_path, "SELECT COUNT(*) FROM session_collaboration_messages WHERE source_session_id = ?",
                        b) == [(0,)]
            await end(c, b, "tb")
            fresh = (await deliver(c, b, x, "f3", remainingHops=2))["delivery"]  # a later turn starts its own
            assert fresh["remainingHops"] == 2


# ---------------------------------------------------------------------------
# 3. trashed ends


async def test_a_delivery_to_a_trashed_target_is_session_not_found_like_one_from_a_trashed_source(
        tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as c:
            src, tgt = await session(c, "a"), await session(c, "b")
            await c.call("sessions.trash", {"sessionId": tgt})
            err = await rpc_error(deliver(c, src, tgt))
            assert err.data_code == "SESSION_NOT_FOUND" and err.data["sessionId"] == tgt
            assert rows(tmp_path, "SELECT COUNT(*) FROM session_collaboration_messages") == [(0,)]
            assert rows(tmp_path, "SELECT COUNT(*) FROM turn_queue") == [(0,)]
            await c.call("sessions.restore", {"sessionId": tgt})
            await c.call("sessions.trash", {"sessionId": src})
            assert (await rpc_error(deliver(c, src, tgt, "k2"))).data_code == "SESSION_NOT_FOUND"
            await c.call("sessions.restore", {"sessionId": src})
            assert (await deliver(c, src, tgt))["delivery"]["status"] == "queued"
