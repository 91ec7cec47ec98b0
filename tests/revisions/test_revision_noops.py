"""Seed 000 §2 (command receipts) and seed 003 §4.9 (branches): calls of the branch methods that change
nothing write nothing. Black-box, against real ``pi-host serve`` processes.

Found: ``session.activateRevision`` of the branch already live, keyed, appended a ``session_info`` line that
changed nothing but carried the receipt (one line per call); ``sessions.trash`` / ``sessions.restore`` no-ops
had been fixed the same way before (their receipt is a database row only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from protocol.methods import METHODS
from runtime.client import HostClient
from tests.acceptance.outsiderkit import code_of, data_dir, real_host, say
from tests.revisions.helpers import revisions_path, transcript_path


async def _call(c: HostClient, method: str, params: dict[str, Any]) -> Any:
    result = await c.call(method, params)
    METHODS[method].result_model.model_validate(result)
    return result


def _files(root: Path, sid: str) -> tuple[bytes, bytes]:
    return transcript_path(root, sid).read_bytes(), revisions_path(root, sid).read_bytes()


async def test_activating_the_live_branch_writes_nothing_and_a_keyed_retry_answers_as_the_first(
        tmp_path: Path) -> None:
    """protocol/README §4: an ``activateRevision`` of the branch already live rewrites nothing; it writes
    nothing at all either (no ``session_info`` line: the transcript and the revisions file keep their bytes).
    Keyed, its receipt is a database row: a retry answers exactly the first answer after the session changed
    (a rename, another variant saved and made live) and after a SIGKILL and restart, and switches nothing;
    the same key for another request is ``IDEMPOTENCY_CONFLICT``."""
    root = data_dir(tmp_path)
    keyed = {"rootUserId": "u1", "revisionIndex": 1, "submissionId": "act-live"}
    with trio.fail_after(120):
        async with real_host(root) as (proc, c):
            sid: str = (await _call(c, "session.create", {}))["id"]
            keyed["sessionId"] = sid
            await say(c, sid, "u1", "question u1")
            await say(c, sid, "a1", "answer a1", "assistant")
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            before = _files(root, sid)
            plain = await _call(c, "session.activateRevision",
                                {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 1})
            first = await _call(c, "session.activateRevision", keyed)
            assert first == plain
            assert [(r["revisionIndex"], r["isActive"]) for r in first["revisions"]] == [(1, True)]
            assert await _call(c, "session.activateRevision", keyed) == first
            assert _files(root, sid) == before, "an activate of the live branch writes no byte"

            # the session changes since: a rename, a regenerate saved as variant 2 and live
            await _call(c, "session.rename", {"sessionId": sid, "title": "renamed since"})
            await _call(c, "session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            await say(c, sid, "a1b", "answer a1b", "assistant")
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            changed = _files(root, sid)
            assert await _call(c, "session.activateRevision", keyed) == first  # answered: nothing switched
            assert _files(root, sid) == changed
            assert await code_of(c, "session.activateRevision", {**keyed, "revisionIndex": 2}) == "IDEMPOTENCY_CONFLICT"
            proc.kill9()
        async with real_host(root) as (proc, c):
            assert await _call(c, "session.activateRevision", keyed) == first
            assert _files(root, sid) == changed
            live = (await _call(c, "session.get", {"sessionId": sid}))["messages"]
            assert [m["id"] for m in live] == ["u1", "a1b"]
            proc.kill9()
