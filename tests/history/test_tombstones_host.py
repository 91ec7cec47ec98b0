"""session.deleteMessage / session.restoreMessage through the real gateway (seed 000 §3.3)."""

from __future__ import annotations

import pytest
import trio

from runtime.client import RpcError
from store.jsonio import loads_line
from tests.hostkit import client_for, index_caught_up, inprocess_host, msg
from tests.revisions.helpers import query, revisions_path, transcript_path, turn


def deleted_flags(root, sid):  # type: ignore[no-untyped-def]
    return dict(query(root, "SELECT id, deleted FROM messages WHERE session_id = ? ORDER BY seq", sid))


def lines(root, sid):  # type: ignore[no-untyped-def]
    return [loads_line(x) for x in transcript_path(root, sid).read_bytes().splitlines(keepends=True)]


async def search_ids(c, text: str, sid: str | None = None) -> list[str]:  # type: ignore[no-untyped-def]
    params = {"query": text} if sid is None else {"query": text, "sessionId": sid}
    return [h["messageId"] for h in (await c.call("search.query", params))["results"]]


async def test_delete_appends_one_line_and_flags_the_row(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1", "zebra")
            before = transcript_path(tmp_path, sid).read_bytes()
            r = await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "a1"})
            assert r == {"messageId": "a1", "deleted": True}
            after = transcript_path(tmp_path, sid).read_bytes()
            assert after.startswith(before)  # O(1): an append, no rewrite
            tomb = loads_line(after[len(before):])
            assert tomb["type"] == "tombstone" and tomb["messageId"] == "a1" and tomb["deleted"] is True
            assert isinstance(tomb["id"], str) and isinstance(tomb["createdAt"], str)
            await index_caught_up(host)
            assert deleted_flags(tmp_path, sid) == {"u1": 0, "a1": 1}
            got = await c.call("session.get", {"sessionId": sid, "full": True})
            assert [m.get("deleted", False) for m in got["messages"]] == [False, True]
            ctx = await c.call("session.context", {"sessionId": sid})
            assert [m["id"] for m in ctx["messages"]] == ["u1"]
            # asking again for the state it has writes nothing
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "a1"})
            assert transcript_path(tmp_path, sid).read_bytes() == after
            r = await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "a1"})
            assert r == {"messageId": "a1", "deleted": False}
            assert lines(tmp_path, sid)[-1]["deleted"] is False
            await index_caught_up(host)
            assert deleted_flags(tmp_path, sid) == {"u1": 0, "a1": 0}
            ctx = await c.call("session.context", {"sessionId": sid})
            assert [m["id"] for m in ctx["messages"]] == ["u1", "a1"]


async def test_tombstone_publishes_a_session_message_event(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c, client_for(host, "watcher") as w:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            await w.subscribe(["session.message"], session_id=sid)
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "a1"})
            await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "a1"})
            seen = [await w.next_event(), await w.next_event()]
            assert [(e.data["message"]["id"], e.data["message"]["seq"], e.data["deleted"]) for e in seen] == [
                ("a1", 2, True), ("a1", 2, False)]


async def test_unknown_message_is_message_not_found(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            other = (await c.call("session.create", {}))["id"]
            await turn(c, other, "x1", "y1")
            before = transcript_path(tmp_path, sid).read_bytes()
            for method in ("session.deleteMessage", "session.restoreMessage"):
                for mid in ("nope", "x1"):  # x1 belongs to another session
                    with pytest.raises(RpcError) as err:
                        await c.call(method, {"sessionId": sid, "messageId": mid})
                    assert err.value.data_code == "MESSAGE_NOT_FOUND"
            assert transcript_path(tmp_path, sid).read_bytes() == before
            with pytest.raises(RpcError) as err:
                await c.call("session.deleteMessage", {"sessionId": "missing", "messageId": "x1"})
            assert err.value.data_code == "SESSION_NOT_FOUND"


async def test_search_stops_finding_tombstoned_messages(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1", "platypus")
            assert sorted(await search_ids(c, "platypus")) == ["a1", "u1"]
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "u1"})
            assert await search_ids(c, "platypus") == ["a1"]
            assert await search_ids(c, "platypus", sid) == ["a1"]
            hits = (await c.call("search.sessions", {"query": "platypus"}))["results"]
            assert [s["messageId"] for s in hits[0]["snippets"]] == ["a1"]
            await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "u1"})
            assert sorted(await search_ids(c, "platypus")) == ["a1", "u1"]


async def test_receipt_replays_the_stored_answer(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            p = {"sessionId": sid, "messageId": "u1", "submissionId": "sub-1"}
            assert (await c.call("session.deleteMessage", p))["deleted"] is True
            await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "u1"})
            size = (await trio.Path(transcript_path(tmp_path, sid)).stat()).st_size
            # the retry answers from the receipt; it does not delete again
            assert (await c.call("session.deleteMessage", p))["deleted"] is True
            assert (await trio.Path(transcript_path(tmp_path, sid)).stat()).st_size == size
            await index_caught_up(host)
            assert deleted_flags(tmp_path, sid)["u1"] == 0
            with pytest.raises(RpcError) as err:
                await c.call("session.deleteMessage", {**p, "messageId": "a1"})
            assert err.value.data_code == "IDEMPOTENCY_CONFLICT"


