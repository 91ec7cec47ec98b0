"""Seed 003 §4.6b/§4.6c and §11 item 21: the four items a review left open, each decided from the seed's text and
checked against a real ``pi-host serve`` process.

* A completion carries its delivery's ceiling. §4.6c: "The host snapshots the sender's effective permission
  ceiling and rejects a target whose current effective mode exceeds it"; a callback is the host's reply inside
  the delivery's exchange ("completion rows cannot create another automatic callback"), so it carries the
  ceiling the delivery's sender set, and the rule about the target applies to it too: a sender whose current
  mode exceeds that ceiling (it sent with a lower ``permissionCeiling``, or raised its mode since) could never
  begin it, so the host does not queue one it would refuse (the settlement records it ``failed``,
  ``PERMISSION_DENIED``, as it records a callback a full queue cannot take).
* A completion addressed to a deleted sender goes with it. §4.6c's prose says "a delivery record and its
  completion receipt outlive a deleted sender", its DDL cascades ``target_session_id`` and a completion's
  target *is* the sender; the DDL is the schema built from and the same sentence says "unlike
  target_session_id, which cascades". The delivery record (its status, result and error: what the callback
  projected) outlives the sender; the completion row goes, and no retry makes another.
* ``session_collaboration_links``: no seed sentence names a writer or when one is written (§4.6c has only
  the DDL, §7 "adds the session collaboration link and delivery tables"), and no method creates a session on
  another's behalf: left without a writer.
* §4.6b "holds each session's queue until a controller attaches": a second ``agent`` connection that never
  attached cannot take from a queue by quoting the attached controller's id (``queueList`` shows it).

And one §4.6c sentence no other test held: "titles are display snapshots only".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import trio

from runtime.client import HostClient
from tests.acceptance.outsiderkit import client, code_of, error_of, shared_host
from tests.dbkit import rows
from tests.hostkit import HostProcess

PLUGIN = "team"


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    yield from shared_host(tmp_path_factory, "collab-open-items")


def _deliver(src: str, dst: str, key: str, **extra: Any) -> dict[str, Any]:
    return {"pluginId": PLUGIN, "sourceSessionId": src, "targetSessionId": dst, "kind": "task",
            "content": f"job {key}", "idempotencyKey": key, "notifyOnCompletion": True, **extra}


async def _session(c: HostClient, title: str, mode: str) -> str:
    sid: str = (await c.call("session.create", {"title": title, "permissionMode": mode}))["id"]
    return sid


async def _settled(c: HostClient, src: str, dst: str, key: str, **extra: Any) -> dict[str, Any]:
    """A delivery src → dst (callback asked for) begun in dst's turn ``<key>-t`` and settled completed: the
    settlement's answer."""
    d = (await c.call("collab.deliver", _deliver(src, dst, key, **extra)))["delivery"]
    await c.call("session.startTurn", {"sessionId": dst, "turnId": f"{key}-t"})
    await c.call("collab.begin", {"sessionId": dst, "deliveryId": d["id"], "turnId": f"{key}-t"})
    done: dict[str, Any] = await c.call("collab.settle", {"sessionId": dst, "deliveryId": d["id"],
                                                          "turnId": f"{key}-t", "status": "completed",
                                                          "result": "three call sites"})
    await c.call("session.endTurn", {"sessionId": dst, "turnId": f"{key}-t", "status": "completed"})
    return done


async def _admissions(c: HostClient, sid: str) -> list[str | None]:
    return [e.get("sessionMessageId") for e in (await c.call("session.queueList", {"sessionId": sid}))["entries"]]


async def test_a_callback_carries_its_deliverys_ceiling_and_begins_in_a_sender_above_its_worker(
        shared: HostProcess) -> None:
    """A lead (auto) delegates to a reviewer (ask): the delivery's ceiling is the lead's ``auto``; the callback
    carries it, is admitted to the lead's queue and begins in the lead's turn."""
    with trio.fail_after(60):
        async with client(shared, kind="agent") as c:
            lead, rev = await _session(c, "oi1 lead", "auto"), await _session(c, "oi1 rev", "ask")
            done = await _settled(c, lead, rev, "oi1")
            cb = done["callback"]
            assert (cb["kind"], cb["status"], cb["permissionCeiling"], cb["remainingHops"]) == (
                "completion", "queued", done["delivery"]["permissionCeiling"], 0)
            assert done["delivery"]["permissionCeiling"] == "auto"
            assert await _admissions(c, lead) == [cb["id"]]
            await c.call("session.startTurn", {"sessionId": lead, "turnId": "oi1-lead"})
            began = await c.call("collab.begin", {"sessionId": lead, "deliveryId": cb["id"], "turnId": "oi1-lead"})
            assert began["delivery"]["status"] == "running"


