"""What a session handler may do inside its session actor: :class:`SessionContext`.

Handlers get one per call. They read (one snapshot on the read pool, or in the
actor's own worker thread together with a file step), append lines, commit
(the effect's transaction with the call's receipt), publish events and keep
per-incarnation memos — never the actor's fields. A failed handler poisons the
actor (``actors/session.py``), which rebuilds from the transcript before the
next call.

Lines enter the transcript only through :meth:`SessionContext.append_lines`
(whole files through :meth:`SessionContext.rewrite_file`): the one owner of the
session's index mark and of the actor's file state (ARCHITECTURE.md "Read
barriers"). Its index op moves the mark by compare-and-set from the length
before the write and indexes any bytes the mark misses instead of jumping
over them; a deferred op that fails is repaired before it counts as covered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, TypeVarTuple

import outcome

from actors.db_writer import IndexOp
from actors.gateway_types import CallContext
from actors.index_log import IndexLog
from runtime.kernel.actor import ActorStopped, Busy, CallbackReply, InternalBug
from store import receipts
from store.errors import SessionNotFound, StoreError
from store.faults import Faults
from store.indexing import appends as store_appends
from store.indexing import index
from store.indexing.appends import Written
from store.indexing.backlog import Backlog, Repair
from store.indexing.message_ids import MessageIds
from store.jsonio import dumps_line, loads_line
from store.receipts import ReceiptKey, file_record
from store.transcripts.records import ms_to_rfc3339
from store.transcripts.session_files import SessionPaths
from store.trash import TRASHED_AT

if TYPE_CHECKING:
    from actors.session import SessionActor

T = TypeVar("T")
log = logging.getLogger("pi_host")
Ts = TypeVarTuple("Ts")

__all__ = ["SETTING_KEYS", "Appended", "Borrow", "CarriedAnswer", "FileShape", "Lines", "SessionContext", "UNSET",
           "session_info_line", "settings_of"]

SETTING_KEYS = ("title", "projectPath", "providerId", "modelId", "mode", "thinkingLevel", "permissionMode")


UNSET: Any = object()
"""``SessionContext.committed`` before the handler committed anything."""

F = TypeVar("F", bound="FileShape")


class FileShape(Protocol):
    """What a whole-file write leaves: the new file's length and epoch."""

    @property
    def file_len(self) -> int: ...

    @property
    def epoch(self) -> str | None: ...


Borrow = Callable[[], AbstractContextManager[Any]]
"""A read connection for a line-planning step, taken when the step reads (``ReadPool.borrow``)."""


@dataclass(frozen=True, slots=True)
class Lines:
    """Lines for :meth:`SessionContext.append_lines`, each a complete encoded line."""

    lines: Sequence[bytes]
    records: Sequence[Mapping[str, Any]] | None = None
    """The lines parsed, one per line, when the caller has them (nothing is parsed twice)."""
    seqs: Mapping[int, int] = field(default_factory=dict)
    """Line index -> the seq acknowledged for that new message id (the index checks it)."""
    held: Mapping[str, Any] = field(default_factory=dict)
    """``later=True``: message ids the index log holds until the op is covered (``Held`` values)."""
    last_seq: int = 0
    """``later=True``: the session's last seq once the lines are indexed."""


@dataclass(frozen=True, slots=True)
class Appended:
    """What :meth:`SessionContext.append_lines` did."""

    planned: Any = None
    """The step's plan (when ``lines`` was a step)."""
    end: int = 0
    """The transcript's length after the write."""
    refs: list[dict[str, Any]] = field(default_factory=list)
    """``later=False``: a MessageRef per message line, as indexed."""
    value: Any = None
    """``later=False``: ``then``'s value (the response, stored with the receipt)."""
    seq: int = 0
    """``later=True``: the index log sequence of the op."""