async def test_flags_rebuilt_from_the_file_after_the_index_is_lost(tmp_path):
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1", "wombat")
            await turn(c, sid, "u2", "a2", "wombat")
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "a1"})
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "u2"})
            await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "u2"})
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "a2"})
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (tmp_path / name).unlink(missing_ok=True)
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await index_caught_up(host)
            assert deleted_flags(tmp_path, sid) == {"u1": 0, "a1": 1, "u2": 0, "a2": 1}
            got = await c.call("session.get", {"sessionId": sid, "full": True})
            assert [m["id"] for m in got["messages"] if m.get("deleted")] == ["a1", "a2"]
            assert sorted(await search_ids(c, "wombat")) == ["u1", "u2"]


async def test_lost_index_update_is_caught_up_from_the_tail(tmp_path):
    """The tombstone line is durable before the index op; a failed op heals on the next request."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            await index_caught_up(host)
            host.faults.add("index.before_commit", nth=1, action="raise")
            with pytest.raises(RpcError):
                await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "a1"})
            host.faults.clear()
            assert lines(tmp_path, sid)[-1]["type"] == "tombstone"
            got = await c.call("session.get", {"sessionId": sid, "full": True})
            assert [m.get("deleted", False) for m in got["messages"]] == [False, True]
            await index_caught_up(host)
            assert deleted_flags(tmp_path, sid) == {"u1": 0, "a1": 1}


async def test_rewrites_carry_tombstones_of_surviving_messages(tmp_path):
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            await turn(c, sid, "u2", "a2")
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "a1"})
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "a2"})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a2", "mode": "regenerate"})
            kinds = [(x["type"], x.get("messageId")) for x in lines(tmp_path, sid)[1:]]
            assert ("tombstone", "a1") in kinds and ("tombstone", "a2") not in kinds
            await index_caught_up(host)
            assert deleted_flags(tmp_path, sid) == {"u1": 0, "a1": 1, "u2": 0}
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a2b", "again", role="assistant")})
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (tmp_path / name).unlink(missing_ok=True)
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await index_caught_up(host)
            assert deleted_flags(tmp_path, sid) == {"u1": 0, "a1": 1, "u2": 0, "a2b": 0}
            # the archived branch comes back with its tombstone (seed 000 §3.3: a deleted node stays
            # deleted whichever leaf is current; the revision line records it)
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u2", "revisionIndex": 1})
            await index_caught_up(host)
            assert deleted_flags(tmp_path, sid) == {"u1": 0, "a1": 1, "u2": 0, "a2": 1}


async def _regenerated(c, sid: str) -> None:  # type: ignore[no-untyped-def]
    """u1 a1 | u2 a2, then a2 regenerated as a2b: a2 is only on the archived variant 1 of u2."""
    await turn(c, sid, "u1", "a1")
    await turn(c, sid, "u2", "a2", "walrus")
    await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a2", "mode": "regenerate"})
    await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a2b", "again", role="assistant")})


async def _shown(c, sid: str) -> dict[str, bool]:  # type: ignore[no-untyped-def]
    got = await c.call("session.get", {"sessionId": sid, "full": True})
    return {m["id"]: m.get("deleted", False) for m in got["messages"]}


async def test_a_message_only_an_archived_branch_holds_can_be_deleted_and_restored(tmp_path):
    """Seed 000 §3.3: any node can be tombstoned, not only those on the current leaf's path. The
    regenerated-away reply is deleted where it is stored (its branch's revision line, one more line;
    the transcript untouched), and comes back deleted when its branch is activated."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await _regenerated(c, sid)
            before = transcript_path(tmp_path, sid).read_bytes()
            rev_before = revisions_path(tmp_path, sid).read_bytes()
            r = await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "a2"})
            assert r == {"messageId": "a2", "deleted": True}
            assert transcript_path(tmp_path, sid).read_bytes() == before
            rev_after = revisions_path(tmp_path, sid).read_bytes()
            assert rev_after.startswith(rev_before)  # one more line, nothing rewritten
            (added,) = rev_after[len(rev_before):].splitlines()
            rec = loads_line(added)
            assert rec["type"] == "revision" and rec["deleted"] == ["a2"]
            tree = (await c.call("session.tree", {"sessionId": sid}))["nodes"]
            assert [(n["messageId"], n["deleted"]) for n in tree if n["messageId"] == "a2"] == [("a2", True)]
            # asking again writes nothing
            again = await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "a2"})
            assert again == r and revisions_path(tmp_path, sid).read_bytes() == rev_after
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u2", "revisionIndex": 1})
            assert await _shown(c, sid) == {"u1": False, "a1": False, "u2": False, "a2": True}
            ctx = await c.call("session.context", {"sessionId": sid})
            assert [m["id"] for m in ctx["messages"]] == ["u1", "a1", "u2"]
            assert await search_ids(c, "walrus", sid) == ["u2"]
            # back to the regenerated reply; a2 is archived again, and restored there
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u2", "revisionIndex": 2})
            assert await _shown(c, sid) == {"u1": False, "a1": False, "u2": False, "a2b": False}
            r = await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "a2"})
            assert r == {"messageId": "a2", "deleted": False}
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u2", "revisionIndex": 1})
            assert await _shown(c, sid) == {"u1": False, "a1": False, "u2": False, "a2": False}
            with pytest.raises(RpcError) as err:
                await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "nowhere"})
            assert err.value.data_code == "MESSAGE_NOT_FOUND"


