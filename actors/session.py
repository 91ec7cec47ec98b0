"""The per-session actor: serializes every request that touches one session.

Its mailbox holds :class:`SessionCall` messages (a route's session operation,
the validated params, the command receipt key and the caller). The actor:

* keeps the session's state — the index row, the transcript writer, the file
  length and epoch the index covers — and hands handlers a
  :class:`SessionContext` to work with, never its fields;
* runs consecutive calls of a *batched* operation (appends) as one group:
  one write + one fdatasync, one index op, one reply each;
* answers a keyed mutation from its stored receipt before running it;
* is **poisoned** by any failed mutation, in one place (h11 moves to
  ``ERROR`` the same way): the next call first rebuilds the state from the
  transcript, the source of truth;
* **reads ahead** when a handler asks it to (a forward ``session.get`` page
  with more after it): while its mailbox stays empty it reads the next page
  (``on_idle``) and offers it to the very next call only, which takes it if
  it asks for exactly that page and nothing changed since: the session's file
  state is the same and no SQLite commit that could change this session's rows
  became visible (its commit generation at the DB writer, even and unchanged:
  index ops of other sessions and an idle search-index merge do not count,
  they change nothing this session's read returns). Held pages are bounded host-wide
  in bytes (:class:`ReadAhead`) and dropped after ``READ_AHEAD_SECONDS``;
  :attr:`ReadAhead.gave_up` counts every read-ahead given up, per reason.

Order of every write: transcript line(s) + fdatasync first, index transaction
second, reply last (``docs/DESIGN.md``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, TypeVarTuple

import trio

from actors.db_reader import ReadPool
from actors.db_writer import DbOp
from actors.events import EventBus
from actors.gateway_types import CallContext
from actors.index_log import IndexLog
from actors.session_context import UNSET, Borrow, Lines, SessionContext, session_info_line, settings_of
from runtime.kernel.actor import Actor, Envelope, InternalBug
from runtime.kernel.threads import run_in_thread
from store import orphans, receipts
from store.errors import IOFailure, NotDurable, SessionNotFound, StoreError, TranscriptChanged
from store.faults import Faults
from store.indexing import index
from store.indexing.backlog import CATCH_UP_STEP_BYTES, Backlog
from store.indexing.message_ids import MessageIds
from store.indexing.reconcile import (
    ReconcilePlan,
    apply_plan,
    forget_deleted,
    plan_catch_up,
    plan_reconcile,
    replan_from_mark,
)
from store.receipts import ReceiptKey
from store.rules import READ_AHEAD_BYTES, READ_AHEAD_SECONDS
from store.transcripts.session_files import PendingDelete, SessionPaths, finish_delete, pending_delete
from store.transcripts.transcript import TranscriptWriter, create_transcript

logger = logging.getLogger(__name__)

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

__all__ = ["DbHandle", "ReadAhead", "SessionActor", "SessionCall", "SessionContext", "SessionDeps", "SessionOp"]


class DbHandle:
    """What actors and handlers need of the DB writer: run one op in its next batch."""

    def __init__(self, ask: Callable[[DbOp], Awaitable[Any]]) -> None:
        self._ask = ask

    async def write(self, fn: Callable[[Any], Any], *, durable: bool = True, label: str = "",
                    backlogs: tuple[Backlog, ...] = ()) -> Any:
        """``backlogs``: sessions whose index may trail their transcript far, caught up in bounded commits
        before the op's batch (``store.indexing.backlog``)."""
        return await self._ask(DbOp(fn, durable=durable, label=label, backlogs=backlogs))


SessionHandler = Callable[["SessionContext", Any, ReceiptKey | None], Awaitable[Any]]
GroupHandler = Callable[["SessionContext", Sequence["SessionCall"]], Awaitable[list[Any]]]


@dataclass(frozen=True, slots=True)
class SessionOp:
    """What a route asks of a session actor."""

    handler: SessionHandler
    mutating: bool
    name: str = ""
    """The wire method (names the fault points ``<name>.before_commit`` / ``<name>.after_commit``)."""
    ready_check: bool = True
    """False: the handler establishes the session itself (create makes it, get reads it cold)."""
    group: GroupHandler | None = None
    """Consecutive calls of this op are handled together (appends); the group handler
    answers keyed retries itself (its one read finds them)."""
    replayed: SessionHandler | None = None
    """A keyed retry answered from its stored receipt runs this first (the session made ready): for
    an effect that lives in this process's memory, which a restart since the first try forgot."""


