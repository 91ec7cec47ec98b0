"""Revisions through the real gateway (seed 003 §4.9, §11.13)."""

from __future__ import annotations

import os
from itertools import pairwise

import pytest
import trio

from runtime.client import RpcError
from runtime.handlers import revisions as rev
from store.revisions import read_revisions
from store.transcripts import rewrite as rewrite_module
from tests.hostkit import client_for, index_caught_up, inprocess_host, msg
from tests.revisions.helpers import (
    assert_index_matches_file,
    full,
    ids,
    query,
    revision_kinds,
    revisions_path,
    turn,
)
from tests.threadkit import on_trio_thread


def meta_of(got: dict, mid: str) -> dict:
    return next(m for m in got["messages"] if m["id"] == mid).get("meta") or {}


async def test_regenerate_save_switch_and_restart(tmp_path):
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "rev"}))["id"]
            await turn(c, sid, "u0", "a0")
            await turn(c, sid, "u1", "a1")
            r = await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            assert r["revision"] == {**r["revision"], "rootUserId": "u1", "revisionIndex": 1, "isActive": True,
                                     "messageCount": 2}
            assert revision_kinds(tmp_path, sid) == {("u1", 1): True}
            got = await full(c, sid)
            assert meta_of(got, "u1") == {"revisionCount": 1, "activeRevision": 1, "revisionRootId": "u1"}
            assert ids(got) == ["u0", "a0", "u1", "a1"]
            # regenerate a1: the discarded tail is stored in full over variant 1
            t = await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            assert t["removed"] == 1 and t["session"]["messageCount"] == 3
            assert revision_kinds(tmp_path, sid) == {("u1", 1): False}
            got = await full(c, sid)
            assert ids(got) == ["u0", "a0", "u1"]
            assert meta_of(got, "u1")["activeRevision"] == 2 and meta_of(got, "u1")["revisionCount"] == 2
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a1b", "second", role="assistant")})
            r = await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            assert r["revision"]["revisionIndex"] == 2
            revs = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
            assert [(x["revisionIndex"], x["isActive"], x["messageCount"]) for x in revs] == [
                (1, False, 2), (2, True, 2)]
            await index_caught_up(host)
            assert_index_matches_file(tmp_path, sid)
    # restart: variants survive, the live root reloads with its pager stamp
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            got = await full(c, sid)
            assert ids(got) == ["u0", "a0", "u1", "a1b"]
            assert meta_of(got, "u1") == {"revisionCount": 2, "activeRevision": 2, "revisionRootId": "u1"}
            before = revisions_path(tmp_path, sid).read_bytes()
            inode = os.stat(revisions_path(tmp_path, sid)).st_ino
            a = await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 1})
            assert [(x["revisionIndex"], x["isActive"]) for x in a["revisions"]] == [(1, True), (2, False)]
            got = await full(c, sid)
            assert ids(got) == ["u0", "a0", "u1", "a1"]
            assert meta_of(got, "u1")["activeRevision"] == 1 and meta_of(got, "u1")["revisionCount"] == 2
            after = revisions_path(tmp_path, sid).read_bytes()
            # never rewritten: the old bytes are untouched, the live branch was appended in full
            assert after.startswith(before) and os.stat(revisions_path(tmp_path, sid)).st_ino == inode
            assert revision_kinds(tmp_path, sid) == {("u1", 1): False, ("u1", 2): False}
            await index_caught_up(host)
            assert_index_matches_file(tmp_path, sid)
            # switching back and forth between stored variants adds nothing
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 2})
            stable = revisions_path(tmp_path, sid).read_bytes()
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 1})
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 2})
            assert revisions_path(tmp_path, sid).read_bytes() == stable
            assert ids(await full(c, sid)) == ["u0", "a0", "u1", "a1b"]
            # the last_seq counter follows the rewritten transcript
            assert (await c.call("session.get", {"sessionId": sid}))["session"]["messageCount"] == 4
            with pytest.raises(RpcError) as err:
                await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 9})
            assert err.value.data_code == "NOT_FOUND"


async def test_repeated_turns_over_live_branch_add_constant_reference_lines(tmp_path):
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a1b", "x", role="assistant")})
            sizes = []
            for i in range(8):
                await turn(c, sid, f"u{i + 2}", f"a{i + 2}", "x" * 200)
                await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
                sizes.append((await trio.Path(revisions_path(tmp_path, sid)).stat()).st_size)
            growth = {b - a for a, b in pairwise(sizes)}
            # one small line each, whatever the branch holds: only its messageCount's digits vary (9 → 18)
            assert max(growth) - min(growth) <= 1 and max(growth) < 200
            revs = (await c.call("session.listRevisions", {"sessionId": sid, "rootUserId": "u1"}))["revisions"]
            assert revs[-1]["messageCount"] == 2 + 2 * 8 and revs[-1]["isActive"]
            assert len(revs) == 2  # refreshed, never duplicated