async def test_an_archived_delete_survives_a_restart_and_a_lost_index_and_its_retry_is_one_effect(tmp_path):
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await _regenerated(c, sid)
            p = {"sessionId": sid, "messageId": "a2", "submissionId": "del-a2"}
            first = await c.call("session.deleteMessage", p)
            size = revisions_path(tmp_path, sid).stat().st_size
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (tmp_path / name).unlink(missing_ok=True)
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            assert await c.call("session.deleteMessage", p) == first  # the retry after a lost ack
            assert revisions_path(tmp_path, sid).stat().st_size == size
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u2", "revisionIndex": 1})
            assert await _shown(c, sid) == {"u1": False, "a1": False, "u2": False, "a2": True}
            await index_caught_up(host)
            assert deleted_flags(tmp_path, sid) == {"u1": 0, "a1": 0, "u2": 0, "a2": 1}


def _call(cid: str, name: str, **extra: object) -> dict[str, object]:
    return {"type": "tool_call", "callId": cid, "name": name, "args": {"path": "a.py"}, **extra}


async def test_context_leaves_out_the_results_of_a_tombstoned_call(tmp_path):
    """Seed 000 §3.3-4: context derivation skips a tombstone; a tool result whose call it skipped would
    reach the provider unpaired (refused), so it goes too. The reads keep both, flagged or not."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            for m in (msg("u1", "read it"),
                      msg("a1", "reading", role="assistant", blocks=[{"type": "text", "text": "reading"},
                                                                   _call("c1", "Read"), _call("c3", "Read")]),
                      msg("t1", "", role="tool", blocks=[_call("c1", "Read", result="one", status="ok")]),
                      # one row holding the results of a call a1 makes and of one a2 makes
                      msg("t13", "", role="tool", blocks=[_call("c3", "Read", result="three", status="ok"),
                                                          _call("c2", "Grep", result="two", status="ok")]),
                      msg("a2", "", role="assistant", blocks=[_call("c2", "Grep")]),
                      msg("t2", "", role="tool", blocks=[_call("c2", "Grep", result="two", status="ok")]),
                      msg("a3", "done", role="assistant")):
                await c.call("session.appendMessage", {"sessionId": sid, "message": m})
            ctx = await c.call("session.context", {"sessionId": sid})
            assert [m["id"] for m in ctx["messages"]] == ["u1", "a1", "t1", "t13", "a2", "t2", "a3"]

            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "a1"})
            ctx = await c.call("session.context", {"sessionId": sid})
            assert [m["id"] for m in ctx["messages"]] == ["u1", "t13", "a2", "t2", "a3"]
            (t13,) = [m for m in ctx["messages"] if m["id"] == "t13"]
            assert [b["callId"] for b in t13["blocks"]] == ["c2"]  # c3's result left with its call
            # the reads and the tree still hold every message, the tombstoned one flagged
            assert await _shown(c, sid) == {"u1": False, "a1": True, "t1": False, "t13": False, "a2": False,
                                            "t2": False, "a3": False}
            got = await c.call("session.get", {"sessionId": sid, "full": True})
            (t13_read,) = [m for m in got["messages"] if m["id"] == "t13"]
            assert [b["callId"] for b in t13_read["blocks"]] == ["c3", "c2"]
            tree = (await c.call("session.tree", {"sessionId": sid}))["nodes"]
            assert [(n["messageId"], n["deleted"]) for n in tree] == [
                ("u1", False), ("a1", True), ("t1", False), ("t13", False), ("a2", False), ("t2", False),
                ("a3", False)]

            # a tombstoned result leaves its call in place (a call with no result yet is a turn's normal state)
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "t2"})
            ctx = await c.call("session.context", {"sessionId": sid})
            assert [m["id"] for m in ctx["messages"]] == ["u1", "t13", "a2", "a3"]

            await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "a1"})
            ctx = await c.call("session.context", {"sessionId": sid})
            assert [m["id"] for m in ctx["messages"]] == ["u1", "a1", "t1", "t13", "a2", "a3"]
            (t13,) = [m for m in ctx["messages"] if m["id"] == "t13"]
            assert [b["callId"] for b in t13["blocks"]] == ["c3", "c2"]
