"""Folding the WAL into the database file before boot writes, when (and only when) the disk has room for it.

A host that ran its disk full leaves a large WAL behind: its last checkpoints could not grow the database file
to copy the WAL's newest pages into it, so the WAL never started over (measured: a 24 MiB disk left 10.5 MB of
database and 11.3 MB of WAL). Boot's commits then went on appending to that WAL, and each commit's automatic
checkpoint grew the database into whatever had been freed and failed part way: a boot that failed kept the room
it was given (up to 4 MiB per try), and four tries, 12 MiB freed, were needed where 1 MiB was enough.

Here boot folds the WAL first (``wal_checkpoint(TRUNCATE)``: every committed frame into the database, the file
cut to nothing), which needs room only for what the database file must grow by: the pages the WAL holds past the
file's allocated end (:func:`fold_needs`, usually a fraction of the WAL). Without that room it folds nothing and
writes nothing (:func:`fold_or_refuse` raises :class:`StorageFull` naming the room wanted), so a refused boot
leaves the directory as it found it. Once folded, the WAL's bytes are free for the boot's own writes.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from store.errors import StorageFull
from store.indexing.database import checkpoint_wal

__all__ = ["FOLD_SLACK_BYTES", "Fold", "close_unfolded", "fold_needs", "fold_or_refuse", "fold_wal", "free_bytes",
           "short_of_room"]

FOLD_SLACK_BYTES = 64 << 10
"""Room kept beyond the database file's growth before a fold starts (the file system's own blocks for a
larger file): a fold that fails part way grows the database without starting the WAL over."""
SPARE_BYTES = 64 << 20
"""Room beyond the database file's size under which the disk counts as short of room (:func:`short_of_room`)."""
_FOLD_WAIT_MS = 200
"""How long a fold waits for a reader to leave the WAL (boot has none; the running host's are short)."""


@dataclass(frozen=True)
class Fold:
    """What :func:`fold_wal` found and did."""

    wal_bytes: int
    """The WAL file's size before."""
    growth: int
    """Bytes the database file had to grow by to take every page of the WAL."""
    free: int
    """Bytes free on the database's file system before."""
    folded: bool
    """The WAL was folded into the database and truncated."""
    busy: bool = False
    """A reader kept the fold from finishing (nothing refused: the WAL stays as it was)."""

    @property
    def wanted(self) -> int:
        """Free bytes a fold needs: the growth, with slack when there is any."""
        return self.growth + FOLD_SLACK_BYTES if self.growth else 0

    def to_dict(self) -> dict[str, object]:
        return {"walBytes": self.wal_bytes, "growth": self.growth, "free": self.free, "folded": self.folded,
                "busy": self.busy}


def _main_file(conn: sqlite3.Connection) -> str:
    for _seq, name, path in conn.execute("PRAGMA database_list").fetchall():
        if name == "main" and path:
            return str(path)
    raise ValueError("the connection has no database file")


def free_bytes(path: str) -> int:
    """Bytes this process may still write on ``path``'s file system (root: the blocks reserved for it too)."""
    st = os.statvfs(path)
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return int(blocks * st.f_frsize)


def short_of_room(conn: sqlite3.Connection, *, spare: int = SPARE_BYTES) -> bool:
    """The database's file system has less free than the database file and ``spare``: a write transaction that
    rewrites a large part of the index (an FTS5 merge) may not fit."""
    path = _main_file(conn)
    return free_bytes(os.path.dirname(path) or ".") < os.stat(path).st_size + spare


def fold_needs(conn: sqlite3.Connection) -> int:
    """Bytes the database file must grow by for a checkpoint to copy every page of the WAL into it: the database's
    size as of its last commit less what its file already holds on disk (a fold that failed part way, or an
    automatic checkpoint, may have written pages past its end: those count as held)."""
    path = _main_file(conn)
    (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    (page_count,) = conn.execute("PRAGMA page_count").fetchone()
    st = os.stat(path)
    held = min(st.st_size, st.st_blocks * 512)
    return max(0, int(page_size) * int(page_count) - held)


def fold_wal(conn: sqlite3.Connection) -> Fold:
    """Fold the WAL into the database file and truncate it when the file system has room for the database's
    growth (:func:`fold_needs` plus :data:`FOLD_SLACK_BYTES`); otherwise write nothing (``folded`` False). No
    transaction may be open. An SQLite error of the fold itself (a disk that filled meanwhile) propagates."""
    path = _main_file(conn)
    try:
        wal = os.stat(f"{path}-wal").st_size
    except FileNotFoundError:
        wal = 0
    growth = fold_needs(conn)
    free = free_bytes(os.path.dirname(path) or ".")
    if wal == 0:
        return Fold(wal, growth, free, folded=True)
    if growth and growth + FOLD_SLACK_BYTES > free:
        return Fold(wal, growth, free, folded=False)
    busy = checkpoint_wal(conn, wait_ms=_FOLD_WAIT_MS).busy
    return Fold(wal, growth, free, folded=not busy, busy=busy)


def fold_or_refuse(conn: sqlite3.Connection) -> Fold:
    """:func:`fold_wal`, or :class:`StorageFull` (nothing written) when the disk lacks the room it needs."""
    fold = fold_wal(conn)
    if not fold.folded and not fold.busy:
        raise StorageFull(
            f"the index's write-ahead log ({fold.wal_bytes} bytes) needs {fold.wanted} bytes free to be folded "
            f"into the database, {fold.free} are: the disk is full",
            data={"walBytes": fold.wal_bytes, "neededBytes": fold.wanted, "freeBytes": fold.free})
    return fold


def close_unfolded(conn: sqlite3.Connection) -> None:
    """Close the writer and leave the WAL as it is. SQLite checkpoints when its last connection to a database
    closes, and on a full disk that checkpoint grows the database file into whatever room there is before it
    fails (measured: 364 KB of 400 KB free). A read-only connection that has read holds the database across the
    writer's close, so the writer is not the last; and a read-only connection never checkpoints."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")
    try:
        holder = sqlite3.connect(f"{Path(_main_file(conn)).resolve().as_uri()}?mode=ro", uri=True,
                                 isolation_level=None)
    except (sqlite3.Error, ValueError):
        conn.close()
        raise
    try:
        holder.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
    finally:
        conn.close()
        holder.close()
