"""Revisions audit fixes: rewrite receipts carried forward, nested families in the tree, the family a
live edited root names, and branch rows that a database rebuild reads back unchanged."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import trio

from runtime.host import RunningHost, run_host, wall_ms
from store.context import StoredBranch, build_tree
from store.transcripts import rewrite, transcript
from tests.hostkit import client_for, index_caught_up, inprocess_host, msg
from tests.hostkit import test_config as host_config  # aliased: pytest would collect a test_* name
from tests.revisions.helpers import full, ids, revisions_path, transcript_path, turn


def drop_db(root: Path) -> None:
    """A database rebuild: the next host boots with no index and rebuilds it from the files."""
    for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
        (root / name).unlink(missing_ok=True)


def header_of(root: Path, sid: str) -> dict[str, Any]:
    first = transcript_path(root, sid).read_bytes().split(b"\n", 1)[0]
    rec = orjson.loads(first)
    assert isinstance(rec, dict)
    return rec


def ticking_clock() -> Callable[[], int]:
    """Wall time that advances on every read: two reads never share a millisecond."""
    last = 0

    def now() -> int:
        nonlocal last
        last = max(wall_ms(), last + 1)
        return last

    return now


@asynccontextmanager
async def ticking_host(root: Path) -> AsyncIterator[RunningHost]:
    async with trio.open_nursery() as nursery:
        running: RunningHost = await nursery.start(partial(run_host, host_config(root), now_ms=ticking_clock()))
        try:
            yield running
        finally:
            nursery.cancel_scope.cancel()


async def save(c: Any, sid: str, root: str) -> dict[str, Any]:
    r: dict[str, Any] = (await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": root}))
    return r["revision"]


async def regen(c: Any, sid: str, mid: str, mode: str = "regenerate") -> None:
    await c.call("session.truncateFrom", {"sessionId": sid, "messageId": mid, "mode": mode})


async def answer(c: Any, sid: str, aid: str) -> None:
    await c.call("session.appendMessage", {"sessionId": sid, "message": msg(aid, f"a {aid}", role="assistant")})


async def activate(c: Any, sid: str, root: str, idx: int, **extra: Any) -> dict[str, Any]:
    r: dict[str, Any] = await c.call("session.activateRevision",
                                     {"sessionId": sid, "rootUserId": root, "revisionIndex": idx, **extra})
    return r


# ---------------------------------------------------------------------- 1. receipts of earlier rewrites


async def test_earlier_rewrite_receipts_survive_later_rewrites_and_a_rebuild(tmp_path):
    """A rewrite's receipt rides in the header it writes; a later rewrite writes a new header, which must
    carry the earlier receipts forward, or a rebuild forgets them and a retry runs the rewrite again."""
    sid = "s1"
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": sid})
            await turn(c, sid, "u1", "a1")
            await save(c, sid, "u1")
            r1 = await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate",
                                                       "submissionId": "K1"})
            await answer(c, sid, "a1b")
            await save(c, sid, "u1")
            await activate(c, sid, "u1", 1, submissionId="K2")
            await activate(c, sid, "u1", 2)  # a rewrite with no key of its own
            live = (await full(c, sid))["messages"]
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": [
                {k: v for k, v in m.items() if k in ("id", "role", "blocks", "meta")} for m in live]})
            await index_caught_up(host)
            before = ids(await full(c, sid))
            assert before == ["u1", "a1b"]
    transcript = transcript_path(tmp_path, sid).read_bytes()
    revisions = revisions_path(tmp_path, sid).read_bytes()
    drop_db(tmp_path)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            again2 = await activate(c, sid, "u1", 1, submissionId="K2")
            assert ids(await full(c, sid)) == before  # answered from the restored receipt, not switched again
            again1 = await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1",
                                                           "mode": "regenerate", "submissionId": "K1"})
            assert again1["removed"] == r1["removed"] == 1  # a1 is not live: a second run would fail
            assert again2["session"]["id"] == sid
            assert ids(await full(c, sid)) == before
    assert transcript_path(tmp_path, sid).read_bytes() == transcript
    assert revisions_path(tmp_path, sid).read_bytes() == revisions
    header = header_of(tmp_path, sid)
    assert "receipt" not in header  # the last rewrite had no key; the earlier ones ride on, oldest first
    assert [r["submissionId"] for r in header["receipts"]] == ["K1", "K2"]


def test_carried_receipts_are_bounded_and_read_from_old_headers() -> None:
    def rec(n: int) -> dict[str, Any]:
        return {"clientId": "c", "submissionId": f"K{n}", "fingerprint": "f", "method": "session.truncateFrom"}

    CARRIED_RECEIPTS, carried_receipts, header_receipts = (  # noqa: N806
        rewrite.CARRIED_RECEIPTS, rewrite.carried_receipts, transcript.header_receipts)
    # a header an older build wrote holds its own receipt only
    assert header_receipts({"type": "session", "receipt": rec(1)}) == [rec(1)]
    assert header_receipts({"type": "session", "receipts": [rec(1), "junk"], "receipt": rec(2)}) == [rec(1), rec(2)]
    assert header_receipts(None) == []
    many = [rec(n) for n in range(CARRIED_RECEIPTS + 10)]
    kept = carried_receipts(many, rec(CARRIED_RECEIPTS + 20))
    assert kept == many[-CARRIED_RECEIPTS:]  # the newest, oldest first
    assert carried_receipts([rec(1), rec(2), rec(1)], rec(2)) == [rec(1)]  # one per key; never the new one
    # the file's birth receipt (a keyed create, fork or edit's child) stays, however many keyed changes came after
    born = {"clientId": "c", "submissionId": "born", "fingerprint": "f", "method": "session.create"}
    kept = carried_receipts([born, *many], rec(CARRIED_RECEIPTS + 20))
    assert kept == [born, *many[-CARRIED_RECEIPTS:]]
    assert carried_receipts(kept, rec(CARRIED_RECEIPTS + 21))[0] == born


# ---------------------------------------------------------------------- 2. nested families in the tree


async def test_tree_shows_a_nested_family_once_with_its_own_index(tmp_path):
    sid = "s1"
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": sid})
            await turn(c, sid, "u1", "a1")
            await save(c, sid, "u1")
            await regen(c, sid, "a1")
            await answer(c, sid, "a1b")  # u1 variant 2 goes on with u2
            await turn(c, sid, "u2", "a2")
            await save(c, sid, "u2")
            await regen(c, sid, "a2")
            await answer(c, sid, "a2b")
            await regen(c, sid, "a2b")  # unsaved: stored as u2 variant 2
            await answer(c, sid, "a2c")
            assert (await save(c, sid, "u2"))["revisionIndex"] == 3
            assert (await save(c, sid, "u1"))["revisionIndex"] == 2
            await activate(c, sid, "u1", 1)  # u1 variant 2, holding u2 variant 3, leaves the transcript
            tree = await c.call("session.tree", {"sessionId": sid})
    nodes = tree["nodes"]
    shown = [n["messageId"] for n in nodes]
    assert sorted(shown) == sorted(set(shown)), shown  # every message once
    by_msg = {n["messageId"]: n for n in nodes}
    # u2 and its live reply when u1 left were u2's variant 3, not u1's variant 2
    assert by_msg["u2"]["revisionIndex"] == 3 and by_msg["a2c"]["revisionIndex"] == 3
    assert by_msg["a1b"]["revisionIndex"] == 2
    under_u2 = [n["messageId"] for n in nodes if n.get("parentId") == by_msg["u2"]["id"]]
    assert under_u2 == ["a2", "a2b", "a2c"]  # siblings by u2's revision index


def m(mid: str, role: str = "user", meta: dict[str, Any] | None = None) -> dict[str, Any]:
    rec: dict[str, Any] = {"id": mid, "role": role, "blocks": [{"type": "text", "text": f"t {mid}"}]}
    if meta:
        rec["meta"] = meta
    return rec


def test_build_tree_labels_a_nested_variant_by_its_family() -> None:
    u2 = m("u2", meta={"revisionCount": 3, "activeRevision": 3, "revisionRootId": "u2"})
    branches = [
        StoredBranch("u1", 2, [m("u1"), m("a1b", "assistant"), u2, m("a2c", "assistant"), m("u3"),
                               m("a3", "assistant")]),
        StoredBranch("u2", 1, [m("u2"), m("a2", "assistant")]),
        StoredBranch("u2", 3, [u2, m("a2c", "assistant"), m("u3"), m("a3", "assistant")]),  # the same variant
    ]
    tree = build_tree([m("u1"), m("a1", "assistant")], (), branches)
    nodes = {n["id"]: n for n in tree["nodes"]}
    assert [n["messageId"] for n in tree["nodes"]].count("a2c") == 1
    assert not any(i.startswith("rev:u2:3:") for i in nodes)
    assert nodes["rev:u1:2:a1b"]["revisionIndex"] == 2
    assert nodes["rev:u1:2:u2"]["revisionIndex"] == 3 and nodes["rev:u1:2:a2c"]["revisionIndex"] == 3
    assert nodes["rev:u1:2:a3"]["revisionIndex"] == 3  # u3 has no variants: it stays in u2's
    assert nodes["rev:u2:1:a2"]["parentId"] == "rev:u1:2:u2" and nodes["rev:u2:1:a2"]["revisionIndex"] == 1


# ---------------------------------------------------------------------- 3. listRevisions by the live root's id


async def test_list_revisions_by_the_edited_root_id(tmp_path):
    sid = "s1"
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": sid})
            await turn(c, sid, "u1", "a1")
            await save(c, sid, "u1")
            await regen(c, sid, "u1", mode="edit")
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                "u1x", "edited", meta={"revisionRootId": "u1"})})
            await answer(c, sid, "a1x")
            assert (await save(c, sid, "u1x"))["rootUserId"] == "u1"
            by_family = (await c.call("session.listRevisions", {"sessionId": sid, "rootUserId": "u1"}))["revisions"]
            by_live = (await c.call("session.listRevisions", {"sessionId": sid, "rootUserId": "u1x"}))["revisions"]
            assert [r["revisionIndex"] for r in by_family] == [1, 2]
            assert by_live == by_family
            other = (await c.call("session.listRevisions", {"sessionId": sid, "rootUserId": "a1x"}))["revisions"]
            assert other == []  # a reply roots no family


# ---------------------------------------------------------------------- 4. rows a rebuild reads back


async def test_saved_live_branch_count_reads_back_after_a_rebuild(tmp_path):
    """messageCount of a saved live branch is the count at save time (the row's): the ``revision_live``
    line carries it, so a rebuild does not count the live suffix as it is by then."""
    sid = "s1"
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": sid})
            await turn(c, sid, "u1", "a1")
            await save(c, sid, "u1")
            await turn(c, sid, "u2", "a2")  # the saved live branch grows after its save
            await save(c, sid, "u2")
            await turn(c, sid, "u3", "a3")
            await index_caught_up(host)
            before = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
            assert [(r["rootUserId"], r["revisionIndex"], r["messageCount"]) for r in before] == [
                ("u1", 1, 2), ("u2", 1, 2)]
    drop_db(tmp_path)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            rebuilt = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
    assert rebuilt == before


async def test_rewrite_minted_row_created_at_reads_back_after_a_rebuild(tmp_path):
    """createdAt of a row a rewrite mints is the time its revisions line carries (the clock ticks on
    every read here, so a second read in the rewrite would show)."""
    sid = "s1"
    with trio.fail_after(60):
        async with ticking_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": sid})
            await turn(c, sid, "u1", "a1")
            await regen(c, sid, "a1")  # no save first: the truncate mints the row
            await answer(c, sid, "a1b")
            await regen(c, sid, "a1b", mode="retry")
            await answer(c, sid, "a1c")
            await index_caught_up(host)
            before = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
            assert [r["revisionIndex"] for r in before] == [1, 2]
    drop_db(tmp_path)
    with trio.fail_after(60):
        async with ticking_host(tmp_path) as host, client_for(host) as c:
            rebuilt = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
    assert rebuilt == before
