"""What a session handler may do inside its session actor: :class:`SessionContext`.

Handlers get one per call. They read (one snapshot on the read pool, or in the
actor's own worker thread together with a file step), append lines durably,
commit (the effect's transaction with the call's receipt), publish events and
keep per-incarnation memos — never the actor's fields. A failed handler
poisons the actor (``actors/session.py``), which rebuilds from the transcript
before the next call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, TypeVarTuple

import outcome

from actors.db_writer import DbOp
from actors.gateway_types import CallContext
from actors.index_log import IndexLog
from runtime.kernel.actor import Busy, CallbackReply
from store import receipts
from store.errors import SessionNotFound, StoreError
from store.faults import Faults
from store.indexing import index
from store.jsonio import dumps_line
from store.receipts import ReceiptKey
from store.transcripts.records import ms_to_rfc3339
from store.transcripts.session_files import SessionPaths
from store.transcripts.transcript import TranscriptWriter

if TYPE_CHECKING:
    from actors.session import SessionActor

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

__all__ = ["SETTING_KEYS", "SessionContext", "UNSET", "session_info_line", "settings_of"]

SETTING_KEYS = ("title", "projectPath", "providerId", "modelId", "mode", "thinkingLevel", "permissionMode")


UNSET: Any = object()
"""``SessionContext.committed`` before the handler committed anything."""


class SessionContext:
    """What a session handler may do: read, write lines, commit, publish. Never the actor's fields."""

    __slots__ = ("_actor", "caller", "receipt", "method", "committed")

    def __init__(self, actor: SessionActor, caller: CallContext, receipt: ReceiptKey | None, method: str = "") -> None:
        self._actor = actor
        self.caller = caller
        self.receipt = receipt
        self.method = method
        self.committed: Any = UNSET

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

    async def refresh_row(self) -> dict[str, Any]:
        self._actor.known.row = await self.read(index.session_row, self.sid)
        return self.row

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
        st.row, st.deleted, st.file_len, st.epoch = None, True, 0, None
        st.cache.clear()

    def undelete(self) -> None:
        st = self._actor.known
        st.deleted = False
        st.needs_catchup = True

    def mark_stale(self) -> None:
        """Something changed that the in-memory state may not reflect: rebuild before the next call."""
        self._actor.poisoned = True

    def appended(self, file_len: int, last_seq: int, updated_at: int) -> None:
        """Lines this handler wrote through :meth:`writer` are durable and indexed."""
        st = self._actor.known
        st.file_len = file_len
        row = st.row
        if row is not None:
            row["messageCount"] = max(int(row["messageCount"]), last_seq)
            row["updatedAt"] = max(int(row["updatedAt"]), updated_at)
            row["_indexedLen"] = file_len

    def note_rewritten(self, file_len: int, epoch: str | None) -> None:
        st = self._actor.known
        st.file_len, st.epoch = file_len, epoch

    # -- I/O
    async def io(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """Blocking file work in this actor's own worker thread."""
        return await self._actor.io(fn, *args)

    async def io_with_reader(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(conn, *args)`` in this actor's worker thread with a read connection (one hop for both)."""
        reads = self._actor.deps.reads

        def run() -> T:
            with reads.borrow() as conn:
                return fn(conn, *args)

        return await self._actor.io(run)

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(conn, *args)`` on a read-pool connection (one snapshot), after the index covers
        every append this session acknowledged."""
        return await self._actor.read(fn, *args)

    async def index_later(self, fn: Callable[[Any], Any], *, nbytes: int, held: Mapping[str, Any]) -> int:
        """Send the index op of lines already durable to the DB writer without waiting for it.

        Returns its index log sequence: the lines' receipts are in the database once it is
        covered. Waits first while the index trails by more than its bounds (backpressure).
        The sequence is taken in the same synchronous step as the op enters the writer's
        mailbox, so the mailbox holds index ops in sequence order. An op that fails (even
        its fallback) marks this actor for a rebuild from the transcript.
        """
        actor = self._actor
        log, writer = actor.deps.index_log, actor.deps.writer
        await log.wait_room()
        while True:
            seq = log.acknowledged + 1

            def settled(result: outcome.Outcome[Any], seq: int = seq) -> None:
                if isinstance(result, outcome.Error):
                    actor.poisoned = True
                log.settle(seq)

            try:
                writer.post_nowait(DbOp(fn, durable=False, label="index"), CallbackReply(settled))
            except Busy:
                await writer.wait_room()  # full mailbox: wait, then take the sequence afresh
                continue
            break
        taken = log.enqueue(nbytes, held)
        assert taken == seq, "index log sequence taken out of step with the writer's mailbox"
        actor.known.index_seq = seq
        return seq

    async def db(self, fn: Callable[[Any], T], *, durable: bool = True) -> T:
        """One op in the DB writer's next transaction (no receipt: see :meth:`commit`)."""
        result: T = await self._actor.deps.db.write(fn, durable=durable)
        return result

    async def commit(self, fn: Callable[[Any], T], *, durable: bool = True) -> T:
        """The effect's transaction: ``fn(conn)`` plus this call's receipt row, atomically.

        Its value is the response; a handler with a receipt returns exactly it.
        """
        key, sid, now, faults, method = self.receipt, self.sid, self.now(), self.faults, self.method

        def op(conn: Any) -> T:
            value = fn(conn)
            if key is not None:
                receipts.store(conn, key, value, session_id=sid, now_ms=now)
            faults.point(f"{method}.before_commit")
            return value

        value = await self.db(op, durable=durable or key is not None)
        faults.point(f"{method}.after_commit")
        self.committed = value
        return value

    async def writer(self) -> TranscriptWriter:
        return await self._actor.open_writer()

    async def write_lines(self, lines: Sequence[bytes]) -> tuple[list[int], int]:
        """Append lines durably (one write, one fdatasync): each line's offset and the new length."""
        return await self._actor.write_lines(lines)

    async def close_writer(self) -> None:
        """Before a whole-file rewrite: no append may go through the old file's descriptor."""
        await self._actor.close_writer()

    def storage_failed(self, exc: StoreError) -> None:
        self._actor.known.storage_failed = exc

    # -- events
    def publish(self, topic: str, data: dict[str, Any], *, session_id: str | None = None,
                size: int | None = None) -> None:
        self._actor.deps.bus.publish(topic, data, session_id=session_id or self.sid, size=size)

    # -- session_info lines
    def settings(self) -> dict[str, Any]:
        return settings_of(self.row)

    def session_info_line(self, settings: Mapping[str, Any]) -> bytes:
        return session_info_line(settings, self.now())


def settings_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """The session metadata a ``session_info`` line records (a rebuilt index keeps it)."""
    return {key: row.get(key, "" if key == "title" else None) for key in SETTING_KEYS}


def session_info_line(settings: Mapping[str, Any], now_ms: int) -> bytes:
    rec: dict[str, Any] = {"type": "session_info", **settings, "updatedAt": ms_to_rfc3339(now_ms)}
    return dumps_line(rec)
