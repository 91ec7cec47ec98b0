"""Plan/goal approvals (seed 003 §4.6a): immutable Markdown artifacts + ``plan_approvals`` rows.

Both are session-routed (they read and change the session's mode); a
response is routed to the session its request belongs to.

``plans.submit``: an *intent* sidecar naming the artifact about to be written
(``sessions/<id>.plan-intent.json``, fsynced) → the artifact (temp + link,
never replacing) → the pending row + receipt in one transaction → the intent
removed. A crash before the row commits leaves an intent without a row; boot
removes that artifact (``store.plans.sweep_intents``), so no plan file without
its row survives, and the retried submission runs once. A submission that fails
before its row is sent to the DB, or whose transaction is refused, removes its
artifact and intent itself. The markdown limit (UTF-8 bytes) and §4.11 (no
proposal while an unattended task run is running in the session:
``PLAN_REQUIRES_INTERACTIVE_SESSION``) are checked before anything is written.

After the commit they publish ``plan.requested`` (the pending row) and
``plan.resolved`` (approved/rejected/expired); rows the boot fence interrupts
are not announced — ``plans.pending`` is the rehydration path. A request reaches
its deadline: the expiry timer (``runtime/request_expiry.py``) expires it with
:func:`expire_lapsed` and announces it; a late response or the next submission
(the timer behind) applies the same transition, and only whoever changed the row
announces it.

Execution (§4.6a): an approval queues its execution; ``plans.startExecution``
binds it to the running turn that executes it (queued → running) and
``plans.finishExecution`` ends it (completed | failed | cancelled; a queued one
can only be cancelled). A turn that ends with its execution still running ends
it too (completed → completed, error → failed, aborted → cancelled). Each move
publishes ``plan.execution`` and ``session.updated`` (the projected state).
A mode change that would break a pending contract (``session.update``) is
refused: see :func:`check_mode_change`.

The artifact lives under the workspace it was written to: the session's project
at submission. A session moved to another project while its request is pending
(``session.update {projectPath}``) is still approved against that workspace,
which the host remembers per session in :data:`SUBMITTED_ROOTS` (see
:func:`submitted_root`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio

from actors.session_context import Lines, SessionContext
from protocol import models as m
from runtime.context import ReadContext, Services
from runtime.handlers.approvals import note_deadline
from store import approvals, plans, receipts, tasks
from store.errors import Conflict, CorruptData, InvalidInput, NotFound, StoreError
from store.fsutil import remove_file_durable
from store.ids import derived_id, new_id
from store.indexing import index
from store.receipts import ReceiptKey

__all__ = ["RESOLVED", "SUBMITTED_ROOTS", "check_mode_change", "expire_lapsed", "finish_execution", "pending",
           "publish_executions", "resolved_payload", "respond", "respond_target", "start_execution", "submit",
           "submitted_root"]

RESOLVED = "plan.resolved"

SUBMITTED_ROOTS = "plans.submitted_roots"
"""``Services.extra`` key: ``{session_id: (request_id, workspace_root)}``, the workspace each session's latest
committed submission wrote its artifact under. Memory is enough: a request is only ever verified by the
process that created it (boot interrupts every pending row; an approval that boot applies from its mode
line was verified before that line was written), and a session has one pending request at a time."""


UNDO_SECONDS = 10.0
"""How long a failed submission may spend removing its own files when it is being cancelled
(the actor stopping); past it, the boot sweep finishes the job from the intent."""


async def submit(ctx: SessionContext, p: m.PlansSubmitParams, key: ReceiptKey | None) -> Any:
    row = ctx.row
    kind = p.kind
    # The wire bound counts characters; the artifact bound is bytes: refused before anything is written.
    markdown = p.markdown.encode("utf-8")
    plans.check_markdown_size(markdown)
    root = row.get("projectPath")
    if not root:
        raise InvalidInput(f"session {ctx.sid} has no project: a {kind} artifact needs the session's workspace",
                           data={"field": "workspaceRoot"})
    if index.normalize_project_path(p.workspace_root) != root:
        raise Conflict(f"workspaceRoot is not session {ctx.sid}'s project ({root})",
                       data={"field": "workspaceRoot", "projectPath": root})
    if row.get("mode") != kind:
        raise Conflict(f"session {ctx.sid} is in {row.get('mode')} mode; a {kind} is submitted in {kind} mode",
                       data={"sessionId": ctx.sid, "mode": row.get("mode")})
    now, sid = ctx.now(), ctx.sid

    def gate(conn: Any) -> dict[str, Any] | None:
        # §4.11: the session may have been switched to this mode while a task run bound to it is
        # running; that run cannot show or approve a proposal. No race with tasks.startRun: it refuses a
        # session already in a contract mode, and the mode only changes through this session's actor.
        tasks.require_interactive(conn, sid, kind, work=f"submit a {kind}")
        return plans.pending_of(conn, sid, now)

    existing = await ctx.read(gate)
    if existing is not None:
        raise Conflict(f"session {ctx.sid} already has a pending {existing['kind']} approval",
                       data={"sessionId": ctx.sid, "requestId": existing["requestId"]})
    # keyed: the request id and the artifact's name token derive from the key, and an artifact an earlier try
    # published (its row and receipt lost with the database) is named again, not written a second time
    token = None if key is None else plans.keyed_token(key.client_id, key.submission_id)
    request_id = new_id("plan_") if key is None else derived_id(key.client_id, key.submission_id, prefix="plan_")

    def plan_artifact() -> tuple[plans.Artifact | None, plans.Artifact]:
        # up to 1 MiB hashed: the worker thread's work, not the trio loop's
        found = None if token is None else plans.find_keyed_artifact(root, kind, token, markdown)
        return found, found or plans.Artifact(plans.artifact_name(kind, now, token), plans.sha256_of(markdown),
                                              len(markdown))

    found, planned = await ctx.io(plan_artifact)
    intent, faults = ctx.paths.plan_intent, ctx.faults
    try:
        await ctx.io(lambda: plans.write_intent(intent, request_id=request_id, session_id=sid,
                                                workspace_root=root, artifact=planned, faults=faults))
        if found is not None:
            artifact = found
        else:
            artifact = await ctx.io(lambda: plans.write_artifact(root, kind, markdown, faults=faults, now_ms=now,
                                                                 relative_path=planned.relative_path))
        await ctx.io(faults.point, "plans.before_row")
    except BaseException:
        # Nothing was sent to the DB yet, so no row can ever name this artifact: undo it here rather
        # than leave the intent until a restart (the session's next submission would overwrite it and
        # orphan the artifact). Shielded and bounded: it also runs when the actor is being stopped.
        with trio.CancelScope(shield=True), trio.move_on_after(UNDO_SECONDS):
            await ctx.io(plans.abandon_submission, intent, root, planned)
        raise

    expired: list[dict[str, Any]] = []

    def op(conn: Any) -> Any:
        expired[:] = expire_lapsed(conn, sid, now)  # the timer is behind: expired in this transaction
        return plans.insert_pending(
            conn, request_id=request_id, session_id=sid, turn_id=p.turn_id, tool_call_id=p.tool_call_id,
            kind=kind, markdown=p.markdown, title=p.title, question=p.question, artifact=artifact,
            expires_at=p.expires_at, now_ms=now)

    try:
        result = await ctx.commit(op)
    except StoreError:
        # The transaction was refused: no row. Any other exception leaves the outcome unknown, so
        # the intent stays for the boot sweep, which keeps the artifact exactly when the row exists.
        await ctx.io(plans.abandon_submission, intent, root, artifact)
        raise
    _remember_root(ctx, result["requestId"], root)
    await ctx.io(remove_file_durable, intent)
    for stale in expired:
        ctx.publish(RESOLVED, stale)
    ctx.publish("plan.requested", {"approval": result})
    note_deadline(ctx, result.get("expiresAt"))
    return result


async def respond_target(services: Services, p: m.PlansRespondParams, key: ReceiptKey | None) -> str:
    """The session a response goes to: the one its request belongs to. A keyed retry whose request a lost
    database took goes to the session its receipt names (restored from the approval's mode line, which
    carries the answer): it is answered there."""
    try:
        request = await services.reads.run(plans.get_request, p.request_id)
    except NotFound:
        found = None if key is None else await services.reads.run(receipts.session_of, key.client_id,
                                                                  key.submission_id)
        if found is None:
            raise
        return found
    return str(request["sessionId"])


async def respond(ctx: SessionContext, p: m.PlansRespondParams, key: ReceiptKey | None) -> Any:
    approvals.check_responder(ctx.caller.client_kind)  # §11.19: only a person approves a plan or goal
    row = ctx.row
    request_id = p.request_id
    now = ctx.now()
    current = await ctx.read(plans.get_request, request_id)
    if current["sessionId"] != ctx.sid:
        raise Conflict(f"approval request {request_id} belongs to another session", data={"requestId": request_id})
    if current["status"] == "pending" and current.get("expiresAt") is not None and current["expiresAt"] <= now:
        sid = ctx.sid
        # announced only by whoever changed the row: the expiry timer may have settled it meanwhile
        for expired in await ctx.db(lambda conn: expire_lapsed(conn, sid, now), durable=True):
            ctx.publish(RESOLVED, expired)
        current = await ctx.read(plans.get_request, request_id)
    if current["status"] != "pending":
        raise Conflict(f"approval request {request_id} is {current['status']}, not pending: a stale response "
                       "is refused", data={"requestId": request_id, "status": current["status"]})
    sid = ctx.sid
    if p.action == "reject":
        def reject_op(conn: Any) -> Any:
            approval = plans.reject(conn, request_id, now_ms=now)
            return {"approval": approval, "session": index.public_session(index.require_session(conn, sid))}

        rejected = await ctx.commit(reject_op)
        _publish_resolved(ctx, request_id, rejected["approval"]["status"])
        return rejected
    # the workspace the artifact was written under, the session's current project for a request this
    # process did not submit (none is pending after a restart: only the stale-response refusal is left)
    root = submitted_root(ctx, request_id) or row.get("projectPath")
    if not root:
        raise CorruptData(f"session {ctx.sid} lost its project; the artifact cannot be verified",
                          data={"requestId": request_id})
    await ctx.io(plans.verify_artifact, root, current.get("artifactPath"), current.get("artifactSha256"),
                 current.get("artifactSize"))
    target = p.target_permission_mode
    before = ctx.settings()
    after = {**before, "mode": "agent", **({"permissionMode": target} if target else {})}
    execution_id = new_id("exec_")

    def approve_op(conn: Any, refs: Any) -> Any:
        approval = plans.approve(conn, request_id, target_permission_mode=target, execution_id=execution_id,
                                 now_ms=now)
        return {"approval": approval, "session": index.public_session(index.require_session(conn, sid))}

    try:
        # the line names the approval: killed before the row changes, boot applies it (store/plan_recovery.py);
        # keyed, its receipt carries the answer (a retry after the database was lost, the approval row gone
        # with it, is answered with it)
        result = await ctx.append_info({**after, **plans.approval_note(request_id, execution_id, target)},
                                       approve_op)
    except Exception:
        await _undo_mode_line(ctx, request_id, before)
        raise
    ctx.publish("session.updated", {"session": result["session"]})
    _publish_resolved(ctx, request_id, result["approval"]["status"])
    return result


def _submitted_roots(ctx: SessionContext) -> dict[str, tuple[str, str]] | None:
    services = ctx.services
    if services is None:
        return None
    roots: dict[str, tuple[str, str]] = services.extra.setdefault(SUBMITTED_ROOTS, {})
    return roots


def _remember_root(ctx: SessionContext, request_id: str, root: str) -> None:
    roots = _submitted_roots(ctx)
    if roots is not None:
        roots[ctx.sid] = (request_id, root)


def submitted_root(ctx: SessionContext, request_id: str) -> str | None:
    """The workspace ``request_id``'s artifact was written under, remembered at its submission (§4.6a: the
    row is an immutable checkpoint whose path is relative to the session's workspace at submission; the
    session may have moved to another project since). None: nothing remembered (no shared services)."""
    remembered = (_submitted_roots(ctx) or {}).get(ctx.sid)
    return remembered[1] if remembered is not None and remembered[0] == request_id else None


def pending(ctx: ReadContext, p: m.PlansPendingParams) -> Any:
    return plans.list_pending(ctx.conn, p.session_id, ctx.now).result("pending")


def resolved_payload(request_id: str, session_id: str, status: str) -> dict[str, Any]:
    return {"requestId": request_id, "sessionId": session_id, "status": status}


def expire_lapsed(conn: Any, session_id: str, now_ms: int) -> list[dict[str, Any]]:
    """The one expiry transition (a late response, a submission, the expiry timer): the session's request
    still pending at ``now_ms`` past its deadline becomes ``expired`` (the session stays in its contract
    mode). The ``plan.resolved`` payloads of the rows this call changed (none: something settled them first)."""
    stale = plans.stale_pending(conn, session_id, now_ms)
    plans.expire_stale(conn, session_id, now_ms)
    return [resolved_payload(request_id, session_id, "expired") for request_id in stale]


def _publish_resolved(ctx: SessionContext, request_id: str, status: str) -> None:
    """``plan.resolved`` after the commit. Boot interruptions are not announced: ``plans.pending`` rehydrates."""
    ctx.publish(RESOLVED, resolved_payload(request_id, ctx.sid, status))


async def _undo_mode_line(ctx: SessionContext, request_id: str, before: Mapping[str, Any]) -> None:
    """The approval did not commit: put the previous settings back as the newest session_info line.

    If it did commit (only the reply was lost), nothing is undone.
    """
    try:
        state = await ctx.read(plans.get_request, request_id)
        if state["status"] != "approved":
            undo = ctx.without_receipt()  # the call failed: its retry must run again, not replay this line
            await undo.append_lines(Lines([undo.session_info_line(dict(before))]), durable=False)
    except StoreError:
        pass  # the rebuild before the next request re-derives the row from the transcript


async def _execution(ctx: SessionContext, change: Any) -> Any:
    sid = ctx.sid

    def op(conn: Any) -> Any:
        approval = change(conn)
        return {"approval": approval, "session": index.public_session(index.require_session(conn, sid))}

    result = await ctx.commit(op)
    publish_executions(ctx, [result["approval"]], result["session"])
    return result


async def start_execution(ctx: SessionContext, p: m.PlansStartExecutionParams, key: ReceiptKey | None) -> Any:
    sid, now = ctx.sid, ctx.now()
    return await _execution(ctx, lambda conn: plans.start_execution(conn, sid, p.execution_id, p.turn_id, now))


async def finish_execution(ctx: SessionContext, p: m.PlansFinishExecutionParams, key: ReceiptKey | None) -> Any:
    sid, now = ctx.sid, ctx.now()
    return await _execution(ctx, lambda conn: plans.finish_execution(
        conn, sid, p.execution_id, turn_id=p.turn_id, outcome=p.outcome, error_code=p.error_code, now_ms=now))


def publish_executions(ctx: SessionContext, approvals: list[dict[str, Any]], session: dict[str, Any] | None) -> None:
    for approval in approvals:
        ctx.publish("plan.execution", {"approval": approval})
    if approvals and session is not None:
        ctx.publish("session.updated", {"session": session})


async def check_mode_change(ctx: SessionContext, mode: str | None) -> None:
    """``session.update`` may not break a pending contract: a pending plan/goal keeps its mode,
    an approved execution that is queued or running keeps the session in agent mode."""
    if mode is None or mode == ctx.row.get("mode"):
        return
    contract = await ctx.read(plans.active_contract, ctx.sid, ctx.now())
    if contract is None:
        return
    if contract["status"] == "pending":
        if mode != contract["kind"]:
            raise Conflict(
                f"session {ctx.sid} has a pending {contract['kind']} approval; its mode stays {contract['kind']} "
                "until the approval is answered or expires",
                data={"sessionId": ctx.sid, "requestId": contract["requestId"], "state": "awaiting_approval"})
    elif mode != "agent":
        state = contract["executionState"]
        damaged = state not in ("queued", "running")  # damaged: it may be running (plans.EXECUTION_MAY_RUN)
        raise Conflict(
            f"session {ctx.sid} is executing an approved {contract['kind']} "
            f"({f'its stored state {state!r} is damaged: it may be running' if damaged else state}); "
            "it stays in agent mode until the execution ends",
            data={"sessionId": ctx.sid, "executionId": contract.get("executionId"),
                  **({"damaged": True} if damaged else {"state": state})})
