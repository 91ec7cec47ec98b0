"""Seed 003 §7 ("Versioning, v7 reset, and v8-to-v15 migration") and acceptance items 5 and 16 of §11 read by
an outsider: data directories at seed versions built from the seed's own DDL (tests/migrations/seed_sql),
opened by a real ``pi-host serve`` process, for what tests/migrations leaves open:

* files a seed-era host left with committed rows still in their ``-wal`` (it was killed, not closed): the
  pre-v7 reset and the guarded step must checkpoint before they archive or back up;
* a pre-v7 reset next to an archive an earlier reset left, and a SIGKILL inside the reset;
* refusals from every version that takes the guarded path, and the malformed values a demanding reader
  finds in the words "malformed", "invalid mode", "invalid default shell" beyond the ones tests/migrations
  names; the exit status and the one-line reason;
* nasty-but-legal values the guarded step must carry exactly (nested modes, a shell that is valid but not
  installed, settings it must not touch);
* a SIGKILL inside the guarded step: every backup of the starting version stays an exact copy of it;
* ``plan_approvals.kind`` as the text defines it in the migrated file.

Each test quotes the sentence it checks.
"""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import open_client
from store.upgrade.schema import SCHEMA_VERSION
from tests.acceptance.outsiderkit import code_of, say
from tests.hostkit import HostProcess, run_cli, serve_until_exit, start_host_process
from tests.migrations.dbcheck import boot_report, dump, sha256, sqlite3_cli, user_version
from tests.migrations.seedkit import (
    after_boot,
    assert_rows_present,
    build_seed_dir,
    expected_rows,
)

Rows = dict[str, list[dict[str, Any]]]
EXIT_STORE_REFUSED = 5  # runtime/cli_serve.py: a StoreError at start ("cannot open the data directory")


def _stop(host: HostProcess) -> None:
    assert host.terminate(60) == 0


def _serve(data: Path) -> Any:
    return run_cli("--data-dir", str(data), "serve", "--port", "0", "--quiet")


def _backups(data: Path) -> list[str]:
    return sorted(p.name for p in data.iterdir() if ".bak" in p.name)


async def _read(host: HostProcess) -> dict[str, Any]:
    async with open_client(host.url, host.token, client_id="mig-outsider", client_kind="test") as c:
        return {
            "alpha": await c.call("session.get", {"sessionId": "s-alpha", "messageLimit": 50}),
            "list": await c.call("session.list", {}),
            "settings": await c.call("settings.get", {"ns": "app", "key": "settings"}),
            "tasks": await c.call("tasks.list", {}),
        }


def _open_and_read(data: Path) -> dict[str, Any]:
    host = start_host_process(data)
    try:
        return trio.run(_read, host)
    finally:
        _stop(host)


def _leave_in_wal(db: Path, *statements: str) -> None:
    """Run ``statements`` on ``db`` and leave the result where a killed seed-era host-core leaves it:
    committed in ``-wal`` (with its ``-shm``), not yet checkpointed into the main file."""
    stage = db.parent / ".stage"
    stage.mkdir()
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("PRAGMA wal_autocheckpoint = 0")
        for statement in statements:
            holder.execute(statement)
        assert Path(f"{db}-wal").stat().st_size > 0
        for suffix in ("", "-wal", "-shm"):
            shutil.copyfile(f"{db}{suffix}", stage / f"db{suffix}")
    finally:
        holder.close()  # checkpoints and removes the -wal: put the crash-left copies back
    for suffix in ("", "-wal", "-shm"):
        shutil.copyfile(stage / f"db{suffix}", f"{db}{suffix}")
    shutil.rmtree(stage)


def _main_file_alone(db: Path, sql: str) -> list[str]:
    """``sql`` on the main file without its ``-wal`` (what the archive/backup would hold unchecked)."""
    return sqlite3_cli(db, sql)  # immutable=1 reads the main file only


# --- §11.5 / §7 bullet 2: the v7 reset -------------------------------------------------------------------


