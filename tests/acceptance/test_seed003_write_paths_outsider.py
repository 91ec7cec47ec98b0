"""Seed 003 §5 "Write paths (consistency)", §4.6b turn_queue and §4.14 notifications read by an outsider:
black-box checks over a real host's WebSocket gateway with nasty-but-legal inputs, and a SIGKILL + restart
where the seed makes a crash claim. Each test quotes the statement it checks; the methods are the ones
protocol/README.md documents for each write path."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import ClientClosed, HostClient, open_client
from tests.acceptance.outsiderkit import all_pages, code_of, say
from tests.acceptance.outsiderkit import real_host as outsider_host
from tests.hostkit import HostProcess, client_for, inprocess_host, msg, start_host_process


@asynccontextmanager
async def real_host(data_dir: Path) -> AsyncIterator[tuple[HostProcess, HostClient]]:
    """The outsider host with an agent client."""
    async with outsider_host(data_dir, kind="agent") as pair:
        yield pair


async def get(c: HostClient, sid: str) -> dict[str, Any]:
    result: dict[str, Any] = await c.call("session.get", {"sessionId": sid})
    return result


async def ids(c: HostClient, sid: str) -> list[str]:
    return [m["id"] for m in (await get(c, sid))["messages"]]


# ------------------------------------------------------------------------------- in-flight checkpoints (§5)

async def test_message_end_removes_the_checkpoint_only_when_its_id_matches(tmp_path: Path) -> None:
    """§5: "assistant/tool message end — append message line; remove the in-flight checkpoint when its id
    matches". A tool row and another assistant row ending while the reply streams leave the checkpoint; the
    reply's own final row removes it."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t/1:a"})
            await say(c, sid, "u1", "question", turnId="t/1:a")
            partial = msg("a.1", "half an ans", role="assistant", turnId="t/1:a")
            assert (await c.call("session.saveInflightMessage",
                                 {"sessionId": sid, "turnId": "t/1:a", "message": partial}))["saved"] is True
            await say(c, sid, "tool-1", "ls output", role="tool", turnId="t/1:a", toolName="Bash")
            await say(c, sid, "a.0", "a preamble", role="assistant", turnId="t/1:a")
            view = await get(c, sid)
            assert view["inflight"]["message"]["id"] == "a.1"
            assert view["inflight"]["message"]["blocks"] == partial["blocks"]
            await say(c, sid, "a.1", "half an answer, finished", role="assistant", turnId="t/1:a")
            view = await get(c, sid)
            assert "inflight" not in view or view["inflight"] is None
            assert [m["id"] for m in view["messages"]] == ["u1", "tool-1", "a.0", "a.1"]


