"""A ``pi-host serve`` the index's migration refuses (seed 003 §7, §11 item 16: "fail closed with the
pre-migration schema intact") leaves its data directory as it found it.

A refused start wrote ``host.lock``, a new ``host.token``, an empty log, the seed §2 folders it did not find,
and made every folder owner-only, before opening the database said no. Now the refusal is decided first
(under the lock, whose file is removed again if the start made it): every file and folder keeps its bytes
and mode, and the only file added is the backup of the starting version the guarded step leaves (seed §7:
"the backup remains available for recovery"). The exit status and the one stderr line are what they were.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from store.upgrade.schema import SCHEMA_VERSION
from tests.hostkit import run_cli, start_host_process
from tests.migrations.seedkit import build_seed_dir
from tests.migrations.test_fail_closed import CASES, _to_rollback_journal

EXIT_STORE_REFUSED = 5  # runtime/cli_serve.py: a StoreError at start


def _tree(root: Path) -> dict[str, tuple[str, bytes | None]]:
    """The root and every file and folder under it: its mode and (files) its bytes."""
    out: dict[str, tuple[str, bytes | None]] = {".": (stat.filemode(root.lstat().st_mode), None)}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = (stat.filemode(p.lstat().st_mode), p.read_bytes() if p.is_file() else None)
    return out


def _loosen(data: Path) -> None:
    """Modes a start would change (it makes its folders 0700): group-readable root and folders."""
    os.chmod(data, 0o750)
    for name in ("sessions", "attachments", "secrets"):
        os.chmod(data / name, 0o750)


def _serve(data: Path) -> tuple[int, str]:
    done = run_cli("--data-dir", str(data), "serve", "--port", "0", "--quiet")
    return done.returncode, done.stderr


def _too_new(db: Path) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    finally:
        conn.close()


@pytest.mark.parametrize(("case", "journal"), [("bad-app-settings-json", "wal"), ("unknown-shell", "wal"),
                                               ("invalid-session-mode", "delete")])
def test_a_refused_migration_writes_nothing_but_its_backup(tmp_path: Path, case: str, journal: str) -> None:
    data = tmp_path / "data"
    seed = build_seed_dir(data, 8, tweak=CASES[case][0])
    if journal == "delete":
        _to_rollback_journal(seed.db)
    _loosen(data)
    before = _tree(data)
    code, err = _serve(data)
    assert code == EXIT_STORE_REFUSED, (code, err[-2000:])
    assert err.startswith("pi-host: cannot open the data directory: MIGRATION_FAILED: "), err[-2000:]
    assert CASES[case][1] in err and "schema v8 stays authoritative" in err, err[-2000:]
    assert err.count("\n") == 1 and "Traceback" not in err
    after = _tree(data)
    backup = after.pop("pi.sqlite.v8.bak")  # seed §7: the backup remains available for recovery
    assert backup[0] == "-rw-------"
    assert after == before
    # refused again (the row still bad): not even a second backup this time
    code, err2 = _serve(data)
    assert (code, err2) == (EXIT_STORE_REFUSED, err)
    assert {k: v for k, v in _tree(data).items() if k != "pi.sqlite.v8.bak"} == before


@pytest.mark.parametrize("lock_there", [False, True])
def test_a_database_newer_than_this_build_is_refused_leaving_every_file_and_mode(tmp_path: Path,
                                                                                  lock_there: bool) -> None:
    data = tmp_path / "data"
    seed = build_seed_dir(data, 8)
    _too_new(seed.db)
    _loosen(data)
    if lock_there:  # a host ran here before: its lock file stays, mode and all
        fd = os.open(data / "host.lock", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
        os.close(fd)
    before = _tree(data)
    code, err = _serve(data)
    assert code == EXIT_STORE_REFUSED, (code, err[-2000:])
    assert err == (f"pi-host: cannot open the data directory: SCHEMA_TOO_NEW: {seed.db} has schema version "
                   f"{SCHEMA_VERSION + 1}, newer than the version this build supports ({SCHEMA_VERSION}); "
                   f"refusing to open it, the file is left untouched\n")
    after = _tree(data)
    if lock_there:  # taken while deciding: it names this start's pid now, as any start's lock does
        assert after.pop("host.lock")[0] == before.pop("host.lock")[0] == "-rw-r-----"
    assert after == before


def test_a_start_that_is_not_refused_still_makes_its_directory(tmp_path: Path) -> None:
    """The check before writing leaves a database it would not refuse to the boot: a v8 file migrates."""
    data = tmp_path / "data"
    build_seed_dir(data, 8)
    _loosen(data)
    host = start_host_process(data)
    try:
        assert (data / "host.token").exists() and (data / "logs").is_dir()
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
    finally:
        host.proc.terminate()
        host.proc.communicate(timeout=60)
    assert host.proc.returncode == 0
    assert (data / "pi.sqlite.v8.bak").exists()
