"""Group commit on the one SQLite write connection (synchronous; the DB-writer actor's thread).

:meth:`GroupCommit.run` executes a batch of operations in ONE transaction,
each under its own SAVEPOINT (one failing operation rolls back alone and gets
its own error), then commits once. A batch made only of derived-index writes
(rows boot can rebuild from transcripts) commits with ``synchronous=NORMAL``;
any batch holding DB-only state commits with ``FULL`` (ARCHITECTURE.md
"Durability"). :meth:`GroupCommit.upkeep` runs one bounded search-index merge
step in its own ``NORMAL`` transaction.

Errors become stable codes here: a full disk (``SQLITE_FULL``, ``ENOSPC``) in
any statement or in the COMMIT is ``STORAGE_FULL`` (retriable), a key
constraint (UNIQUE, PRIMARY KEY, FOREIGN KEY: a duplicate, or a row another
request removed) is ``CONFLICT``; a corrupt database is returned as is, for the
actor to crash on (the supervisor then restarts it and boot rebuilds the file).
Any other constraint (NOT NULL, CHECK, a trigger's RAISE, a datatype) refuses a
value the host itself wrote (requests are validated first), so it is never a
client's conflict: if ``PRAGMA quick_check`` then finds a row that breaks its
table's constraints (the host copied a damaged value), or the stored schema is
not the one the host creates (a damaged byte in a CHECK's literal refused a
valid value), the index is damaged and it is treated as such (CORRUPT_DATA,
rebuild); otherwise it is a host bug, left unmapped (INTERNAL).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Any, Protocol

from store.errors import Conflict, IOFailure, StorageFull, StoreError, classify_os_error
from store.faults import NO_FAULTS, Faults
from store.indexing.corruption import altered_definition, is_corruption
from store.search.search_upkeep import upkeep_step

__all__ = ["GroupCommit", "GroupStats", "IndexCorrupt", "Op", "attempt", "index_corrupt", "is_corruption",
           "is_key_conflict"]

_FULL_MARKERS = ("disk is full", "database or disk is full")


class Op(Protocol):
    """One op of a batch: ``fn(conn)`` under a savepoint; ``durable`` asks for a FULL commit;
    ``requests``: how many requests it answers (an op may join several, the stats count them)."""

    @property
    def fn(self) -> Callable[[sqlite3.Connection], Any]: ...

    @property
    def durable(self) -> bool: ...

    @property
    def requests(self) -> int: ...

    @property
    def sessions(self) -> frozenset[str] | None:
        """The sessions whose rows it may change (an index op: its own); ``None``: any row at all."""


@dataclass
class GroupStats:
    batches: int = 0
    ops: int = 0
    full_commits: int = 0
    normal_commits: int = 0
    max_batch: int = 0
    failed_commits: int = 0
    last_batch_ms: float = 0.0
    sync_modes: dict[str, int] = field(default_factory=dict)
    upkeep_steps: int = 0
    upkeep_failures: int = 0
    upkeep_ms: float = 0.0
    catch_up_commits: int = 0
    """Bounded commits of a backlog catch-up (``store.indexing.backlog``), each its own transaction."""
    catch_up_failures: int = 0
    """Catch-ups stopped by an error (a full disk...): the op that carried it answers that error."""
    integrity_checks: int = 0
    """Tables the idle integrity sweep checked since start (``actors/integrity_sweep.py``)."""
    integrity_passes: int = 0
    writes_begun: int = 0
    """Transactions the DB writer set out to open (a batch, an upkeep step), counted before it asks for the
    write lock: the integrity sweep's FTS5 check, which holds that lock, gives way when this moves."""
    generation: int = 0
    """Odd while the COMMIT of a batch runs, bumped again once it is over: the same even value read
    before a snapshot and after using it means no batch commit became visible in between (a read-ahead's
    check). An upkeep commit leaves it alone: an FTS5 merge rewrites only the search index's own shadow
    tables, which hold the same index after it; no other table and no query result changes
    (``store.search.search_upkeep``), and a ``session.get`` page reads none of them."""
    touched: dict[str, int] = field(default_factory=dict)
    """Per session, :attr:`generation` at the last batch commit that held an op limited to it (an index
    op: ``Op.sessions``), odd while that commit runs: see :meth:`generation_of`."""
    everyone: int = 0
    """:attr:`generation` at the last batch commit holding an op that may change any row, odd while it runs."""

    TOUCHED_LIMIT = 4096
    """Sessions remembered in :attr:`touched`; past it the map is cleared and :attr:`everyone` moved to
    now: every session then counts as changed once (conservative, bounded)."""

    def generation_of(self, session_id: str) -> int:
        """The generation a read of this session's rows checks: the same even value before a read and
        after using it means no commit that could change them became visible in between. Commits
        limited to other sessions (their index ops) leave it alone."""
        return max(self.everyone, self.touched.get(session_id, 0))

    def _mark(self, sessions: frozenset[str] | None) -> None:
        if sessions is None:
            self.everyone = self.generation
            return
        if len(self.touched) + len(sessions) > self.TOUCHED_LIMIT:
            self.touched.clear()
            self.everyone = self.generation
        for sid in sessions:
            self.touched[sid] = self.generation