async def test_save_inflight_is_a_no_op_for_an_empty_message_and_an_indexed_id(tmp_path: Path) -> None:
    """§5: "streaming reply checkpoint (session.saveInflightMessage) — atomically replace <id>.inflight.json;
    no-op for an empty message or an id already indexed". A no-op must not replace (or remove) the checkpoint
    that is already there."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            await say(c, sid, "u1", "question", turnId="t1")
            await say(c, sid, "a0", "done already", role="assistant", turnId="t1")
            live = msg("a1", "streaming…", role="assistant", turnId="t1")
            await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1", "message": live})
            empty = {"id": "a2", "role": "assistant", "turnId": "t1", "blocks": []}
            r = await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1", "message": empty})
            assert r["saved"] is False and r.get("reason") == "empty"
            indexed = msg("a0", "a rewrite of a landed row", role="assistant", turnId="t1")
            r = await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1", "message": indexed})
            assert r["saved"] is False and r.get("reason") == "already_indexed"
            view = await get(c, sid)
            assert view["inflight"]["message"]["id"] == "a1"
            assert view["inflight"]["message"]["blocks"] == live["blocks"]
            assert [m["blocks"][0]["text"] for m in view["messages"]] == ["question", "done already"]
            assert not (tmp_path / "sessions" / f"{sid}.inflight.json").read_text().count("a rewrite")


async def test_completed_end_turn_keeps_an_unindexed_checkpoint_and_boot_promotes_it_complete(tmp_path: Path) -> None:
    """§5: "completed/error: remove the in-flight checkpoint only when its id is already indexed; otherwise
    leave it for the outbox or boot" and "The boot sweep promotes a leftover checkpoint whose final row never
    landed: as complete when the turn already completed". SIGKILL after the endTurn, restart: the reply is a
    row of the completed turn, not an interrupted one, and the turn's notification exists exactly once."""
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(60):
        async with real_host(data) as (proc, c):
            created = await c.call("session.create", {})
            sid = created["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            await say(c, sid, "u1", "question", turnId="t1")
            reply = msg("a1", "the whole answer", role="assistant", turnId="t1")
            await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1", "message": reply})
            ended = await c.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed"})
            assert ended["turn"]["status"] == "completed"
            assert ended["notification"]["kind"] == "task.completed"
            assert ended["notification"]["sessionTitle"] == created["title"]
            assert (await get(c, sid))["inflight"]["message"]["id"] == "a1"
            proc.kill9()
        async with real_host(data) as (proc, c):
            view = await get(c, sid)
            assert [m["id"] for m in view["messages"]] == ["u1", "a1"]
            promoted = view["messages"][1]
            assert promoted["blocks"] == reply["blocks"]
            assert promoted.get("turnId") == "t1"
            assert not (promoted.get("meta") or {}).get("interrupted")
            assert view.get("inflight") is None
            hits = (await c.call("search.query", {"query": "whole answer"}))["results"]
            assert [(h["sessionId"], h["messageId"]) for h in hits] == [(sid, "a1")]
            listed = await c.call("notifications.list", {})
            assert [n["turnId"] for n in listed["notifications"]] == ["t1"]
            again = await c.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed"})
            assert "notification" not in again or again["notification"] is None
            assert len((await c.call("notifications.list", {}))["notifications"]) == 1


async def test_recover_inflight_promotes_complete_after_a_completed_turn_and_aborted_otherwise(
        tmp_path: Path) -> None:
    """§5: "recoverInflight: append the leftover as complete when the turn is completed, otherwise as
    aborted, when its final row never landed"."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="agent") as c:
            done = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": done, "turnId": "t1"})
            await say(c, done, "u1", "q", turnId="t1")
            await c.call("session.saveInflightMessage", {"sessionId": done, "turnId": "t1",
                                                         "message": msg("a1", "full", role="assistant",
                                                                        turnId="t1")})
            await c.call("session.endTurn", {"sessionId": done, "turnId": "t1", "status": "completed",
                                             "createNotification": False})
            r = await c.call("session.recoverInflight", {"sessionId": done, "turnId": "t1"})
            assert r["action"] == "promoted" and r["turn"]["status"] == "completed"
            assert r["message"]["id"] == "a1" and r["message"].get("turnId") == "t1"
            assert (await c.call("session.recoverInflight", {"sessionId": done}))["action"] == "none"
            row = (await get(c, done))["messages"][-1]
            assert row["id"] == "a1" and not (row.get("meta") or {}).get("interrupted")

            live = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": live, "turnId": "t2"})
            await say(c, live, "u2", "q", turnId="t2")
            await c.call("session.saveInflightMessage", {"sessionId": live, "turnId": "t2",
                                                         "message": msg("a2", "part", role="assistant",
                                                                        turnId="t2")})
            r = await c.call("session.recoverInflight", {"sessionId": live, "turnId": "t2"})
            assert r["action"] == "promoted" and r["turn"]["status"] == "aborted"
            row = (await get(c, live))["messages"][-1]
            assert row["id"] == "a2" and (row.get("meta") or {}).get("interrupted") is True
            hits = (await c.call("search.query", {"query": "part", "sessionId": live}))["results"]
            assert [h["messageId"] for h in hits] == ["a2"]
            assert (await c.call("notifications.list", {}))["notifications"] == []


# ------------------------------------------------------------------------------------ notifications (§4.14)

async def test_end_turn_notifications_error_code_abort_and_repeats(tmp_path: Path) -> None:
    """§4.14: "inserts task.completed for completed or task.failed for error in the same transaction ...
    aborted never inserts a row", "Repeating a terminal update cannot duplicate a notification ... The RPC
    result includes the record only when this call inserted it", "session deletion also cascades its rows",
    and mark-read / clear change no turn or transcript data."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "日本語 ✓"}))["id"]
            other = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "bad"})
            r = await c.call("session.endTurn", {"sessionId": sid, "turnId": "bad", "status": "error",
                                                 "errorCode": "provider/429: rate"})
            assert r["notification"]["kind"] == "task.failed"
            assert r["notification"]["errorCode"] == "provider/429: rate"
            assert r["notification"]["sessionTitle"] == "日本語 ✓"
            r = await c.call("session.endTurn", {"sessionId": sid, "turnId": "bad", "status": "error",
                                                 "errorCode": "provider/429: rate"})
            assert r.get("notification") is None
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "stop"})
            r = await c.call("session.endTurn", {"sessionId": sid, "turnId": "stop", "status": "aborted"})
            assert r.get("notification") is None
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "quiet"})
            r = await c.call("session.endTurn", {"sessionId": sid, "turnId": "quiet", "status": "completed",
                                                 "createNotification": False})
            assert r.get("notification") is None
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "ok"})
            await c.call("session.endTurn", {"sessionId": sid, "turnId": "ok", "status": "completed"})
            await c.call("session.startTurn", {"sessionId": other, "turnId": "o1"})
            await c.call("session.endTurn", {"sessionId": other, "turnId": "o1", "status": "completed"})
            listed = await c.call("notifications.list", {})
            assert sorted(n["turnId"] for n in listed["notifications"]) == ["bad", "o1", "ok"]
            assert listed["unreadCount"] == 3
            first = listed["notifications"][0]["id"]
            assert (await c.call("notifications.markRead", {"ids": [first, first]}))["updated"] == 1
            assert (await c.call("notifications.markRead", {"ids": [first]}))["updated"] == 0
            assert (await c.call("notifications.list", {"unreadOnly": True}))["unreadCount"] == 2
            await c.call("session.delete", {"sessionId": sid})
            listed = await c.call("notifications.list", {})
            assert [n["turnId"] for n in listed["notifications"]] == ["o1"]
            assert (await c.call("notifications.clear", {}))["deleted"] == 1
            assert (await get(c, other))["session"]["id"] == other


# --------------------------------------------------------------------------- checkpoints (compaction lines)

async def _compacted(c: HostClient, p: str = "") -> str:
    """Three exchanges ``{p}u0``/``{p}a0`` ... and a checkpoint through ``{p}a1`` (message ids are global:
    a second session of the same ids gets host-scoped ones, so tests pass distinct prefixes)."""
    sid: str = (await c.call("session.create", {}))["id"]
    for i in range(3):
        await say(c, sid, f"{p}u{i}", f"question {i}")
        await say(c, sid, f"{p}a{i}", f"answer {i}", role="assistant")
    await c.call("session.appendCompaction", {"sessionId": sid, "compaction": {
        "id": f"{p}cp-1", "summary": "summary of 0 and 1", "firstKeptMessageId": f"{p}u2",
        "throughMessageId": f"{p}a1", "tokensBefore": 0, "retainedTail": []}})
    return sid


