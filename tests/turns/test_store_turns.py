"""store.turns / store.notifications / store.artifacts against a real index database (no trio)."""

from __future__ import annotations

import sqlite3

import orjson
import pytest

from runtime.boot import run_boot
from runtime.datadir import DataDir
from store import artifacts, notifications, turns
from store.errors import Conflict, InvalidInput, NotFound
from store.faults import NO_FAULTS
from store.fence import prune_notifications, retention
from store.indexing import index
from store.indexing.database import open_writer
from store.revisions import artifact_line, parse_revisions
from store.snapshots import prepare_snapshot
from store.transcripts.records import ms_to_rfc3339
from store.upgrade.schema import apply_schema
from tests.dbkit import index_leaf

NOW = 1_700_000_000_000


def open_db(tmp_path) -> sqlite3.Connection:
    conn, _ = open_writer(tmp_path / "pi.sqlite", quarantine_dir=tmp_path / "quarantine", now_ms=NOW)
    return conn


@pytest.fixture
def conn(tmp_path):
    c = open_db(tmp_path)
    c.execute("INSERT INTO sessions(id, title, provider_id, model_id, created_at, updated_at) "
              "VALUES ('s1', 'Title', 'p', 'm', 1, 1)")
    yield c
    c.close()


def start(conn, tid, sid="s1", **kw):
    return turns.start_turn(conn, session_id=sid, turn_id=tid, provider_id=kw.get("provider"),
                            model_id=kw.get("model"), snapshot=kw.get("snapshot"), now_ms=kw.get("now", NOW))


def end(conn, tid, status="completed", *, note=True, now=NOW + 5, error_code=None, usage=None):
    return turns.end_turn(conn, session_id="s1", turn_id=tid, status=status, error_code=error_code,
                          usage=usage, create_notification=note, now_ms=now)


def test_start_turn_snapshots_session_binding_and_is_retry_safe(conn):
    turn, created = start(conn, "t1")
    assert created and (turn["providerId"], turn["modelId"], turn["status"]) == ("p", "m", "running")
    again, created = start(conn, "t1")
    assert not created and again == turn
    with pytest.raises(Conflict):
        start(conn, "t1", snapshot=prepare_snapshot({"version": 1}))  # different snapshot
    with pytest.raises(Conflict) as second:
        start(conn, "t2")  # one running turn per session (issue 25)
    assert second.value.data["runningTurnId"] == "t1"
    end(conn, "t1")
    explicit, _ = start(conn, "t2", provider="p2", model="m2")
    assert (explicit["providerId"], explicit["modelId"]) == ("p2", "m2")


def test_end_turn_usage_rollup_and_settled_rules(conn):
    start(conn, "t1")
    out = end(conn, "t1", usage={"inputTokens": 12, "outputTokens": 3, "cacheRead": 9})
    assert out.changed and out.notification is not None
    row = conn.execute("SELECT status, input_tokens, output_tokens, usage_json, ended_at FROM turns").fetchone()
    assert row[:3] == ("completed", 12, 3) and orjson.loads(row[3])["cacheRead"] == 9 and row[4] == NOW + 5
    repeat = end(conn, "t1", now=NOW + 9)
    assert not repeat.changed and repeat.notification is None and repeat.turn["endedAt"] == NOW + 5
    with pytest.raises(Conflict):
        end(conn, "t1", "aborted")
    with pytest.raises(NotFound):
        end(conn, "nope")
    start(conn, "t2")
    with pytest.raises(InvalidInput):
        end(conn, "t2", error_code="X")  # completed carries no error code
    with pytest.raises(InvalidInput):
        end(conn, "t2", "running")


def test_notification_kinds_and_at_most_one_per_turn(conn):
    start(conn, "t1")
    assert end(conn, "t1").notification["kind"] == "task.completed"
    start(conn, "t2")
    failed = end(conn, "t2", "error", error_code="E").notification
    assert failed["kind"] == "task.failed" and failed["errorCode"] == "E" and failed["sessionTitle"] == "Title"
    start(conn, "t3")
    assert end(conn, "t3", "aborted").notification is None
    # even a direct second insert for the same turn is refused by UNIQUE(turn_id)
    assert notifications.insert_for_turn(conn, session_id="s1", turn_id="t1", kind="task.completed",
                                         error_code=None, now_ms=NOW) is None
    assert conn.execute("SELECT COUNT(*) FROM notifications").fetchone()[0] == 2