async def test_failed_turn_variant_is_its_own_new_variant(tmp_path):
    """D307: a stamped variant with no index row yet is stored as a new variant, never over another."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            # the regenerated reply fails before saveActiveRevision; the user regenerates again
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("e1", "boom", role="assistant")})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "e1", "mode": "retry"})
            rf = read_revisions(revisions_path(tmp_path, sid))
            assert [m["id"] for m in rf.get("u1", 1).messages] == ["u1", "a1"]
            assert [m["id"] for m in rf.get("u1", 2).messages] == ["u1", "e1"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a1c", "ok", role="assistant")})
            r = await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            assert r["revision"]["revisionIndex"] == 3
            got = await full(c, sid)
            assert meta_of(got, "u1")["revisionCount"] == 3


async def test_edited_prompt_joins_its_family_and_pager_restores_any_branch(tmp_path):
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            await turn(c, sid, "u2", "a2")
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u2"})
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            # edit u1: cut at the root itself; both live references must be stored in full first
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u1", "mode": "edit"})
            assert revision_kinds(tmp_path, sid) == {("u1", 1): False, ("u2", 1): False}
            assert ids(await full(c, sid)) == []
            edited = msg("u1x", "edited", meta={"revisionRootId": "u1"})
            await c.call("session.appendMessage", {"sessionId": sid, "message": edited})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a1x", "r", role="assistant")})
            r = await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            assert r["revision"]["revisionIndex"] == 2
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 1})
            got = await full(c, sid)
            assert ids(got) == ["u1", "a1", "u2", "a2"]
            assert meta_of(got, "u2")["activeRevision"] == 1
            revs = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
            assert {(x["rootUserId"], x["revisionIndex"]): x["isActive"] for x in revs} == {
                ("u1", 1): True, ("u1", 2): False, ("u2", 1): True}
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 2})
            assert ids(await full(c, sid)) == ["u1x", "a1x"]
            revs = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
            assert {(x["rootUserId"], x["revisionIndex"]): x["isActive"] for x in revs} == {
                ("u1", 1): False, ("u1", 2): True, ("u2", 1): False}
            await index_caught_up(host)
            assert_index_matches_file(tmp_path, sid)


async def test_save_unknown_root_is_message_not_found(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            with pytest.raises(RpcError) as err:
                await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "nope"})
            assert err.value.data_code == "MESSAGE_NOT_FOUND"
            assert not revisions_path(tmp_path, sid).exists()


async def test_lost_revision_rows_are_rebuilt_from_files(tmp_path):
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a1b", "x", role="assistant")})
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
    import sqlite3

    conn = sqlite3.connect(tmp_path / "pi.sqlite")
    conn.execute("DELETE FROM message_revisions")
    conn.commit()
    conn.close()
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            revs = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
            assert [(x["revisionIndex"], x["isActive"], x["messageCount"]) for x in revs] == [
                (1, False, 2), (2, True, 2)]
    assert query(tmp_path, "SELECT COUNT(*) FROM message_revisions")[0][0] == 2


async def test_a_branchs_checkpoint_leaves_and_comes_back_with_it(tmp_path):
    """Reproduces: a context checkpoint anchored in a branch was dropped when a regenerate or a switch took the
    branch out of the transcript, and restoring the branch did not bring it back (``session.context`` then
    started from nothing). The branch's ``revision`` line now keeps it (``compactions``) and a restore writes
    it again."""
    checkpoint = {"id": "c1", "summary": "summary c1", "throughMessageId": "a1", "tokensBefore": 100}
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "rev"}))["id"]
            await turn(c, sid, "u1", "a1")
            await c.call("session.appendCompaction", {"sessionId": sid, "compaction": checkpoint})
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            assert (await full(c, sid))["compactions"] == []
            stored = read_revisions(revisions_path(tmp_path, sid)).get("u1", 1)
            assert stored is not None and [x["id"] for x in stored.compactions] == ["c1"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a1b", "b", role="assistant")})
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            for index, want in ((1, ["c1"]), (2, []), (1, ["c1"])):
                await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": index})
                got = await full(c, sid)
                assert [x["id"] for x in got["compactions"]] == want, index
                context = await c.call("session.context", {"sessionId": sid})
                assert (context["compaction"] or {}).get("id") == (want[0] if want else None)
            await index_caught_up(host)
            assert_index_matches_file(tmp_path, sid)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            assert [x["id"] for x in (await full(c, sid))["compactions"]] == ["c1"]


async def test_a_message_deleted_in_a_branch_stays_deleted_when_the_branch_comes_back(tmp_path):
    """Seed 000 §3.3 (context skips a tombstoned message): a regenerate archived the branch without its
    tombstones, so switching back to it brought the deleted message back to get, context and search."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1"})
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("u1", "q1")})
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("a1", "answer", "assistant")})
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(
                "a1x", "zebra the user deleted", "assistant")})
            await c.call("session.deleteMessage", {"sessionId": "s1", "messageId": "a1x"})
            await c.call("session.truncateFrom", {"sessionId": "s1", "messageId": "a1", "mode": "regenerate"})
            tree = await c.call("session.tree", {"sessionId": "s1"})
            assert [n["deleted"] for n in tree["nodes"] if n["messageId"] == "a1x"] == [True]
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("a2", "again", "assistant")})
            await c.call("session.activateRevision", {"sessionId": "s1", "rootUserId": "u1", "revisionIndex": 1})

            async def check() -> None:
                got = await c.call("session.get", {"sessionId": "s1"})
                assert [(m["id"], bool(m.get("deleted"))) for m in got["messages"]] == [
                    ("u1", False), ("a1", False), ("a1x", True)]
                ctx = await c.call("session.context", {"sessionId": "s1"})
                assert [m["id"] for m in ctx["messages"]] == ["u1", "a1"]
                assert (await c.call("search.sessions", {"query": "zebra"}))["totalMessageMatches"] == 0

            await check()
            await c.call("session.restoreMessage", {"sessionId": "s1", "messageId": "a1x"})  # still reversible
            assert (await c.call("search.sessions", {"query": "zebra"}))["totalMessageMatches"] == 1
            await c.call("session.deleteMessage", {"sessionId": "s1", "messageId": "a1x"})
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await check()


