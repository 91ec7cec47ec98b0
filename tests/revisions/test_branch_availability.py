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
from tests.acceptance.outsiderkit import data_dir, real_host, say
from tests.revisions.helpers import revisions_path


async def _call(c: HostClient, method: str, params: dict[str, Any]) -> Any:
    result = await c.call(method, params)
    METHODS[method].result_model.model_validate(result)
    return result


def _lines(root: Path, sid: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in revisions_path(root, sid).read_bytes().splitlines()]


async def _saved_turn(c: HostClient) -> str:
    """A session holding u1 a1, saved: its revisions file holds one reference, to variant 1."""
    sid: str = (await _call(c, "session.create", {}))["id"]
    await say(c, sid, "u1", "question u1")
    await say(c, sid, "a1", "answer a1", "assistant")
    await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
    return sid


async def test_a_rewrite_dropping_the_live_root_never_stores_it_under_a_stale_reference(tmp_path: Path) -> None:
    """Before the fix, deleting the live root (``replaceMessages`` without it) archived the live branch (u1
    a1b, variant 2) as a full line keyed ``u1/1``, because the stale reference for variant 1 "resolved" to the
    live suffix: variant 1 then held variant 2's messages."""
    root = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(root) as (_, c):
            sid = await _saved_turn(c)
            backup = revisions_path(root, sid).read_bytes()
            await _call(c, "session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            await say(c, sid, "a1b", "answer a1b", "assistant")
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
        revisions_path(root, sid).write_bytes(backup)
        async with real_host(root) as (_, c):
            await _call(c, "session.replaceMessages", {"sessionId": sid, "messages": [
                {"id": "n1", "role": "user", "blocks": [{"type": "text", "text": "something else"}]}]})
            for line in _lines(root, sid):
                held = [m["id"] for m in line.get("messages", ())]
                assert "a1b" not in held or line["revisionIndex"] != 1, line
            assert revisions_path(root, sid).read_bytes().startswith(backup)
