"""Connection bootstrap: support check, PRAGMAs, quarantine of corrupt files, readers."""

from __future__ import annotations

import random
import shutil
import sqlite3
import stat
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from store.errors import IOFailure, SchemaTooNew, UnsupportedSQLite
from store.faults import Faults
from store.indexing.database import (
    SALVAGE_OWED,
    OpenReport,
    check_sqlite_support,
    checkpoint_wal,
    open_reader,
    open_writer,
    probe_database,
    salvage_owed_by_marker,
    set_synchronous,
)
from store.upgrade.schema import SCHEMA_VERSION

from ._sqlite_helpers import NOW_MS, add_session, fts_hits, listing, sha256, user_version


def _open(root: Path, now_ms: int = NOW_MS) -> tuple[sqlite3.Connection, OpenReport]:
    return open_writer(root / "pi.sqlite", quarantine_dir=root / "quarantine", now_ms=now_ms)


def _populated(root: Path, sessions: int = 3, per_session: int = 60) -> Path:
    """A closed database with enough rows to span many pages."""
    conn, _ = _open(root)
    try:
        conn.execute("BEGIN")
        for s in range(sessions):
            add_session(
                conn, f"s{s}", [f"session {s} message {i} lorem ipsum 你好世界" * 4 for i in range(per_session)]
            )
        conn.execute("COMMIT")
    finally:
        conn.close()
    return root / "pi.sqlite"


def test_sqlite_support_check_passes_here_and_names_an_old_version() -> None:
    check_sqlite_support()
    with pytest.raises(UnsupportedSQLite, match=r"3\.33\.0") as info:
        check_sqlite_support(version=(3, 33, 0))
    assert info.value.code == "UNSUPPORTED_SQLITE"
    assert ">= 3.34.0" in str(info.value)


def test_writer_pragmas_in_effect(tmp_path: Path) -> None:
    conn, report = _open(tmp_path)
    try:
        pragma = lambda name: conn.execute(f"PRAGMA {name}").fetchone()[0]  # noqa: E731
        assert pragma("journal_mode") == "wal"
        assert pragma("synchronous") == 2  # FULL
        assert pragma("foreign_keys") == 1
        assert pragma("auto_vacuum") == 2  # INCREMENTAL, set before the first table
        assert pragma("trusted_schema") == 1
        assert pragma("busy_timeout") == 5000
        assert pragma("temp_store") == 2  # MEMORY
        assert pragma("cache_size") == -16000
        assert conn.isolation_level is None
        assert report.created_fresh and not report.rebuilt
        assert user_version(conn) == SCHEMA_VERSION
    finally:
        conn.close()
    db = tmp_path / "pi.sqlite"
    assert stat.S_IMODE(db.stat().st_mode) == 0o600


def test_set_synchronous_switches_per_batch_and_rejects_unknown_modes(tmp_path: Path) -> None:
    conn, _ = _open(tmp_path)
    try:
        set_synchronous(conn, "NORMAL")
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1
        set_synchronous(conn, "full")
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
        with pytest.raises(ValueError, match="synchronous"):
            set_synchronous(conn, "OFF")
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    finally:
        conn.close()


def test_checkpoint_wal_truncates_the_log(tmp_path: Path) -> None:
    conn, _ = _open(tmp_path)
    try:
        add_session(conn, "s1", ["hello there"] * 20)
        wal = tmp_path / "pi.sqlite-wal"
        assert wal.stat().st_size > 0
        result = checkpoint_wal(conn)
        assert not result.busy
        assert result.log_frames == result.checkpointed_frames
        assert wal.stat().st_size == 0
    finally:
        conn.close()


def test_reopening_a_current_database_is_a_plain_open(tmp_path: Path) -> None:
    _populated(tmp_path, sessions=1, per_session=3)
    conn, report = _open(tmp_path)
    try:
        assert not report.created_fresh and not report.rebuilt
        assert report.quarantined == [] and report.archived_to is None
        assert report.migrated_from is None
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 3
    finally:
        conn.close()
    assert not (tmp_path / "quarantine").exists()


