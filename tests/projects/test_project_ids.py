"""Project ids name one project for ever: a removed project's id is never issued again, and a database
rebuilt from the files issues ids above any the lost one can have issued (``store/projects.py``)."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from actors.session_context import session_info_line
from runtime.boot import run_boot
from runtime.datadir import DataDir
from store import projects
from store.faults import NO_FAULTS
from store.indexing import index
from store.transcripts.transcript import create_transcript
from tests.dbkit import NOW


def test_a_removed_projects_id_is_not_issued_again(conn: sqlite3.Connection) -> None:
    first, second = index.upsert_project(conn, "/a", NOW), index.upsert_project(conn, "/b", NOW)
    assert (first, second) == (1, 2)
    assert index.upsert_project(conn, "/b/", NOW + 1) == 2  # the canonical path's row, opened again
    projects.remove_project_row(conn, second)
    assert index.upsert_project(conn, "/c", NOW) == 3  # MAX(id) + 1 would have been 2 again
    projects.remove_project_row(conn, 3)
    projects.remove_project_row(conn, first)
    assert index.upsert_project(conn, "/a", NOW) == 4
    assert index.issued_project_id(conn) == 4


def test_the_floor_only_rises(conn: sqlite3.Connection) -> None:
    index.upsert_project(conn, "/a", NOW)
    assert index.raise_project_id_floor(conn, 5_000, NOW) == 5_000
    assert index.raise_project_id_floor(conn, 10, NOW) == 5_000
    assert index.upsert_project(conn, "/b", NOW) == 5_001
    conn.execute("UPDATE kv SET value_json = 'junk' WHERE ns = 'projectIds'")
    assert index.upsert_project(conn, "/c", NOW) == 5_002  # an unreadable mark: the rows' own highest id


def test_the_floor_after_a_loss_is_past_the_clock_and_every_folders_time(tmp_path: Path) -> None:
    before = time.time_ns() // 1000
    future = time.time_ns() + 3600 * 10**9  # a clock set back since the folder last changed
    os.utime(tmp_path, ns=(future, future))
    floor = projects.id_floor_after_loss((tmp_path, tmp_path / "missing"), now_ms=0)
    assert floor > future // 1000 > before
    assert projects.id_floor_after_loss((), now_ms=0) >= before
    assert floor < 2**53  # a JSON number's exact integers


def _boot_ids(data: DataDir, paths: dict[str, str]) -> dict[str, int]:
    boot = run_boot(data, faults=NO_FAULTS, now_ms=lambda: NOW)
    try:
        rows = dict(boot.conn.execute("SELECT path, id FROM projects").fetchall())
        return {sid: rows[path] for sid, path in paths.items()}
    finally:
        boot.conn.close()


def test_a_rebuilt_database_numbers_its_projects_above_the_lost_ones(tmp_path: Path) -> None:
    data = DataDir(tmp_path / "data")
    data.ensure()
    paths = {"s-a": "/alpha", "s-b": "/beta"}
    for sid, path in paths.items():
        create_transcript(data.transcript(sid), sid, NOW,
                          body_lines=[session_info_line({"title": sid, "projectPath": path}, NOW)])
    floor = time.time_ns() // 1000
    first = _boot_ids(data, paths)  # transcripts and no database: one was lost
    assert min(first.values()) > floor
    assert _boot_ids(data, paths) == first  # the same database: the same ids
    for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
        (data.root / name).unlink(missing_ok=True)
    rebuilt = _boot_ids(data, paths)
    assert min(rebuilt.values()) > max(first.values())
    (data.root / "pi.sqlite").write_bytes(b"not an SQLite header, garbage!!" * 8)
    again = _boot_ids(data, paths)
    assert min(again.values()) > max(rebuilt.values())


def test_a_new_data_directory_starts_at_one(tmp_path: Path) -> None:
    data = DataDir(tmp_path / "data")
    data.ensure()
    boot = run_boot(data, faults=NO_FAULTS, now_ms=lambda: NOW)
    try:
        assert "projectIdFloor" not in boot.report
        assert index.upsert_project(boot.conn, "/a", NOW) == 1
    finally:
        boot.conn.close()
