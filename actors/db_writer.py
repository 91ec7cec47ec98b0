"""The DB-writer actor: the only code that writes SQLite.

Group commit: the actor takes one request, drains whatever else is already
waiting (up to ``batch_limit``), runs them in ONE transaction with a SAVEPOINT
per request (a failing request rolls back alone), commits once, then replies
to each. A batch made only of derived-index writes (rows that boot can rebuild
from transcripts) commits with ``synchronous=NORMAL``; any batch holding
DB-only state commits with ``FULL`` (ARCHITECTURE.md "Durability").

Idle upkeep: once the mailbox has stayed empty for ``upkeep_after`` seconds
(after a batch, and once after start), the writer folds the search index's
segments together with bounded FTS5 merge steps (``store.search.search_upkeep``),
one small ``NORMAL`` transaction each, until there is nothing left to merge.
A request that arrives meanwhile waits for the current step only.

The transaction mechanics (savepoints, the commit, the error codes) are
``store/indexing/group_commit.py``; this actor decides when a batch runs.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import trio

from runtime.kernel.actor import Actor, Envelope, Fatal
from runtime.kernel.threads import run_in_thread
from store.faults import NO_FAULTS, Faults
from store.indexing.appends import Written, follows, index_written, index_written_batch
from store.indexing.backlog import Backlog
from store.indexing.group_commit import GroupCommit, GroupStats, index_corrupt, is_corruption
from store.indexing.message_ids import MessageIds

DbWriterStats = GroupStats

__all__ = ["DbOp", "DbWriter", "DbWriterStats", "IndexOp"]


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DbOp:
    """One request: ``fn(conn)`` runs inside the batch transaction under its own SAVEPOINT."""

    fn: Callable[[sqlite3.Connection], Any]
    durable: bool = True
    label: str = ""
    requests: int = 1
    sessions: frozenset[str] | None = None
    """May change any row (see ``Op.sessions``)."""
    backlogs: tuple[Backlog, ...] = ()
    """Sessions to catch up in bounded commits before the batch (a repair's, a catch-up's: their index may
    trail their transcript far; ``GroupCommit.run``)."""


@dataclass(frozen=True)
class IndexOp:
    """Index lines a session actor made durable (``store.indexing.appends.index_written``): derived
    rows, a ``NORMAL`` commit. The ops of one session whose lines follow each other in a batch run
    as one (:func:`_runs`)."""

    written: Written
    now_ms: int
    durable: bool = False
    label: str = "index"
    requests: int = 1
    mark_known: bool = False
    """The DB writer's last commit for this session left its index mark at this op's start (the op
    before it committed): no backlog to look for (:attr:`backlogs`)."""

    @property
    def fn(self) -> Callable[[sqlite3.Connection], Any]:
        return partial(index_written, w=self.written, now_ms=self.now_ms)

    @property
    def sessions(self) -> frozenset[str]:
        return frozenset((self.written.session_id,))

    @property
    def backlogs(self) -> tuple[Backlog, ...]:
        """The bytes before its lines that the index misses (earlier ops that failed while the disk was
        full...), caught up in bounded commits when they are many (``store.indexing.backlog.next_step``:
        one indexed read when the mark stands at its lines, as it does but after a failure)."""
        if self.mark_known:
            return ()
        w = self.written
        return (Backlog(w.session_id, w.path, self.now_ms, stop=w.start),)


@dataclass(frozen=True)
class _IndexBatch:
    """Index ops run as one op: per session, the ops whose lines follow each other, joined; the
    sessions' new rows in one INSERT per table (``index_written_batch``). Its value holds each
    op's own outcome, in the order of ``ops``."""

    runs: Sequence[Sequence[IndexOp]]
    durable: bool = False

    @property
    def ops(self) -> list[IndexOp]:
        return [op for run in self.runs for op in run]

    @property
    def requests(self) -> int:
        return len(self.ops)

    @property
    def sessions(self) -> frozenset[str]:
        return frozenset(op.written.session_id for op in self.ops)

    @property
    def backlogs(self) -> tuple[Backlog, ...]:
        return tuple(b for run in self.runs for b in run[0].backlogs)

    @property
    def fn(self) -> Callable[[sqlite3.Connection], Any]:
        return partial(_index_batch, runs=[[op.written for op in run] for run in self.runs],
                       now_ms=[max(op.now_ms for op in run) for run in self.runs])


