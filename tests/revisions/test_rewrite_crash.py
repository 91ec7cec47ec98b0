"""Every rewrite survives SIGKILL at every step (subprocess host + RT_CRASHPOINT).

One scenario runs three rewrites in order (truncateFrom, activateRevision,
replaceMessages); arming a crash point at hit N kills the host inside the Nth
rewrite. After a reboot the transcript is wholly the old or wholly the new
one, and the index (rows, search text, compactions, revision rows) matches it.
"""

from __future__ import annotations

import signal

import pytest
import trio

from runtime.client import ClientClosed, RpcError, open_client
from store.revisions import read_revisions
from tests.hostkit import call_killed_at, client_for, inprocess_host, msg, start_host_process
from tests.revisions.helpers import assert_index_matches_file, file_message_ids, full, ids, query, revisions_path

POINTS = ["rewrite.after_tmp_write", "rewrite.after_tmp_fsync", "rewrite.after_rename",
          "rewrite.before_dirsync", "rewrite.before_reindex"]
SID = "crash-s1"

# (ids before, ids after) for rewrite #1, #2, #3 of the scenario below
STATES = [
    (["u1", "a1", "u2", "a2"], ["u1", "a1", "u2"]),
    (["u1", "a1", "u2", "a2b"], ["u1", "a1", "u2", "a2"]),
    (["u1", "a1", "u2", "a2"], ["u1", "a1"]),
]


async def _two_turns(c, **create: str) -> None:
    """Session SID with u1 a1 u2 a2."""
    await c.call("session.create", {"sessionId": SID, **create})
    for mid, role in (("u1", "user"), ("a1", "assistant"), ("u2", "user"), ("a2", "assistant")):
        await c.call("session.appendMessage", {"sessionId": SID, "message": msg(mid, f"text {mid}", role=role)})


async def _scenario(c) -> None:
    await _two_turns(c, title="crash")
    await c.call("session.appendCompaction", {"sessionId": SID, "compaction": {
        "id": "c1", "summary": "s", "throughMessageId": "a1", "tokensBefore": 1}})
    await c.call("session.saveActiveRevision", {"sessionId": SID, "rootUserId": "u2"})
    await c.call("session.truncateFrom", {"sessionId": SID, "messageId": "a2", "mode": "regenerate"})
    await c.call("session.appendMessage", {"sessionId": SID, "message": msg("a2b", "text a2b", role="assistant")})
    await c.call("session.saveActiveRevision", {"sessionId": SID, "rootUserId": "u2"})
    await c.call("session.activateRevision", {"sessionId": SID, "rootUserId": "u2", "revisionIndex": 1})
    await c.call("session.replaceMessages", {"sessionId": SID, "messages": [
        msg("u1", "text u1"), msg("a1", "text a1", role="assistant")]})


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("nth", [1, 2, 3])
async def test_sigkill_during_rewrite(tmp_path, point, nth):
    proc = start_host_process(tmp_path, env={"RT_CRASHPOINT": f"{point}:{nth}:kill"})
    try:
        with trio.fail_after(30):
            with pytest.raises(ClientClosed):  # the host dies under the call
                async with open_client(proc.url, proc.token, client_id="crash") as c:
                    await _scenario(c)
        assert proc.reap(30) == -signal.SIGKILL
    finally:
        proc.kill9()
        proc.proc.communicate()  # closes the pipes
    before, after = STATES[nth - 1]
    on_disk = file_message_ids(tmp_path, SID)
    assert on_disk in (before, after)  # wholly old or wholly new
    if point in ("rewrite.after_rename", "rewrite.before_dirsync", "rewrite.before_reindex"):
        assert on_disk == after
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            got = await full(c, SID)
            assert ids(got) == on_disk
            assert [x["id"] for x in got["compactions"]] == ["c1"]
            revs = (await c.call("session.listRevisions", {"sessionId": SID}))["revisions"]
            stamps = {m["id"]: (m.get("meta") or {}).get("activeRevision") for m in got["messages"]}
            for r in revs:
                assert r["isActive"] == (stamps.get("u2") == r["revisionIndex"]), (r, stamps)
    assert_index_matches_file(tmp_path, SID)
    fts = query(tmp_path, "SELECT COUNT(*) FROM messages_fts WHERE messages_fts MATCH 'text'")[0][0]
    assert fts == len(on_disk)