def test_pre_v7_file_killed_with_rows_in_its_wal_is_checkpointed_into_the_v6_archive(tmp_path: Path) -> None:
    """§7: "Opening a database with user_version 1–6 WAL-checkpoints it, renames it to pi.sqlite.v6.bak
    (removing stale -wal/-shm siblings), and bootstraps a fresh v7 file. Sessions, providers, and settings
    from the old file are not carried over; the archive remains for manual recovery." §11.5: "reopening the
    fresh file is a plain open".

    The old file's version number and a row exist only in its -wal: the host must read through the WAL to see
    a pre-v7 file at all, and the archive must hold them in one self-contained file."""
    data = tmp_path / "data"
    seed = build_seed_dir(data, 7)
    _leave_in_wal(seed.db, "INSERT INTO kv VALUES ('ui', 'only-in-wal', '\"kept\"', 1)", "PRAGMA user_version = 4")
    assert _main_file_alone(seed.db, "PRAGMA user_version;") == ["7"]  # the main file alone says 7
    seen = _open_and_read(data)
    # the archive: one file, no -wal/-shm of its own, holding what the -wal held
    assert _backups(data) == ["pi.sqlite.v6.bak"]
    assert sqlite3_cli(data / "pi.sqlite.v6.bak",
                       "PRAGMA integrity_check; PRAGMA user_version; "
                       "SELECT value_json FROM kv WHERE key = 'only-in-wal'; SELECT count(*) FROM sessions;") == [
        "ok", "4", '"kept"', "4"]
    # nothing of the old file was carried over; the transcripts are the source of truth again
    conn = sqlite3.connect(seed.db)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("SELECT count(*) FROM kv WHERE key = 'only-in-wal'").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM providers WHERE id = 'p-openai'").fetchone()[0] == 0
    finally:
        conn.close()
    assert "updatedAt" not in seen["settings"]
    assert [m["id"] for m in seen["alpha"]["messages"]] == ["m-a1", "m-a2", "m-a3", "m-a4", "m-a5"]
    assert seed.file_bytes() == seed.files
    _stop(start_host_process(data))
    report = boot_report(seed.db)
    assert (report["database"]["archivedTo"], report["database"]["createdFresh"], report["database"]["steps"]) == (
        None, False, [])
    assert _backups(data) == ["pi.sqlite.v6.bak"]