async def test_truncate_and_replace_preserve_only_a_checkpoint_whose_boundary_remains(tmp_path: Path) -> None:
    """§5: truncateFrom "preserve only a checkpoint whose boundary remains"; replaceMessages likewise."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await _compacted(c)
            assert [cp["id"] for cp in (await get(c, sid))["compactions"]] == ["cp-1"]
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a2", "mode": "regenerate"})
            assert [cp["id"] for cp in (await get(c, sid))["compactions"]] == ["cp-1"]
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "retry"})
            view = await get(c, sid)
            assert [m["id"] for m in view["messages"]] == ["u0", "a0", "u1"]
            assert view["compactions"] == []
            hits = (await c.call("search.query", {"query": "answer", "sessionId": sid}))["results"]
            assert [h["messageId"] for h in hits] == ["a0"]

            sid = await _compacted(c, "r")
            full = (await get(c, sid))["messages"]
            plain = [{k: m[k] for k in ("id", "role", "blocks") if k in m} for m in full]
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": plain[:4]})
            assert [cp["id"] for cp in (await get(c, sid))["compactions"]] == ["rcp-1"]
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": plain[:1] + plain[2:3]})
            view = await get(c, sid)
            assert [m["id"] for m in view["messages"]] == ["ru0", "ru1"]
            assert view["compactions"] == []
            assert (await c.call("search.query", {"query": "answer", "sessionId": sid}))["results"] == []


async def test_fork_copies_the_checkpoint_only_when_its_boundary_is_included(tmp_path: Path) -> None:
    """§5: "session fork — write a new transcript with remapped message/tool-call ids; copy/remap the
    checkpoint only when its boundary is included"."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await _compacted(c)
            short = await c.call("session.fork", {"sessionId": sid, "throughMessageId": "u1"})
            view = await get(c, short["id"])
            assert len(view["messages"]) == 3 and view["compactions"] == []
            whole = await c.call("session.fork", {"sessionId": sid, "throughMessageId": "a1"})
            view = await get(c, whole["id"])
            child_ids = [m["id"] for m in view["messages"]]
            assert len(child_ids) == 4
            [cp] = view["compactions"]
            assert cp["throughMessageId"] == child_ids[3]
            assert cp["summary"] == "summary of 0 and 1"
            full = await c.call("session.fork", {"sessionId": sid})
            view = await get(c, full["id"])
            [cp] = view["compactions"]
            child_ids = [m["id"] for m in view["messages"]]
            assert cp["throughMessageId"] == child_ids[3]
            assert cp.get("firstKeptMessageId") == child_ids[4]


async def test_append_compaction_boundary_must_be_a_durable_message(tmp_path: Path) -> None:
    """§5: "context checkpoint (session.appendCompaction) — append typed checkpoint line after its referenced
    message boundary": a checkpoint naming a message the transcript does not hold has no boundary to follow
    and is refused, leaving no checkpoint behind."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await say(c, sid, "u0", "q")
            code = await code_of(c, "session.appendCompaction", {"sessionId": sid, "compaction": {
                "id": "cp-x", "summary": "s", "throughMessageId": "nowhere", "tokensBefore": 1}})
            assert code is not None
            assert (await get(c, sid))["compactions"] == []


# ------------------------------------------------------------------------------------- turn queue (§4.6b)

def _push(sid: str, content: str, key: str | None = None, principal: str = "ui") -> dict[str, Any]:
    params: dict[str, Any] = {"sessionId": sid, "principal": principal, "content": content,
                              "permissionMode": "ask"}
    if key is not None:
        params["idempotencyKey"] = key
    return params


async def test_queue_positions_idempotency_cap_priority_and_restart(tmp_path: Path) -> None:
    """§4.6b: "position is per session and only grows, so a removed entry never reorders the rest", "principal
    plus idempotency_key make a retried push return the same row; a reused key with a different input_hash
    fails with IDEMPOTENCY_CONFLICT", "A session holds at most eight entries", promotion order, "queueReorder
    ... refuses a promoted entry", "After a restart the module lists every entry, holds each session's queue
    until a controller attaches", "Deleting the session cascades to its entries". SIGKILL mid-way."""
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(60):
        async with real_host(data) as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            e = [(await c.call("session.queuePush", _push(sid, f"p{i}", key=f"k{i}")))["entry"] for i in range(3)]
            again = await c.call("session.queuePush", _push(sid, "p1", key="k1"))
            assert again["replayed"] is True and again["entry"]["id"] == e[1]["id"]
            # the same key under another principal is a different row
            bob = await c.call("session.queuePush", _push(sid, "p1", key="k1", principal="bob"))
            assert bob["replayed"] is False and bob["entry"]["id"] != e[1]["id"]
            assert await code_of(c, "session.queuePush", _push(sid, "other", key="k1")) == "IDEMPOTENCY_CONFLICT"
            await c.call("session.queueRemove", {"sessionId": sid, "entryId": e[1]["id"]})
            later = (await c.call("session.queuePush", _push(sid, "", key=None)))["entry"]
            assert later["position"] > bob["entry"]["position"] > e[2]["position"] > e[0]["position"]
            for i in range(4):
                await c.call("session.queuePush", _push(sid, f"fill{i}"))
            state = await c.call("session.queueList", {"sessionId": sid})
            assert len(state["entries"]) == 8
            assert await code_of(c, "session.queuePush", _push(sid, "ninth")) == "LIMIT_EXCEEDED"
            # a replay of an existing key is not a ninth entry
            assert (await c.call("session.queuePush", _push(sid, "p0", key="k0")))["replayed"] is True
            order = [x["id"] for x in state["entries"]]
            listed_before = state["entries"]
            await c.call("session.queuePrioritize", {"sessionId": sid, "entryId": order[5]})
            state = await c.call("session.queuePrioritize", {"sessionId": sid, "entryId": order[2]})
            expect = [order[5], order[2]] + [x for x in order if x not in (order[5], order[2])]
            assert [x["id"] for x in state["entries"]] == expect
            assert await code_of(c, "session.queueReorder", {"sessionId": sid, "entryId": order[5],
                                                             "direction": "down"}) == "CONFLICT"
            state = await c.call("session.queueReorder", {"sessionId": sid, "entryId": order[4],
                                                          "direction": "up"})
            swapped = [x["id"] for x in state["entries"]]
            assert swapped[2:] == [order[0], order[1], order[4], order[3], order[6], order[7]]
            pos = {x["id"]: x["position"] for x in state["entries"]}
            was = {x["id"]: x["position"] for x in listed_before}
            assert (pos[order[4]], pos[order[3]]) == (was[order[3]], was[order[4]])  # the values swapped
            assert all(pos[x] == was[x] for x in order if x not in (order[3], order[4]))
            assert [x.get("priority") for x in state["entries"][:3]] == [1, 2, None]
            assert (await c.call("session.queueAttach", {"sessionId": sid, "controllerId": "ag"}))["held"] is False
            proc.kill9()
        async with real_host(data) as (proc, c):
            state = await c.call("session.queueList", {"sessionId": sid})
            assert [x["id"] for x in state["entries"]] == swapped
            assert state["held"] is True
            take = {"sessionId": sid, "controllerId": "ag2"}
            assert (await c.call("session.queueTake", take)).get("entry") is None
            await c.call("session.queueAttach", take)
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "busy"})
            taken = await c.call("session.queueTake", take)
            assert taken.get("entry") is None and taken.get("reason") == "turnRunning"
            await c.call("session.endTurn", {"sessionId": sid, "turnId": "busy", "status": "aborted"})
            assert (await c.call("session.queueTake", take))["entry"]["id"] == swapped[0]
            await c.call("session.delete", {"sessionId": sid})
            assert await code_of(c, "session.queueList", {"sessionId": sid}) == "SESSION_NOT_FOUND"


