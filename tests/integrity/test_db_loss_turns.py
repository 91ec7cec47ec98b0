"""Turns after a lost or corrupt ``pi.sqlite``: the index rebuilt from the transcripts links every message to
the turn its line names again, and a turn that ended before the loss is not started again by its retried
``session.startTurn`` (protocol/README.md, receipts table: ``INDEX_LOST``).

Black-box, on a real host process, as tests/integrity/test_db_loss_receipts.py: built through the wire, the
host stopped, the database removed (with its ``-wal``/``-shm``) or its header overwritten, the host started
again, the sidecar's keyed calls retried.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, open_client
from tests.hostkit import msg, start_host_process
from tests.integrity.test_db_loss_receipts import _damage

SID = "s1"
START = {"sessionId": SID, "turnId": "t1", "submissionId": "k-start"}
PROMPT = {"sessionId": SID, "turnId": "t1", "message": msg("u1", "question"), "submissionId": "k-u1"}
REPLY = {"sessionId": SID, "turnId": "t1", "message": msg("a1", "answer", role="assistant"),
         "submissionId": "k-a1"}
END = {"sessionId": SID, "turnId": "t1", "status": "completed", "submissionId": "k-end"}


async def _on_host(root: Path, work: Any) -> Any:
    proc = await trio.to_thread.run_sync(start_host_process, root)
    try:
        async with open_client(proc.url, proc.token, client_id="sidecar", client_kind="agent") as c:
            return await work(c)
    finally:
        assert await trio.to_thread.run_sync(proc.terminate) == 0


async def _turns(c: HostClient) -> list[tuple[str, str, str | None]]:
    listed = await c.call("session.listTurns", {"sessionId": SID})
    return [(t["id"], t["status"], t.get("errorCode")) for t in listed["turns"]]


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_turn_that_ended_before_the_loss_keeps_its_messages_and_is_not_run_again(
        tmp_path: Path, how: str) -> None:
    """The rebuilt index used to drop every message's turn (the turn rows went with the database, and a
    row links only to a turn row): a keyed append's retry answered ``turnId: null``. And the retried start
    of the turn, which had completed, started it again: a turn ``running`` for work that had finished, until
    its end was retried or a restart's fence aborted it."""

    async def build(c: HostClient) -> Any:
        await c.call("session.create", {"sessionId": SID, "title": "t"})
        first = [await c.call("session.startTurn", START), await c.call("session.appendMessage", PROMPT),
                 await c.call("session.appendMessage", REPLY), await c.call("session.endTurn", END)]
        return first, await _turns(c)

    async def retry(c: HostClient) -> Any:
        lost = await _turns(c)
        prompt, reply = await c.call("session.appendMessage", PROMPT), await c.call("session.appendMessage", REPLY)
        started = await c.call("session.startTurn", START)
        after_start = await _turns(c)
        ended = await c.call("session.endTurn", END)
        return lost, (prompt, reply), started, after_start, ended, await _turns(c)

    with trio.fail_after(60):
        (first, before) = await _on_host(tmp_path, build)
        _damage(tmp_path, how)
        lost, appends, started, after_start, ended, settled = await _on_host(tmp_path, retry)
    assert before == [("t1", "completed", None)]
    # the messages' turn, as the first answers gave it
    assert [a["message"]["turnId"] for a in appends] == ["t1", "t1"]
    assert list(appends) == first[1:3]
    # the turn is back, ended (how, the lost row knew), and its retried start does not run it again
    assert lost == [("t1", "aborted", "INDEX_LOST")]
    assert (started["id"], started["status"], started["errorCode"]) == ("t1", "aborted", "INDEX_LOST")
    assert after_start == lost
    # its retried end settles it as the first end did, once
    assert ended["turn"]["status"] == "completed" and ended["notification"]["turnId"] == "t1"
    assert settled == before