def _sessions_of(ops: Sequence[Op]) -> frozenset[str] | None:
    out: set[str] = set()
    for op in ops:
        mine = op.sessions
        if mine is None:
            return None
        out |= mine
    return frozenset(out)


class Backlog(Protocol):
    """A session whose index may trail its transcript far (``store.indexing.backlog.Backlog``)."""

    @property
    def session_id(self) -> str: ...

    def catch_up(self, conn: sqlite3.Connection, *, commit: Callable[[], None] | None = None,
                 faults: Faults = NO_FAULTS, on_commit: Callable[[Any], None] | None = None) -> object:
        """Index it in bounded commits, each committed by ``commit()``."""


def _backlogs(op: Op) -> Sequence[Backlog]:
    """An op's ``backlogs`` (optional): sessions whose index may trail their transcript far (an index
    op's, a repair's), caught up in bounded commits before the batch's transaction (:meth:`GroupCommit.run`)."""
    found: Sequence[Backlog] = getattr(op, "backlogs", ())
    return found


class IndexCorrupt(sqlite3.DatabaseError):
    """The index database met corrupt while the host runs (RELIABILITY.md row 7), as the reader or the DB writer
    that met it raises it on: still an ``sqlite3.DatabaseError`` for whoever catches those, and ``CORRUPT_DATA``
    for the client (it carries its code, like a ``StoreError``). The host restarts on a rebuilt index."""

    code = "CORRUPT_DATA"
    message = ("the index database is corrupt; the host restarts on an index rebuilt from the transcripts: "
               "reconnect and retry")
    data: Mapping[str, Any] = MappingProxyType({"reason": "index_corrupt"})


def index_corrupt(exc: sqlite3.DatabaseError | UnicodeDecodeError) -> IndexCorrupt:
    """``exc`` (:func:`is_corruption`) as what a request that met it answers; its cause kept."""
    if isinstance(exc, IndexCorrupt):
        return exc
    corrupt = IndexCorrupt(str(exc))
    corrupt.__cause__ = exc
    return corrupt


_KEY_CONSTRAINTS = frozenset({"SQLITE_CONSTRAINT_UNIQUE", "SQLITE_CONSTRAINT_PRIMARYKEY", "SQLITE_CONSTRAINT_ROWID",
                              "SQLITE_CONSTRAINT_FOREIGNKEY"})


def is_key_conflict(exc: BaseException) -> bool:
    """``exc`` is a constraint a request can meet on a healthy index: a key that is taken (UNIQUE, PRIMARY
    KEY) or a row it names that another request removed (FOREIGN KEY). An ``IntegrityError`` that SQLite
    did not name (raised by hand) counts as one, as every constraint did before."""
    if not isinstance(exc, sqlite3.IntegrityError):
        return False
    name = getattr(exc, "sqlite_errorname", None)
    return name is None or name in _KEY_CONSTRAINTS


