"""Seed 003 §11 item 13: "the pager can restore any archived branch", also when another session took one of
its message ids after the branch left the transcript. Message ids are the host's: a message in
``sessions/<id>.revisions.jsonl`` no longer holds its id in the index, so session B may append ``a1`` after
session A regenerated away from its ``a1``. Restoring A's branch then brings ``a1`` back as an append of that
id would be stored: ``{sessionId}:a1`` (D444), with every reference the branch makes to it (its checkpoints'
``throughMessageId``, its deleted ids, its turns) spelled the same way, so the branch reads back message for
message. Black-box, against real ``pi-host serve`` processes; kills are SIGKILL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from protocol.methods import METHODS
from runtime.client import HostClient
from tests.acceptance.outsiderkit import client, real_host, say
from tests.hostkit import call_killed_at, msg, start_host_process


def _revisions(root: Path, sid: str) -> bytes:
    path = root / "sessions" / f"{sid}.revisions.jsonl"
    return path.read_bytes() if path.exists() else b""


def _drop_database(root: Path) -> None:
    for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
        (root / name).unlink(missing_ok=True)


def _text(m: dict[str, Any]) -> str:
    return "".join(b.get("text", "") for b in m.get("blocks", ()))


async def _call(c: HostClient, method: str, params: dict[str, Any]) -> Any:
    result = await c.call(method, params)
    METHODS[method].result_model.model_validate(result)
    return result


async def _live(c: HostClient, sid: str) -> list[tuple[str, str]]:
    page = await _call(c, "session.get", {"sessionId": sid, "messageLimit": 200})
    return [(m["id"], _text(m)) for m in page["messages"]]


async def _context(c: HostClient, sid: str) -> list[str]:
    return [m["id"] for m in (await _call(c, "session.context", {"sessionId": sid}))["messages"]]


async def _checkpoints(c: HostClient, sid: str) -> list[tuple[str, str]]:
    page = await _call(c, "session.get", {"sessionId": sid, "messageLimit": 200})
    return [(cp["id"], cp["throughMessageId"]) for cp in page.get("compactions", ())]


async def _rows(c: HostClient, sid: str) -> list[tuple[str, int, bool, int]]:
    got = (await _call(c, "session.listRevisions", {"sessionId": sid}))["revisions"]
    return [(r["rootUserId"], r["revisionIndex"], r["isActive"], r["messageCount"]) for r in got]


OLD = [("u1", "question u1"), ("a1", "old answer"), ("u2", "question u2"), ("a2", "second answer")]


async def _setup(c: HostClient) -> tuple[str, str]:
    """Session A: u1 a1 u2 a2 (a checkpoint through a1, a2 deleted), regenerated at a1 → u1 a1b. Session B
    then appends its own a1 and a2: A's archived branch holds ids another session holds now."""
    a = (await _call(c, "session.create", {}))["id"]
    for mid, text in OLD:
        await say(c, a, mid, text, "assistant" if mid.startswith("a") else "user")
    await _call(c, "session.appendCompaction", {"sessionId": a, "compaction": {
        "id": "c1", "summary": "summary c1", "throughMessageId": "a1", "tokensBefore": 100}})
    await _call(c, "session.deleteMessage", {"sessionId": a, "messageId": "a2"})
    await _call(c, "session.truncateFrom", {"sessionId": a, "messageId": "a1", "mode": "regenerate"})
    await say(c, a, "a1b", "new answer", "assistant")
    b = (await _call(c, "session.create", {}))["id"]
    await say(c, b, "a1", "B's own a1", "assistant")
    await say(c, b, "a2", "B's own a2", "assistant")
    return a, b


