"""``attachments.gc`` sweeps blobs nothing references any more (seed 003 §8, seed 000 §3.3).

Seed 003 §8: "Attachment GC: sweep attachments/ for hashes unreferenced by any transcript file"; seed 000
§3.3: deleting a thread deletes its attachments. A blob whose only references were a deleted (or purged)
session's is swept by the next GC once its last use (put, import, ref) is older than the grace
(``app.attachmentUnreferencedGraceMs``, default 1 hour), whatever the budget; a blob any existing session's
transcript, revisions, checkpoint, queued turn or client reference holds stays, and so does one put a
moment ago for a message not appended yet. The hosts run on a wall clock the test sets.
"""

from __future__ import annotations

import base64
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from runtime.client import HostClient, RpcError
from store import attachments as a
from tests.attachments.test_gc_crash_retry import _killed_during_gc
from tests.dbkit import NOW, add_session, tx
from tests.hostkit import client_for, index_caught_up, inprocess_host, msg
from tests.scheduler.hostclock import SetClock, host_at

BASE = 1_700_000_000_000
HOUR = 60 * 60 * 1000


def _att(blob: dict[str, Any]) -> dict[str, Any]:
    return {"type": "attachment", "kind": "file", "name": "f.bin", "ref": blob["ref"],
            "mimeType": "application/octet-stream", "size": blob["size"]}


async def _put(c: HostClient, fill: bytes) -> dict[str, Any]:
    result: dict[str, Any] = await c.call("attachments.put", {
        "name": "f.bin", "mimeType": "application/octet-stream", "dataBase64": base64.b64encode(fill * 100).decode()})
    return result


async def _append(c: HostClient, sid: str, mid: str, *blobs: dict[str, Any], role: str = "user") -> None:
    await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
        mid, "x", role=role, blocks=[{"type": "text", "text": "x"}, *(_att(b) for b in blobs)])})


async def _state(c: HostClient, blob: dict[str, Any]) -> str:
    return str((await c.call("attachments.get", {"sha256": blob["sha256"]}))["deletionState"])


async def test_a_deleted_sessions_blobs_are_swept_past_the_grace_and_everything_still_referenced_stays(
        tmp_path: Path) -> None:
    clock = SetClock(BASE)
    with trio.fail_after(90):
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            active = (await c.call("session.create", {}))["id"]
            doomed = (await c.call("session.create", {}))["id"]
            other = (await c.call("session.create", {}))["id"]
            only_doomed, shared, queued, streaming, archived, client_ref, in_active, ref_only = [
                await _put(c, bytes([fill])) for fill in b"DSQCARXr"]
            await _append(c, doomed, "d1", only_doomed, shared)
            await c.call("attachments.ref", {"sha256": only_doomed["sha256"], "sessionId": doomed, "messageId": "d1"})
            await c.call("attachments.ref", {"sha256": ref_only["sha256"], "sessionId": doomed})
            await _append(c, other, "o1", shared)
            await c.call("session.queuePush", {"sessionId": other, "principal": "me", "content": "look",
                                               "permissionMode": "inherit", "attachments": [_att(queued)]})
            await _append(c, other, "o2", archived, role="assistant")
            await c.call("session.truncateFrom", {"sessionId": other, "messageId": "o2", "mode": "regenerate"})
            await c.call("session.startTurn", {"sessionId": other, "turnId": "t-1"})
            await c.call("session.saveInflightMessage", {"sessionId": other, "turnId": "t-1", "message": msg(
                "o3", "p", role="assistant", blocks=[{"type": "text", "text": "p"}, _att(streaming)])})
            await c.call("attachments.ref", {"sha256": client_ref["sha256"], "sessionId": other})
            await _append(c, active, "k1", in_active)
            await index_caught_up(host)
            assert [r["sessionId"] for r in (await c.call("attachments.get", {
                "sha256": ref_only["sha256"]}))["references"]] == [doomed]

            await c.call("session.delete", {"sessionId": doomed})
            # the deleted session's client references went with it
            for blob in (only_doomed, ref_only):
                assert (await c.call("attachments.get", {"sha256": blob["sha256"]}))["references"] == []

            # within the grace (last use exactly one hour ago): nothing is swept
            clock.ms = BASE + HOUR
            fresh = await _put(c, b"F")  # put for a message not appended yet
            gc = await c.call("attachments.gc", {"activeSessionId": active})
            assert (gc["evicted"], gc["unreferencedEvicted"], gc["freedBytes"]) == ([], [], 0)
            assert (tmp_path / "attachments" / only_doomed["sha256"]).exists()

            clock.ms = BASE + HOUR + 1
            gc = await c.call("attachments.gc", {"activeSessionId": active})
            swept = sorted([only_doomed["sha256"], ref_only["sha256"]])
            assert (gc["evicted"], sorted(gc["unreferencedEvicted"]), gc["freedBytes"]) == ([], swept, 200)
            assert gc["estimate"]["blobs"] == 7
            for sha in swept:
                assert not (tmp_path / "attachments" / sha).exists()
            assert await _state(c, only_doomed) == "evicted"
            for blob in (shared, queued, streaming, archived, client_ref, in_active, fresh):
                assert await _state(c, blob) == "live"
                assert (tmp_path / "attachments" / blob["sha256"]).exists()

            # swept once: the next GC finds nothing more; the fresh blob goes once its grace is over
            again = await c.call("attachments.gc", {"activeSessionId": active})
            assert (again["evicted"], again["unreferencedEvicted"], again["freedBytes"]) == ([], [], 0)
            clock.ms = BASE + 2 * HOUR + 1
            later = await c.call("attachments.gc", {"activeSessionId": active})
            assert later["unreferencedEvicted"] == [fresh["sha256"]]

            # a re-put of swept bytes revives the blob
            again_put = await _put(c, b"D")
            assert again_put["sha256"] == only_doomed["sha256"]
            assert await _state(c, only_doomed) == "live"
            assert (tmp_path / "attachments" / only_doomed["sha256"]).exists()


