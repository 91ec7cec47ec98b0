"""Indexing a transcript far ahead of its index in bounded commits, the WAL checkpointed between them.

A session whose index trails its transcript (the disk filled while appends went on, a crash, a DB
writer that died with ops queued) used to catch up in ONE transaction: every page it wrote went to
the WAL, which cannot start over before that transaction commits and a checkpoint copies it into the
database, so the catch-up needed about twice the index's size free (the index twice: in the WAL and in
the file). Here the bytes past the session's index mark are indexed a bounded slice at a time
(:func:`next_step`: whole lines, ``budget`` bytes), each slice its own transaction that moves the
mark over exactly its lines (``apply_plan`` of a tail plan, the one owner of the mark: the same rows,
receipts and mark a single catch-up writes, the receipts committed with their rows), and the WAL is
checkpointed between two slices once it passed a bound (:func:`run_steps`). A crash between two
commits leaves the mark at the end of the last one: the next catch-up resumes there, nothing indexed
twice, nothing skipped.

Only a transcript the index already covers in part (same epoch, mark past the header) is caught up in
slices; a whole reindex (another epoch, a rebuilt index) still runs in one transaction.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from store.faults import NO_FAULTS, Faults
from store.indexing import index
from store.indexing.database import checkpoint_wal
from store.indexing.reconcile import ReconcilePlan, apply_plan, read_header, repair_session, scan_from

__all__ = ["CATCH_UP_STEP_BYTES", "WAL_BOUND_BYTES", "Backlog", "Repair", "Steps", "checkpoint_between", "next_step",
           "run_steps", "wal_bytes"]

CATCH_UP_STEP_BYTES = 256 << 10
"""Transcript bytes one bounded commit indexes (whole lines; at least one line). Its pages in the WAL are
several times this: the index takes ~4.6 bytes per byte of prose (the trigram search index is most of it),
and FTS5's automerge folds older segments in the same transaction (10 MB of prose: 1.4 to 8.9 MB of WAL
per commit at 256 KiB, 5 to 20 MB at 1 MiB; against 46 MB in one transaction)."""
WAL_BOUND_BYTES = 1 << 20
"""Past this size the WAL is checkpointed before the next bounded commit (and truncated when no reader
holds an older snapshot), so it starts over instead of growing with the backlog."""
_CHECKPOINT_WAIT_MS = 200
"""How long a checkpoint between two commits waits for a reader to leave the WAL's old frames."""


@dataclass(frozen=True)
class Backlog:
    """A session whose index may trail its transcript far: what :func:`run_steps` catches up."""

    session_id: str
    path: Path
    now_ms: int
    stop: int | None = None
    """A line end the steps stay within (an index op's start: its own lines are its own); None: the file's end."""

    def catch_up(self, conn: sqlite3.Connection, *, commit: Callable[[], None] | None = None,
                 faults: Faults = NO_FAULTS, on_commit: Callable[[Steps], None] | None = None) -> Steps:
        """:func:`run_steps` of this backlog (what ``GroupCommit`` calls: it imports nothing of this module)."""
        return run_steps(conn, self, commit=commit, faults=faults, on_commit=on_commit)


def next_step(conn: sqlite3.Connection, backlog: Backlog, *, budget: int = CATCH_UP_STEP_BYTES) -> ReconcilePlan | None:
    """The next slice of the transcript past the session's index mark: a tail plan of the whole lines
    within ``budget`` bytes of the mark (one longer line alone), read outside any transaction (the
    DB writer is the only one that moves the mark).

    ``None`` when nothing is left for a bounded step: the mark is within ``budget`` of the stop (or of
    the file's end), the file is not the one the mark counts (another epoch, no mark yet, no file) or no
    whole line follows the mark. The caller's ordinary path indexes that rest in its own transaction,
    as before.
    """
    mark = index.index_mark(conn, backlog.session_id)
    if mark is None or mark[0] <= 0:
        return None
    start, epoch = mark
    if backlog.stop is not None and backlog.stop - start <= budget:
        return None  # the usual index op: its mark is at (or just short of) its start
    try:
        end = os.stat(backlog.path).st_size
    except FileNotFoundError:
        return None
    if backlog.stop is not None:
        end = min(end, backlog.stop)
    if end - start <= budget:
        return None
    header = read_header(backlog.path)
    if header is None or header.get("epoch") != epoch:
        return None
    window = budget
    while True:
        scan = scan_from(backlog.path, start, min(end, start + window))
        if scan.end > start:
            return ReconcilePlan(kind="tail", file_len=scan.end, epoch=epoch, scan=scan)
        if start + window >= end:
            return None  # no whole line (a torn tail or damage): for the ordinary path
        window *= 4


