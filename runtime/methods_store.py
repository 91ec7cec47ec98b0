"""Method handlers: secrets, attachments, scheduled tasks, plan/goal approvals, projects.

* ``secrets.*`` and ``attachments.*`` change files and rows: file step first
  (in a worker thread), then one DB transaction with the command receipt. A
  retry with a stored receipt returns before the file step. Writers of each
  store are serialized by a lock owned by this registration (no module state).
* ``tasks.*`` are DB-only: effect + receipt in one durable transaction; a
  change (create/update/delete/startRun) wakes the scheduler actor.
* ``plans.submit`` / ``plans.respond`` are session-routed (they read and change
  the session's mode): the artifact file / ``session_info`` line is written by
  the session actor before the approval transaction. After the commit they
  publish ``plan.requested`` (the pending row) and ``plan.resolved``
  (approved/rejected/expired); rows the boot fence interrupts are not
  announced - ``plans.pending`` is the rehydration path.
* ``projects.remove`` deletes each owned session through its session actor
  (exactly ``session.delete``), then the project row in a last transaction.

``secrets.get`` returns a value only to ``agent`` and ``ui`` clients (the
sidecar needs provider keys, the Settings UI shows them); ``cli``/``test``
clients get ``PERMISSION_DENIED``. Receipts of ``secrets.set`` fingerprint the
value with a keyed MAC (machine key), so no receipt row can leak or confirm a
guessed value.

Registered through ``runtime/features.py``.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from actors.gateway_types import CallContext
from actors.session import SessionActor
from actors.session_msgs import Custom, DeleteSession, ReceiptKey
from runtime.api import HostApi
from store import attachments, index, plans, projects, tasks
from store import secrets as secret_store
from store.errors import (
    Conflict,
    CorruptData,
    InvalidInput,
    PayloadTooLarge,
    PermissionDenied,
    SessionNotFound,
    StoreError,
)
from store.faults import Faults
from store.ids import new_id

Handler = Callable[[dict[str, Any], Mapping[str, Any], CallContext, Any], Awaitable[Any]]

SECRET_READERS = frozenset({"agent", "ui"})


# ---------------------------------------------------------------------------
# session-actor handlers (plans)


def store_handlers() -> dict[str, Any]:
    """``Custom.kind`` → session-actor handler."""
    return {"plans.submit": submit_plan, "plans.respond": respond_plan}


async def submit_plan(actor: SessionActor, req: Custom) -> Any:
    replay = await actor.check_receipt(req.receipt)
    if replay is not None:
        return replay
    row = await actor.ensure_ready()
    p = req.params
    kind = str(p["kind"])
    root = row.get("projectPath")
    if not root:
        raise InvalidInput(f"session {actor.sid} has no project: a {kind} artifact needs the session's workspace",
                           data={"field": "workspaceRoot"})
    if index.normalize_project_path(str(p["workspaceRoot"])) != root:
        raise Conflict(f"workspaceRoot is not session {actor.sid}'s project ({root})",
                       data={"field": "workspaceRoot", "projectPath": root})
    if row.get("mode") != kind:
        raise Conflict(f"session {actor.sid} is in {row.get('mode')} mode; a {kind} is submitted in {kind} mode",
                       data={"sessionId": actor.sid, "mode": row.get("mode")})
    now = actor.now()
    existing = await actor.read(plans.pending_of, actor.sid)
    if existing is not None and (existing.get("expiresAt") is None or existing["expiresAt"] > now):
        raise Conflict(f"session {actor.sid} already has a pending {existing['kind']} approval",
                       data={"sessionId": actor.sid, "requestId": existing["requestId"]})
    markdown = str(p["markdown"])
    artifact = await actor.io(lambda: plans.write_artifact(root, kind, markdown.encode("utf-8"),
                                                           faults=actor.deps.faults, now_ms=now))
    request_id = new_id("plan_")

    def op(conn: Any) -> Any:
        result = plans.insert_pending(
            conn, request_id=request_id, session_id=actor.sid, turn_id=str(p["turnId"]),
            tool_call_id=str(p["toolCallId"]), kind=kind, markdown=markdown, title=str(p.get("title", "")),
            question=str(p.get("question", "")), artifact=artifact, expires_at=p.get("expiresAt"), now_ms=now)
        SessionActor.store_receipt(conn, req.receipt, result, actor.sid, now)
        return result

    try:
        result = await actor.db(op, durable=True)
    except StoreError:
        await actor.io(plans.remove_artifact, root, artifact.relative_path)
        raise
    if existing is not None:  # it was past its deadline: insert_pending expired it in the same transaction
        _publish_resolved(actor, existing["requestId"], "expired")
    actor.publish("plan.requested", {"approval": result})
    return result


async def respond_plan(actor: SessionActor, req: Custom) -> Any:
    replay = await actor.check_receipt(req.receipt)
    if replay is not None:
        return replay
    row = await actor.ensure_ready()
    p = req.params
    request_id = str(p["requestId"])
    now = actor.now()
    current = await actor.read(plans.get_request, request_id)
    if current["sessionId"] != actor.sid:
        raise Conflict(f"approval request {request_id} belongs to another session", data={"requestId": request_id})
    if current["status"] == "pending" and current.get("expiresAt") is not None and current["expiresAt"] <= now:
        await actor.db(lambda conn: plans.expire_stale(conn, actor.sid, now), durable=True)
        current = await actor.read(plans.get_request, request_id)
        if current["status"] == "expired":
            _publish_resolved(actor, request_id, "expired")
    if current["status"] != "pending":
        raise Conflict(f"approval request {request_id} is {current['status']}, not pending: a stale response "
                       "is refused", data={"requestId": request_id, "status": current["status"]})
    if p["action"] == "reject":
        def reject_op(conn: Any) -> Any:
            approval = plans.reject(conn, request_id, now_ms=now)
            result = {"approval": approval, "session": index.public_session(index.require_session(conn, actor.sid))}
            SessionActor.store_receipt(conn, req.receipt, result, actor.sid, now)
            return result

        rejected = await actor.db(reject_op, durable=True)
        _publish_resolved(actor, request_id, rejected["approval"]["status"])
        return rejected
    root = row.get("projectPath")
    if not root:
        raise CorruptData(f"session {actor.sid} lost its project; the artifact cannot be verified",
                          data={"requestId": request_id})
    await actor.io(plans.verify_artifact, root, current.get("artifactPath"), current.get("artifactSha256"),
                   current.get("artifactSize"))
    target = p.get("targetPermissionMode")
    before = actor.settings_snapshot(row)
    after = {**before, "mode": "agent", **({"permissionMode": target} if target else {})}
    _, new_len = await actor.write_lines([actor.session_info_line(after)])
    epoch = actor.epoch
    execution_id = new_id("exec_")

    def approve_op(conn: Any) -> Any:
        approval = plans.approve(conn, request_id, target_permission_mode=target, execution_id=execution_id,
                                 now_ms=now)
        index.set_index_mark(conn, actor.sid, new_len, epoch)
        result = {"approval": approval, "session": index.public_session(index.require_session(conn, actor.sid))}
        SessionActor.store_receipt(conn, req.receipt, result, actor.sid, now)
        return result

    try:
        result = await actor.db(approve_op, durable=True)
    except Exception:
        await _undo_mode_line(actor, request_id, before)
        raise
    await actor.refresh_row()
    actor.publish("session.updated", {"session": result["session"]})
    _publish_resolved(actor, request_id, result["approval"]["status"])
    return result


def _publish_resolved(actor: SessionActor, request_id: str, status: str) -> None:
    """``plan.resolved`` after the commit. Boot interruptions are not announced: ``plans.pending`` rehydrates."""
    actor.publish("plan.resolved", {"requestId": request_id, "sessionId": actor.sid, "status": status})


async def _undo_mode_line(actor: SessionActor, request_id: str, before: Mapping[str, Any]) -> None:
    """The approval did not commit: put the previous settings back as the newest session_info line.

    If it did commit (only the reply was lost), nothing is undone.
    """
    actor.needs_catchup = True
    try:
        state = await actor.read(plans.get_request, request_id)
        if state["status"] != "approved":
            await actor.write_lines([actor.session_info_line(dict(before))])
    except StoreError:
        pass  # the catch-up on the next request re-derives the row from the transcript


# ---------------------------------------------------------------------------
# method handlers


def store_methods(*, registry: Any, reads: Any, db: Any, now_ms: Callable[[], int], data_dir: Any,
                  faults: Faults | None = None, scheduler: Callable[[], None] | None = None,
                  **_: Any) -> dict[str, Handler]:
    """JSON-RPC method name → handler. ``scheduler()`` wakes the scheduler after a task change."""
    faults = faults if faults is not None else Faults.parse(os.environ.get("RT_CRASHPOINT"))
    vault = secret_store.SecretStore(data_dir.secrets_dir, faults=faults)
    blobs = attachments.AttachmentFiles(data_dir.attachments_dir, faults=faults)
    vault_lock, blob_lock = trio.Lock(), trio.Lock()
    vault_thread, blob_thread = trio.CapacityLimiter(1), trio.CapacityLimiter(1)

    async def in_vault(fn: Callable[..., Any], *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args, limiter=vault_thread)

    async def in_blobs(fn: Callable[..., Any], *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args, limiter=blob_thread)

    async def replay(receipt: ReceiptKey | None) -> Any | None:
        if receipt is None:
            return None
        found = await reads.run(index.check_receipt, receipt.client_id, receipt.submission_id, receipt.method,
                                receipt.fingerprint)
        return None if found is None else found["response"]

    def with_receipt(receipt: ReceiptKey | None, now: int, fn: Callable[[Any], Any],
                     session_id: str | None = None) -> Callable[[Any], Any]:
        """``fn(conn)`` + the receipt in the same transaction (a raced retry returns the stored response)."""
        def op(conn: Any) -> Any:
            if receipt is not None:
                found = index.check_receipt(conn, receipt.client_id, receipt.submission_id, receipt.method,
                                            receipt.fingerprint)
                if found is not None:
                    return found["response"]
            result = fn(conn)
            if receipt is not None:
                index.store_receipt_if_absent(
                    conn, client_id=receipt.client_id, submission_id=receipt.submission_id, method=receipt.method,
                    fingerprint=receipt.fingerprint, response=result, session_id=session_id, now_ms=now)
            return result

        return op

    def db_only(method: str, fn: Callable[[Any, dict[str, Any], Mapping[str, Any], int], Any]) -> Handler:
        async def handler(p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
            receipt = HostApi.receipt(method, p, raw, ctx)
            now = now_ms()
            return await db.write(with_receipt(receipt, now, lambda conn: fn(conn, p, raw, now)), durable=True)

        return handler

    def task_write(method: str, fn: Callable[[Any, dict[str, Any], Mapping[str, Any], int], Any]) -> Handler:
        """``db_only`` + wake the scheduler (also after a failure: the effect may have committed)."""
        inner = db_only(method, fn)

        async def handler(p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext, m: Any) -> Any:
            try:
                return await inner(p, raw, ctx, m)
            finally:
                if scheduler is not None:
                    scheduler()

        return handler

    def read_only(fn: Callable[[Any, dict[str, Any]], Any]) -> Handler:
        async def handler(p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
            return await reads.run(fn, p)

        return handler

    # -- secrets -----------------------------------------------------------
    async def secrets_set(p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        ref, value = str(p["ref"]), str(p["value"])
        secret_store.validate_ref(ref)
        receipt = None
        if p.get("submissionId") is not None:
            mac = await in_vault(vault.value_mac, value)
            shown = {k: v for k, v in raw.items() if k != "value"}
            receipt = ReceiptKey(ctx.client_id, str(p["submissionId"]), "secrets.set",
                                 index.fingerprint("secrets.set", {**shown, "valueMac": mac}))
        if (found := await replay(receipt)) is not None:
            return found
        async with vault_lock:
            now = now_ms()
            version = await in_vault(lambda: vault.set(ref, value, now_ms=now))

            def effect(conn: Any) -> Any:
                secret_store.upsert_meta(conn, ref, owner_kind=p.get("ownerKind"), owner_id=p.get("ownerId"),
                                         kind=p.get("kind"), now_ms=now)
                return {"ref": ref, "updatedAt": now, "version": version}

            return await db.write(with_receipt(receipt, now, effect), durable=True)

    async def secrets_get(p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        if ctx.client_kind not in SECRET_READERS:
            raise PermissionDenied(f"client kind {ctx.client_kind!r} may not read secret values "
                                   f"(only {', '.join(sorted(SECRET_READERS))})")
        stored = await in_vault(vault.get, str(p["ref"]))
        return {"ref": stored.ref, "value": stored.value}

    async def secrets_delete(p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        receipt = HostApi.receipt("secrets.delete", p, raw, ctx)
        if (found := await replay(receipt)) is not None:
            return found
        ref = secret_store.validate_ref(p["ref"])
        async with vault_lock:
            now = now_ms()
            removed = await in_vault(lambda: vault.delete(ref, now_ms=now))  # file first: the value is gone
            return await db.write(with_receipt(receipt, now, lambda conn: {
                "ref": ref, "deleted": secret_store.delete_meta(conn, ref) or removed}), durable=True)

    # -- attachments -------------------------------------------------------
    def blob_result(sha: str, size: int, name: Any, mime: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"ref": attachments.ref_for(sha), "sha256": sha, "size": size}
        if name is not None:
            out["name"] = name
        if mime is not None:
            out["mimeType"] = mime
        return out

    async def store_blob(method: str, p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext,
                         write: Callable[[], tuple[str, int]]) -> Any:
        receipt = HostApi.receipt(method, p, raw, ctx)
        if (found := await replay(receipt)) is not None:
            return found
        async with blob_lock:
            sha, size = await in_blobs(write)
            now = now_ms()
            mime = p.get("mimeType")

            def effect(conn: Any) -> Any:
                attachments.record_blob(conn, sha, size, mime, now)
                return blob_result(sha, size, p.get("name"), mime)

            return await db.write(with_receipt(receipt, now, effect), durable=True)

    async def attachments_put(p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        try:
            data = base64.b64decode(str(p["dataBase64"]), validate=True)
        except (binascii.Error, ValueError):
            raise InvalidInput("dataBase64 is not valid base64", data={"field": "dataBase64"}) from None
        if len(data) > attachments.MAX_PUT_BYTES:
            raise PayloadTooLarge(f"attachment is larger than {attachments.MAX_PUT_BYTES} bytes; use "
                                  "attachments.importFile", data={"field": "dataBase64"})
        return await store_blob("attachments.put", p, raw, ctx, lambda: blobs.put_bytes(data))

    async def attachments_import(p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        budget = await reads.run(attachments.budget_bytes)
        return await store_blob("attachments.importFile", p, raw, ctx,
                                lambda: blobs.import_file(str(p["path"]), max_bytes=budget))

    async def attachments_ref(p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        receipt = HostApi.receipt("attachments.ref", p, raw, ctx)
        sha, sid, mid = str(p["sha256"]), str(p["sessionId"]), p.get("messageId")
        async with blob_lock:
            now = now_ms()

            def effect(conn: Any) -> Any:
                created = attachments.record_ref(conn, sha, sid, mid, now)
                out = {"sha256": sha, "sessionId": sid, "created": created}
                if mid is not None:
                    out["messageId"] = mid
                return out

            return await db.write(with_receipt(receipt, now, effect, session_id=sid), durable=True)

    async def attachments_gc(p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        receipt = HostApi.receipt("attachments.gc", p, raw, ctx)
        if (found := await replay(receipt)) is not None:
            return found
        now = now_ms()

        def write(fn: Callable[[Any], Any]) -> Any:
            return trio.from_thread.run(lambda: db.write(fn, durable=True))

        def finalize(conn: Any, result: dict[str, Any]) -> Any:  # a raced retry's stored response, or ``out``
            out = {"evicted": result["evicted"], "freedBytes": result["freedBytes"],
                   "orphansRemoved": result["orphansRemoved"], "estimate": attachments.estimate(conn).to_wire()}
            return with_receipt(receipt, now, lambda _c: out)(conn)

        async with blob_lock:
            return await in_blobs(lambda: attachments.collect(
                blobs, write, budget=None, active_session_id=p.get("activeSessionId"), finalize=finalize))

    # -- tasks ---------------------------------------------------------------
    def task_create(conn: Any, p: dict[str, Any], raw: Mapping[str, Any], now: int) -> Any:
        config = dict(raw.get("config") or {})
        if p.get("mode") is not None:
            config["mode"] = p["mode"]
        return tasks.create_task(conn, task_id=p.get("taskId") or new_id("task_"), title=p["title"],
                                 prompt=p["prompt"], cadence=p.get("cadence", "manual"),
                                 enabled=p.get("enabled", True), project_id=p.get("projectId"), config=config,
                                 now_ms=now)

    def task_update(conn: Any, p: dict[str, Any], raw: Mapping[str, Any], now: int) -> Any:
        fields = ("title", "prompt", "cadence", "enabled", "projectId", "mode")
        patch: dict[str, Any] = {k: p[k] for k in fields if k in p}
        if raw.get("config") is not None:
            patch["config"] = dict(raw["config"])
        return tasks.update_task(conn, p["taskId"], patch, now_ms=now)

    def task_start(conn: Any, p: dict[str, Any], raw: Mapping[str, Any], now: int) -> Any:
        return tasks.start_run(conn, task_id=p["taskId"], run_id=p.get("runId") or new_id("run_"),
                               session_id=p.get("sessionId"), now_ms=now)

    def task_finish(conn: Any, p: dict[str, Any], raw: Mapping[str, Any], now: int) -> Any:
        return tasks.finish_run(conn, run_id=p["runId"], status=p["status"], error_code=p.get("errorCode"),
                                session_id=p.get("sessionId"), now_ms=now)

    # -- plans ---------------------------------------------------------------
    async def plans_submit(p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        receipt = HostApi.receipt("plans.submit", p, raw, ctx)
        return await registry.ask(p["sessionId"], Custom("plans.submit", p, receipt=receipt))

    async def plans_respond(p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        receipt = HostApi.receipt("plans.respond", p, raw, ctx)
        if (found := await replay(receipt)) is not None:
            return found
        request = await reads.run(plans.get_request, str(p["requestId"]))
        return await registry.ask(request["sessionId"], Custom("plans.respond", p, receipt=receipt))

    # -- projects ------------------------------------------------------------
    async def projects_remove(p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        receipt = HostApi.receipt("projects.remove", p, raw, ctx)
        if (found := await replay(receipt)) is not None:
            return found
        project_id = int(p["projectId"])
        await reads.run(projects.get_project, project_id)
        deleted: list[str] = []
        for _attempt in range(3):  # a session created meanwhile is deleted on the next pass
            for sid in await reads.run(projects.session_ids, project_id):
                try:
                    await registry.ask(sid, DeleteSession())
                    deleted.append(sid)
                except SessionNotFound:
                    pass
            now = now_ms()

            def effect(conn: Any) -> Any:
                project = projects.remove_project_row(conn, project_id)
                return {"projectId": project_id, "path": project["path"], "deletedSessions": sorted(deleted)}

            try:
                return await db.write(with_receipt(receipt, now, effect), durable=True)
            except Conflict as exc:
                if "sessions" not in exc.data:
                    raise
        raise Conflict(f"project {project_id} keeps gaining sessions; try again", data={"projectId": project_id})

    def task_read(fn: Callable[..., Any]) -> Handler:
        return read_only(lambda conn, p: fn(conn, p))

    return {
        "secrets.set": secrets_set,
        "secrets.get": secrets_get,
        "secrets.delete": secrets_delete,
        "secrets.list": read_only(lambda conn, p: {"secrets": secret_store.list_meta(
            conn, owner_kind=p.get("ownerKind"), owner_id=p.get("ownerId"))}),
        "attachments.put": attachments_put,
        "attachments.importFile": attachments_import,
        "attachments.ref": attachments_ref,
        "attachments.estimate": read_only(lambda conn, p: attachments.estimate(conn).to_wire()),
        "attachments.gc": attachments_gc,
        "tasks.create": task_write("tasks.create", task_create),
        "tasks.update": task_write("tasks.update", task_update),
        "tasks.delete": task_write("tasks.delete", lambda conn, p, raw, now: {
            "taskId": p["taskId"], "deleted": tasks.delete_task(conn, p["taskId"])}),
        "tasks.list": task_read(lambda conn, p: {"tasks": tasks.list_tasks(conn)}),
        "tasks.get": task_read(lambda conn, p: tasks.get_task(conn, p["taskId"])),
        "tasks.runs": task_read(lambda conn, p: {"runs": tasks.list_runs(conn, p["taskId"],
                                                                          limit=int(p.get("limit", 100)))}),
        "tasks.startRun": task_write("tasks.startRun", task_start),
        "tasks.finishRun": db_only("tasks.finishRun", task_finish),
        "plans.submit": plans_submit,
        "plans.pending": read_only(lambda conn, p: {"pending": plans.list_pending(conn, p.get("sessionId"))}),
        "plans.respond": plans_respond,
        "projects.list": read_only(lambda conn, p: {"projects": projects.list_projects(conn)}),
        "projects.remove": projects_remove,
    }


__all__ = ["store_handlers", "store_methods", "submit_plan", "respond_plan"]
