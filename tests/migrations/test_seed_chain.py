"""The seed's chain walked in place by ``store.indexing.database.open_writer`` (seed 003 §4, §7, §11.16).

Each database is built from the seed's DDL (``seed_sql/``) with rows in every
table; after one open it must be at this host's schema with every row there,
mapped as §7 says, and a readable exact backup before every step that needs one.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from store.errors import SchemaTooNew
from store.faults import Faults
from store.indexing.database import OpenReport, open_writer
from store.upgrade.migrations import MigrationFailed, SchemaUnknown, ddl_for_version
from store.upgrade.schema import SCHEMA_VERSION
from store.upgrade.schema_rebuild import normalize_sql
from tests.migrations.dbcheck import dump, file_layout, host_layout, seed_layout, sha256, sqlite3_cli, user_version
from tests.migrations.seedkit import (
    VERSIONS,
    assert_rows_present,
    build_seed_dir,
    create_seed_db,
    expected_rows,
    section,
    seed_sql,
)

SEED_STEPS = {7: 8, 8: 11, 9: 11, 10: 11, 11: 14, 14: 15, 15: 16, 16: 17, 17: 18, 18: 19, 19: 20}
HOST_STEPS = [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32]


def chain_from(version: int) -> list[int]:
    out = []
    while version < 20:
        version = SEED_STEPS[version]
        out.append(version)
    return out + [v for v in HOST_STEPS if v > version]


def backups_from(version: int) -> list[int]:
    """Every step of the seed's chain and the 19→20 bridge take one; ours only before v22."""
    seed = [version] + [v for v in chain_from(version) if v < 20]
    return seed + [21]


def _open(root: Path, now_ms: int = 1_800_000_000_000, faults: Faults | None = None,
          platform: str = "linux") -> tuple[sqlite3.Connection, OpenReport]:
    return open_writer(root / "pi.sqlite", quarantine_dir=root / "quarantine", now_ms=now_ms,
                       platform=platform, **({"faults": faults} if faults else {}))


def _schema(conn: sqlite3.Connection) -> set[tuple[str, str, str]]:
    return {(t, n, normalize_sql(s or "")) for t, n, s in conn.execute("SELECT type, name, sql FROM sqlite_master")}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_seed_version_reaches_ours_in_one_open_keeping_every_row(tmp_path: Path, version: int) -> None:
    root = tmp_path / "data"
    seed = build_seed_dir(root, version)
    before = dump(seed.db)
    conn, report = _open(root)
    try:
        assert report.steps == chain_from(version)
        assert report.migrated_from == version
        assert not report.rebuilt and not report.created_fresh
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert_rows_present(conn, expected_rows(seed))
        migrated = _schema(conn)
    finally:
        conn.close()
    # the same objects with the same definitions as a fresh install
    fresh_root = tmp_path / "fresh"
    fresh_root.mkdir()
    fresh, _ = _open(fresh_root)
    try:
        assert migrated == _schema(fresh)
    finally:
        fresh.close()
    # backups: named by the version they hold, readable by the sqlite3 shell, the first one exact
    names = [f"pi.sqlite.v{v}.bak" for v in backups_from(version)]
    assert [p.name for p in report.backups] == names
    assert sorted(p.name for p in root.iterdir() if ".bak" in p.name) == sorted(names)
    for name in names:
        held = int(name.split(".v")[1].split(".")[0])
        assert sqlite3_cli(root / name, "PRAGMA integrity_check; PRAGMA user_version;") == ["ok", str(held)]
    assert dump(root / names[0]) == before
    # files are never touched by the chain
    assert seed.file_bytes() == seed.files
    # a second open is a plain open
    digest = sha256(seed.db)
    conn, again = _open(root)
    conn.close()
    assert (again.steps, again.backups, again.migrated_from) == ([], [], None)
    assert sha256(seed.db) == digest
    assert sorted(p.name for p in root.iterdir() if ".bak" in p.name) == sorted(names)


