"""The DB-writer actor: the only code that writes SQLite.

Group commit: the actor takes one request, drains whatever else is already
waiting (up to ``batch_limit``), runs them in ONE transaction with a SAVEPOINT
per request (a failing request rolls back alone), commits once, then replies
to each. A batch made only of derived-index writes (rows that boot can rebuild
from transcripts) commits with ``synchronous=NORMAL``; any batch holding
DB-only state commits with ``FULL`` (ARCHITECTURE.md "Durability").

Idle upkeep: once the mailbox has stayed empty for ``upkeep_after`` seconds
(after a batch, and once after start), the writer folds the search index's
segments together with bounded FTS5 merge steps (``store.search_upkeep``),
one small ``NORMAL`` transaction each, until there is nothing left to merge.
A request that arrives meanwhile waits for the current step only.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from runtime.kernel.actor import Actor, Envelope, Fatal
from store.errors import Conflict, IOFailure, StorageFull, StoreError, classify_os_error
from store.faults import NO_FAULTS, Faults
from store.search_upkeep import upkeep_step

_CORRUPT_MARKERS = ("malformed", "not a database", "disk image", "corrupt")


@dataclass(frozen=True)
class DbOp:
    """One request: ``fn(conn)`` runs inside the batch transaction under its own SAVEPOINT."""

    fn: Callable[[sqlite3.Connection], Any]
    durable: bool = True
    label: str = ""


@dataclass
class DbWriterStats:
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


class DbWriter(Actor):
    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        name: str = "db-writer",
        mailbox_size: int = 1024,
        batch_limit: int = 512,
        faults: Faults = NO_FAULTS,
        stats: DbWriterStats | None = None,
        force_synchronous: str | None = None,
        upkeep_after: float | None = None,
    ) -> None:
        super().__init__(name, mailbox_size=mailbox_size)
        self.batch_limit = batch_limit
        self.idle_work_after = upkeep_after  # None: no idle upkeep
        self.linger_ticks = 2  # sessions committing at the same moment share one transaction
        self.drain_on_stop = True  # a stop commits what is already queued (index rows of acknowledged appends)
        self._conn = conn
        self._faults = faults
        self._limiter = trio.CapacityLimiter(1)
        self._sync_mode: str | None = None
        self._force_sync = force_synchronous
        self.stats = stats if stats is not None else DbWriterStats()

    async def on_start(self) -> None:
        await trio.to_thread.run_sync(self._reset, limiter=self._limiter)

    def _reset(self) -> None:
        if self._conn.in_transaction:
            self._conn.rollback()

    async def on_idle(self) -> bool:
        outcome = await trio.to_thread.run_sync(self._upkeep_step, limiter=self._limiter)
        if isinstance(outcome, BaseException):
            if _is_corruption(outcome):
                raise Fatal(outcome)
            return False  # disk full, I/O error: try again after the next batch
        return outcome

    def _upkeep_step(self) -> bool | BaseException:
        """One search-index merge step in its own transaction (worker thread)."""
        conn = self._conn
        started = time.perf_counter()
        try:
            self._use_synchronous(self._force_sync or "NORMAL")  # derived rows only
            conn.execute("BEGIN IMMEDIATE")
            merged = upkeep_step(conn)
            self._faults.point("upkeep.before_commit")
            conn.execute("COMMIT")
            self._faults.point("upkeep.after_commit")
        except sqlite3.Error as exc:
            self._rollback_quietly()
            self.stats.upkeep_failures += 1
            return exc
        if merged:
            self.stats.upkeep_steps += 1
        self.stats.upkeep_ms += (time.perf_counter() - started) * 1000
        return merged

    async def handle(self, msg: Any) -> Any:  # pragma: no cover - handle_batch is used
        raise NotImplementedError

    async def handle_batch(self, batch: list[Envelope]) -> None:
        ops: list[DbOp] = []
        for env in batch:
            if not isinstance(env.msg, DbOp):
                if env.reply is not None:
                    env.reply.set_exception(TypeError(f"db-writer got {type(env.msg).__name__}, not DbOp"))
                continue
            ops.append(env.msg)
        envs = [env for env in batch if isinstance(env.msg, DbOp)]
        if not ops:
            return
        outcome = await trio.to_thread.run_sync(self._run_batch, ops, limiter=self._limiter)
        fatal: BaseException | None = None
        if isinstance(outcome, BaseException):
            fatal = outcome
            results: list[tuple[bool, Any]] = [(False, IOFailure(f"index commit failed: {outcome}"))] * len(envs)
        else:
            results = outcome
        for env, (ok, value) in zip(envs, results, strict=True):
            if env.reply is None:
                continue
            if ok:
                env.reply.set_result(value)
            else:
                env.reply.set_exception(value)
        if fatal is not None and _is_corruption(fatal):
            raise Fatal(fatal)

    # runs in the actor's worker thread -------------------------------------
    def _run_batch(self, ops: list[DbOp]) -> list[tuple[bool, Any]] | BaseException:
        conn = self._conn
        started = time.perf_counter()
        mode = self._force_sync or ("FULL" if any(op.durable for op in ops) else "NORMAL")
        try:
            self._use_synchronous(mode)
        except sqlite3.Error as exc:
            return exc
        try:
            results = self._execute(ops)
            self._faults.point("index.before_commit")
            conn.execute("COMMIT")
            self._faults.point("index.after_commit")
        except BaseException as exc:  # noqa: BLE001 - returned so the actor can fail every asker
            self._rollback_quietly()
            self.stats.failed_commits += 1
            if isinstance(exc, OSError):
                return classify_os_error(exc, "index commit")
            if not isinstance(exc, Exception):
                raise
            return exc
        self.stats.batches += 1
        self.stats.ops += len(ops)
        self.stats.max_batch = max(self.stats.max_batch, len(ops))
        self.stats.sync_modes[mode] = self.stats.sync_modes.get(mode, 0) + 1
        if mode == "FULL":
            self.stats.full_commits += 1
        else:
            self.stats.normal_commits += 1
        self.stats.last_batch_ms = (time.perf_counter() - started) * 1000
        return results

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

    def _execute(self, ops: list[DbOp]) -> list[tuple[bool, Any]]:
        """BEGIN and run every op under its own SAVEPOINT (no commit)."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        results: list[tuple[bool, Any]] = []
        for op in ops:
            conn.execute("SAVEPOINT op")
            try:
                value = op.fn(conn)
            except Exception as exc:  # noqa: BLE001 - delivered to that one asker
                conn.execute("ROLLBACK TO op")
                conn.execute("RELEASE op")
                results.append((False, _wrap_db_error(exc)))
                if isinstance(exc, sqlite3.DatabaseError) and _is_corruption(exc):
                    raise
            else:
                conn.execute("RELEASE op")
                results.append((True, value))
        return results


def _wrap_db_error(exc: Exception) -> Exception:
    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, sqlite3.IntegrityError):
        return Conflict(f"constraint failed: {exc}")
    if isinstance(exc, sqlite3.OperationalError) and "disk is full" in str(exc):
        return StorageFull(f"database: {exc}")
    return exc


def _is_corruption(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, sqlite3.DatabaseError) and any(m in text for m in _CORRUPT_MARKERS)
