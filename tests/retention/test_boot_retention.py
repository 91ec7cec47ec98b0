"""Retention at boot (seed 003 §8) on a directory a seed-era pi-desktop left: audit rows older than the
configured days are pruned and the file vacuumed, task runs keep the newest 100 per task, notifications
the newest 200 — and nothing ever prunes a transcript, however old, orphaned or torn."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from runtime.boot import run_boot
from runtime.datadir import DataDir
from store.faults import NO_FAULTS
from tests.migrations.seedkit import DAY_MS, build_seed_dir

Rows = dict[str, list[dict[str, Any]]]


def _lots_of_history(rows: Rows) -> None:
    base = rows["sessions"][0]["created_at"]
    for i in range(130):
        rows["task_runs"].append({"id": f"old-run-{i:03d}", "task_id": "task-weekly", "session_id": None,
                                  "status": "completed", "error_code": None, "started_at": base - i * 60_000,
                                  "ended_at": base - i * 60_000 + 1})
    for i in range(230):
        rows["turns"].append({"id": f"nt-{i:03d}", "session_id": "s-beta", "status": "completed",
                              "provider_id": None, "model_id": None, "error_code": None, "input_tokens": 0,
                              "output_tokens": 0, "usage_json": None, "started_at": base, "ended_at": base})
        rows["notifications"].append({"id": f"nn-{i:03d}", "kind": "task.completed", "session_id": "s-beta",
                                      "session_title": "beta", "turn_id": f"nt-{i:03d}", "error_code": None,
                                      "created_at": base + 100_000 + i, "read_at": None})
    for i in range(50):
        rows["audit_log"].append({"id": 100 + i, "ts": base - (100 + i) * DAY_MS, "kind": "tool_execute",
                                  "session_id": "s-alpha", "payload_json": '{"pad":"' + "p" * 2000 + '"}'})


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (root / "sessions").iterdir()}


def test_boot_retention_on_a_seed_directory_never_touches_a_transcript(tmp_path: Path) -> None:
    root = tmp_path / "data"
    seed = build_seed_dir(root, 17, tweak=_lots_of_history)
    # an orphan transcript (no row), a torn one, and an old quarantine file: all user data
    (root / "sessions" / "s-orphan.jsonl").write_bytes(
        b'{"type":"session","schema":1,"sessionId":"s-orphan","createdAt":"2020-01-01T00:00:00.000Z"}\n'
        b'{"type":"message","id":"m-o1","role":"user","createdAt":"2020-01-01T00:00:01.000Z",'
        b'"blocks":[{"type":"text","text":"from long ago"}]}\n')
    torn = root / "sessions" / "s-beta.jsonl"
    torn.write_bytes(torn.read_bytes() + b'{"type":"message","id":"half')
    (root / "sessions" / "s-beta.jsonl.torn-1600000000000").write_bytes(b"cut long ago")
    before = _files(root)
    data = DataDir(root)
    data.ensure()
    now = seed.rows["sessions"][0]["created_at"] + DAY_MS
    boot = run_boot(data, faults=NO_FAULTS, now_ms=lambda: now, audit_retention_days=90)
    conn = boot.conn
    try:
        retention = boot.report["retention"]
        assert retention == {"auditPruned": 50, "taskRunsPruned": 30, "notificationsPruned": 32}
        weekly = [r[0] for r in conn.execute(
            "SELECT id FROM task_runs WHERE task_id = 'task-weekly' ORDER BY started_at DESC")]
        assert weekly == [f"old-run-{i:03d}" for i in range(100)]  # the newest 100
        assert conn.execute("SELECT count(*) FROM task_runs WHERE task_id <> 'task-weekly'").fetchone()[0] == 3
        assert conn.execute("SELECT count(*) FROM notifications").fetchone()[0] == 200
        assert conn.execute("SELECT count(*) FROM audit_log WHERE ts < ?", (now - 90 * DAY_MS,)).fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM audit_log WHERE id IN (1, 2, 3)").fetchone()[0] == 3
        # the 50 pruned rows of 2 KB freed 25+ pages; incremental_vacuum gave them back (later boot steps may
        # free a page or two of their own)
        assert conn.execute("PRAGMA freelist_count").fetchone()[0] < 5
        # the orphan transcript got its row back (re-indexed), nothing was swept
        assert conn.execute("SELECT count(*) FROM messages WHERE session_id = 's-orphan'").fetchone()[0] == 1
        audit_left = conn.execute("SELECT count(*) FROM audit_log").fetchone()[0]  # the 3 seed rows + the fence's
    finally:
        conn.close()
    assert _files(root) == before
    # a year later: still every transcript, every session row
    later = run_boot(data, faults=NO_FAULTS, now_ms=lambda: now + 400 * DAY_MS, audit_retention_days=90)
    try:
        assert later.conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == 7
        # only audit rows age out: the 3 seed rows, the fence's turn record and its 2 plan records (an approval
        # and an execution it interrupted)
        assert later.report["retention"]["auditPruned"] == audit_left == 6
    finally:
        later.conn.close()
    assert _files(root) == before
    conn = sqlite3.connect(root / "pi.sqlite")
    try:
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 11  # 10 seed messages + the orphan's
    finally:
        conn.close()
