"""Seed 003 §7 and §11 items 5 and 16 audited from the outside: seed-era data directories built from the seed's
own DDL (tests/migrations/seed_sql, through tests/migrations/seedkit), opened by real ``pi-host serve``
processes, looked at over WebSocket and by reading the files. Only what older tests leave open:

* each backup is the pre-migration file BYTE FOR BYTE (older tests compare logical dumps), apart from the
  header's write/read-format bytes that say "WAL", so that it opens read-only as one self-contained file
  without growing ``-wal``/``-shm`` siblings; the v15 file that walks v15→v16→v17 in one launch (its v16
  backup a v16 file), ``largePasteThreshold`` out of range in a migrated blob, a transcript whose header
  says a newer file schema;
* the pre-v7 archive is the old file with its ``-wal`` folded in, byte for byte;
* a refusal leaves every file and folder of the directory as it was (bytes and mode); what it adds is the
  backup alone;
* SIGKILL at the moments tests/migrations/test_crash_chain.py leaves out of each seed step (after the commit
  of every step, after the backup of 8→11, 14→15 and 16→17): one version at a time, never half-migrated,
  every backup byte-exact, every row once at the end, and the launch after that a plain open.

Held elsewhere, not repeated: the v7 reset and its archive (tests/migrations/test_seed_chain.py,
test_host_open.py, test_seed003_migrations_outsider.py: WAL-held rows, an earlier archive, a kill inside
the reset); the nine steps of the guarded transaction, its mappings and every malformed value
(tests/migrations/test_fail_closed.py, test_seed_chain.py, test_seed003_migrations_outsider.py);
``planApprovalPermissionMode`` and unrelated settings (test_host_open.py); v14–v17 layouts and added
columns' defaults (test_seed_chain.py ``expected_rows``); the plain second open (test_host_open.py);
``largePasteThreshold`` reads and writes (tests/settings/test_settings_rules.py; here once through a
migrated file); unknown transcript line types (test_seed003_migrations_outsider.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import open_client
from store.upgrade.schema import SCHEMA_VERSION
from tests.acceptance.test_seed003_migrations_outsider import _leave_in_wal
from tests.hostkit import HostProcess, run_cli, serve_until_exit, start_host_process
from tests.migrations.dbcheck import boot_report, file_layout, seed_layout, user_version
from tests.migrations.seedkit import after_boot, assert_rows_present, build_seed_dir, expected_rows
from tests.migrations.test_fail_closed import _to_rollback_journal

Rows = dict[str, list[dict[str, Any]]]
EXIT_STORE_REFUSED = 5  # runtime/cli_serve.py: a StoreError at start
WAL_FLAGS = (18, 19)  # the header's file format write/read version: 2 = WAL, 1 = rollback journal


def _backups(data: Path) -> list[str]:
    return sorted(p.name for p in data.iterdir() if ".bak" in p.name)


def _tree(root: Path) -> dict[str, tuple[str, bytes | None]]:
    """Every file and folder under ``root``: its mode and (files) its bytes."""
    return {str(p.relative_to(root)): (stat.filemode(p.lstat().st_mode), p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def _checkpointed(db: Path) -> bytes:
    """The bytes ``db`` has once its ``-wal`` is checkpointed into it (done on a private copy)."""
    with tempfile.TemporaryDirectory(prefix="audit-") as name:
        copy = Path(name) / "db"
        for suffix in ("", "-wal"):
            if Path(f"{db}{suffix}").exists():
                shutil.copyfile(f"{db}{suffix}", f"{copy}{suffix}")
        conn = sqlite3.connect(copy, isolation_level=None)
        try:
            assert conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
        finally:
            conn.close()
        return copy.read_bytes()


def _assert_exact_backup(bak: Path, original: bytes, version: int) -> None:
    """``bak`` is ``original`` byte for byte but its WAL flags (which say rollback journal), and opens
    read-only with ``version`` and without leaving a sibling behind."""
    got = bak.read_bytes()
    assert len(got) == len(original), (bak.name, len(got), len(original))
    differ = [i for i in range(len(got)) if got[i] != original[i] and i not in WAL_FLAGS]
    assert differ == [], f"{bak.name} differs from the file it backs up at byte(s) {differ[:10]}"
    assert (got[18], got[19]) == (1, 1), bak.name
    siblings = set(os.listdir(bak.parent))
    conn = sqlite3.connect(f"{bak.resolve().as_uri()}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == version
        assert conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    assert set(os.listdir(bak.parent)) == siblings, "a read-only open of the backup left files beside it"


async def _look(host: HostProcess, create: bool) -> dict[str, Any]:
    async with open_client(host.url, host.token, client_id="mig-audit", client_kind="test") as c:
        seen = {"settings": await c.call("settings.get", {"ns": "app", "key": "settings"}),
                "beta": await c.call("session.get", {"sessionId": "s-beta", "messageLimit": 50})}
        if create:
            await c.call("session.create", {"sessionId": "s-new", "title": "new"})
        return seen


def _serve_and_read(data: Path, *, create: bool = False) -> dict[str, Any]:
    host = start_host_process(data)
    try:
        return trio.run(_look, host, create)
    finally:
        assert host.terminate(60) == 0


def _out_of_range_paste(rows: Rows) -> None:
    row = next(r for r in rows["kv"] if (r["ns"], r["key"]) == ("app", "settings"))
    row["value_json"] = json.dumps({**json.loads(row["value_json"]), "largePasteThreshold": 0})


# --- the backups, byte for byte -----------------------------------------------------------------------------


def test_a_v15_file_walks_both_steps_behind_byte_exact_backups_and_a_second_launch_takes_none(
        tmp_path: Path) -> None:
    """§7: "host-core checkpoints the WAL, then creates the exact readable pi.sqlite.v8.bak"; "A pi.sqlite.v15.bak
    copy precedes the migration" (v16) and "A pi.sqlite.v16.bak copy precedes the step" (v17); "The v15→v16
    session-collaboration step now stamps 16 ... so a v15 file can walk both steps in one launch"; "every
    pre-v17 row keeps a NULL owner". §7: "Host settings reads normalize a missing, malformed, or out-of-range
    value to 600 ... gain the default lazily without a destructive migration". §11.5: "reopening ... is a
    plain open". (The guarded step's v8 backup: the kill test below.)"""
    data = tmp_path / "data"
    version = 15
    seed = build_seed_dir(data, version, tweak=_out_of_range_paste)
    original = seed.db.read_bytes()  # the fixture closed it cleanly: this is the file after its checkpoint
    # §7 "The transcript file format carries its own schema field in the session header line; unknown line
    # types are skipped, so additive file-format growth needs no reset": a transcript a newer writer grew
    rel = "sessions/s-beta.jsonl"
    lines = seed.files[rel].splitlines(keepends=True)
    ids = [r["id"] for r in map(json.loads, lines[1:]) if r.get("type") == "message"]
    assert ids
    header = {**json.loads(lines[0]), "schema": 2, "writer": {"app": "pi-desktop", "build": "3.0.0"}}
    grown = b"".join([json.dumps(header).encode() + b"\n", *lines[1:],
                      b'{"type":"annotation","id":"x-1","messageId":"' + ids[0].encode() + b'","note":"later"}\n'])
    (data / rel).write_bytes(grown)
    seed.files[rel] = grown
    seen = _serve_and_read(data, create=True)
    assert seen["settings"]["value"]["largePasteThreshold"] == 600
    assert [m["id"] for m in seen["beta"]["messages"]] == ids
    new_header = json.loads((data / "sessions" / "s-new.jsonl").read_bytes().split(b"\n", 1)[0])
    assert new_header["type"] == "session" and type(new_header["schema"]) is int
    conn = sqlite3.connect(f"{seed.db.resolve().as_uri()}?mode=ro", uri=True)
    try:
        stored = json.loads(conn.execute("SELECT value_json FROM kv WHERE ns = 'app' AND key = 'settings'")
                            .fetchone()[0])
        owners = conn.execute("SELECT id, owner_plugin_id FROM providers").fetchall()
        owner_index = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'idx_providers_owner'").fetchone()
    finally:
        conn.close()
    assert stored["largePasteThreshold"] == 0, "the stored value is normalized on read, not rewritten"
    assert owners and {o for _id, o in owners} == {None}
    assert owner_index is not None and "owner_plugin_id IS NOT NULL" in owner_index[0]
    names = _backups(data)
    assert f"pi.sqlite.v{version}.bak" in names
    _assert_exact_backup(data / f"pi.sqlite.v{version}.bak", original, version)
    # both seed steps in one launch: the v16 backup is a v16 file, without the v17 column
    v16 = data / "pi.sqlite.v16.bak"
    assert user_version(v16) == 16 and file_layout(v16) == seed_layout(16)
    # the second launch: a plain open, every backup as it was
    before = {name: (data / name).read_bytes() for name in names}
    _serve_and_read(data)
    assert boot_report(seed.db)["database"]["backups"] == []
    assert {name: (data / name).read_bytes() for name in _backups(data)} == before
    assert seed.file_bytes() == seed.files  # the grown transcript too