@pytest.mark.parametrize("content", ["", " \u0000\u202e", "x" * 100_000])
async def test_queue_push_keeps_odd_content_as_given(tmp_path: Path, content: str) -> None:
    """§4.6b: the row keeps the prompt ``content`` as given (TEXT NOT NULL): an empty prompt, control and
    bidi characters, a large prompt."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            pushed = (await c.call("session.queuePush", _push(sid, content, key="k")))["entry"]
            assert pushed["content"] == content
            [listed] = (await c.call("session.queueList", {"sessionId": sid}))["entries"]
            assert listed["content"] == content


# ---------------------------------------------------------------------- stop, truncate, replace, fork (§5)

async def test_user_stop_leaves_the_checkpoint_for_the_aborted_final_row_and_boot_promotes_it_aborted(
        tmp_path: Path) -> None:
    """§5 Rules: "A user Stop does not touch the checkpoint, because the runtime's own aborted final row is
    still on its way and removes it on arrival" and the boot sweep promotes a leftover "otherwise as aborted
    under an aborted turn". Kill -9 after the Stop, before the final row: boot promotes it interrupted."""
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(60):
        async with real_host(data) as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            await say(c, sid, "u1", "q", turnId="t1")
            part = msg("a1", "partial 日本語 \u0000 reply", role="assistant", turnId="t1")
            await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1", "message": part})
            r = await c.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "aborted"})
            assert r.get("notification") is None
            assert (await get(c, sid))["inflight"]["message"]["id"] == "a1"
            proc.kill9()
        async with real_host(data) as (proc, c):
            view = await get(c, sid)
            assert [m["id"] for m in view["messages"]] == ["u1", "a1"]
            assert view["messages"][1]["blocks"] == part["blocks"]
            assert (view["messages"][1].get("meta") or {}).get("interrupted") is True
            assert view.get("inflight") is None
            assert (await c.call("notifications.list", {}))["notifications"] == []