def test_newest_200_cap_after_every_insert(conn):
    conn.execute("BEGIN")  # one commit: the test is about the in-transaction prune
    for i in range(205):
        start(conn, f"t{i}")
        end(conn, f"t{i}", now=NOW + i)
        count = conn.execute("SELECT COUNT(*) FROM notifications").fetchone()[0]
        assert count == min(i + 1, 200)
    oldest = conn.execute("SELECT MIN(created_at) FROM notifications").fetchone()[0]
    assert oldest == NOW + 5
    # turns are never touched by the prune
    assert conn.execute("SELECT COUNT(*) FROM turns WHERE status = 'completed'").fetchone()[0] == 205


def test_cap_is_repaired_at_boot_and_survives_restart(tmp_path):
    data = DataDir(tmp_path)
    data.ensure()
    conn = open_db(tmp_path)
    conn.execute("BEGIN")
    conn.execute("INSERT INTO sessions(id, created_at, updated_at) VALUES ('s1', 1, 1)")
    for i in range(230):  # e.g. rows written by an older build without the cap
        conn.execute("INSERT INTO turns(id, session_id, status, started_at) VALUES (?, 's1', 'completed', 1)",
                     (f"t{i}",))
        conn.execute("INSERT INTO notifications(id, kind, session_id, session_title, turn_id, created_at) "
                     "VALUES (?, 'task.completed', 's1', '', ?, ?)", (f"n{i:03d}", f"t{i}", NOW + i))
    conn.execute("COMMIT")
    conn.close()
    boot = run_boot(data, faults=NO_FAULTS, now_ms=lambda: NOW + 1000)
    assert boot.report["retention"]["notificationsPruned"] == 30
    boot.conn.close()
    conn = open_db(tmp_path)
    ids = [r[0] for r in conn.execute("SELECT id FROM notifications ORDER BY created_at DESC")]
    assert len(ids) == 200 and ids[0] == "n229" and ids[-1] == "n030"
    conn.close()


def test_a_damaged_inbox_index_never_prunes_the_notifications_it_hides(tmp_path):
    """A loss scripts/chaos --mode corrupt reported once (seed 1498681220: an acknowledged notification gone after
    the salvage, which named no notification skipped, its turn row back ``completed``) and that random bytes over
    the inbox's pages reproduce: a changed byte in an entry of ``idx_notifications_created`` (its payload size:
    a scan reads its rowid as another row's) hides a row from the index's newest-first scan, with the page well
    formed. The newest-N prune kept the ids that scan listed and deleted every other row, so the next
    ``endTurn`` deleted the hidden, acknowledged notification in a commit that succeeded, and no salvage could
    see it had ever been there. The prune now deletes only the rows older than the N-th newest row a scan of
    the table itself finds."""
    path = tmp_path / "pi.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    apply_schema(conn)
    conn.execute("INSERT INTO sessions(id, title, created_at, updated_at) VALUES ('s1', 'Title', 1, 1)")
    for i in range(30):  # rowid i + 1
        conn.execute("INSERT INTO notifications(id, kind, session_id, session_title, turn_id, created_at) "
                     "VALUES (?, 'task.completed', 's1', 'Title', ?, ?)", (f"n{i:03d}", f"t{i}", NOW + i))
    conn.close()
    with index_leaf(path, "idx_notifications_created") as page:
        # an index leaf: an 8-byte header, a 2-byte pointer per cell (newest first); a cell is its payload size,
        # the record header (3, 5: a 6-byte created_at, 1: a 1-byte rowid), created_at, then the rowid
        assert page[0] == 10 and int.from_bytes(page[3:5], "big") == 30
        cell = int.from_bytes(page[8 + 2 * 6:8 + 2 * 7], "big")  # the 7th newest: t23, rowid 24
        assert page[cell:cell + 4] == bytes([10, 3, 5, 1]) and page[cell + 10] == 24
        # its payload size changed: a scan reads an entry's rowid from its payload's last byte, now a byte of a
        # later cell that names another row; a seek still finds the entry by its record (created_at, 24)
        size = next(n for n in range(11, 64) if page[cell + n] in range(1, 31) and page[cell + n] != 24)
        page[cell] = size
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        listed = [r[0] for r in conn.execute("SELECT turn_id FROM notifications ORDER BY created_at DESC, id DESC")]
        assert "t23" not in listed and len(listed) == 30  # the inbox's own order reads through the index
        conn.execute("BEGIN")
        note = notifications.insert_for_turn(conn, session_id="s1", turn_id="t-new", kind="task.completed",
                                             error_code=None, now_ms=NOW + 100)
        conn.execute("COMMIT")
        assert note is not None
        kept = {r[0] for r in conn.execute("SELECT turn_id FROM notifications NOT INDEXED")}
        assert kept == {f"t{i}" for i in range(30)} | {"t-new"}  # 31 of at most 200: none goes
        assert prune_notifications(conn, 25) == 6  # past the cap, the oldest by the table go, t23 stays
        kept = {r[0] for r in conn.execute("SELECT turn_id FROM notifications NOT INDEXED")}
        assert kept == {f"t{i}" for i in range(6, 30)} | {"t-new"}
    finally:
        conn.close()


