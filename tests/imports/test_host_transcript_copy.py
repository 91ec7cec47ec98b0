"""Importing this host's own transcript copied from another installation (source ``pi-host``)."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.hostkit import client_for, inprocess_host, msg


async def test_a_transcript_copy_imported_keeps_its_deleted_messages_out(tmp_path: Path) -> None:
    """The pi-host importer says tombstoned messages stay out, but it skipped tombstone lines: a
    transcript copied from another installation brought back every message its user had deleted."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "there") as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1", "title": "from the other machine"})
            for i in range(4):
                await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(f"m{i}", f"text {i}")})
            for mid in ("m1", "m2"):
                await c.call("session.deleteMessage", {"sessionId": "s1", "messageId": mid})
            await c.call("session.restoreMessage", {"sessionId": "s1", "messageId": "m2"})  # the newest decides
        copy = tmp_path / "copy" / "s1.jsonl"
        copy.parent.mkdir()
        copy.write_bytes((tmp_path / "there" / "sessions" / "s1.jsonl").read_bytes())
        async with inprocess_host(tmp_path / "here") as host, client_for(host) as c:
            done = await c.call("import.sessions", {"source": "pi-host", "root": str(copy)})
            (sid,) = [s["id"] for s in (await c.call("session.list", {}))["sessions"]]
            texts = [m["blocks"][0]["text"] for m in (await c.call("session.get", {"sessionId": sid}))["messages"]]
            assert texts == ["text 0", "text 2", "text 3"], done
            assert (await c.call("search.query", {"query": "text 1"}))["results"] == []