def test_the_pre_v7_archive_is_the_checkpointed_file_byte_for_byte(tmp_path: Path) -> None:
    """§7: "Opening a database with user_version 1–6 WAL-checkpoints it, renames it to pi.sqlite.v6.bak
    (removing stale -wal/-shm siblings)": the archive is the old file with its -wal folded in, byte for byte
    (a rename, nothing rewritten), and alone."""
    data = tmp_path / "data"
    seed = build_seed_dir(data, 7)
    _leave_in_wal(seed.db, "INSERT INTO kv VALUES ('ui', 'only-in-wal', '\"kept\"', 1)", "PRAGMA user_version = 3")
    original = _checkpointed(seed.db)
    _serve_and_read(data)
    assert _backups(data) == ["pi.sqlite.v6.bak"]
    assert (data / "pi.sqlite.v6.bak").read_bytes() == original
    assert user_version(data / "pi.sqlite.v6.bak") == 3 and user_version(seed.db) == SCHEMA_VERSION


# --- a refusal changes nothing but the backup ---------------------------------------------------------------


def _shell(value: str) -> Any:
    def tweak(rows: Rows) -> None:
        row = next(r for r in rows["kv"] if (r["ns"], r["key"]) == ("app", "settings"))
        row["value_json"] = json.dumps({**json.loads(row["value_json"]), "defaultCommandShell": value})
    return tweak


