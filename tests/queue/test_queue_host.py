"""session.queue* through the real gateway (in-process host)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from protocol.models_queue import QueuePushResult, QueueState, QueueTakeResult
from runtime.client import HostClient, RpcError
from runtime.handlers.queue import SERVICE, QueueControl
from runtime.host import RunningHost
from tests.hostkit import client_for, inprocess_host


async def new_session(c: HostClient) -> str:
    return str((await c.call("session.create", {"title": "queue"}))["id"])


async def push(c: HostClient, sid: str, content: str = "next", **extra: Any) -> dict[str, Any]:
    params = {"sessionId": sid, "principal": "ui", "content": content, "permissionMode": "ask", **extra}
    result = await c.call("session.queuePush", params)
    QueuePushResult.model_validate(result)
    return dict(result)


def _att(ref: str, **extra: Any) -> dict[str, Any]:
    return {"type": "attachment", "kind": "file", "name": "notes.txt", "ref": ref, **extra}


async def listing(c: HostClient, sid: str) -> dict[str, Any]:
    state = await c.call("session.queueList", {"sessionId": sid})
    QueueState.model_validate(state)
    return dict(state)


async def contents(c: HostClient, sid: str) -> list[str]:
    return [e["content"] for e in (await listing(c, sid))["entries"]]


async def set_turn(host: RunningHost, sid: str, tid: str, status: str) -> None:
    await host.services.db.write(
        lambda conn: conn.execute(
            "INSERT INTO turns(id, session_id, status, started_at) VALUES (?, ?, ?, 0) "
            "ON CONFLICT(id) DO UPDATE SET status = excluded.status", (tid, sid, status)),
        durable=True,
    )


async def test_push_list_and_positions_through_the_gateway(tmp_path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            r1 = await push(c, sid, "one", attachments=[_att("/w/a.png", kind="image", mimeType="image/png")])
            r2 = await push(c, sid, "two", permissionMode="auto")
            assert r1["replayed"] is False and r1["entry"]["position"] == 1
            assert r2["entry"]["position"] == 2 and r2["entry"]["permissionMode"] == "auto"
            state = await listing(c, sid)
            assert [e["id"] for e in state["entries"]] == [r1["entry"]["id"], r2["entry"]["id"]]
            assert state["entries"][0]["attachments"] == [_att("/w/a.png", kind="image", mimeType="image/png")]
            assert state["held"] is True and "controllerId" not in state


async def test_retried_push_returns_same_row_and_conflicting_input_is_refused(tmp_path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            first = await push(c, sid, "go", idempotencyKey="k1")
            again = await push(c, sid, "go", idempotencyKey="k1")
            assert again["replayed"] is True and again["entry"] == first["entry"]
            with pytest.raises(RpcError) as info:
                await push(c, sid, "other text", idempotencyKey="k1")
            assert info.value.data_code == "IDEMPOTENCY_CONFLICT"
            assert await contents(c, sid) == ["go"]


async def test_push_receipt_replays_the_stored_response(tmp_path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            first = await push(c, sid, "go", submissionId="sub-1")
            again = await push(c, sid, "go", submissionId="sub-1")
            assert again == first
            assert await contents(c, sid) == ["go"]
            row = await host.services.reads.run(
                lambda conn: conn.execute("SELECT method FROM command_receipts WHERE submission_id = 'sub-1'")
                .fetchone())
            assert row == ("session.queuePush",)


async def test_ninth_entry_is_limit_exceeded(tmp_path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            for i in range(8):
                await push(c, sid, f"p{i}")
            with pytest.raises(RpcError) as info:
                await push(c, sid, "p8")
            assert info.value.data_code == "LIMIT_EXCEEDED" and "at most 8" in str(info.value)
            assert len(await contents(c, sid)) == 8


async def test_remove_prioritize_reorder(tmp_path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            ids = [(await push(c, sid, x))["entry"]["id"] for x in "abcde"]
            state = await c.call("session.queueRemove", {"sessionId": sid, "entryId": ids[1]})
            assert [(e["content"], e["position"]) for e in state["entries"]] == [
                ("a", 1), ("c", 3), ("d", 4), ("e", 5)]
            await c.call("session.queuePrioritize", {"sessionId": sid, "entryId": ids[4]})
            state = await c.call("session.queuePrioritize", {"sessionId": sid, "entryId": ids[2]})
            assert [(e["content"], e["priority"]) for e in state["entries"]] == [
                ("e", 1), ("c", 2), ("a", None), ("d", None)]
            state = await c.call("session.queueReorder", {"sessionId": sid, "entryId": ids[3], "direction": "up"})
            assert [e["content"] for e in state["entries"]] == ["e", "c", "d", "a"]
            for entry_id, direction in ((ids[4], "down"), (ids[3], "up")):
                with pytest.raises(RpcError) as info:
                    await c.call("session.queueReorder",
                                 {"sessionId": sid, "entryId": entry_id, "direction": direction})
                assert info.value.data_code == "CONFLICT"
            with pytest.raises(RpcError) as info:
                await c.call("session.queueRemove", {"sessionId": sid, "entryId": ids[1]})
            assert info.value.data_code == "NOT_FOUND"


async def test_attach_take_and_controller_rules(tmp_path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as ui, \
                client_for(host, "sidecar", kind="agent") as agent:
            sid = await new_session(ui)
            await push(ui, sid, "a")
            await push(ui, sid, "b")
            # Held: nothing is handed out before a controller attaches.
            held = await agent.call("session.queueTake", {"sessionId": sid, "controllerId": "ctl"})
            assert held == {"entry": None, "reason": "held"}
            QueueTakeResult.model_validate(held)
            with pytest.raises(RpcError) as info:
                await ui.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl"})
            assert info.value.data_code == "CONFLICT" and "agent" in str(info.value)
            state = await agent.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl"})
            assert state["held"] is False and state["controllerId"] == "ctl"
            with pytest.raises(RpcError) as info:
                await agent.call("session.queueTake", {"sessionId": sid, "controllerId": "intruder"})
            assert info.value.data_code == "CONFLICT"
            taken = await agent.call("session.queueTake", {"sessionId": sid, "controllerId": "ctl"})
            QueueTakeResult.model_validate(taken)
            assert taken["entry"]["content"] == "a"
            assert await contents(ui, sid) == ["b"]


async def test_take_waits_for_a_terminal_turn_event(tmp_path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = await new_session(c)
            await push(c, sid, "a")
            await c.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl"})
            await set_turn(host, sid, "t1", "running")
            busy = await c.call("session.queueTake", {"sessionId": sid, "controllerId": "ctl"})
            assert busy == {"entry": None, "reason": "turnRunning"}
            assert await contents(c, sid) == ["a"]
            await set_turn(host, sid, "t1", "completed")
            got = await c.call("session.queueTake", {"sessionId": sid, "controllerId": "ctl"})
            assert got["entry"]["content"] == "a"
            empty = await c.call("session.queueTake", {"sessionId": sid, "controllerId": "ctl"})
            assert empty == {"entry": None, "reason": "empty"}


async def test_retried_take_returns_the_same_entry(tmp_path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = await new_session(c)
            await push(c, sid, "a")
            await push(c, sid, "b")
            await c.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl"})
            params = {"sessionId": sid, "controllerId": "ctl", "submissionId": "take-1"}
            first = await c.call("session.queueTake", params)
            again = await c.call("session.queueTake", params)
            assert again == first and first["entry"]["content"] == "a"
            assert await contents(c, sid) == ["b"]


async def test_a_retried_attach_after_a_restart_attaches_again(tmp_path) -> None:
    """The first attach's answer was lost with its host: the retry (same key) is answered from the
    receipt, and the controller it names controls the queue again (a restart left it held)."""
    with trio.fail_after(30):
        params = {"controllerId": "ctl", "submissionId": "attach-1"}
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = await new_session(c)
            await push(c, sid, "a")
            first = await c.call("session.queueAttach", {"sessionId": sid, **params})
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "other", kind="agent") as other:
            assert (await listing(c, sid))["held"] is True
            again = await c.call("session.queueAttach", {"sessionId": sid, **params})
            assert again == first
            state = await listing(c, sid)
            assert state["held"] is False and state["controllerId"] == "ctl"
            got = await c.call("session.queueTake", {"sessionId": sid, "controllerId": "ctl"})
            assert got["entry"]["content"] == "a"
            # A queue another controller took since is left to it by a later retry of the old attach.
            await other.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl-2"})
            assert await c.call("session.queueAttach", {"sessionId": sid, **params}) == first
            assert (await listing(c, sid))["controllerId"] == "ctl-2"


async def test_controller_survives_a_session_actor_crash(tmp_path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = await new_session(c)
            await push(c, sid, "a")
            await c.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl"})
            assert host.kill_actor(f"session:{sid}")
            state = await listing(c, sid)
            assert state["held"] is False and state["controllerId"] == "ctl"
            got = await c.call("session.queueTake", {"sessionId": sid, "controllerId": "ctl"})
            assert got["entry"]["content"] == "a"


async def test_every_change_publishes_session_queue(tmp_path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = await new_session(c)
            await c.subscribe(["session.queue"], session_id=sid)
            a = (await push(c, sid, "a", idempotencyKey="k"))["entry"]["id"]
            await push(c, sid, "a", idempotencyKey="k")  # replay: no event
            b = (await push(c, sid, "b"))["entry"]["id"]
            await c.call("session.queuePrioritize", {"sessionId": sid, "entryId": b})
            await c.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl"})
            await c.call("session.queueTake", {"sessionId": sid, "controllerId": "ctl"})
            await c.call("session.queueRemove", {"sessionId": sid, "entryId": a})
            seen = []
            for _ in range(6):
                ev = await c.next_event()
                assert ev.topic == "session.queue" and ev.data["sessionId"] == sid
                QueueState.model_validate(ev.data)
                seen.append(([e["content"] for e in ev.data["entries"]], ev.data["held"]))
            assert seen == [(["a"], True), (["a", "b"], True), (["b", "a"], True), (["b", "a"], False),
                            (["a"], False), ([], False)]


async def test_deleting_the_session_cascades_its_entries(tmp_path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            other = await new_session(c)
            await push(c, sid, "a")
            await push(c, other, "b")
            await c.call("session.delete", {"sessionId": sid})
            count = await host.services.reads.run(
                lambda conn: conn.execute("SELECT session_id, count(*) FROM turn_queue GROUP BY session_id")
                .fetchall())
            assert count == [(other, 1)]
            with pytest.raises(RpcError) as info:
                await listing(c, sid)
            assert info.value.data_code == "SESSION_NOT_FOUND"


async def test_a_recreated_session_id_starts_held_with_an_empty_queue(tmp_path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = "same-id"
            old = await c.call("session.create", {"sessionId": sid, "title": "one"})
            await push(c, sid, "a", idempotencyKey="k1")
            await c.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl"})
            await c.call("session.delete", {"sessionId": sid})
            new = await c.call("session.create", {"sessionId": sid, "title": "two"})
            # The ledger and the controller slot are tied to the session's createdAt (ms), and
            # five durable round trips separate the two creates.
            assert new["createdAt"] != old["createdAt"]
            state = await listing(c, sid)
            assert state["entries"] == [] and state["held"] is True
            fresh = await push(c, sid, "a", idempotencyKey="k1")
            assert fresh["replayed"] is False and fresh["entry"]["position"] == 1


async def test_a_failed_push_leaves_neither_entry_nor_receipt(tmp_path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            host.faults.add("queue.after_apply", nth=1, action="raise")
            with pytest.raises(RpcError):
                await push(c, sid, "a", submissionId="sub-1", idempotencyKey="k1")
            assert await contents(c, sid) == []
            receipts = await host.services.reads.run(
                lambda conn: conn.execute("SELECT count(*) FROM command_receipts").fetchone()[0])
            assert receipts == 0
            retry = await push(c, sid, "a", submissionId="sub-1", idempotencyKey="k1")
            assert retry["replayed"] is False and retry["entry"]["position"] == 1
            assert await contents(c, sid) == ["a"]


async def test_unknown_session_is_session_not_found(tmp_path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            with pytest.raises(RpcError) as info:
                await push(c, "nope", "a")
            assert info.value.data_code == "SESSION_NOT_FOUND"


@pytest.mark.parametrize("attachment", [
    _att("../../etc/passwd"),
    _att("attachments/../../host.token"),
    _att("attachments/a/b"),
    _att("notes.txt"),
    _att("/proj/../../etc/passwd"),
    _att(""),
    {"ref": "../../etc/passwd"},  # a bare reference object: not an attachment block
    {"path": "/proj/../../etc/passwd"},  # a reference object of the caller's own: no '..' either
    {"type": "attachment", "name": "notes.txt", "ref": "attachments/" + "ab" * 32},  # no kind
], ids=lambda a: str(a.get("ref", a.get("path"))) + ("" if a.get("type") else " (no type)"))
async def test_a_queued_attachment_is_checked_like_a_message_attachment_and_nothing_is_queued(
        tmp_path, attachment: dict[str, Any]) -> None:
    """Audit: queuePush kept attachments as given (only inline bytes were refused): a ref such as
    ../../etc/passwd was queued, and the sidecar would hand it to the model. A queued attachment is the
    attachment block the prompt's user message will carry, checked by the one block check
    session.appendMessage runs (protocol.blocks.check_block): a blob ref attachments/<sha256> or an
    absolute path without '..'. Both methods refuse the same input."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            with pytest.raises(RpcError) as info:
                await push(c, sid, "look", attachments=[attachment])
            assert info.value.data_code == "INVALID_PARAMS"
            assert [e["loc"] for e in info.value.data["errors"]] == ["attachments.0"]
            assert (await listing(c, sid))["entries"] == []
            if attachment.get("type") == "attachment":  # the append refuses the same block
                with pytest.raises(RpcError) as appended:
                    await c.call("session.appendMessage", {"sessionId": sid, "message": {
                        "id": "u1", "role": "user", "blocks": [{"type": "text", "text": "look"}, attachment]}})
                assert appended.value.data_code == "INVALID_PARAMS"


