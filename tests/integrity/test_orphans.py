"""Orphaned sessions (seed 003 §5, the durability table's D318 row):

    "orphaned session restore (boot / session.appendMessage, D318) | leave the live JSONL in place |
    reinsert the missing sessions row and rebuild index rows from the file; if the file is also
    gone, append inserts a stub row under the existing id so the outbox can drain"

and its other half, "session delete | … Electron main drops that session's outbox entries": a
session the user deleted is never brought back by a late append, and an id the host never knew
stays ``SESSION_NOT_FOUND``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from store import orphans
from store.indexing import index
from store.upgrade.migrations import migrate
from tests.dbkit import NOW, fresh_db
from tests.hostkit import client_for, inprocess_host, msg


def _lose(root: Path, sid: str, *, foreign_keys: bool, transcript: bool = True) -> None:
    """What a database reset or an older backup does to a session, done by hand: its row goes
    (``foreign_keys`` off: its index rows stay behind), and with ``transcript`` its file too."""
    db = sqlite3.connect(root / "pi.sqlite")
    try:
        db.execute(f"PRAGMA foreign_keys = {'ON' if foreign_keys else 'OFF'}")
        db.execute("DELETE FROM sessions WHERE id = ?", (sid,))
        db.commit()
    finally:
        db.close()
    if transcript:
        (root / "sessions" / f"{sid}.jsonl").unlink()


async def _ids(c: HostClient, sid: str) -> list[str]:
    got = await c.call("session.get", {"sessionId": sid})
    assert got["totalMessages"] == len(got["messages"])
    return [m["id"] for m in got["messages"]]


async def _not_found(c: HostClient, method: str, params: dict[str, Any]) -> None:
    with pytest.raises(RpcError) as err:
        await c.call(method, params)
    assert err.value.data_code == "SESSION_NOT_FOUND"


@pytest.mark.parametrize("foreign_keys", [True, False], ids=["row deleted with its cascade", "row alone"])
async def test_an_append_to_a_session_whose_row_and_transcript_are_gone_inserts_a_stub(
        tmp_path: Path, foreign_keys: bool) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1", "title": "lost"})
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m1", "before the loss")})
        _lose(tmp_path, "s1", foreign_keys=foreign_keys)
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            got = await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m2", "from the outbox")})
            assert got["message"]["seq"] == 1 and got["replayed"] is False
            assert await _ids(c, "s1") == ["m2"]  # what the lost file held is gone; nothing stale is shown
            assert [s["id"] for s in (await c.call("session.list", {}))["sessions"]] == ["s1"]
            hits = await c.call("search.query", {"query": "outbox"})
            assert [h["messageId"] for h in hits["results"]] == ["m2"]
            assert (await c.call("search.query", {"query": "before the loss"}))["results"] == []
            # the retry of the same append is the same message, once
            again = await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m2", "from the outbox")})
            assert again["replayed"] is True
        async with inprocess_host(tmp_path) as host, client_for(host) as c:  # durable: a new transcript
            assert await _ids(c, "s1") == ["m2"]
            assert (tmp_path / "sessions" / "s1.jsonl").exists()


async def test_a_row_lost_under_its_transcript_comes_back_on_the_next_start(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1", "title": "kept"})
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m1", "kept line")})
        _lose(tmp_path, "s1", foreign_keys=True, transcript=False)
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m2", "after")})
            assert await _ids(c, "s1") == ["m1", "m2"]
            assert (await c.call("session.get", {"sessionId": "s1"}))["session"]["title"] == "kept"


async def test_a_row_lost_while_the_host_runs_is_put_back_by_the_next_append(tmp_path: Path) -> None:
    """The session actor still holds the row; the append's index op fails for want of it. Before,
    the repair skipped the session as deleted: the acknowledged message was missing from every read
    (session.get answered PAYLOAD_TOO_LARGE) until a restart."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1", "title": "kept"})
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m1", "one")})
            _lose(tmp_path, "s1", foreign_keys=True, transcript=False)
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m2", "two")})
            assert await _ids(c, "s1") == ["m1", "m2"]
            assert [h["messageId"] for h in (await c.call("search.query", {"query": "two"}))["results"]] == ["m2"]