@pytest.mark.parametrize("how", ["lower ceiling", "raised since"])
async def test_a_callback_its_sender_could_never_begin_is_recorded_failed_not_queued(
        shared: HostProcess, how: str) -> None:
    """The lead's current mode exceeds the delivery's ceiling (it sent with ``permissionCeiling: ask``, or it was
    ``ask`` and became ``auto`` since): a callback would be refused at its begin (PERMISSION_DENIED), over and
    over, by every controller that took it. The settlement records the one callback ``failed`` with
    ``PERMISSION_DENIED`` and admits nothing to the lead's queue; the delivery itself completes, and a retry
    of the settlement answers the same."""
    tag = "oi2a" if how == "lower ceiling" else "oi2b"
    with trio.fail_after(60):
        async with client(shared, kind="agent") as c:
            lead = await _session(c, f"{tag} lead", "auto" if how == "lower ceiling" else "ask")
            rev = await _session(c, f"{tag} rev", "ask")
            extra = {"permissionCeiling": "ask"} if how == "lower ceiling" else {}
            d = (await c.call("collab.deliver", _deliver(lead, rev, tag, **extra)))["delivery"]
            assert d["permissionCeiling"] == "ask"
            if how == "raised since":
                await c.call("session.update", {"sessionId": lead, "permissionMode": "auto"})
            await c.call("session.startTurn", {"sessionId": rev, "turnId": f"{tag}-t"})
            await c.call("collab.begin", {"sessionId": rev, "deliveryId": d["id"], "turnId": f"{tag}-t"})
            settle = {"sessionId": rev, "deliveryId": d["id"], "turnId": f"{tag}-t", "status": "completed",
                      "result": "done"}
            done = await c.call("collab.settle", settle)
            assert done["delivery"]["status"] == "completed"
            cb = done["callback"]
            assert (cb["kind"], cb["status"], cb["error"], cb["permissionCeiling"]) == (
                "completion", "failed", "PERMISSION_DENIED", "ask")
            assert await _admissions(c, lead) == []
            assert await c.call("collab.settle", settle) == done
            assert rows(shared.data_dir, "SELECT COUNT(*) FROM session_collaboration_messages "
                        "WHERE reply_to_message_id = ?", d["id"]) == [(1,)]
            await c.call("session.startTurn", {"sessionId": lead, "turnId": f"{tag}-lead"})
            code, _ = await error_of(c, "collab.begin", {"sessionId": lead, "deliveryId": cb["id"],
                                                         "turnId": f"{tag}-lead"})
            assert code == "CONFLICT"  # it is not queued: nothing to begin


async def test_a_callback_addressed_to_a_deleted_sender_goes_with_it_and_is_never_made_again(
        shared: HostProcess) -> None:
    """The DDL decides (``target_session_id ... ON DELETE CASCADE``; a completion's target is the sender): the
    completion row goes with the deleted sender; the delivery record stays with its outcome (status, result,
    turn) and ``source.available: false``; a retried settlement answers without making another callback."""
    data = shared.data_dir
    with trio.fail_after(60):
        async with client(shared, kind="agent") as c:
            lead, rev = await _session(c, "oi3 lead", "ask"), await _session(c, "oi3 rev", "ask")
            done = await _settled(c, lead, rev, "oi3")
            did, cb = done["delivery"]["id"], done["callback"]["id"]
            await c.call("session.delete", {"sessionId": lead})
            assert await code_of(c, "collab.get", {"deliveryId": cb}) == "NOT_FOUND"
            kept = await c.call("collab.get", {"deliveryId": did})
            assert (kept["status"], kept["result"], kept["turnId"], kept["source"]["available"]) == (
                "completed", "three call sites", "oi3-t", False)
            assert "callbackId" not in kept
            again = await c.call("collab.settle", {"sessionId": rev, "deliveryId": did, "turnId": "oi3-t",
                                                   "status": "completed", "result": "three call sites"})
            assert "callback" not in again and again["delivery"]["status"] == "completed"
            assert rows(data, "SELECT COUNT(*) FROM session_collaboration_messages WHERE reply_to_message_id = ?",
                        did) == [(0,)]
            assert rows(data, "SELECT COUNT(*) FROM turn_queue WHERE session_id = ?", lead) == [(0,)]


