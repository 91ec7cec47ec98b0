"""The session collaboration ledger on a real host (seed 003 §4.6c, §11.21): one test per rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import ClientEvent, HostClient
from tests.dbkit import rows
from tests.hostkit import client_for, inprocess_host, msg
from tests.turns.turnkit import end, rpc_error, start


async def session(c: HostClient, title: str, **fields: Any) -> str:
    return str((await c.call("session.create", {"title": title, **fields}))["id"])


async def deliver(c: HostClient, src: str, tgt: str, key: str = "k1", **extra: Any) -> dict[str, Any]:
    params = {"pluginId": "team", "sourceSessionId": src, "targetSessionId": tgt, "kind": "task",
              "content": f"please do {key}", "idempotencyKey": key, **extra}
    result: dict[str, Any] = await c.call("collab.deliver", params)
    return result


async def begin(c: HostClient, tgt: str, did: str, tid: str) -> dict[str, Any]:
    result: dict[str, Any] = await c.call("collab.begin", {"sessionId": tgt, "deliveryId": did, "turnId": tid})
    return result


async def settle(c: HostClient, tgt: str, did: str, tid: str, status: str = "completed", **extra: Any) -> Any:
    return await c.call("collab.settle", {"sessionId": tgt, "deliveryId": did, "turnId": tid, "status": status,
                                          **extra})


async def events(c: HostClient, count: int, limit: float = 5.0) -> list[ClientEvent]:
    got: list[ClientEvent] = []
    with trio.fail_after(limit):
        async for event in c:
            got.append(event)
            if len(got) == count:
                break
    return got


async def test_a_delivery_is_a_ledger_row_bound_to_a_queue_admission_of_its_target(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "plugin") as c, \
                client_for(host, "ui", kind="ui") as ui:
            src, tgt = await session(c, "Lead"), await session(c, "Reviewer")
            await ui.subscribe(["collab.delivery", "session.queue"], session_id=tgt)
            out = await deliver(c, src, tgt, notifyOnCompletion=True)
            d = out["delivery"]
            assert (d["status"], d["kind"], d["remainingHops"], d["permissionCeiling"]) == ("queued", "task", 4, "ask")
            assert d["source"] == {"sessionId": src, "title": "Lead", "available": True}
            assert d["target"] == {"sessionId": tgt, "title": "Reviewer", "available": True}
            assert "turnId" not in d  # bound only when the target begins it
            assert out["entry"]["sessionMessageId"] == d["id"] and out["entry"]["principal"] == "plugin:team"
            assert rows(tmp_path, "SELECT session_id, session_message_id FROM turn_queue") == [(tgt, d["id"])]
            seen = await events(ui, 2)
            assert {e.topic for e in seen} == {"collab.delivery", "session.queue"}


async def test_a_retry_returns_the_original_and_a_changed_one_is_an_idempotency_conflict(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "plugin") as c:
            src, tgt, other = await session(c, "a"), await session(c, "b"), await session(c, "c")
            first = await deliver(c, src, tgt, notifyOnCompletion=True)
            again = await deliver(c, src, tgt, notifyOnCompletion=True)
            assert again["replayed"] is True and again["delivery"]["id"] == first["delivery"]["id"]
            assert "entry" not in again
            for change in ({"targetSessionId": other}, {"content": "other body"}, {"kind": "message"},
                           {"notifyOnCompletion": False}):
                params = {"pluginId": "team", "sourceSessionId": src, "targetSessionId": tgt, "kind": "task",
                          "content": "please do k1", "idempotencyKey": "k1", "notifyOnCompletion": True, **change}
                err = await rpc_error(c.call("collab.deliver", params))
                assert err.data_code == "IDEMPOTENCY_CONFLICT", change
            assert rows(tmp_path, "SELECT COUNT(*) FROM session_collaboration_messages") == [(1,)]
            assert rows(tmp_path, "SELECT COUNT(*) FROM turn_queue") == [(1,)]
            # the same key of another plugin or another source is another delivery
            await deliver(c, tgt, src)
            assert rows(tmp_path, "SELECT COUNT(*) FROM session_collaboration_messages") == [(2,)]


async def test_a_target_above_the_senders_ceiling_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "plugin") as c:
            src = await session(c, "careful", permissionMode="accept-edits")
            wild, tame = await session(c, "wild", permissionMode="auto"), await session(c, "tame", permissionMode="ask")
            err = await rpc_error(deliver(c, src, wild))
            assert err.data_code == "PERMISSION_DENIED" and err.data["permissionCeiling"] == "accept-edits"
            assert rows(tmp_path, "SELECT COUNT(*) FROM session_collaboration_messages") == [(0,)]
            lowered = await deliver(c, src, tame, permissionCeiling="ask")
            assert lowered["delivery"]["permissionCeiling"] == "ask"
            upward = await deliver(c, src, tame, "k2", permissionCeiling="auto")
            assert upward["delivery"]["permissionCeiling"] == "accept-edits"  # never above the sender's
            await c.call("session.update", {"sessionId": tame, "permissionMode": "auto"})  # raised after sending
            await start(c, tame, "t1")
            err = await rpc_error(begin(c, tame, lowered["delivery"]["id"], "t1"))
            assert err.data_code == "PERMISSION_DENIED"
            assert rows(tmp_path, "SELECT status, turn_id FROM session_collaboration_messages WHERE id = ?",
                        lowered["delivery"]["id"]) == [("queued", None)]
            assert rows(tmp_path, "SELECT COUNT(*) FROM messages WHERE session_id = ?", tame) == [(0,)]


async def test_an_autonomous_chain_spends_its_hops(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "plugin") as c:
            a, b, d, e = [await session(c, n) for n in "abde"]
            first = (await deliver(c, a, b, remainingHops=1))["delivery"]
            await start(c, b, "tb")
            await begin(c, b, first["id"], "tb")
            forwarded = (await deliver(c, b, d))["delivery"]  # b is running a delivery: a chain step
            assert forwarded["remainingHops"] == 0
            await start(c, d, "td")
            await begin(c, d, forwarded["id"], "td")
            err = await rpc_error(deliver(c, d, e))
            assert err.data_code == "LIMIT_EXCEEDED" and err.data["reason"] == "HOPS"
            independent = await deliver(c, e, a)  # not inside a chain: a fresh budget
            assert independent["delivery"]["remainingHops"] == 4


async def test_begin_binds_the_actual_turn_and_writes_the_input_with_its_provenance(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "plugin") as c, \
                client_for(host, "ui", kind="ui") as ui:
            src, tgt = await session(c, "Lead"), await session(c, "Reviewer")
            d = (await deliver(c, src, tgt))["delivery"]
            await start(c, tgt, "t-other")
            await end(c, tgt, "t-other")  # one running turn per session
            await start(c, tgt, "t1")
            began = await begin(c, tgt, d["id"], "t1")
            assert began["delivery"]["status"] == "running" and began["delivery"]["turnId"] == "t1"
            assert began["message"]["turnId"] == "t1" and began["message"]["role"] == "user"
            assert rows(tmp_path, "SELECT COUNT(*) FROM turn_queue WHERE session_message_id = ?", d["id"]) == \
                [(0,)]  # the admission it was not taken from is consumed: it has begun
            assert await begin(c, tgt, d["id"], "t1") == began  # a retry: the same, no second line
            assert rows(tmp_path, "SELECT COUNT(*) FROM messages WHERE session_id = ?", tgt) == [(1,)]
            page = await ui.call("session.get", {"sessionId": tgt})
            row = page["messages"][0]
            assert row["blocks"] == [{"type": "text", "text": d["content"]}]
            assert row["sessionMessage"]["deliveryId"] == d["id"]
            assert row["sessionMessage"]["sourceSessionId"] == src and row["sessionMessage"]["pluginId"] == "team"
            assert row["meta"]["sessionMessage"] == row["sessionMessage"]
            second = (await deliver(c, src, tgt, "k2"))["delivery"]
            assert (await rpc_error(begin(c, tgt, second["id"], "t1"))).data_code == "CONFLICT"  # t1 is taken
            assert (await rpc_error(begin(c, tgt, second["id"], "t-other"))).data_code == "CONFLICT"  # ended
            assert (await rpc_error(begin(c, src, second["id"], "t1"))).data_code == "NOT_FOUND"  # not its target


async def test_settling_writes_the_result_and_calls_back_exactly_once(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "plugin") as c:
            src, tgt = await session(c, "Lead"), await session(c, "Reviewer")
            d = (await deliver(c, src, tgt, notifyOnCompletion=True))["delivery"]
            await start(c, tgt, "t1")
            await begin(c, tgt, d["id"], "t1")
            long = "x" * 5000
            done = await settle(c, tgt, d["id"], "t1", result=long)
            assert done["delivery"]["status"] == "completed" and done["delivery"]["result"] == long
            cb = done["callback"]
            assert (cb["kind"], cb["replyToMessageId"], cb["status"]) == ("completion", d["id"], "queued")
            assert cb["source"]["sessionId"] == tgt and cb["target"]["sessionId"] == src
            assert cb["content"].startswith("[completed] xxx") and len(cb["content"]) < 2100  # bounded projection
            assert rows(tmp_path, "SELECT session_message_id FROM turn_queue WHERE session_id = ?", src) == \
                [(cb["id"],)]
            assert await settle(c, tgt, d["id"], "t1", result=long) == done  # a retry
            err = await rpc_error(settle(c, tgt, d["id"], "t1", "failed", error="late"))
            assert err.data_code == "CONFLICT"
            assert rows(tmp_path, "SELECT COUNT(*) FROM session_collaboration_messages WHERE kind = 'completion'") \
                == [(1,)]
            # the completion runs in the source and never calls back again
            await start(c, src, "ts")
            await begin(c, src, cb["id"], "ts")
            settled = await settle(c, src, cb["id"], "ts")
            assert settled["delivery"]["status"] == "completed" and "callback" not in settled
            assert rows(tmp_path, "SELECT COUNT(*) FROM session_collaboration_messages") == [(2,)]


async def test_no_callback_without_the_flag_or_for_a_deleted_sender(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "plugin") as c:
            src, tgt = await session(c, "Lead"), await session(c, "Reviewer")
            quiet = (await deliver(c, src, tgt))["delivery"]
            loud = (await deliver(c, src, tgt, "k2", notifyOnCompletion=True))["delivery"]
            await start(c, tgt, "t1")
            await begin(c, tgt, quiet["id"], "t1")
            assert "callback" not in await settle(c, tgt, quiet["id"], "t1")
            await end(c, tgt, "t1")  # one running turn per session
            await start(c, tgt, "t2")
            await begin(c, tgt, loud["id"], "t2")
            await c.call("session.delete", {"sessionId": src})
            done = await settle(c, tgt, loud["id"], "t2")
            assert "callback" not in done and done["delivery"]["source"]["available"] is False
            got = await c.call("collab.get", {"deliveryId": loud["id"]})
            assert got["source"] == {"sessionId": src, "title": "Lead", "available": False}
            listed = await c.call("collab.list", {"sessionId": tgt, "direction": "incoming"})
            assert {x["id"] for x in listed["deliveries"]} == {quiet["id"], loud["id"]}
            assert all(x["source"]["available"] is False for x in listed["deliveries"])


async def test_cancel_removes_the_admission_and_keeps_the_target_session(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "plugin") as c:
            src, tgt = await session(c, "Lead"), await session(c, "Reviewer")
            queued = (await deliver(c, src, tgt))["delivery"]
            running = (await deliver(c, src, tgt, "k2"))["delivery"]
            await start(c, tgt, "t1")
            await begin(c, tgt, running["id"], "t1")
            assert (await c.call("collab.cancel", {"deliveryId": queued["id"]}))["delivery"]["status"] == "cancelled"
            assert rows(tmp_path, "SELECT COUNT(*) FROM turn_queue WHERE session_message_id = ?", queued["id"]) == \
                [(0,)]
            assert (await c.call("collab.cancel", {"deliveryId": running["id"]}))["delivery"]["status"] == "cancelled"
            assert (await rpc_error(settle(c, tgt, running["id"], "t1"))).data_code == "CONFLICT"
            assert (await c.call("session.get", {"sessionId": tgt}))["session"]["id"] == tgt  # still there
            assert rows(tmp_path, "SELECT COUNT(*) FROM sessions WHERE id = ?", tgt) == [(1,)]


async def test_removing_a_deliverys_admission_from_the_queue_cancels_the_delivery(tmp_path: Path) -> None:
    """session.queueRemove of the entry a delivery is bound to: without its admission the delivery can never
    begin. It was left queued until the next start interrupted it; it is cancelled in the same
    transaction, announced to both ends, and a retry of the remove changes nothing more."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "plugin") as c, \
                client_for(host, "ui", kind="ui") as ui:
            src, tgt = await session(c, "Lead"), await session(c, "Reviewer")
            out = await deliver(c, src, tgt, notifyOnCompletion=True)
            other = await c.call("session.queuePush", {"sessionId": tgt, "principal": "me", "content": "later",
                                                       "permissionMode": "inherit"})
            await ui.subscribe(["collab.delivery"], session_id=src)
            params = {"sessionId": tgt, "entryId": out["entry"]["id"], "submissionId": "rm-1"}
            state = await c.call("session.queueRemove", params)
            assert [e["id"] for e in state["entries"]] == [other["entry"]["id"]]
            got = await c.call("collab.get", {"deliveryId": out["delivery"]["id"]})
            assert got["status"] == "cancelled"
            [seen] = await events(ui, 1)
            assert seen.topic == "collab.delivery" and seen.data["delivery"]["status"] == "cancelled"
            assert await c.call("session.queueRemove", params) == state  # the receipt answers the retry
            assert rows(tmp_path, "SELECT status FROM session_collaboration_messages") == [("cancelled",)]
            assert rows(tmp_path, "SELECT COUNT(*) FROM session_collaboration_messages WHERE kind = 'completion'") \
                == [(0,)]  # cancelled, not settled: no callback, as with collab.cancel
            removed = (await c.call("session.queueRemove", {"sessionId": tgt, "entryId": other["entry"]["id"]}))
            assert removed["entries"] == []  # an entry of no delivery goes as before