async def test_archived_branches_are_serialized_and_hashed_off_the_trio_thread(tmp_path, monkeypatch):
    """Archiving a branch serializes it whole, reads it back and hashes it (megabytes for a long branch), as
    does deleting a message only an archived branch holds: all in the session's worker thread, never on the
    trio loop (every other request of the host waits while it runs there)."""
    seen: list[tuple[str, bool]] = []
    line_of, digest_of = rev.revision_line, rev.payload_digest

    def line_seen(*args, **kwargs):
        seen.append(("line", on_trio_thread()))
        return line_of(*args, **kwargs)

    def digest_seen(entry):
        seen.append(("digest", on_trio_thread()))
        return digest_of(entry)

    monkeypatch.setattr(rev, "revision_line", line_seen)
    monkeypatch.setattr(rev, "payload_digest", digest_seen)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "rev"}))["id"]
            await turn(c, sid, "u1", "a1", "x" * 4096)
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            archived = list(seen)
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a1b", "b", role="assistant")})
            assert await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "a1"}) == {
                "messageId": "a1", "deleted": True}
    assert archived == [("line", False), ("digest", False)]
    assert seen[len(archived):] == [("digest", False)]


async def test_rewrites_and_forks_serialize_the_transcript_off_the_trio_thread(tmp_path, monkeypatch):
    """A rewrite (truncateFrom, activateRevision, replaceMessages) and a fork or assistant edit lay out a whole
    transcript line by line (megabytes for a long session): in the session's worker thread, never on the trio
    loop (every other request of the host waits while it runs there)."""
    seen: list[tuple[str, bool]] = []
    dumps = rewrite_module.dumps_line
    method = [""]

    def dumps_seen(rec):
        seen.append((method[0], on_trio_thread()))
        return dumps(rec)

    async def call(c, name, params):
        method[0] = name
        return await c.call(name, params)

    monkeypatch.setattr(rewrite_module, "dumps_line", dumps_seen)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "rev"}))["id"]
            await turn(c, sid, "u1", "a1")
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            await call(c, "session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a1b", "b", role="assistant")})
            await call(c, "session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 1})
            held = (await full(c, sid))["messages"]
            await call(c, "session.replaceMessages", {"sessionId": sid, "messages": held[:1]})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a2", "b", role="assistant")})
            await call(c, "session.fork", {"sessionId": sid})
            await call(c, "session.assistantEdit", {"sessionId": sid, "messageId": "a2",
                                                    "blocks": [{"type": "text", "text": "edited"}]})
    assert {name for name, _ in seen} == {"session.truncateFrom", "session.activateRevision",
                                          "session.replaceMessages", "session.fork", "session.assistantEdit"}
    assert sorted({name for name, on_trio in seen if on_trio}) == []


async def test_a_dropped_live_branch_finds_its_turns_in_one_pass(tmp_path, monkeypatch):
    """A referenced live branch that a rewrite drops is archived with its messages' turns: found with one lookup
    per turn entry, not a scan of the whole branch for each (quadratic in the session's length, on the trio
    loop). Counted by comparisons against the turn map's message ids."""
    compared = [0]

    class CountedId(str):
        __hash__ = str.__hash__

        def __eq__(self, other):
            compared[0] += 1
            return str.__eq__(self, other)

        def __ne__(self, other):
            return not self.__eq__(other)

    turn_map = rev.turn_map
    counting = [False]

    def counted_turn_map(conn, session_id, ids=None):
        found = turn_map(conn, session_id, ids)
        if not counting[0]:
            return found
        # every message as a turn's (a turn-driven session), keyed by ids that count their comparisons
        every = [mid for (mid,) in conn.execute("SELECT id FROM messages WHERE session_id = ?", (session_id,))]
        return {CountedId(mid): found.get(mid, "turn-1") for mid in every}

    line_of = rev.revision_line

    def plain_keys_line(root, idx, msgs, turns, **kwargs):
        return line_of(root, idx, msgs, {str(k): v for k, v in turns.items()}, **kwargs)  # orjson: exact str keys

    monkeypatch.setattr(rev, "turn_map", counted_turn_map)
    monkeypatch.setattr(rev, "revision_line", plain_keys_line)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "rev"}))["id"]
            await turn(c, sid, "u0", "a0")
            await turn(c, sid, "u1", "a1")
            for i in range(2, 30):
                await turn(c, sid, f"u{i}", f"a{i}")
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            held = (await full(c, sid))["messages"]
            counting[0] = True
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": held[:2]})
            counting[0] = False
            assert ids(await full(c, sid)) == ["u0", "a0"]
    stored = read_revisions(revisions_path(tmp_path, sid)).get("u1", 1)
    assert stored is not None and len(stored.messages) == 58 and len(stored.turns) == 58
    assert compared[0] <= 2 * 60  # a scan per turn entry compares about 60 * 58 / 2 times