def test_inbox_queries_use_the_documented_indexes(conn):
    plan = " ".join(str(r) for r in conn.execute(
        "EXPLAIN QUERY PLAN SELECT id FROM notifications ORDER BY created_at DESC, id DESC LIMIT 50"))
    assert "idx_notifications_created" in plan
    plan = " ".join(str(r) for r in conn.execute(
        "EXPLAIN QUERY PLAN SELECT COUNT(*) FROM notifications WHERE read_at IS NULL"))
    assert "idx_notifications_unread" in plan


def test_mark_read_mark_all_and_clear(conn):
    for i in range(4):
        start(conn, f"t{i}")
        end(conn, f"t{i}", now=NOW + i)
    ids = [n["id"] for n in notifications.list_notifications(conn, unread_only=False, limit=10, cursor=None)[0].items]
    assert notifications.mark_read(conn, [ids[0], ids[0], "missing"], NOW + 50) == 1
    assert notifications.mark_read(conn, [ids[0]], NOW + 60) == 0
    items, _, unread = notifications.list_notifications(conn, unread_only=True, limit=10, cursor=None)
    assert unread == 3 and ids[0] not in [n["id"] for n in items.items]
    assert notifications.mark_all_read(conn, NOW + 70) == 3
    assert notifications.mark_all_read(conn, NOW + 80) == 0
    read_at = conn.execute("SELECT read_at FROM notifications WHERE id = ?", (ids[0],)).fetchone()[0]
    assert read_at == NOW + 50  # never rewritten
    assert notifications.clear(conn, [ids[1]]) == 1
    assert notifications.clear(conn, None) == 3
    assert conn.execute("SELECT COUNT(*) FROM turns").fetchone()[0] == 4


# ---------------------------------------------------------------------- artifacts


def tool(mid, name, status="ok", *, args=None, turn="t1", **block):
    return {"type": "message", "id": mid, "role": "tool", "turnId": turn, "toolName": name,
            "blocks": [{"type": "tool_call", "callId": f"c-{mid}", "name": name, "args": args or {},
                        "status": status, **block}]}


def test_tool_effects_detection():
    eff = artifacts.tool_effects
    assert eff(tool("m", "Write", args={"path": "/w/a.py"}))[0].effects == (("/w/a.py", "write"),)
    assert eff(tool("m", "Edit", "success", args={"file_path": "/w/b.py"}))[0].effects == (("/w/b.py", "edit"),)
    assert eff(tool("m", "Write", "error", args={"path": "/w/a.py"})) == []
    assert eff(tool("m", "Write", "denied", args={"path": "/w/a.py"})) == []
    assert eff(tool("m", "Write", None, args={"path": "/w/a.py"})) == []
    assert eff(tool("m", "Read", args={"path": "/w/a.py"})) == []
    assert eff(tool("m", "Write", args={})) == []
    declared = tool("m", "plugin.gen", fileEffects=[{"path": "/w/x", "op": "delete"}, {"path": "/w/y"}])
    assert eff(declared)[0].effects == (("/w/x", "delete"), ("/w/y", "write"))


def test_upsert_keeps_one_row_per_file_and_excludes_scratch(conn):
    scratch = "/data/scratch/s1"
    n = artifacts.record_effects(conn, "s1", tool("m1", "Write", args={"path": "/w/a.py"}), "t1", NOW,
                                 scratch=scratch)
    assert n == 1
    artifacts.record_effects(conn, "s1", tool("m2", "Edit", args={"path": "/w/a.py"}), "t2", NOW + 1, scratch=scratch)
    artifacts.record_effects(conn, "s1", tool("m3", "Write", args={"path": scratch + "/tmp.txt"}), "t2", NOW + 2,
                             scratch=scratch)
    rows = conn.execute("SELECT path, op, turn_id, updated_at FROM artifacts").fetchall()
    assert rows == [("/w/a.py", "edit", "t2", NOW + 1)]
    audits = [orjson.loads(r[0]) for r in conn.execute(
        "SELECT payload_json FROM audit_log WHERE kind = 'tool_execute' ORDER BY id")]
    assert len(audits) == 3 and audits[2]["effects"] == [{"path": scratch + "/tmp.txt", "op": "write",
                                                           "artifact": False}]
    assert audits[0]["messageId"] == "m1" and audits[0]["tool"] == "Write" and audits[0]["callId"] == "c-m1"


