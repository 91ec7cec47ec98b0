"""Session-actor handlers: tombstones, fork, and the derived tree and model context.

* ``history.delete`` / ``history.restore`` (``session.deleteMessage`` /
  ``session.restoreMessage``): one ``tombstone`` line (write + fsync), then
  ``messages.deleted`` and the index mark in one DB op, reply last. Asking for
  the state a message already has writes nothing.
* ``history.fork`` (``session.fork``): runs in the SOURCE session's actor. It
  never asks the registry (the child's actor would be a second writer racing
  this one, and asking our own actor would deadlock): it copies referenced
  pasted inputs, writes the child transcript atomically, then inserts the
  child's session row and index rows in one DB op; the child's actor finds a
  clean index on first use. A handled failure removes the child's files (and,
  if the DB op's outcome is unknown, its rows).
* ``history.tree`` / ``history.context``: pure views (:mod:`store.context`)
  over one full read of the transcript (and the revisions file for the tree).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import trio

from actors.session import validate_title
from actors.session_msgs import Custom
from store import index
from store.context import StoredBranch, build_session_context, build_tree
from store.errors import MessageNotFound
from store.fork import copy_pasted, plan_fork, remove_child_files, resolve_pasted, write_child_transcript
from store.ids import new_id
from store.records import ms_to_rfc3339, wire_record
from store.revisions import read_revisions
from store.rewrite import LiveTranscript, load_live, reindex
from store.tombstones import deleted_ids, tombstone_line

if TYPE_CHECKING:
    from actors.session import SessionActor


async def _snapshot(actor: SessionActor) -> LiveTranscript:
    row = actor.row or {}
    return await actor.io(lambda: load_live(actor.path, default_created_ms=int(row.get("createdAt") or 0)))


# ---------------------------------------------------------------------- tombstones


def _message_state(conn: Any, sid: str, mid: str) -> dict[str, Any] | None:
    row = conn.execute(
        "SELECT seq, role, created_at, turn_id, deleted FROM messages WHERE session_id = ? AND id = ?", (sid, mid)
    ).fetchone()
    if row is None:
        return None
    return {"ref": {"id": mid, "sessionId": sid, "seq": row[0], "role": row[1], "createdAt": row[2],
                    "turnId": row[3]}, "deleted": bool(row[4])}


async def delete_message(actor: SessionActor, req: Custom) -> Any:
    return await _set_deleted(actor, req, True)


async def restore_message(actor: SessionActor, req: Custom) -> Any:
    return await _set_deleted(actor, req, False)


async def _set_deleted(actor: SessionActor, req: Custom, deleted: bool) -> Any:
    replay = await actor.check_receipt(req.receipt)
    if replay is not None:
        return replay
    await actor.ensure_ready()
    sid, mid = actor.sid, str(req.params["messageId"])
    state = await actor.read(_message_state, sid, mid)
    if state is None:
        raise MessageNotFound(f"message {mid} is not in session {sid}", data={"sessionId": sid, "messageId": mid})
    result = {"messageId": mid, "deleted": deleted}
    now = actor.now()
    if state["deleted"] == deleted:
        if req.receipt is not None:
            await actor.db(lambda conn: actor.store_receipt(conn, req.receipt, result, sid, now), durable=True)
        return result
    line = tombstone_line(new_id("t"), mid, deleted, created_at_ms=now)
    _, new_len = await actor.write_lines([line])
    epoch = actor.epoch

    def op(conn: Any) -> Any:
        index.set_deleted(conn, sid, mid, deleted)
        index.set_index_mark(conn, sid, new_len, epoch)
        actor.store_receipt(conn, req.receipt, result, sid, now)
        return result

    try:
        # The line is authoritative (a tail catch-up re-applies it); only a receipt needs FULL.
        await actor.db(op, durable=req.receipt is not None)
    except BaseException:
        actor.needs_catchup = True
        raise
    actor.publish("session.message", {"message": state["ref"], "deleted": deleted})
    return result


# ---------------------------------------------------------------------- fork


async def fork(actor: SessionActor, req: Custom) -> Any:
    replay = await actor.check_receipt(req.receipt)
    if replay is not None:
        return replay
    row = await actor.ensure_ready()
    sid = actor.sid
    data_dir = actor.deps.data_dir
    faults = actor.deps.faults
    title = req.params.get("title")
    if title is not None:
        title = validate_title(title)
    else:
        title = row.get("title") or ""
    live = await _snapshot(actor)
    child = new_id()
    now = actor.now()
    settings = {**actor.settings_snapshot(row), "title": title}
    info = {"type": "session_info", **settings, "updatedAt": ms_to_rfc3339(now)}
    plan = plan_fork(sid, child, live.messages, live.compactions, live.tombstones, info,
                     through_message_id=req.params.get("throughMessageId"), now_ms=now)
    child_path = data_dir.transcript(child)
    child_scratch = data_dir.scratch(child)
    pasted_src = data_dir.scratch(sid) / "pasted"
    project_id = row.get("projectId")
    committed = False
    try:
        names = await actor.io(resolve_pasted, pasted_src, plan.pasted_refs)
        await actor.io(lambda: copy_pasted(pasted_src, child_scratch / "pasted", names, faults=faults))
        written = await actor.io(lambda: write_child_transcript(child_path, child, now, plan.plan, faults=faults))
        await actor.io(faults.point, "fork.before_index")

        def op(conn: Any) -> Any:
            index.insert_session(conn, child, now_ms=now, created_at_ms=now, title=title,
                                 settings={k: v for k, v in settings.items() if v is not None},
                                 file_epoch=written.epoch)
            # the exact project_id (not a lookup by path, which would touch the project row)
            conn.execute("UPDATE sessions SET project_id = ? WHERE id = ?", (project_id, child))
            reindex(conn, child, written, now_ms=now)
            faults.point("fork.index_before_commit")
            result = index.public_session(index.require_session(conn, child))
            actor.store_receipt(conn, req.receipt, result, sid, now)
            return result

        result = await actor.db(op, durable=True)
        committed = True
    except BaseException:
        if not committed:
            with trio.CancelScope(shield=True):
                await _undo_fork(actor, child, child_path, child_scratch)
        raise
    actor.deps.bus.publish("session.created", {"session": result}, session_id=child)
    return result


async def _undo_fork(actor: SessionActor, child: str, path: Any, scratch: Any) -> None:
    """Remove what a failed fork left. Rows: the DB op rolled back, unless its outcome is unknown."""
    await actor.io(remove_child_files, path, scratch)
    try:
        await actor.db(lambda conn: index.delete_session_rows(conn, child), durable=True)
    except Exception:  # noqa: BLE001 - best effort; the original error is the one to report
        pass


# ---------------------------------------------------------------------- derived views


async def context(actor: SessionActor, req: Custom) -> Any:
    await actor.ensure_ready()
    live = await _snapshot(actor)
    built = build_session_context(live.messages, live.compactions, deleted_ids(live.tombstones))
    checkpoint = built["compaction"]
    return {
        "messages": built["messages"],
        "compaction": wire_record(checkpoint) if checkpoint is not None else None,
    }


async def tree(actor: SessionActor, req: Custom) -> Any:
    await actor.ensure_ready()
    live = await _snapshot(actor)
    rf = await actor.io(read_revisions, actor.deps.data_dir.revisions(actor.sid))
    branches = [StoredBranch(e.root_user_id, e.revision_index, e.messages, e.live)
                for _, e in sorted(rf.entries.items())]
    return build_tree(live.messages, deleted_ids(live.tombstones), branches)


HANDLERS: Mapping[str, Any] = {
    "history.delete": delete_message,
    "history.restore": restore_message,
    "history.fork": fork,
    "history.context": context,
    "history.tree": tree,
}
"""``Custom.kind`` → handler, registered in ``runtime/features.py``."""

__all__ = ["HANDLERS", "context", "delete_message", "fork", "restore_message", "tree"]