def test_pre_v7_reset_never_replaces_an_archive_an_earlier_reset_left(tmp_path: Path) -> None:
    """§7: "... renames it to pi.sqlite.v6.bak ... the archive remains for manual recovery." A second reset
    (a user put back another pre-v7 file) must not destroy the first archive the sentence promises."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    first = data / "pi.sqlite.v6.bak"
    conn = sqlite3.connect(first, isolation_level=None)
    conn.executescript("CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT);"
                       "INSERT INTO settings VALUES ('theme', 'first archive'); PRAGMA user_version = 3;")
    conn.close()
    first_bytes = first.read_bytes()
    conn = sqlite3.connect(data / "pi.sqlite", isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.executescript("CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT);"
                       "INSERT INTO settings VALUES ('theme', 'second file'); PRAGMA user_version = 6;")
    conn.close()
    _stop(start_host_process(data))
    assert first.read_bytes() == first_bytes, "the earlier archive was replaced"
    newer = [n for n in _backups(data) if n != first.name]
    assert len(newer) == 1 and newer[0].startswith("pi.sqlite.v6.bak"), _backups(data)
    assert sqlite3_cli(data / newer[0], "PRAGMA user_version; SELECT value FROM settings;") == ["6", "second file"]
    assert user_version(data / "pi.sqlite") == SCHEMA_VERSION


@pytest.mark.parametrize("point", ["db.reset.after_archive", "migrate.before_fresh_schema"])
def test_sigkill_inside_the_pre_v7_reset_then_a_restart_finishes_it_once(tmp_path: Path, point: str) -> None:
    """§11.5: "Opening a pre-v7 database archives it as pi.sqlite.v6.bak and starts a fresh v7 file;
    reopening the fresh file is a plain open" — also when the process is killed between the archive and the
    fresh schema: one archive (the old file, whole), one fresh file, the transcripts indexed again."""
    data = tmp_path / "data"
    seed = build_seed_dir(data, 7)
    conn = sqlite3.connect(seed.db)
    conn.execute("PRAGMA user_version = 6")
    conn.close()
    before = dump(seed.db)
    assert serve_until_exit(data, env={"RT_CRASHPOINT": f"{point}:1:kill"}) == -signal.SIGKILL
    assert _backups(data) == ["pi.sqlite.v6.bak"]
    seen = _open_and_read(data)
    assert _backups(data) == ["pi.sqlite.v6.bak"], "the restart archived again"
    assert dump(data / "pi.sqlite.v6.bak") == before
    assert user_version(seed.db) == SCHEMA_VERSION
    assert [m["id"] for m in seen["alpha"]["messages"]] == ["m-a1", "m-a2", "m-a3", "m-a4", "m-a5"]
    assert {"s-alpha", "s-beta", "s-gamma", "s-delta"} <= {s["id"] for s in seen["list"]["sessions"]}
    assert seed.file_bytes() == seed.files
    _stop(start_host_process(data))
    report = boot_report(seed.db)
    assert (report["database"]["archivedTo"], report["database"]["createdFresh"]) == (None, False)
    assert _backups(data) == ["pi.sqlite.v6.bak"]


# --- §11.16: fail closed ------------------------------------------------------------------------------------


def _settings_row(rows: Rows) -> dict[str, Any]:
    return next(r for r in rows["kv"] if (r["ns"], r["key"]) == ("app", "settings"))


def _settings_with(**changes: Any) -> Callable[[Rows], None]:
    def tweak(rows: Rows) -> None:
        row = _settings_row(rows)
        value = json.loads(row["value_json"])
        value.update(changes)
        row["value_json"] = json.dumps(value)
    return tweak


def _settings_text(text: str) -> Callable[[Rows], None]:
    def tweak(rows: Rows) -> None:
        _settings_row(rows)["value_json"] = text
    return tweak


def _task_config(text: str, index: int = 0) -> Callable[[Rows], None]:
    def tweak(rows: Rows) -> None:
        rows["scheduled_tasks"][index]["config_json"] = text
    return tweak


def _session_mode(mode: Any) -> Callable[[Rows], None]:
    def tweak(rows: Rows) -> None:
        rows["sessions"][1]["mode"] = mode
    return tweak


# Beyond tests/migrations/test_fail_closed.py: values that are not a mode, a shell or JSON in other ways.
MALFORMED: dict[str, Callable[[Rows], None]] = {
    "default-mode-null": _settings_with(defaultMode=None),
    "default-mode-number": _settings_with(defaultMode=1),
    "default-mode-capitalised": _settings_with(defaultMode="Chat"),
    "default-mode-list": _settings_with(defaultMode=["chat"]),
    "default-mode-empty": _settings_with(defaultMode=""),
    "shell-null": _settings_with(defaultCommandShell=None),
    "shell-empty": _settings_with(defaultCommandShell=""),
    "shell-capitalised": _settings_with(defaultCommandShell="Bash"),
    "shell-a-path": _settings_with(defaultCommandShell="/bin/bash"),
    "settings-empty-text": _settings_text(""),
    "settings-json-null": _settings_text("null"),
    "settings-trailing-garbage": _settings_text('{"defaultMode": "chat"} x'),
    "settings-nan": _settings_text('{"defaultMode": "chat", "zoom": NaN}'),
    "task-config-null": _task_config("null"),
    "task-config-array": _task_config('[{"mode": "chat"}]'),
    "task-config-empty": _task_config(""),
    "task-mode-null": _task_config('{"mode": null}'),
    "task-mode-capitalised": _task_config('{"mode": "CHAT"}'),
    "session-mode-empty": _session_mode(""),
    "session-mode-padded": _session_mode("chat "),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_values_refuse_the_guarded_step_with_the_file_intact(tmp_path: Path, case: str) -> None:
    """§7 item 9: "A malformed app-settings value, malformed scheduled-task config_json, invalid session or
    top-level scheduled mode, unknown or wrong-platform defaultCommandShell, parse, constraint, or write
    failure fails closed, rolls back the transaction, and leaves the pre-migration schema authoritative; the
    backup remains available for recovery." Item 6: "validates all new mode values as plan | goal | agent";
    item 7: "validates defaultCommandShell as a known current-platform catalog ID"."""
    data = tmp_path / "data"
    seed = build_seed_dir(data, 8, tweak=MALFORMED[case])
    digest, before = sha256(seed.db), dump(seed.db)
    done = _serve(data)
    assert done.returncode == EXIT_STORE_REFUSED, (done.returncode, done.stderr[-2000:])
    assert "MIGRATION_FAILED" in done.stderr and "schema v8 stays authoritative" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert sha256(seed.db) == digest and user_version(seed.db) == 8
    assert _backups(data) == ["pi.sqlite.v8.bak"] and dump(data / "pi.sqlite.v8.bak") == before
    assert seed.file_bytes() == seed.files
    assert not (data / "host.json").exists()


@pytest.mark.parametrize("version", [7, 9, 10])
def test_every_version_on_the_guarded_path_refuses_through_serve(tmp_path: Path, version: int) -> None:
    """§7: "Schema v7 first reaches v8, then uses the guarded path ... schema-v9 and schema-v10 databases take
    the same guarded path"; a refusal "leaves the pre-migration schema authoritative; the backup remains
    available for recovery" — for the v7, v9 and v10 files, through the host, not only for v8."""
    data = tmp_path / "data"
    seed = build_seed_dir(data, version, tweak=_settings_with(defaultCommandShell="powershell"))
    digest, before = sha256(seed.db), dump(seed.db)
    done = _serve(data)
    assert done.returncode == EXIT_STORE_REFUSED, (done.returncode, done.stderr[-2000:])
    assert f"schema v{version} stays authoritative" in done.stderr
    assert "defaultCommandShell 'powershell'" in done.stderr
    assert sha256(seed.db) == digest and user_version(seed.db) == version
    backups = _backups(data)
    assert backups and all(dump(data / name) == before for name in backups), backups
    assert f"pi.sqlite.v{version}.bak" in backups