@dataclass(frozen=True, slots=True)
class SessionCall:
    op: SessionOp
    params: Any
    """The validated params model."""
    receipt: ReceiptKey | None
    caller: CallContext
    more: bool = False
    """More calls of the same JSON-RPC batch follow (group-commit hint)."""


@dataclass
class ReadAhead:
    """Bytes of pages read ahead and held by every session actor together (at most ``limit``)."""

    limit: int = READ_AHEAD_BYTES
    seconds: float = READ_AHEAD_SECONDS
    """How long a page is held unasked, and the most a read-ahead waits for a commit or for its read."""
    held: int = 0
    reads: int = 0
    """Pages read ahead."""
    taken: int = 0
    """Pages a call took (the rest were dropped: not asked for, stale, expired or over the bound)."""
    gave_up: dict[str, int] = field(default_factory=dict)
    """Read-aheads given up (not read, or read and not taken), per reason. Before the read: ``moved`` (the
    session's file state changed after the call that asked for it), ``commit`` (a commit still ran when
    the wait for it ended), ``call`` (a call arrived during that wait), ``bound`` (the host-wide bound was
    full), ``slow`` (the read took longer than ``seconds``), ``error`` (the read failed),
    ``busy`` (the next call arrived before the mailbox was empty).
    Held: ``expired`` (unasked for ``seconds``), ``other_call`` (the next call did not ask for
    a page), ``key`` (it asked for another page), ``stale_state`` / ``stale_commit`` (asked for, but
    the session's file state changed or a commit ran since the read)."""

    def give_up(self, reason: str) -> None:
        self.gave_up[reason] = self.gave_up.get(reason, 0) + 1

    def reserve(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def release(self, size: int) -> None:
        self.held = max(0, self.held - size)


@dataclass(frozen=True, slots=True)
class _Wanted:
    key: Hashable
    state: tuple[Any, ...]
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    bound: int
    size: Callable[[Any], int]


@dataclass(frozen=True, slots=True)
class _Ahead:
    key: Hashable
    state: tuple[Any, ...]
    generation: int
    value: Any
    size: int


@dataclass
class SessionDeps:
    paths: Callable[[str], SessionPaths]
    db: DbHandle
    reads: ReadPool
    bus: EventBus
    faults: Faults
    now_ms: Callable[[], int]
    index_log: IndexLog
    """Appends are acknowledged before their index rows commit; reads wait on this."""
    writer: Any
    """The DB writer's ``ActorRef`` (index ops are posted to it without waiting for them)."""
    services: Any = None
    """Per-host state handlers share (queue controllers, ...); opaque to the actor."""
    db_generation: Callable[[str], int] | None = None
    """A session's commit generation at the DB writer (``GroupStats.generation_of``); ``None``: no
    read-ahead."""
    read_ahead: ReadAhead = field(default_factory=ReadAhead)
    message_ids: MessageIds | None = None
    """The filter of indexed message ids the DB writer feeds (``store.indexing.message_ids``): an append
    skips the id lookup of an id it says is certainly absent; None: every id is looked up."""
    idle_timeout: float | None = 300.0
    mailbox_size: int = 512
    batch_limit: int = 256
    failed_storage: dict[str, StoreError] = field(default_factory=dict)
    """Sessions whose transcript failed an fsync in this run (RELIABILITY rule 7): refused until the host
    restarts, also by the actor that follows one stopped when idle (or restarted after a crash)."""
    doubtful_receipts: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    """Per failed session: the receipt keys ``(clientId, submissionId)`` whose answer is refused until the
    restart (:meth:`SessionActor.refuse_if_receipt_doubtful`): the calls under way when its storage failed,
    and every receipt a catch-up restored from its files since. Every other receipt of it was committed
    for a write acknowledged before the failure (durable) and is answered, as after the restart."""


@dataclass
class _State:
    """Everything the actor knows about its session; rebuilt from the transcript when poisoned."""

    row: dict[str, Any] | None = None
    writer: TranscriptWriter | None = None
    file_len: int = 0
    epoch: str | None = None
    needs_catchup: bool = True
    deleted: bool = False
    seen: bool = False
    """This actor saw the session's row in this run (kept across rebuilds; a delete clears it): an
    append after both the row and the transcript vanished restores a stub (``store/orphans.py``)."""
    storage_failed: StoreError | None = None
    index_seq: int = 0
    """The index log sequence of this session's newest append (its reads wait for it)."""
    cache: dict[str, Any] = field(default_factory=dict)


class SessionActor(Actor):
    start_waits = False  # no on_start: a session's first request does not wait for its task to start

    def __init__(self, session_id: str, deps: SessionDeps) -> None:
        super().__init__(f"session:{session_id}", mailbox_size=deps.mailbox_size)
        self.batch_limit = deps.batch_limit
        self.idle_timeout = deps.idle_timeout
        # No tick-by-tick linger: appends that arrive while a group's write + fdatasync runs form the
        # next group by themselves; a JSON-RPC batch says "more" (expects_more) and is waited for.
        self.linger_ticks = 0
        self.sid = session_id
        self.deps = deps
        self.paths = deps.paths(session_id)
        self.known = _State(storage_failed=deps.failed_storage.get(session_id))
        self.poisoned = False
        self.idle_work_after = None  # on_idle runs only while a read-ahead is wanted or held
        self.idle_work_interval = deps.read_ahead.seconds  # a held page is dropped after that long unasked
        self._wanted: _Wanted | None = None
        self._ahead: _Ahead | None = None
        self._offered: _Ahead | None = None
        self._calls: Sequence[SessionCall] = ()
        """The call(s) being handled: their receipts are doubtful if the storage fails under them."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await super().run(task_status=task_status)
        finally:  # however the actor ends: what it held read ahead leaves the host-wide bound
            self._wanted = None
            self._drop(self._ahead)
            self._drop(self._offered)
            self._ahead = self._offered = None

    # ------------------------------------------------------------------ lifecycle
    async def on_stop(self) -> None:
        await self.close_writer()

    async def close_writer(self) -> None:
        writer, self.known.writer = self.known.writer, None
        if writer is not None:
            with trio.CancelScope(shield=True):
                await run_in_thread(writer.close)

    def expects_more(self, batch: list[Envelope]) -> bool:
        msg = batch[-1].msg
        return isinstance(msg, SessionCall) and msg.more

    async def rebuild(self) -> None:
        """The only way out of POISONED: forget what we knew; the transcript decides again."""
        await self.close_writer()
        failed = self.known.storage_failed  # a failed fsync stays failed until the host restarts
        seq = self.known.index_seq  # index ops already sent still count for this session's reads
        seen = not self.known.deleted and (self.known.seen or self.known.row is not None)
        self.known = _State(storage_failed=failed, index_seq=seq, seen=seen)
        self.poisoned = False

    # ------------------------------------------------------------------ read-ahead
    def _file_state(self) -> tuple[Any, ...]:
        st = self.known
        return st.file_len, st.epoch, st.index_seq, st.deleted, st.needs_catchup, st.storage_failed, self.poisoned

    def read_ahead(self, key: Hashable, fn: Callable[..., T], *args: Any, bound: int,
                   size: Callable[[T], int]) -> None:
        """Once the mailbox is empty, read ``fn(conn, *args)`` (as :meth:`read` does) and offer it to
        the next call as ``key`` (:meth:`take_ahead`). ``bound`` (the most bytes it can hold) is taken
        from the host-wide bound before the read, then only its ``size``: when the bound is full,
        nothing is read. Without a DB commit generation to check it against, nothing is read ahead."""
        if self.deps.db_generation is None:
            return
        self._wanted = _Wanted(key, self._file_state(), fn, args, bound, size)
        self.idle_work_after = 0.0

    def take_ahead(self, key: Hashable) -> Any:
        """The value read ahead as ``key``, if this call was offered one and nothing changed since
        it was read; else ``None`` (the caller reads it itself)."""
        ahead, self._offered = self._offered, None
        if ahead is None:
            return None
        bounds = self.deps.read_ahead
        bounds.release(ahead.size)
        gen = self.deps.db_generation
        if ahead.key != key:
            bounds.give_up("key")
            return None
        if ahead.state != self._file_state():
            bounds.give_up("stale_state")
            return None
        if gen is None or gen(self.sid) != ahead.generation:
            bounds.give_up("stale_commit")
            return None
        bounds.taken += 1
        return ahead.value

    def _drop(self, ahead: _Ahead | None, reason: str | None = None) -> None:
        if ahead is not None:
            self.deps.read_ahead.release(ahead.size)
            if reason is not None:
                self.deps.read_ahead.give_up(reason)

    async def on_idle(self) -> bool:
        wanted, self._wanted = self._wanted, None
        self._drop(self._ahead, "expired")  # a page held this long unasked is dropped
        self._ahead = None
        self.idle_work_after = None
        gen = self.deps.db_generation
        if wanted is None or gen is None:
            return False
        bounds = self.deps.read_ahead
        if wanted.state != self._file_state():
            bounds.give_up("moved")
            return False
        generation = gen(self.sid)
        if generation % 2:
            # A commit is running (an index batch, idle upkeep): what a read sees now may be stale by the time
            # it is taken. Wait for it to end (milliseconds; bounded), unless a call arrives meanwhile.
            with trio.move_on_after(bounds.seconds):
                # the commit runs in the DB writer's thread: there is no trio event to wait on
                while (generation := gen(self.sid)) % 2 and not self._recv.statistics().current_buffer_used:  # noqa: ASYNC110
                    await trio.sleep(0.001)
            if self._recv.statistics().current_buffer_used:
                bounds.give_up("call")
                return False
            if generation % 2:
                bounds.give_up("commit")
                return False
            if wanted.state != self._file_state():
                bounds.give_up("moved")
                return False
        if not bounds.reserve(wanted.bound):
            bounds.give_up("bound")
            return False
        try:
            # Bounded: a read-ahead that would wait for the index (or for a free read connection) that
            # long keeps the next call waiting for nothing; it gives up instead.
            with trio.move_on_after(bounds.seconds) as waited:
                value = await self.read(wanted.fn, *wanted.args)
            if waited.cancelled_caught:
                bounds.release(wanted.bound)
                bounds.give_up("slow")
                return False
            size = wanted.size(value)
        except Exception:  # the next call reads (and fails) by itself; nothing is poisoned by a read-ahead
            bounds.release(wanted.bound)
            bounds.give_up("error")
            return False
        except BaseException:
            bounds.release(wanted.bound)
            raise
        bounds.release(wanted.bound)
        if not bounds.reserve(size):  # more than it said it could hold (never, for a page): not kept
            bounds.give_up("bound")
            return False
        bounds.reads += 1
        self._ahead = _Ahead(wanted.key, wanted.state, generation, value, size)
        self.idle_work_after = 0.0
        self.idle_work_interval = bounds.seconds  # called again after that long: then dropped
        return True

    # ------------------------------------------------------------------ dispatch
    async def handle(self, msg: Any) -> Any:  # pragma: no cover - handle_batch is used
        raise InternalBug("session actor handles batches")

    async def handle_batch(self, batch: list[Envelope]) -> None:
        # A page read ahead is offered to the first call of this batch only (whatever it is).
        self._offered, self._ahead = self._ahead, None
        if self._wanted is not None:  # the next call came before the mailbox was ever empty
            self.deps.read_ahead.give_up("busy")
        self._wanted = None
        self.idle_work_after = None
        try:
            await self._handle_batch(batch)
        finally:
            self._drop(self._offered, "other_call")
            self._offered = None

    async def _handle_batch(self, batch: list[Envelope]) -> None:
        i = 0
        while i < len(batch):
            if i:
                self._drop(self._offered, "other_call")
                self._offered = None
            call = batch[i].msg
            if not isinstance(call, SessionCall):
                _deliver(batch[i], InternalBug(f"session actor got {type(call).__name__}, not SessionCall"))
                i += 1
                continue
            if call.op.group is not None:
                j = i + 1
                while j < len(batch) and isinstance(batch[j].msg, SessionCall) and batch[j].msg.op is call.op:
                    j += 1
                group = batch[i:j]
                outcomes = await self._run_group(call.op, [env.msg for env in group])
                for env, outcome in zip(group, outcomes, strict=True):
                    _deliver(env, outcome)
                i = j
                continue
            _deliver(batch[i], await self._run_one(call))
            i += 1

    async def _run_one(self, call: SessionCall) -> Any:
        op = call.op
        self._calls = (call,)
        try:
            if self.poisoned:
                await self.rebuild()
            ctx = SessionContext(self, call.caller, call.receipt, op.name)
            if op.mutating and call.receipt is not None:
                # Before the existence check: the answer of a completed delete is still its answer.
                found = await self.read(receipts.check, call.receipt)
                if found is None and op.ready_check and self.known.needs_catchup and not self.known.deleted:
                    # catching up restores a receipt the transcript carries (a rewrite whose commit failed)
                    await ctx.ensure_ready()
                    found = await self.read(receipts.check, call.receipt)
                if found is not None:
                    # Not while the session's storage is failed, if the receipt is the failed call's or one a
                    # catch-up restored from a file since (its durability unknown): rule 7, the next boot
                    # trusts the disk and answers it. An earlier acknowledged write's receipt is answered.
                    self.refuse_if_receipt_doubtful(call.receipt)
                    if op.replayed is not None:
                        if op.ready_check:
                            await ctx.ensure_ready()
                        await op.replayed(ctx, call.params, call.receipt)
                    return found["response"]
            if op.ready_check:
                await ctx.ensure_ready()
            result = await op.handler(ctx, call.params, call.receipt)
            if call.receipt is not None and op.mutating and ctx.committed is not UNSET and ctx.committed != result:
                raise InternalBug(f"{type(call.params).__name__}: the handler answered something other than "
                                  "the response it stored with its receipt")
            return result
        except Exception as exc:
            if op.mutating or not isinstance(exc, StoreError) or exc.code in ("IO_ERROR", "CORRUPT_DATA"):
                self.poisoned = True
            return exc
        finally:
            self._calls = ()

    async def _run_group(self, op: SessionOp, calls: list[SessionCall]) -> list[Any]:
        self._calls = calls
        try:
            try:
                return await self._group_once(op, calls)
            except TranscriptChanged:
                # Another program wrote to (or replaced) the transcript; the writer wrote nothing.
                # Once: forget what this actor knew, let the file decide again (its new lines are
                # indexed), and plan the group anew on it.
                self.poisoned = True
                return await self._group_once(op, calls)
        except Exception as exc:
            self.poisoned = True
            return [exc] * len(calls)
        finally:
            self._calls = ()

    async def _group_once(self, op: SessionOp, calls: list[SessionCall]) -> list[Any]:
        assert op.group is not None
        if self.poisoned:
            await self.rebuild()
        ctx = SessionContext(self, calls[0].caller, None, op.name)
        try:
            await ctx.ensure_ready()
        except SessionNotFound as gone:
            stub = await self._restore_orphan()
            if stub is None:
                return await self._answer_from_receipts(calls, gone)
            await ctx.ensure_ready()
            ctx.publish("session.created", {"session": index.public_session(stub)})
        if self.known.storage_failed is not None:
            return await self._answer_while_failed(calls)
        outcomes = await op.group(ctx, calls)
        if len(outcomes) != len(calls):
            raise InternalBug("a group handler must answer every call")
        return outcomes

    async def _restore_orphan(self) -> dict[str, Any] | None:
        """Seed 003 §5 (D318): an append to a session whose row and transcript are both gone, not
        deleted by the user, inserts a stub row under its id so the app's outbox can drain (the next
        write starts its transcript anew). The stub row, or ``None``: not an orphan of that kind."""
        st = self.known
        if st.deleted or st.row is not None or await self.io(os.path.exists, self.paths.transcript):
            return None  # deleted here, or a row / a transcript is there (reconciling decides)
        sid, seen, now = self.sid, st.seen, self.deps.now_ms()

        def stub(conn: Any) -> dict[str, Any] | None:
            try:
                return orphans.insert_stub(conn, sid, now_ms=now, seen=seen)
            except LookupError:
                return None

        row: dict[str, Any] | None = await self.deps.db.write(stub, durable=True)
        if row is not None:
            logger.warning("session %s had neither a row nor a transcript: restored as a stub for its appends", sid)
            st.needs_catchup = True
        return row

    async def _answer_from_receipts(self, calls: list[SessionCall], gone: SessionNotFound) -> list[Any]:
        """The session is gone: a retry of a call that completed before is still answered from its
        receipt; everything else is ``SESSION_NOT_FOUND``."""
        keys = [call.receipt for call in calls]
        if not any(keys):
            return [gone] * len(calls)
        return [found if isinstance(found, StoreError) else gone if found is None else found["response"]
                for found in await self._stored_receipts(keys)]

    async def _stored_receipts(self, keys: list[ReceiptKey | None]) -> list[Any]:
        """Each key's stored receipt (``None``: none, or no key), or the ``StoreError`` its lookup raised."""

        def lookup(conn: Any) -> list[Any]:
            out: list[Any] = []
            for key in keys:
                try:
                    out.append(receipts.check(conn, key) if key is not None else None)
                except StoreError as exc:
                    out.append(exc)
            return out

        return await self.read(lookup)

    async def _answer_while_failed(self, calls: list[SessionCall]) -> list[Any]:
        """The session's storage is failed (rule 7): nothing is written; a retry of a write acknowledged
        before the failure is answered from its receipt (:meth:`refuse_if_receipt_doubtful`), everything
        else is refused with ``IO_ERROR``, as the writer would refuse it."""
        keys = [call.receipt for call in calls]
        out: list[Any] = []
        for key, found in zip(keys, await self._stored_receipts(keys), strict=True):
            if isinstance(found, StoreError):
                out.append(found)
                continue
            try:
                if found is None:
                    self.refuse_if_storage_failed()
                self.refuse_if_receipt_doubtful(key)
            except IOFailure as exc:
                out.append(exc)
                continue
            out.append(found["response"])
        return out

    # ------------------------------------------------------------------ state (used by SessionContext)
    async def io(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """``fn(*args)`` in a worker thread: one hop at a time, as the actor's task awaits each one (a hop is
        never abandoned, even when cancelled), so no limiter is taken per hop."""
        try:
            return await run_in_thread(fn, *args)  # a checkpoint itself
        except NotDurable as exc:
            self._storage_failed(exc)
            raise

    def _storage_failed(self, exc: StoreError) -> None:
        """RELIABILITY rule 7: a failed fsync of this session's storage (a transcript line's, or the directory's
        after a file of it was published) fails it until the host restarts; the error is the client's answer
        and the log's record (the client may be gone by then; the operator learns why the session refuses
        writes)."""
        self.known.storage_failed = self.deps.failed_storage[self.sid] = exc
        # the calls under way: whatever receipt they got (or a catch-up restores) is of an unacknowledged write
        self._doubt(call.receipt for call in self._calls)
        logger.error("storage of session %s failed its fsync; its writes are refused until the host restarts: %s",
                     self.sid, exc.message, extra={"sessionId": self.sid, "error": exc.message})

    def _doubt(self, keys: Iterable[ReceiptKey | tuple[str, str] | None]) -> None:
        doubtful = self.deps.doubtful_receipts.setdefault(self.sid, set())
        for key in keys:
            if isinstance(key, ReceiptKey):
                doubtful.add((key.client_id, key.submission_id))
            elif key is not None:
                doubtful.add(key)

    async def indexed(self) -> None:
        """Until the index covers every append this session acknowledged (its own read barrier)."""
        await self.deps.index_log.wait_covered(self.known.index_seq)

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """A read-pool snapshot that sees every append this session acknowledged."""
        await self.indexed()
        return await self.deps.reads.run(fn, *args)

    async def catch_up(self) -> None:
        st = self.known
        row = await self.read(index.session_row, self.sid)
        indexed = row["_indexedLen"] if row else 0
        epoch = row["_fileEpoch"] if row else None
        paths = self.paths
        # Storage failed: what the files hold past the failure is not known durable; a receipt restored
        # from them now is doubtful (refused until the restart), whatever request it answers.
        failed = st.storage_failed is not None
        # a tail far past the mark is indexed in bounded commits (store.indexing.backlog), each reading its
        # own slice: it is not read whole here first. Not while the storage is failed: every receipt this
        # catch-up restores must be seen by the one transaction below, to be doubted
        far = None if failed else CATCH_UP_STEP_BYTES

        def look() -> PendingDelete | ReconcilePlan:  # one hop: a delete that did not finish, else the plan
            return pending_delete(paths) or (plan_reconcile(paths.transcript, indexed, epoch) if far is None
                                             else plan_catch_up(paths.transcript, indexed, epoch, far=far))

        plan = await self.io(look)
        if isinstance(plan, PendingDelete):
            await self._finish_delete(plan)
            return
        needs_apply = plan.kind != "clean" or row is None or indexed != plan.file_len
        if plan.kind == "missing":
            needs_apply = row is not None and bool(row["_indexedLen"] or row["messageCount"])
        if needs_apply:
            now = self.deps.now_ms()
            # the file was replaced since the index's last commit (a rewrite whose commit failed, another
            # program): the row moves now, as that rewrite's commit would have moved it
            replaced = row is not None and plan.kind == "full" and row["_fileEpoch"] != plan.epoch

            path = paths.transcript
            # a tail far past the mark is indexed in bounded commits first (store.indexing.backlog); this
            # op then indexes what they left from the mark they moved (a tail plan from the old mark
            # would index their lines twice; a far tail's plan has not read its lines at all)
            backlogs = (Backlog(self.sid, path, now),) if plan.kind == "tail" and not failed else ()
            planned = plan

            def apply(conn: Any) -> ReconcilePlan:
                before = receipts.keys_of_session(conn, self.sid) if failed else set()
                todo = replan_from_mark(conn, self.sid, path, planned, (indexed, epoch)) if backlogs else planned
                apply_plan(conn, self.sid, todo, now_ms=now)
                if replaced:
                    index.touch_session(conn, self.sid, now)
                if failed:
                    self._doubt(receipts.keys_of_session(conn, self.sid) - before)
                return todo

            plan = await self.deps.db.write(apply, durable=True, backlogs=backlogs)
            row = await self.read(index.session_row, self.sid)
        st.file_len, st.epoch = (0, None) if plan.kind == "missing" else (plan.file_len, plan.epoch)
        st.row = row
        st.seen = st.seen or row is not None
        st.needs_catchup = False

    async def _finish_delete(self, pending: PendingDelete) -> None:
        """A delete of this session began (its marker is durable) and did not finish (a failure after its
        rows went): it happened. Finished as boot finishes it, never indexed again from its transcript."""
        now = self.deps.now_ms()
        await self.deps.db.write(lambda conn: forget_deleted(conn, pending, now_ms=now), durable=True)
        paths = self.paths
        await self.io(lambda: finish_delete(paths, now_ms=now))
        st = self.known
        st.row, st.deleted, st.seen, st.file_len, st.epoch, st.needs_catchup = None, True, False, 0, None, False
        st.cache.clear()

    def refuse_if_storage_failed(self) -> None:
        """RELIABILITY rule 7: after a failed fsync every write of this session's storage is refused (the
        transcript's appends and rewrites, its in-flight checkpoint) until the host restarts."""
        failed = self.known.storage_failed
        if failed is not None:
            raise IOFailure(
                f"storage for session {self.sid} failed earlier ({failed.message}); "
                "writes are refused until the host restarts",
                data={"sessionId": self.sid},
            )

    def refuse_if_receipt_doubtful(self, key: ReceiptKey | None) -> None:
        """Before a stored receipt answers a retry while the storage is failed: refused (as
        :meth:`refuse_if_storage_failed`) if it is the receipt of a call under way when the storage failed,
        or one a catch-up restored from the session's files since (``SessionDeps.doubtful_receipts``).
        Any other receipt of the session was committed for a write acknowledged before the failure, whose
        line (or file) and directory were fsynced: answered now, as after the restart."""
        if self.known.storage_failed is None:
            return
        if key is None or (key.client_id, key.submission_id) in self.deps.doubtful_receipts.get(self.sid, ()):
            self.refuse_if_storage_failed()

    async def open_writer(self) -> TranscriptWriter:
        st = self.known
        self.refuse_if_storage_failed()
        if st.writer is None:
            path = self.paths.transcript
            if st.row is not None and not await self.io(os.path.exists, path):
                await self._recreate_transcript()
            st.writer = await self.io(lambda: TranscriptWriter.open(path, faults=self.deps.faults))
            if st.writer.length != st.file_len or st.writer.epoch != st.epoch:
                # A torn tail was quarantined, or the file is not the one the index knows.
                st.file_len, st.epoch = st.writer.length, st.writer.epoch
                await self.catch_up()
        return st.writer

    async def _recreate_transcript(self) -> None:
        """The row exists but its transcript vanished: start a new file that records the settings."""
        row = self.known.row
        assert row is not None
        now = self.deps.now_ms()
        created = int(row.get("createdAt") or now)
        info = session_info_line(settings_of(row), now)
        path, faults = self.paths.transcript, self.deps.faults
        await self.io(lambda: create_transcript(path, self.sid, created, body_lines=[info], faults=faults))
        await self.catch_up()

    # ------------------------------------------------------------------ the line primitive's state
    async def write_durably(self, lines: Lines | Callable[[Borrow], tuple[Any, Lines]],
                            after_write: Callable[[], object] | None = None) -> tuple[Any, Lines, int, int]:
        """Write ``lines`` (or what ``step(borrow)`` plans, in the same worker-thread hop; ``borrow()``: a
        read connection, taken only by a step that reads) with one write + one fdatasync:
        ``(planned, lines, start, end)``. Only :meth:`SessionContext.append_lines` calls this; the file
        length it records is the actor's."""
        writer = await self.open_writer()
        reads = self.deps.reads

        def run() -> tuple[Any, Lines, int, int]:
            if isinstance(lines, Lines):
                planned, batch = None, lines
            else:
                planned, batch = lines(reads.borrow)
            if not batch.lines:
                return planned, batch, writer.length, writer.length
            first, new_len = writer.append(list(batch.lines))
            if after_write is not None:
                after_write()
            return planned, batch, first, new_len

        try:
            planned, batch, start, end = await self.io(run)
        except IOFailure as exc:
            # A failed fsync (RELIABILITY rule 7) fails the session's storage; a failed write was cut back
            # (rule 2), and an error after the fsync left the lines durable: the call that fails with it
            # poisons this actor, whose rebuild opens a new writer (the tail re-validated, the index caught
            # up from the file, the line's receipt with it), so a retry of the call is answered from there.
            if writer.storage_failed:
                self._storage_failed(exc)  # rule 7 / row 6
            raise
        self.known.file_len = end
        return planned, batch, start, end

    def indexed_later(self, end: int, last_seq: int, updated_at: int | None) -> None:
        """Lines up to ``end`` are durable and their index op is queued: the row as it will be."""
        row = self.known.row
        if row is not None:
            row["messageCount"] = max(int(row["messageCount"]), last_seq)
            if updated_at is not None:
                row["updatedAt"] = max(int(row["updatedAt"]), updated_at)
            row["_indexedLen"] = end

    def adopt_row(self, row: dict[str, Any] | None) -> None:
        """The row as the transaction that indexed this actor's latest lines left it."""
        self.known.row = row
        self.known.needs_catchup = False

    def rewritten(self, file_len: int, epoch: str | None) -> None:
        """The whole transcript was replaced (or created): its length and epoch are the actor's now."""
        self.known.file_len, self.known.epoch = file_len, epoch


def _deliver(env: Envelope, outcome: Any) -> None:
    if env.reply is None:
        return
    if isinstance(outcome, BaseException):
        env.reply.set_exception(outcome)
    else:
        env.reply.set_result(outcome)