def _index_batch(conn: sqlite3.Connection, *, runs: list[list[Written]],
                 now_ms: list[int]) -> list[tuple[bool, Any]]:
    return [one for run in index_written_batch(conn, runs, now_ms=now_ms) for one in run]


Planned = DbOp | IndexOp | _IndexBatch


def _runs(envs: Sequence[Envelope]) -> list[tuple[Planned, list[Envelope]]]:
    """The batch's ops in order, with the index ops between two other ops joined into one
    (:class:`_IndexBatch`) at the place of the first: per session, those whose lines follow each
    other (``follows``) run as one op; a session's op that does not follow starts the next batch
    (a gap or another file is for ``index_written``'s own cover rules, not for held rows). One statement
    per table and one search-index segment for them all instead of one per op. Index ops of
    different sessions touch different rows, so only their relative order changes; any other op
    ends the open batch (it may read or change what they index)."""
    out: list[tuple[Planned, list[Envelope]]] = []
    runs: list[list[Envelope]] = []  # of the open batch, in order of their first op
    last_of: dict[str, list[Envelope]] = {}  # session -> its open run

    def close() -> None:
        if not runs:
            return
        group = [env for run in runs for env in run]
        if len(group) == 1:
            out.append((group[0].msg, group))
        else:
            out.append((_IndexBatch([[env.msg for env in run] for run in runs]), group))
        runs.clear()
        last_of.clear()

    for env in envs:
        msg = env.msg
        if not isinstance(msg, IndexOp):
            close()
            out.append((msg, [env]))
            continue
        run = last_of.get(msg.written.session_id)
        if run is not None:
            if follows(run[-1].msg.written, msg.written):
                run.append(env)
                continue
            close()  # one run per session in a batch: this op starts the next batch
        run = [env]
        runs.append(run)
        last_of[msg.written.session_id] = run
    close()
    return out


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
        index_hold: float = 0.0,
        index_wanted: Callable[[], bool] | None = None,
        on_corruption: Callable[[BaseException], None] | None = None,
        message_ids: MessageIds | None = None,
    ) -> None:
        super().__init__(name, mailbox_size=mailbox_size)
        self._conn = conn
        self._message_ids = message_ids
        """The filter of indexed message ids that appends test (``store.indexing.message_ids``): fed by a
        TEMP trigger on ``conn``, (re)built on it at every start of this actor unless already fed by it."""
        self._on_corruption = on_corruption or (lambda exc: None)
        """Told (from the trio thread) before the actor crashes on a corrupt database: the host restarts
        itself on a rebuilt index (RELIABILITY.md row 7)."""
        self.batch_limit = batch_limit
        self.idle_work_after = upkeep_after  # None: no idle upkeep
        self.linger_ticks = 2  # sessions committing at the same moment share one transaction
        self.hold_seconds = index_hold
        self._index_wanted = index_wanted or (lambda: True)
        self.drain_on_stop = True  # a stop commits what is already queued (index rows of acknowledged appends)
        self._commit = GroupCommit(conn, faults=faults, force_synchronous=force_synchronous, stats=stats)
        self._limiter = trio.CapacityLimiter(1)
        self.stats = self._commit.stats
        self._marks = _Marks()

    def may_hold(self, batch: list[Envelope]) -> bool:
        return not self._index_wanted() and all(_holdable(env.msg) for env in batch)

    def ends_hold(self, msg: Any) -> bool:
        return not _holdable(msg)

    async def on_start(self) -> None:
        await trio.to_thread.run_sync(self._start, limiter=self._limiter)

    def _start(self) -> None:
        self._commit.reset()
        if self._message_ids is None:
            return
        try:  # in this thread, before any op: nothing writes through the connection while it is built
            self._message_ids.attach(self._conn)
        except (sqlite3.Error, UnicodeDecodeError) as exc:  # appends look every id up; the ops meet the cause
            self._message_ids.detach()
            log.warning("the filter of indexed message ids was not built: every append looks its id up (%s)", exc)

    async def on_idle(self) -> bool:
        outcome = await trio.to_thread.run_sync(self._commit.upkeep, limiter=self._limiter)
        if isinstance(outcome, BaseException):
            if is_corruption(outcome):
                self._on_corruption(outcome)
                raise Fatal(outcome)
            return False  # disk full, I/O error: try again after the next batch
        return outcome

    async def handle(self, msg: Any) -> Any:  # pragma: no cover - handle_batch is used
        raise NotImplementedError

    async def handle_batch(self, batch: list[Envelope]) -> None:
        envs: list[Envelope] = []
        for env in batch:
            if isinstance(env.msg, DbOp | IndexOp):
                envs.append(env)
            elif env.reply is not None:
                env.reply.set_exception(TypeError(f"db-writer got {type(env.msg).__name__}, not DbOp"))
        if not envs:
            return
        runs = [(self._marks.known(op), group) for op, group in _runs(envs)]
        outcome = await run_in_thread(self._commit.run, [op for op, _ in runs])  # one batch at a time
        corrupt = index_corrupt(outcome) if isinstance(outcome, sqlite3.DatabaseError | UnicodeDecodeError) \
            and is_corruption(outcome) else None
        if corrupt is not None:
            outcome = corrupt  # what each request of the batch answers (CORRUPT_DATA)
        results: list[tuple[bool, Any]] = [(False, outcome)] * len(runs) if isinstance(outcome, BaseException) \
            else outcome
        for (op, group), (ok, value) in zip(runs, results, strict=True):
            if isinstance(op, _IndexBatch) and ok:
                for env, (one_ok, one_value) in zip(group, value, strict=True):
                    self._marks.settled(env.msg, one_ok)
                    _deliver(env, one_ok, one_value)
            else:
                for env in group:
                    self._marks.settled(env.msg, ok)
                    _deliver(env, ok, value)
        if corrupt is not None:
            self._on_corruption(corrupt)
            raise Fatal(corrupt)