def test_a_refused_file_killed_with_rows_in_its_wal_keeps_them_and_backs_them_up(tmp_path: Path) -> None:
    """§7: "Before migration, host-core checkpoints the WAL, then creates the exact readable pi.sqlite.v8.bak";
    a refusal "leaves the pre-migration schema authoritative; the backup remains available for recovery". The
    bad row and a good one exist only in the -wal a killed seed host left."""
    data = tmp_path / "data"
    seed = build_seed_dir(data, 8)
    _leave_in_wal(seed.db, "INSERT INTO kv VALUES ('ui', 'only-in-wal', '\"kept\"', 1)",
                  "UPDATE sessions SET mode = 'autopilot' WHERE id = 's-beta'")
    done = _serve(data)
    assert done.returncode == EXIT_STORE_REFUSED, done.stderr[-2000:]
    assert "sessions row id='s-beta': mode 'autopilot'" in done.stderr
    for path in (seed.db, data / "pi.sqlite.v8.bak"):
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            assert conn.execute("PRAGMA user_version").fetchone()[0] == 8
            assert conn.execute("SELECT value_json FROM kv WHERE key = 'only-in-wal'").fetchone() == ('"kept"',)
            assert conn.execute("SELECT mode FROM sessions WHERE id = 's-beta'").fetchone() == ("autopilot",)
        finally:
            conn.close()
    # the backup is readable on its own (no -wal of its own holds the rows)
    assert sqlite3_cli(data / "pi.sqlite.v8.bak", "SELECT value_json FROM kv WHERE key = 'only-in-wal';") == [
        '"kept"']


# --- §11.16: what the guarded step carries -----------------------------------------------------------------


NASTY_SETTINGS: dict[str, Any] = {
    "defaultMode": "chat",
    "planApprovalPermissionMode": "accept-edits",
    "defaultCommandShell": "fish",  # a linux catalog id, likely not installed: kept for the runtime fallback
    "profiles": {"work": {"defaultMode": "chat", "planApprovalPermissionMode": "ask"}},
    "recentModes": ["chat", "agent"],
    "": "an empty key",
    "emoji 😀": "line\u2028separator\u0000nul \"quoted\" \\ back",
    "zoom": 1.25,
    "tiny": 1e-7,
    "huge": 1.7976931348623157e308,
    "negative": -42,
    "nothing": None,
    "deep": {"a": [{"b": {"mode": "chat"}}]},
    "largePasteThreshold": 777,
}


def _nasty(rows: Rows) -> None:
    _settings_row(rows)["value_json"] = json.dumps(NASTY_SETTINGS, ensure_ascii=False)
    tasks = rows["scheduled_tasks"]
    tasks[0]["config_json"] = json.dumps({"mode": "chat", "extension": {"mode": "chat"},
                                          "steps": [{"mode": "chat"}], "note": "模式 chat"}, ensure_ascii=False)
    tasks[1]["config_json"] = '{ "mode" : "plan",\n  "spaced": true }'  # needs no change
    tasks[2]["config_json"] = '{"schedule": {"hour": 9, "minute": 30}, "Mode": "chat"}'  # no top-level "mode"
    tasks[3]["config_json"] = '{"mode": "agent", "extension": {"mode": "chat"}}'
    for row in rows["kv"]:
        if (row["ns"], row["key"]) == ("app", "currentProjectId"):
            row["value_json"] = '{"defaultMode": "chat"}'  # another key of the app namespace: not the blob


@pytest.mark.parametrize("version", [7, 10])
def test_the_guarded_step_maps_only_top_level_chat_and_keeps_every_other_value(tmp_path: Path,
                                                                                 version: int) -> None:
    """§7 items 2, 3 and 7: "parses the structured app settings value and maps its top-level defaultMode:
    "chat" to "plan""; "parses each scheduled task's config_json and maps its top-level stored mode: "chat"
    to "plan", leaving nested extension modes untouched"; "validates defaultCommandShell as a known
    current-platform catalog ID, retaining a valid ID that is temporarily unavailable"; "Legacy
    planApprovalPermissionMode is removed from the app settings JSON during migration; all unrelated
    settings remain intact"."""
    data = tmp_path / "data"
    seed = build_seed_dir(data, version, tweak=_nasty)
    raw_tasks = {r["id"]: r["config_json"] for r in seed.rows["scheduled_tasks"]}
    seen = _open_and_read(data)
    conn = sqlite3.connect(seed.db)
    try:
        stored = json.loads(conn.execute("SELECT value_json FROM kv WHERE ns = 'app' AND key = 'settings'")
                            .fetchone()[0])
        configs = dict(conn.execute("SELECT id, config_json FROM scheduled_tasks"))
        other = conn.execute("SELECT value_json FROM kv WHERE ns = 'app' AND key = 'currentProjectId'").fetchone()
    finally:
        conn.close()
    want = {k: v for k, v in NASTY_SETTINGS.items() if k != "planApprovalPermissionMode"}
    want["defaultMode"] = "plan"
    assert stored == want
    assert seen["settings"]["value"]["defaultCommandShell"] == "fish"
    assert seen["settings"]["value"]["profiles"] == NASTY_SETTINGS["profiles"]
    assert seen["settings"]["value"]["defaultMode"] == "plan"
    assert other == ('{"defaultMode": "chat"}',)
    assert json.loads(configs["task-manual"]) == {"mode": "plan", "extension": {"mode": "chat"},
                                                  "steps": [{"mode": "chat"}], "note": "模式 chat"}
    for tid in ("task-hourly", "task-weekly"):
        assert json.loads(configs[tid]) == json.loads(raw_tasks[tid]), tid
    assert json.loads(configs["task-daily"])["Mode"] == "chat"
    assert "mode" not in json.loads(configs["task-daily"])