@pytest.mark.parametrize("point", ["revisions.after_write", "rewrite.after_tmp_write"])
async def test_a_regenerate_retried_after_a_kill_archives_its_tail_once(tmp_path, point):
    """truncateFrom (regenerate) writes the archived tail to the revisions file before the transcript
    rewrite that carries its receipt. Killed between the two, the retry with the same submissionId minted a
    second, identical variant (two revision lines, revisionIndex 1 and 2). It finds the stored one and
    refreshes it: one variant, the same as an uninterrupted run. Its line, already durable with the same
    payload, was written a second time (two identical lines for variant 1): it is not written again."""
    proc = start_host_process(tmp_path, env={"RT_CRASHPOINT": f"{point}:1:kill"})
    cut = {"sessionId": SID, "messageId": "a2", "mode": "regenerate", "submissionId": "cut-1"}
    try:
        with trio.fail_after(30):
            with pytest.raises(ClientClosed):
                async with open_client(proc.url, proc.token, client_id="crash") as c:
                    await _two_turns(c)
                    await c.call("session.truncateFrom", cut)
        assert proc.reap(30) == -signal.SIGKILL
    finally:
        proc.kill9()
        proc.proc.communicate()
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "crash") as c:
            assert (await c.call("session.truncateFrom", cut))["removed"] == 1
            assert ids(await full(c, SID)) == ["u1", "a1", "u2"]
            # and one line: the retry does not store the same variant's payload a second time
            assert revisions_path(tmp_path, SID).read_bytes().count(b"\n") == 1
            revs = (await c.call("session.listRevisions", {"sessionId": SID}))["revisions"]
            assert [(r["revisionIndex"], r["messageCount"]) for r in revs] == [(1, 2)], revs
            await c.call("session.appendMessage", {"sessionId": SID, "message": msg("a2b", "b", role="assistant")})
            await c.call("session.activateRevision", {"sessionId": SID, "rootUserId": "u2", "revisionIndex": 1})
            assert ids(await full(c, SID)) == ["u1", "a1", "u2", "a2"]


@pytest.mark.parametrize("point", ["revisions.after_write", "rewrite.after_tmp_write"])
async def test_a_switch_from_an_unsaved_branch_retried_after_a_kill_archives_it_once(tmp_path, point):
    """activateRevision from a live branch no variant names yet (an edit under a new id: its root carries
    the family but no pager stamp) stores that branch as the next variant in the revisions file before the
    transcript rewrite. Killed between the two, the retry (or a plain second try) read the variant the
    file now held as one more known index and stored the same branch again under the next one: two
    identical variants. It finds the stored one: one variant, as an uninterrupted switch leaves."""
    edit = msg("u2e", "text u2 edited", meta={"revisionRootId": "u2"})
    switch = {"sessionId": SID, "rootUserId": "u2", "revisionIndex": 1, "submissionId": "switch-1"}
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "crash") as c:
            await _two_turns(c)
            await c.call("session.truncateFrom", {"sessionId": SID, "messageId": "u2", "mode": "edit"})
            await c.call("session.appendMessage", {"sessionId": SID, "message": edit})
            await c.call("session.appendMessage", {"sessionId": SID, "message": msg("a2e", "b", role="assistant")})
    await call_killed_at(tmp_path, point, "session.activateRevision", switch, client_id="crash")
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "crash") as c:
            again = await c.call("session.activateRevision", switch)
            assert ids(await full(c, SID)) == ["u1", "a1", "u2", "a2"]
            assert revisions_path(tmp_path, SID).read_bytes().count(b"\n") == 2  # variant 1, variant 2
            revs = (await c.call("session.listRevisions", {"sessionId": SID, "rootUserId": "u2"}))["revisions"]
            assert [(r["revisionIndex"], r["isActive"], r["messageCount"]) for r in revs] == [
                (1, True, 2), (2, False, 2)], revs
            assert again["revisions"] == revs
            await c.call("session.activateRevision", {**switch, "revisionIndex": 2, "submissionId": "switch-2"})
            assert ids(await full(c, SID)) == ["u1", "a1", "u2e", "a2e"]
    stored = read_revisions(revisions_path(tmp_path, SID))
    assert sorted(stored.entries) == [("u2", 1), ("u2", 2)]