@pytest.mark.parametrize("stop_after", [8, 11, 14, 15, 16, 17, 18, 19, 20, 21, 22])
def test_each_intermediate_version_has_exactly_that_versions_layout(tmp_path: Path, stop_after: int) -> None:
    """Walking from v7, the file at every step is the seed's (or our) layout of that version, no more."""
    seed = build_seed_dir(tmp_path, 7)
    faults = Faults()
    after = next(v for v in [*chain_from(7)] if v > stop_after)
    faults.add(f"migrate.{stop_after}_{after}.before_commit", action="raise")
    with pytest.raises(MigrationFailed, match="injected fault"):
        _open(tmp_path, faults=faults)
    assert user_version(seed.db) == stop_after
    want = seed_layout(stop_after) if stop_after <= 19 else host_layout(stop_after)
    assert file_layout(seed.db) == want
    # and the chain continues from there on the next open
    conn, report = _open(tmp_path)
    conn.close()
    assert report.steps == chain_from(stop_after)


def test_seed_11_16_v7_reaches_v8_then_takes_the_guarded_path(tmp_path: Path) -> None:
    """§11.16: v7 → v8 → guarded v8→v11; chat → plan in sessions, app default and task mode only;
    plan_approvals keep their fields and gain kind = 'plan'; exact readable v8/v9/v10 backups."""
    for version in (7, 8, 9, 10):
        root = tmp_path / f"v{version}"
        seed = build_seed_dir(root, version)
        before = dump(seed.db)
        conn, report = _open(root)
        try:
            assert report.steps[:2] == ([8, 11] if version == 7 else [11, 14])
            modes = dict(conn.execute("SELECT id, mode FROM sessions"))
            assert "chat" not in modes.values()
            assert modes["s-alpha"] == "plan" and modes["s-beta"] == "agent"
            settings = conn.execute("SELECT value_json FROM kv WHERE ns = 'app' AND key = 'settings'").fetchone()[0]
            assert '"defaultMode":"plan"' in settings and "planApprovalPermissionMode" not in settings
            assert '"largePasteThreshold":1200' in settings and '"defaultCommandShell":"bash"' in settings
            tasks = dict(conn.execute("SELECT id, config_json FROM scheduled_tasks"))
            assert '"mode":"plan"' in tasks["task-manual"] and '"extension":{"mode":"chat"}' in tasks["task-manual"]
            # another namespace's "mode" is not the app default: untouched
            assert conn.execute("SELECT value_json FROM kv WHERE ns = 'plugin:acme'").fetchone()[0] == (
                '{"enabled":true,"mode":"chat"}')
            if version >= 8:
                kinds = dict(conn.execute("SELECT request_id, kind FROM plan_approvals"))
                assert set(kinds.values()) == {"plan"} and len(kinds) == 6
            if version >= 10:
                row = conn.execute("SELECT artifact_relative_path, artifact_size_bytes FROM plan_approvals "
                                   "WHERE request_id = 'pa-2'").fetchone()
                assert row == (".pi/plan/approved-1.md", 16)
        finally:
            conn.close()
        guarded_backup = root / f"pi.sqlite.v{max(version, 8)}.bak"
        assert sqlite3_cli(guarded_backup, "PRAGMA user_version; SELECT mode FROM sessions WHERE id = 's-alpha';") \
            == [str(max(version, 8)), "chat"]
        if version > 7:
            assert dump(guarded_backup) == before
        assert_rows_present(sqlite3.connect(f"file:{guarded_backup}?mode=ro", uri=True),
                            {t: seed.rows[t] for t in ("sessions", "scheduled_tasks", "kv")})


def test_guarded_backup_is_taken_after_a_wal_checkpoint(tmp_path: Path) -> None:
    """Rows committed only to the -wal (another connection still open) are in pi.sqlite.v8.bak."""
    seed = build_seed_dir(tmp_path, 8)
    other = sqlite3.connect(seed.db, isolation_level=None)
    try:
        other.execute("PRAGMA wal_autocheckpoint = 0")
        other.execute("INSERT INTO kv VALUES ('ui', 'only-in-wal', '1', 1)")
        assert Path(f"{seed.db}-wal").stat().st_size > 0
        conn, report = _open(tmp_path)
        conn.close()
    finally:
        other.close()
    assert sqlite3_cli(tmp_path / "pi.sqlite.v8.bak", "SELECT value_json FROM kv WHERE key = 'only-in-wal';") == ["1"]