async def test_activate_compares_and_merges_branches_off_the_trio_thread(tmp_path, monkeypatch):
    """activateRevision compares the live branch with its stored variant and merges the restored branch (on
    its newest descendants) after the messages before the root: copies and comparisons of whole branches
    (O(session)), in the session's worker thread as the rewrite's plan, never on the trio loop."""
    seen: list[tuple[str, bool]] = []
    unstamped, descendants, dropped = rev._unstamped, rev.newest_descendants, rev.dropped_branches

    def unstamped_seen(messages):
        seen.append(("compare", on_trio_thread()))
        return unstamped(messages)

    def descendants_seen(*args):
        seen.append(("merge", on_trio_thread()))
        return descendants(*args)

    def dropped_seen(*args):
        seen.append(("dropped", on_trio_thread()))
        return dropped(*args)

    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "rev"}))["id"]
            await turn(c, sid, "u0", "a0")
            await turn(c, sid, "u1", "a1")
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a1b", "b", role="assistant")})
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            monkeypatch.setattr(rev, "_unstamped", unstamped_seen)
            monkeypatch.setattr(rev, "newest_descendants", descendants_seen)
            monkeypatch.setattr(rev, "dropped_branches", dropped_seen)
            a = await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 1})
            assert [(x["revisionIndex"], x["isActive"]) for x in a["revisions"]] == [(1, True), (2, False)]
            assert ids(await full(c, sid)) == ["u0", "a0", "u1", "a1"]
            # back: the live branch (variant 1) is compared with its full stored line, which holds it already
            a = await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 2})
            monkeypatch.undo()
            assert [(x["revisionIndex"], x["isActive"]) for x in a["revisions"]] == [(1, False), (2, True)]
            assert ids(await full(c, sid)) == ["u0", "a0", "u1", "a1b"]
    assert sorted({what for what, on_trio in seen if on_trio}) == []
    assert {what for what, _ in seen} == {"compare", "merge", "dropped"}