async def test_the_row_and_transcript_lost_while_the_host_runs(tmp_path: Path) -> None:
    """The writer finds its file gone and writes nothing; the actor lets the file decide again and
    the same append lands on the stub (before: CONFLICT, and only a retry landed)."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1"})
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m1", "one")})
            _lose(tmp_path, "s1", foreign_keys=True)
            params = {"sessionId": "s1", "message": msg("m2", "two"), "submissionId": "out-2"}
            first = await c.call("session.appendMessage", params)
            assert first["message"]["seq"] == 1
            assert await c.call("session.appendMessage", params) == first  # the retry: its receipt, once
            assert await _ids(c, "s1") == ["m2"]


async def test_a_deleted_or_purged_session_is_never_brought_back_by_a_late_append(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            for sid in ("deleted", "purged"):
                await c.call("session.create", {"sessionId": sid})
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", "x"),
                                                       "submissionId": f"{sid}-1"})
            await c.call("session.delete", {"sessionId": "deleted"})
            await c.call("sessions.trash", {"sessionId": "purged"})
            await c.call("sessions.purge", {"sessionId": "purged"})
            for sid in ("deleted", "purged"):
                await _not_found(c, "session.appendMessage", {"sessionId": sid, "message": msg("m2", "late")})
        async with inprocess_host(tmp_path) as host, client_for(host) as c:  # receipts name them: still refused
            for sid in ("deleted", "purged"):
                await _not_found(c, "session.appendMessage", {"sessionId": sid, "message": msg("m2", "late")})
            assert (await c.call("session.list", {}))["sessions"] == []
            # the id created again is a live session again, and can be an orphan like any other
            await c.call("session.create", {"sessionId": "deleted"})
            await c.call("session.appendMessage", {"sessionId": "deleted", "message": msg("m3", "new life")})
        _lose(tmp_path, "deleted", foreign_keys=True)
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.appendMessage", {"sessionId": "deleted", "message": msg("m4", "outbox")})
            assert await _ids(c, "deleted") == ["m4"]


async def test_an_id_the_host_never_knew_is_not_found_and_creates_nothing(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await _not_found(c, "session.appendMessage", {"sessionId": "never", "message": msg("m1", "x")})
            await _not_found(c, "session.get", {"sessionId": "never"})
            assert (await c.call("session.list", {}))["sessions"] == []
    assert not (tmp_path / "sessions" / "never.jsonl").exists()


# ----------------------------------------------------------------------------- store/orphans.py


def test_insert_stub_needs_a_known_id_not_deleted(tmp_path: Path) -> None:
    conn = fresh_db(tmp_path / "pi.sqlite")
    index.insert_session(conn, "known", now_ms=NOW)
    index.insert_session(conn, "gone", now_ms=NOW)
    index.delete_session_rows(conn, "gone", now_ms=NOW + 1)
    conn.execute("DELETE FROM sessions WHERE id = 'known'")  # lost, not deleted: still known
    assert orphans.was_deleted(conn, "gone") and not orphans.was_deleted(conn, "known")
    for sid, seen in (("gone", True), ("never", False)):
        with pytest.raises(LookupError):
            orphans.insert_stub(conn, sid, now_ms=NOW, seen=seen)
    row = orphans.insert_stub(conn, "known", now_ms=NOW + 2, seen=False)
    assert row["id"] == "known" and row["messageCount"] == 0
    assert orphans.insert_stub(conn, "seen-here", now_ms=NOW, seen=True)["id"] == "seen-here"
    # created again after a delete: live (and known) again
    index.insert_session(conn, "gone", now_ms=NOW + 3)
    assert not orphans.was_deleted(conn, "gone")


def test_a_session_older_than_the_record_counts_by_its_traces(tmp_path: Path) -> None:
    conn = fresh_db(tmp_path / "pi.sqlite")
    conn.execute("INSERT INTO command_receipts(client_id, submission_id, method, status, response_json, "
                 "fingerprint, session_id, created_at) VALUES ('c', 'k', 'session.appendMessage', 'done', '{}', "
                 "'f', 'old', ?)", (NOW,))
    assert orphans.left_traces(conn, "old") and not orphans.left_traces(conn, "other")
    assert orphans.insert_stub(conn, "old", now_ms=NOW, seen=False)["id"] == "old"


def test_the_v29_step_knows_every_session_there_is(tmp_path: Path) -> None:
    conn = fresh_db(tmp_path / "pi.sqlite")
    for sid in ("a", "b"):
        index.insert_session(conn, sid, now_ms=NOW)
    conn.execute("DROP TABLE known_sessions")
    for column in ("lease", "lease_turn_id", "lease_seq", "lease_client"):  # v30, v31
        conn.execute(f"ALTER TABLE turn_queue DROP COLUMN {column}")
    conn.execute("DROP INDEX idx_messages_window")  # v32
    conn.execute("PRAGMA user_version = 28")
    assert migrate(conn, tmp_path / "pi.sqlite", now_ms=NOW).applied == [29, 30, 31, 32]
    assert sorted(r[0] for r in conn.execute("SELECT id FROM known_sessions WHERE deleted_at IS NULL")) == ["a", "b"]