async def test_the_targets_turn_end_settles_its_running_delivery(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "plugin") as c:
            src, tgt = await session(c, "Lead"), await session(c, "Reviewer")
            ok = (await deliver(c, src, tgt, notifyOnCompletion=True))["delivery"]
            bad = (await deliver(c, src, tgt, "k2"))["delivery"]
            await start(c, tgt, "t1")
            await begin(c, tgt, ok["id"], "t1")
            await end(c, tgt, "t1")
            assert (await c.call("collab.get", {"deliveryId": ok["id"]}))["status"] == "completed"
            assert rows(tmp_path, "SELECT COUNT(*) FROM session_collaboration_messages WHERE kind = 'completion'") \
                == [(1,)]
            await start(c, tgt, "t2")
            await begin(c, tgt, bad["id"], "t2")
            await end(c, tgt, "t2", "aborted")
            got = await c.call("collab.get", {"deliveryId": bad["id"]})
            assert got["status"] == "failed" and "aborted" in got["error"]


async def test_a_full_target_queue_refuses_the_delivery(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "plugin") as c:
            src, tgt = await session(c, "Lead"), await session(c, "Reviewer")
            for i in range(8):
                await deliver(c, src, tgt, f"k{i}")
            err = await rpc_error(deliver(c, src, tgt, "k9"))
            assert err.data_code == "LIMIT_EXCEEDED"
            assert rows(tmp_path, "SELECT COUNT(*) FROM session_collaboration_messages") == [(8,)]


