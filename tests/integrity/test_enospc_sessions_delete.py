"""session.delete and sessions.purge failing with ENOSPC / EIO after the ``.deleting`` marker is durable:
once its rows are gone the delete has happened, in the process that failed too, not only after the next
boot; before that it has not (the marker is withdrawn).

A `pi-host serve` process raises ``OSError`` at a named point (``RT_CRASHPOINT=<point>:1:<action>``)
between the marker and the removal of the files. After the rows went, the session's actor caught up
from the transcript still on disk: its row came back (``session.list`` and ``session.get`` served the
deleted session, a write to it was acknowledged and then removed by the next boot's finishing of the
delete), while a retry answered ``deleted: true``. Now a catch-up that finds the marker finishes the
delete as boot does; a failure before the rows went withdraws the marker (the delete did not happen).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.client import RpcError
from runtime.datadir import DataDir
from tests.hostkit import client_for, faulted_client, inprocess_host, msg

CLIENT = "cli-1"
CODES = {"enospc": "STORAGE_FULL", "eio": "IO_ERROR"}
DELETE = {"sessionId": "s1", "submissionId": "sub-1"}
COMMITTED = ("index.after_commit", "before_files")  # the rows went before the failure


async def _setup(root: Path) -> None:
    async with inprocess_host(root) as host, client_for(host, CLIENT, kind="agent") as c:
        for sid in ("s1", "s9"):
            await c.call("session.create", {"sessionId": sid, "title": sid})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m-{sid}", "hello")})


@pytest.mark.parametrize("action", ["enospc", "eio"])
@pytest.mark.parametrize("step", ["after_marker", "before_commit", "index.after_commit", "before_files"])
@pytest.mark.parametrize("read_first", [True, False], ids=["read-then-retry", "retry"])
@pytest.mark.parametrize("method", ["session.delete", "sessions.purge"])
async def test_delete_failed_after_its_marker_is_done_in_the_same_process(tmp_path: Path, method: str, step: str,
                                                                         action: str, read_first: bool) -> None:
    await _setup(tmp_path)
    if method == "sessions.purge":
        async with inprocess_host(tmp_path) as host, client_for(host, CLIENT, kind="agent") as c:
            await c.call("sessions.trash", {"sessionId": "s1"})
    prefix = "delete" if method == "session.delete" else "purge"
    point = {"after_marker": f"{prefix}.after_marker", "before_commit": f"{method}.before_commit",
             "before_files": f"{prefix}.before_files"}.get(step, step)
    answer = {"sessionId": "s1", "deleted" if method == "session.delete" else "purged": True}
    async with faulted_client(tmp_path, f"{point}:1:{action}", client_id=CLIENT) as c:
        with pytest.raises(RpcError) as failed:
            await c.call(method, DELETE)
        assert failed.value.data_code == CODES[action]
        if read_first and step in COMMITTED:
            with pytest.raises(RpcError) as gone:
                await c.call("session.get", {"sessionId": "s1"})
            assert gone.value.data_code == "SESSION_NOT_FOUND"
        elif read_first:  # rolled back: the session is there, and nothing will delete it later
            kept = await c.call("session.get", {"sessionId": "s1"})
            assert [m["id"] for m in kept["messages"]] == ["m-s1"]
            assert not DataDir(tmp_path).session_paths("s1").delete_marker.exists()
        assert await c.call(method, DELETE) == answer
        assert await c.call(method, DELETE) == answer
        listed = [s["id"] for s in (await c.call("session.list", {}))["sessions"]]
        trashed = (await c.call("sessions.listTrashed", {}))["sessions"]
        with pytest.raises(RpcError) as gone:
            await c.call("session.get", {"sessionId": "s1"})
        assert gone.value.data_code == "SESSION_NOT_FOUND"
        other = await c.call("session.get", {"sessionId": "s9"})
    assert listed == ["s9"] and trashed == []
    assert [m["id"] for m in other["messages"]] == ["m-s9"]
    sessions = DataDir(tmp_path).sessions_dir
    assert sorted(p.name for p in sessions.iterdir()) == ["deleted-sessions.log", "s9.jsonl"]
