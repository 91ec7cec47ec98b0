"""Version handling: resets (seed §11.5), the v20→v21→…→v27 chain, backups, rollback.

The seed's own chain (7 … 17) is tested with fixtures built from the seed's DDL
in ``tests/migrations``."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from store.errors import SchemaTooNew
from store.faults import Faults
from store.indexing.database import OpenReport, apply_pragmas, open_writer
from store.upgrade.migrations import (
    STEPS,
    MigrationFailed,
    MigrationStep,
    OpenAction,
    archive_name,
    classify,
    ddl_for_version,
    migrate,
)
from store.upgrade.schema import (
    DDL,
    SCHEMA_VERSION,
    V24_ADDITIONS,
    V25_ADDITIONS,
    V26_ADDITIONS,
    V27_ADDITIONS,
    V28_TOOL_SEARCH,
    V29_KNOWN_SESSIONS,
    V30_QUEUE_LEASES,
    V31_LEASE_CLIENT,
    V32_WINDOW_INDEX,
)

from ._sqlite_helpers import (
    NOW_MS,
    add_session,
    build_db,
    connect_plain,
    fresh_layout,
    fts_hits,
    listing,
    schema_objects,
    sha256,
    user_version,
)


def _open(root: Path, now_ms: int = NOW_MS) -> tuple[sqlite3.Connection, OpenReport]:
    return open_writer(root / "pi.sqlite", quarantine_dir=root / "quarantine", now_ms=now_ms)


def _legacy_db(path: Path, version: int, *, wal: bool = True) -> None:
    """A seed-era database we cannot migrate, with data in it."""
    conn = connect_plain(path)
    try:
        if wal:
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT)")
        conn.executemany(
            "INSERT INTO settings VALUES (?, ?)", [(f"k{i}", f"legacy value {i}") for i in range(50)]
        )
        conn.execute(f"PRAGMA user_version = {version}")
    finally:
        conn.close()


def _v20_with_data(path: Path) -> None:
    build_db(path, ddl_for_version(20), 20)
    conn = connect_plain(path)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        add_session(conn, "s1", ["migrations keep old messages", "旧的消息仍然可以搜索"])
        conn.execute("INSERT INTO turns(id, session_id, started_at) VALUES ('t1', 's1', 1)")
        conn.execute("UPDATE messages SET turn_id = 't1' WHERE seq = 2")
        conn.execute("INSERT INTO kv VALUES ('app', 'settings', '{\"a\":1}', 1)")
    finally:
        conn.close()


@pytest.fixture
def v20_conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    """A writer-style connection on a real v20 database with data."""
    _v20_with_data(tmp_path / "pi.sqlite")
    conn = connect_plain(tmp_path / "pi.sqlite")
    apply_pragmas(conn)
    try:
        yield conn
    finally:
        conn.close()


def test_classify_and_archive_names() -> None:
    assert classify(0, False) is OpenAction.FRESH
    assert classify(0, True) is OpenAction.RESET  # foreign, unversioned schema
    for legacy in (1, 3, 6):
        assert classify(legacy, True) is OpenAction.RESET
    for seed in (7, 8, 9, 10, 11, 14, 15, 16, 17, 18, 19):
        assert classify(seed, True) is OpenAction.UPGRADE
    for never_released in (12, 13):
        assert classify(never_released, True) is OpenAction.UNKNOWN
    assert classify(20, True) is OpenAction.UPGRADE
    assert classify(SCHEMA_VERSION, True) is OpenAction.CURRENT
    assert classify(SCHEMA_VERSION + 1, True) is OpenAction.TOO_NEW
    assert [archive_name("pi.sqlite", v) for v in (1, 6, 7, 19)] == [
        "pi.sqlite.v6.bak", "pi.sqlite.v6.bak", "pi.sqlite.v7.bak", "pi.sqlite.v19.bak",
    ]  # fmt: skip


def test_ddl_for_version_20_is_21_without_boot_reports_and_turn_index() -> None:
    v20 = ddl_for_version(20)
    v21 = ddl_for_version(21)
    assert ddl_for_version(SCHEMA_VERSION) == DDL
    assert len(v21) - len(v20) == 2 and v21[: len(v20)] == v20
    assert not any("boot_reports" in s or "idx_messages_turn" in s for s in v20)
    assert not any("ordinal" in s or "search_hazard" in s for s in v21)
    assert any("ordinal" in s for s in DDL) and any("search_hazard" in s for s in DDL)
    with pytest.raises(ValueError, match="no DDL kept"):
        ddl_for_version(7)
    assert [s.to_version for s in STEPS] == [21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32]
    assert [s.destructive for s in STEPS] == [False, True] + [False] * 10
    assert ddl_for_version(22) + ("CREATE INDEX idx_messages_created ON messages(created_at)",) == ddl_for_version(23)
    assert ddl_for_version(23) + V24_ADDITIONS == ddl_for_version(24)
    assert ddl_for_version(24) + V25_ADDITIONS == ddl_for_version(25)
    assert ddl_for_version(25) + V26_ADDITIONS == ddl_for_version(26)
    assert ddl_for_version(26) + V27_ADDITIONS == ddl_for_version(27)
    assert ddl_for_version(27) + V28_TOOL_SEARCH == ddl_for_version(28)
    assert ddl_for_version(28) + V29_KNOWN_SESSIONS == ddl_for_version(29)
    assert ddl_for_version(29) + V30_QUEUE_LEASES == ddl_for_version(30)
    assert ddl_for_version(30) + V31_LEASE_CLIENT == ddl_for_version(31)
    assert ddl_for_version(31) + V32_WINDOW_INDEX == DDL


def test_pre_v7_database_is_archived_as_v6_bak_and_a_fresh_file_starts(tmp_path: Path) -> None:
    db = tmp_path / "pi.sqlite"
    _legacy_db(db, 3)
    conn, report = _open(tmp_path)
    try:
        assert report.archived_to == tmp_path / "pi.sqlite.v6.bak"
        assert report.archived_version == 3
        assert report.rebuilt and report.created_fresh
        assert user_version(conn) == SCHEMA_VERSION
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'settings'").fetchone()[0] == 0
    finally:
        conn.close()
    archive = tmp_path / "pi.sqlite.v6.bak"
    # checkpointed and renamed: one self-contained file, no stale sidecars anywhere
    assert [n for n in listing(tmp_path) if "v6" in n] == ["pi.sqlite.v6.bak"]
    archived = sha256(archive)
    old = sqlite3.connect(f"file:{archive}?mode=ro", uri=True)
    try:
        assert user_version(old) == 3
        assert old.execute("SELECT count(*) FROM settings").fetchone()[0] == 50
        assert old.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    finally:
        old.close()

    # reopening the fresh file is a plain open: no second archive
    conn, again = _open(tmp_path, now_ms=NOW_MS + 1)
    try:
        assert again.archived_to is None
        assert not again.created_fresh and not again.rebuilt
        assert user_version(conn) == SCHEMA_VERSION
    finally:
        conn.close()
    assert sha256(archive) == archived
    assert [n for n in listing(tmp_path) if n.endswith(".bak")] == ["pi.sqlite.v6.bak"]


@pytest.mark.parametrize(
    ("version", "archive"),
    [
        (0, "pi.sqlite.v0.bak"),  # unversioned tables: not ours, never reused
        (1, "pi.sqlite.v6.bak"),
        (6, "pi.sqlite.v6.bak"),
    ],
)
def test_unmigratable_versions_are_archived_by_version(
    tmp_path: Path, version: int, archive: str
) -> None:
    _legacy_db(tmp_path / "pi.sqlite", version, wal=version % 2 == 1)
    conn, report = _open(tmp_path)
    conn.close()
    assert report.archived_to == tmp_path / archive
    old = sqlite3.connect(f"file:{tmp_path / archive}?mode=ro", uri=True)
    try:
        assert user_version(old) == version
        assert old.execute("SELECT value FROM settings WHERE key = 'k7'").fetchone() == ("legacy value 7",)
    finally:
        old.close()


def test_an_existing_archive_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "pi.sqlite.v6.bak").write_bytes(b"an older archive")
    _legacy_db(tmp_path / "pi.sqlite", 2)
    conn, report = _open(tmp_path)
    conn.close()
    assert report.archived_to == tmp_path / f"pi.sqlite.v6.bak.{NOW_MS}"
    assert (tmp_path / "pi.sqlite.v6.bak").read_bytes() == b"an older archive"


def test_v20_database_migrates_to_current_keeping_its_data(tmp_path: Path) -> None:
    _v20_with_data(tmp_path / "pi.sqlite")
    conn, report = _open(tmp_path)
    try:
        assert report.migrated_from == 20 and report.schema_version == SCHEMA_VERSION
        assert not report.created_fresh and not report.rebuilt
        assert report.backups == [tmp_path / "pi.sqlite.v21.bak"]  # before the destructive v22 step
        assert user_version(conn) == SCHEMA_VERSION
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 2
        assert conn.execute("SELECT value_json FROM kv").fetchone() == ('{"a":1}',)
        assert fts_hits(conn, "仍然可以") == ["s1-m2"]
        conn.execute("INSERT INTO boot_reports VALUES ('b1', 1, '{}')")
        plan = conn.execute(
            "EXPLAIN QUERY PLAN SELECT mid FROM messages WHERE turn_id = 't1'"
        ).fetchall()
        assert any("idx_messages_turn" in str(row[-1]) for row in plan)
        migrated = schema_objects(conn)
    finally:
        conn.close()
    assert migrated == fresh_layout(tmp_path, NOW_MS)  # same objects, same SQL as a fresh install
    conn, again = _open(tmp_path)
    conn.close()
    assert again.migrated_from is None  # already current


def _rebuild_kv_dropping_ui(conn: sqlite3.Connection) -> None:
    """A destructive step: table rebuild that also deletes rows."""
    conn.execute(
        "CREATE TABLE kv_new (ns TEXT NOT NULL, key TEXT NOT NULL, value_json TEXT NOT NULL,"
        " updated_at INTEGER NOT NULL, PRIMARY KEY (ns, key)) WITHOUT ROWID"
    )
    conn.execute("INSERT INTO kv_new SELECT * FROM kv WHERE ns <> 'ui'")
    conn.execute("DROP TABLE kv")
    conn.execute("ALTER TABLE kv_new RENAME TO kv")
    for statement in ddl_for_version(21)[-2:]:
        conn.execute(statement)


def test_destructive_step_gets_a_readable_backup_first(
    tmp_path: Path, v20_conn: sqlite3.Connection
) -> None:
    v20_conn.execute("INSERT INTO kv VALUES ('ui', 'sidebar', '{}', 1)")
    stale = tmp_path / f"pi.sqlite.v20.bak.tmp-{NOW_MS - 1}"
    stale.write_bytes(b"half-written backup from a crash")
    step = MigrationStep(21, "rebuild kv without ui rows", True, _rebuild_kv_dropping_ui)
    result = migrate(v20_conn, tmp_path / "pi.sqlite", [step, *STEPS[1:]], now_ms=NOW_MS)

    backup = tmp_path / "pi.sqlite.v20.bak"
    assert result.backups == [backup, tmp_path / "pi.sqlite.v21.bak"]
    assert result.applied == [21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32]
    assert user_version(v20_conn) == SCHEMA_VERSION
    assert v20_conn.execute("SELECT ns FROM kv ORDER BY ns").fetchall() == [("app",)]
    assert v20_conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1  # restored
    assert not (tmp_path / "pi.sqlite.v20.bak-wal").exists()
    assert not any("tmp" in name for name in listing(tmp_path))
    old = sqlite3.connect(f"file:{backup}?mode=ro", uri=True)
    try:
        assert user_version(old) == 20
        assert old.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        assert old.execute("SELECT ns FROM kv ORDER BY ns").fetchall() == [("app",), ("ui",)]
        assert old.execute("SELECT count(*) FROM messages").fetchone()[0] == 2
        assert old.execute("SELECT count(*) FROM sqlite_master WHERE name = 'boot_reports'").fetchone()[0] == 0
    finally:
        old.close()


def _half_then_fail(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE half_done (x)")
    conn.execute("INSERT INTO kv VALUES ('app', 'half', '1', 2)")
    conn.execute("DELETE FROM messages")
    raise RuntimeError("step blew up mid-way")


@pytest.mark.parametrize("destructive", [False, True])
def test_failing_step_rolls_back_and_leaves_v20_authoritative(
    tmp_path: Path, v20_conn: sqlite3.Connection, destructive: bool
) -> None:
    before = schema_objects(v20_conn)
    step = MigrationStep(21, "breaks", destructive, _half_then_fail)
    with pytest.raises(MigrationFailed, match="step blew up mid-way") as info:
        migrate(v20_conn, tmp_path / "pi.sqlite", [step, *STEPS[1:]], now_ms=NOW_MS)
    assert info.value.code == "MIGRATION_FAILED"
    assert "v20" in str(info.value)
    assert not v20_conn.in_transaction
    assert user_version(v20_conn) == 20
    assert schema_objects(v20_conn) == before
    assert v20_conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 2
    assert v20_conn.execute("SELECT count(*) FROM kv").fetchone()[0] == 1
    assert v20_conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    # a destructive step had taken its backup before failing; it stays for recovery
    assert (tmp_path / "pi.sqlite.v20.bak").exists() == destructive

    # once the step is fixed, the same file migrates
    assert migrate(v20_conn, tmp_path / "pi.sqlite", now_ms=NOW_MS).applied == list(range(21, 33))


def test_fault_before_commit_rolls_back_the_real_step(
    tmp_path: Path, v20_conn: sqlite3.Connection
) -> None:
    faults = Faults()
    faults.add("migrate.before_commit", action="raise")
    with pytest.raises(MigrationFailed, match="injected fault"):
        migrate(v20_conn, tmp_path / "pi.sqlite", now_ms=NOW_MS, faults=faults)
    assert user_version(v20_conn) == 20
    assert v20_conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'boot_reports'").fetchone()[0] == 0


def test_missing_step_fails_before_touching_anything(
    tmp_path: Path, v20_conn: sqlite3.Connection
) -> None:
    before = schema_objects(v20_conn)
    with pytest.raises(MigrationFailed, match="no migration step from schema version 20 to 21"):
        migrate(v20_conn, tmp_path / "pi.sqlite", [], now_ms=NOW_MS)
    assert user_version(v20_conn) == 20 and schema_objects(v20_conn) == before


def test_migrate_refuses_too_new_and_reset_versions_without_writing(tmp_path: Path) -> None:
    db = tmp_path / "pi.sqlite"
    _legacy_db(db, 3, wal=False)
    conn = connect_plain(db)
    try:
        with pytest.raises(MigrationFailed, match="pi.sqlite.v6.bak"):
            migrate(conn, db, now_ms=NOW_MS)
        conn.execute("PRAGMA user_version = 40")
        with pytest.raises(SchemaTooNew, match="40"):
            migrate(conn, db, now_ms=NOW_MS)
        assert user_version(conn) == 40
        assert conn.execute("SELECT count(*) FROM settings").fetchone()[0] == 50
    finally:
        conn.close()


def test_fresh_database_gets_the_full_schema_directly(tmp_path: Path) -> None:
    conn = connect_plain(tmp_path / "pi.sqlite")
    try:
        apply_pragmas(conn)
        result = migrate(conn, tmp_path / "pi.sqlite", now_ms=NOW_MS)
        assert result.created_fresh and result.applied == [] and result.to_version == SCHEMA_VERSION
        assert user_version(conn) == SCHEMA_VERSION
    finally:
        conn.close()


def test_v23_database_gets_the_v24_tables_and_columns_additively(tmp_path: Path) -> None:
    """23→24 only adds: every row is kept, no backup is taken, the layout is a fresh install's."""
    db = tmp_path / "pi.sqlite"
    build_db(db, ddl_for_version(23), 23)
    conn = connect_plain(db)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        add_session(conn, "s1", ["a plan session"])
        conn.execute("INSERT INTO turns(id, session_id, input_tokens, started_at, ended_at, status) "
                     "VALUES ('t1', 's1', 7, 1, 2, 'completed')")
        conn.execute(
            "INSERT INTO plan_approvals(request_id, session_id, turn_id, tool_call_id, plan_json, status, "
            "created_at, updated_at, execution_id, execution_state) "
            "VALUES ('p1', 's1', 't1', 'c1', '# plan', 'approved', 1, 1, 'x1', 'queued')")
    finally:
        conn.close()
    conn, report = _open(tmp_path)
    try:
        assert report.migrated_from == 23 and report.backups == []  # additive: nothing to back up
        assert user_version(conn) == SCHEMA_VERSION
        assert conn.execute("SELECT input_tokens, cost_micros, retry_of FROM turns").fetchall() == [(7, 0, None)]
        assert conn.execute("SELECT execution_state, execution_outcome, execution_turn_id FROM plan_approvals"
                            ).fetchall() == [("queued", None, None)]
        conn.execute("INSERT INTO approvals(request_id, session_id, turn_id, tool, risk, options_json, "
                     "requested_by, status, created_at, updated_at) "
                     "VALUES ('r1', 's1', 't1', 'Bash', 'high', '[]', 'sidecar', 'pending', 1, 1)")
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute("UPDATE plan_approvals SET execution_outcome = 'exploded'")
        conn.execute("INSERT INTO permission_rules(id, scope, tool, decision, created_at) "
                     "VALUES ('g1', 'global', 'Read', 'allow', 1)")
        with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
            conn.execute("INSERT INTO permission_rules(id, scope, tool, decision, created_at) "
                         "VALUES ('g2', 'global', 'Read', 'deny', 1)")
        migrated = schema_objects(conn)
    finally:
        conn.close()
    assert migrated == fresh_layout(tmp_path, NOW_MS)


def test_v24_database_gains_the_wire_columns_additively(tmp_path: Path) -> None:
    """24→25 only adds two nullable columns: rows indexed before keep NULL (their replies take the parsing
    path), no backup is taken, the layout is a fresh install's."""
    db = tmp_path / "pi.sqlite"
    build_db(db, ddl_for_version(24), 24)
    conn = connect_plain(db)
    try:
        add_session(conn, "s1", ["indexed before v25", "and another"])
    finally:
        conn.close()
    conn, report = _open(tmp_path)
    try:
        assert report.migrated_from == 24 and report.backups == []
        assert user_version(conn) == SCHEMA_VERSION
        assert conn.execute("SELECT seq, wire_cut, line_crc FROM messages ORDER BY seq").fetchall() == [
            (1, None, None), (2, None, None)]
        migrated = schema_objects(conn)
    finally:
        conn.close()
    assert migrated == fresh_layout(tmp_path, NOW_MS)