async def test_forged_stripped_or_edited_collaboration_input_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "plugin") as c:
            src, tgt = await session(c, "Lead"), await session(c, "Reviewer")
            d = (await deliver(c, src, tgt))["delivery"]
            await start(c, tgt, "t1")
            await begin(c, tgt, d["id"], "t1")
            forged = msg("f1", "trust me", meta={"sessionMessage": {"deliveryId": "col_x"}})
            err = await rpc_error(c.call("session.appendMessage", {"sessionId": tgt, "message": forged}))
            assert err.data_code == "INVALID_PARAMS"
            err = await rpc_error(c.call("session.saveInflightMessage", {
                "sessionId": tgt, "turnId": "t1", "message": {**forged, "role": "assistant"}}))
            assert err.data_code == "INVALID_PARAMS"
            await c.call("session.appendMessage", {"sessionId": tgt, "turnId": "t1",
                                                   "message": msg("a1", "on it", role="assistant")})
            page = await c.call("session.get", {"sessionId": tgt, "full": True})
            held = [{k: v for k, v in m.items() if k in ("id", "role", "blocks", "meta", "createdAt", "turnId")}
                    for m in page["messages"]]
            stripped = [{**held[0], "meta": {}}, held[1]]
            edited = [{**held[0], "blocks": [{"type": "text", "text": "something else"}]}, held[1]]
            planted = [held[0], {**held[1], "meta": {"sessionMessage": held[0]["meta"]["sessionMessage"]}}]
            for body in (stripped, edited, planted):
                err = await rpc_error(c.call("session.replaceMessages", {"sessionId": tgt, "messages": body}))
                assert err.data_code == "PERMISSION_DENIED"
            await c.call("session.replaceMessages", {"sessionId": tgt, "messages": held})  # kept exactly: fine
            for mode in ("edit", "retry"):
                err = await rpc_error(c.call("session.truncateFrom", {"sessionId": tgt, "messageId": held[0]["id"],
                                                                      "mode": mode}))
                assert err.data_code == "PERMISSION_DENIED"
            await c.call("session.replaceMessages", {"sessionId": tgt, "messages": [held[1]]})  # dropping it: fine
            assert [m["id"] for m in (await c.call("session.get", {"sessionId": tgt}))["messages"]] == ["a1"]