async def test_a_trashed_session_keeps_its_blobs_and_a_purged_one_does_not(tmp_path: Path) -> None:
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            blob, recorded = await _put(c, b"T"), await _put(c, b"R")
            await _append(c, sid, "m1", blob)
            await c.call("attachments.ref", {"sha256": recorded["sha256"], "sessionId": sid})
            await c.call("sessions.trash", {"sessionId": sid})
            clock.ms = BASE + 2 * HOUR
            gc = await c.call("attachments.gc", {})
            assert gc["unreferencedEvicted"] == []  # the trash can be restored
            await c.call("sessions.purge", {"sessionId": sid})
            gc = await c.call("attachments.gc", {})
            assert sorted(gc["unreferencedEvicted"]) == sorted([blob["sha256"], recorded["sha256"]])


async def test_the_grace_is_an_app_setting(tmp_path: Path) -> None:
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            blob = await _put(c, b"G")
            for bad in (-1, "1h", 1.5, True):
                with pytest.raises(RpcError) as err:
                    await c.call("settings.set", {"ns": "app", "key": "attachmentUnreferencedGraceMs",
                                                  "value": bad})
                assert err.value.data_code == "INVALID_PARAMS", bad
            await c.call("settings.set", {"ns": "app", "key": "attachmentUnreferencedGraceMs", "value": 10})
            clock.ms = BASE + 10
            assert (await c.call("attachments.gc", {}))["unreferencedEvicted"] == []
            clock.ms = BASE + 11
            assert (await c.call("attachments.gc", {}))["unreferencedEvicted"] == [blob["sha256"]]


# ------------------------------------------------------------------------------------------ crash and retry

CLIENT = "ui-sweep"
SUBMISSION = "sweep-1"
POINTS = [
    "attachments.gc.after_mark:1",
    "index.after_commit:1",
    "attachments.gc.after_unlink:1",
    "attachments.gc.after_unlink:2",
    "attachments.gc.before_commit:1",
]


