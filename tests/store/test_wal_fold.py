"""Folding a full disk's leftover WAL into the database (store/indexing/wal_fold.py), on a real small tmpfs:
without room for the database's growth nothing is written, not even by closing; with it the WAL is folded
and cut to nothing."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

import pytest

from store.errors import StorageFull
from store.indexing.wal_fold import FOLD_SLACK_BYTES, close_unfolded, fold_needs, fold_or_refuse, fold_wal
from tests.hostile.test_full_disk import fill, small_disk

ROWS = 600
BLOB = 4000


def _wal_past_the_file(path: Path) -> sqlite3.Connection:
    """A database whose rows are all in its WAL: no checkpoint has copied them, so a fold must grow the file
    by about ``ROWS * BLOB`` bytes."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, b BLOB)")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the file holds the schema, nothing else
    for _ in range(ROWS):
        conn.execute("INSERT INTO t (b) VALUES (?)", (os.urandom(BLOB),))
    return conn


def _sums(*paths: Path) -> dict[str, tuple[int, str]]:
    return {p.name: (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()) for p in paths}


def _used(mnt: Path) -> int:
    st = os.statvfs(mnt)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def test_without_room_for_the_growth_nothing_is_written_and_with_it_the_wal_is_folded(tmp_path: Path) -> None:
    with small_disk("tmpfs", tmp_path, size_mb=16) as mnt:
        db = mnt / "pi.sqlite"
        wal = Path(f"{db}-wal")
        conn = _wal_past_the_file(db)
        growth = fold_needs(conn)
        assert growth >= ROWS * BLOB, growth
        fill(mnt / "filler")
        os.truncate(mnt / "filler", (mnt / "filler").stat().st_size - growth // 2)  # half the room it needs
        before, used = _sums(db, wal), _used(mnt)

        fold = fold_wal(conn)
        assert not fold.folded and fold.growth == growth and fold.wanted == growth + FOLD_SLACK_BYTES
        with pytest.raises(StorageFull) as caught:
            fold_or_refuse(conn)
        assert caught.value.data["neededBytes"] == fold.wanted
        # SQLite's own checkpoint on closing its last connection is not run either (it would grow the file
        # into the half there is)
        close_unfolded(conn)
        assert _sums(db, wal) == before and _used(mnt) == used

        (mnt / "filler").unlink()
        conn = sqlite3.connect(db, isolation_level=None)
        fold = fold_or_refuse(conn)
        assert fold.folded and wal.stat().st_size == 0
        assert conn.execute("SELECT count(*), sum(length(b)) FROM t").fetchone() == (ROWS, ROWS * BLOB)
        assert fold_needs(conn) == 0
        conn.close()


def test_a_wal_the_file_already_holds_folds_on_a_full_disk(tmp_path: Path) -> None:
    """A WAL whose pages are all within the database file (rows updated in place) needs no growth: it folds
    with no byte free, and gives the disk the WAL's bytes."""
    with small_disk("tmpfs", tmp_path, size_mb=16) as mnt:
        db = mnt / "pi.sqlite"
        conn = _wal_past_the_file(db)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("UPDATE t SET b = zeroblob(?)", (BLOB,))
        wal_size = Path(f"{db}-wal").stat().st_size
        assert wal_size > ROWS * BLOB and fold_needs(conn) == 0
        fill(mnt / "filler")
        used = _used(mnt)
        fold = fold_or_refuse(conn)
        assert fold.folded and fold.growth == 0 and Path(f"{db}-wal").stat().st_size == 0
        assert _used(mnt) <= used - ROWS * BLOB
        conn.close()