def test_index_insert_artifact_and_audit_share_the_transaction(conn):
    conn.execute("BEGIN")
    index.index_messages(conn, "s1", [index.IndexRecord(tool("m1", "Write", args={"path": "/w/a"}), 100, 10)],
                         indexed_len=110, file_epoch="e", now_ms=NOW)
    assert conn.execute("SELECT COUNT(*) FROM artifacts").fetchone()[0] == 1
    conn.execute("ROLLBACK")
    counts = [conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("messages", "artifacts", "audit_log")]
    assert counts == [0, 0, 0]


def test_rebuild_restores_missing_artifacts_without_audit_or_overwrite(conn):
    conn.execute("INSERT INTO artifacts VALUES ('s1', '/w/new', 'edit', 't9', ?)", (NOW + 99,))
    recs = [index.IndexRecord(tool("m1", "Write", args={"path": "/w/a"}), 100, 10),
            index.IndexRecord(tool("m2", "Write", args={"path": "/w/new"}), 110, 10)]
    index.reindex_session(conn, "s1", recs, [], [], indexed_len=120, file_epoch="e", now_ms=NOW)
    rows = dict((r[0], (r[1], r[2])) for r in conn.execute("SELECT path, op, updated_at FROM artifacts"))
    assert rows == {"/w/a": ("write", NOW), "/w/new": ("edit", NOW + 99)}
    assert conn.execute("SELECT COUNT(*) FROM audit_log").fetchone()[0] == 0


def test_a_paths_row_is_its_newest_line_whatever_order_the_lines_come_in(conn):
    """Dated by the line's createdAt, a row moves only for a line not older than it: a rebuild reading the
    archived branches after the live transcript lists what the live index listed (the newest op and turn)."""
    def at(mid, name, ms, turn):
        rec = tool(mid, name, args={"path": "/w/a"}, turn=turn)
        return {**rec, "createdAt": ms_to_rfc3339(ms)}

    lines = [at("m1", "Write", NOW, "t1"), at("m2", "Edit", NOW + 5, "t2"), at("m3", "Write", NOW + 9, "t3")]
    for order in ([0, 1, 2], [2, 1, 0], [1, 2, 0]):
        conn.execute("DELETE FROM artifacts")
        for i in order:
            artifacts.record_effects(conn, "s1", lines[i], lines[i]["turnId"], NOW + 100, audit=False)
        assert conn.execute("SELECT op, turn_id, updated_at FROM artifacts").fetchall() == [("write", "t3", NOW + 9)]
    carried = [{"path": "/w/a", "op": "write", "turnId": "t3", "updatedAt": NOW + 9}]
    # the lines give the row back: nothing to carry; without them, or with an older one only, it is carried
    assert artifacts.rows_to_carry(conn, "s1", [(line, None) for line in lines], {}) == []
    assert artifacts.rows_to_carry(conn, "s1", [(lines[0], None)], {}) == carried
    assert artifacts.rows_to_carry(conn, "s1", [], {}) == carried
    # a row the revisions file carries as it is is not carried again (one line per row, once)
    held = parse_revisions(b"".join(artifact_line(row) for row in carried)).artifacts
    assert artifacts.rows_to_carry(conn, "s1", [], artifacts.carried_of(held)) == []
    # an older carried row of one time as the line's would win over it in a rebuild: carried again
    tie = {"/w/a": ("edit", "t2", NOW + 9)}
    assert artifacts.rows_to_carry(conn, "s1", [(line, None) for line in lines], tie) == carried
    # undated, the line gives no row back (a rebuild dates it when it runs)
    undated = {k: v for k, v in lines[2].items() if k != "createdAt"}
    assert artifacts.rows_to_carry(conn, "s1", [(undated, None)], {}) == carried
    conn.execute("DELETE FROM artifacts")
    bad = [{"path": "/w/b", "op": "rename", "turnId": None, "updatedAt": 1}, {"path": "/w/c", "op": "edit"},
           {"path": 7, "op": "edit", "updatedAt": 1}, {"path": "w/d", "op": "edit", "turnId": None, "updatedAt": 1}]
    assert artifacts.restore_carried(conn, "s1", [*bad, *carried]) == 1
    artifacts.record_effects(conn, "s1", lines[1], "t2", NOW, audit=False)  # older: the carried row stays
    assert conn.execute("SELECT path, op, turn_id, updated_at FROM artifacts").fetchall() == [
        ("/w/a", "write", "t3", NOW + 9)]


