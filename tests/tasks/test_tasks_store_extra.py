"""Scheduled-task edits keep the armed slot unless the schedule changed; finished runs link their session."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from store import tasks
from store.errors import SessionNotFound
from store.indexing import index
from store.upgrade.schema import apply_schema

HOUR = 3_600_000


@pytest.fixture
def conn(tmp_path: Path) -> sqlite3.Connection:
    c = sqlite3.connect(tmp_path / "t.sqlite", isolation_level=None)
    c.execute("PRAGMA foreign_keys = ON")
    apply_schema(c)
    return c


def test_rename_keeps_next_run_but_cadence_change_recomputes(conn: sqlite3.Connection) -> None:
    t0 = 1_700_000_000_000
    task = tasks.create_task(conn, task_id="t1", title="a", prompt="p", cadence="hourly", enabled=True,
                             project_id=None, config={"schedule": {"hour": 0, "minute": 0}}, now_ms=t0)
    armed = task["config"]["nextRunAt"]
    assert armed == t0 + HOUR
    renamed = tasks.update_task(conn, "t1", {"title": "b", "prompt": "q"}, now_ms=t0 + 30 * 60_000)
    assert renamed["title"] == "b" and renamed["config"]["nextRunAt"] == armed
    later = t0 + 40 * 60_000
    rescheduled = tasks.update_task(conn, "t1", {"enabled": False}, now_ms=later)
    again = tasks.update_task(conn, "t1", {"enabled": True}, now_ms=later)
    assert again["config"]["nextRunAt"] == later + HOUR
    assert rescheduled["enabled"] is False or rescheduled["enabled"] == 0


def test_finish_run_links_the_session(conn: sqlite3.Connection) -> None:
    t0 = 1_700_000_000_000
    tasks.create_task(conn, task_id="t1", title="a", prompt="p", cadence="manual", enabled=True,
                      project_id=None, config={}, now_ms=t0)
    run = tasks.start_run(conn, task_id="t1", run_id="r1", session_id=None, now_ms=t0)
    assert run.get("sessionId") is None
    index.insert_session(conn, "s1", now_ms=t0)
    with pytest.raises(SessionNotFound):
        tasks.finish_run(conn, run_id="r1", status="completed", error_code=None, now_ms=t0, session_id="nope")
    done = tasks.finish_run(conn, run_id="r1", status="completed", error_code=None, now_ms=t0 + 5,
                            session_id="s1")
    assert done["sessionId"] == "s1" and done["status"] == "completed"