def test_a_quarantine_asked_for_moves_even_a_file_that_checks_clean(tmp_path: Path) -> None:
    """The running host met the index corrupt (a read or the writer): the restart quarantines it whatever a
    ``quick_check`` says now (damage a check does not see, or a page read back right once) and starts fresh."""
    _populated(tmp_path, sessions=1, per_session=3)
    conn, report = open_writer(tmp_path / "pi.sqlite", quarantine_dir=tmp_path / "quarantine", now_ms=NOW_MS,
                               quarantine="the running host met it corrupt")
    try:
        assert report.rebuilt and report.corruption == "the running host met it corrupt"
        assert [p.name for p in report.quarantined][0] == f"pi.sqlite.corrupt-{NOW_MS}"
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
    finally:
        conn.close()


def _corrupt_header(data: bytes, _root: Path) -> bytes:
    return b"this is not an sqlite file!!" * 4 + data[112:]


def _corrupt_mid_page(data: bytes, root: Path) -> bytes:
    # random bytes over the b-tree page of the messages table (a page in the middle)
    page_size = int.from_bytes(data[16:18], "big")
    conn = sqlite3.connect(f"file:{root / 'pi.sqlite'}?immutable=1", uri=True)  # no sidecars
    try:
        page = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'messages'").fetchone()[0]
    finally:
        conn.close()
    start = (page - 1) * page_size
    noise = random.Random(7).randbytes(page_size // 2)
    return data[:start] + noise + data[start + len(noise) :]


def _truncate_to_third(data: bytes, _root: Path) -> bytes:
    return data[: len(data) // 3]


@pytest.mark.parametrize("damage", [_corrupt_header, _corrupt_mid_page, _truncate_to_third])
def test_corrupt_database_is_quarantined_and_a_fresh_one_opens(
    tmp_path: Path, damage: Callable[[bytes, Path], bytes]
) -> None:
    db = _populated(tmp_path)
    broken = damage(db.read_bytes(), tmp_path)
    db.write_bytes(broken)
    assert probe_database(db).corrupt

    conn, report = _open(tmp_path, now_ms=NOW_MS + 5)
    try:
        assert report.rebuilt and report.created_fresh
        assert report.corruption
        expected = tmp_path / "quarantine" / f"pi.sqlite.corrupt-{NOW_MS + 5}"
        assert report.quarantined == [expected]
        assert expected.read_bytes() == broken  # moved, byte for byte
        assert user_version(conn) == SCHEMA_VERSION
        assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0
        assert conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        add_session(conn, "new", ["works again after the rebuild"])
        assert fts_hits(conn, "again after") == ["new-m1"]
    finally:
        conn.close()
    assert stat.S_IMODE((tmp_path / "quarantine").stat().st_mode) == 0o700
    as_json = orjson.loads(orjson.dumps(report.to_dict()))
    assert as_json["rebuilt"] is True and as_json["quarantined"] == [str(expected)]


def test_corrupt_database_with_wal_quarantines_all_its_files(tmp_path: Path) -> None:
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    live = tmp_path / "live"
    live.mkdir()
    _populated(live, sessions=1, per_session=40)
    conn, _ = _open(live)
    try:
        conn.execute("INSERT INTO kv VALUES ('app', 'k', '1', 1)")  # lands in the WAL only
        for suffix in ("", "-wal", "-shm"):  # the files as a kill -9 leaves them
            shutil.copy(live / f"pi.sqlite{suffix}", crashed / f"pi.sqlite{suffix}")
    finally:
        conn.close()
    db = crashed / "pi.sqlite"
    db.write_bytes(_corrupt_mid_page(db.read_bytes(), live))
    assert (crashed / "pi.sqlite-wal").stat().st_size > 0

    conn, report = _open(crashed)
    try:
        names = sorted(p.name for p in report.quarantined)
        base = f"pi.sqlite.corrupt-{NOW_MS}"
        assert names == sorted([base, base + "-wal", base + "-shm"])
        assert all(p.exists() for p in report.quarantined)
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
    finally:
        conn.close()


def test_stray_wal_without_its_database_is_quarantined(tmp_path: Path) -> None:
    (tmp_path / "pi.sqlite-wal").write_bytes(b"old frames of another database")
    conn, report = _open(tmp_path)
    try:
        assert report.created_fresh
        assert [p.name for p in report.quarantined] == [f"pi.sqlite.corrupt-{NOW_MS}-wal"]
        assert user_version(conn) == SCHEMA_VERSION
    finally:
        conn.close()


def test_a_second_quarantine_in_the_same_millisecond_keeps_the_first(tmp_path: Path) -> None:
    for _ in range(2):
        (tmp_path / "pi.sqlite").write_bytes(b"garbage" * 100)
        conn, report = _open(tmp_path)
        conn.close()
    names = listing(tmp_path / "quarantine")
    # salvage-owed.json names the newest copy until a boot holds the salvage's mark (boot removes it)
    assert names == [f"pi.sqlite.corrupt-{NOW_MS}", f"pi.sqlite.corrupt-{NOW_MS}.{NOW_MS}", SALVAGE_OWED]
    assert salvage_owed_by_marker(tmp_path / "quarantine") == tmp_path / "quarantine" / names[1]


def test_quarantine_fault_point_stops_before_anything_moves(tmp_path: Path) -> None:
    db = tmp_path / "pi.sqlite"
    db.write_bytes(b"garbage" * 100)
    faults = Faults()
    faults.add("db.quarantine.before_move", action="eio")
    with pytest.raises(OSError):
        open_writer(db, quarantine_dir=tmp_path / "q", now_ms=NOW_MS, faults=faults)
    assert db.read_bytes() == b"garbage" * 100
    # only the marker is there, naming a copy that never came: a boot ignores it (the index is still in place)
    assert listing(tmp_path / "q") == [SALVAGE_OWED]
    assert salvage_owed_by_marker(tmp_path / "q") is None


def test_too_new_database_is_refused_and_left_byte_identical(tmp_path: Path) -> None:
    db = _populated(tmp_path, sessions=1, per_session=5)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    before, files = sha256(db), listing(tmp_path)

    with pytest.raises(SchemaTooNew) as info:
        _open(tmp_path)
    assert "99" in str(info.value) and str(SCHEMA_VERSION) in str(info.value)
    assert info.value.code == "SCHEMA_TOO_NEW"
    assert sha256(db) == before
    assert listing(tmp_path) == files


def test_unreadable_path_is_an_io_error_not_a_quarantine(tmp_path: Path) -> None:
    db = tmp_path / "pi.sqlite"
    db.mkdir()  # exists, but SQLite cannot open it: not corruption
    with pytest.raises(IOFailure):
        _open(tmp_path)
    assert db.is_dir()
    assert not (tmp_path / "quarantine").exists()


def test_reader_reads_committed_data_but_cannot_write(tmp_path: Path) -> None:
    conn, _ = _open(tmp_path)
    reader = open_reader(tmp_path / "pi.sqlite")
    try:
        add_session(conn, "s1", ["readers see committed rows", "共享的搜索索引"])
        assert reader.execute("SELECT count(*) FROM messages").fetchone()[0] == 2
        assert fts_hits(reader, "搜索索") == ["s1-m2"]
        assert reader.execute("PRAGMA query_only").fetchone()[0] == 1
        with pytest.raises(sqlite3.OperationalError, match="readonly|read-only"):
            reader.execute("INSERT INTO kv VALUES ('app', 'k', '1', 1)")
        with pytest.raises(sqlite3.OperationalError):
            reader.execute("CREATE TABLE sneaky (x)")
        reader.execute("PRAGMA query_only = OFF")  # mode=ro still refuses writes
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            reader.execute("DELETE FROM messages")
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 2
    finally:
        reader.close()
        conn.close()


def test_reader_on_a_missing_database_is_an_io_error(tmp_path: Path) -> None:
    with pytest.raises(IOFailure, match="read-only"):
        open_reader(tmp_path / "missing.sqlite")
    assert not (tmp_path / "missing.sqlite").exists()