def test_list_artifacts_per_session_and_global_with_cursor(conn):
    conn.execute("INSERT INTO sessions(id, created_at, updated_at) VALUES ('s2', 1, 1)")
    for i in range(5):
        sid = "s1" if i % 2 == 0 else "s2"
        conn.execute("INSERT INTO artifacts VALUES (?, ?, 'write', NULL, ?)", (sid, f"/w/f{i}", NOW + i // 2))
    seen = []
    cursor = None
    while True:
        items, cursor = artifacts.list_artifacts(conn, session_id=None, limit=2, cursor=cursor)
        seen += [(a["sessionId"], a["path"]) for a in items.items]
        if cursor is None:
            break
    assert len(seen) == 5 and len(set(seen)) == 5
    times = [conn.execute("SELECT updated_at FROM artifacts WHERE path = ?", (p,)).fetchone()[0] for _, p in seen]
    assert times == sorted(times, reverse=True)
    mine, _ = artifacts.list_artifacts(conn, session_id="s1", limit=10, cursor=None)
    assert {a["path"] for a in mine.items} == {"/w/f0", "/w/f2", "/w/f4"}


def test_audit_retention_prunes_old_rows(conn):
    day = 86_400_000
    conn.execute("INSERT INTO audit_log(ts, kind) VALUES (?, 'tool_execute')", (NOW - 91 * day,))
    conn.execute("INSERT INTO audit_log(ts, kind) VALUES (?, 'tool_execute')", (NOW - 89 * day,))
    assert retention(conn, now_ms=NOW)["auditPruned"] == 1
    conn.execute("INSERT INTO audit_log(ts, kind) VALUES (?, 'tool_execute')", (NOW - 10 * day,))
    assert retention(conn, now_ms=NOW, audit_days=7)["auditPruned"] == 2


def test_boot_prunes_audit_by_configured_retention_then_vacuums(tmp_path):
    data = DataDir(tmp_path)
    data.ensure()
    conn = open_db(tmp_path)
    day = 86_400_000
    blob = "x" * 4000
    conn.execute("BEGIN")
    for i in range(300):
        conn.execute("INSERT INTO audit_log(ts, kind, payload_json) VALUES (?, 'tool_execute', ?)",
                     (NOW - (40 if i < 290 else 1) * day, orjson.dumps({"pad": blob}).decode()))
    conn.execute("COMMIT")
    conn.close()
    boot = run_boot(data, faults=NO_FAULTS, now_ms=lambda: NOW, audit_retention_days=30)
    try:
        assert boot.report["retention"]["auditPruned"] == 290
        assert boot.conn.execute("SELECT COUNT(*) FROM audit_log").fetchone()[0] == 10
        assert boot.conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
        assert boot.conn.execute("PRAGMA freelist_count").fetchone()[0] == 0  # the freed pages were returned
    finally:
        boot.conn.close()


def test_an_undated_line_reindexed_keeps_the_paths_row_and_a_live_one_moves_it(conn):
    """A rebuild / reindex / migration meeting a Write line with no ``createdAt`` (older or imported history)
    dated it at the boot and moved the path's row there (a migrated seed's artifact came back dated at its first
    boot); it now only makes a row the path lacks. The live tool call's success still moves the row."""
    conn.execute("INSERT INTO artifacts VALUES ('s1', '/w/a', 'write', 't1', ?)", (NOW,))
    undated = tool("m1", "Edit", args={"path": "/w/a"})
    assert "createdAt" not in undated
    artifacts.record_effects(conn, "s1", undated, "t2", NOW + 5_000, audit=False)
    assert conn.execute("SELECT op, turn_id, updated_at FROM artifacts").fetchall() == [("write", "t1", NOW)]
    artifacts.record_effects(conn, "s1", tool("m2", "Write", args={"path": "/w/b"}), "t2", NOW + 6_000, audit=False)
    assert conn.execute("SELECT updated_at FROM artifacts WHERE path = '/w/b'").fetchone() == (NOW + 6_000,)
    artifacts.record_effects(conn, "s1", undated, "t2", NOW + 7_000)
    assert conn.execute("SELECT op, turn_id, updated_at FROM artifacts WHERE path = '/w/a'").fetchall() == [
        ("edit", "t2", NOW + 7_000)]