async def _assert_old_branch(c: HostClient, a: str, b: str) -> None:
    """A shows its old branch message for message, the taken ids spelled as an append of them would be; B
    keeps its own a1 and a2."""
    assert await _live(c, a) == [("u1", "question u1"), (f"{a}:a1", "old answer"), ("u2", "question u2"),
                                 (f"{a}:a2", "second answer")]
    # the checkpoint through a1 still stands (its summary replaces u1 a1), a2 stays deleted (its tombstone too)
    assert await _checkpoints(c, a) == [("c1", f"{a}:a1")]
    assert await _context(c, a) == ["c1", "u2"]
    assert await _live(c, b) == [("a1", "B's own a1"), ("a2", "B's own a2")]
    again = await _call(c, "session.appendMessage", {"sessionId": a, "message": msg("a1", "old answer",
                                                                                       role="assistant")})
    assert again["message"]["id"] == f"{a}:a1"  # what an append of that id is answered: the same row


async def _assert_new_branch(c: HostClient, a: str) -> None:
    assert await _live(c, a) == [("u1", "question u1"), ("a1b", "new answer")]


async def _switch(c: HostClient, a: str, idx: int, **extra: Any) -> Any:
    return await _call(c, "session.activateRevision", {"sessionId": a, "rootUserId": "u1", "revisionIndex": idx,
                                                       **extra})


async def test_a_branch_whose_id_another_session_took_is_restored_under_the_sessions_spelling(
        tmp_path: Path) -> None:
    """Before the fix: CONFLICT "message id a1 belongs to another session". Switching back and forth keeps
    one spelling (never ``{a}:{a}:a1``) and only ever appends to the revisions file."""
    root = tmp_path / "data"
    root.mkdir()
    with trio.fail_after(120):
        async with real_host(root) as (_, c):
            a, b = await _setup(c)
            before = _revisions(root, a)
            await _switch(c, a, 1)
            await _assert_old_branch(c, a, b)
            assert await _rows(c, a) == [("u1", 1, True, 4), ("u1", 2, False, 2)]
            sizes = []
            for _ in range(3):
                now = _revisions(root, a)
                assert now.startswith(before)
                before = now
                sizes.append(len(now))
                await _switch(c, a, 2)
                await _assert_new_branch(c, a)
                await _switch(c, a, 1)
                await _assert_old_branch(c, a, b)
            assert sizes[1] == sizes[2], "a steady back-and-forth writes no new lines"
            assert await _rows(c, a) == [("u1", 1, True, 4), ("u1", 2, False, 2)]


async def test_the_restore_holds_across_a_restart_and_a_rebuilt_index(tmp_path: Path) -> None:
    """The index deleted and rebuilt from the files between every step: before the switch (B's a1 owns the
    bare id), after it, and after switching back and forth."""
    root = tmp_path / "data"
    root.mkdir()
    with trio.fail_after(180):
        async with real_host(root) as (_, c):
            a, b = await _setup(c)
        _drop_database(root)
        async with real_host(root) as (_, c):
            await _switch(c, a, 1)
            await _assert_old_branch(c, a, b)
        _drop_database(root)
        async with real_host(root) as (_, c):
            await _assert_old_branch(c, a, b)
            await _switch(c, a, 2)
            await _assert_new_branch(c, a)
        async with real_host(root) as (_, c):  # a plain restart
            await _switch(c, a, 1)
        _drop_database(root)
        async with real_host(root) as (_, c):
            await _assert_old_branch(c, a, b)
            assert await _rows(c, a) == [("u1", 1, True, 4), ("u1", 2, False, 2)]


async def test_a_keyed_restore_killed_after_its_rewrite_takes_effect_once(tmp_path: Path) -> None:
    """SIGKILL after the transcript rename, before the reindex; the keyed retry on a restarted host answers
    the switch and writes nothing more."""
    root = tmp_path / "data"
    root.mkdir()
    with trio.fail_after(180):
        async with real_host(root, client_id="k") as (_, c):
            a, b = await _setup(c)
        params = {"sessionId": a, "rootUserId": "u1", "revisionIndex": 1, "submissionId": "K1"}
        await call_killed_at(root, "rewrite.after_rename", "session.activateRevision", params, client_id="k")
        after_kill = (_revisions(root, a), (root / "sessions" / f"{a}.jsonl").read_bytes())
        host = start_host_process(root)
        try:
            async with client(host, client_id="k") as c:
                first = await _call(c, "session.activateRevision", params)
                again = await _call(c, "session.activateRevision", params)
                assert again == first
                await _assert_old_branch(c, a, b)
                assert [r["revisionIndex"] for r in first["revisions"] if r["isActive"]] == [1]
                assert _revisions(root, a) == after_kill[0]
                body = (root / "sessions" / f"{a}.jsonl").read_bytes()
                assert body.count(f'"id":"{a}:a1"'.encode()) == 1 and b'"id":"a1"' not in body
        finally:
            host.kill9()