def test_v8_file_that_already_made_plan_approvals_from_the_current_ddl_keeps_each_kind(tmp_path: Path) -> None:
    """§7 item 8: kind is added only when absent; a goal row stays a goal."""
    current = section(17, "§4.6a")
    statements = seed_sql(8).replace(section(8, "§4.6a"), current)

    def goal_rows(rows: dict[str, list[dict[str, object]]]) -> None:
        for row in rows["plan_approvals"]:
            row.update({"kind": "plan", "title": "", "question": "", "artifact_relative_path": None,
                        "artifact_sha256": None, "artifact_size_bytes": None, "version": 1,
                        "execution_id": None, "execution_state": None})
        rows["plan_approvals"][0]["kind"] = "goal"
        rows["plan_approvals"][1].update({"execution_id": "exec-early", "execution_state": "completed"})

    seed = build_seed_dir(tmp_path, 8, tweak=goal_rows, statements=statements)
    conn, _ = _open(tmp_path)
    try:
        assert dict(conn.execute("SELECT request_id, kind FROM plan_approvals WHERE kind = 'goal'")) == {"pa-1": "goal"}
        assert conn.execute("SELECT execution_id FROM plan_approvals WHERE request_id = 'pa-2'").fetchone() == (
            "exec-early",)
        assert_rows_present(conn, expected_rows(seed), tables=["plan_approvals", "sessions", "kv"])
    finally:
        conn.close()


@pytest.mark.parametrize("version", [12, 13, SCHEMA_VERSION + 1, 99])
def test_versions_no_release_wrote_and_newer_ones_are_refused_untouched(tmp_path: Path, version: int) -> None:
    db = tmp_path / "pi.sqlite"
    create_seed_db(db, version, statements=seed_sql(17))
    digest = sha256(db)
    expected = SchemaTooNew if version > SCHEMA_VERSION else SchemaUnknown
    with pytest.raises(expected, match=f"schema version {version}"):
        _open(tmp_path)
    assert sha256(db) == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pi.sqlite"]


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5, 6])
def test_seed_11_5_pre_v7_is_archived_as_v6_bak_and_a_fresh_file_starts(tmp_path: Path, version: int) -> None:
    """§11.5: versions 1–6 are archived (not migrated) and a fresh file starts; reopening is a plain open."""
    db = tmp_path / "pi.sqlite"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.executescript("CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT);"
                       "INSERT INTO settings VALUES ('theme', 'dark');"
                       f"PRAGMA user_version = {version};")
    conn.close()
    before = dump(db)
    conn, report = _open(tmp_path)
    try:
        assert report.archived_to == tmp_path / "pi.sqlite.v6.bak"
        assert report.created_fresh and report.steps == []
        assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0
    finally:
        conn.close()
    assert dump(tmp_path / "pi.sqlite.v6.bak") == before
    assert sqlite3_cli(tmp_path / "pi.sqlite.v6.bak", "SELECT value FROM settings;") == ["dark"]
    conn, again = _open(tmp_path)
    conn.close()
    assert (again.archived_to, again.created_fresh, again.steps) == (None, False, [])
    assert sorted(p.name for p in tmp_path.iterdir() if ".bak" in p.name) == ["pi.sqlite.v6.bak"]


def test_host_layouts_are_the_ones_the_chain_continues_from() -> None:
    """The bridge's target is our v20 DDL; the seed's v19 file is a different layout."""
    assert host_layout(20) != seed_layout(19)
    assert set(seed_layout(19)["tables"]) < set(host_layout(20)["tables"])
    assert ddl_for_version(20)
