"""Attachments after a database rebuild, and the data directory behind a symlinked project."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import RpcError
from tests.hostkit import client_for, inprocess_host, msg


def attachment_block(sha: str) -> dict[str, Any]:
    return {"type": "attachment", "kind": "image", "name": "pic.png", "ref": f"attachments/{sha}",
            "mimeType": "image/png", "size": 21}


async def test_a_rebuilt_database_keeps_every_referenced_blob(tmp_path: Path) -> None:
    """Blobs are files and their rows derived: a database rebuilt from the files (or created anew beside
    them) had no row for any blob, and attachments.gc deleted referenced bytes as orphans of an
    interrupted put, without marking a single reference evicted (seed 000 §2.3)."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "one"}))["id"]
            put = await c.call("attachments.put", {"name": "a.png", "mimeType": "image/png",
                                                   "dataBase64": base64.b64encode(b"referenced blob bytes").decode()})
            sha = put["sha256"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                "m1", "see", blocks=[{"type": "text", "text": "see"}, attachment_block(sha)])})
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (tmp_path / name).unlink(missing_ok=True)
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            info = await c.call("attachments.get", {"sha256": sha})
            assert info["size"] == 21
            gc = await c.call("attachments.gc", {})
            assert gc["orphansRemoved"] == 0
            assert (tmp_path / "attachments" / sha).exists()
            blocks = [b for m in (await c.call("session.get", {"sessionId": sid}))["messages"]
                      for b in m["blocks"] if b["type"] == "attachment"]
            assert len(blocks) == 1 and "evicted" not in blocks[0]


@pytest.mark.parametrize("link_to", ["data", "parent"])
async def test_a_symlinked_project_path_does_not_reach_the_data_directory(tmp_path: Path, link_to: str) -> None:
    """README 'Files the host reads for you': never the rest of the data directory, even inside a project.
    A project path that reached it through a symlink compared as text and let importFile read host.token."""
    data = tmp_path / "home" / "data"
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            alias = tmp_path / "alias"
            os.symlink(data if link_to == "data" else data.parent, alias)
            inside = alias if link_to == "data" else alias / "data"
            sid = (await c.call("session.create", {"title": "p", "projectPath": str(alias)}))["id"]
            for name in ("host.token", "pi.sqlite"):
                with pytest.raises(RpcError) as err:
                    await c.call("attachments.importFile", {"sessionId": sid, "path": str(inside / name)})
                assert err.value.data_code in ("PERMISSION_DENIED", "INVALID_PARAMS", "NOT_FOUND")
            assert not [p for p in (data / "attachments").iterdir() if len(p.name) == 64] \
                if (data / "attachments").exists() else True