def test_a_sigkill_inside_the_guarded_step_keeps_every_backup_an_exact_copy(tmp_path: Path) -> None:
    """§7: "Before migration, host-core checkpoints the WAL, then creates the exact readable pi.sqlite.v8.bak;
    both happen before destructive work. Within one atomic transaction it: ..."; §11.16 "schema v9 and v10
    receive pi.sqlite.v9.bak / pi.sqlite.v10.bak". Killed after the backup and again before the commit, then
    started: the mapping is done once, nothing is lost, and every v9 backup on disk is the v9 file."""
    data = tmp_path / "data"
    seed = build_seed_dir(data, 9)
    _leave_in_wal(seed.db, "INSERT INTO kv VALUES ('ui', 'only-in-wal', '\"kept\"', 1)")
    conn = sqlite3.connect(f"file:{seed.db}?mode=ro", uri=True)
    before = list(conn.iterdump())
    conn.close()
    for point in ("migrate.9_11.after_backup", "migrate.9_11.before_commit"):
        assert serve_until_exit(data, env={"RT_CRASHPOINT": f"{point}:1:kill"}) == -signal.SIGKILL, point
        assert user_version(seed.db) == 9
    seen = _open_and_read(data)
    v9 = [n for n in _backups(data) if n.startswith("pi.sqlite.v9.bak")]
    assert v9 and "pi.sqlite.v9.bak" in v9
    for name in v9:
        assert sqlite3_cli(data / name, "PRAGMA integrity_check;") == ["ok"], name
        assert dump(data / name) == before, name
        assert not Path(f"{data / name}-wal").exists()
    assert user_version(seed.db) == SCHEMA_VERSION
    conn = sqlite3.connect(seed.db)
    try:
        assert_rows_present(conn, after_boot(expected_rows(seed)))
        assert conn.execute("SELECT value_json FROM kv WHERE key = 'only-in-wal'").fetchone() == ('"kept"',)
        assert "chat" not in {m for (m,) in conn.execute("SELECT mode FROM sessions")}
    finally:
        conn.close()
    assert seen["settings"]["value"]["defaultMode"] == "plan"
    assert [m["id"] for m in seen["alpha"]["messages"]] == ["m-a1", "m-a2", "m-a3", "m-a4", "m-a5"]
    assert seed.file_bytes() == seed.files


def test_plan_approvals_kind_is_the_column_the_text_defines(tmp_path: Path) -> None:
    """§7 item 8: "adds plan_approvals.kind (NOT NULL DEFAULT 'plan', checked against plan | goal) when the
    column is absent ... existing rows are Plan contracts by definition, which is exactly the column
    default"; item 4: "preserves/migrates the existing plan_approvals table and adds its artifact and
    execution fields/indexes"."""
    data = tmp_path / "data"
    seed = build_seed_dir(data, 8)
    ids = sorted(r["request_id"] for r in seed.rows["plan_approvals"])
    _stop(start_host_process(data))
    conn = sqlite3.connect(seed.db)
    try:
        columns = {r[1]: r for r in conn.execute("PRAGMA table_info(plan_approvals)")}
        assert columns["kind"][3] == 1 and columns["kind"][4] == "'plan'"
        for name in ("artifact_relative_path", "artifact_sha256", "artifact_size_bytes", "execution_id",
                     "execution_state"):
            assert name in columns, name
        assert sorted(r for (r,) in conn.execute("SELECT request_id FROM plan_approvals")) == ids
        assert {k for (k,) in conn.execute("SELECT kind FROM plan_approvals")} == {"plan"}
        row = conn.execute("SELECT session_id, turn_id, plan_json, status, created_at FROM plan_approvals "
                           "WHERE request_id = ?", (ids[0],)).fetchone()
        conn.execute("SAVEPOINT probe")
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("UPDATE plan_approvals SET kind = 'chat' WHERE request_id = ?", (ids[0],))
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("UPDATE plan_approvals SET kind = NULL WHERE request_id = ?", (ids[0],))
        conn.execute("UPDATE plan_approvals SET kind = 'goal' WHERE request_id = ?", (ids[0],))
        conn.execute("ROLLBACK TO probe")
        assert row is not None
        names = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE tbl_name = 'plan_approvals' "
                                            "AND type = 'index'")}
        assert {"idx_plan_approvals_execution_queue", "idx_plan_approvals_execution_id"} <= names, names
    finally:
        conn.close()