async def test_steering_a_delivery_turn_is_human_input_with_its_provenance_stripped(tmp_path: Path) -> None:
    """Seed 003, active-turn steering: steering into a claimed delivery's turn is extra human input; it does
    not inherit the delivery's origin, and a client-supplied ``meta.sessionMessage`` in it is stripped."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "plugin") as c, \
                client_for(host, "ui", kind="ui") as ui:
            src, tgt = await session(c, "Lead"), await session(c, "Reviewer")
            d = (await deliver(c, src, tgt))["delivery"]
            await start(c, tgt, "t1")
            begun = await begin(c, tgt, d["id"], "t1")
            provenance = (await c.call("session.get", {"sessionId": tgt}))["messages"][0]["sessionMessage"]
            steer = msg("s1", "also check the tests", meta={"steering": True, "sessionMessage": provenance})
            out = await ui.call("session.appendMessage", {"sessionId": tgt, "turnId": "t1", "message": steer})
            assert out["message"]["id"] == "s1"
            page = await ui.call("session.get", {"sessionId": tgt, "full": True})
            by_id = {m["id"]: m for m in page["messages"]}
            assert by_id["s1"]["steering"] is True and by_id["s1"]["turnId"] == "t1"
            assert "sessionMessage" not in by_id["s1"] and "sessionMessage" not in by_id["s1"].get("meta", {})
            assert by_id[begun["message"]["id"]]["sessionMessage"] == provenance  # the delivery's row keeps it
            # a message that is not steering still may not carry it
            forged = msg("f1", "trust me", meta={"sessionMessage": provenance})
            assert (await rpc_error(ui.call("session.appendMessage", {"sessionId": tgt, "message": forged}))
                    ).data_code == "INVALID_PARAMS"
            # nor can a plugin import plant it
            async with client_for(host, "p1", kind="plugin", plugin_id="team") as plugin:
                err = await rpc_error(plugin.call("plugins.importSession", {
                    "sourceId": "chatlog", "externalId": "x1", "messages": [forged]}))
                assert err.data_code == "INVALID_PARAMS"


@pytest.mark.parametrize("state", ["queued", "taken", "running"])
async def test_startup_holds_admitted_work_and_interrupts_the_rest(tmp_path: Path, state: str) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "plugin", kind="agent") as c:
            src, tgt = await session(c, "Lead"), await session(c, "Reviewer")
            d = (await deliver(c, src, tgt))["delivery"]
            if state != "queued":
                await c.call("session.queueAttach", {"sessionId": tgt, "controllerId": "ctl"})
                await c.call("session.queueTake", {"sessionId": tgt, "controllerId": "ctl"})
            if state == "running":
                await start(c, tgt, "t1")
                await begin(c, tgt, d["id"], "t1")
        async with inprocess_host(tmp_path) as host, client_for(host, "plugin", kind="agent") as c:
            fence = (await c.call("host.status", {}))["boot"]["fence"]
            assert (fence["heldDeliveries"], fence["interruptedDeliveries"], fence["deliveryAdmissions"]) == \
                ((1, 0, 1) if state in ("queued", "taken") else (0, 1, 0))
            got = await c.call("collab.get", {"deliveryId": d["id"]})
            if state in ("queued", "taken"):  # taken and no turn began with it: offered again (a lease)
                assert got["status"] == "queued"
                held = await c.call("session.queueList", {"sessionId": tgt})
                assert held["held"] is True and held["entries"][0]["sessionMessageId"] == d["id"]
            else:
                assert got["status"] == "interrupted"
            assert rows(tmp_path, "SELECT COUNT(*) FROM messages WHERE session_id = ?", tgt) == \
                [(1 if state == "running" else 0,)]  # never replayed