async def test_a_lost_wal_takes_the_turns_row_the_session_row_kept(tmp_path: Path) -> None:
    """Only the database's newest commits lost (its ``-wal`` gone after a kill, the main file kept): the
    session's row stays, the turn's row and its messages' rows went. The boot reconcile indexes the lines
    again and restores the turn they name, as a rebuild does: before, the rows linked to no turn (a keyed
    append's retry answered ``turnId: null``), the turn was missing from ``listTurns``, and its retried
    start ran it again."""

    async def create(c: HostClient) -> None:
        await c.call("session.create", {"sessionId": SID, "title": "t"})

    with trio.fail_after(90):
        await _on_host(tmp_path, create)  # a clean stop: the session's row is in the main file
        assert not (tmp_path / "pi.sqlite-wal").exists()
        proc = await trio.to_thread.run_sync(start_host_process, tmp_path)
        async with open_client(proc.url, proc.token, client_id="sidecar", client_kind="agent") as c:
            first = [await c.call("session.startTurn", START), await c.call("session.appendMessage", PROMPT),
                     await c.call("session.appendMessage", REPLY), await c.call("session.endTurn", END)]
            before = await _turns(c)
        await trio.to_thread.run_sync(proc.kill9)
        assert (tmp_path / "pi.sqlite-wal").stat().st_size > 0  # the turn's commits are there only
        for name in ("pi.sqlite-wal", "pi.sqlite-shm"):
            (tmp_path / name).unlink()

        async def retry(c: HostClient) -> Any:
            lost = await _turns(c)
            appends = [await c.call("session.appendMessage", PROMPT), await c.call("session.appendMessage", REPLY)]
            started = await c.call("session.startTurn", START)
            return lost, appends, started, await c.call("session.endTurn", END), await _turns(c)

        lost, appends, started, ended, settled = await _on_host(tmp_path, retry)
    assert before == [("t1", "completed", None)]
    assert lost == [("t1", "aborted", "INDEX_LOST")]
    assert appends == first[1:3] and [a["message"]["turnId"] for a in appends] == ["t1", "t1"]
    assert (started["id"], started["status"], started["errorCode"]) == ("t1", "aborted", "INDEX_LOST")
    assert ended["turn"]["status"] == "completed" and settled == before


async def test_a_branch_switched_back_after_the_loss_brings_its_turn_back_as_a_rebuild_does(tmp_path: Path) -> None:
    """A regenerated branch left the transcript, and its turn is named only by the revisions file (its ``turns``
    map and its lines), so a rebuild after a lost database has no row for it. Switching back to that branch then
    wrote lines naming the turn into the transcript: the switch linked the restored messages to no turn and
    ``listTurns`` lacked it, while the next rebuild from the very same files gives it a row (``INDEX_LOST``), as
    for every turn a line names. The switch restores it as the rebuild would (seed 003 §4.9: the map "exists for
    messages a restore has to re-attach after they left the index")."""

    async def build(c: HostClient) -> None:
        await c.call("session.create", {"sessionId": SID, "title": "t"})
        await c.call("session.appendMessage", {"sessionId": SID, "message": msg("u1", "question")})  # seed §5:
        await c.call("session.startTurn", START)  # the prompt's line first, then the turn it starts
        await c.call("session.appendMessage", REPLY)
        await c.call("session.endTurn", END)
        await c.call("session.saveActiveRevision", {"sessionId": SID, "rootUserId": "u1"})
        await c.call("session.truncateFrom", {"sessionId": SID, "messageId": "a1", "mode": "regenerate"})
        await c.call("session.startTurn", {"sessionId": SID, "turnId": "t2"})
        await c.call("session.appendMessage", {"sessionId": SID, "turnId": "t2",
                                               "message": msg("a2", "again", role="assistant")})
        await c.call("session.endTurn", {"sessionId": SID, "turnId": "t2", "status": "completed"})
        await c.call("session.saveActiveRevision", {"sessionId": SID, "rootUserId": "u1"})

    async def switch(c: HostClient) -> Any:
        lost = await _turns(c)
        await c.call("session.activateRevision", {"sessionId": SID, "rootUserId": "u1", "revisionIndex": 1})
        got = await c.call("session.get", {"sessionId": SID})
        return lost, [(m["id"], m.get("turnId")) for m in got["messages"]], await _turns(c)

    with trio.fail_after(90):
        await _on_host(tmp_path, build)
        _damage(tmp_path, "deleted")
        lost, switched_messages, switched = await _on_host(tmp_path, switch)
        _damage(tmp_path, "deleted")
        rebuilt = await _on_host(tmp_path, _turns)
    assert lost == [("t2", "aborted", "INDEX_LOST")]  # t1: named by no line of the transcript then
    assert switched_messages == [("u1", None), ("a1", "t1")]
    # a rebuild from the files as the switch left them: a row for the turn the transcript's lines name
    assert rebuilt == [("t1", "aborted", "INDEX_LOST")]
    # the switch gave it that row already (t2's, a row before the switch, stays: turns are never deleted)
    assert sorted(switched) == [("t1", "aborted", "INDEX_LOST"), ("t2", "aborted", "INDEX_LOST")]