# --- §7 last bullets: the boot fence over migrated rows ---------------------------------------------------


def _fence_rows(rows: Rows) -> None:
    pending = next(r for r in rows["plan_approvals"] if r["request_id"] == "pa-1")
    pending["expires_at"] = None  # no deadline: interrupted, not expired
    for row in rows["sessions"]:
        if row["id"] == "s-alpha":
            row["mode"] = "agent"  # pa-2, approved, its execution queued


async def _respond_to_migrated(host: HostProcess) -> dict[str, Any]:
    async with open_client(host.url, host.token, client_id="mig-fence", client_kind="ui") as c:
        out: dict[str, Any] = {"pending": await c.call("plans.pending", {})}
        for request in ("pa-1", "pa-2"):
            out[request] = await code_of(c, "plans.respond", {"requestId": request, "action": "approve",
                                                              "targetPermissionMode": "ask"})
        out["alpha"] = await c.call("session.get", {"sessionId": "s-alpha", "messageLimit": 1})
        out["gamma"] = await c.call("session.get", {"sessionId": "s-gamma", "messageLimit": 1})
        return out


@pytest.mark.parametrize("version", [10, 14])
def test_migrated_approvals_and_executions_are_interrupted_and_no_old_response_is_accepted(
        tmp_path: Path, version: int) -> None:
    """§7: "On startup, one transaction marks every pending approval and every queued or running execution
    state in plan_approvals as interrupted; associated running turns are marked aborted before RPC service
    begins. Pending sessions remain in their contract mode and already-approved queued/running sessions
    remain Agent. No approval response or execution from before the restart is accepted." — for rows a
    seed-era host wrote, on the first start after the migration."""
    data = tmp_path / "data"
    seed = build_seed_dir(data, version, tweak=_fence_rows)
    gamma_mode = next(r["mode"] for r in seed.rows["sessions"] if r["id"] == "s-gamma")
    host = start_host_process(data)
    try:
        seen = trio.run(_respond_to_migrated, host)
    finally:
        _stop(host)
    assert seen["pending"]["pending"] == []
    assert (seen["pa-1"], seen["pa-2"]) == ("CONFLICT", "CONFLICT")  # protocol: stale responses are CONFLICT
    assert seen["alpha"]["session"]["mode"] == "agent"
    assert seen["gamma"]["session"]["mode"] == {"chat": "plan"}.get(gamma_mode, gamma_mode)
    conn = sqlite3.connect(seed.db)
    try:
        states = {r: (s, e) for r, s, e in conn.execute(
            "SELECT request_id, status, execution_state FROM plan_approvals")}
        running = conn.execute("SELECT count(*) FROM turns WHERE status = 'running'").fetchone()[0]
    finally:
        conn.close()
    assert states["pa-1"][0] == "interrupted"
    if version >= 11:
        assert states["pa-2"] == ("approved", "interrupted")
    assert running == 0


def _deep(depth: int) -> Any:
    value: Any = {"leaf": "chat"}
    for i in range(depth - 1):
        value = [value] if i % 2 else {"mode": "chat", "next": value}
    return value


def _well_formed_but_deep(rows: Rows) -> None:
    row = _settings_row(rows)
    value = json.loads(row["value_json"])
    value["layout"] = _deep(100)  # 100 containers: what serde_json (limit 128) and JSON.parse both accept
    value["serial"] = int("9" * 120)  # an integer literal of 120 digits: well-formed JSON
    row["value_json"] = json.dumps(value)
    rows["scheduled_tasks"][0]["config_json"] = json.dumps({"mode": "chat", "tree": _deep(90)})


