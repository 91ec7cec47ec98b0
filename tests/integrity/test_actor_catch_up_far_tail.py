"""A session actor that starts on an index far behind its transcript reads the tail a bounded slice at a time.

The actor's catch-up used to plan the whole tail first (every line past the mark parsed at once, up to the
index lag: 64 MiB of lines), then index it in bounded commits (``store.indexing.backlog``) that read the
same lines again, so its memory grew with the tail. Now the plan of a far tail reads nothing
(``plan_catch_up``); the bounded steps read their own slices, and the last transaction plans from the mark
they left (``replan_from_mark``). The index it builds holds every message once, in order."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from store.indexing import backlog as backlog_module
from store.indexing import reconcile
from store.indexing.backlog import CATCH_UP_STEP_BYTES
from store.indexing.reconcile import ReconcilePlan, TailScan, plan_catch_up, plan_reconcile
from store.jsonio import dumps_line
from store.transcripts.transcript import TranscriptWriter, create_transcript
from tests.hostkit import client_for, index_caught_up, inprocess_host, msg, passivate

N = 80
TEXT = "prose " * 1700  # ~10 KB a line: N lines are ~3 budgets of one bounded commit


def _roll_back_the_mark(db: Path, sid: str, keep: int) -> None:
    """The index as if every index op after the ``keep``-th message's was lost: rows and mark moved back."""
    conn = sqlite3.connect(db, isolation_level=None, timeout=10)
    try:
        conn.execute("BEGIN IMMEDIATE")
        (offset,) = conn.execute("SELECT line_offset FROM messages WHERE session_id = ? AND seq = ?",
                                 (sid, keep + 1)).fetchone()
        conn.execute("DELETE FROM messages WHERE session_id = ? AND seq > ?", (sid, keep))
        conn.execute("UPDATE sessions SET indexed_len = ?, last_seq = ? WHERE id = ?", (offset, keep, sid))
        conn.execute("COMMIT")
    finally:
        conn.close()


def _spans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Bytes each transcript scan was asked to read (to its stop, or to the file's end)."""
    seen: list[int] = []
    real = reconcile.scan_from

    def scan_from(path: Path, start: int, stop: int | None = None) -> TailScan:
        seen.append((os.stat(path).st_size if stop is None else stop) - start)
        return real(path, start, stop)

    monkeypatch.setattr(reconcile, "scan_from", scan_from)
    monkeypatch.setattr(backlog_module, "scan_from", scan_from)
    return seen


async def test_an_actor_starting_far_behind_reads_its_tail_in_slices(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with inprocess_host(tmp_path) as host, client_for(host) as c:
        await c.call("session.create", {"sessionId": "s1", "title": "far"})
        for i in range(N):
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(f"m{i}", f"{TEXT}{i}")})
        await index_caught_up(host)
        await passivate(host, "s1")
        _roll_back_the_mark(tmp_path / "pi.sqlite", "s1", keep=2)
        spans = _spans(monkeypatch)
        with trio.fail_after(60):
            page = await c.call("session.get", {"sessionId": "s1", "messageLimit": 500})
        assert [m["id"] for m in page["messages"]] == [f"m{i}" for i in range(N)]
        assert [m["seq"] for m in page["messages"]] == list(range(1, N + 1))
        hits = await c.call("search.sessions", {"query": f"prose {N - 1}"})
        assert [r["sessionId"] for r in hits["results"]] == ["s1"]
    assert spans, "the catch-up read the tail"
    assert max(spans) <= CATCH_UP_STEP_BYTES, spans  # before: the whole tail (~800 KB), twice
    conn = sqlite3.connect(tmp_path / "pi.sqlite")
    try:
        rows = conn.execute("SELECT id, seq FROM messages WHERE session_id = 's1' ORDER BY seq").fetchall()
    finally:
        conn.close()
    assert rows == [(f"m{i}", i + 1) for i in range(N)]


def test_a_far_tail_is_planned_without_reading_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.jsonl"
    create_transcript(path, "s", 1)
    head = plan_reconcile(path, 0, None)
    line = dumps_line({"type": "message", "id": "x", "role": "user", "createdAt": "2026-01-01T00:00:00Z",
                       "blocks": [{"type": "text", "text": "y" * 4000}]})
    w = TranscriptWriter.open(path)
    try:
        w.append([line] * 100)
    finally:
        w.close()
    spans = _spans(monkeypatch)
    far: ReconcilePlan = plan_catch_up(path, head.file_len, head.epoch, far=64 << 10)
    assert (far.kind, far.scan, far.file_len, far.epoch) == ("tail", None, os.stat(path).st_size, head.epoch)
    assert spans == []
    near: Any = plan_catch_up(path, head.file_len, head.epoch, far=1 << 20)  # within the budget: read as before
    assert near.kind == "tail" and near.scan is not None and len(near.scan.messages) == 100
    assert plan_catch_up(path, head.file_len, "another epoch", far=64 << 10).kind == "full"
