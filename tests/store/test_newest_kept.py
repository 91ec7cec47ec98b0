"""store.newest_kept: a cap on a list deletes only rows proven older than the N newest a scan of the table
finds, never a row a damaged index hides from the newest-first list (the task runs' cap, the boot's retention,
the deliveries' kept answers; the inbox's cap: tests/turns/test_store_turns.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from store import collab, tasks
from store.fence import retention
from store.newest_kept import delete_past_newest
from store.upgrade.schema import apply_schema
from tests.dbkit import NOW, add_session, index_leaf

RUNS = 30


def _runs_db(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    apply_schema(conn)
    conn.execute("INSERT INTO scheduled_tasks(id, title, prompt, created_at, updated_at) VALUES ('t', 't', 'p', 1, 1)")
    for i in range(RUNS):  # rowid i + 1
        conn.execute("INSERT INTO task_runs(id, task_id, status, started_at, ended_at) "
                     "VALUES (?, 't', 'completed', ?, ?)", (f"r{i:03d}", NOW + i, NOW + i))
    conn.close()


def _hide_a_run(path: Path, newest_rank: int) -> str:
    """Change one byte of ``idx_task_runs``: the entry of the ``newest_rank``-th newest run (0: the newest) gets
    a payload size that ends on a byte of a later cell naming another row, so the index's newest-first scan
    reads that row's rowid twice and never the hidden one, with the page well formed. The hidden run's id."""
    with index_leaf(path, "idx_task_runs") as page:
        # an index leaf (type 10), one 2-byte cell pointer per entry, newest first (a DESC index); an entry is
        # its payload size (12), the record header (4; 15: a 1-character text, 5: a 6-byte int, 1: a 1-byte
        # rowid), task_id, started_at, then the rowid, read from the payload's last byte
        assert page[0] == 10 and int.from_bytes(page[3:5], "big") == RUNS
        cell = int.from_bytes(page[8 + 2 * newest_rank:10 + 2 * newest_rank], "big")
        assert page[cell:cell + 5] == bytes([12, 4, 15, 5, 1])
        rowid = page[cell + 12]
        assert rowid == RUNS - newest_rank
        size = next(n for n in range(13, 64) if page[cell + n] in range(1, RUNS + 1) and page[cell + n] != rowid)
        page[cell] = size
    return f"r{rowid - 1:03d}"


def _kept(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT id FROM task_runs NOT INDEXED")}


def test_a_run_a_damaged_index_hides_is_never_pruned_for_it(tmp_path: Path) -> None:
    """The cap keeps what the index hides. (The statement before this one read both its sides through
    ``idx_task_runs``, so this damage did not lose a run there, unlike the inbox's cap, whose delete scanned the
    table: it passes on the old code too and pins that the shared primitive keeps it so.)"""
    path = tmp_path / "pi.sqlite"
    _runs_db(path)
    hidden = _hide_a_run(path, 6)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        listed = [r[0] for r in conn.execute(
            "SELECT id FROM task_runs WHERE task_id = 't' ORDER BY started_at DESC, id DESC")]
        assert hidden not in listed and len(listed) == RUNS  # the damage is real: the list misses it
        assert tasks.prune_runs(conn, "t", keep=RUNS) == 0
        assert _kept(conn) == {f"r{i:03d}" for i in range(RUNS)}
        assert tasks.prune_runs(conn, "t", keep=25) == 5  # past the cap: the oldest by the table go
        assert _kept(conn) == {f"r{i:03d}" for i in range(5, RUNS)}
        assert hidden in _kept(conn)
    finally:
        conn.close()


def test_the_boot_retention_keeps_what_a_damaged_index_hides(tmp_path: Path) -> None:
    path = tmp_path / "pi.sqlite"
    _runs_db(path)
    _hide_a_run(path, 6)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert retention(conn, now_ms=NOW + 1_000)["taskRunsPruned"] == 0
        assert _kept(conn) == {f"r{i:03d}" for i in range(RUNS)}
    finally:
        conn.close()


def test_the_retention_keeps_the_newest_runs_of_each_task(conn: sqlite3.Connection) -> None:
    for task in ("a", "b"):
        conn.execute("INSERT INTO scheduled_tasks(id, title, prompt, created_at, updated_at) VALUES (?, ?, 'p', 1, 1)",
                     (task, task))
    for i in range(tasks.RUNS_KEPT + 3):  # a: three past the cap; b: under it
        conn.execute("INSERT INTO task_runs(id, task_id, status, started_at) VALUES (?, 'a', 'completed', ?)",
                     (f"a{i:03d}", NOW + i // 2))  # pairs share a stamp: the id breaks the tie
    conn.execute("INSERT INTO task_runs(id, task_id, status, started_at) VALUES ('b0', 'b', 'completed', ?)", (NOW,))
    assert retention(conn, now_ms=NOW + 1_000)["taskRunsPruned"] == 3
    assert _kept(conn) == {f"a{i:03d}" for i in range(3, tasks.RUNS_KEPT + 3)} | {"b0"}


def test_delete_past_newest_keeps_ties_by_id_and_only_its_rows(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE t(id TEXT PRIMARY KEY, at INTEGER NOT NULL, grp TEXT NOT NULL)")
    conn.executemany("INSERT INTO t VALUES (?, ?, ?)", [("x1", 1, "g"), ("x2", 2, "g"), ("y2", 2, "g"),
                                                         ("z9", 9, "h")])
    assert delete_past_newest(conn, "t", keep=2, stamp="at", tiebreak="id", where="grp = ?", params=("g",)) == 1
    assert {r[0] for r in conn.execute("SELECT id FROM t")} == {"x2", "y2", "z9"}
    assert delete_past_newest(conn, "t", keep=5, stamp="at", tiebreak="id") == 0
    assert delete_past_newest(conn, "t", keep=0, stamp="at", tiebreak="id", where="grp = ?", params=("h",)) == 1
    assert {r[0] for r in conn.execute("SELECT id FROM t")} == {"x2", "y2"}


def _delivery(conn: sqlite3.Connection, did: str, status: str) -> None:
    conn.execute("PRAGMA ignore_check_constraints = ON")  # a damaged status: SQLite checks a CHECK on writes only
    conn.execute(
        "INSERT INTO session_collaboration_messages(id, plugin_id, source_session_id, source_title, "
        "target_session_id, target_title, kind, content, status, idempotency_key, remaining_hops, "
        "permission_ceiling, created_at, updated_at) VALUES (?, 'p', 'src', 'Src', 'tgt', 'Tgt', 'task', 'do it', ?, "
        "?, 3, 'ask', ?, ?)", (did, status, did, NOW, NOW))
    conn.execute("PRAGMA ignore_check_constraints = OFF")
    collab.keep_delivered(conn, did, {"response": {"delivery": {"id": did}}}, NOW)


def test_the_boot_keeps_the_answer_of_a_delivery_that_may_still_begin(conn: sqlite3.Connection) -> None:
    """Before, every answer but a queued delivery's went: one whose status is damaged (it is never settled or
    fenced, so it may still begin) lost the answer its input line must carry."""
    add_session(conn, "tgt")
    for did, status in (("col_q", "queued"), ("col_dmg", "qu\x00eued"), ("col_run", "running"),
                        ("col_done", "completed"), ("col_cut", "interrupted")):
        _delivery(conn, did, status)
    collab.keep_delivered(conn, "col_gone", {"response": {}}, NOW)  # its row lost
    assert collab.prune_delivered(conn) == 4
    assert {r[0] for r in conn.execute("SELECT key FROM kv WHERE ns = 'collabDelivered'")} == {"col_q", "col_dmg"}