def test_well_formed_deep_settings_and_task_config_migrate_and_read_back(tmp_path: Path) -> None:
    """§7 item 2/3: the guarded step "parses the structured app settings value" and "parses each scheduled
    task's config_json"; only "A malformed app-settings value, malformed scheduled-task config_json ... fails
    closed". A value nested 100 deep, or holding a 120-digit integer, is well-formed JSON (the host's own
    settings reader parses it): it must migrate, mapped, the rest of it exactly as it was."""
    data = tmp_path / "data"
    seed = build_seed_dir(data, 9, tweak=_well_formed_but_deep)
    done_first = start_host_process(data)
    try:
        seen = trio.run(_read, done_first)
    finally:
        _stop(done_first)
    assert user_version(seed.db) == SCHEMA_VERSION
    conn = sqlite3.connect(seed.db)
    try:
        stored = json.loads(conn.execute("SELECT value_json FROM kv WHERE ns = 'app' AND key = 'settings'")
                            .fetchone()[0])
        config = json.loads(conn.execute("SELECT config_json FROM scheduled_tasks WHERE id = 'task-manual'")
                            .fetchone()[0])
    finally:
        conn.close()
    assert stored["defaultMode"] == "plan" and "planApprovalPermissionMode" not in stored
    assert stored["layout"] == _deep(100) and stored["serial"] == int("9" * 120)
    assert config == {"mode": "plan", "tree": _deep(90)}
    assert seen["settings"]["value"]["defaultMode"] == "plan"


# --- §7 last bullet: the transcript's own format across the migration -----------------------------------


async def _read_append_read(host: HostProcess) -> tuple[list[str], list[str], list[str]]:
    async with open_client(host.url, host.token, client_id="mig-lines", client_kind="ui") as c:
        before = await c.call("session.get", {"sessionId": "s-alpha", "messageLimit": 50})
        await say(c, "s-alpha", "m-a6", "after the upgrade")
        after = await c.call("session.get", {"sessionId": "s-alpha", "messageLimit": 50})
        found = await c.call("search.sessions", {"query": "数据库迁移"})
        return ([m["id"] for m in before["messages"]], [m["id"] for m in after["messages"]],
                [r["sessionId"] for r in found["results"]])


def test_unknown_transcript_lines_of_a_seed_file_survive_the_migration_and_an_append(tmp_path: Path) -> None:
    """§7: "The transcript file format carries its own schema field in the session header line; unknown line
    types are skipped, so additive file-format growth needs no reset." A seed-era transcript with a line type
    and header fields this host does not know: the migration re-reads it, every message is there, the
    unknown lines are kept byte for byte and a new message is appended after them."""
    data = tmp_path / "data"
    seed = build_seed_dir(data, 10)
    rel = "sessions/s-alpha.jsonl"
    lines = seed.files[rel].splitlines(keepends=True)
    header = json.loads(lines[0])
    header["origin"] = {"app": "pi-desktop", "build": "2.0.0-beta"}
    unknown = [
        json.dumps({"type": "reaction", "id": "r-1", "messageId": "m-a2", "emoji": "👍",
                    "createdAt": "2026-07-26T09:00:01.000Z"}, ensure_ascii=False).encode() + b"\n",
        json.dumps({"type": "bookmark", "messageId": "m-a1", "label": {"nested": ["chat"]}}).encode() + b"\n",
    ]
    content = b"".join([json.dumps(header, separators=(",", ":")).encode() + b"\n", lines[1], lines[2],
                        unknown[0], *lines[3:5], unknown[1], *lines[5:]])
    (data / rel).write_bytes(content)
    seed.files[rel] = content
    host = start_host_process(data)
    try:
        before, after, found = trio.run(_read_append_read, host)
    finally:
        _stop(host)
    assert before == ["m-a1", "m-a2", "m-a3", "m-a4", "m-a5"]
    assert after == [*before, "m-a6"]
    assert found == ["s-alpha"]
    written = (data / rel).read_bytes()
    assert written.startswith(content), "the seed's lines were rewritten"
    assert all(line in written for line in unknown)
    host = start_host_process(data)
    try:
        again = trio.run(_read, host)
    finally:
        _stop(host)
    assert [m["id"] for m in again["alpha"]["messages"]] == after


@pytest.mark.parametrize("ahead", [1, 1000])
def test_a_file_from_a_newer_build_is_refused_through_serve_untouched(tmp_path: Path, ahead: int) -> None:
    """§7: "PRAGMA user_version stays the schema authority" — a file whose number is newer than this build's
    schema is neither archived (the reset is for 1–6 only) nor migrated: serve refuses it, the file and its
    WAL exactly as they were, no backup written."""
    data = tmp_path / "data"
    seed = build_seed_dir(data, 17)
    _leave_in_wal(seed.db, f"PRAGMA user_version = {SCHEMA_VERSION + ahead}")
    digests = {s: sha256(Path(f"{seed.db}{s}")) for s in ("", "-wal")}
    done = _serve(data)
    assert done.returncode == EXIT_STORE_REFUSED, (done.returncode, done.stderr[-2000:])
    assert f"schema version {SCHEMA_VERSION + ahead}" in done.stderr and "Traceback" not in done.stderr
    assert {s: sha256(Path(f"{seed.db}{s}")) for s in ("", "-wal")} == digests
    assert _backups(data) == [] and seed.file_bytes() == seed.files


