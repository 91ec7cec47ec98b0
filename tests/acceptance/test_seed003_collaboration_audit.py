"""Seed 003 §4.6c (the session collaboration ledger), §4.6b's ``turn_queue.session_message_id`` binding and §11
item 21, read by an outsider: every clause of item 21 checked against real ``pi-host serve`` processes with the
``collab.*`` methods protocol/README.md documents ("Collaboration"), the transcript read back and the database
read (read-only) for the rows the seed names.

Already held elsewhere, so checked here only where this module's story needs it: the retry/conflict basics and
one ceiling and hop chain on one host (collab/test_collab_host, test_seed003_runs_outsider); hop and ceiling
edges (0, 16, 17, ``inherit``, a raised target across a kill: test_seed003_acceptance_adversarial item 21); a
begin killed at each fault point and a settle killed at its commit (collab/test_crash_retry); the boot fence per
single state (collab/test_collab_host, collab/test_audit_fixes); steering into a delivery's turn
(collab/test_collab_host); a lost database (integrity/test_db_loss_collab_lines).

New here: retries after SIGKILLs at four moments (a deliver's commit, a begin's, a settle's, and the commit of
a turn end that settles its delivery) counted as one row, one turn, one input line and one callback; a deleted
sender's rows and retries; a conflicting retry that changes nothing (row, queue, other target); provenance a
client tries to forge, strip, edit or *regenerate* (``truncateFrom`` mode ``regenerate`` at the delivery's row,
and a human message naming it as the revision it replaces: both made the collaboration input's family carry
ordinary human input until this audit); and one restart with every fence state at once, then a second restart
that replays nothing either.

Not checked: ``session_collaboration_links`` (§4.6c's first table), which no method writes yet.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient
from tests.acceptance.outsiderkit import client, code_of, data_dir, error_of, killed_during, real_host, shared_host
from tests.dbkit import rows
from tests.hostkit import HostProcess, msg

PLUGIN = "team"


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    """One host for the checks that never restart it (each makes sessions of its own)."""
    yield from shared_host(tmp_path_factory, "collab-audit")


def _deliver(src: str, dst: str, key: str, **extra: Any) -> dict[str, Any]:
    return {"pluginId": PLUGIN, "sourceSessionId": src, "targetSessionId": dst, "kind": "task",
            "content": f"job {key}", "idempotencyKey": key, **extra}


async def _session(c: HostClient, title: str, mode: str = "ask") -> str:
    sid: str = (await c.call("session.create", {"title": title, "permissionMode": mode}))["id"]
    return sid


async def _full(c: HostClient, sid: str) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = (await c.call("session.get", {"sessionId": sid, "full": True}))["messages"]
    return got


async def _queue(c: HostClient, sid: str) -> dict[str, Any]:
    got: dict[str, Any] = await c.call("session.queueList", {"sessionId": sid})
    return got


async def _turns(c: HostClient, sid: str) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = (await c.call("session.listTurns", {"sessionId": sid}))["turns"]
    return got


def _ledger(data: Path, *where: str) -> list[tuple[Any, ...]]:
    """The ledger rows (id, kind, status, source, target, turn_id, reply_to) matching ``where`` (SQL, ANDed)."""
    sql = ("SELECT id, kind, status, source_session_id, target_session_id, turn_id, reply_to_message_id "
           "FROM session_collaboration_messages")
    return rows(data, sql + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY created_at, id")


def _input_lines(data: Path, sid: str, did: str) -> list[dict[str, Any]]:
    """The lines of the target's transcript file that carry the delivery's provenance."""
    lines = (data / "sessions" / f"{sid}.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [r for r in records if r.get("type") == "message"
            and ((r.get("meta") or {}).get("sessionMessage") or {}).get("deliveryId") == did]


# --------------------------------------------------------------- ids, idempotency, turn binding, one callback


async def test_ids_are_real_sessions_a_retry_is_the_original_and_a_conflict_changes_nothing(
        shared: HostProcess) -> None:
    """§4.6c: "source_session_id and target_session_id are real durable Session IDs"; "turn_id is assigned when
    the target actually begins the delivery, not when a plugin creates the record"; §4.6b/§4.6c
    "turn_queue.session_message_id binds a queued Agent Host admission to its ledger row. A retry with the same
    (plugin_id, source_session_id, idempotency_key) returns the original delivery; changing its target, body,
    kind, or callback flag fails with IDEMPOTENCY_CONFLICT" — and changes nothing: not the row, not the
    target's queue, not the other session's."""
    data = shared.data_dir
    with trio.fail_after(60):
        async with client(shared, kind="agent") as c:
            lead, rev, other = (await _session(c, "Lead", "accept-edits"), await _session(c, "Reviewer"),
                                await _session(c, "Other"))
            first = await c.call("collab.deliver", _deliver(lead, rev, "k1", notifyOnCompletion=True))
            d = first["delivery"]
            assert first["replayed"] is False and "turnId" not in d
            assert (d["source"]["sessionId"], d["target"]["sessionId"]) == (lead, rev)
            assert _ledger(data, f"id = '{d['id']}'") == [(d["id"], "task", "queued", lead, rev, None, None)]
            assert rows(data, "SELECT plugin_id, idempotency_key FROM session_collaboration_messages WHERE id = ?",
                        d["id"]) == [(PLUGIN, "k1")]
            [entry] = (await _queue(c, rev))["entries"]
            assert entry["sessionMessageId"] == d["id"] and entry["permissionMode"] == "ask"
            assert rows(data, "SELECT session_id FROM turn_queue WHERE session_message_id = ?", d["id"]) == [(rev,)]

            again = await c.call("collab.deliver", _deliver(lead, rev, "k1", notifyOnCompletion=True))
            assert again["replayed"] is True and again["delivery"] == d
            before = (await c.call("collab.get", {"deliveryId": d["id"]}), await _queue(c, rev))
            for change in ({"targetSessionId": other}, {"content": "another body"}, {"kind": "message"},
                           {"notifyOnCompletion": False}):
                code, info = await error_of(c, "collab.deliver", {**_deliver(lead, rev, "k1",
                                                                            notifyOnCompletion=True), **change})
                assert code == "IDEMPOTENCY_CONFLICT" and info["deliveryId"] == d["id"], change
                assert (await c.call("collab.get", {"deliveryId": d["id"]}), await _queue(c, rev)) == before
            assert (await _queue(c, other))["entries"] == []
            assert len(_ledger(data, f"source_session_id = '{lead}'")) == 1

            # bound to the turn that actually begins it: not another session's, not an ended one
            await c.call("session.startTurn", {"sessionId": other, "turnId": "aud1-other"})
            assert await code_of(c, "collab.begin", {"sessionId": rev, "deliveryId": d["id"],
                                                     "turnId": "aud1-other"}) is not None
            await c.call("session.startTurn", {"sessionId": rev, "turnId": "aud1-ended"})
            await c.call("session.endTurn", {"sessionId": rev, "turnId": "aud1-ended", "status": "completed"})
            assert await code_of(c, "collab.begin", {"sessionId": rev, "deliveryId": d["id"],
                                                     "turnId": "aud1-ended"}) == "CONFLICT"
            assert _ledger(data, f"id = '{d['id']}'")[0][2:6] == ("queued", lead, rev, None)
            await c.call("session.startTurn", {"sessionId": rev, "turnId": "aud1-t"})
            began = await c.call("collab.begin", {"sessionId": rev, "deliveryId": d["id"], "turnId": "aud1-t"})
            assert began["delivery"]["turnId"] == "aud1-t" and began["message"]["turnId"] == "aud1-t"
            assert rows(data, "SELECT t.session_id FROM session_collaboration_messages c JOIN turns t "
                              "ON t.id = c.turn_id WHERE c.id = ?", d["id"]) == [(rev,)]
            assert (await _queue(c, rev))["entries"] == []  # the admission was consumed by the begin

            # one callback: a retried settle, a late one, the turn's end make no second
            settle = {"sessionId": rev, "deliveryId": d["id"], "turnId": "aud1-t", "status": "completed",
                      "result": "r" * 5000}
            done = await c.call("collab.settle", settle)
            cb = done["callback"]
            assert (cb["kind"], cb["replyToMessageId"], cb["remainingHops"]) == ("completion", d["id"], 0)
            assert (cb["source"]["sessionId"], cb["target"]["sessionId"]) == (rev, lead)
            assert len(cb["content"]) < 2_100 and done["delivery"]["result"] == "r" * 5000
            assert await c.call("collab.settle", settle) == done
            assert await code_of(c, "collab.settle", {**settle, "status": "failed", "error": "late"}) == "CONFLICT"
            await c.call("session.endTurn", {"sessionId": rev, "turnId": "aud1-t", "status": "completed"})
            assert _ledger(data, f"reply_to_message_id = '{d['id']}'") == [
                (cb["id"], "completion", "queued", rev, lead, None, d["id"])]
            assert [e["sessionMessageId"] for e in (await _queue(c, lead))["entries"]] == [cb["id"]]


async def test_a_deleted_sender_leaves_its_rows_readable_as_unavailable(shared: HostProcess) -> None:
    """§4.6c: "source_session_id deliberately has no foreign key ... so a delivery record ... outlive[s] a
    deleted sender. Read projections therefore report such references with available: false instead of
    dropping the row." After the sender is deleted: a delivery it had settled keeps how it ended; a queued one's
    row is there (with its sender's id), list and get show both with ``available: false``, the same retry still
    returns it, a changed one is still a conflict, a new delivery from the deleted session is refused, and
    settling it makes no callback to nobody."""
    data = shared.data_dir
    with trio.fail_after(60):
        async with client(shared, kind="agent") as c:
            lead, rev = await _session(c, "Gone lead"), await _session(c, "Stays")
            early = (await c.call("collab.deliver", _deliver(lead, rev, "k0", notifyOnCompletion=True)))["delivery"]
            await c.call("session.startTurn", {"sessionId": rev, "turnId": "aud2-t0"})
            await c.call("collab.begin", {"sessionId": rev, "deliveryId": early["id"], "turnId": "aud2-t0"})
            await c.call("collab.settle", {"sessionId": rev, "deliveryId": early["id"], "turnId": "aud2-t0",
                                           "status": "failed", "error": "no access"})
            await c.call("session.endTurn", {"sessionId": rev, "turnId": "aud2-t0", "status": "completed"})
            d = (await c.call("collab.deliver", _deliver(lead, rev, "k1", notifyOnCompletion=True)))["delivery"]
            await c.call("session.delete", {"sessionId": lead})
            # the settled one keeps how it ended (the completion row addressed to the sender went with it: the
            # seed's schema cascades target_session_id)
            kept = await c.call("collab.get", {"deliveryId": early["id"]})
            assert (kept["status"], kept["error"], kept["turnId"], kept["source"]["available"]) == (
                "failed", "no access", "aud2-t0", False)
            assert _ledger(data, f"id = '{d['id']}'") == [(d["id"], "task", "queued", lead, rev, None, None)]
            got = await c.call("collab.get", {"deliveryId": d["id"]})
            assert got["source"] == {"sessionId": lead, "title": "Gone lead", "available": False}
            assert got["target"]["available"] is True
            listed = (await c.call("collab.list", {"sessionId": rev, "direction": "incoming"}))["deliveries"]
            assert [(x["id"], x["source"]["available"]) for x in listed] == [(d["id"], False), (early["id"], False)]
            outgoing = (await c.call("collab.list", {"sessionId": lead, "direction": "outgoing"}))["deliveries"]
            assert [x["id"] for x in outgoing] == [d["id"], early["id"]]
            again = await c.call("collab.deliver", _deliver(lead, rev, "k1", notifyOnCompletion=True))
            assert again["replayed"] is True and again["delivery"]["id"] == d["id"]
            assert await code_of(c, "collab.deliver", _deliver(lead, rev, "k1")) == "IDEMPOTENCY_CONFLICT"
            assert await code_of(c, "collab.deliver", _deliver(lead, rev, "k2")) == "SESSION_NOT_FOUND"
            await c.call("session.startTurn", {"sessionId": rev, "turnId": "aud2-t"})
            await c.call("collab.begin", {"sessionId": rev, "deliveryId": d["id"], "turnId": "aud2-t"})
            done = await c.call("collab.settle", {"sessionId": rev, "deliveryId": d["id"], "turnId": "aud2-t",
                                                  "status": "completed", "result": "done"})
            assert "callback" not in done and done["delivery"]["source"]["available"] is False
            assert _ledger(data, f"id = '{d['id']}'")[0][2:6] == ("completed", lead, rev, "aud2-t")
            assert _ledger(data, f"reply_to_message_id = '{d['id']}'") == []
            assert [r[0] for r in _ledger(data, f"source_session_id = '{lead}'")] == [early["id"], d["id"]]


# ------------------------------------------------------------------------------------------ provenance


async def _begun_with_reply(c: HostClient, tag: str) -> tuple[str, str, str]:
    """A delivery begun in the target's turn, answered and ended: (source, target, input row id)."""
    src, dst = await _session(c, f"{tag} lead"), await _session(c, f"{tag} target")
    d = (await c.call("collab.deliver", _deliver(src, dst, "k1")))["delivery"]
    await c.call("session.startTurn", {"sessionId": dst, "turnId": f"{tag}-t"})
    began = await c.call("collab.begin", {"sessionId": dst, "deliveryId": d["id"], "turnId": f"{tag}-t"})
    await c.call("session.appendMessage", {"sessionId": dst, "turnId": f"{tag}-t",
                                           "message": msg(f"{tag}-a1", "on it", role="assistant")})
    await c.call("session.endTurn", {"sessionId": dst, "turnId": f"{tag}-t", "status": "completed"})
    return src, dst, str(began["message"]["id"])


async def test_collaboration_input_cannot_be_forged_stripped_edited_or_regenerated(shared: HostProcess) -> None:
    """§4.6c: "Collaboration provenance is stored in the transcript line's meta as sessionMessage and is
    projected to the UI as UiMessage.sessionMessage. Host validation prevents forged, stripped, edited, or
    regenerated collaboration input from becoming ordinary human input." The begin's line holds the
    provenance in the file and on the wire. Refused, with the transcript and the ledger unchanged: a new
    message carrying it (append, checkpoint, plugin import) or taking the row's id; a rewrite stripping,
    editing or planting it; a cut at the row in ``edit``, ``retry`` or ``regenerate`` mode; a human message
    that names the row as the message it revises (``meta.revisionRootId``), before or after the row was cut.
    Regenerating the *reply* keeps the row, and switching back to the archived branch brings it back with
    its provenance."""
    data = shared.data_dir
    with trio.fail_after(60):
        async with client(shared, kind="agent") as c:
            src, dst, row_id = await _begun_with_reply(c, "aud3")
            did = row_id.removeprefix("collab-")
            [line] = _input_lines(data, dst, did)
            assert line["meta"]["sessionMessage"]["sourceSessionId"] == src
            held = await _full(c, dst)
            assert held[0]["sessionMessage"] == line["meta"]["sessionMessage"] == held[0]["meta"]["sessionMessage"]
            assert held[0]["sessionMessage"]["pluginId"] == PLUGIN and held[0]["role"] == "user"
            ledger = await c.call("collab.get", {"deliveryId": did})
            provenance = held[0]["sessionMessage"]

            forged = msg("aud3-f", "trust me", meta={"sessionMessage": provenance})
            refused: list[tuple[str, dict[str, Any]]] = [
                ("session.appendMessage", {"sessionId": dst, "message": forged}),
                ("session.appendMessage", {"sessionId": dst, "message": msg(f"collab-{did}x", "mine")}),
                ("session.appendMessage", {"sessionId": dst, "message": msg(
                    "aud3-h", "my own words", meta={"revisionRootId": row_id})}),
            ]
            for method, params in refused:
                assert await code_of(c, method, params) == "INVALID_PARAMS", params["message"]
            keep = [{k: v for k, v in m.items() if k in ("id", "role", "blocks", "meta", "createdAt", "turnId")}
                    for m in held]
            rewrites = [[{**keep[0], "meta": {}}, keep[1]],
                        [{**keep[0], "blocks": [{"type": "text", "text": "something else"}]}, keep[1]],
                        [keep[0], {**keep[1], "meta": {"sessionMessage": provenance}}],
                        [keep[0], keep[1], {**msg("aud3-h2", "mine"), "meta": {"revisionRootId": row_id}}]]
            for body in rewrites:
                assert await code_of(c, "session.replaceMessages", {"sessionId": dst, "messages": body}) \
                    == "PERMISSION_DENIED"
            for mode in ("edit", "retry", "regenerate"):
                assert await code_of(c, "session.truncateFrom", {"sessionId": dst, "messageId": row_id,
                                                                 "mode": mode}) == "PERMISSION_DENIED", mode
            assert await _full(c, dst) == held
            assert await c.call("collab.get", {"deliveryId": did}) == ledger
            assert _input_lines(data, dst, did) == [line]

            # regenerating the reply keeps the input; the archived branch comes back with its provenance
            await c.call("session.truncateFrom", {"sessionId": dst, "messageId": "aud3-a1", "mode": "regenerate"})
            await c.call("session.appendMessage", {"sessionId": dst, "message": msg("aud3-a2", "again",
                                                                                    role="assistant")})
            assert [m["id"] for m in await _full(c, dst)] == [row_id, "aud3-a2"]
            await c.call("session.activateRevision", {"sessionId": dst, "rootUserId": row_id, "revisionIndex": 1})
            back = await _full(c, dst)
            assert [m["id"] for m in back] == [row_id, "aud3-a1"] and back[0]["sessionMessage"] == provenance

            # cut whole (allowed): a human message still cannot take its place as its revision
            await c.call("session.truncateFrom", {"sessionId": dst, "messageId": row_id})
            assert await code_of(c, "session.appendMessage", {"sessionId": dst, "message": msg(
                "aud3-h3", "my own words", meta={"revisionRootId": row_id})}) == "INVALID_PARAMS"
            assert await _full(c, dst) == []

        async with client(shared, client_id="importer", kind="plugin", plugin_id=PLUGIN) as plugin:
            for message in (forged, msg("aud3-i", "x", meta={"revisionRootId": row_id})):
                assert await code_of(plugin, "plugins.importSession", {
                    "sourceId": "chatlog", "externalId": f"aud3-{message['id']}", "messages": [message]}) \
                    == "INVALID_PARAMS"


# ------------------------------------------------------------------------------- ceilings, hops, cancel


async def test_ceilings_and_hops_are_enforced_and_cancel_keeps_the_target(shared: HostProcess) -> None:
    """§4.6c: "The host snapshots the sender's effective permission ceiling and rejects a target whose current
    effective mode exceeds it. Autonomous chains decrement remaining_hops; completion rows cannot create another
    automatic callback"; item 21 "cancel without deleting the target session". A refused delivery writes no
    row and no queue entry; a chain of one hop forwards once; a completion's turn cannot forward. Cancelling a
    queued delivery takes its admission only; cancelling a running one leaves its turn, its input row and the
    session; a retried cancel answers the same and a settle after it is refused; no callback."""
    data = shared.data_dir
    with trio.fail_after(60):
        async with client(shared, kind="agent") as c:
            lead, rev, wild, third = (await _session(c, "aud4 lead", "accept-edits"), await _session(c, "aud4 rev"),
                                      await _session(c, "aud4 wild", "auto"), await _session(c, "aud4 third"))
            assert await code_of(c, "collab.deliver", _deliver(lead, wild, "up")) == "PERMISSION_DENIED"
            assert _ledger(data, f"target_session_id = '{wild}'") == [] and (await _queue(c, wild))["entries"] == []
            d = (await c.call("collab.deliver", _deliver(lead, rev, "k1", notifyOnCompletion=True,
                                                         remainingHops=1)))["delivery"]
            assert (d["permissionCeiling"], d["remainingHops"]) == ("accept-edits", 1)
            queued = (await c.call("collab.deliver", _deliver(lead, rev, "k2", notifyOnCompletion=True)))["delivery"]
            await c.call("session.startTurn", {"sessionId": rev, "turnId": "aud4-r"})
            await c.call("collab.begin", {"sessionId": rev, "deliveryId": d["id"], "turnId": "aud4-r"})
            fwd = (await c.call("collab.deliver", _deliver(rev, third, "fwd", remainingHops=9)))["delivery"]
            assert (fwd["remainingHops"], fwd["permissionCeiling"]) == (0, "ask")
            await c.call("session.startTurn", {"sessionId": third, "turnId": "aud4-3"})
            await c.call("collab.begin", {"sessionId": third, "deliveryId": fwd["id"], "turnId": "aud4-3"})
            code, info = await error_of(c, "collab.deliver", _deliver(third, lead, "fwd2"))
            assert code == "LIMIT_EXCEEDED" and info["parentDeliveryId"] == fwd["id"]

            before = await _full(c, rev)
            out = await c.call("collab.cancel", {"deliveryId": queued["id"]})
            assert out["delivery"]["status"] == "cancelled"
            assert [e.get("sessionMessageId") for e in (await _queue(c, rev))["entries"]] == []
            out = await c.call("collab.cancel", {"deliveryId": d["id"]})
            assert out["delivery"]["status"] == "cancelled" and out["delivery"]["turnId"] == "aud4-r"
            assert await c.call("collab.cancel", {"deliveryId": d["id"]}) == out
            assert await code_of(c, "collab.settle", {"sessionId": rev, "deliveryId": d["id"], "turnId": "aud4-r",
                                                      "status": "completed"}) == "CONFLICT"
            assert (await c.call("session.get", {"sessionId": rev}))["session"]["id"] == rev
            assert await _full(c, rev) == before and before[0]["sessionMessage"]["deliveryId"] == d["id"]
            assert [(t["id"], t["status"]) for t in await _turns(c, rev)] == [("aud4-r", "running")]
            await c.call("session.endTurn", {"sessionId": rev, "turnId": "aud4-r", "status": "completed"})
            assert _ledger(data, "kind = 'completion'", f"target_session_id = '{lead}'") == []

            # a completion's turn reacts to a result: it cannot forward work
            await c.call("collab.settle", {"sessionId": third, "deliveryId": fwd["id"], "turnId": "aud4-3",
                                           "status": "completed"})
            await c.call("session.endTurn", {"sessionId": third, "turnId": "aud4-3", "status": "completed"})
            mine = (await c.call("collab.deliver", _deliver(third, rev, "cb-src", notifyOnCompletion=True)))
            await c.call("session.startTurn", {"sessionId": rev, "turnId": "aud4-r2"})
            await c.call("collab.begin", {"sessionId": rev, "deliveryId": mine["delivery"]["id"], "turnId": "aud4-r2"})
            cb = (await c.call("collab.settle", {"sessionId": rev, "deliveryId": mine["delivery"]["id"],
                                                 "turnId": "aud4-r2", "status": "completed"}))["callback"]
            await c.call("session.startTurn", {"sessionId": third, "turnId": "aud4-3b"})
            await c.call("collab.begin", {"sessionId": third, "deliveryId": cb["id"], "turnId": "aud4-3b"})
            assert await code_of(c, "collab.deliver", _deliver(third, lead, "from-cb")) == "LIMIT_EXCEEDED"
            settled = await c.call("collab.settle", {"sessionId": third, "deliveryId": cb["id"],
                                                     "turnId": "aud4-3b", "status": "completed"})
            assert "callback" not in settled
            assert _ledger(data, f"reply_to_message_id = '{cb['id']}'") == []


# ------------------------------------------------------------------------------ SIGKILL, retry, one effect


async def test_retries_after_kills_at_four_moments_make_one_row_one_turn_one_line_one_callback(
        tmp_path: Path) -> None:
    """Item 21 "preserve ... idempotency across retries" and "create no duplicate completion callback", with the
    host SIGKILLed right after a step committed and before it answered: a deliver, a begin, a settle, and the
    end of a turn that still ran its delivery (which settles it: README "A turn that ends with its delivery
    still running settles it"). Each is retried with its ``submissionId`` (the first answer) and without it:
    one ledger row, one queue admission while queued, one input line, one turn that began it, one completion.
    A begin cut by the kill leaves the delivery interrupted (its turn ended with the host), not replayed; the
    deliveries begun after that get exactly one callback each."""
    data = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(data, kind="agent") as (_proc, c):
            lead, rev = await _session(c, "Lead"), await _session(c, "Reviewer")
        keyed = {**_deliver(lead, rev, "k1", notifyOnCompletion=True), "submissionId": "dlv-1"}
        await killed_during(data, "collab.deliver.after_commit:1", [("collab.deliver", keyed)], kind="agent")
        async with real_host(data, kind="agent") as (_proc, c):
            first = await c.call("collab.deliver", keyed)
            did = first["delivery"]["id"]
            assert first["replayed"] is False and first["entry"]["sessionMessageId"] == did
            assert await c.call("collab.deliver", keyed) == first
            plain = await c.call("collab.deliver", {k: v for k, v in keyed.items() if k != "submissionId"})
            assert plain["replayed"] is True and plain["delivery"]["id"] == did
            assert [e["sessionMessageId"] for e in (await _queue(c, rev))["entries"]] == [did]
            second = (await c.call("collab.deliver", _deliver(lead, rev, "k2", notifyOnCompletion=True)))["delivery"]
            third = (await c.call("collab.deliver", _deliver(lead, rev, "k3", notifyOnCompletion=True)))["delivery"]
        assert [r[0] for r in _ledger(data)] == [did, second["id"], third["id"]]

        control = {"sessionId": rev, "controllerId": "ctl"}
        begin = {"sessionId": rev, "deliveryId": did, "turnId": "t1", "submissionId": "beg-1"}
        await killed_during(data, "collab.begin.after_commit:1", [
            ("session.queueAttach", control), ("session.queueTake", control),
            ("session.startTurn", {"sessionId": rev, "turnId": "t1"}), ("collab.begin", begin)], kind="agent")
        async with real_host(data, kind="agent") as (_proc, c):
            answer = await c.call("collab.begin", begin)
            assert (answer["delivery"]["turnId"], answer["message"]["id"]) == ("t1", f"collab-{did}")
            assert await c.call("collab.begin", {k: v for k, v in begin.items() if k != "submissionId"}) == answer
            got = await c.call("collab.get", {"deliveryId": did})
            assert (got["status"], got["turnId"]) == ("interrupted", "t1")
            assert [(t["id"], t["status"]) for t in await _turns(c, rev)] == [("t1", "aborted")]
            assert [e["sessionMessageId"] for e in (await _queue(c, rev))["entries"]] == [second["id"], third["id"]]
        assert len(_input_lines(data, rev, did)) == 1

        settle = {"sessionId": rev, "deliveryId": second["id"], "turnId": "t2", "status": "completed",
                  "result": "all good", "submissionId": "set-1"}
        await killed_during(data, "collab.settle.after_commit:1", [
            ("session.queueAttach", control), ("session.queueTake", control),
            ("session.startTurn", {"sessionId": rev, "turnId": "t2"}),
            ("collab.begin", {"sessionId": rev, "deliveryId": second["id"], "turnId": "t2"}),
            ("collab.settle", settle)], kind="agent")
        async with real_host(data, kind="agent") as (_proc, c):
            done = await c.call("collab.settle", settle)
            assert done["delivery"]["status"] == "completed" and done["callback"]["replyToMessageId"] == second["id"]
            assert await c.call("collab.settle", {k: v for k, v in settle.items() if k != "submissionId"}) == done
            assert [e["sessionMessageId"] for e in (await _queue(c, lead))["entries"]] == [done["callback"]["id"]]
            assert sorted((t["id"], t["status"]) for t in await _turns(c, rev)) == [("t1", "aborted"),
                                                                                   ("t2", "aborted")]
            again = await c.call("collab.deliver", _deliver(lead, rev, "k2", notifyOnCompletion=True))
            assert again["replayed"] is True and again["delivery"]["status"] == "completed"

        end = {"sessionId": rev, "turnId": "t3", "status": "completed", "submissionId": "end-3"}
        await killed_during(data, "session.endTurn.after_commit:1", [
            ("session.queueAttach", control), ("session.queueTake", control),
            ("session.startTurn", {"sessionId": rev, "turnId": "t3"}),
            ("collab.begin", {"sessionId": rev, "deliveryId": third["id"], "turnId": "t3"}),
            ("session.endTurn", end)], kind="agent")
        async with real_host(data, kind="agent") as (_proc, c):
            ended = await c.call("session.endTurn", end)
            repeat = await c.call("session.endTurn", {k: v for k, v in end.items() if k != "submissionId"})
            assert repeat["turn"] == ended["turn"] and ended["turn"]["status"] == "completed"
            got = await c.call("collab.get", {"deliveryId": third["id"]})
            assert (got["status"], got["turnId"]) == ("completed", "t3") and "callbackId" in got
            assert [e["sessionMessageId"] for e in (await _queue(c, lead))["entries"]] == [
                done["callback"]["id"], got["callbackId"]]
        assert _ledger(data, "kind = 'completion'") == [
            (done["callback"]["id"], "completion", "queued", rev, lead, None, second["id"]),
            (got["callbackId"], "completion", "queued", rev, lead, None, third["id"])]
        assert [(r[0], r[2], r[5]) for r in _ledger(data, "kind = 'task'")] == [
            (did, "interrupted", "t1"), (second["id"], "completed", "t2"), (third["id"], "completed", "t3")]
        assert rows(data, "SELECT id, status FROM turns WHERE session_id = ? ORDER BY id", rev) == [
            ("t1", "aborted"), ("t2", "aborted"), ("t3", "completed")]
        assert [len(_input_lines(data, rev, x)) for x in (did, second["id"], third["id"])] == [1, 1, 1]
        assert rows(data, "SELECT COUNT(*) FROM turn_queue WHERE session_id = ?", rev) == [(0,)]


# ------------------------------------------------------------------------------------------- the fence


async def test_a_restart_holds_admitted_work_interrupts_the_rest_and_replays_nothing(tmp_path: Path) -> None:
    """§4.6c: "On startup, queued work that still has a turn_queue row remains held for the Agent Host
    controller. Running work and queued deliveries without a queue admission are marked interrupted; the
    startup fence never replays a turn without a new controller admission." One SIGKILL with every state at
    once: queued with its admission, taken by the controller (no turn began with it), a completion callback
    queued in the sender, running in a turn, and queued whose admission row is gone (removed from the stopped
    host's database, as a lost write would leave it). After the restart the first three are held (the queues
    say ``held``), the last two interrupted; no turn starts, no line is written, the provenance of the running
    one's input is still in its transcript. A second restart changes nothing more, and a cancel of held work
    then keeps the target session."""
    data = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(data, kind="agent") as (proc, c):
            lead = await _session(c, "Lead")
            held_t, taken_t, run_t, lost_t, done_t = [await _session(c, n) for n in
                                                      ("held", "taken", "running", "lost", "done")]
            ids = {name: (await c.call("collab.deliver", _deliver(lead, sid, name)))["delivery"]["id"]
                   for name, sid in (("held", held_t), ("taken", taken_t), ("running", run_t), ("lost", lost_t))}
            notify = (await c.call("collab.deliver", _deliver(lead, done_t, "done", notifyOnCompletion=True)))
            for sid in (taken_t, run_t, done_t):
                await c.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl"})
                await c.call("session.queueTake", {"sessionId": sid, "controllerId": "ctl"})
            for sid, name in ((run_t, "running"), (done_t, "done")):
                did = ids[name] if name in ids else notify["delivery"]["id"]
                await c.call("session.startTurn", {"sessionId": sid, "turnId": f"turn-{name}"})
                await c.call("collab.begin", {"sessionId": sid, "deliveryId": did, "turnId": f"turn-{name}"})
            ids["callback"] = (await c.call("collab.settle", {
                "sessionId": done_t, "deliveryId": notify["delivery"]["id"], "turnId": "turn-done",
                "status": "completed", "result": "ok"}))["callback"]["id"]
            await c.call("session.endTurn", {"sessionId": done_t, "turnId": "turn-done", "status": "completed"})
            proc.kill9()
        conn = sqlite3.connect(data / "pi.sqlite")
        try:
            assert conn.execute("DELETE FROM turn_queue WHERE session_message_id = ?", (ids["lost"],)).rowcount == 1
            conn.commit()
        finally:
            conn.close()
        lines = {sid: (data / "sessions" / f"{sid}.jsonl").read_bytes() for sid in (lead, held_t, taken_t, run_t,
                                                                                    lost_t, done_t)}
        expected = {"held": "queued", "taken": "queued", "callback": "queued", "running": "interrupted",
                    "lost": "interrupted"}
        for boot in range(2):
            async with real_host(data, kind="agent") as (_proc, c):
                fence = (await c.call("host.status", {}))["boot"]["fence"]
                assert (fence["interruptedDeliveries"], fence["heldDeliveries"], fence["deliveryAdmissions"]) == \
                    ((2, 3, 3) if boot == 0 else (0, 3, 3))
                assert {n: (await c.call("collab.get", {"deliveryId": d}))["status"] for n, d in ids.items()} \
                    == expected
                for sid, name in ((held_t, "held"), (taken_t, "taken"), (lead, "callback")):
                    queue = await _queue(c, sid)
                    assert queue["held"] is True and [e["sessionMessageId"] for e in queue["entries"]] == [ids[name]]
                assert (await _queue(c, lost_t))["entries"] == [] and (await _queue(c, run_t))["entries"] == []
                assert [(t["id"], t["status"]) for t in await _turns(c, run_t)] == [("turn-running", "aborted")]
                for sid in (held_t, taken_t, lost_t, lead):
                    assert await _turns(c, sid) == []
                [row] = await _full(c, run_t)
                assert row["sessionMessage"]["deliveryId"] == ids["running"] and row["turnId"] == "turn-running"
                again = await c.call("collab.deliver", _deliver(lead, run_t, "running"))
                assert again["replayed"] is True and again["delivery"]["status"] == "interrupted"
            assert {sid: (data / "sessions" / f"{sid}.jsonl").read_bytes() for sid in lines} == lines
        async with real_host(data, kind="agent") as (_proc, c):
            assert (await c.call("collab.cancel", {"deliveryId": ids["held"]}))["delivery"]["status"] == "cancelled"
            assert (await c.call("session.get", {"sessionId": held_t}))["session"]["id"] == held_t
            assert (await _queue(c, held_t))["entries"] == []
            assert await code_of(c, "collab.cancel", {"deliveryId": ids["running"]}) == "CONFLICT"
