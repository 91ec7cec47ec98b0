"""Seed 003 §2.1 / §4.9 and seed 000 §3: which archived branches ``session.activateRevision`` can switch to,
and what ``session.listRevisions`` and ``session.tree`` say about the others. Black-box, against real
``pi-host serve`` processes.

* A ``revision_live`` line names its branch by ``(rootUserId, revisionIndex)`` only (no ids, no hash): it is
  that branch only while the live root's pager stamp (``activeRevision``) names that index. A revisions file
  restored from a backup can hold a reference to a variant that is not the live one any more: it resolves to
  nothing. It is listed ``unavailable: "stale_reference"`` (``activateRevision`` answers ``CORRUPT_DATA``),
  and a rewrite that drops the live branch never stores the live branch's messages under its key.
* A branch whose family no live user message roots (an edit that names no root; a root deleted since) is
  listed, and shown in the tree, ``unavailable: "root_missing"`` (``activateRevision`` answers
  ``MESSAGE_NOT_FOUND``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from protocol.methods import METHODS
from runtime.client import HostClient
from tests.acceptance.outsiderkit import code_of, data_dir, real_host, say
from tests.revisions.helpers import revisions_path


async def _call(c: HostClient, method: str, params: dict[str, Any]) -> Any:
    result = await c.call(method, params)
    METHODS[method].result_model.model_validate(result)
    return result


async def _rows(c: HostClient, sid: str) -> list[tuple[str, int, bool, str | None]]:
    got = (await _call(c, "session.listRevisions", {"sessionId": sid}))["revisions"]
    return [(r["rootUserId"], r["revisionIndex"], r["isActive"], r.get("unavailable")) for r in got]


def _lines(root: Path, sid: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in revisions_path(root, sid).read_bytes().splitlines()]


async def _saved_turn(c: HostClient) -> str:
    """A session holding u1 a1, saved: its revisions file holds one reference, to variant 1."""
    sid: str = (await _call(c, "session.create", {}))["id"]
    await say(c, sid, "u1", "question u1")
    await say(c, sid, "a1", "answer a1", "assistant")
    await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
    return sid


async def _regenerated_after_a_backup(c: HostClient, root: Path) -> tuple[str, bytes]:
    """A saved turn (variant 1 live, referenced), the revisions file's bytes then (the backup), and a
    regenerate saved as variant 2: the session's id and the backup."""
    sid = await _saved_turn(c)
    backup = revisions_path(root, sid).read_bytes()
    await _call(c, "session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
    await say(c, sid, "a1b", "answer a1b", "assistant")
    await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
    return sid, backup


async def test_a_reference_restored_from_a_backup_that_names_another_variant_is_listed_stale(
        tmp_path: Path) -> None:
    """The backup holds only ``revision_live u1/1``; the transcript's root says variant 2 is live. Variant 1
    is listed, not active, ``unavailable: "stale_reference"``, and switching to it is ``CORRUPT_DATA``."""
    root = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(root) as (_, c):
            sid, backup = await _regenerated_after_a_backup(c, root)
            assert await _rows(c, sid) == [("u1", 1, False, None), ("u1", 2, True, None)]
        revisions_path(root, sid).write_bytes(backup)
        async with real_host(root) as (_, c):
            assert await _rows(c, sid) == [("u1", 1, False, "stale_reference")]
            assert await code_of(c, "session.activateRevision",
                                 {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 1}) == "CORRUPT_DATA"
            assert revisions_path(root, sid).read_bytes() == backup, "the revisions file is never rewritten"


async def test_a_rewrite_dropping_the_live_root_never_stores_it_under_a_stale_reference(tmp_path: Path) -> None:
    """Before the fix, deleting the live root (``replaceMessages`` without it) archived the live branch (u1
    a1b, variant 2) as a full line keyed ``u1/1``, because the stale reference for variant 1 "resolved" to the
    live suffix: variant 1 then held variant 2's messages."""
    root = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(root) as (_, c):
            sid, backup = await _regenerated_after_a_backup(c, root)
        revisions_path(root, sid).write_bytes(backup)
        async with real_host(root) as (_, c):
            await _call(c, "session.replaceMessages", {"sessionId": sid, "messages": [
                {"id": "n1", "role": "user", "blocks": [{"type": "text", "text": "something else"}]}]})
            for line in _lines(root, sid):
                held = [m["id"] for m in line.get("messages", ())]
                assert "a1b" not in held or line["revisionIndex"] != 1, line
            assert revisions_path(root, sid).read_bytes().startswith(backup)


async def test_a_branch_whose_root_is_gone_is_listed_and_shown_unavailable(tmp_path: Path) -> None:
    """An edit that names no root (a new id, no ``meta.revisionRootId``) leaves family u1 with no live root:
    its branch shows as a separate chain (protocol README), marked ``unavailable: "root_missing"`` in the
    listing and on the chain's nodes, and switching to it answers ``MESSAGE_NOT_FOUND``. The live family's
    rows and nodes carry no mark."""
    root = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(root) as (_, c):
            sid = (await _call(c, "session.create", {}))["id"]
            await say(c, sid, "u1", "first wording")
            await say(c, sid, "a1", "first answer", "assistant")
            await _call(c, "session.truncateFrom", {"sessionId": sid, "messageId": "u1", "mode": "edit"})
            await say(c, sid, "u9", "another question")
            await say(c, sid, "a9", "another answer", "assistant")
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u9"})
            assert await _rows(c, sid) == [("u1", 1, False, "root_missing"), ("u9", 1, True, None)]
            tree = await _call(c, "session.tree", {"sessionId": sid})
            marks = {n["messageId"]: (n["parentId"], n.get("unavailable")) for n in tree["nodes"]}
            assert marks == {"u9": (None, None), "a9": ("u9", None), "u1": (None, "root_missing"),
                             "a1": ("rev:u1:1:u1", "root_missing")}
            assert await code_of(c, "session.activateRevision",
                                 {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 1}) == "MESSAGE_NOT_FOUND"
