"""Thread metadata in the session summary and session.updateMetadata (seed 000 §2.1)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio

from runtime.client import RpcError
from store import thread_meta
from store.rules import MAX_FOLDER_CHARS, MAX_TAG_CHARS, MAX_TAGS, MAX_THREAD_ORIGINS
from tests.hostkit import client_for, index_caught_up, inprocess_host
from tests.revisions.helpers import full, query, transcript_path, turn


def drop_database(root: Path) -> None:
    for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
        (root / name).unlink(missing_ok=True)


async def test_thread_metadata_is_in_the_session_summary_list_and_get(tmp_path):
    """Seed 000 §2.1: "ThreadMeta stores ... optional folder and preset, tags, pin and archive flags, optional
    parentThreadId, ... and origins reached or approved by the Thread. The UI reads this table for the
    conversation list instead of scanning nodes." """
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            parent = (await c.call("session.create", {"title": "Parent"}))["id"]
            sid = (await c.call("session.create", {"title": "Child"}))["id"]
            before = await c.call("session.get", {"sessionId": sid})
            assert "thread" not in before["session"]
            got = await c.call("session.updateMetadata", {
                "sessionId": sid, "tags": [" work ", "Work", "urgent"], "folder": "Clients/Acme",
                "preset": "reviewer", "archived": True, "parentThreadId": parent,
                "origins": [{"origin": "https://a.example", "status": "reached"},
                            {"origin": "https://b.example", "status": "approved"},
                            {"origin": "https://a.example", "status": "approved"}]})
            want = {"tags": ["work", "urgent"], "folder": "Clients/Acme", "preset": "reviewer", "archived": True,
                    "parentThreadId": parent, "origins": [{"origin": "https://b.example", "status": "approved"},
                                                          {"origin": "https://a.example", "status": "approved"}]}
            assert got["thread"] == want
            assert got["updatedAt"] == before["session"]["updatedAt"]  # labels never reorder recent activity
            listed = {s["id"]: s for s in (await c.call("session.list", {}))["sessions"]}
            assert listed[sid]["thread"] == want and "thread" not in listed[parent]
            assert (await c.call("session.get", {"sessionId": sid}))["session"]["thread"] == want
            # absent fields stay, null clears, a list replaces
            got = await c.call("session.updateMetadata", {"sessionId": sid, "folder": None, "tags": ["later"]})
            assert got["thread"] == {**{k: v for k, v in want.items() if k != "folder"}, "tags": ["later"]}
            got = await c.call("session.updateMetadata", {"sessionId": sid, "tags": None, "preset": None,
                                                          "archived": False, "parentThreadId": None,
                                                          "origins": None})
            assert "thread" not in got  # nothing left: no row, no field
            await index_caught_up(host)
            assert query(tmp_path, "SELECT COUNT(*) FROM thread_meta") == [(0,)]


@pytest.mark.parametrize(("params", "why"), [
    ({"tags": [f"t{i}" for i in range(MAX_TAGS + 1)]}, "too many tags"),
    ({"tags": ["x" * (MAX_TAG_CHARS + 1)]}, "tag too long"),
    ({"folder": "f" * (MAX_FOLDER_CHARS + 1)}, "folder too long"),
    ({"folder": "a\nb"}, "control character"),
    ({"origins": [{"origin": f"https://{i}.example", "status": "reached"}
                  for i in range(MAX_THREAD_ORIGINS + 1)]}, "too many origins"),
    ({"origins": [{"origin": "https://a.example", "status": "visited"}]}, "unknown origin status"),
    ({"parentThreadId": "../etc"}, "parent is not a session id"),
    ({"parentThreadId": "SELF"}, "parent is the session itself"),
    ({}, "nothing to update"),
])
async def test_update_metadata_is_validated_and_bounded(tmp_path, params, why):
    """Seed 000 §2.1: "ThreadMeta stores ... optional folder and preset, tags, pin and archive flags, optional
    parentThreadId, ... and origins reached or approved by the Thread" — bounded here (store/rules.py: tag
    count and length, folder length, origins); bad input is a clear INVALID_PARAMS and changes nothing."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.updateMetadata", {"sessionId": sid, "tags": ["keep"]})
            before = transcript_path(tmp_path, sid).read_bytes()
            sent = {k: (sid if v == "SELF" else v) for k, v in params.items()}
            with pytest.raises(RpcError) as err:
                await c.call("session.updateMetadata", {"sessionId": sid, **sent})
            assert err.value.data_code == "INVALID_PARAMS", why
            assert transcript_path(tmp_path, sid).read_bytes() == before
            assert (await c.call("session.get", {"sessionId": sid}))["session"]["thread"]["tags"] == ["keep"]


async def test_update_metadata_retry_is_a_replay(tmp_path):
    """ARCHITECTURE "Command receipts": "A retry with the same key returns the stored response and does nothing
    else" — one session_info line, however many retries."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            p = {"sessionId": sid, "archived": True, "submissionId": "meta-1"}
            first = await c.call("session.updateMetadata", p)
            size = transcript_path(tmp_path, sid).stat().st_size
            assert await c.call("session.updateMetadata", p) == first
            assert transcript_path(tmp_path, sid).stat().st_size == size
            with pytest.raises(RpcError) as err:
                await c.call("session.updateMetadata", {**p, "archived": False})
            assert err.value.data_code == "IDEMPOTENCY_CONFLICT"