async def test_truncate_aborts_the_running_turn_drops_the_checkpoint_and_resets_last_seq(tmp_path: Path) -> None:
    """§5: truncateFrom "abort leftover running turn ... drop inflight checkpoint ... reset last_seq", and
    replaceMessages "reset last_seq": the next append continues the numbering of what survived."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="agent") as c:
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            await say(c, sid, "u1", "q1", turnId="t1")
            await say(c, sid, "a1", "r1", role="assistant", turnId="t1")
            await c.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed",
                                             "createNotification": False})
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t2"})
            await say(c, sid, "u2", "q2", turnId="t2")
            await say(c, sid, "x2", "tool out", role="tool", turnId="t2", toolName="Bash")
            await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t2",
                                                         "message": msg("a2", "so far", role="assistant",
                                                                        turnId="t2")})
            r = await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u2", "mode": "edit"})
            assert r["removed"] == 2
            view = await get(c, sid)
            assert view.get("inflight") is None
            assert [(m["id"], m.get("turnId")) for m in view["messages"]] == [("u1", "t1"), ("a1", "t1")]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t3"})  # t2 no longer runs
            assert (await say(c, sid, "u3", "q3", turnId="t3"))["message"]["seq"] == 3
            plain = [{k: m[k] for k in ("id", "role", "blocks", "turnId") if k in m}
                     for m in (await get(c, sid))["messages"]]
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": plain[:1]})
            assert (await say(c, sid, "u4", "q4"))["message"]["seq"] == 2


async def test_fork_remaps_message_and_tool_call_ids_consistently(tmp_path: Path) -> None:
    """§5: "session fork — write a new transcript with remapped message/tool-call ids": the child's ids are
    new, and a tool call and the tool row answering it still pair up in the child."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await say(c, sid, "fu", "do it")
            call = {"type": "tool_call", "callId": "call:1/a", "name": "Bash", "args": {"cmd": "ls"},
                    "result": "ok", "status": "ok"}
            await c.call("session.appendMessage", {"sessionId": sid, "message": {
                "id": "fa", "role": "assistant", "blocks": [call]}})
            await c.call("session.appendMessage", {"sessionId": sid, "message": {
                "id": "ft", "role": "tool", "toolName": "Bash", "blocks": [call]}})
            child = await c.call("session.fork", {"sessionId": sid})
            rows = (await get(c, child["id"]))["messages"]
            assert len(rows) == 3
            assert not {m["id"] for m in rows} & {"fu", "fa", "ft"}
            a_call = rows[1]["blocks"][0]["callId"]
            assert rows[2]["blocks"][0]["callId"] == a_call
            assert rows[1]["blocks"][0]["args"] == {"cmd": "ls"}
            original = (await get(c, sid))["messages"]
            assert [m["id"] for m in original] == ["fu", "fa", "ft"]
            assert original[1]["blocks"][0]["callId"] == "call:1/a"


# ------------------------------------------------------------------------------ regenerate branches (§5)

async def test_active_revision_refresh_and_switch_survive_a_kill(tmp_path: Path) -> None:
    """§5: "turn-completion branch archive (session.saveActiveRevision) — append a revision_live reference
    line ... index row with message_count (+ is_active flip)"; "a refresh only updates message_count";
    "revision switch — append a full revision line ..., atomic transcript rewrite". §11.13: switching never
    rewrites the revisions file (it only grows). SIGKILL, restart: the families and the live branch hold."""
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(60):
        async with real_host(data) as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await say(c, sid, "q", "question")
            await say(c, sid, "r0", "reply 0", role="assistant")
            first = (await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "q"}))["revision"]
            assert first["revisionIndex"] == 1 and first["isActive"] is True
            await say(c, sid, "t0", "tool", role="tool", toolName="Bash")
            await say(c, sid, "r0b", "reply 0 continued", role="assistant")
            again = (await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "q"}))["revision"]
            assert again["revisionIndex"] == 1
            assert again["messageCount"] == first["messageCount"] + 2
            listed = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
            assert [(x["revisionIndex"], x["isActive"]) for x in listed] == [(1, True)]
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "r0", "mode": "regenerate"})
            await say(c, sid, "r1", "reply 1", role="assistant")
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "q"})
            listed = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
            assert [(x["revisionIndex"], x["isActive"]) for x in listed] == [(1, False), (2, True)]
            revs = data / "sessions" / f"{sid}.revisions.jsonl"
            before = revs.read_bytes()
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "q", "revisionIndex": 1})
            assert revs.read_bytes().startswith(before)
            assert await ids(c, sid) == ["q", "r0", "t0", "r0b"]
            proc.kill9()
        async with real_host(data) as (proc, c):
            assert await ids(c, sid) == ["q", "r0", "t0", "r0b"]
            listed = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
            assert [(x["revisionIndex"], x["isActive"], x["messageCount"]) for x in listed] == [
                (1, True, again["messageCount"]), (2, False, 2)]
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "q", "revisionIndex": 2})
            assert await ids(c, sid) == ["q", "r1"]
            assert (await say(c, sid, "q2", "next"))["message"]["seq"] == 3


# ------------------------------------------------------------------------- tool results, artifacts (§5)

async def test_acknowledged_write_results_keep_artifacts_audit_and_search_across_a_kill(tmp_path: Path) -> None:
    """§5: "tool succeeded (Write/Edit) — upsert artifacts + audit_log row, same tx as result persistence";
    §11.4: a kill between file append and index commit leaves the message readable. SIGKILL right after
    a burst of acknowledged tool results (one path written twice, one failed write): after the restart every
    acknowledged result is a row, each success is audited once, the twice-written path is one artifact and the
    failed write none."""
    data = tmp_path / "data"
    data.mkdir()
    project = tmp_path / "project"
    project.mkdir()

    def write(mid: str, path: str, status: str = "ok") -> dict[str, Any]:
        return {"id": mid, "role": "tool", "toolName": "Write", "blocks": [
            {"type": "tool_call", "callId": f"c-{mid}", "name": "Write", "args": {"path": path},
             "status": status, "result": f"wrote {mid} ✓"}]}

    with trio.fail_after(60):
        async with real_host(data) as (proc, c):
            sid = (await c.call("session.create", {"projectPath": str(project)}))["id"]
            for i in range(12):
                await c.call("session.appendMessage", {"sessionId": sid, "message": write(f"w{i}", f"f{i}.txt")})
            await c.call("session.appendMessage", {"sessionId": sid, "message": write("w12", "f0.txt")})
            await c.call("session.appendMessage", {"sessionId": sid,
                                                   "message": write("bad", "nope.txt", status="error")})
            proc.kill9()
        async with real_host(data) as (proc, c):
            assert len(await ids(c, sid)) == 14
            listed = (await c.call("artifacts.list", {"sessionId": sid}))["artifacts"]
            assert sorted(a["path"] for a in listed) == sorted(f"{project}/f{i}.txt" for i in range(12))
            audited = (await c.call("audit.list", {"sessionId": sid, "kind": "tool_execute",
                                                   "limit": 100}))["entries"]
            assert sorted(e["payload"]["messageId"] for e in audited) == sorted(f"w{i}" for i in range(13))