def _damage_behind(conn: sqlite3.Connection, exc: sqlite3.IntegrityError) -> sqlite3.DatabaseError | None:
    """After a constraint that only a value the host wrote can break: damage if ``PRAGMA quick_check`` finds
    a row against its table's constraints (the host copied a damaged value), or if the stored schema is not
    the host's (a damaged byte in a CHECK's literal refused a valid value: ``altered_definition``), as the
    error that says so."""
    try:
        rows = [str(r[0]) for r in conn.execute("PRAGMA quick_check(20)")]
        altered = altered_definition(conn) if rows == ["ok"] else None
    except sqlite3.DatabaseError as failed:
        return failed if is_corruption(failed) else None
    if altered is not None:
        return sqlite3.DatabaseError(f"database disk image is malformed: {exc} ({altered})")
    if rows == ["ok"]:
        return None
    return sqlite3.DatabaseError(f"database disk image is malformed: {exc} ({'; '.join(rows[:5])[:500]})")


def _is_full(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and any(m in str(exc).lower() for m in _FULL_MARKERS)


def attempt(conn: sqlite3.Connection, name: str, fn: Callable[[], Any]) -> tuple[bool, Any]:
    """``(True, fn())`` under SAVEPOINT ``name``, or ``(False, the exception)`` with everything ``fn``
    did rolled back (the rest of the transaction stays). A corrupt database propagates, and so does
    an error after which SQLite rolled the whole transaction back itself (``SQLITE_FULL`` may): no
    savepoint is left to roll back to, and the rest of the transaction is gone too."""
    conn.execute(f"SAVEPOINT {name}")
    try:
        value = fn()
    except Exception as exc:  # noqa: BLE001 - the caller's outcome
        if is_corruption(exc) or not conn.in_transaction:
            raise
        conn.execute(f"ROLLBACK TO {name}")
        conn.execute(f"RELEASE {name}")
        if isinstance(exc, sqlite3.IntegrityError) and not is_key_conflict(exc):
            damage = _damage_behind(conn, exc)
            if damage is not None:
                raise damage from exc
        return False, exc
    conn.execute(f"RELEASE {name}")
    return True, value


def db_error(exc: BaseException, what: str) -> BaseException:
    """The stable error for a failure of one statement or of the commit."""
    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, OSError):
        return classify_os_error(exc, what)
    if _is_full(exc):
        return StorageFull(f"{what}: the disk is full ({exc})")
    if is_key_conflict(exc):
        return Conflict(f"constraint failed: {exc}")
    return exc  # any other constraint: a value the host wrote (INTERNAL); damage was told apart in attempt()