@pytest.mark.parametrize("fault", ["migrate.9_11.before_commit:1:enospc", "migrate.9_11.before_commit:1:eio",
                                   "migrate.9_11.before_commit:1:raise", "migrate.9_11.after_backup:1:enospc"])
def test_a_write_failure_inside_the_guarded_step_fails_closed_through_serve(tmp_path: Path, fault: str) -> None:
    """§7 item 9: "A ... parse, constraint, or write failure fails closed, rolls back the transaction, and
    leaves the pre-migration schema authoritative; the backup remains available for recovery." The failure
    is injected inside the step's open transaction (and right after the backup); the host exits with one
    line, every row of the v9 file is there, its backup is exact, and the next start migrates it."""
    data = tmp_path / "data"
    seed = build_seed_dir(data, 9)
    before = dump(seed.db)
    done = run_cli("--data-dir", str(data), "serve", "--port", "0", "--quiet", env={"RT_CRASHPOINT": fault})
    assert done.returncode == EXIT_STORE_REFUSED, (done.returncode, done.stderr[-2000:])
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert user_version(seed.db) == 9 and dump(seed.db) == before
    assert _backups(data) == ["pi.sqlite.v9.bak"] and dump(data / "pi.sqlite.v9.bak") == before
    assert not (data / "host.json").exists()
    seen = _open_and_read(data)
    assert user_version(seed.db) == SCHEMA_VERSION
    assert seen["settings"]["value"]["defaultMode"] == "plan"
    assert seed.file_bytes() == seed.files


@pytest.mark.parametrize("repair", [False, True])
def test_doctor_on_a_file_the_guarded_step_refuses_says_so_and_changes_nothing(tmp_path: Path,
                                                                                 repair: bool) -> None:
    """§7 item 9: a malformed value "fails closed ... and leaves the pre-migration schema authoritative; the
    backup remains available for recovery" — recovery means a person corrects the value, and the offline
    checker they run to find out why the host will not start must not call the directory clean and promise
    that the next start migrates it. It names the row, exits as for damage nothing here can repair, and
    writes nothing (not even with --repair)."""
    data = tmp_path / "data"
    seed = build_seed_dir(data, 9, tweak=_settings_with(defaultCommandShell="cmd"))
    assert _serve(data).returncode == EXIT_STORE_REFUSED
    digest, before = sha256(seed.db), dump(seed.db)
    done = run_cli("--data-dir", str(data), "doctor", *(["--repair"] if repair else []))
    assert done.returncode == 2, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "defaultCommandShell 'cmd' is a shell of win32, not of linux" in done.stdout, done.stdout
    assert "migrates it in place" not in done.stdout
    assert sha256(seed.db) == digest and dump(seed.db) == before
    assert _backups(data) == ["pi.sqlite.v9.bak"]


def test_an_offline_read_of_a_file_the_guarded_step_refuses_names_the_row(tmp_path: Path) -> None:
    """§7 item 9 (as above): the offline reads (`pi-host sessions`) of a directory whose seed file the guarded
    step refuses must not send the user to `pi-host serve` "once to migrate it" — serve refuses it too."""
    data = tmp_path / "data"
    seed = build_seed_dir(data, 10, tweak=_session_mode("autopilot"))
    assert _serve(data).returncode == EXIT_STORE_REFUSED  # what the user saw first
    digest = sha256(seed.db)
    done = run_cli("--data-dir", str(data), "sessions")
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "sessions row id='s-beta': mode 'autopilot'" in done.stderr, done.stderr
    assert "once to migrate it" not in done.stderr
    assert sha256(seed.db) == digest and _backups(data) == ["pi.sqlite.v10.bak"]


def test_a_seed_file_without_a_settings_blob_or_tasks_migrates(tmp_path: Path) -> None:
    """§7 items 2-3 parse "the structured app settings value" and "each scheduled task's config_json": a seed
    install that never saved a setting and has no task has neither, which is not malformed — it migrates,
    and reads give the defaults."""
    def bare(rows: Rows) -> None:
        rows["kv"] = [r for r in rows["kv"] if (r["ns"], r["key"]) != ("app", "settings")]
        rows["task_runs"] = [r for r in rows["task_runs"] if r.get("task_id") is None]
        rows["scheduled_tasks"] = []

    data = tmp_path / "data"
    seed = build_seed_dir(data, 8, tweak=bare)
    seen = _open_and_read(data)
    assert user_version(seed.db) == SCHEMA_VERSION
    assert seen["settings"]["value"] == {"largePasteThreshold": 600, "thinkingDisplayMode": "detailed"}
    assert seen["tasks"]["tasks"] == []
    assert [m["id"] for m in seen["alpha"]["messages"]] == ["m-a1", "m-a2", "m-a3", "m-a4", "m-a5"]
