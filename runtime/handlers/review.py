"""``review.*``: message-owned review-change snapshots (seed 003 §2.0, ADR 0043).

Every call runs inside the session actor, so a record, a restore, a read and ``session.delete``
(which removes ``review-changes/<sid>/``) of one session never interleave. The file format, the
bounds and the restore decision are ``store/review.py``'s; the path goes through the rule of
``session.resolvePath`` (``store/workspace.resolve_for_session``) and must stay inside the
session's own workspace root.

Receipts: the snapshot (``meta.json``) carries the recording call's receipt, and a restore writes
its intent with its receipt before it touches the workspace; the receipt row is committed after
the file effect, so a retry after a crash in between is answered from the file.
"""

from __future__ import annotations

import base64
from typing import Any

from actors.session_context import SessionContext
from protocol import models as m
from store import review
from store.errors import Conflict, InvalidInput, LimitExceeded, NotFound
from store.receipts import ReceiptKey
from store.rules import MAX_REVIEW_SNAPSHOTS
from store.workspace import resolve_for_session

__all__ = ["get", "list_snapshots", "record", "restore"]


async def _resolve(ctx: SessionContext, path: str) -> tuple[str, str]:
    """``(root, absolute path)`` of ``path`` under the session's workspace root, or INVALID_PARAMS."""
    found = await ctx.read(resolve_for_session, ctx.sid, path)
    root = found.get("root")
    if not root:
        raise Conflict(f"session {ctx.sid} has no workspace root", data={"sessionId": ctx.sid,
                                                                          "reason": "no_project_root"})
    if not found.get("insideRoot"):
        raise InvalidInput(f"{path} is outside the session's workspace {root}",
                           data={"field": "path", "reason": "outside_workspace"})
    return str(root), str(found["path"])


async def _answer(ctx: SessionContext, key: ReceiptKey | None, response: dict[str, Any]) -> dict[str, Any]:
    if key is None:
        return response
    return await ctx.commit(lambda conn: response)


async def _require(ctx: SessionContext, snapshot_id: str) -> dict[str, Any]:
    meta = await ctx.io(review.load_meta, ctx.paths.review_changes, snapshot_id)
    if meta is None:
        raise NotFound(f"review snapshot {snapshot_id} not found in session {ctx.sid}",
                       data={"sessionId": ctx.sid, "snapshotId": snapshot_id})
    return meta


async def record(ctx: SessionContext, p: m.ReviewRecordParams, key: ReceiptKey | None) -> Any:
    # up to 4 MiB of base64 and two SHA-256s of up to 4 MiB: this actor's worker thread's work, not the loop's
    before = await ctx.io(review.decode_before, p.before_base64)
    root, path = await _resolve(ctx, p.path)
    directory = ctx.paths.review_changes
    snapshot_id = review.snapshot_id_for(key)
    if key is not None:
        published = await ctx.io(review.load_meta, directory, snapshot_id)
        if published is not None:  # the first attempt published it and died before its receipt row
            return await _answer(ctx, key, review.check_record_retry(published, key))
    if await ctx.io(review.count_snapshots, directory) >= MAX_REVIEW_SNAPSHOTS:
        raise LimitExceeded(f"session {ctx.sid} already keeps {MAX_REVIEW_SNAPSHOTS} review snapshots",
                            data={"sessionId": ctx.sid, "limit": MAX_REVIEW_SNAPSHOTS})
    after = await ctx.io(review.read_workspace_file, root, path)
    now = ctx.now()
    meta = await ctx.io(lambda: review.new_meta(
        snapshot_id=snapshot_id, session_id=ctx.sid, path=path, tool_name=p.tool_name, tool_call_id=p.tool_call_id,
        message_id=p.message_id, turn_id=p.turn_id, before=before, after=after, now_ms=now, key=key))
    faults = ctx.faults
    await ctx.io(lambda: review.write_snapshot(directory, meta, before, faults=faults))
    return await _answer(ctx, key, review.record_answer(meta))


async def get(ctx: SessionContext, p: m.ReviewGetParams, key: ReceiptKey | None) -> Any:
    meta = await _require(ctx, p.snapshot_id)
    out: dict[str, Any] = {"snapshot": review.wire_snapshot(meta)}
    if p.include_before:
        directory = ctx.paths.review_changes

        def before_base64() -> str | None:  # up to 4 MiB read and encoded: the worker thread's, not the loop's
            data = review.read_before(directory, meta)
            return None if data is None else base64.b64encode(data).decode("ascii")

        encoded = await ctx.io(before_base64)
        if encoded is not None:
            out["beforeBase64"] = encoded
    return out


async def list_snapshots(ctx: SessionContext, p: m.ReviewListParams, key: ReceiptKey | None) -> Any:
    found = await ctx.io(review.list_snapshots, ctx.paths.review_changes)
    metas = found.items
    if p.message_id is not None:  # a damaged one is named whatever the filter: its messageId no longer reads
        metas = [meta for meta in metas if meta.get("messageId") == p.message_id]
    out: dict[str, Any] = {"snapshots": [review.wire_snapshot(meta) for meta in metas[: p.limit]],
                           "truncated": len(metas) > p.limit}
    if found.unreadable:
        out["unreadable"] = found.unreadable
    return out


async def restore(ctx: SessionContext, p: m.ReviewRestoreParams, key: ReceiptKey | None) -> Any:
    directory = ctx.paths.review_changes
    meta = await _require(ctx, p.snapshot_id)
    root, path = await _resolve(ctx, str(meta["path"]))
    if path != meta["path"]:
        raise Conflict(f"{meta['path']} no longer resolves to itself under the session's workspace",
                       data={"snapshotId": p.snapshot_id, "reason": "outside_workspace"})
    current = await ctx.io(review.file_state, root, path)
    plan = review.plan_restore(meta, current, key)
    if plan == "answered":
        return await _answer(ctx, key, review.restore_answer(meta))
    before = await ctx.io(review.read_before, directory, meta)
    faults, now = ctx.faults, ctx.now()
    if plan == "write":
        meta = await ctx.io(lambda: review.start_restore(directory, meta, key, now, faults=faults))
    done = await ctx.io(lambda: review.finish_restore(directory, meta, root, before, write=plan == "write",
                                                      faults=faults))
    return await _answer(ctx, key, review.restore_answer(done))