@pytest.mark.parametrize("spec", ["append.after_fsync:2", "index.before_commit:5"])
async def test_a_kill_after_the_final_row_is_written_never_promotes_its_checkpoint_twice(
        tmp_path: Path, spec: str) -> None:
    """§5: the boot sweep promotes a leftover checkpoint only when "its final row never landed", and "A crash
    between file append and index commit leaves the message readable". The turn completes with its reply
    still a checkpoint (the outbox delivers the final row late, D327); SIGKILL once the final row's line is
    durable (before its index commit, before the checkpoint is removed; ``spec`` counts this scenario's hits):
    after the restart the reply is one row holding the final content, and no checkpoint is left."""
    data = tmp_path / "data"
    data.mkdir()
    final = msg("a1", "the final reply", role="assistant", turnId="t1")
    crashing = start_host_process(data, env={"RT_CRASHPOINT": spec})
    with trio.fail_after(60):
        try:
            async with open_client(crashing.url, crashing.token, client_id="outsider", client_kind="agent") as c:
                sid = (await c.call("session.create", {}))["id"]
                await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
                await say(c, sid, "u1", "q", turnId="t1")
                await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1", "message": msg(
                    "a1", "partial", role="assistant", turnId="t1")})
                await c.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed",
                                                 "createNotification": False})
                await c.call("session.appendMessage", {"sessionId": sid, "message": final})
                await get(c, sid)  # the index commit of the final row may come after its answer
        except (ClientClosed, OSError):
            pass
        await trio.to_thread.run_sync(crashing.reap)
        assert crashing.proc.returncode == -9
        async with real_host(data) as (proc, c):
            view = await get(c, sid)
            assert [m["id"] for m in view["messages"]] == ["u1", "a1"]
            assert view["messages"][1]["blocks"] == final["blocks"]
            assert view.get("inflight") is None
            assert view["session"]["messageCount"] == 2


async def test_the_newest_200_notifications_survive_a_kill_with_their_title_snapshots(tmp_path: Path) -> None:
    """§4.14: "After an insert, the same transaction prunes all but the newest 200 rows by (created_at DESC,
    id DESC). This is a global cap"; "session_title is the stable session-name snapshot at notification
    creation". 205 terminal turns over two sessions (many in the same millisecond), a rename half-way,
    SIGKILL, restart: exactly the newest 200 remain, each with the title of its moment."""
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(60):
        async with real_host(data) as (proc, c):
            a = (await c.call("session.create", {"title": "before"}))["id"]
            b = (await c.call("session.create", {"title": "  other  "}))["id"]
            for i in range(205):
                if i == 100:
                    await c.call("session.rename", {"sessionId": a, "title": "after ✓"})
                sid = a if i % 2 == 0 else b
                await c.call("session.startTurn", {"sessionId": sid, "turnId": f"t{i:03d}"})
                await c.call("session.endTurn", {"sessionId": sid, "turnId": f"t{i:03d}",
                                                 "status": "error" if i % 3 else "completed"})
            proc.kill9()
        async with real_host(data) as (proc, c):
            seen = await all_pages(c, "notifications.list", "notifications", limit=64)
            assert (await c.call("notifications.list", {"limit": 1}))["unreadCount"] == 200
            assert sorted(n["turnId"] for n in seen) == [f"t{i:03d}" for i in range(5, 205)]
            titles = {n["turnId"]: n["sessionTitle"] for n in seen}
            assert titles["t098"] == "before" and titles["t100"] == "after ✓" and titles["t099"] == "other"
            kinds = {n["turnId"]: n["kind"] for n in seen}
            assert kinds["t006"] == "task.completed" and kinds["t007"] == "task.failed"


async def test_queue_positions_only_grow_past_removed_tail_entries_and_kills(tmp_path: Path) -> None:
    """§4.6b: "position is per session and only grows": removing the newest entry, or every entry, and a
    SIGKILL in between never hands out a position again."""
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(60):
        async with real_host(data) as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            e = [(await c.call("session.queuePush", _push(sid, f"p{i}")))["entry"] for i in range(3)]
            await c.call("session.queueRemove", {"sessionId": sid, "entryId": e[2]["id"]})
            await c.call("session.queueRemove", {"sessionId": sid, "entryId": e[1]["id"]})
            proc.kill9()
        async with real_host(data) as (proc, c):
            n = (await c.call("session.queuePush", _push(sid, "p3")))["entry"]
            assert n["position"] > e[2]["position"]
            for entry_id in (n["id"], e[0]["id"]):
                await c.call("session.queueRemove", {"sessionId": sid, "entryId": entry_id})
            proc.kill9()
        async with real_host(data) as (proc, c):
            assert (await c.call("session.queuePush", _push(sid, "p4")))["entry"]["position"] > n["position"]