@dataclass
class _Marks:
    """Per session, the index mark the DB writer's last commit of an index op of it left (the end of
    its lines, at their epoch): an op whose lines start there has no backlog before them, and is sent
    without one (``IndexOp.mark_known``): no read of the mark per op in the usual case. Bounded (past
    ``LIMIT`` sessions it starts empty again: each then costs one read once). Never wrong for the
    catch-up: a mark only moves forward within an epoch (a repair's, a catch-up's), and a stale entry
    names an old epoch or a start the next op does not have."""

    at: dict[str, tuple[int, str | None]] = field(default_factory=dict)

    LIMIT = 4096

    def known(self, op: Planned) -> Planned:
        """``op`` with the sessions whose mark stands at its lines' start marked known."""
        if isinstance(op, IndexOp):
            return replace(op, mark_known=True) if self._at_start(op) else op
        if isinstance(op, _IndexBatch):
            runs = [[replace(run[0], mark_known=True), *run[1:]] if self._at_start(run[0]) else run
                    for run in op.runs]
            return replace(op, runs=runs)
        return op

    def _at_start(self, op: IndexOp) -> bool:
        w = op.written
        return self.at.get(w.session_id) == (w.start, w.epoch)

    def settled(self, msg: Any, ok: bool) -> None:
        """The outcome of one request: an index op that committed left its session's mark at its end."""
        if not isinstance(msg, IndexOp):
            return
        w = msg.written
        if not ok:
            self.at.pop(w.session_id, None)
            return
        if len(self.at) >= self.LIMIT and w.session_id not in self.at:
            self.at.clear()
        self.at[w.session_id] = (w.end, w.epoch)


def _deliver(env: Envelope, ok: bool, value: Any) -> None:
    if env.reply is None:
        return
    if ok:
        env.reply.set_result(value)
    else:
        env.reply.set_exception(value)


def _holdable(msg: Any) -> bool:
    return isinstance(msg, IndexOp) or (isinstance(msg, DbOp) and not msg.durable and msg.label == "index")
