"""``approvals.*`` and ``interactions.*``: what a running turn asks the user (seed 000 §2).

Requests and answers are session-routed: the session actor serializes them,
so an answer resolves its request exactly once (a second one finds it settled:
``CONFLICT``). The sidecar asks; a UI answers (never a client of kind
``agent``: ``PERMISSION_DENIED``); both get ``approval.*`` / ``interaction.*``
events of the session.

A decision — a UI's answer, or a permission rule's — is first written to the
transcript as an ``approval_decision`` line (one write + fdatasync, carrying
the answer's receipt), then the row changes in one transaction with the stored
rule and the receipt row. If the host dies in between, boot applies the line
to the still-pending row before the fence (``store.approvals.apply_recorded_decisions``).
A request reaches its deadline: the expiry timer (``runtime/request_expiry.py``) marks it
``expired`` and announces it (``<kind>.resolved``), with :func:`expire_lapsed`; a late answer
(the timer behind) applies the same transition before it is refused. Whichever comes first
changes the row, and only it announces. A turn's end cancels its pending requests
(``session.endTurn``, ``session.recoverInflight``); a restart interrupts them (``store/fence.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from actors.session_context import CarriedAnswer, Lines, SessionContext
from protocol import models as m
from runtime.context import ReadContext, WriterContext
from store import approvals, audit, turns
from store.approvals import Kind
from store.errors import Conflict
from store.ids import new_id
from store.indexing import index
from store.jsonio import dumps_line
from store.receipts import ReceiptKey

__all__ = [
    "DEADLINES",
    "expire_lapsed",
    "note_deadline",
    "pending_approvals",
    "pending_interactions",
    "publish_cancelled",
    "remove_rule",
    "request_approval",
    "request_interaction",
    "resolved_topic",
    "respond_approval",
    "respond_interaction",
    "rules",
]

T = TypeVar("T")

_TOPIC: Mapping[str, str] = {"approval": "approval", "interaction": "interaction"}

DEADLINES = "requests.deadlines"
"""``Services.extra`` key: ``(expires_at_ms) -> None``, told of each new pending deadline after its commit
(``runtime/request_expiry.py``: an earlier one moves the timer's wake-up). Never raises."""


def note_deadline(ctx: SessionContext, expires_at: int | None) -> None:
    """A pending request with a deadline committed: the expiry timer may have to wake earlier."""
    services = ctx.services
    notify = services.extra.get(DEADLINES) if services is not None and expires_at is not None else None
    if notify is not None:
        notify(expires_at)


def expire_lapsed(conn: Any, kind: Kind, request_id: str, now_ms: int) -> dict[str, Any] | None:
    """The one expiry transition (a late answer, the expiry timer): a request still pending at ``now_ms``
    past its deadline becomes ``expired``. The ``<kind>.resolved`` payload when this call changed it;
    None when it was not due or something settled it first (nothing to announce)."""
    if not approvals.expire_stale(conn, kind, request_id, now_ms):
        return None
    return {"request": approvals.settled_request(conn, kind, request_id)}


def resolved_topic(kind: Kind) -> str:
    return f"{_TOPIC[kind]}.resolved"


async def _running_turn(ctx: SessionContext, turn_id: str) -> None:
    status = await ctx.read(turns.turn_status, turn_id)
    if status is None or status[2] != ctx.sid:
        raise turns.turn_not_found(ctx.sid, turn_id)
    if status[0] != "running":
        raise Conflict(f"turn {turn_id} is {status[0]}: only a running turn can ask the user",
                       data={"turnId": turn_id, "status": status[0]})


def _publish_resolved(ctx: SessionContext, kind: Kind, result: Mapping[str, Any]) -> None:
    ctx.publish(resolved_topic(kind), dict(result))


def publish_cancelled(ctx: SessionContext, cancelled: list[dict[str, Any]]) -> None:
    """After a turn end committed: announce the requests it cancelled."""
    for row in cancelled:
        ctx.publish(f"{_TOPIC[row['kind']]}.resolved", {"request": row})


async def _decide(ctx: SessionContext, record: Mapping[str, Any] | None, op: Callable[[Any], T]) -> T:
    """The decision line (if any) durably before any row changes, then ``op`` with its index op and the
    receipt in one transaction (``ctx.append_lines``); no line: ``op`` and the receipt."""
    if record is None:
        return await ctx.commit(op)
    line = dumps_line(dict(record))
    done = await ctx.append_lines(Lines([line], records=[record]), then=lambda conn, refs: op(conn))
    value: T = done.value
    return value


# ---------------------------------------------------------------------------
# approvals


async def request_approval(ctx: SessionContext, p: m.ApprovalsRequestParams, key: ReceiptKey | None) -> Any:
    await _running_turn(ctx, p.turn_id)
    row = ctx.row
    sid, now, project_id = ctx.sid, ctx.now(), row.get("projectId")
    raw = [o.model_dump(by_alias=True) for o in p.options] if p.options is not None else None
    options = approvals.normalize_options(raw, has_project=project_id is not None)
    existing = (await ctx.read(approvals.find_by_tool_call, "approval", sid, p.tool_call_id)
                if p.tool_call_id is not None else None)
    rule = await ctx.read(approvals.matching_rule, sid, project_id, p.tool) if existing is None else None
    request_id = new_id("apr_")
    decision: Mapping[str, Any] | None = None
    if rule is not None:  # a rule answers at once: the decision line first, like a UI's answer
        status = "allowed" if rule["decision"] == "allow" else "denied"
        shape = {"requestId": request_id, "turnId": p.turn_id, "toolCallId": p.tool_call_id, "tool": p.tool}
        decision = approvals.decision_record(
            "approval", shape, status=status, decided_at_ms=now, by="rule", rule_id=rule["id"], receipt=key)
    caller = ctx.caller.client_id
    created: list[bool] = []

    def op(conn: Any) -> dict[str, Any]:
        found, was_created = approvals.insert_approval(
            conn, request_id=request_id, session_id=sid, turn_id=p.turn_id, tool_call_id=p.tool_call_id,
            tool=p.tool, args_summary=p.args_summary, risk=p.risk, options=options, requested_by=caller,
            expires_at=p.expires_at, now_ms=now, rule=rule if decision is not None else None)
        created.append(was_created)
        if was_created and found["status"] == "denied":  # seed 003 §4.13: in the denial's transaction
            audit.record_denied(conn, found, by="rule", rule_id=rule["id"] if rule else None, now_ms=now)
        out: dict[str, Any] = {"request": found}
        if found.get("ruleId") and found["status"] != "pending" and found.get("respondedBy") == "rule":
            ruled = approvals.get_rule(conn, found["ruleId"])
            if ruled is not None:
                out["rule"] = ruled
        return out

    result = await _decide(ctx, decision, op)
    if created[0]:
        if result["request"]["status"] == "pending":
            ctx.publish("approval.requested", {"request": result["request"]})
            note_deadline(ctx, result["request"].get("expiresAt"))
        else:
            _publish_resolved(ctx, "approval", result)
    return result


async def _refuse_late(ctx: SessionContext, kind: Kind, request_id: str) -> None:
    """A pending request past its deadline is marked ``expired`` before the answer is refused."""
    sid, now = ctx.sid, ctx.now()
    row = await ctx.read(approvals.get_request, kind, request_id, True)  # lenient: only its status counts here
    if row["sessionId"] == sid and row["status"] == "pending" and (row.get("expiresAt") or now + 1) <= now:
        expired = await ctx.db(lambda conn: expire_lapsed(conn, kind, request_id, now), durable=True)
        if expired is not None:  # None: the expiry timer (or another answer) settled it first and announced it
            _publish_resolved(ctx, kind, expired)
    await ctx.read(approvals.require_pending, kind, request_id, sid, now, True)  # raises the CONFLICT


async def _respond(ctx: SessionContext, kind: Kind, request_id: str, option_id: str | None,
                   answer_of: Any, key: ReceiptKey | None) -> Any:
    """Answer once: check pending (late → expired), the decision line, then the row + rule + receipt."""
    approvals.check_responder(ctx.caller.client_kind)
    sid, now, responder = ctx.sid, ctx.now(), ctx.caller.client_id
    # a deny needs nothing of the stored record but its id: an approval whose record is damaged (its options,
    # risk or status) can still be denied (approvals.outcome_of), so the turn waiting on it goes on; an allow of
    # it, and an answer to a damaged question, are CORRUPT_DATA
    lenient = kind == "approval"
    try:
        row = await ctx.read(approvals.require_pending, kind, request_id, sid, now, lenient)
    except Conflict:
        await _refuse_late(ctx, kind, request_id)
        raise
    answer = answer_of(row) if answer_of is not None else None
    status, option = approvals.outcome_of(kind, row, option_id, answer)
    remember = option["remember"] if option is not None else "once"
    rule_id = approvals.rule_id_for(request_id) if remember != "once" else None
    project_id = ctx.row.get("projectId")

    def op(conn: Any) -> dict[str, Any]:
        current = approvals.require_pending(conn, kind, request_id, sid, now, lenient)
        approvals.resolve(conn, kind, request_id, status=status, option_id=option_id, answer=answer,
                          responder=responder, now_ms=now)
        if kind == "approval" and status == "denied":  # seed 003 §4.13: in the denial's transaction
            audit.record_denied(conn, current, by="user", option_id=option_id, now_ms=now)
        if rule_id is not None:
            approvals.upsert_rule(conn, rule_id=rule_id, scope=remember, session_id=sid, project_id=project_id,
                                  tool=current["tool"], decision="allow" if status == "allowed" else "deny",
                                  source_request_id=request_id, now_ms=now)
            approvals.link_rule(conn, request_id, rule_id)
        return approvals.response_of(conn, kind, request_id, lenient)

    said = None
    if key is not None:
        # the decision line's receipt carries the answer (the request is a row only: after the database was
        # lost, a retry is answered with it): ``op`` run before the line, rolled back
        said = await ctx.db(lambda conn: index.dry_run(conn, op), durable=False)
    decision = approvals.decision_record(
        kind, row, status=status, decided_at_ms=now, by="user", responder=responder, option=option, answer=answer,
        rule_id=rule_id, receipt=key, response=said)
    carried = CarriedAnswer(said)
    result = await _decide(ctx, decision, lambda conn: carried.give(op(conn)))
    carried.check(ctx.method)
    _publish_resolved(ctx, kind, result)
    return result


async def respond_approval(ctx: SessionContext, p: m.ApprovalsRespondParams, key: ReceiptKey | None) -> Any:
    return await _respond(ctx, "approval", p.request_id, p.option_id, None, key)


def pending_approvals(ctx: ReadContext, p: m.ApprovalsPendingParams) -> Any:
    return approvals.list_pending(ctx.conn, "approval", p.session_id, ctx.now).result("pending")


def rules(ctx: ReadContext, p: m.ApprovalsRulesParams) -> Any:
    if p.session_id is None:
        return {"rules": approvals.list_rules(ctx.conn)}
    row = index.require_session(ctx.conn, p.session_id)
    return {"rules": approvals.list_rules(ctx.conn, session_id=p.session_id, project_id=row.get("projectId"))}


def remove_rule(ctx: WriterContext, p: m.ApprovalsRemoveRuleParams, key: ReceiptKey | None) -> Any:
    return {"removed": approvals.delete_rule(ctx.conn, p.rule_id)}


# ---------------------------------------------------------------------------
# interactions


async def request_interaction(ctx: SessionContext, p: m.InteractionsRequestParams, key: ReceiptKey | None) -> Any:
    await _running_turn(ctx, p.turn_id)
    sid, now, caller = ctx.sid, ctx.now(), ctx.caller.client_id
    request_id = new_id("ask_")
    choices = [c.model_dump(by_alias=True) for c in p.choices]
    created: list[bool] = []

    def op(conn: Any) -> dict[str, Any]:
        found, was_created = approvals.insert_interaction(
            conn, request_id=request_id, session_id=sid, turn_id=p.turn_id, tool_call_id=p.tool_call_id,
            question=p.question, choices=choices, multiple=p.multiple, allow_free_text=p.allow_free_text,
            requested_by=caller, expires_at=p.expires_at, now_ms=now)
        created.append(was_created)
        return {"request": found}

    result = await ctx.commit(op)
    if created[0]:
        ctx.publish("interaction.requested", {"request": result["request"]})
        note_deadline(ctx, result["request"].get("expiresAt"))
    return result


async def respond_interaction(ctx: SessionContext, p: m.InteractionsRespondParams, key: ReceiptKey | None) -> Any:
    given = p.answer.model_dump(by_alias=True, exclude_none=True)
    return await _respond(ctx, "interaction", p.request_id, None,
                          lambda row: approvals.validate_answer(row, given), key)


def pending_interactions(ctx: ReadContext, p: m.InteractionsPendingParams) -> Any:
    return approvals.list_pending(ctx.conn, "interaction", p.session_id, ctx.now).result("pending")