async def test_a_revision_switch_keeps_the_checkpoints_whose_anchors_survive(tmp_path: Path) -> None:
    """§5: "revision switch — ... atomic transcript rewrite keeping checkpoints whose anchors survive ... reset
    last_seq". A checkpoint through the family's root user survives both switches; one through a branch's
    reply is not shown while another branch is live."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="agent") as c:
            sid = (await c.call("session.create", {}))["id"]
            await say(c, sid, "p0", "pre")
            await say(c, sid, "pa", "pre reply", role="assistant")
            await say(c, sid, "q", "question")
            await c.call("session.appendCompaction", {"sessionId": sid, "compaction": {
                "id": "cq", "summary": "through q", "throughMessageId": "q", "tokensBefore": 1}})
            await say(c, sid, "r0", "reply 0", role="assistant")
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "q"})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "r0", "mode": "regenerate"})
            view = await get(c, sid)
            assert [m["id"] for m in view["messages"]] == ["p0", "pa", "q"]
            assert [x["id"] for x in view["compactions"]] == ["cq"]
            await say(c, sid, "r1", "reply 1", role="assistant")
            await c.call("session.appendCompaction", {"sessionId": sid, "compaction": {
                "id": "c1", "summary": "through r1", "throughMessageId": "r1", "tokensBefore": 1}})
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "q"})
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "q", "revisionIndex": 1})
            view = await get(c, sid)
            assert [m["id"] for m in view["messages"]] == ["p0", "pa", "q", "r0"]
            assert [x["id"] for x in view["compactions"]] == ["cq"]
            assert (await say(c, sid, "n", "next"))["message"]["seq"] == 5


async def test_mark_read_mark_all_read_and_clear_touch_only_notifications(tmp_path: Path) -> None:
    """§4.14: "Mark-read updates are idempotent (read_at changes only from null), mark all read is one indexed
    update, and clear deletes notification rows only. None of these operations changes sessions, turns, or
    transcripts." An unknown id among the ids, a repeated id, an empty ``ids`` list for clear (not "all")."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await say(c, sid, "u", "hello")
            for t in ("t1", "t2", "t3"):
                await c.call("session.startTurn", {"sessionId": sid, "turnId": t})
                await c.call("session.endTurn", {"sessionId": sid, "turnId": t, "status": "completed"})
            before = await get(c, sid)
            listed = (await c.call("notifications.list", {}))["notifications"]
            assert (await c.call("notifications.markRead", {"ids": [listed[0]["id"], "n_unknown",
                                                                    listed[0]["id"]]}))["updated"] == 1
            read_at = (await c.call("notifications.list", {}))["notifications"][0]["readAt"]
            await trio.sleep(0.01)
            assert (await c.call("notifications.markAllRead", {}))["updated"] == 2
            assert (await c.call("notifications.markAllRead", {}))["updated"] == 0
            after = (await c.call("notifications.list", {}))
            assert after["notifications"][0]["readAt"] == read_at and after["unreadCount"] == 0
            assert (await c.call("notifications.clear", {"ids": []}))["deleted"] == 0
            assert (await c.call("notifications.clear", {"ids": [listed[1]["id"]] * 2}))["deleted"] == 1
            assert [n["turnId"] for n in (await c.call("notifications.list", {}))["notifications"]] == ["t3", "t1"]
            assert (await c.call("notifications.clear", {}))["deleted"] == 2
            assert await get(c, sid) == before


async def test_concurrent_appends_from_three_clients_get_gapless_seqs_in_file_order(tmp_path: Path) -> None:
    """§5: "prompt accepted — append user message line — last_seq alloc (RETURNING) + index row + touch
    sessions.updated_at": three connections appending to one session at once get the seqs 1..N without a
    gap or a repeat, in the order of the transcript lines, and the session counts N."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "c0") as c0, \
                client_for(host, "c1") as c1, client_for(host, "c2") as c2:
            sid = (await c0.call("session.create", {}))["id"]
            seqs: dict[str, int] = {}

            async def burst(c: HostClient, tag: str) -> None:
                for i in range(25):
                    mid = f"{tag}-{i}"
                    seqs[mid] = (await say(c, sid, mid, f"text {mid}",
                                           role="user" if i % 2 else "assistant"))["message"]["seq"]

            async with trio.open_nursery() as nursery:
                for tag, c in (("x", c0), ("y", c1), ("z", c2)):
                    nursery.start_soon(burst, c, tag)
            assert sorted(seqs.values()) == list(range(1, 76))
            view = await c0.call("session.get", {"sessionId": sid, "messageLimit": 500})
            assert [seqs[m["id"]] for m in view["messages"]] == list(range(1, 76))
            assert [m["seq"] for m in view["messages"]] == list(range(1, 76))
            assert view["session"]["messageCount"] == 75


@pytest.mark.parametrize("status", ["completed", "error"])
async def test_a_terminal_end_turn_removes_a_checkpoint_whose_id_is_already_indexed(
        tmp_path: Path, status: str) -> None:
    """§5: "turn terminal via session.endTurn — completed/error: remove the in-flight checkpoint only when its
    id is already indexed". The reply's row landed by a rewrite (replaceMessages, which does not settle
    checkpoints) while its checkpoint stayed: the terminal endTurn removes it, and it is never shown beside
    its own row nor promoted again by a restart."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="agent") as c:
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            await say(c, sid, "u1", "q", turnId="t1")
            await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1", "message": msg(
                "a1", "partial", role="assistant", turnId="t1")})
            final = [msg("u1", "q", turnId="t1"), msg("a1", "final", role="assistant", turnId="t1")]
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": final})
            assert (await get(c, sid)).get("inflight") is None
            await c.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": status,
                                             "createNotification": False})
            assert not (tmp_path / "sessions" / f"{sid}.inflight.json").exists()
            assert (await c.call("session.recoverInflight", {"sessionId": sid}))["action"] == "none"
        async with inprocess_host(tmp_path) as host, client_for(host, kind="agent") as c:
            view = await get(c, sid)
            assert [(m["id"], m["blocks"][0]["text"]) for m in view["messages"]] == [("u1", "q"), ("a1", "final")]


