"""session.create failing with ENOSPC / EIO once its transcript is in place, retried at once in the same
process with the same clientId + submissionId: the first try's answer, one session.

A `pi-host serve` process raises ``OSError`` at a named point (``RT_CRASHPOINT=<point>:1:<action>``)
after the new transcript (whose header holds the call's receipt) was renamed into place, before or in
the commit of its row. The retry found no receipt row, caught the session up from its transcript (which
restored the row and the receipt from the header) and then answered CONFLICT "session ... already
exists"; only a second retry got the session.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.hostkit import client_for, failed_then_retried, faulted_client, inprocess_host

CLIENT = "cli-1"
CODES = {"enospc": "STORAGE_FULL", "eio": "IO_ERROR"}


@pytest.mark.parametrize("action", ["enospc", "eio"])
@pytest.mark.parametrize("point", ["create.after_rename", "create.before_index", "session.create.before_commit",
                                   "index.before_commit"])
@pytest.mark.parametrize("with_id", [True, False], ids=["sessionId", "derived-id"])
async def test_create_retried_after_a_storage_error_answers_the_session(tmp_path: Path, point: str, action: str,
                                                                       with_id: bool) -> None:
    async with inprocess_host(tmp_path) as host, client_for(host, CLIENT, kind="agent") as c:
        await c.call("session.create", {"sessionId": "s0", "title": "Other"})
    params: dict[str, Any] = {"title": "New", "submissionId": "sub-1", **({"sessionId": "s1"} if with_id else {})}
    async with faulted_client(tmp_path, f"{point}:1:{action}", client_id=CLIENT) as c:
        retried = await failed_then_retried(c, "session.create", params, CODES[action])
        listed = (await c.call("session.list", {}))["sessions"]
    assert retried["title"] == "New" and retried["messageCount"] == 0
    if with_id:
        assert retried["id"] == "s1"
    assert sorted(s["id"] for s in listed) == sorted(["s0", retried["id"]])