async def _setup(root: Path) -> dict[str, Any]:
    """Two blobs only a deleted session referenced (last used long ago, on a set clock), one a live
    session still references."""
    async with host_at(root, SetClock(BASE)) as host, client_for(host, CLIENT, kind="ui") as c:
        live = (await c.call("session.create", {}))["id"]
        doomed = (await c.call("session.create", {}))["id"]
        a, b, kept = await _put(c, b"a"), await _put(c, b"b"), await _put(c, b"k")
        await _append(c, doomed, "d1", a, kept)
        await c.call("attachments.ref", {"sha256": b["sha256"], "sessionId": doomed})
        await _append(c, live, "l1", kept)
        await c.call("session.delete", {"sessionId": doomed})
        await index_caught_up(host)
    return {"live": live, "swept": sorted([a["sha256"], b["sha256"]]), "kept": kept["sha256"]}


@pytest.mark.parametrize("point", POINTS)
async def test_a_sweep_retried_after_a_crash_answers_the_first_attempt_once(tmp_path: Path, point: str) -> None:
    with trio.fail_after(120):
        root, copy = tmp_path / "data", tmp_path / "reference"
        setup = await _setup(root)
        shutil.copytree(root, copy)
        params = {"activeSessionId": setup["live"], "submissionId": SUBMISSION}
        async with inprocess_host(copy) as host, client_for(host, CLIENT, kind="ui") as c:  # real time: long past
            reference = await c.call("attachments.gc", params)
        assert (reference["evicted"], sorted(reference["unreferencedEvicted"]), reference["freedBytes"]) == (
            [], setup["swept"], 200)

        await _killed_during_gc(root, point, params, client_id=CLIENT)

        async with inprocess_host(root) as host, client_for(host, CLIENT, kind="ui") as c:
            assert await c.call("attachments.gc", params) == reference
            assert await c.call("attachments.gc", params) == reference
            for sha in setup["swept"]:
                assert not (root / "attachments" / sha).exists()
                assert (await c.call("attachments.get", {"sha256": sha}))["deletionState"] == "evicted"
            assert (root / "attachments" / setup["kept"]).exists()
            later = await c.call("attachments.gc", {"activeSessionId": setup["live"], "submissionId": "sweep-2"})
            assert (later["evicted"], later["unreferencedEvicted"], later["freedBytes"]) == ([], [], 0)


# ------------------------------------------------------------------------------- a reference made meanwhile

def test_a_swept_blob_that_a_session_comes_to_reference_during_the_gc_stays(
        tmp_path: Path, conn: sqlite3.Connection) -> None:
    """An append into any session (not only the active one) acknowledged after the GC's scan, before its
    marks, referring to a blob the GC found unreferenced: that blob is taken back (live, bytes kept, left
    out of the answer); the other unreferenced blob goes."""
    d, sessions = tmp_path / "attachments", tmp_path / "sessions"
    sessions.mkdir()
    files = a.AttachmentFiles(d)
    add_session(conn, "other")
    late, gone = files.put_bytes(b"l" * 10), files.put_bytes(b"g" * 10)
    write = tx(conn)
    for sha, size in (late, gone):
        write(lambda c, sha=sha, size=size: a.record_blob(c, sha, size, None, NOW))
    calls = 0

    def racing_write(fn: Callable[[sqlite3.Connection], Any]) -> Any:
        nonlocal calls
        out = write(fn)
        calls += 1
        if calls == 1:  # the marks committed: the append lands now, its rescan (step 1b) finds it
            line = orjson.dumps({"type": "message", "id": "m1", "role": "user", "blocks": [
                {"type": "attachment", "kind": "file", "name": "f", "ref": f"attachments/{late[0]}", "size": 10}]})
            (sessions / "other.jsonl").write_bytes(line + b"\n")
        return out

    result = a.collect(files, racing_write, budget=None, active_session_id=None, sessions_dir=sessions,
                       now_ms=NOW + 2 * HOUR)
    assert isinstance(result, dict)
    assert (result["evicted"], result["unreferencedEvicted"], result["freedBytes"]) == ([], [gone[0]], 10)
    assert files.exists(late[0]) and not files.exists(gone[0])
    late_row = a.blob_row(conn, late[0])
    assert late_row is not None and late_row["deletionState"] == "live"
    assert a.refs_of(conn, late[0]) == [("other", "m1")]