class GroupCommit:
    def __init__(self, conn: sqlite3.Connection, *, faults: Faults = NO_FAULTS, force_synchronous: str | None = None,
                 stats: GroupStats | None = None) -> None:
        self._conn = conn
        self._faults = faults
        self._force_sync = force_synchronous
        self._sync_mode: str | None = None
        self.stats = stats if stats is not None else GroupStats()

    def reset(self) -> None:
        """A new actor incarnation: end whatever transaction a crash left open."""
        if self._conn.in_transaction:
            self._conn.rollback()

    def run(self, ops: Sequence[Op]) -> list[tuple[bool, Any]] | BaseException:
        """Every op in one transaction (a savepoint each), one commit. Per-op (ok, value or error),
        or the error that failed the whole batch (nothing of it committed). Before it, the ops'
        backlogs (:func:`_backlogs`) are caught up in bounded commits of their own (:meth:`_catch_up`);
        an op whose catch-up failed (a full disk) is not run: it answers that error, and never indexes
        the whole backlog in the batch's one transaction instead (twice the index's size in the WAL)."""
        started = time.perf_counter()
        mode = self._force_sync or ("FULL" if any(op.durable for op in ops) else "NORMAL")
        try:
            stopped: dict[int, Exception] = {}
            for i, op in enumerate(ops):
                for backlog in _backlogs(op):
                    failure = self._catch_up(backlog)
                    if failure is not None:
                        stopped[i] = failure
                        break
            self.stats.writes_begun += 1
            self._use_synchronous(mode)
            results = self._execute(ops, stopped)
            self._faults.point("index.before_commit")
            self._commit(sessions=_sessions_of(ops))
            self._faults.point("index.after_commit")
        except BaseException as exc:  # noqa: BLE001 - returned so the actor can fail every asker
            self._rollback_quietly()
            self.stats.failed_commits += 1
            if not isinstance(exc, Exception):
                raise
            error = db_error(exc, "index commit")
            if error is exc and not is_corruption(exc):
                return IOFailure(f"index commit failed: {exc}")
            return error
        st = self.stats
        st.batches += 1
        requests = sum(op.requests for op in ops)
        st.ops += requests
        st.max_batch = max(st.max_batch, requests)
        st.sync_modes[mode] = st.sync_modes.get(mode, 0) + 1
        if mode == "FULL":
            st.full_commits += 1
        else:
            st.normal_commits += 1
        st.last_batch_ms = (time.perf_counter() - started) * 1000
        return results

    def upkeep(self) -> bool | BaseException:
        """One search-index merge step in its own transaction: True if work is left."""
        conn = self._conn
        started = time.perf_counter()
        self.stats.writes_begun += 1
        try:
            self._use_synchronous(self._force_sync or "NORMAL")  # derived rows only
            conn.execute("BEGIN IMMEDIATE")
            merged = upkeep_step(conn)
            self._faults.point("upkeep.before_commit")
            self._commit(visible=False)
            self._faults.point("upkeep.after_commit")
        except sqlite3.Error as exc:
            self._rollback_quietly()
            self.stats.upkeep_failures += 1
            return exc
        if merged:
            self.stats.upkeep_steps += 1
        self.stats.upkeep_ms += (time.perf_counter() - started) * 1000
        return merged

    # -- internals -------------------------------------------------------------
    def _catch_up(self, backlog: Backlog) -> Exception | None:
        """A session far behind its transcript, indexed in bounded ``NORMAL`` commits (derived rows, the
        receipts its lines carry with them) before the batch's own transaction, the WAL checkpointed
        between them (``store.indexing.backlog``): the batch then finds its op's mark at (or near) its
        lines. An error stops it with the slices before it committed, and is returned (a corrupt
        database propagates)."""
        st = self.stats
        sessions = frozenset((backlog.session_id,))

        def committed(_steps: object) -> None:
            st.catch_up_commits += 1
            st.writes_begun += 1  # the next slice's transaction (or the batch's)

        st.writes_begun += 1
        try:
            self._use_synchronous(self._force_sync or "NORMAL")
            backlog.catch_up(self._conn, commit=partial(self._commit, sessions=sessions), faults=self._faults,
                             on_commit=committed)
        except Exception as exc:  # noqa: BLE001 - the op that carried it answers it
            self._rollback_quietly()
            if is_corruption(exc):
                raise
            st.catch_up_failures += 1
            return exc
        return None

    def _commit(self, *, visible: bool = True, sessions: frozenset[str] | None = None) -> None:
        """``visible``: the transaction may change what a read returns (``GroupStats.generation``);
        ``sessions``: only the rows of these sessions (``None``: any)."""
        if not visible:
            self._conn.execute("COMMIT")
            return
        st = self.stats
        st.generation += 1
        st._mark(sessions)
        try:
            self._conn.execute("COMMIT")
        finally:
            st.generation += 1
            st._mark(sessions)

    def _use_synchronous(self, mode: str) -> None:
        if mode != self._sync_mode:
            self._conn.execute(f"PRAGMA synchronous = {mode}")
            self._sync_mode = mode

    def _rollback_quietly(self) -> None:
        """After a failure: end any open transaction (a failing ROLLBACK changes nothing more)."""
        try:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass

    def _execute(self, ops: Sequence[Op], stopped: Mapping[int, Exception]) -> list[tuple[bool, Any]]:
        """BEGIN and run every op under its own SAVEPOINT (no commit); those in ``stopped`` (their
        catch-up failed) answer its error instead."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        results: list[tuple[bool, Any]] = []
        for i, op in enumerate(ops):
            if i in stopped:
                results.append((False, db_error(stopped[i], "index catch-up")))
                continue
            ok, value = attempt(conn, "op", partial(op.fn, conn))
            results.append((ok, value if ok else db_error(value, "index write")))  # to that one asker
        return results