def _task_mode(rows: Rows) -> None:
    rows["scheduled_tasks"][0]["config_json"] = '{"mode": "chatty", "extension": {"mode": "chat"}}'


def _session_mode(rows: Rows) -> None:
    rows["sessions"][1]["mode"] = "ask"


# case: (version, tweak, what the refusal names, the file is in rollback-journal mode)
REFUSALS = {
    "wrong-platform-shell": (8, _shell("powershell"), "defaultCommandShell 'powershell'", False),
    "scheduled-mode": (10, _task_mode, "mode 'chatty'", False),
    "session-mode-rollback-journal-file": (9, _session_mode, "mode 'ask'", True),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_refusal_leaves_the_directory_as_it_was_apart_from_the_backup(tmp_path: Path, case: str) -> None:
    """§7 item 9: "... unknown or wrong-platform defaultCommandShell ... fails closed, rolls back the
    transaction, and leaves the pre-migration schema authoritative; the backup remains available for
    recovery" — and the refusal names the value; no file or folder of the directory is rewritten or
    re-moded, and the only new file is the backup."""
    version, tweak, named, rollback_journal = REFUSALS[case]
    data = tmp_path / "data"
    seed = build_seed_dir(data, version, tweak=tweak)
    if rollback_journal:
        _to_rollback_journal(seed.db)
    original = seed.db.read_bytes()
    before = _tree(data)
    done = run_cli("--data-dir", str(data), "serve", "--port", "0", "--quiet")
    assert done.returncode == EXIT_STORE_REFUSED, (done.returncode, done.stderr[-2000:])
    assert named in done.stderr and f"schema v{version} stays authoritative" in done.stderr, done.stderr[-2000:]
    after = _tree(data)
    backup = f"pi.sqlite.v{version}.bak"
    # what is new is the backup alone: the refusal is decided before the start writes its lock, its token,
    # its log or the seed §2 folders, or makes any folder owner-only (tests/migrations/test_refused_start.py)
    assert backup in after
    assert {k: v for k, v in after.items() if k != backup} == before, "the refused start changed the directory"
    _assert_exact_backup(data / backup, original, version)


# --- SIGKILL at the moments the crash chain leaves out ------------------------------------------------------

# (point, the version the file holds after the kill); the chain from 7 reaches the seed's v17 and beyond
KILLS = [
    ("migrate.7_8.after_commit", 8),
    ("migrate.8_11.after_backup", 8),
    ("migrate.8_11.after_commit", 11),
    ("migrate.11_14.after_commit", 14),
    ("migrate.14_15.after_backup", 14),
    ("migrate.14_15.after_commit", 15),
    ("migrate.15_16.after_commit", 16),
    ("migrate.16_17.after_backup", 16),
    ("migrate.16_17.after_commit", 17),
]


def test_sigkill_after_each_seed_steps_backup_and_commit_then_restarts_finish_it_once(tmp_path: Path) -> None:
    """§7: every step "in one transaction, with a pi.sqlite.v<n>.bak copy before destructive steps"; "Schema v7
    first reaches v8, then uses the guarded path"; the v14, v15, v16, v17 steps each behind the backup of the
    version before. Killed right after each step's backup and right after each commit: the file holds
    exactly one version's layout (never a mixture), each backup is that version's file byte for byte (however
    many restarts took one), and the last start ends at the newest schema with every row exactly once."""
    data = tmp_path / "data"
    seed = build_seed_dir(data, 7)
    held = {7: _checkpointed(seed.db)}  # each version's file as it stood (checkpointed) when a step began
    for point, version in KILLS:
        assert serve_until_exit(data, env={"RT_CRASHPOINT": f"{point}:1:kill"}) == -signal.SIGKILL, point
        assert user_version(seed.db) == version, point
        assert file_layout(seed.db) == seed_layout(version), point
        held.setdefault(version, _checkpointed(seed.db))
        assert not (data / "host.json").exists()
    host = start_host_process(data)
    assert host.terminate(60) == 0
    assert user_version(seed.db) == SCHEMA_VERSION
    names = _backups(data)
    for version, original in held.items():
        mine = [n for n in names if n.startswith(f"pi.sqlite.v{version}.bak")]
        assert mine, (version, names)
        for name in mine:
            _assert_exact_backup(data / name, original, version)
    assert len([n for n in names if n.startswith("pi.sqlite.v8.bak")]) == 2  # killed after it once
    expected = after_boot(expected_rows(seed))
    conn = sqlite3.connect(seed.db)
    try:
        assert_rows_present(conn, expected)
        for table in ("sessions", "messages", "scheduled_tasks", "providers", "notifications"):
            count = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            assert count == len(expected[table]), (table, count, len(expected[table]))
    finally:
        conn.close()
    assert seed.file_bytes() == seed.files
    # the launch after that: a plain open
    host = start_host_process(data)
    assert host.terminate(60) == 0
    report = boot_report(seed.db)["database"]
    assert (report["steps"], report["backups"], report["migratedFrom"]) == ([], [], None)
    assert _backups(data) == names
