"""Shared helpers for the revisions tests (host-level reads of files and index)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from runtime.client import HostClient
from store.indexing.reconcile import dedupe, scan_from
from store.revisions import read_revisions
from tests.hostkit import msg


def ids(got: dict[str, Any]) -> list[str]:
    return [m["id"] for m in got["messages"]]


async def full(c: HostClient, sid: str) -> dict[str, Any]:
    return await c.call("session.get", {"sessionId": sid, "full": True})


async def turn(c: HostClient, sid: str, uid: str, aid: str, text: str = "") -> None:
    await c.call("session.appendMessage", {"sessionId": sid, "message": msg(uid, f"q {uid} {text}")})
    await c.call("session.appendMessage",
                 {"sessionId": sid, "message": msg(aid, f"a {aid} {text}", role="assistant")})


def transcript_path(root: Path, sid: str) -> Path:
    return root / "sessions" / f"{sid}.jsonl"


def revisions_path(root: Path, sid: str) -> Path:
    return root / "sessions" / f"{sid}.revisions.jsonl"


def file_message_ids(root: Path, sid: str) -> list[str]:
    scan = scan_from(transcript_path(root, sid), 0)
    return [m.record["id"] for m in dedupe(scan.messages)]


def index_rows(root: Path, sid: str) -> list[tuple[str, int, str | None]]:
    conn = sqlite3.connect(f"file:{root / 'pi.sqlite'}?mode=ro", uri=True)
    try:
        return conn.execute(
            "SELECT id, seq, text FROM messages WHERE session_id = ? ORDER BY seq", (sid,)
        ).fetchall()
    finally:
        conn.close()


def query(root: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{root / 'pi.sqlite'}?mode=ro", uri=True)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def assert_index_matches_file(root: Path, sid: str) -> None:
    """Index rows (ids, seq, search text) are exactly the file's deduped messages."""
    scan = scan_from(transcript_path(root, sid), 0)
    from store.transcripts.records import extract_text

    expected = [(m.record["id"], i + 1, extract_text(m.record)) for i, m in enumerate(dedupe(scan.messages))]
    assert index_rows(root, sid) == expected


def revision_kinds(root: Path, sid: str) -> dict[tuple[str, int], bool]:
    """(root, index) → True when the newest record is a live reference."""
    rf = read_revisions(revisions_path(root, sid))
    return {k: e.live for k, e in rf.entries.items()}
