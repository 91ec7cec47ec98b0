"""The guarded v8→v11 step fails closed on every malformed input seed 003 §7 names.

For each one: the database file is byte for byte what it was, the backup of the
starting version exists and is an exact readable copy, and ``pi-host serve``
exits non-zero with a message that names the offending row. Once the row is
fixed, the same file migrates.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from store.indexing.database import open_writer
from store.upgrade.migrations import MigrationFailed
from store.upgrade.schema import SCHEMA_VERSION
from tests.hostkit import run_cli, start_host_process
from tests.migrations.dbcheck import dump, sha256, sqlite3_cli, user_version
from tests.migrations.seedkit import SeedDir, build_seed_dir

Rows = dict[str, list[dict[str, Any]]]


def _settings(rows: Rows) -> dict[str, Any]:
    return next(r for r in rows["kv"] if (r["ns"], r["key"]) == ("app", "settings"))


def bad_settings_json(rows: Rows) -> None:
    _settings(rows)["value_json"] = '{"defaultMode": "chat", "language": '


def settings_not_an_object(rows: Rows) -> None:
    _settings(rows)["value_json"] = '["defaultMode", "chat"]'


def bad_task_config(rows: Rows) -> None:
    rows["scheduled_tasks"][1]["config_json"] = "{mode: chat}"


def invalid_session_mode(rows: Rows) -> None:
    rows["sessions"][2]["mode"] = "autopilot"


def invalid_task_mode(rows: Rows) -> None:
    rows["scheduled_tasks"][3]["config_json"] = '{"mode": "turbo", "extension": {"mode": "chat"}}'


def invalid_default_mode(rows: Rows) -> None:
    _settings(rows)["value_json"] = '{"defaultMode": "cruise"}'


def unknown_shell(rows: Rows) -> None:
    _settings(rows)["value_json"] = '{"defaultMode": "chat", "defaultCommandShell": "tcsh-9000"}'


def wrong_platform_shell(rows: Rows) -> None:
    _settings(rows)["value_json"] = '{"defaultMode": "chat", "defaultCommandShell": "cmd"}'


# (break the fixture, text the refusal must contain: the row and what is wrong with it)
CASES: dict[str, tuple[Callable[[Rows], None], str]] = {
    "bad-app-settings-json": (bad_settings_json, "kv row (ns='app', key='settings'): the app settings value is not "
                                                 "valid JSON"),
    "app-settings-not-an-object": (settings_not_an_object, "kv row (ns='app', key='settings'): the app settings "
                                                           "value must be a JSON object"),
    "bad-task-config-json": (bad_task_config, "scheduled_tasks row id='task-hourly': config_json is not valid JSON"),
    "invalid-session-mode": (invalid_session_mode, "sessions row id='s-gamma': mode 'autopilot' is not one of"),
    "invalid-task-mode": (invalid_task_mode, "scheduled_tasks row id='task-weekly': config_json mode 'turbo'"),
    "invalid-default-mode": (invalid_default_mode, "kv row (ns='app', key='settings'): defaultMode 'cruise'"),
    "unknown-shell": (unknown_shell, "defaultCommandShell 'tcsh-9000' is not a known shell id for linux"),
    "wrong-platform-shell": (wrong_platform_shell, "defaultCommandShell 'cmd' is a shell of win32, not of linux"),
}


def _broken(root: Path, version: int, case: str) -> SeedDir:
    return build_seed_dir(root, version, tweak=CASES[case][0])


@pytest.mark.parametrize("version", [7, 8, 9, 10])
@pytest.mark.parametrize("case", sorted(CASES))
def test_guarded_step_refuses_leaving_the_file_untouched(tmp_path: Path, case: str, version: int) -> None:
    seed = _broken(tmp_path, version, case)
    digest, before = sha256(seed.db), dump(seed.db)
    with pytest.raises(MigrationFailed) as info:
        open_writer(seed.db, quarantine_dir=tmp_path / "quarantine", now_ms=1, platform="linux")
    message = str(info.value)
    assert CASES[case][1] in message
    assert f"schema v{version} stays authoritative" in message
    assert info.value.code == "MIGRATION_FAILED"
    assert sha256(seed.db) == digest, "the refused file changed"
    assert not Path(f"{seed.db}-wal").exists() or Path(f"{seed.db}-wal").stat().st_size == 0
    backup = tmp_path / f"pi.sqlite.v{version}.bak"
    assert sorted(p.name for p in tmp_path.iterdir() if ".bak" in p.name) == [backup.name]
    assert sqlite3_cli(backup, "PRAGMA integrity_check; PRAGMA user_version;") == ["ok", str(version)]
    assert dump(backup) == before
    assert seed.file_bytes() == seed.files


def _serve(data: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("--data-dir", str(data), "serve", "--port", "0", "--quiet")


@pytest.mark.parametrize("case", sorted(CASES))
def test_pi_host_serve_exits_non_zero_naming_the_row(tmp_path: Path, case: str) -> None:
    seed = _broken(tmp_path / "data", 8, case)
    digest, before = sha256(seed.db), dump(seed.db)
    done = _serve(seed.root)
    assert done.returncode != 0
    assert CASES[case][1] in done.stderr, done.stderr[-3000:]
    assert "MIGRATION_FAILED" in done.stderr and "schema v8 stays authoritative" in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr  # one line, no traceback
    assert sha256(seed.db) == digest
    backup = seed.root / "pi.sqlite.v8.bak"
    assert sqlite3_cli(backup, "PRAGMA user_version;") == ["8"] and dump(backup) == before
    assert seed.file_bytes() == seed.files
    assert not (seed.root / "host.json").exists()


def test_fixing_the_row_lets_the_same_file_migrate(tmp_path: Path) -> None:
    seed = _broken(tmp_path / "data", 9, "invalid-session-mode")
    assert _serve(seed.root).returncode != 0
    conn = sqlite3.connect(seed.db)
    conn.execute("UPDATE sessions SET mode = 'chat' WHERE id = 's-gamma'")
    conn.commit()
    conn.close()
    host = start_host_process(seed.root)
    host.proc.send_signal(signal.SIGTERM)
    host.proc.communicate(timeout=60)
    assert host.proc.returncode == 0
    assert user_version(seed.db) == SCHEMA_VERSION
    conn = sqlite3.connect(seed.db)
    try:
        assert conn.execute("SELECT mode FROM sessions WHERE id = 's-gamma'").fetchone() == ("plan",)
    finally:
        conn.close()
    # the refused attempt's backup and the successful one's are both kept
    assert {p.name for p in seed.root.iterdir() if p.name.startswith("pi.sqlite.v9.bak")} >= {"pi.sqlite.v9.bak"}


def _to_rollback_journal(db: Path) -> None:
    """The same file in rollback-journal mode (what a plain ``sqlite3.connect`` script leaves)."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        assert conn.execute("PRAGMA journal_mode = DELETE").fetchone()[0] == "delete"
    finally:
        conn.close()