async def test_a_saved_branch_archived_before_a_kill_lists_the_count_its_line_says(tmp_path):
    """A saved live branch (``revision_live``, counted when saved) that grew, then a rewrite that drops its
    root: the branch is archived in full (its grown count) before the transcript rewrite. Killed between
    the two, the reboot kept the row's old count: listRevisions disagreed with the file and with an index
    rebuilt from it. The rows take the count the newest line says. (The first write of the revisions
    file is the saveActiveRevision's reference, the second the archive.)"""
    proc = start_host_process(tmp_path, env={"RT_CRASHPOINT": "revisions.after_write:2:kill"})
    try:
        with trio.fail_after(30):
            with pytest.raises(ClientClosed):
                async with open_client(proc.url, proc.token, client_id="crash") as c:
                    await c.call("session.create", {"sessionId": SID})
                    for mid, role in (("u1", "user"), ("a1", "assistant")):
                        await c.call("session.appendMessage", {"sessionId": SID, "message": msg(
                            mid, f"text {mid}", role=role)})
                    await c.call("session.saveActiveRevision", {"sessionId": SID, "rootUserId": "u1"})
                    for mid, role in (("u2", "user"), ("a2", "assistant")):
                        await c.call("session.appendMessage", {"sessionId": SID, "message": msg(
                            mid, f"text {mid}", role=role)})
                    await c.call("session.truncateFrom", {"sessionId": SID, "messageId": "u1", "mode": "edit"})
        assert proc.reap(30) == -signal.SIGKILL
    finally:
        proc.kill9()
        proc.proc.communicate()
    stored = read_revisions(revisions_path(tmp_path, SID)).entries
    assert not stored[("u1", 1)].live and len(stored[("u1", 1)].messages) == 4
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            assert ids(await full(c, SID)) == ["u1", "a1", "u2", "a2"]  # the rewrite never happened
            revs = (await c.call("session.listRevisions", {"sessionId": SID}))["revisions"]
            assert [(r["revisionIndex"], r["isActive"], r["messageCount"]) for r in revs] == [(1, True, 4)]


async def test_an_archived_delete_retried_after_a_kill_answers_from_the_receipt_its_line_carries(tmp_path):
    """A message only an archived branch holds is deleted on that branch's revisions line, which carries the
    request's receipt (the receipt rides with its effect). Killed after the line reached the file, before the
    receipt row committed: another client restores the message meanwhile; the retry answers as the first
    try would have and does not delete it again (state alone would have flipped it back)."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "crash") as c:
            await _two_turns(c)
            await c.call("session.truncateFrom", {"sessionId": SID, "messageId": "a2", "mode": "regenerate"})
            await c.call("session.appendMessage", {"sessionId": SID, "message": msg("a2b", "b", role="assistant")})
    delete = {"sessionId": SID, "messageId": "a2", "submissionId": "del-1"}
    await call_killed_at(tmp_path, "revisions.after_write", "session.deleteMessage", delete, client_id="crash")
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "crash") as c, \
                client_for(host, "other") as other:
            assert await other.call("session.restoreMessage", {"sessionId": SID, "messageId": "a2"}) == {
                "messageId": "a2", "deleted": False}
            size = revisions_path(tmp_path, SID).stat().st_size
            assert await c.call("session.deleteMessage", delete) == {"messageId": "a2", "deleted": True}
            assert revisions_path(tmp_path, SID).stat().st_size == size  # nothing written again
            assert await c.call("session.deleteMessage", delete) == {"messageId": "a2", "deleted": True}
            with pytest.raises(RpcError) as err:
                await c.call("session.restoreMessage", delete)
            assert err.value.data_code == "IDEMPOTENCY_CONFLICT"
            await c.call("session.activateRevision", {"sessionId": SID, "rootUserId": "u2", "revisionIndex": 1})
            got = await full(c, SID)
            assert [(m["id"], m.get("deleted", False)) for m in got["messages"]] == [
                ("u1", False), ("a1", False), ("u2", False), ("a2", False)]


@pytest.mark.parametrize("saved_before", [False, True], ids=["new-variant", "refresh"])
async def test_a_save_active_retried_after_a_kill_before_its_commit_answers_from_its_reference_line(
        tmp_path, saved_before):
    """A keyed ``session.saveActiveRevision`` carries its receipt, with its answer, on its ``revision_live``
    reference line. Killed after that line reached the file, before the commit (the database whole): no
    receipt row. The retry used to save the branch again (one more reference line, a refresh) instead of
    answering from the line; boot's first look at the revisions file restores the receipt now."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "crash") as c:
            await _two_turns(c)
            if saved_before:
                await c.call("session.saveActiveRevision", {"sessionId": SID, "rootUserId": "u2"})
    save = {"sessionId": SID, "rootUserId": "u2", "submissionId": "save-1"}
    await call_killed_at(tmp_path, "revisions.after_write", "session.saveActiveRevision", save, client_id="crash")
    path = revisions_path(tmp_path, SID)
    carried = read_revisions(path).line_receipts[-1]
    assert carried["submissionId"] == "save-1"
    size = path.stat().st_size
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "crash") as c:
            assert await c.call("session.saveActiveRevision", save) == carried["extra"]["response"]
            assert path.stat().st_size == size  # no second reference line
            assert await c.call("session.saveActiveRevision", save) == carried["extra"]["response"]
            revs = (await c.call("session.listRevisions", {"sessionId": SID, "rootUserId": "u2"}))["revisions"]
            assert [(r["revisionIndex"], r["isActive"], r["messageCount"]) for r in revs] == [(1, True, 2)]
    assert path.stat().st_size == size
