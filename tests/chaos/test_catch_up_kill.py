"""SIGKILL between two bounded commits of a catch-up (``store.indexing.backlog``, RT_CRASHPOINT): boot
was indexing a transcript far ahead of its index one slice per transaction; the next boot resumes from
the mark the last commit left, and every acknowledged message is indexed exactly once."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest
import trio

from runtime.datadir import DataDir
from store.jsonio import dumps_line
from store.transcripts.transcript import TranscriptWriter
from tests.hostkit import client_for, inprocess_host, msg, start_host_process

LATE = 120  # ~13 KB each: ~1.5 MB, six bounded commits


def _late_lines() -> list[bytes]:
    rng = random.Random(5)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))) for _ in range(3000)]
    return [dumps_line({"type": "message", "id": f"late{i}", "role": "user", "createdAt": "2026-01-01T00:00:00Z",
                        "blocks": [{"type": "text", "text": " ".join(rng.choice(words) for _ in range(1800))
                                    + f" marker{i}x"}]})
            for i in range(LATE)]


def test_a_boot_killed_between_two_bounded_commits_resumes_and_indexes_each_message_once(tmp_path: Path) -> None:
    data = tmp_path / "data"

    async def seed() -> str:
        async with inprocess_host(data) as host, client_for(host) as c:
            sid: str = (await c.call("session.create", {"title": "far behind"}))["id"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m0", "before the crash")})
            return sid

    sid = trio.run(seed)
    # acknowledged lines whose index ops were lost (a kill between the fsync and the index commit)
    writer = TranscriptWriter.open(DataDir(data).transcript(sid))
    try:
        writer.append(_late_lines())
    finally:
        writer.close()

    with pytest.raises(RuntimeError, match="exited with -9"):
        start_host_process(data, env={"RT_CRASHPOINT": "index.catch_up.after_commit:3:kill"})
    conn = sqlite3.connect(f"file:{DataDir(data).db_path}?mode=ro", uri=True)
    try:
        mark = conn.execute("SELECT indexed_len FROM sessions WHERE id = ?", (sid,)).fetchone()[0]
        ids = [r[0] for r in conn.execute("SELECT id FROM messages WHERE session_id = ? ORDER BY seq", (sid,))]
        covered = conn.execute("SELECT MAX(line_offset + line_len) FROM messages WHERE session_id = ?",
                               (sid,)).fetchone()[0]
    finally:
        conn.close()
    # three slices committed, each with the mark at its end: no row past the mark, none missing before it
    assert ids == ["m0", *(f"late{i}" for i in range(len(ids) - 1))] and 1 < len(ids) < LATE + 1
    assert covered == mark

    async def check() -> None:
        async with inprocess_host(data) as host, client_for(host) as c:
            got = await c.call("session.get", {"sessionId": sid, "messageLimit": 1000})
            assert [m["id"] for m in got["messages"]] == ["m0", *(f"late{i}" for i in range(LATE))]
            assert [m["seq"] for m in got["messages"]] == list(range(1, LATE + 2))
            found = await c.call("search.query", {"query": f"marker{LATE - 1}x"})
            assert [r["messageId"] for r in found["results"]] == [f"late{LATE - 1}"]
            assert (await c.call("host.status", {}))["boot"]["reconcile"]["errors"] == 0

    trio.run(check)