async def test_a_queued_attachment_by_blob_or_absolute_path_is_kept(tmp_path) -> None:
    blob, path = _att("attachments/" + "ab" * 32, size=3), _att("/home/ada/src/notes.txt", mimeType="text/plain")
    drive = _att("C:\\Users\\ada\\notes.txt")
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            pushed = await push(c, sid, "look", attachments=[blob, path, drive])
            assert pushed["entry"]["attachments"] == [blob, path, drive]


async def test_a_session_message_id_naming_no_delivery_stays_a_loose_reference(tmp_path) -> None:
    """turn_queue.session_message_id binds an admission to its ledger row (seed 003 §4.6c); an id naming no
    delivery is kept as a loose reference (clients send those), queued once, and it changes no delivery."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            pushed = await push(c, sid, "x", sessionMessageId="col_nothing")
            entries = (await listing(c, sid))["entries"]
            assert [e["id"] for e in entries] == [pushed["entry"]["id"]]
            assert (await c.call("collab.list", {"sessionId": sid}))["deliveries"] == []


async def test_the_controller_book_keeps_only_controlled_queues(tmp_path) -> None:
    """The in-memory controller book (``QueueControl``) lives as long as the host: reading, pushing to or
    taking from a held queue leaves no slot, a deleted session's slot goes with it, and a gone client's
    slots go when its queues are held again. Before, every session ever asked about kept one for good."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path, client_gone_after=0.1) as host:
            control: QueueControl = host.services.get(SERVICE)
            async with client_for(host, "ui", kind="ui") as ui:
                touched = [await new_session(ui) for _ in range(20)]
                for sid in touched:
                    await push(ui, sid, "a")
                    await listing(ui, sid)
                assert control.statistics() == {"controlled": 0}
                async with client_for(host, "sidecar", kind="agent") as agent:
                    for sid in touched[:3]:
                        await agent.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl"})
                        await agent.call("session.queueTake", {"sessionId": sid, "controllerId": "ctl"})
                    assert control.statistics() == {"controlled": 3}
                    await ui.call("session.delete", {"sessionId": touched[0]})
                    assert control.statistics() == {"controlled": 2}
                    assert (await listing(ui, touched[1]))["controllerId"] == "ctl"
                with trio.fail_after(10):
                    while control.statistics()["controlled"]:  # noqa: ASYNC110 - the client-gone timer
                        await trio.sleep(0.05)
                assert (await listing(ui, touched[1]))["held"] is True