async def test_session_delete_leaves_nothing_for_a_session_recreated_under_the_same_id(tmp_path: Path) -> None:
    """§5: "session delete — remove both session files after row delete — DELETE FROM sessions (cascades)";
    §4.6b "Deleting the session cascades to its entries"; §4.14 "session deletion also cascades its rows". A
    session holding every kind of state (revision, checkpoint, compaction, queue entry, notification) is
    deleted and created again under its id: nothing of the old one shows, files, queue or inbox, even after a
    restart (no boot sweep promotes an old checkpoint)."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="agent") as c:
            await c.call("session.create", {"sessionId": "dup"})
            await c.call("session.startTurn", {"sessionId": "dup", "turnId": "dt"})
            await say(c, "dup", "d1", "q", turnId="dt")
            await say(c, "dup", "d2", "r", role="assistant", turnId="dt")
            await c.call("session.saveActiveRevision", {"sessionId": "dup", "rootUserId": "d1"})
            await c.call("session.appendCompaction", {"sessionId": "dup", "compaction": {
                "id": "dc", "summary": "s", "throughMessageId": "d2", "tokensBefore": 3}})
            await c.call("session.queuePush", _push("dup", "later", key="k"))
            await c.call("session.endTurn", {"sessionId": "dup", "turnId": "dt", "status": "completed"})
            await c.call("session.startTurn", {"sessionId": "dup", "turnId": "dt2"})
            await c.call("session.saveInflightMessage", {"sessionId": "dup", "turnId": "dt2", "message": msg(
                "d3", "partial", role="assistant", turnId="dt2")})
            await c.call("session.delete", {"sessionId": "dup"})
            assert not [p.name for p in (tmp_path / "sessions").iterdir() if p.name.startswith("dup")]
            assert (await c.call("notifications.list", {}))["notifications"] == []
            await c.call("session.create", {"sessionId": "dup"})
        async with inprocess_host(tmp_path) as host, client_for(host, kind="agent") as c:
            view = await get(c, "dup")
            assert view["messages"] == [] and view["compactions"] == [] and view.get("inflight") is None
            assert (await c.call("session.listRevisions", {"sessionId": "dup"}))["revisions"] == []
            assert (await c.call("session.queueList", {"sessionId": "dup"}))["entries"] == []
            again = await c.call("session.queuePush", _push("dup", "other", key="k"))
            assert again["replayed"] is False
            assert (await c.call("search.query", {"query": "partial"}))["results"] == []


async def test_a_taken_entry_no_turn_began_with_is_offered_again_after_a_kill(tmp_path: Path) -> None:
    """§4.6b: "After a restart the module lists every entry, holds each session's queue until a controller
    attaches, and drains one entry after the active turn's terminal event"; protocol/README: a taken entry
    no turn began with is listed again, first, after a restart. SIGKILL between the take and the turn."""
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(60):
        async with real_host(data) as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            first = (await c.call("session.queuePush", _push(sid, "first ✓", key="a")))["entry"]
            second = (await c.call("session.queuePush", _push(sid, "second", key="b")))["entry"]
            ctl = {"sessionId": sid, "controllerId": "sidecar-1"}
            await c.call("session.queueAttach", ctl)
            assert (await c.call("session.queueTake", ctl))["entry"]["id"] == first["id"]
            assert [x["id"] for x in (await c.call("session.queueList", {"sessionId": sid}))["entries"]] == [
                second["id"]]
            proc.kill9()
        async with real_host(data) as (proc, c):
            state = await c.call("session.queueList", {"sessionId": sid})
            assert state["held"] is True
            assert [x["id"] for x in state["entries"]] == [first["id"], second["id"]]
            ctl = {"sessionId": sid, "controllerId": "sidecar-2"}
            assert (await c.call("session.queueTake", ctl)).get("reason") == "held"
            await c.call("session.queueAttach", ctl)
            again = (await c.call("session.queueTake", ctl))["entry"]
            assert (again["id"], again["content"]) == (first["id"], "first ✓")


async def test_a_kill_at_the_end_turn_commit_leaves_no_half_settled_turn(tmp_path: Path) -> None:
    """§11.14: "Completed and failed turns atomically create one durable notification"; §5 "update turns; for
    completed/error insert one notification ... in the same tx". SIGKILL at the endTurn's commit: after the
    restart the turn is not completed without its notification — boot aborted it, so the retried endTurn is a
    stale update (CONFLICT) and the inbox is empty."""
    data = tmp_path / "data"
    data.mkdir()
    crashing = start_host_process(data, env={"RT_CRASHPOINT": "index.before_commit:3"})
    sid = ""
    with trio.fail_after(60):
        try:
            async with open_client(crashing.url, crashing.token, client_id="outsider", client_kind="agent") as c:
                sid = (await c.call("session.create", {}))["id"]
                await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
                await c.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed"})
        except (ClientClosed, OSError):
            pass
        await trio.to_thread.run_sync(crashing.reap)
        assert crashing.proc.returncode == -9 and sid
        async with real_host(data) as (proc, c):
            assert (await c.call("notifications.list", {}))["notifications"] == []
            [turn] = (await c.call("session.listTurns", {"sessionId": sid}))["turns"]
            assert turn["status"] == "aborted"
            retry = {"sessionId": sid, "turnId": "t1", "status": "completed"}
            assert await code_of(c, "session.endTurn", retry) == "CONFLICT"
            assert (await c.call("notifications.list", {}))["notifications"] == []