class SessionContext:
    """What a session handler may do: read, write lines, commit, publish. Never the actor's fields."""

    __slots__ = ("_actor", "caller", "receipt", "method", "committed")

    def __init__(self, actor: SessionActor, caller: CallContext, receipt: ReceiptKey | None, method: str = "") -> None:
        self._actor = actor
        self.caller = caller
        self.receipt = receipt
        self.method = method
        self.committed: Any = UNSET

    def without_receipt(self) -> SessionContext:
        """This call's context for a write that is not its effect (an undo after a failure): its
        commit stores no receipt, so a retry of the call runs it again instead of replaying that write."""
        return SessionContext(self._actor, self.caller, None, self.method)

    # -- identity and services
    @property
    def sid(self) -> str:
        return self._actor.sid

    @property
    def paths(self) -> SessionPaths:
        return self._actor.paths

    @property
    def faults(self) -> Faults:
        return self._actor.deps.faults

    @property
    def services(self) -> Any:
        return self._actor.deps.services

    @property
    def index_log(self) -> IndexLog:
        return self._actor.deps.index_log

    @property
    def message_ids(self) -> MessageIds | None:
        return self._actor.deps.message_ids

    @property
    def cache(self) -> dict[str, Any]:
        """Per-incarnation memo (cleared when the actor is poisoned): derived, never authoritative."""
        return self._actor.known.cache

    def now(self) -> int:
        return self._actor.deps.now_ms()

    # -- the session's state
    @property
    def row(self) -> dict[str, Any]:
        row = self._actor.known.row
        if row is None:
            raise SessionNotFound(f"session {self.sid} not found", data={"sessionId": self.sid})
        return row

    @property
    def exists(self) -> bool:
        return self._actor.known.row is not None and not self._actor.known.deleted

    @property
    def file_len(self) -> int:
        return self._actor.known.file_len

    @property
    def epoch(self) -> str | None:
        return self._actor.known.epoch

    async def ensure_ready(self) -> dict[str, Any]:
        """The session exists and the index covers every durable line; its row."""
        st = self._actor.known
        if st.deleted:
            raise SessionNotFound(f"session {self.sid} was deleted", data={"sessionId": self.sid})
        if st.needs_catchup:
            await self._actor.catch_up()
        return self.row

    async def catch_up(self) -> dict[str, Any] | None:
        """Re-derive the row from the index after reconciling it with the transcript."""
        await self._actor.catch_up()
        return self._actor.known.row

    def adopt_window_state(self, row: dict[str, Any], file_len: int, epoch: str | None) -> None:
        """A cold read proved the index clean for the file: take its row instead of catching up."""
        st = self._actor.known
        st.row, st.file_len, st.epoch, st.needs_catchup = row, file_len, epoch, False

    @property
    def needs_catchup(self) -> bool:
        return self._actor.known.needs_catchup

    def forget_session(self) -> None:
        """The session is gone (deleted): refuse everything but a create until then."""
        st = self._actor.known
        st.row, st.deleted, st.seen, st.file_len, st.epoch = None, True, False, 0, None
        st.cache.clear()

    def undelete(self) -> None:
        st = self._actor.known
        st.deleted = False
        st.needs_catchup = True

    def mark_stale(self) -> None:
        """Something changed that the in-memory state may not reflect: rebuild before the next call."""
        self._actor.poisoned = True

    # -- I/O
    async def io(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """Blocking file work in this actor's own worker thread."""
        return await self._actor.io(fn, *args)

    async def io_with_reader(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(conn, *args)`` in this actor's worker thread with a read connection (one hop for both) that
        sees every append this session acknowledged, as :meth:`read`'s does."""
        await self._actor.indexed()
        reads = self._actor.deps.reads

        def run() -> T:
            with reads.borrow() as conn:
                return fn(conn, *args)

        return await self._actor.io(run)

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(conn, *args)`` on a read-pool connection (one snapshot), after the index covers
        every append this session acknowledged."""
        return await self._actor.read(fn, *args)

    async def read_uncovered(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(conn, *args)`` on a read-pool connection without waiting for the index to cover this
        session's appends: only for what does not depend on them (a read served from the transcript
        while a full disk keeps the index behind)."""
        return await self._actor.deps.reads.run(fn, *args)

    async def landed(self, check: Callable[[Any], bool]) -> bool:
        """After :meth:`commit` raised: whether its transaction took place all the same (an error once the
        commit may have happened; ``store.receipts.landed``: the receipt's row, else ``check``, a read of the
        effect's rows). Not known (the read fails too): False."""
        try:
            return await self.read(receipts.landed, self.receipt, check)
        except StoreError:
            return False

    def read_ahead(self, key: Hashable, fn: Callable[..., T], *args: Any, bound: int,
                   size: Callable[[T], int]) -> None:
        """Read ``fn(conn, *args)`` (at most ``bound`` bytes) once this actor's mailbox is empty, for
        the next call only (:meth:`take_ahead` with the same ``key``; ``actors/session.py``)."""
        self._actor.read_ahead(key, fn, *args, bound=bound, size=size)

    def take_ahead(self, key: Hashable) -> Any:
        """What was read ahead as ``key`` for this call, if nothing changed since; else ``None``."""
        return self._actor.take_ahead(key)

    async def db(self, fn: Callable[[Any], T], *, durable: bool = True, backlogs: tuple[Backlog, ...] = ()) -> T:
        """One op in the DB writer's next transaction (no receipt: see :meth:`commit`); ``backlogs``:
        caught up in bounded commits before it (``store.indexing.backlog``)."""
        result: T = await self._actor.deps.db.write(fn, durable=durable, backlogs=backlogs)
        return result

    async def commit(self, fn: Callable[[Any], T], *, durable: bool = True, reload_row: bool = False,
                     backlogs: tuple[Backlog, ...] = ()) -> T:
        """The effect's transaction: ``fn(conn)`` plus this call's receipt row, atomically.

        Its value is the response; a handler with a receipt returns exactly it.
        ``reload_row``: the session's row is read again in that same transaction and
        becomes the actor's (a change to the row that writes no line: trash, restore).
        ``backlogs``: see :meth:`db`.
        """
        key, sid, now, faults, method = self.receipt, self.sid, self.now(), self.faults, self.method
        rows: list[dict[str, Any] | None] = []

        def op(conn: Any) -> T:
            value = fn(conn)
            if key is not None:
                receipts.store(conn, key, value, session_id=sid, now_ms=now)
            if reload_row:
                rows.append(index.session_row(conn, sid))
            faults.point(f"{method}.before_commit")
            return value

        value = await self.db(op, durable=durable or key is not None, backlogs=backlogs)
        faults.point(f"{method}.after_commit")
        if rows:
            self._actor.adopt_row(rows[-1])
        self.committed = value
        return value

    # -- lines: the only way anything enters the transcript
    async def append_lines(
        self,
        lines: Lines | Callable[[Borrow], tuple[Any, Lines]],
        *,
        later: bool = False,
        then: Callable[[Any, list[dict[str, Any]]], Any] | None = None,
        durable: bool = True,
        touch: bool = True,
        after_write: Callable[[], object] | None = None,
    ) -> Appended:
        """Append lines to the transcript durably, then index them: the one way lines enter it.

        ``lines`` is a :class:`Lines`, or ``step(borrow) -> (planned, Lines)`` that plans
        them in the same worker-thread hop as the write, with a read connection
        (``with borrow() as conn``) when it reads (the append group: one hop for read, plan,
        write and fdatasync). Then the index
        op (``store.indexing.appends.index_written``) indexes exactly these lines and
        moves the session's index mark by compare-and-set from the length before
        the write; if the mark is not there (an earlier op was lost) it indexes the
        missing bytes from the transcript first. The actor's state (file length,
        row) is updated here and nowhere else.

        * ``later=False``: ONE commit holds the index op, ``then(conn, refs)`` (the
          method's own DB change; its value is the response) and the call's receipt;
          the row is re-read in that transaction. ``Appended.value`` is ``then``'s.
        * ``later=True``: the lines are acknowledged now and the index op goes to
          the DB writer behind the read barrier (``Appended.seq``); a failed op
          queues a repair of the session and stays uncovered until it commits.

        ``after_write``: more file work, run in the same worker-thread hop right after
        the lines are durable (and before their index op).
        """
        actor = self._actor
        planned, batch, start, end = await actor.write_durably(lines, after_write)
        if not batch.lines:
            return Appended(planned=planned, end=end)
        sid, now = self.sid, self.now()
        written = Written(sid, self.paths.transcript, start, end, self.epoch, list(batch.lines), batch.records,
                          batch.seqs, touch)
        if later:
            if then is not None:
                raise InternalBug("append_lines(later=True) takes no `then`: nothing waits for its commit")
            seq = await self._index_later(written, now, batch.held)
            actor.indexed_later(end, batch.last_seq, now if touch and batch.last_seq else None)
            return Appended(planned=planned, end=end, seq=seq)
        refs_box: list[list[dict[str, Any]]] = []
        rows: list[dict[str, Any] | None] = []

        def op(conn: Any) -> Any:
            refs = store_appends.index_written(conn, written, now_ms=now)
            value = then(conn, refs) if then is not None else None
            refs_box.append(refs)
            rows.append(index.session_row(conn, sid))
            return value

        # the bytes before ``start`` the index misses (earlier index ops that failed), when they are many:
        # in bounded commits before this one (one indexed read when the mark stands at ``start``)
        value = await self.commit(op, durable=durable, backlogs=(Backlog(sid, written.path, now, stop=start),))
        actor.adopt_row(rows[-1])
        return Appended(planned=planned, end=end, refs=refs_box[-1], value=value)

    async def rewrite_file(
        self,
        write: Callable[[], F],
        reindex: Callable[[Any, F], object],
        then: Callable[[Any], T],
        *,
        fault: str | None = None,
        durable: bool = True,
    ) -> T:
        """Replace (or create) the whole transcript, then ONE commit: ``reindex(conn, made)`` (every
        row of the new file and its mark, at its new epoch), ``then(conn)`` (the response) and the
        receipt. The rewrite variant of :meth:`append_lines`: the same single owner of the mark
        and of the actor's file state. ``fault``: a fault point between the file and the commit."""
        actor = self._actor
        await actor.close_writer()  # no append may go through the old file's descriptor
        made = await self.io(write)
        actor.rewritten(made.file_len, made.epoch)
        if fault is not None:
            await self.io(self.faults.point, fault)
        sid = self.sid
        rows: list[dict[str, Any] | None] = []

        def op(conn: Any) -> T:
            reindex(conn, made)
            value = then(conn)
            rows.append(index.session_row(conn, sid))
            return value

        value = await self.commit(op, durable=durable)
        actor.adopt_row(rows[-1])
        return value

    async def _index_later(self, written: Written, now: int, held: Mapping[str, Any]) -> int:
        """Send the index op of lines already durable to the DB writer without waiting for it.

        Returns its index log sequence: the lines' receipts are in the database once it is
        covered. Waits first while the index trails by more than its bounds (backpressure).
        The sequence is taken in the same synchronous step as the op enters the writer's
        mailbox, so the mailbox holds index ops in sequence order. An op that fails queues
        a repair of this session (``IndexLog.fail``); its sequence is covered once that commits.
        """
        actor = self._actor
        log, writer = actor.deps.index_log, actor.deps.writer
        sid, path = self.sid, self.paths.transcript
        await log.wait_room()
        while True:
            seq = log.acknowledged + 1

            def settled(result: outcome.Outcome[Any], seq: int = seq) -> None:
                if isinstance(result, outcome.Error):
                    log.fail(seq, sid, Repair(sid, path, now))
                else:
                    log.settle(seq)

            try:
                writer.post_nowait(IndexOp(written, now), CallbackReply(settled))
            except (Busy, ActorStopped):
                await writer.wait_room()  # full mailbox, or between incarnations: wait, then take the sequence afresh
                continue
            break
        taken = log.enqueue(written.end - written.start, held)
        assert taken == seq, "index log sequence taken out of step with the writer's mailbox"
        actor.known.index_seq = seq
        return seq

    async def close_writer(self) -> None:
        """Before a whole-file rewrite: no append may go through the old file's descriptor."""
        await self._actor.close_writer()

    def storage_failed(self, exc: StoreError) -> None:
        self._actor.known.storage_failed = exc

    def refuse_if_storage_failed(self) -> None:
        """``IO_ERROR``, as an append gets it, once a failed fsync failed this session's storage (rule 7)."""
        self._actor.refuse_if_storage_failed()

    def refuse_if_receipt_doubtful(self, key: ReceiptKey | None) -> None:
        """While the storage is failed: ``IO_ERROR`` for a retry whose receipt is the failed call's or one a
        catch-up restored since; an earlier acknowledged write's receipt answers (rule 7)."""
        self._actor.refuse_if_receipt_doubtful(key)

    # -- events
    def publish(self, topic: str, data: dict[str, Any], *, session_id: str | None = None,
                size: int | None = None) -> None:
        self._actor.deps.bus.publish(topic, data, session_id=session_id or self.sid, size=size)

    # -- session_info lines
    def settings(self) -> dict[str, Any]:
        return settings_of(self.row)

    async def append_info(self, settings: Mapping[str, Any], then: Callable[[Any, list[dict[str, Any]]], T], *,
                          touch: bool = True, receipt_extra: Mapping[str, Any] | None = None) -> T:
        """A :meth:`session_info_line` of ``settings``, then its commit with ``then(conn, refs)``, whose value
        is the answer (:meth:`append_lines`).

        Keyed, the line's receipt carries that answer (``extra.response``): a retry after the database was
        lost is answered with it, not with the session as it is then. It is computed before the line is
        written, by a dry run of the commit's op (``store.indexing.appends.info_answer``: the line's effect
        on the row and ``then``, rolled back) in the DB writer. The writer runs ops in the order they came,
        so the dry run comes after every index op of this session's earlier lines (the actor's index lag:
        appends acknowledged before their rows committed); ``backlogs`` catches up first what an op that
        failed left out, as the commit does. One more round trip for a keyed call, no fsync (unless the
        line names a project the index lacks: its row goes in for good first); unkeyed calls as before."""
        now = self.now()
        answer: T | None = None
        if self.receipt is not None:
            draft = loads_line(self.session_info_line(settings, receipt_extra=receipt_extra, now_ms=now))
            sid, start = self.sid, self.file_len
            answer = await self.db(
                lambda conn: store_appends.info_answer(conn, sid, draft, then, now_ms=now),
                durable=bool(draft.get("projectPath")),
                backlogs=(Backlog(sid, self.paths.transcript, now, stop=start),))
        line = self.session_info_line(settings, receipt_extra=receipt_extra, now_ms=now, answer=answer)
        carried = CarriedAnswer(answer)
        result: T = (await self.append_lines(Lines([line]), then=lambda conn, refs: carried.give(then(conn, refs)),
                                             touch=touch)).value
        carried.check(self.method)
        return result

    def session_info_line(self, settings: Mapping[str, Any], *, receipt_extra: Mapping[str, Any] | None = None,
                          now_ms: int | None = None, answer: Any = None) -> bytes:
        """The line; it carries the session's thread metadata and trash state too (the newest line
        is the one a rewrite keeps and a rebuilt index reads), unless ``settings`` names them, and
        this call's receipt (``receipt``: durable with the effect; a reconcile restores a row the
        database lost; ``receipt_extra``: what its answer needs beyond the state the file leaves;
        ``answer``: the answer itself, as ``extra.response``, see :meth:`append_info`)."""
        row = self._actor.known.row
        thread = row.get("thread") if row is not None else None
        if thread is not None and "thread" not in settings:
            settings = {**settings, "thread": thread}
        trashed = row.get("deletedAt") if row is not None else None
        if trashed is not None and TRASHED_AT not in settings:
            settings = {**settings, TRASHED_AT: trashed}
        if self.receipt is not None:
            extra = {**(receipt_extra or {}), **({"response": answer} if answer is not None else {})}
            settings = {**settings, "receipt": file_record(self.receipt, **extra)}
        return session_info_line(settings, self.now() if now_ms is None else now_ms)


class CarriedAnswer(Generic[T]):
    """A keyed call's answer computed before its file or line was written, which its receipt carries
    (``extra.response``: a retry after a lost database is answered with it), and what its commit made.

    ``give`` is the commit's last step: it answers with the carried one (None: an unkeyed call, its commit's
    own); ``check``, after the commit, logs a commit that made another (the rows moved between the dry run
    and the commit): the answer stays the carried one, as every retry's."""

    __slots__ = ("carried", "made")

    def __init__(self, carried: T | None) -> None:
        self.carried = carried
        self.made: T | None = None

    def give(self, made: T) -> T:
        self.made = made
        return made if self.carried is None else self.carried

    def check(self, method: str) -> None:
        if self.carried is not None and self.made is not None and self.made != self.carried:
            log.warning("%s answered %r as its receipt carries; its commit made %r", method, self.carried,
                        self.made)


def settings_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """The session metadata a ``session_info`` line records (a rebuilt index keeps it)."""
    return {key: row.get(key, "" if key == "title" else None) for key in SETTING_KEYS}


def session_info_line(settings: Mapping[str, Any], now_ms: int) -> bytes:
    rec: dict[str, Any] = {"type": "session_info", **settings, "updatedAt": ms_to_rfc3339(now_ms)}
    return dumps_line(rec)