@pytest.mark.parametrize("case", ["bad-app-settings-json", "invalid-session-mode", "wrong-platform-shell"])
def test_a_rollback_journal_file_is_refused_byte_for_byte_too(tmp_path: Path, case: str) -> None:
    """Switching to WAL rewrites the header: the refusal must come before the writer's PRAGMAs."""
    seed = _broken(tmp_path, 8, case)
    _to_rollback_journal(seed.db)
    digest, before = sha256(seed.db), dump(seed.db)
    with pytest.raises(MigrationFailed) as info:
        open_writer(seed.db, quarantine_dir=tmp_path / "quarantine", now_ms=1, platform="linux")
    assert CASES[case][1] in str(info.value) and "schema v8 stays authoritative" in str(info.value)
    assert sha256(seed.db) == digest, "the refused file changed"
    assert not Path(f"{seed.db}-wal").exists() and not Path(f"{seed.db}-shm").exists()
    backup = tmp_path / "pi.sqlite.v8.bak"
    assert sorted(p.name for p in tmp_path.iterdir() if ".bak" in p.name) == [backup.name]
    assert sqlite3_cli(backup, "PRAGMA integrity_check; PRAGMA user_version;") == ["ok", "8"]
    assert dump(backup) == before


def test_a_rollback_journal_file_that_is_valid_migrates(tmp_path: Path) -> None:
    seed = build_seed_dir(tmp_path, 9)
    _to_rollback_journal(seed.db)
    conn, report = open_writer(seed.db, quarantine_dir=tmp_path / "quarantine", now_ms=1, platform="linux")
    conn.close()
    assert report.schema_version == SCHEMA_VERSION and report.migrated_from == 9
    assert user_version(seed.db) == SCHEMA_VERSION
    assert (tmp_path / "pi.sqlite.v9.bak").exists()


@pytest.mark.parametrize("journal", ["wal", "delete"])
def test_a_retried_refusal_adds_no_backup_per_try(tmp_path: Path, journal: str) -> None:
    """A launcher restarting a host that refuses its database (the row still bad, the file intact)
    kept the first refusal's backup and wrote another full copy per try."""
    seed = _broken(tmp_path, 8, "invalid-session-mode")
    if journal == "delete":
        _to_rollback_journal(seed.db)
    before = dump(seed.db)
    for attempt in range(4):
        with pytest.raises(MigrationFailed):
            open_writer(seed.db, quarantine_dir=tmp_path / "quarantine", now_ms=1_000 + attempt, platform="linux")
    assert sorted(p.name for p in tmp_path.iterdir() if ".bak" in p.name) == ["pi.sqlite.v8.bak"]
    assert dump(tmp_path / "pi.sqlite.v8.bak") == before == dump(seed.db)


def test_well_formed_values_with_integers_beyond_64_bits_migrate(tmp_path: Path) -> None:
    """Seed §7 fails closed on malformed values only: a settings blob or a task config that is valid
    JSON with an integer beyond 64 bits (a JavaScript number written as an integer literal) is
    rewritten exactly; the encoder refused it and the whole upgrade with it."""
    big = 123456789012345678901234567890

    def tweak(rows: Rows) -> None:
        settings = next(r for r in rows["kv"] if (r["ns"], r["key"]) == ("app", "settings"))
        value = json.loads(settings["value_json"])
        settings["value_json"] = json.dumps({**value, "installId": big})
        rows["scheduled_tasks"][0]["config_json"] = json.dumps({"mode": "chat", "seed": 2 ** 70})

    seed = build_seed_dir(tmp_path, 9, tweak=tweak)
    conn, _report = open_writer(seed.db, quarantine_dir=tmp_path / "quarantine", now_ms=1, platform="linux")
    try:
        settings = json.loads(conn.execute("SELECT value_json FROM kv WHERE ns = 'app' AND key = 'settings'")
                              .fetchone()[0])
        config = json.loads(conn.execute("SELECT config_json FROM scheduled_tasks").fetchone()[0])
    finally:
        conn.close()
    assert settings["installId"] == big and settings["defaultMode"] == "plan"
    assert config == {"mode": "plan", "seed": 2 ** 70}