async def test_an_edited_away_root_whose_id_another_session_took_comes_back_in_its_family(tmp_path: Path) -> None:
    """An edit archived the user message u1 itself (the edit u1e names it in ``meta.revisionRootId``); B took u1
    and a1. The restore shows ``{a}:u1`` ``{a}:a1``, still the family u1 (its rows, its pager), and switching
    back and forth by the id the client chose keeps working."""
    root = tmp_path / "data"
    root.mkdir()
    with trio.fail_after(120):
        async with real_host(root) as (_, c):
            a = (await _call(c, "session.create", {}))["id"]
            await say(c, a, "u1", "first wording")
            await say(c, a, "a1", "first answer", "assistant")
            await _call(c, "session.truncateFrom", {"sessionId": a, "messageId": "u1", "mode": "edit"})
            await say(c, a, "u1e", "second wording", meta={"revisionRootId": "u1"})
            await say(c, a, "a1e", "second answer", "assistant")
            b = (await _call(c, "session.create", {}))["id"]
            await say(c, b, "u1", "B's u1")
            await say(c, b, "a1", "B's a1", "assistant")
            for _ in range(2):
                await _switch(c, a, 1)
                assert await _live(c, a) == [(f"{a}:u1", "first wording"), (f"{a}:a1", "first answer")]
                assert await _rows(c, a) == [("u1", 1, True, 2), ("u1", 2, False, 2)]
                await _switch(c, a, 2)
                assert await _live(c, a) == [("u1e", "second wording"), ("a1e", "second answer")]
            assert await _live(c, b) == [("u1", "B's u1"), ("a1", "B's a1")]


async def _archived_nodes(c: HostClient, sid: str) -> list[tuple[str, str, bool]]:
    tree = await _call(c, "session.tree", {"sessionId": sid})
    return [(n["id"], n["messageId"], n["deleted"]) for n in tree["nodes"] if n["id"].startswith("rev:")]


async def test_the_tree_shows_an_archived_message_under_the_id_its_restore_gives_it(tmp_path: Path) -> None:
    """Seed 000 §3: the tree is what a client acts on. Before the fix it showed A's archived a1 and a2 under
    their stored ids, which are B's messages now; a client naming them (to delete one, or to find it after the
    switch) reached B's message or none. The tree shows each under the id ``activateRevision`` then puts in the
    transcript (``{sessionId}:{id}``), before the switch, after a restart with a rebuilt index, and the
    spelling the switch gives is the one the tree showed."""
    root = tmp_path / "data"
    root.mkdir()
    with trio.fail_after(120):
        async with real_host(root) as (_, c):
            a, b = await _setup(c)
            shown = await _archived_nodes(c, a)
            assert shown == [(f"rev:u1:1:{a}:a1", f"{a}:a1", False), ("rev:u1:1:u2", "u2", False),
                             (f"rev:u1:1:{a}:a2", f"{a}:a2", True)]
        _drop_database(root)
        async with real_host(root) as (_, c):
            assert await _archived_nodes(c, a) == shown
            await _switch(c, a, 1)
            assert [mid for mid, _ in await _live(c, a)] == ["u1"] + [mid for _, mid, _ in shown]
            assert await _archived_nodes(c, a) == [("rev:u1:2:a1b", "a1b", False)]
            await _switch(c, a, 2)  # the old branch left again, stored as it was live: the same ids
            assert await _archived_nodes(c, a) == shown
