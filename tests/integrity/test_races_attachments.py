"""Race audit (h44b): ``attachments.gc`` racing writes that reference blobs.

The GC scans the session files for references before the transaction that marks its victims. An append
into the active session acknowledged in between was not seen by that transaction: the GC evicted the
blob the active session had just referenced (its block read back ``"evicted": true``, the bytes were
gone), although the active session's blobs are never evicted. The test holds the scan until the append
is acknowledged, which makes the race certain.
"""

from __future__ import annotations

import base64
import hashlib

import trio

from runtime.client import RpcError
from store import attachments
from tests.hostkit import client_for, inprocess_host, msg


async def test_an_append_into_the_active_session_during_the_gc_scan_keeps_its_blob(tmp_path, monkeypatch) -> None:
    scan = attachments.scan_references
    appended = trio.Event()
    scanning = trio.Event()

    def scan_held(sessions_dir, since=None):  # type: ignore[no-untyped-def]
        found = scan(sessions_dir, since)
        if since is None:  # the GC's first scan: the append lands after it, before the marks
            trio.from_thread.run_sync(scanning.set)
            trio.from_thread.run(appended.wait)
        return found

    monkeypatch.setattr(attachments, "scan_references", scan_held)
    root = tmp_path / "data"
    data = b"the active session's screenshot"
    sha = hashlib.sha256(data).hexdigest()
    with trio.fail_after(30):
        async with inprocess_host(root) as host, client_for(host) as c, client_for(host, client_id="gc") as g:
            await c.call("settings.set", {"key": "attachmentBudgetBytes", "value": 1})  # every blob is over budget
            await c.call("session.create", {"sessionId": "act", "title": "t"})
            await c.call("attachments.put", {"name": "s.png", "mimeType": "image/png",
                                             "dataBase64": base64.b64encode(data).decode()})
            block = {"type": "attachment", "kind": "image", "name": "s.png", "ref": f"attachments/{sha}",
                     "size": len(data)}
            answers = {}

            async def gc() -> None:
                answers["gc"] = await g.call("attachments.gc", {"activeSessionId": "act", "submissionId": "gc-1"})

            async with trio.open_nursery() as n:
                n.start_soon(gc)
                await scanning.wait()
                await c.call("session.appendMessage", {"sessionId": "act", "message": msg("m1", "x", blocks=[block])})
                appended.set()
            assert sha not in answers["gc"]["evicted"]
            assert answers["gc"]["freedBytes"] == 0
            assert await g.call("attachments.gc", {"activeSessionId": "act", "submissionId": "gc-1"}) == answers["gc"]
            blob = await c.call("attachments.get", {"sha256": sha})
            assert blob["deletionState"] == "live"
            assert (root / "attachments" / sha).read_bytes() == data
            got = await c.call("session.get", {"sessionId": "act", "full": True})
            assert "evicted" not in got["messages"][0]["blocks"][0]
            # the next GC sees the reference in the file: still kept
            assert sha not in (await g.call("attachments.gc", {"activeSessionId": "act"}))["evicted"]
            assert (await c.call("attachments.get", {"sha256": sha}))["deletionState"] == "live"


async def test_a_gc_cut_short_after_its_marks_leaves_the_active_sessions_blob_to_the_next_one(
        tmp_path, monkeypatch) -> None:
    """The same append, and the GC fails right after its marks (before the rescan that takes the blob
    back): the retry, which finishes what the first attempt marked, keeps the blob the active session
    references, and answers without it."""
    scan = attachments.scan_references
    appended = trio.Event()
    scanning = trio.Event()
    held: list[bool] = []

    def scan_held(sessions_dir, since=None):  # type: ignore[no-untyped-def]
        found = scan(sessions_dir, since)
        if since is None and not held:
            held.append(True)
            trio.from_thread.run_sync(scanning.set)
            trio.from_thread.run(appended.wait)
        return found

    monkeypatch.setattr(attachments, "scan_references", scan_held)
    root = tmp_path / "data"
    data = b"the active session's photo"
    sha = hashlib.sha256(data).hexdigest()
    with trio.fail_after(30):
        async with inprocess_host(root, faults_spec="attachments.gc.after_mark:1:raise") as host, \
                client_for(host) as c, client_for(host, client_id="gc") as g:
            await c.call("settings.set", {"key": "attachmentBudgetBytes", "value": 1})
            await c.call("session.create", {"sessionId": "act", "title": "t"})
            await c.call("attachments.put", {"name": "p.png", "mimeType": "image/png",
                                             "dataBase64": base64.b64encode(data).decode()})
            block = {"type": "attachment", "kind": "image", "name": "p.png", "ref": f"attachments/{sha}",
                     "size": len(data)}
            failed = []

            async def gc() -> None:
                try:
                    await g.call("attachments.gc", {"activeSessionId": "act", "submissionId": "gc-1"})
                except RpcError as e:
                    failed.append(e)

            async with trio.open_nursery() as n:
                n.start_soon(gc)
                await scanning.wait()
                await c.call("session.appendMessage", {"sessionId": "act", "message": msg("m1", "x", blocks=[block])})
                appended.set()
            assert failed  # cut short after its marks
            retried = await g.call("attachments.gc", {"activeSessionId": "act", "submissionId": "gc-1"})
            assert sha not in retried["evicted"]
            assert (await c.call("attachments.get", {"sha256": sha}))["deletionState"] == "live"
            assert (root / "attachments" / sha).read_bytes() == data
            got = await c.call("session.get", {"sessionId": "act", "full": True})
            assert "evicted" not in got["messages"][0]["blocks"][0]