async def test_only_the_connection_that_attached_takes_from_the_queue(shared: HostProcess) -> None:
    """§4.6b: the queue is held "until a controller attaches". A sidecar (clientId ``sc-1``) attaches as
    ``agent-1``; another ``agent`` connection (``sc-2``) reads ``controllerId`` from ``queueList`` and asks
    ``queueTake`` with it: CONFLICT, and the entry stays listed for the controller, which takes it. The same
    sidecar on a second connection (same clientId) still takes: it is the one that attached."""
    with trio.fail_after(60):
        async with client(shared, client_id="sc-1", kind="agent") as one, \
                client(shared, client_id="sc-2", kind="agent") as other, \
                client(shared, client_id="sc-1", kind="agent") as one_again:
            sid = await _session(one, "oi4", "ask")
            for content in ("first", "second"):
                await one.call("session.queuePush", {"sessionId": sid, "principal": "user", "content": content,
                                                     "permissionMode": "ask"})
            await one.call("session.queueAttach", {"sessionId": sid, "controllerId": "agent-1"})
            listed = await other.call("session.queueList", {"sessionId": sid})
            assert listed["controllerId"] == "agent-1"
            code, info = await error_of(other, "session.queueTake", {"sessionId": sid, "controllerId": "agent-1"})
            assert code == "CONFLICT" and info.get("controllerId") == "agent-1"
            state = await one.call("session.queueList", {"sessionId": sid})
            assert [e["content"] for e in state["entries"]] == ["first", "second"]
            taken = await one.call("session.queueTake", {"sessionId": sid, "controllerId": "agent-1"})
            assert taken["entry"]["content"] == "first"
            await one.call("session.startTurn", {"sessionId": sid, "turnId": "oi4-t1"})
            await one.call("session.endTurn", {"sessionId": sid, "turnId": "oi4-t1", "status": "completed"})
            again = await one_again.call("session.queueTake", {"sessionId": sid, "controllerId": "agent-1"})
            assert again["entry"]["content"] == "second"


async def test_titles_are_snapshots_taken_when_the_row_was_written(shared: HostProcess) -> None:
    """§4.6c: "source_session_id and target_session_id are real durable Session IDs; titles are display
    snapshots only". Both sessions are renamed after the delivery: the row keeps the ids and the titles it was
    written with, and so does the input row's provenance; a completion written after the renames snapshots
    the new titles."""
    with trio.fail_after(60):
        async with client(shared, kind="agent") as c:
            lead, rev = await _session(c, "oi5 lead", "ask"), await _session(c, "oi5 rev", "ask")
            d = (await c.call("collab.deliver", _deliver(lead, rev, "oi5")))["delivery"]
            await c.call("session.startTurn", {"sessionId": rev, "turnId": "oi5-t"})
            await c.call("collab.begin", {"sessionId": rev, "deliveryId": d["id"], "turnId": "oi5-t"})
            await c.call("session.rename", {"sessionId": lead, "title": "oi5 lead renamed"})
            await c.call("session.rename", {"sessionId": rev, "title": "oi5 rev renamed"})
            got = await c.call("collab.get", {"deliveryId": d["id"]})
            assert (got["source"], got["target"]) == (
                {"sessionId": lead, "title": "oi5 lead", "available": True},
                {"sessionId": rev, "title": "oi5 rev", "available": True})
            row = (await c.call("session.get", {"sessionId": rev, "full": True}))["messages"][0]
            assert (row["sessionMessage"]["sourceSessionId"], row["sessionMessage"]["sourceTitle"]) == (
                lead, "oi5 lead")
            done = await c.call("collab.settle", {"sessionId": rev, "deliveryId": d["id"], "turnId": "oi5-t",
                                                  "status": "completed", "result": "ok"})
            assert (done["callback"]["source"]["title"], done["callback"]["target"]["title"]) == (
                "oi5 rev renamed", "oi5 lead renamed")
