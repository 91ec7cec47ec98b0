"""A whole-transcript rewrite (truncateFrom, replaceMessages) failing with ENOSPC / EIO once its new
file is in place, retried at once in the same process with the same clientId + submissionId: the
first try's answer, from the receipt the new file's header carries.

A `pi-host serve` process raises ``OSError`` at a named point (``RT_CRASHPOINT=<point>:1:<action>``)
after the new transcript replaced the old one, before its commit landed. The retry looked for its
receipt row before the session's actor caught up with the file (the catch-up restores that receipt
from the header), then ran the method again on the rewritten file: MESSAGE_NOT_FOUND for a
truncateFrom whose message the first try had cut.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.hostkit import client_for, create_two_exchanges, failed_then_retried, faulted_client, inprocess_host, msg

CLIENT = "cli-1"
CODES = {"enospc": "STORAGE_FULL", "eio": "IO_ERROR"}
CALLS: dict[str, dict[str, Any]] = {
    "session.truncateFrom": {"sessionId": "s1", "messageId": "a1", "mode": "regenerate"},
    "session.replaceMessages": {"sessionId": "s1", "messages": [msg("u0", "q0"), msg("z1", "new")]},
}


async def _setup(root: Path) -> None:
    async with inprocess_host(root) as host, client_for(host, CLIENT, kind="agent") as c:
        await create_two_exchanges(c)


async def _crash_free(root: Path, method: str) -> tuple[Any, list[str]]:
    await _setup(root)
    async with inprocess_host(root) as host, client_for(host, CLIENT, kind="agent") as c:
        answer = await c.call(method, {**CALLS[method], "submissionId": "sub-1"})
        got = await c.call("session.get", {"sessionId": "s1", "full": True})
    return answer, [m["id"] for m in got["messages"]]


def _stable(answer: Any) -> Any:
    session = {k: v for k, v in answer["session"].items() if k not in ("createdAt", "updatedAt")}
    return {**answer, "session": session}


@pytest.mark.parametrize("action", ["enospc", "eio"])
@pytest.mark.parametrize("point", ["rewrite.after_rename", "rewrite.before_reindex", "before_commit"])
@pytest.mark.parametrize("method", list(CALLS))
async def test_rewrite_retried_at_once_answers_the_first_try(tmp_path: Path, method: str, point: str,
                                                             action: str) -> None:
    expected, expected_ids = await _crash_free(tmp_path / "ref", method)
    root = tmp_path / "run"
    await _setup(root)
    armed = f"{method}.before_commit" if point == "before_commit" else point
    params = {**CALLS[method], "submissionId": "sub-1"}
    async with faulted_client(root, f"{armed}:1:{action}", client_id=CLIENT) as c:
        retried = await failed_then_retried(c, method, params, CODES[action])
        got = await c.call("session.get", {"sessionId": "s1", "full": True})
    assert _stable(retried) == _stable(expected)
    assert [m["id"] for m in got["messages"]] == expected_ids
