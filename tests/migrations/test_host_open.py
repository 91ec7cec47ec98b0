"""``pi-host serve`` on a seed-era data directory (seed 003 §2, §7, §11.5, §11.16, §11.18), black box.

The host is started as a subprocess on a directory a seed-era pi-desktop left
behind and spoken to over WebSocket. After the first start every row of every
table is there with its mapped values (and what the boot fence does to running
work), every transcript and file is byte-identical, the backups are named by
the version they hold; the second start is a plain open.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import open_client
from runtime.datadir import DataDir
from store.doctor.doctor import run_doctor
from store.upgrade.schema import SCHEMA_VERSION
from tests.hostkit import HostProcess, start_host_process
from tests.migrations.dbcheck import boot_report, sqlite3_cli
from tests.migrations.seedkit import (
    ATTACHMENT_SHA,
    VERSIONS,
    after_boot,
    assert_rows_present,
    build_seed_dir,
    expected_rows,
)


def _stop(host: HostProcess) -> None:
    host.proc.send_signal(signal.SIGTERM)
    host.proc.communicate(timeout=60)
    assert host.proc.returncode == 0


async def _look(host: HostProcess) -> dict[str, Any]:
    async with open_client(host.url, host.token, client_id="seed-open", client_kind="test") as c:
        return {
            "status": await c.call("host.status", {}),
            "alpha": await c.call("session.get", {"sessionId": "s-alpha", "messageLimit": 50}),
            "gamma": await c.call("session.get", {"sessionId": "s-gamma", "messageLimit": 50}),
            "search": await c.call("search.sessions", {"query": "数据库迁移"}),
            "settings": await c.call("settings.get", {"ns": "app", "key": "settings"}),
            "tasks": await c.call("tasks.list", {}),
            "notifications": await c.call("notifications.list", {}),
            "pending": await c.call("plans.pending", {}),
        }


@pytest.mark.parametrize("version", VERSIONS)
def test_serve_opens_a_seed_data_directory_without_losing_a_byte(tmp_path: Path, version: int) -> None:
    data = tmp_path / "data"
    seed = build_seed_dir(data, version)
    host = start_host_process(data)
    try:
        seen = trio.run(_look, host)
    finally:
        _stop(host)
    # what a client sees
    alpha = seen["alpha"]
    assert [m["id"] for m in alpha["messages"]] == ["m-a1", "m-a2", "m-a3", "m-a4", "m-a5"]
    assert alpha["messages"][1]["blocks"][0] == {"type": "thinking", "text": "secret reasoning"}
    assert alpha["messages"][2]["blocks"][0]["name"] == "Write"
    assert [m["id"] for m in seen["gamma"]["messages"]] == ["m-shared"]
    assert [r["sessionId"] for r in seen["search"]["results"]] == ["s-alpha"]
    settings = seen["settings"]["value"]
    assert settings["defaultMode"] == "plan" and "planApprovalPermissionMode" not in settings
    assert settings["networkProxy"]["url"] == "http://127.0.0.1:3128" and settings["largePasteThreshold"] == 1200
    assert sorted(t["id"] for t in seen["tasks"]["tasks"]) == ["task-daily", "task-hourly", "task-manual",
                                                               "task-weekly"]
    # §4.11 "Absence of schedule leaves legacy tasks unarmed": the seed's hourly row has no schedule
    # object, so after the upgrade it is unarmed (no nextRunAt, it never fires) and keeps its fields (its
    # config_json row stays as migrated, checked below).
    listed = {t["id"]: t for t in seen["tasks"]["tasks"]}
    hourly = listed["task-hourly"]
    assert "nextRunAt" not in hourly and "schedule" not in hourly and hourly["enabled"] is True
    assert hourly["cadence"] == "hourly" and hourly["calendarConfigured"] is False
    assert {n["id"] for n in seen["notifications"]["notifications"]} == {"n-1", "n-2"}
    assert seen["pending"]["pending"] == []  # §11.18: the pending approval was interrupted, not replayed
    # what the files say
    conn = sqlite3.connect(seed.db)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert_rows_present(conn, after_boot(expected_rows(seed)))
        if version >= 8:  # §11.18: the interrupted pending row keeps its session in its contract mode
            mode = conn.execute("SELECT mode FROM sessions WHERE id = 's-gamma'").fetchone()[0]
            assert mode == ("goal" if version >= 11 else "plan")
    finally:
        conn.close()
    assert seed.file_bytes() == seed.files, "a transcript or another file was touched"
    conn = sqlite3.connect(seed.db)
    try:  # the seed's attachment files got their rows (else the attachment GC would take them for orphans)
        assert conn.execute("SELECT sha256 FROM attachment_blobs").fetchall() == [(ATTACHMENT_SHA,)]
        assert conn.execute("SELECT count(*) FROM kv WHERE ns = 'pi-host'").fetchone()[0] == 0
    finally:
        conn.close()
    checked = run_doctor(DataDir(data), repair=False, now_ms=0)
    assert checked.exit_code == 0, [(f.check, f.subject) for f in checked.findings]
    first = boot_report(seed.db)
    assert first["database"]["migratedFrom"] == version
    for name in first["database"]["backups"]:
        held = Path(name).name.split(".v")[1].split(".")[0]
        assert sqlite3_cli(Path(name), "PRAGMA user_version;") == [held]
    assert Path(first["database"]["backups"][0]).name == f"pi.sqlite.v{version}.bak"
    # the second start is a plain open: no step, no backup, no reindex
    host = start_host_process(data)
    try:
        again = trio.run(_look, host)
    finally:
        _stop(host)
    second = boot_report(seed.db)
    assert (second["database"]["steps"], second["database"]["backups"], second["database"]["migratedFrom"]) == (
        [], [], None)
    assert second["reconcile"]["full"] == 0 and second["reconcile"]["tail"] == 0
    assert [m["id"] for m in again["alpha"]["messages"]] == [m["id"] for m in alpha["messages"]]
    assert seed.file_bytes() == seed.files


@pytest.mark.parametrize("version", [12, 13])
def test_serve_refuses_a_version_no_release_wrote(tmp_path: Path, version: int) -> None:
    from tests.hostkit import run_cli
    from tests.migrations.dbcheck import sha256
    from tests.migrations.seedkit import create_seed_db, seed_sql

    data = tmp_path / "data"
    data.mkdir()
    create_seed_db(data / "pi.sqlite", version, statements=seed_sql(17))
    digest = sha256(data / "pi.sqlite")
    done = run_cli("--data-dir", str(data), "serve", "--port", "0", "--quiet")
    assert done.returncode != 0
    assert f"schema version {version}, which no pi-desktop release wrote" in done.stderr
    assert sha256(data / "pi.sqlite") == digest
    assert not any(".bak" in p.name for p in data.iterdir())


def test_seed_11_5_serve_archives_a_pre_v7_database_and_reindexes_the_transcripts(tmp_path: Path) -> None:
    """§11.5 through the real host: v1–6 → pi.sqlite.v6.bak, a fresh file, transcripts re-indexed."""
    data = tmp_path / "data"
    seed = build_seed_dir(data, 7)
    conn = sqlite3.connect(seed.db)
    conn.execute("PRAGMA user_version = 5")
    conn.close()
    host = start_host_process(data)
    try:
        seen = trio.run(_look, host)
    finally:
        _stop(host)
    assert sqlite3_cli(data / "pi.sqlite.v6.bak", "PRAGMA user_version; SELECT count(*) FROM sessions;") == [
        "5", "4"]
    assert [m["id"] for m in seen["alpha"]["messages"]] == ["m-a1", "m-a2", "m-a3", "m-a4", "m-a5"]
    # §7: settings are not carried over a breaking reset (nothing stored; reads give the defaults)
    assert "updatedAt" not in seen["settings"]
    assert seen["settings"]["value"] == {"largePasteThreshold": 600, "thinkingDisplayMode": "detailed"}
    assert seed.file_bytes() == seed.files
    host = start_host_process(data)
    _stop(host)
    report = boot_report(seed.db)
    assert (report["database"]["archivedTo"], report["database"]["createdFresh"]) == (None, False)
    assert sorted(p.name for p in data.iterdir() if ".bak" in p.name) == ["pi.sqlite.v6.bak"]


@pytest.mark.parametrize("version", [5, 8])
def test_an_index_a_seed_era_build_left_group_readable_is_owner_only_once_the_host_uses_it(
    tmp_path: Path, version: int
) -> None:
    """docs/DESIGN.md "Data directory": files 0600. A seed-era build left ``pi.sqlite`` 0644 (SQLite's own
    mode under a usual umask); the host that migrates and then writes it (or archives it, pre-v7) keeps it,
    its ``-wal``/``-shm`` (whose mode SQLite copies from the database file) and the archive owner-only."""
    data = tmp_path / "data"
    seed = build_seed_dir(data, 7 if version == 5 else version)
    if version == 5:
        conn = sqlite3.connect(seed.db)
        conn.execute("PRAGMA user_version = 5")
        conn.close()
    os.chmod(seed.db, 0o644)
    host = start_host_process(data)
    try:
        sidecars = {p.name: stat.S_IMODE(p.stat().st_mode) for p in data.iterdir() if p.name.startswith("pi.sqlite")}
    finally:
        _stop(host)
    assert {"pi.sqlite-wal", "pi.sqlite-shm"} <= set(sidecars), sidecars
    assert {name: oct(mode) for name, mode in sidecars.items() if mode != 0o600} == {}
    after = {p.name: stat.S_IMODE(p.stat().st_mode) for p in data.iterdir() if p.name.startswith("pi.sqlite")}
    assert {name: oct(mode) for name, mode in after.items() if mode != 0o600} == {}
    assert ("pi.sqlite.v6.bak" in after) == (version == 5)


def test_a_transcript_and_a_revisions_file_an_earlier_app_left_group_readable_are_owner_only_once_appended_to(
    tmp_path: Path,
) -> None:
    """docs/DESIGN.md "Data directory": files 0600. A seed-era app left its transcripts (and a revisions file)
    0644; the host that appends to them makes them owner-only (the one it only reads keeps its mode until then;
    its content is not touched either way)."""
    data = tmp_path / "data"
    build_seed_dir(data, VERSIONS[-1])
    sessions = data / "sessions"
    for path in sessions.glob("*.jsonl"):
        os.chmod(path, 0o644)
    host = start_host_process(data)

    def mode(name: str) -> str:
        return oct(stat.S_IMODE((sessions / name).stat().st_mode))

    async def touch() -> list[str]:
        async with open_client(host.url, host.token, client_id="modes", client_kind="test") as c:
            await c.call("session.appendMessage", {"sessionId": "s-alpha", "message": {
                "id": "m-new", "role": "user", "blocks": [{"type": "text", "text": "after the upgrade"}]}})
            appended = [mode("s-alpha.jsonl"), mode("s-alpha.revisions.jsonl")]  # the transcript appended to
            # a regenerate's cut archives the tail: appended to the revisions file (the transcript is rewritten)
            await c.call("session.truncateFrom", {"sessionId": "s-alpha", "messageId": "m-new", "mode": "regenerate"})
            return [*appended, mode("s-alpha.revisions.jsonl")]

    try:
        seen = trio.run(touch)
    finally:
        _stop(host)
    assert seen == ["0o600", "0o644", "0o600"]
    assert stat.S_IMODE((sessions / "s-gamma.jsonl").stat().st_mode) == 0o644  # never appended to