async def test_thread_metadata_survives_a_rebuilt_index_after_rename_and_rewrite(tmp_path):
    """ARCHITECTURE "Durability": "A corrupt or missing pi.sqlite is quarantined and rebuilt from the files" —
    the thread metadata rides in every session_info line, so a rename and a rewrite (which keeps only the
    newest session_info line) never lose it."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            await turn(c, sid, "u2", "a2")
            meta = (await c.call("session.updateMetadata", {"sessionId": sid, "tags": ["a", "b"],
                                                            "folder": "Inbox", "archived": True}))["thread"]
            await c.call("session.rename", {"sessionId": sid, "title": "Renamed"})
            await c.call("session.update", {"sessionId": sid, "modelId": "m-2"})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u2"})
            await index_caught_up(host)
    drop_database(tmp_path)
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            got = await full(c, sid)
            assert got["session"]["title"] == "Renamed" and got["session"]["thread"] == meta
            # a fork is an independent session: it does not inherit the source's thread metadata
            child = await c.call("session.fork", {"sessionId": sid})
            assert "thread" not in child


async def test_origins_are_compared_as_url_origins_and_stored_rows_stay_readable(tmp_path):
    """Audit: https://a.com and HTTPS://A.COM were two origins. A URL origin's scheme and host are
    case-insensitive and its default port is no part of it (RFC 6454), so they are one origin, stored in
    the canonical form (last status wins); other text is kept as given. A row stored before (two spellings
    of one origin) reads back as one, and the next update stores it canonical."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            got = await c.call("session.updateMetadata", {"sessionId": sid, "origins": [
                {"origin": "https://a.com", "status": "reached"},
                {"origin": "HTTPS://A.COM:443/", "status": "approved"},
                {"origin": "http://A.com:80", "status": "reached"},
                {"origin": "http://a.com:8080", "status": "reached"},
                {"origin": "https://[::1]:443", "status": "reached"},
                {"origin": "Chrome-Extension://AbC", "status": "reached"},
                {"origin": "https://a.com/Docs", "status": "reached"},
                {"origin": "Some Label", "status": "approved"}]})
            assert got["thread"]["origins"] == [
                {"origin": "https://a.com", "status": "approved"}, {"origin": "http://a.com", "status": "reached"},
                {"origin": "http://a.com:8080", "status": "reached"}, {"origin": "https://[::1]", "status": "reached"},
                {"origin": "chrome-extension://abc", "status": "reached"},
                {"origin": "https://a.com/Docs", "status": "reached"},
                {"origin": "Some Label", "status": "approved"}]
            await index_caught_up(host)
    # a row an older build stored, with two spellings of one origin
    old = '[{"origin":"HTTPS://B.COM","status":"reached"},{"origin":"https://b.com:443","status":"approved"}]'
    conn = sqlite3.connect(tmp_path / "pi.sqlite")
    with conn:
        conn.execute("UPDATE thread_meta SET origins_json = ? WHERE session_id = ?", (old, sid))
    conn.close()
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            want = [{"origin": "https://b.com", "status": "approved"}]
            assert (await c.call("session.get", {"sessionId": sid}))["session"]["thread"]["origins"] == want
            listed = {s["id"]: s for s in (await c.call("session.list", {}))["sessions"]}
            assert listed[sid]["thread"]["origins"] == want
            got = await c.call("session.updateMetadata", {"sessionId": sid, "tags": ["t"]})
            assert got["thread"]["origins"] == want
            await index_caught_up(host)
            assert query(tmp_path, "SELECT origins_json FROM thread_meta") == [
                ('[{"origin":"https://b.com","status":"approved"}]',)]


def test_a_rebuilt_index_takes_an_older_session_info_line_origins_canonical():
    """A session_info line an older build wrote may hold two spellings of one origin: a rebuilt index
    (``restore_from_info`` runs ``normalize``) stores one."""
    older = {"origins": [{"origin": "HTTPS://B.COM", "status": "reached"},
                         {"origin": "https://b.com:443/", "status": "approved"},
                         {"origin": "wss://Chat.B.com:443", "status": "reached"}]}
    assert thread_meta.normalize(older)["origins"] == [{"origin": "https://b.com", "status": "approved"},
                                                       {"origin": "wss://chat.b.com", "status": "reached"}]
    assert thread_meta.canonical_origin("http://a.com:notaport") == "http://a.com:notaport"
    assert thread_meta.canonical_origin("https://user@a.com") == "https://user@a.com"