def wal_bytes(conn: sqlite3.Connection) -> int:
    """The size of the connection's WAL file (0 when there is none)."""
    row = conn.execute("PRAGMA database_list").fetchone()
    if row is None or not row[2]:
        return 0
    try:
        return os.stat(f"{row[2]}-wal").st_size
    except FileNotFoundError:
        return 0


def checkpoint_between(conn: sqlite3.Connection, *, truncate: bool = False) -> bool:
    """Between two bounded commits (none open): every frame of the WAL into the database, so the next
    commit starts it over instead of growing it. True when that holds.

    ``PASSIVE`` first (the commit's own autocheckpoint often did it already: then nothing is copied or
    synced again); when a reader on the read pool still holds old frames, or ``truncate`` (a WAL a full
    disk's failed transactions left large, given back before the first commit), ``TRUNCATE``, which
    waits at most :data:`_CHECKPOINT_WAIT_MS` for the readers (reads are short; a long one keeps the
    WAL growing meanwhile, as it would for any writes). The writer's ``busy_timeout`` is put back."""
    if not truncate:
        busy, log, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if not busy and log == done:
            return True
    return not checkpoint_wal(conn, wait_ms=_CHECKPOINT_WAIT_MS).busy


@dataclass
class Steps:
    """What :func:`run_steps` did."""

    commits: int = 0
    indexed_bytes: int = 0
    checkpoints: int = 0
    wal_peak: int = 0
    """The WAL's size after the largest commit (it only grows within a transaction: its peak)."""
    messages: int = 0
    """Message lines indexed."""
    bad_lines: list[int] = field(default_factory=list)
    """Offsets of the unparsable lines the slices skipped (as a single catch-up's scan lists them)."""
    unknown_lines: int = 0
    pinned: int = 0
    """Checkpoints a reader kept from the WAL's old frames past their wait (a long read): each commit
    after one adds its pages to the WAL instead of starting it over."""


def run_steps(conn: sqlite3.Connection, backlog: Backlog, *, commit: Callable[[], None] | None = None,
              faults: Faults = NO_FAULTS, budget: int = CATCH_UP_STEP_BYTES, wal_bound: int = WAL_BOUND_BYTES,
              on_commit: Callable[[Steps], None] | None = None) -> Steps:
    """Catch ``backlog`` up one :func:`next_step` slice per transaction until none is left, each slice
    indexed by ``apply_plan`` (its rows, the receipts its lines carry and the mark at its end, together)
    and committed by ``commit()`` (default a plain ``COMMIT``), the WAL checkpointed before each once it
    passed ``wal_bound`` (a WAL a full disk left large is truncated before the first). An error rolls
    back the open slice only and propagates: the slices before it are committed, each with the
    session's mark at its end. ``on_commit``: told after each commit."""
    done = Steps()
    while True:
        plan = next_step(conn, backlog, budget=budget)
        if plan is None:
            return done
        assert plan.scan is not None
        start = plan.scan.start
        if wal_bytes(conn) > wal_bound:  # the WAL starts over (a WAL a full disk left large shrinks first)
            if checkpoint_between(conn, truncate=not done.commits):
                done.checkpoints += 1
            else:
                done.pinned += 1
        conn.execute("BEGIN IMMEDIATE")
        try:
            if index.index_mark(conn, backlog.session_id) != (start, plan.epoch):
                conn.execute("ROLLBACK")  # not with one writer; a slice is never indexed twice
                return done
            apply_plan(conn, backlog.session_id, plan, now_ms=backlog.now_ms)
            faults.point("index.catch_up.before_commit")
            if commit is None:
                conn.execute("COMMIT")
            else:
                commit()
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        done.commits += 1
        done.indexed_bytes += plan.file_len - start
        done.messages += len(plan.scan.messages)
        done.bad_lines += plan.scan.bad_lines
        done.unknown_lines += plan.scan.unknown_lines
        size = wal_bytes(conn)
        done.wal_peak = max(done.wal_peak, size)
        if on_commit is not None:
            on_commit(done)
        faults.point("index.catch_up.after_commit")  # between two bounded commits


@dataclass(frozen=True)
class Repair:
    """The DB-writer op that repairs a session whose deferred index op failed (``repair(conn)``:
    ``reconcile.repair_session``, the transcript indexed past the mark), with its :attr:`backlog`
    caught up in bounded commits before it (the ops that failed while a disk was full may be many)."""

    session_id: str
    path: Path
    now_ms: int

    def __call__(self, conn: sqlite3.Connection) -> dict[str, Any]:
        return repair_session(conn, self.session_id, self.path, now_ms=self.now_ms)

    @property
    def backlog(self) -> Backlog:
        return Backlog(self.session_id, self.path, self.now_ms)
