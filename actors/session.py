"""The per-session actor: serializes every mutation of one session.

It owns the session's transcript writer (one appender per file), decides the
order of file and index steps (file line + fsync first, index transaction
second, reply last) and serves bounded window reads from the byte spans the
index records. Requests that wait in its mailbox together are written with
one write + one fsync and one index batch (group commit).

Feature modules (turns, revisions, ...) register handlers for ``Custom``
requests; they use the helpers on :class:`SessionActor` rather than touching
files or SQL order themselves.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, TypeVarTuple

import trio

from actors.db_reader import ReadPool
from actors.db_writer import DbOp, Gate
from actors.events import EventBus
from actors.session_msgs import (
    AppendMessage,
    CreateSession,
    Custom,
    DeleteSession,
    GetWindow,
    ReceiptKey,
    RenameSession,
    UpdateSession,
)
from runtime.kernel.actor import Actor, Envelope
from runtime.datadir import DataDir
from store import index
from store.compaction import normalize_on_read
from store.errors import (
    Conflict,
    InvalidInput,
    IOFailure,
    MessageNotFound,
    SessionNotFound,
    StorageFull,
    StoreError,
)
from store.faults import Faults
from store.fsutil import fsync_dir, remove_file_durable
from store.jsonio import dumps_line, loads_line
from store.queue import forget_session as forget_queue
from store.reconcile import apply_plan, plan_reconcile, read_header
from store.records import (
    cap_content,
    is_streaming,
    ms_to_rfc3339,
    normalize_message,
    wire_record,
    with_receipt,
)
from store.transcript import TranscriptWriter, create_transcript, read_spans

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

FeatureHandler = Callable[["SessionActor", Custom], Awaitable[Any]]

MAX_TITLE = 80
EVENT_RECORD_MAX = 8 * 1024  # bigger records are announced by ref only: the 10,000-event backlog stays ~80 MB at worst
DEFAULT_WINDOW = 100
MAX_WINDOW = 1000


class DbHandle:
    """What a session actor needs of the DB writer: run one op in the next batch."""

    def __init__(self, ask: Callable[[DbOp], Awaitable[Any]]) -> None:
        self._ask = ask

    async def write(
        self, fn: Callable[[Any], Any], *, durable: bool = True, label: str = "", gate: Gate | None = None
    ) -> Any:
        return await self._ask(DbOp(fn, durable=durable, label=label, gate=gate))


@dataclass
class SessionDeps:
    data_dir: DataDir
    db: DbHandle
    reads: ReadPool
    bus: EventBus
    faults: Faults
    now_ms: Callable[[], int]
    features: Mapping[str, FeatureHandler] = field(default_factory=dict)
    idle_timeout: float | None = 300.0
    mailbox_size: int = 256
    batch_limit: int = 256


def validate_title(title: object) -> str:
    if not isinstance(title, str):
        raise InvalidInput("title must be a string", data={"field": "title"})
    trimmed = title.strip()
    if not 1 <= len(trimmed) <= MAX_TITLE:
        raise InvalidInput(
            f"title must be 1-{MAX_TITLE} characters after trimming (got {len(trimmed)})",
            data={"field": "title"},
        )
    return trimmed


class SessionActor(Actor):
    def __init__(self, session_id: str, deps: SessionDeps) -> None:
        super().__init__(f"session:{session_id}", mailbox_size=deps.mailbox_size)
        self.batch_limit = deps.batch_limit
        self.idle_timeout = deps.idle_timeout
        self.linger_ticks = 3  # a JSON-RPC batch or a burst of clients lands in one group commit
        self.sid = session_id
        self.deps = deps
        self.path: Path = deps.data_dir.transcript(session_id)
        self.row: dict[str, Any] | None = None
        self.writer: TranscriptWriter | None = None
        self.file_len = 0
        self.epoch: str | None = None
        self.needs_catchup = True
        self.storage_failed: StoreError | None = None
        self.deleted = False
        self._io = trio.CapacityLimiter(1)
        self.feature_state: dict[str, Any] = {}  # feature modules keep per-session state here

    # ------------------------------------------------------------------ plumbing
    async def io(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """Run blocking file I/O in this actor's own worker thread."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self._io)

    async def read(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self.deps.reads.run(fn, *args)

    async def db(self, fn: Callable[[Any], Any], *, durable: bool = True) -> Any:
        return await self.deps.db.write(fn, durable=durable)

    def now(self) -> int:
        return self.deps.now_ms()

    def publish(self, topic: str, data: dict[str, Any]) -> None:
        self.deps.bus.publish(topic, data, session_id=self.sid)

    async def on_start(self) -> None:
        # Nothing to load: the first request catches the index up with the file
        # (``needs_catchup``), and a cold ``session.get`` does that in the same read.
        return None

    async def on_stop(self) -> None:
        if self.writer is not None:
            writer, self.writer = self.writer, None
            with trio.CancelScope(shield=True):
                await self.io(writer.close)

    async def ensure_ready(self) -> dict[str, Any]:
        """Make sure the session exists and the index covers every durable line."""
        if self.deleted:
            raise SessionNotFound(f"session {self.sid} was deleted", data={"sessionId": self.sid})
        if self.needs_catchup:
            await self.catch_up()
        if self.row is None:
            raise SessionNotFound(f"session {self.sid} not found", data={"sessionId": self.sid})
        return self.row

    async def catch_up(self) -> dict[str, Any] | None:
        row = await self.read(index.session_row, self.sid)
        indexed = row["_indexedLen"] if row else 0
        epoch = row["_fileEpoch"] if row else None
        plan = await self.io(plan_reconcile, self.path, indexed, epoch)
        report = None
        if plan.kind == "missing":
            if row is not None and (row["_indexedLen"] or row["messageCount"]):
                now = self.now()
                report = await self.db(lambda conn: apply_plan(conn, self.sid, plan, now_ms=now), durable=True)
                row = await self.read(index.session_row, self.sid)
            self.file_len, self.epoch = 0, None
        else:
            if plan.kind != "clean" or row is None or indexed != plan.file_len:
                now = self.now()
                report = await self.db(lambda conn: apply_plan(conn, self.sid, plan, now_ms=now), durable=True)
                row = await self.read(index.session_row, self.sid)
            self.file_len, self.epoch = plan.file_len, plan.epoch
        self.row = row
        self.needs_catchup = False
        return report

    async def refresh_row(self) -> dict[str, Any]:
        self.row = await self.read(index.session_row, self.sid)
        if self.row is None:
            raise SessionNotFound(f"session {self.sid} not found", data={"sessionId": self.sid})
        return self.row

    async def open_writer(self) -> TranscriptWriter:
        if self.storage_failed is not None:
            raise IOFailure(
                f"storage for session {self.sid} failed earlier ({self.storage_failed.message}); "
                "writes are refused until the host restarts",
                data={"sessionId": self.sid},
            )
        if self.writer is None:
            if self.row is not None and not await self.io(os.path.exists, self.path):
                await self._recreate_transcript()
            self.writer = await self.io(lambda: TranscriptWriter.open(self.path, faults=self.deps.faults))
            if self.writer.length != self.file_len:
                # A torn tail was quarantined (or the file grew): re-derive the index mark.
                self.needs_catchup = True
                self.file_len = self.writer.length
                self.epoch = self.writer.epoch
        return self.writer

    async def _recreate_transcript(self) -> None:
        """The row exists but its transcript vanished: start a new file that records the settings."""
        assert self.row is not None
        now = self.now()
        created = int(self.row.get("createdAt") or now)
        info = self.session_info_line(self.settings_snapshot(self.row))

        def make() -> None:
            create_transcript(self.path, self.sid, created, faults=self.deps.faults)
            with TranscriptWriter.open(self.path, faults=self.deps.faults) as writer:
                writer.append([info])

        await self.io(make)
        self.needs_catchup = True  # the next catch-up indexes the new file from its header

    async def write_lines(self, lines: Sequence[bytes]) -> tuple[list[int], int]:
        """Append lines durably (one write, one fsync). Returns each line's offset and the new length."""
        writer = await self.open_writer()
        try:
            first, new_len = await self.io(writer.append, list(lines))
        except IOFailure as exc:
            self.storage_failed = exc
            raise
        offsets = []
        pos = first
        for line in lines:
            offsets.append(pos)
            pos += len(line)
        self.file_len = new_len
        return offsets, new_len

    async def write_and_index(
        self,
        lines: Sequence[bytes],
        make_op: Callable[[list[int], int], Callable[[Any], Any]],
        *,
        durable: bool = False,
    ) -> tuple[list[int], int, Any]:
        """Append lines and commit their index op, overlapping the fsync with the SQL work.

        The op runs in the DB writer while the lines are written and fsynced; the
        DB writer commits only once the write is durable (a :class:`Gate`), so the
        order *file durable → index committed → reply* holds, at roughly the cost
        of the slower of the two instead of their sum.
        """
        writer = await self.open_writer()
        pre = writer.length
        offsets: list[int] = []
        pos = pre
        for line in lines:
            offsets.append(pos)
            pos += len(line)
        new_len = pos
        gate = Gate()
        op = make_op(offsets, new_len)
        box: dict[str, Any] = {}

        async def index_task() -> None:
            try:
                box["value"] = await self.deps.db.write(op, durable=durable, gate=gate)
            except Exception as exc:  # noqa: BLE001 - re-raised below, after the write's outcome
                box["index_error"] = exc

        async def write_task() -> None:
            try:
                box["written"] = await self.io(_append_then_open, writer, list(lines), gate)
            except Exception as exc:  # noqa: BLE001 - re-raised below
                box["write_error"] = exc

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(index_task)
                nursery.start_soon(write_task)
        finally:
            gate.fail(IOFailure("append abandoned before the write finished"))  # no-op once opened
        if "write_error" in box:
            exc = box["write_error"]
            if isinstance(exc, IOFailure) and not isinstance(exc, StorageFull):
                self.storage_failed = exc
            if "index_error" not in box or not isinstance(box["index_error"], (IOFailure,)):
                self.needs_catchup = True
            raise exc
        if box["written"] != (pre, new_len):
            self.needs_catchup = True
            raise IOFailure(f"transcript append landed at {box['written']}, expected {(pre, new_len)}")
        self.file_len = new_len
        if "index_error" in box:
            self.needs_catchup = True
            raise box["index_error"]
        return offsets, new_len, box["value"]

    async def check_receipt(self, key: ReceiptKey | None) -> Any | None:
        """Stored terminal response for a matching retry; raises IDEMPOTENCY_CONFLICT on mismatch."""
        if key is None:
            return None
        found = await self.read(index.check_receipt, key.client_id, key.submission_id, key.method, key.fingerprint)
        return None if found is None else found["response"]

    @staticmethod
    def store_receipt(conn: Any, key: ReceiptKey | None, response: Any, session_id: str, now_ms: int) -> None:
        if key is None:
            return
        index.store_receipt_if_absent(
            conn, client_id=key.client_id, submission_id=key.submission_id, method=key.method,
            fingerprint=key.fingerprint, response=response, session_id=session_id, now_ms=now_ms,
        )

    def settings_snapshot(self, row: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "title": row.get("title", ""),
            "projectPath": row.get("projectPath"),
            "providerId": row.get("providerId"),
            "modelId": row.get("modelId"),
            "mode": row.get("mode"),
            "thinkingLevel": row.get("thinkingLevel"),
            "permissionMode": row.get("permissionMode"),
        }

    def session_info_line(self, settings: Mapping[str, Any]) -> bytes:
        rec: dict[str, Any] = {"type": "session_info"}
        rec.update({k: v for k, v in settings.items()})
        rec["updatedAt"] = ms_to_rfc3339(self.now())
        return dumps_line(rec)

    def expects_more(self, batch: list[Envelope]) -> bool:
        return bool(getattr(batch[-1].msg, "more", False))

    # ------------------------------------------------------------------ dispatch
    async def handle(self, msg: Any) -> Any:
        if isinstance(msg, GetWindow):
            return await self._get(msg)
        if isinstance(msg, CreateSession):
            return await self._create(msg)
        if isinstance(msg, RenameSession):
            return await self._rename(msg)
        if isinstance(msg, UpdateSession):
            return await self._update(msg)
        if isinstance(msg, DeleteSession):
            return await self._delete(msg)
        if isinstance(msg, AppendMessage):
            return (await self._append_group([msg]))[0]
        if isinstance(msg, Custom):
            handler = self.deps.features.get(msg.kind)
            if handler is None:
                raise InvalidInput(f"unknown session request {msg.kind!r}")
            return await handler(self, msg)
        raise InvalidInput(f"unknown session request {type(msg).__name__}")

    async def handle_batch(self, batch: list[Envelope]) -> None:
        i = 0
        while i < len(batch):
            if isinstance(batch[i].msg, AppendMessage):
                j = i
                while j < len(batch) and isinstance(batch[j].msg, AppendMessage):
                    j += 1
                group = batch[i:j]
                try:
                    outcomes = await self._append_group([env.msg for env in group])
                except StoreError as exc:
                    outcomes = [exc] * len(group)
                except Exception as exc:  # noqa: BLE001 - e.g. ActorCrashed from the DB writer
                    self.needs_catchup = True
                    outcomes = [exc] * len(group)
                for env, outcome in zip(group, outcomes, strict=True):
                    _deliver(env, outcome)
                i = j
                continue
            env = batch[i]
            try:
                result: Any = await self.handle(env.msg)
            except StoreError as exc:
                result = exc
            except Exception as exc:  # noqa: BLE001 - delivered to the asker
                self.needs_catchup = True
                result = exc
            _deliver(env, result)
            i += 1

    # ------------------------------------------------------------------ create / metadata
    async def _create(self, req: CreateSession) -> Any:
        replay = await self.check_receipt(req.receipt)
        if replay is not None:
            return replay
        if self.deleted:
            self.deleted = False
        await self.catch_up()
        if self.row is not None:
            raise Conflict(f"session {self.sid} already exists", data={"sessionId": self.sid})
        now = self.now()
        settings = {k: v for k, v in req.settings.items() if v is not None}
        title = req.title.strip() if req.title else ""
        if len(title) > MAX_TITLE:
            raise InvalidInput(f"title must be at most {MAX_TITLE} characters", data={"field": "title"})
        info = {"title": title, "projectPath": req.project_path, **settings}
        header = await self.io(read_header, self.path)
        if header is None:
            if await self.io(os.path.exists, self.path):
                raise Conflict(f"transcript for {self.sid} exists but has no valid header")
            await self.io(lambda: create_transcript(self.path, self.sid, now, faults=self.deps.faults))
            self.file_len = await self.io(lambda: os.stat(self.path).st_size)
            self.epoch = (await self.io(read_header, self.path) or {}).get("epoch")
        elif header.get("sessionId") != self.sid:
            raise Conflict(f"transcript for {self.sid} belongs to another session")
        # Record DB-only metadata in the file too, so a rebuild loses nothing.
        offsets, new_len = await self.write_lines([self.session_info_line(info)])
        epoch = self.epoch

        def op(conn: Any) -> Any:
            plan = plan_reconcile(self.path, 0, None)
            apply_plan(conn, self.sid, plan, now_ms=now)
            index.update_session_settings(conn, self.sid, info, now_ms=now)
            row = index.require_session(conn, self.sid)
            conn.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (now, self.sid))
            row = index.require_session(conn, self.sid)
            result = index.public_session(row)
            self.store_receipt(conn, req.receipt, result, self.sid, now)
            return result

        result = await self.db(op, durable=True)
        await self.refresh_row()
        self.needs_catchup = False
        self.file_len, self.epoch = new_len, epoch
        self.publish("session.created", {"session": result})
        return result

    async def _rename(self, req: RenameSession) -> Any:
        replay = await self.check_receipt(req.receipt)
        if replay is not None:
            return replay
        title = validate_title(req.title)
        row = await self.ensure_ready()
        info = {**self.settings_snapshot(row), "title": title}
        return await self._write_settings(info, req.receipt, rename=True)

    async def _update(self, req: UpdateSession) -> Any:
        replay = await self.check_receipt(req.receipt)
        if replay is not None:
            return replay
        row = await self.ensure_ready()
        info = {**self.settings_snapshot(row), **dict(req.settings)}
        return await self._write_settings(info, req.receipt, rename=False)

    async def _write_settings(self, info: dict[str, Any], receipt: ReceiptKey | None, *, rename: bool) -> Any:
        _, new_len = await self.write_lines([self.session_info_line(info)])
        now = self.now()
        epoch = self.epoch

        def op(conn: Any) -> Any:
            if rename:
                index.rename_session(conn, self.sid, info["title"])
            else:
                index.update_session_settings(conn, self.sid, {k: v for k, v in info.items() if k != "title"},
                                              now_ms=now)
            index.set_index_mark(conn, self.sid, new_len, epoch)
            result = index.public_session(index.require_session(conn, self.sid))
            self.store_receipt(conn, receipt, result, self.sid, now)
            return result

        try:
            result = await self.db(op, durable=True)
        except BaseException:
            self.needs_catchup = True
            raise
        await self.refresh_row()
        self.publish("session.updated", {"session": result})
        return result

    async def _delete(self, req: DeleteSession) -> Any:
        replay = await self.check_receipt(req.receipt)
        if replay is not None:
            return replay
        if self.row is None:
            self.row = await self.read(index.session_row, self.sid)
        exists = self.row is not None or await self.io(os.path.exists, self.path)
        if not exists and not await self.io(os.path.exists, self.deps.data_dir.deleted_transcript(self.sid)):
            raise SessionNotFound(f"session {self.sid} not found", data={"sessionId": self.sid})
        if self.writer is not None:
            writer, self.writer = self.writer, None
            await self.io(writer.close)
        await self.io(mark_deleted, self.deps.data_dir, self.sid)
        now = self.now()
        result = {"sessionId": self.sid, "deleted": True}

        def op(conn: Any) -> Any:
            index.delete_session_rows(conn, self.sid)
            forget_queue(conn, self.sid)
            self.store_receipt(conn, req.receipt, result, self.sid, now)
            return result

        await self.db(op, durable=True)
        await self.io(finish_delete, self.deps.data_dir, self.sid)
        self.row = None
        self.deleted = True
        self.file_len, self.epoch = 0, None
        self.feature_state.clear()
        self.publish("session.deleted", {"sessionId": self.sid})
        return result

    # ------------------------------------------------------------------ appends
    async def ensure_exists_for_append(self) -> None:
        """D318: an append to a session whose row is gone restores it from the file or makes a stub."""
        if self.needs_catchup:
            await self.catch_up()
        if self.row is not None:
            return
        await self._create(CreateSession())

    async def _append_group(self, reqs: Sequence[AppendMessage]) -> list[Any]:
        self.deleted = False
        await self.ensure_exists_for_append()
        outcomes: list[Any] = [None] * len(reqs)
        # 1. one read for receipts (a retry gets the stored terminal response) and for ids
        #    already held by this or another session (replay, D444 remap, steering)
        candidates: list[str] = []
        for req in reqs:
            raw_id = req.message.get("id") if isinstance(req.message, Mapping) else None
            if isinstance(raw_id, str):
                candidates += [raw_id, f"{self.sid}:{raw_id}"]
        keys = [req.receipt for req in reqs]
        receipts, known = await self.read(_append_preflight, keys, candidates)
        for i, found in enumerate(receipts):
            if found is not None:
                outcomes[i] = found
        now = self.now()
        pending: list[tuple[int, dict[str, Any], str | None]] = []
        for i, req in enumerate(reqs):
            if outcomes[i] is not None:
                continue
            try:
                rec = normalize_message(req.message, now_ms=now, turn_id=req.turn_id)
            except StoreError as exc:
                outcomes[i] = exc
                continue
            pending.append((i, rec, None))
        if not pending:
            return outcomes
        # 2. ids: same-session replay, cross-session remap (D444), steering replacement
        to_write: list[tuple[int, dict[str, Any], str | None]] = []
        seen_in_batch: dict[str, dict[str, Any]] = {}
        replays: list[tuple[int, str]] = []
        existing_spans: dict[str, tuple[int, int]] = {}
        for i, rec, _ in pending:
            remapped_from = None
            owner = known.get(rec["id"])
            if owner is not None and owner[0] != self.sid:
                remapped_from = rec["id"]
                rec = {**rec, "id": f"{self.sid}:{rec['id']}"}
                owner = known.get(rec["id"])
            mid = rec["id"]
            if mid in seen_in_batch:
                if is_streaming(seen_in_batch[mid]) and rec.get("role") == "assistant" and not is_streaming(rec):
                    seen_in_batch[mid] = rec
                    to_write.append((i, rec, remapped_from))
                else:
                    replays.append((i, mid))
                continue
            if owner is not None:
                existing_spans[mid] = (owner[2], owner[3])
                seen_in_batch[mid] = {}
                replays.append((i, mid))
                pending_rec = rec
                # decided below, once the existing line is read
                to_write.append((i, {"__maybe_replace__": True, "rec": pending_rec}, remapped_from))
                continue
            seen_in_batch[mid] = rec
            to_write.append((i, rec, remapped_from))
        if existing_spans:
            ids = list(existing_spans)
            blobs = await self.io(read_spans, self.path, [existing_spans[m] for m in ids])
            existing_recs = {m: _safe_loads(b) for m, b in zip(ids, blobs, strict=True)}
            resolved: list[tuple[int, dict[str, Any], str | None]] = []
            for i, rec, remapped_from in to_write:
                if "__maybe_replace__" in rec:
                    new = rec["rec"]
                    old = existing_recs.get(new["id"]) or {}
                    if is_streaming(old) and new.get("role") == "assistant" and not is_streaming(new):
                        resolved.append((i, new, remapped_from))
                        replays = [(j, m) for (j, m) in replays if j != i]
                    continue
                resolved.append((i, rec, remapped_from))
            to_write = resolved
        # 3. encode (bad input fails alone), write + fsync once, index once
        lines: list[bytes] = []
        written: list[tuple[int, dict[str, Any], str | None]] = []
        for i, rec, remapped_from in to_write:
            req = reqs[i]
            if req.receipt is not None:
                rec = with_receipt(rec, {"clientId": req.receipt.client_id,
                                         "submissionId": req.receipt.submission_id,
                                         "fingerprint": req.receipt.fingerprint})
            try:
                line = dumps_line(rec)
            except StoreError as exc:
                outcomes[i] = exc
                continue
            lines.append(line)
            written.append((i, rec, remapped_from))
        refs: list[dict[str, Any]] = []
        if lines:
            epoch = self.epoch

            def make_op(offsets: list[int], new_len: int) -> Callable[[Any], Any]:
                items = [index.IndexRecord(rec, off, len(line))
                         for (_, rec, _), off, line in zip(written, offsets, lines, strict=True)]
                return lambda conn: index.index_messages(conn, self.sid, items, indexed_len=new_len,
                                                         file_epoch=epoch, now_ms=now)

            _, _, refs = await self.write_and_index(lines, make_op, durable=False)
            for (i, _rec, remapped_from), ref in zip(written, refs, strict=True):
                result: dict[str, Any] = {"message": ref, "replayed": False}
                if remapped_from is not None:
                    result["remappedFrom"] = remapped_from
                outcomes[i] = result
            await self.after_append([rec for _, rec, _ in written])
        if replays:
            rows = await self.read(index.message_refs, [m for _, m in replays])
            for i, mid in replays:
                if outcomes[i] is not None:
                    continue
                found = rows.get(mid)
                if found is None:
                    outcomes[i] = MessageNotFound(f"message {mid} vanished during append")
                    continue
                outcomes[i] = {"message": found, "replayed": True}
        if refs:
            if self.row is not None:
                self.row["messageCount"] = max([self.row["messageCount"], *(r["seq"] for r in refs)])
                self.row["updatedAt"] = max(self.row["updatedAt"], now)
                self.row["_indexedLen"] = self.file_len
            for ref, (_, rec, _), line in zip(refs, written, lines, strict=True):
                data: dict[str, Any] = {"message": ref}
                if len(line) <= EVENT_RECORD_MAX:
                    data["record"] = wire_record(rec)
                self.publish("session.message", data)
        return outcomes

    async def after_append(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Let features react to rows that just landed (the in-flight module removes its checkpoint)."""
        hook = self.deps.features.get("__after_append__")
        if hook is not None:
            await hook(self, Custom("__after_append__", {"records": list(records)}))

    # ------------------------------------------------------------------ reads
    async def _get(self, req: GetWindow) -> Any:
        limit = req.limit
        if limit is not None and not 1 <= limit <= MAX_WINDOW:
            raise InvalidInput(f"messageLimit must be 1-{MAX_WINDOW}", data={"field": "messageLimit"})
        if req.content_limit is not None and req.content_limit < 1:
            raise InvalidInput("contentLimit must be positive", data={"field": "contentLimit"})
        if req.start is not None and req.start < 0:
            raise InvalidInput("messageStart must be >= 0", data={"field": "messageStart"})
        if req.before is not None and req.before < 0:
            raise InvalidInput("messageBefore must be >= 0", data={"field": "messageBefore"})
        if self.deleted:
            raise SessionNotFound(f"session {self.sid} was deleted", data={"sessionId": self.sid})
        window: _Window | None = None
        if self.needs_catchup:
            # Cold open: session row, file check and the window in ONE read; the
            # common clean case needs nothing else before reading the window's bytes.
            window = await self.read(_cold_window, self.sid, self.path, req)
            if window.row is not None and window.plan_kind == "clean":
                self.row, self.file_len, self.epoch = window.row, window.file_len, window.epoch
                self.needs_catchup = False
            else:
                window = None
        if window is None:
            ready = await self.ensure_ready()
            window = await self.read(_warm_window, self.sid, self.path, int(ready["messageCount"]), req)
        if window.missing_target:
            raise MessageNotFound(
                f"message {req.around} is not in session {self.sid}",
                data={"sessionId": self.sid, "messageId": req.around},
            )
        row = self.row
        assert row is not None
        total, start, end, target_pos = window.total, window.start, window.end, window.target_pos
        rows, blobs = window.rows, window.blobs
        messages: list[dict[str, Any]] = []
        for r, blob in zip(rows, blobs[: len(rows)], strict=True):
            rec = wire_record(_safe_loads(blob))
            if r[4]:
                rec["deleted"] = True
            rec["seq"] = r[0]
            if r[5] is not None:
                rec.setdefault("turnId", r[5])
            bypass = target_pos is not None and r[0] - 1 == target_pos and rec.get("role") in ("user", "assistant")
            messages.append(rec if bypass else cap_content(rec, req.content_limit))
        compactions = [wire_record(normalize_on_read(_safe_loads(b))) for b in blobs[len(rows):]]
        result: dict[str, Any] = {
            "session": index.public_session(row),
            "messages": messages,
            "compactions": compactions,
            "messageStart": start,
            "messageEnd": end,
            "hasMoreBefore": start > 0,
            "hasMoreAfter": end < total,
            "totalMessages": total,
        }
        if target_pos is not None:
            parent = await self._navigation_parent(messages, req, target_pos)
            if parent is not None:
                result["navigationParent"] = parent
        return result

    async def _navigation_parent(self, messages: list[dict[str, Any]], req: GetWindow, pos: int) -> Any:
        target = next((m for m in messages if m.get("seq") == pos + 1), None)
        meta = (target or {}).get("meta") or {}
        call_id = meta.get("parentToolCallId") if isinstance(meta, dict) else None
        if not isinstance(call_id, str):
            return None
        found = await self.io(find_tool_call_line, self.path, call_id)
        if found is None:
            return None
        return cap_content(wire_record(found), req.content_limit)


# ---------------------------------------------------------------------- helpers


def _deliver(env: Envelope, outcome: Any) -> None:
    if env.reply is None:
        return
    if isinstance(outcome, BaseException):
        env.reply.set_exception(outcome)
    else:
        env.reply.set_result(outcome)


def _append_preflight(
    conn: Any, keys: Sequence[ReceiptKey | None], candidates: Sequence[str]
) -> tuple[list[Any], dict[str, tuple[str, int, int, int]]]:
    """Receipts of a group of appends and the ids the index already holds, in one read."""
    receipts: list[Any] = []
    for key in keys:
        if key is None:
            receipts.append(None)
            continue
        try:
            found = index.check_receipt(conn, key.client_id, key.submission_id, key.method, key.fingerprint)
        except StoreError as exc:
            receipts.append(exc)
            continue
        receipts.append(None if found is None else found["response"])
    return receipts, index.lookup_ids(conn, candidates)


MAX_COALESCED_READ = 4 * 1024 * 1024


def read_spans_coalesced(path: Path, spans: Sequence[tuple[int, int]]) -> list[bytes]:
    """``read_spans``, but ranges that lie back to back in the file are read with one pread.

    Consecutive message lines of an append-only transcript are adjacent, so a
    window (or a whole-session load) is one sequential read of exactly its
    lines instead of one system call per line (seed 003 §11.2). A merged read
    is capped at :data:`MAX_COALESCED_READ` bytes.
    """
    merged: list[tuple[int, int]] = []
    for offset, length in spans:
        if merged:
            last_off, last_len = merged[-1]
            if last_off + last_len == offset and last_len + length <= MAX_COALESCED_READ:
                merged[-1] = (last_off, last_len + length)
                continue
        merged.append((offset, length))
    if len(merged) == len(spans):
        return read_spans(path, spans)
    out: list[bytes] = []
    pieces = iter(spans)
    for (_, total), blob in zip(merged, read_spans(path, merged), strict=True):
        view = memoryview(blob)
        pos = 0
        while pos < total:
            _, length = next(pieces)
            out.append(bytes(view[pos : pos + length]))
            pos += length
    return out


def _append_then_open(writer: TranscriptWriter, lines: list[bytes], gate: Gate) -> tuple[int, int]:
    """Worker thread: append + fsync, then let the gated index op commit (or fail it)."""
    try:
        result = writer.append(lines)
    except BaseException as exc:
        gate.fail(exc)
        raise
    gate.open()
    return result


def _safe_loads(blob: bytes) -> dict[str, Any]:
    try:
        return loads_line(blob)
    except ValueError:
        return {"type": "message", "id": None, "corrupt": True}


@dataclass
class _Window:
    total: int = 0
    start: int = 0
    end: int = 0
    target_pos: int | None = None
    missing_target: bool = False
    rows: list[Any] = field(default_factory=list)
    compactions: list[Any] = field(default_factory=list)
    row: dict[str, Any] | None = None
    plan_kind: str = ""
    file_len: int = 0
    epoch: str | None = None
    blobs: list[bytes] = field(default_factory=list)  # the rows' lines, then the compactions' lines


def window_bounds(total: int, req: GetWindow, target_pos: int | None) -> tuple[int, int]:
    """Physical positions ``[start, end)`` of the window a request asks for (seed §5)."""
    limit = req.limit
    if target_pos is not None:
        lim = limit or 50
        start = max(0, target_pos - lim // 2)
        end = min(total, start + lim)
        return max(0, end - lim), end
    if req.start is not None:
        start = min(req.start, total)
        return start, total if limit is None else min(total, start + limit)
    end = total if req.before is None else max(0, min(req.before, total))
    return (0 if limit is None else max(0, end - limit)), end


def _warm_window(conn: Any, sid: str, path: Path, total: int, req: GetWindow) -> _Window:
    """Read pool: target position, bounds, window rows, the compaction chain and their
    lines' bytes, in one snapshot and one worker-thread hop.

    The bytes are read in the same call (not in a second hop) because on a busy
    machine each hop to a worker thread costs as much as the read itself; the
    session actor is the transcript's only writer and awaits this call, so the
    offsets cannot move underneath it.
    """
    w = _Window(total=total)
    if req.around is not None:
        w.target_pos = index.position_of(conn, sid, req.around)
        if w.target_pos is None:
            w.missing_target = True
            return w
    w.start, w.end = window_bounds(total, req, w.target_pos)
    w.rows = index.window_rows(conn, sid, w.start, w.end)
    w.compactions = index.compaction_rows(conn, sid)
    spans = [(r[2], r[3]) for r in w.rows] + [(c[2], c[3]) for c in w.compactions]
    if spans:
        w.blobs = read_spans_coalesced(path, spans)
    return w


def _cold_window(conn: Any, sid: str, path: Path, req: GetWindow) -> _Window:
    """Read pool, first request of an actor: row + clean-file check + window, one snapshot."""
    conn.execute("BEGIN")
    try:
        row = index.session_row(conn, sid)
        if row is None:
            return _Window()
        plan = plan_reconcile(path, row["_indexedLen"], row["_fileEpoch"])
        if plan.kind != "clean" or plan.file_len != row["_indexedLen"]:
            return _Window(row=row, plan_kind=plan.kind)
        w = _warm_window(conn, sid, path, int(row["messageCount"]), req)
        w.row, w.plan_kind, w.file_len, w.epoch = row, plan.kind, plan.file_len, plan.epoch
        return w
    finally:
        conn.execute("ROLLBACK")


def find_tool_call_line(path: Path, call_id: str) -> dict[str, Any] | None:
    """The newest message line holding a ``tool_call`` block with ``callId`` (navigation parent)."""
    needle = call_id.encode()
    found: dict[str, Any] | None = None
    with open(path, "rb") as fh:
        for line in fh:
            if needle not in line or not line.endswith(b"\n"):
                continue
            try:
                rec = loads_line(line)
            except ValueError:
                continue
            if rec.get("type") != "message":
                continue
            for block in rec.get("blocks") or ():
                if isinstance(block, dict) and block.get("type") == "tool_call" and block.get("callId") == call_id:
                    found = rec
    return found


def mark_deleted(data_dir: DataDir, sid: str) -> None:
    """Step 1 of a delete: rename the transcript aside so boot can never resurrect it."""
    src = data_dir.transcript(sid)
    if os.path.exists(src):
        os.replace(src, data_dir.deleted_transcript(sid))
        fsync_dir(data_dir.sessions_dir)


def finish_delete(data_dir: DataDir, sid: str) -> None:
    """Last step of a delete (also run by boot for an interrupted delete)."""
    for path in (data_dir.deleted_transcript(sid), data_dir.transcript(sid), data_dir.revisions(sid),
                 data_dir.inflight(sid)):
        remove_file_durable(path)
    for directory in (data_dir.scratch(sid), data_dir.review_changes(sid)):
        shutil.rmtree(directory, ignore_errors=True)
