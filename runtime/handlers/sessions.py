"""``session.create`` / ``get`` / ``rename`` / ``update`` / ``delete`` (``session.list``: ``native_pi.py``).

Files first, index second, reply last. The receipts of the file-first methods
ride in the file they write: ``session.create`` in the new transcript's header
(written whole, with its first ``session_info`` line), ``session.delete`` in the
delete marker written before anything is removed (``store/transcripts/session_files.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import trio

from actors.gateway_types import CallContext
from actors.session_context import CarriedAnswer, SessionContext
from protocol import models as m
from protocol.jsonrpc import Encoded
from runtime.context import Services
from runtime.handlers import inflight, plans, turn_aftermath
from runtime.handlers import queue as queue_control
from store import orphans, queue, receipts, thread_meta
from store.errors import Conflict, MessageNotFound, StorageFull, StoreError
from store.ids import derived_id, new_id
from store.indexing import index
from store.indexing.reconcile import ReconcilePlan, apply_plan, created_answer, plan_reconcile, read_header
from store.inflight import checkpoint_message_id
from store.receipts import ReceiptKey, file_record
from store.rules import DEFAULT_WINDOW, MAX_REPLY_BYTES, MAX_WHOLE_READ_BYTES
from store.transcripts import windows
from store.transcripts.session_files import finish_delete, withdraw_delete_marker, write_delete_marker
from store.transcripts.transcript import create_transcript
from store.transcripts.window_reply import with_field
from store.turns import abort_running, get_turn

from .plugin_imports import scope_session

__all__ = ["create", "create_target", "delete", "get", "get_direct", "remove_session", "rename", "update",
           "warm_reads", "window_request"]

log = logging.getLogger("pi_host")
T = TypeVar("T")


# ---------------------------------------------------------------------- create


async def create_target(services: Services, p: m.SessionCreateParams, key: ReceiptKey | None) -> str:
    """The new session's id: the client's, else derived from the receipt key (a retry after a
    crash lands on the same session), else fresh."""
    if p.session_id is not None:
        return p.session_id
    if key is not None:
        return derived_id("session", key.client_id, key.submission_id)
    return new_id()


async def create(ctx: SessionContext, p: m.SessionCreateParams, key: ReceiptKey | None) -> Any:
    ctx.undelete()  # an id whose session was deleted may be created again
    if await ctx.catch_up() is not None:
        if key is not None and (first := await ctx.read(receipts.check, key)) is not None:
            # this call's first try made it (its header's receipt, restored by the catch-up): its answer,
            # unless its file failed its directory fsync (rule 7: answered after the restart)
            ctx.refuse_if_receipt_doubtful(key)
            return first["response"]
        raise Conflict(f"session {ctx.sid} already exists", data={"sessionId": ctx.sid})
    path = ctx.paths.transcript
    if await ctx.io(os.path.lexists, path):
        raise Conflict(f"a transcript for {ctx.sid} exists but has no valid session header",
                       data={"sessionId": ctx.sid})
    settings: dict[str, Any] = {"title": p.title or "", "projectPath": p.project_path}
    for name, value in (("providerId", p.provider_id), ("modelId", p.model_id), ("mode", p.mode),
                        ("thinkingLevel", p.thinking_level), ("permissionMode", p.permission_mode)):
        if value is not None:
            settings[name] = value
    now = ctx.now()
    info = ctx.session_info_line(settings)
    faults = ctx.faults
    sid = ctx.sid
    receipt = answer = None
    if key is not None:
        # the header carries the answer this call will give (a retry after the database was lost is answered
        # with it, not with the session as it is then); the project row it names goes in for good first
        answer = await ctx.db(lambda conn: created_answer(conn, sid, now, info, now_ms=now),
                              durable=p.project_path is not None)
        receipt = file_record(key, response=answer)

    def write() -> ReconcilePlan:
        create_transcript(path, sid, now, body_lines=[info], receipt=receipt, faults=faults)
        return plan_reconcile(path, 0, None)

    carried = CarriedAnswer(answer)

    def answered(conn: Any) -> Any:
        # keyed: the header's answer, which apply_plan just stored as the receipt's (every retry gets it)
        return carried.give(index.public_session(index.require_session(conn, sid)))

    result = await ctx.rewrite_file(write, lambda conn, plan: apply_plan(conn, sid, plan, now_ms=now), answered,
                                    fault="create.before_index")
    carried.check("session.create")  # e.g. its project row removed in between; the answer stays the header's
    ctx.publish("session.created", {"session": result})
    return result


# ---------------------------------------------------------------------- reads


def window_request(p: m.SessionGetParams, client_kind: str) -> windows.WindowRequest:
    """The window ``p`` asks for. ``full`` is the whole transcript with no content cap: a
    ``contentLimit`` sent with it is ignored (not refused: clients may send both)."""
    if p.full:
        limit = None
    elif p.message_limit is not None:
        limit = p.message_limit
    else:
        limit = None if client_kind == "agent" else DEFAULT_WINDOW  # the sidecar reads whole transcripts
    return windows.WindowRequest(before=p.message_before, start=p.message_end, limit=limit,
                                 content_limit=None if p.full else p.content_limit, around=p.message_around,
                                 max_bytes=p.max_bytes or MAX_REPLY_BYTES)


async def get(ctx: SessionContext, p: m.SessionGetParams, key: ReceiptKey | None) -> Any:
    req = window_request(p, ctx.caller.client_kind)
    try:
        await scope_session(ctx.read, ctx.caller, ctx.sid)  # a plugin reads only the sessions it imported
        window = await _indexed_window(ctx, req)
    except StorageFull:
        # The index cannot take appends this session acknowledged (a full disk refuses its commits):
        # reads keep working, served from the transcript alone (bounded), until space is freed.
        return await _get_from_file(ctx, req)
    if window.missing_target:
        raise MessageNotFound(f"message {req.around} is not in session {ctx.sid}",
                              data={"sessionId": ctx.sid, "messageId": req.around})
    reply = window.reply
    if window.end >= window.total:  # the newest window: the reply streaming right now, after the rows
        live = await inflight.current(ctx, req.content_limit)
        if live is not None:
            # a copy of the whole reply (up to 16 MiB): the worker thread's work, not the trio loop's
            reply = await ctx.io(with_field, reply, "inflight", live)
    call_id = windows.navigation_call_id(window.target)
    if call_id is not None:
        parent = await ctx.io(windows.navigation_parent, ctx.paths.transcript, call_id, req.content_limit)
        pos = None if parent is None else await ctx.read(index.position_of, ctx.sid, str(parent.get("id")))
        if parent is not None and pos is not None:  # a stored message: its seq, as every window row has
            reply = await ctx.io(with_field, reply, "navigationParent", {**parent, "seq": pos + 1})
    _read_next_page_ahead(ctx, req, window)
    return Encoded(reply)  # encoded once from the lines' own bytes; the gateway sends it as it is


async def get_direct(services: Services, p: m.SessionGetParams, caller: CallContext) -> Any:
    """``session.get`` of a session whose actor is not running, served without starting it: one read-pool
    hop (``_read_cold``: the session row, the file check, the window, the in-flight checkpoint), from the
    request's own task. ``None``: not served here, the session actor serves it (the caller posts it there).

    Only the plain case: not a forward page (its next page is read ahead by the actor), a clean file whose size
    and epoch are the index's, no reply streaming (no checkpoint), no navigation parent, the ``messageAround``
    target found. Everything else, and every error, goes to the actor, which reads again and answers as it
    always did; but a plugin's read of a session it did not import is refused here, without the actor.

    Why it is exact without the actor (``docs/DESIGN.md``, "Reads without the session actor"): with no
    actor running, every write of this session that was acknowledged is durable in the transcript and, when
    the index's mark says so, in the index. The row, the spans and the derived fields come from one read
    snapshot; the file check finds that snapshot's mark and epoch in the very descriptor the lines are read
    from. A write that starts meanwhile (its actor starts beside this read) appends past the mark, which
    moves no byte under it, or replaces the file by a rename, which leaves the open descriptor on the old
    one (the snapshot's). Lines are CRC-checked against the snapshot's rows; a mismatch is not trusted
    here (the actor reads again: real damage is reported there)."""
    req = window_request(p, caller.client_kind)
    if req.start is not None:
        return None
    sid = p.session_id
    if caller.plugin_id is not None:
        # A plugin reaches only the sessions it imported: checked here (its refusal starts no actor), then read as
        # any caller's; what goes to the actor is checked there again, as every session route does for a plugin.
        await scope_session(services.reads.run, caller, sid)
    paths = services.paths(sid)
    try:
        cold, checkpoint = await services.reads.run(_read_cold, sid, paths.transcript, paths.inflight, req,
                                                    services.now_ms())
    except StoreError:
        return None
    if cold.row is None or cold.plan_kind != "clean" or checkpoint is not None or cold.missing_target:
        return None
    if windows.navigation_call_id(cold.target) is not None:
        return None
    return Encoded(cold.reply)


WARM_BUDGET = 0.02
"""Seconds the warm-up may take at most (it stops after the read that passes them)."""
WARM_CALLER = CallContext(connection_id=0, client_id="host-warmup", client_kind="host", protocol=1)


async def warm_reads(services: Services, call: Callable[[str, Any, CallContext], Awaitable[Any]],
                     times: int, budget: float | None = None) -> int:
    """At boot, before any client is served: the newest page of the session updated last, read ``times``
    times through ``call`` (the pipeline: validation, routing, ``get_direct``'s read-pool hop, snapshot
    and encoded reply), so that the first ``session.get`` a client sends costs what a later one does.
    Why a dozen (``HostConfig.warm_reads``): CPython specializes a function's bytecode once it ran a few
    times, and until then the read path runs markedly slower (measured: a fresh host's first get of a page
    costs about 1.5x a later one, and still 1.2-1.4x after one read of another session; after a dozen reads
    of another session, what a later one costs).
    Reads only: a read that would start the session's actor (``get_direct`` declines it) is not made,
    and an error ends the warm-up; it is logged, never raised (a client's read meets it again and is
    answered as always). Returns how many reads it made."""
    done = 0
    try:
        sid = await services.reads.run(windows.newest_read_target)
        if sid is None:
            return 0
        raw = {"sessionId": sid, "messageLimit": DEFAULT_WINDOW}
        params = m.SessionGetParams.model_validate(raw)
        if await get_direct(services, params, WARM_CALLER) is None:
            return 0  # served by the actor: not warmed (no actor is started for it)
        done = 1
        deadline = trio.current_time() + (WARM_BUDGET if budget is None else budget)
        while done < times and trio.current_time() < deadline and not services.sessions.running(sid):
            await call("session.get", raw, WARM_CALLER)
            done += 1
    except Exception as exc:
        log.warning("the boot's read warm-up stopped after %d reads: %s", done, exc)
    return done


async def _indexed_window(ctx: SessionContext, req: windows.WindowRequest) -> windows.Window:
    """The window from the index (the session's row, its spans): ``StorageFull`` while the index
    cannot take appends this session acknowledged."""
    if ctx.needs_catchup:
        # Cold open: session row, file check, the window and whether a reply is streaming (its
        # in-flight checkpoint) in ONE read; the common clean case needs nothing else.
        cold, checkpoint = await ctx.read(_read_cold, ctx.sid, ctx.paths.transcript, ctx.paths.inflight, req,
                                          ctx.now())
        inflight.learned_checkpoint_id(ctx, checkpoint)
        if cold.row is not None and cold.plan_kind == "clean":
            ctx.adopt_window_state(cold.row, cold.file_len, cold.epoch)
            return cold
    row = await ctx.ensure_ready()
    total = int(row["messageCount"])
    window: windows.Window | None = ctx.take_ahead((req, total))  # read ahead for this call, if nothing changed
    if window is None:
        window = await ctx.read(partial(windows.read_warm, now_ms=ctx.now()), ctx.sid, ctx.paths.transcript,
                                total, req, row)
    return window


def _read_next_page_ahead(ctx: SessionContext, req: windows.WindowRequest, window: windows.Window) -> None:
    """A forward page with more after it (a client reading a history page by page): the session actor
    reads the next page while the client receives and decodes this one, and the next call takes it if
    it asks for exactly that page and nothing changed since (``actors/session.py``, read-ahead)."""
    if req.start is None or req.around is not None or window.end >= window.total or not ctx.exists:
        return
    row = ctx.row
    total = int(row["messageCount"])
    if total != window.total:
        return
    nxt = dataclasses.replace(req, start=window.end)
    ctx.read_ahead((nxt, total), partial(windows.read_warm, now_ms=ctx.now()), ctx.sid, ctx.paths.transcript,
                   total, nxt, row, bound=nxt.max_bytes or MAX_REPLY_BYTES, size=lambda w: len(w.reply))


def _read_cold(conn: Any, sid: str, path: Path, inflight_path: Path, req: windows.WindowRequest,
               now_ms: int) -> tuple[windows.Window, str | None]:
    return windows.read_cold(conn, sid, path, req, now_ms), checkpoint_message_id(inflight_path)


async def _get_from_file(ctx: SessionContext, req: windows.WindowRequest) -> Any:
    """``session.get`` from the transcript alone. Its reads of the index do not wait for the appends the
    index cannot take: the session's row and a plugin's import scope do not depend on them, and the
    window's positions and counts come from the file."""
    await scope_session(ctx.read_uncovered, ctx.caller, ctx.sid)
    session_row = await ctx.read_uncovered(index.require_session, ctx.sid)
    window = await ctx.io(lambda: windows.read_file_window(ctx.paths.transcript, req, session_row,
                                                           max_file_bytes=MAX_WHOLE_READ_BYTES))
    if window.missing_target:
        raise MessageNotFound(f"message {req.around} is not in session {ctx.sid}",
                              data={"sessionId": ctx.sid, "messageId": req.around})
    return Encoded(window.reply)


# ---------------------------------------------------------------------- metadata


async def rename(ctx: SessionContext, p: m.SessionRenameParams, key: ReceiptKey | None) -> Any:
    return await _write_settings(ctx, {**ctx.settings(), "title": p.title}, rename=True)


async def update(ctx: SessionContext, p: m.SessionUpdateParams, key: ReceiptKey | None) -> Any:
    await plans.check_mode_change(ctx, p.mode)
    changes = p.model_dump(by_alias=True, exclude_none=True, exclude={"session_id", "submission_id"})
    return await _write_settings(ctx, {**ctx.settings(), **changes}, rename=False)


async def update_metadata(ctx: SessionContext, p: m.SessionUpdateMetadataParams, key: ReceiptKey | None) -> Any:
    """Seed 000 §2.1 thread metadata: a ``session_info`` line carrying it (a rebuilt index keeps it),
    then its row, in the line's commit with the receipt."""
    changes = p.model_dump(by_alias=True, include=p.model_fields_set - {"session_id", "submission_id"})
    meta = thread_meta.merge(ctx.row.get("thread"), changes)
    now, sid = ctx.now(), ctx.sid

    def then(conn: Any, refs: Any) -> Any:
        thread_meta.upsert(conn, sid, meta, now_ms=now)
        return index.public_session(index.require_session(conn, sid))

    result = await ctx.append_info({**ctx.settings(), "thread": meta}, then, touch=False)
    ctx.publish("session.updated", {"session": result})
    return result


async def _write_settings(ctx: SessionContext, info: dict[str, Any], *, rename: bool) -> Any:
    """A ``session_info`` line (so a rebuilt index keeps the metadata), then the row."""
    now, sid = ctx.now(), ctx.sid

    def then(conn: Any, refs: Any) -> Any:
        if rename:
            index.rename_session(conn, sid, info["title"])
        else:
            index.update_session_settings(conn, sid, {k: v for k, v in info.items() if k != "title"}, now_ms=now)
        return index.public_session(index.require_session(conn, sid))

    result = await ctx.append_info(info, then)
    ctx.publish("session.updated", {"session": result})
    return result


# ---------------------------------------------------------------------- delete


def _created_header(path: Path) -> dict[str, Any] | None:
    """The transcript's header, for the receipts of the request that made the session (a fork's is kept
    under its parent); a file that cannot be read names none, and the delete goes on."""
    try:
        return read_header(path)
    except (StoreError, OSError):
        return None


async def remove_session(ctx: SessionContext, key: ReceiptKey | None, rows: Callable[[Any], T], *,
                         points: str) -> T:
    """The delete protocol (``session.delete``, ``sessions.purge``): the marker (with the receipt) → the
    rows (``rows(conn)``, its value the answer) → the files (``store/transcripts/session_files.py``).
    Fault points ``<points>.after_marker`` / ``<points>.before_files``.

    A failure after the marker: if the session's rows stayed, the delete did not happen and its marker
    goes; if they went, it did (the session's next catch-up, or boot, finishes it from the marker). Not
    known, or the marker cannot go: it stays (boot finishes the delete, as after a kill).

    Seed 000 §3.3: "thread.delete first stops admission and active or recovered execution": in the rows'
    transaction a turn still running ends ``aborted`` with what it still asked (its pending approvals and
    questions ``cancelled``, :mod:`runtime.handlers.turn_aftermath`), and after the delete ``turn.ended`` and
    ``approval.resolved`` / ``interaction.resolved`` say so, before ``session.deleted``: a sidecar waiting on
    an answer stops waiting."""
    paths, sid, now, faults = ctx.paths, ctx.sid, ctx.now(), ctx.faults
    ended: list[tuple[list[dict[str, Any]], turn_aftermath.Aftermath]] = []

    def stop_then_remove(conn: Any) -> T:
        aborted = abort_running(conn, sid, now)
        settled = turn_aftermath.settle(conn, sid, aborted, "aborted", None, now, faults)
        turns = [t for t in (get_turn(conn, turn_id) for turn_id in aborted) if t is not None]
        result = rows(conn)
        ended[:] = [(turns, settled)]  # the last try's (a transaction may be run again)
        return result

    await ctx.close_writer()
    header = await ctx.io(_created_header, paths.transcript)
    created = await ctx.read(partial(orphans.created_receipts, header=header), sid)  # into the deleted-sessions log
    await ctx.io(write_delete_marker, paths, file_record(key) if key is not None else None, created)
    try:
        await ctx.io(ctx.faults.point, f"{points}.after_marker")
        result = await ctx.commit(stop_then_remove)
    except Exception:
        try:
            if not await ctx.read(receipts.landed, key, lambda conn: index.session_row(conn, sid) is None):
                await ctx.io(withdraw_delete_marker, paths)
        except Exception:  # noqa: BLE001 - the delete's own error is the one to report
            log.warning("could not withdraw the delete marker of session %s", sid, exc_info=True)
        raise
    await ctx.io(ctx.faults.point, f"{points}.before_files")
    now = ctx.now()
    await ctx.io(lambda: finish_delete(paths, now_ms=now, faults=faults))
    ctx.forget_session()
    control = ctx.services.extra.get(queue_control.SERVICE)
    if isinstance(control, queue_control.QueueControl):
        control.forget(sid)  # its controller drives no queue any more
    for turns, settled in ended:
        for turn in turns:
            ctx.publish("turn.ended", {"turn": {k: v for k, v in turn.items() if v is not None}})
        turn_aftermath.publish(ctx, settled)
    ctx.publish("session.deleted", {"sessionId": sid})
    return result


async def delete(ctx: SessionContext, p: m.SessionDeleteParams, key: ReceiptKey | None) -> Any:
    """Marker (with the receipt) → rows → files (:func:`remove_session`)."""
    sid, now = ctx.sid, ctx.now()

    def op(conn: Any) -> Any:
        index.delete_session_rows(conn, sid, now_ms=now)
        queue.forget_session(conn, sid)
        return {"sessionId": sid, "deleted": True}

    return await remove_session(ctx, key, op, points="delete")
