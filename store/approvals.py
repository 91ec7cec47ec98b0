"""Pending user requests (seed 000 §2): tool-permission approvals, ask-the-user interactions.

A running turn's sidecar asks the user something; the request waits durably in
``approvals`` / ``interactions`` (schema v24) until a UI answers it, it
expires, its turn ends (``cancelled``), or a host restart interrupts it
(``interrupted``, by the boot fence). One state machine serves both kinds:

=============  ==========================================  =================
from           event                                       to
=============  ==========================================  =================
(new)          a permission rule covers the tool           allowed / denied
(new)          otherwise                                   pending
pending        a UI answers (once)                         allowed / denied /
                                                           answered
pending        ``expires_at`` passed (written at the       expired
               deadline by the expiry timer, or by a late
               answer or the next boot if it is behind;
               shown so by reads in the meantime)
pending        its turn ended                              cancelled
pending        host restart (boot fence)                   interrupted
anything else  an answer                                   ``CONFLICT``
=============  ==========================================  =================

A decision (a UI's answer, or a rule's) is recorded in the session's
transcript as an ``approval_decision`` line (docs/DESIGN.md "Transcript file
format"), written *before* the row changes and carrying the answer's command
receipt: if the host dies between the two, boot applies the recorded
decision to the still-pending row (:func:`apply_recorded_decisions`, before
the fence) and restores the receipt, so the answer the user gave is never
lost or applied twice.

Permission rules ("always allow this tool in this project") live in
``permission_rules``, one per (scope, session or project, tool); the most
specific covering rule answers a new request at once.

SQL functions run inside the caller's transaction; pure helpers validate.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal, TypeVar

import orjson

from store import audit, receipts
from store.errors import Conflict, DamagedRecord, InvalidInput, NotFound, PermissionDenied
from store.indexing.sql_lists import in_chunks
from store.jsonio import Readable, loads_stored, readable, stored_value
from store.receipts import ReceiptKey
from store.transcripts.records import ms_to_rfc3339, rfc3339_to_ms
from store.transcripts.transcript import lines_naming

__all__ = [
    "DECISION_LINE",
    "DENY",
    "RESPONDER_KINDS",
    "Kind",
    "apply_decision_lines",
    "apply_recorded_decisions",
    "cancel_for_turn",
    "decision_record",
    "decisions_for_turns",
    "default_options",
    "delete_rule",
    "expire_stale",
    "get_request",
    "insert_approval",
    "insert_interaction",
    "interrupt_pending",
    "lapsed",
    "list_pending",
    "list_rules",
    "matching_rule",
    "next_deadline",
    "normalize_options",
    "require_pending",
    "resolve",
    "response_of",
    "settled_request",
    "validate_answer",
]

Kind = Literal["approval", "interaction"]
_T = TypeVar("_T")
DECISION_LINE: Final = "approval_decision"
RISKS: Final = ("low", "medium", "high")
APPROVAL_STATUSES: Final = ("pending", "allowed", "denied", "expired", "interrupted", "cancelled")
INTERACTION_STATUSES: Final = ("pending", "answered", "expired", "interrupted", "cancelled")
REMEMBER: Final = ("once", "session", "project", "global")
MAX_OPTIONS: Final = 8
MAX_CHOICES: Final = 32
MAX_ANSWER_CHARS: Final = 20_000
RULE_SCOPES: Final = ("session", "project", "global")
RISK_STAND_IN: Final = "high"
"""The risk a lenient read shows for an approval whose stored risk is damaged (the most cautious; the request
names ``risk`` in its ``unreadable``)."""

_TABLE: Final[Mapping[str, str]] = {"approval": "approvals", "interaction": "interactions"}
KINDS: Final[tuple[Kind, ...]] = ("approval", "interaction")
_APPROVAL_COLS = ("request_id, session_id, turn_id, tool_call_id, tool, args_summary, risk, options_json, "
                  "requested_by, status, option_id, rule_id, responded_by, created_at, updated_at, expires_at, "
                  "resolved_at")
_INTERACTION_COLS = ("request_id, session_id, turn_id, tool_call_id, question, choices_json, multiple, "
                     "allow_free_text, requested_by, status, answer_json, responded_by, created_at, updated_at, "
                     "expires_at, resolved_at")
_RULE_COLS = "id, scope, session_id, project_id, tool, decision, source_request_id, created_at"
_DAMAGED_PENDING: Final[Mapping[str, str]] = {
    kind: "(resolved_at IS NULL AND status NOT IN ({}))".format(", ".join(f"'{status}'" for status in statuses))
    for kind, statuses in (("approval", APPROVAL_STATUSES), ("interaction", INTERACTION_STATUSES))}
"""SQL: a row whose status is damaged (outside its set; SQLite checks a CHECK on writes only) and that has no
resolution time, which every transition out of pending sets in the same statement: it was never settled. No
index holds it (the partial ones are ``status = 'pending'``): a query for it scans the table."""
_PENDING: Final[Mapping[str, str]] = {kind: f"(status = 'pending' OR {_DAMAGED_PENDING[kind]})" for kind in KINDS}
"""SQL: a row still pending: its status says so, or :data:`_DAMAGED_PENDING`. Such a row can be denied, cancelled
by its turn's end, expired (:func:`lapsed`) and interrupted like any pending one. ``approvals.pending`` lists
pending rows by their partial index, ``status = 'pending'``, and names such a row in ``unreadable`` (a second
arm of its query, :func:`list_pending`)."""


# ---------------------------------------------------------------------------
# options and answers (pure)


DENY: Final[Mapping[str, str]] = MappingProxyType(
    {"id": "deny", "label": "Deny", "decision": "deny", "remember": "once"})
"""The default deny option, also the answer to an approval whose stored options no longer read."""


def default_options(has_project: bool) -> list[dict[str, str]]:
    """Allow once / always in this project (when there is one) / in this session / deny."""
    options = [{"id": "allow_once", "label": "Allow once", "decision": "allow", "remember": "once"}]
    if has_project:
        options.append({"id": "allow_project", "label": "Always allow in this project", "decision": "allow",
                        "remember": "project"})
    options.append({"id": "allow_session", "label": "Always allow in this session", "decision": "allow",
                    "remember": "session"})
    options.append(dict(DENY))
    return options


def normalize_options(raw: Sequence[Mapping[str, Any]] | None, *, has_project: bool) -> list[dict[str, str]]:
    """The options a prompt offers: unique ids, an allow and a deny, no project rule without a project."""
    if not raw:
        return default_options(has_project)
    if len(raw) > MAX_OPTIONS:
        raise InvalidInput(f"at most {MAX_OPTIONS} options", data={"field": "options"})
    out: list[dict[str, str]] = []
    seen: set[str] = set()
    for i, opt in enumerate(raw):
        oid, decision = opt.get("id"), opt.get("decision")
        remember = opt.get("remember", "once")
        if not isinstance(oid, str) or not oid or oid in seen:
            raise InvalidInput(f"options[{i}].id must be a unique non-empty string", data={"field": f"options[{i}]"})
        if decision not in ("allow", "deny") or remember not in REMEMBER:
            raise InvalidInput(f"options[{i}] needs decision allow|deny and remember {'|'.join(REMEMBER)}",
                               data={"field": f"options[{i}]"})
        if remember == "project" and not has_project:
            raise InvalidInput(f"options[{i}] remembers for the project, but the session has none",
                               data={"field": f"options[{i}].remember"})
        seen.add(oid)
        label = opt.get("label")
        out.append({"id": oid, "label": label if isinstance(label, str) and label else oid,
                    "decision": str(decision), "remember": str(remember)})
    if not any(o["decision"] == "deny" for o in out):
        raise InvalidInput("the options must include a way to deny", data={"field": "options"})
    return out


def validate_answer(row: Mapping[str, Any], answer: Mapping[str, Any]) -> dict[str, Any]:
    """An interaction's answer: chosen choice ids and/or free text, as the question allows."""
    choices = {c["id"] for c in row.get("choices") or ()}
    chosen = answer.get("choiceIds") or []
    text = answer.get("text")
    if not isinstance(chosen, list) or not all(isinstance(c, str) for c in chosen):
        raise InvalidInput("answer.choiceIds must be a list of choice ids", data={"field": "answer.choiceIds"})
    unknown = [c for c in chosen if c not in choices]
    if unknown:
        raise InvalidInput(f"answer.choiceIds names unknown choice {unknown[0]!r}", data={"field": "answer.choiceIds"})
    if len(set(chosen)) != len(chosen) or (len(chosen) > 1 and not row.get("multiple")):
        raise InvalidInput("answer.choiceIds: pick one choice (each at most once)", data={"field": "answer.choiceIds"})
    if text is not None:
        if not row.get("allowFreeText"):
            raise InvalidInput("this question does not take free text", data={"field": "answer.text"})
        if not isinstance(text, str) or len(text) > MAX_ANSWER_CHARS:
            raise InvalidInput(f"answer.text must be at most {MAX_ANSWER_CHARS} characters",
                               data={"field": "answer.text"})
    if not chosen and not (isinstance(text, str) and text.strip()):
        raise InvalidInput("an answer needs a choice or text", data={"field": "answer"})
    out: dict[str, Any] = {"choiceIds": list(chosen)}
    if isinstance(text, str):
        out["text"] = text
    return out


# ---------------------------------------------------------------------------
# rows


def _offered(text: str | None, what: str) -> list[dict[str, Any]]:
    """A prompt's options or choices: a list of objects with a string ``id`` (the host wrote no other);
    anything else is damage of that record (``DamagedRecord``), never an offer read as empty."""
    if not text:
        return []
    items: list[dict[str, Any]] = []
    for item in loads_stored(text, what, list):
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            raise DamagedRecord(f"{what} holds an entry that is not an object with an id")
        items.append(item)
    return items


def _answer(text: str | None, what: str) -> dict[str, Any] | None:
    answer: dict[str, Any] | None = loads_stored(text, what, dict) if text else None
    return answer


def _lenient(read: Callable[[], _T], stand_in: Callable[[], _T], field: str, damaged: list[str] | None) -> _T:
    """``read()``; when its column is damaged and ``damaged`` is a list (a lenient read: :func:`get_request`),
    ``stand_in()`` instead, ``field`` noted in ``damaged`` (the record's ``unreadable``)."""
    try:
        return read()
    except DamagedRecord:
        if damaged is None:
            raise
        value = stand_in()
        damaged.append(field)
        return value


def _stored_times(what: str, *times: Any) -> None:
    """``DamagedRecord`` naming ``what`` when a stored time (created, updated, expires, resolved) is not the
    non-negative integer of milliseconds the host wrote (SQLite keeps any value a column is given): a listing
    names the record instead of failing whole on a result that no longer matches its model."""
    if any(t is not None and (type(t) is not int or t < 0) for t in times):
        raise DamagedRecord(f"{what}'s times are {times!r}, not milliseconds")


def _unsettled(rid: str, resolved: int | None) -> Callable[[], str]:
    """The stand-in of a damaged status: ``pending`` when the row has no resolution time (every transition out
    of pending sets ``resolved_at`` in the same statement, :data:`_PENDING`); a settled row's status cannot be
    told (``DamagedRecord``)."""
    def stand_in() -> str:
        if resolved is not None:
            raise DamagedRecord(f"request {rid}'s status is damaged and it was settled: how is not known")
        return "pending"
    return stand_in


def _approval(r: Sequence[Any], lenient: bool = False) -> dict[str, Any]:
    (rid, sid, turn, call, tool, summary, risk, options, by, status, option, rule, responder, created, updated,
     expires, resolved) = r
    damaged: list[str] | None = [] if lenient else None
    if not lenient:
        _stored_times(f"approval {rid}", created, updated, expires, resolved)
    offered = _lenient(lambda: _offered(options, f"approval {rid}'s options_json"), list, "options", damaged)
    shown_risk = _lenient(lambda: stored_value(risk, RISKS, f"approval {rid}'s risk"), lambda: RISK_STAND_IN,
                          "risk", damaged)
    shown_status = _lenient(lambda: stored_value(status, APPROVAL_STATUSES, f"approval {rid}'s status"),
                            _unsettled(rid, resolved), "status", damaged)
    out: dict[str, Any] = {
        "kind": "approval", "requestId": rid, "sessionId": sid, "turnId": turn, "toolCallId": call, "tool": tool,
        "argsSummary": summary, "risk": shown_risk, "options": offered, "requestedBy": by, "status": shown_status,
        "optionId": option, "ruleId": rule, "respondedBy": responder, "createdAt": created, "updatedAt": updated,
        "expiresAt": expires, "resolvedAt": resolved, "unreadable": damaged or None,
    }
    return {k: v for k, v in out.items() if v is not None}


def _interaction(r: Sequence[Any], lenient: bool = False) -> dict[str, Any]:
    (rid, sid, turn, call, question, choices, multiple, free, by, status, answer, responder, created, updated,
     expires, resolved) = r
    damaged: list[str] | None = [] if lenient else None
    if not lenient:
        _stored_times(f"interaction {rid}", created, updated, expires, resolved)
    offered = _lenient(lambda: _offered(choices, f"interaction {rid}'s choices_json"), list, "choices", damaged)
    answered = _lenient(lambda: _answer(answer, f"interaction {rid}'s answer_json"), lambda: None, "answer",
                        damaged)
    shown_status = _lenient(lambda: stored_value(status, INTERACTION_STATUSES, f"interaction {rid}'s status"),
                            _unsettled(rid, resolved), "status", damaged)
    out: dict[str, Any] = {
        "kind": "interaction", "requestId": rid, "sessionId": sid, "turnId": turn, "toolCallId": call,
        "question": question, "choices": offered, "multiple": bool(multiple), "allowFreeText": bool(free),
        "requestedBy": by, "status": shown_status, "answer": answered, "respondedBy": responder,
        "createdAt": created, "updatedAt": updated, "expiresAt": expires, "resolvedAt": resolved,
        "unreadable": damaged or None,
    }
    return {k: v for k, v in out.items() if v is not None}


def _select(kind: Kind) -> tuple[str, Callable[..., dict[str, Any]]]:
    if kind == "approval":
        return f"SELECT {_APPROVAL_COLS} FROM approvals", _approval
    return f"SELECT {_INTERACTION_COLS} FROM interactions", _interaction


def get_request(conn: sqlite3.Connection, kind: Kind, request_id: str, lenient: bool = False) -> dict[str, Any]:
    """The request; ``DamagedRecord`` (CORRUPT_DATA) when its record is damaged. ``lenient``: a column that no
    longer reads is shown by a stand-in instead (options or choices ``[]``, no answer, risk
    :data:`RISK_STAND_IN`, status ``pending`` for a row never settled: :data:`_PENDING`) and named in the
    request's ``unreadable``, for a transition that needs none of it (a deny, a cancel, an expiry) and its
    announcement; a damaged status of a settled row still raises."""
    sql, row = _select(kind)
    found = conn.execute(f"{sql} WHERE request_id = ?", (request_id,)).fetchone()
    if found is None:
        raise NotFound(f"{kind} request {request_id} not found", data={"requestId": request_id})
    return row(found, lenient)


def settled_request(conn: sqlite3.Connection, kind: Kind, request_id: str) -> dict[str, Any]:
    """A request a transition just settled (cancelled by its turn's end, expired), for its
    announcement: read ``lenient``, so a damaged record is announced like any other (the status it was just
    given reads; its damaged columns are stand-ins, named in ``unreadable``)."""
    return get_request(conn, kind, request_id, lenient=True)


def find_by_tool_call(conn: sqlite3.Connection, kind: Kind, session_id: str,
                      tool_call_id: str) -> dict[str, Any] | None:
    sql, row = _select(kind)
    found = conn.execute(f"{sql} WHERE session_id = ? AND tool_call_id = ?", (session_id, tool_call_id)).fetchone()
    return row(found) if found else None


def list_pending(conn: sqlite3.Connection, kind: Kind, session_id: str | None,
                 now_ms: int, lenient: bool = False) -> Readable[dict[str, Any]]:
    """Pending rows (newest first) that have not passed their deadline, with the original ``expiresAt``.
    A row whose record is damaged is named in ``unreadable`` (request ids), not listed: one damaged prompt
    never hides the others, and a row whose status is damaged but never settled (:data:`_DAMAGED_PENDING`:
    it still pends) is named too, never dropped without a word. That part of the query has no index: the
    session's rows through the session index, or, for every session's, a scan of the table. ``lenient`` (a
    recorded decision's replay): listed with :func:`get_request`'s stand-ins instead, rows pending by their
    status only."""
    sql, row = _select(kind)
    where = "(expires_at IS NULL OR expires_at > ?)"
    args: tuple[Any, ...] = (now_ms,)
    if session_id is not None:
        where += " AND session_id = ?"
        args += (session_id,)
    query = f"{sql} WHERE status = 'pending' AND {where}"
    if not lenient:  # a second arm, so the first still reads the pending rows' partial index
        query += f" UNION ALL {sql} WHERE {_DAMAGED_PENDING[kind]} AND {where}"
        args += args
    rows = conn.execute(f"{query} ORDER BY created_at DESC, request_id", args).fetchall()
    return readable(rows, lambda r: row(r, lenient), lambda r: str(r[0]))  # request_id: column 1 of both


def _check_existing(existing: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    """A retried request for the same tool call gets its row; different content is a CONFLICT."""
    differs = [k for k, v in fields.items() if existing.get(k) != v]
    if differs:
        raise Conflict(f"tool call {existing.get('toolCallId')} already asked something else "
                       f"({', '.join(differs)} differ)", data={"requestId": existing["requestId"]})
    return dict(existing)


def insert_approval(conn: sqlite3.Connection, *, request_id: str, session_id: str, turn_id: str,
                    tool_call_id: str | None, tool: str, args_summary: str, risk: str,
                    options: Sequence[Mapping[str, str]], requested_by: str, expires_at: int | None,
                    now_ms: int, rule: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], bool]:
    """A new prompt: ``pending``, or already decided when ``rule`` covers the tool. (row, created)."""
    if risk not in RISKS:
        raise InvalidInput("risk must be low, medium or high", data={"field": "risk"})
    if tool_call_id is not None:
        existing = find_by_tool_call(conn, "approval", session_id, tool_call_id)
        if existing is not None:
            return _check_existing(existing, {"turnId": turn_id, "tool": tool, "argsSummary": args_summary,
                                              "risk": risk}), False
    status, option, responder, resolved = "pending", None, None, None
    if rule is not None:
        status = "allowed" if rule["decision"] == "allow" else "denied"
        option, responder, resolved = None, "rule", now_ms
    conn.execute(
        "INSERT INTO approvals(request_id, session_id, turn_id, tool_call_id, tool, args_summary, risk, options_json, "
        "requested_by, status, option_id, rule_id, responded_by, created_at, updated_at, expires_at, resolved_at) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (request_id, session_id, turn_id, tool_call_id, tool, args_summary, risk,
         orjson.dumps(list(options)).decode(), requested_by, status, option, rule["id"] if rule else None,
         responder, now_ms, now_ms, expires_at, resolved))
    return get_request(conn, "approval", request_id), True


def insert_interaction(conn: sqlite3.Connection, *, request_id: str, session_id: str, turn_id: str,
                       tool_call_id: str | None, question: str, choices: Sequence[Mapping[str, str]],
                       multiple: bool, allow_free_text: bool, requested_by: str, expires_at: int | None,
                       now_ms: int) -> tuple[dict[str, Any], bool]:
    ids = [c["id"] for c in choices]
    if len(set(ids)) != len(ids) or len(ids) > MAX_CHOICES:
        raise InvalidInput(f"choices need unique ids (at most {MAX_CHOICES})", data={"field": "choices"})
    if not choices and not allow_free_text:
        raise InvalidInput("a question needs choices or allowFreeText", data={"field": "choices"})
    if tool_call_id is not None:
        existing = find_by_tool_call(conn, "interaction", session_id, tool_call_id)
        if existing is not None:
            return _check_existing(existing, {"turnId": turn_id, "question": question,
                                              "choices": [dict(c) for c in choices]}), False
    conn.execute(
        "INSERT INTO interactions(request_id, session_id, turn_id, tool_call_id, question, choices_json, multiple, "
        "allow_free_text, requested_by, status, created_at, updated_at, expires_at) "
        "VALUES (?,?,?,?,?,?,?,?,?,'pending',?,?,?)",
        (request_id, session_id, turn_id, tool_call_id, question, orjson.dumps([dict(c) for c in choices]).decode(),
         int(multiple), int(allow_free_text), requested_by, now_ms, now_ms, expires_at))
    return get_request(conn, "interaction", request_id), True


def expire_stale(conn: sqlite3.Connection, kind: Kind, request_id: str, now_ms: int) -> bool:
    """The row passed its deadline while pending: ``expired``, resolved at its deadline as the boot
    fence and the reads have it (True if it changed; False if anything settled it first)."""
    return conn.execute(
        f"UPDATE {_TABLE[kind]} SET status = 'expired', updated_at = ?, resolved_at = expires_at "
        f"WHERE request_id = ? AND {_PENDING[kind]} AND expires_at IS NOT NULL AND expires_at <= ?",
        (now_ms, request_id, now_ms)).rowcount > 0


def next_deadline(conn: sqlite3.Connection, *, damaged: bool = False) -> int | None:
    """The earliest ``expires_at`` of a pending request of either kind (None: nothing can expire), read through
    the pending rows' partial index; ``damaged``: of a request whose status is damaged too
    (:data:`_DAMAGED_PENDING`: a scan of both tables, so only on the expiry timer's own wake-ups, never per
    request)."""
    found = [conn.execute(f"SELECT MIN(expires_at) FROM {table} WHERE status = 'pending'").fetchone()[0]
             for table in _TABLE.values()]
    if damaged:
        found += [conn.execute(f"SELECT MIN(expires_at) FROM {_TABLE[kind]} WHERE {_DAMAGED_PENDING[kind]}")
                  .fetchone()[0] for kind in KINDS]
    deadlines = [int(at) for at in found if at is not None]
    return min(deadlines) if deadlines else None


def lapsed(conn: sqlite3.Connection, now_ms: int, limit: int,
           session_id: str | None = None) -> list[tuple[Kind, str, str]]:
    """At most ``limit`` pending requests (either kind; of ``session_id`` only, if given) whose deadline
    passed at ``now_ms``, earliest first: ``(kind, request id, session id)``. One whose status is damaged is
    among them (:data:`_PENDING`: without a session, a scan of the table; this runs when a deadline is due)."""
    rows: list[tuple[int, str, Kind, str]] = []
    where = "" if session_id is None else " AND session_id = ?"
    for kind in KINDS:
        args: tuple[Any, ...] = (now_ms,) if session_id is None else (now_ms, session_id)
        rows.extend((at, rid, kind, sid) for at, rid, sid in conn.execute(
            f"SELECT expires_at, request_id, session_id FROM {_TABLE[kind]} WHERE {_PENDING[kind]} "
            f"AND expires_at IS NOT NULL AND expires_at <= ?{where} ORDER BY expires_at, request_id LIMIT ?",
            (*args, limit)))
    return [(kind, rid, sid) for _at, rid, kind, sid in sorted(rows)[:limit]]


def require_pending(conn: sqlite3.Connection, kind: Kind, request_id: str, session_id: str,
                    now_ms: int, lenient: bool = False) -> dict[str, Any]:
    """The row an answer may resolve; ``CONFLICT`` for another session's, a settled or an expired one
    (``lenient``: :func:`get_request`'s)."""
    row = get_request(conn, kind, request_id, lenient)
    if row["sessionId"] != session_id:
        raise Conflict(f"{kind} request {request_id} belongs to another session, not {session_id}",
                       data={"requestId": request_id, "sessionId": session_id})
    if row["status"] == "pending" and row.get("expiresAt") is not None and row["expiresAt"] <= now_ms:
        raise Conflict(f"{kind} request {request_id} expired at {row['expiresAt']}: a late answer is refused",
                       data={"requestId": request_id, "status": "expired"})
    if row["status"] != "pending":
        raise Conflict(f"{kind} request {request_id} is {row['status']}, not pending: it was answered once "
                       "already, or a restart interrupted it", data={"requestId": request_id, "status": row["status"]})
    return row


def outcome_of(kind: Kind, row: Mapping[str, Any], option_id: str | None,
               answer: Mapping[str, Any] | None) -> tuple[str, dict[str, str] | None]:
    """(status, chosen option) an answer gives (pure; raises for an option the prompt did not offer).

    An approval whose record is damaged (read ``lenient``: its ``unreadable`` names what) can still be denied,
    the answer that is safe whatever was offered: the tool does not run and the turn goes on. With its options
    unreadable (none shown), :data:`DENY`'s id denies it. An allow is refused: what it would allow (and
    remember), or whether it may still be allowed, is not known."""
    if kind == "interaction":
        return "answered", None
    damaged = f"approval {row['requestId']}'s {', '.join(row.get('unreadable') or ())} no longer read"
    if not row.get("options"):
        if option_id != DENY["id"]:
            raise DamagedRecord(f"{damaged}: it can only be denied (optionId {DENY['id']!r})",
                                data={"requestId": row["requestId"]})
        return "denied", dict(DENY)
    option = next((o for o in row.get("options") or () if o["id"] == option_id), None)
    if option is None:
        raise InvalidInput(f"option {option_id!r} is not one of the prompt's options", data={"field": "optionId"})
    if option["decision"] == "allow" and row.get("unreadable"):
        raise DamagedRecord(f"{damaged}: it can only be denied", data={"requestId": row["requestId"]})
    return ("allowed" if option["decision"] == "allow" else "denied"), dict(option)


def resolve(conn: sqlite3.Connection, kind: Kind, request_id: str, *, status: str, option_id: str | None,
            answer: Mapping[str, Any] | None, responder: str, now_ms: int) -> None:
    """pending → ``status`` (the caller checked :func:`require_pending` in this transaction)."""
    if kind == "approval":
        changed = conn.execute(
            "UPDATE approvals SET status = ?, option_id = ?, responded_by = ?, updated_at = ?, resolved_at = ? "
            f"WHERE request_id = ? AND {_PENDING[kind]}",
            (status, option_id, responder, now_ms, now_ms, request_id)).rowcount
    else:
        changed = conn.execute(
            "UPDATE interactions SET status = ?, answer_json = ?, responded_by = ?, updated_at = ?, resolved_at = ? "
            f"WHERE request_id = ? AND {_PENDING[kind]}",
            (status, orjson.dumps(dict(answer or {})).decode(), responder, now_ms, now_ms, request_id)).rowcount
    if not changed:
        raise Conflict(f"{kind} request {request_id} is no longer pending", data={"requestId": request_id})


def response_of(conn: sqlite3.Connection, kind: Kind, request_id: str, lenient: bool = False) -> dict[str, Any]:
    """The response of an answer (``approvals.respond`` / ``interactions.respond``), from the rows."""
    row = get_request(conn, kind, request_id, lenient)
    out: dict[str, Any] = {"request": row}
    if kind == "approval" and row.get("ruleId"):
        rule = get_rule(conn, row["ruleId"])
        if rule is not None:
            out["rule"] = rule
    return out


def cancel_for_turn(conn: sqlite3.Connection, session_id: str, turn_id: str, now_ms: int) -> list[tuple[Kind, str]]:
    """The turn ended: its pending requests can no longer be answered (``cancelled``)."""
    out: list[tuple[Kind, str]] = []
    for kind in KINDS:
        rows = conn.execute(
            f"UPDATE {_TABLE[kind]} SET status = 'cancelled', updated_at = ?, resolved_at = ? "
            f"WHERE session_id = ? AND turn_id = ? AND {_PENDING[kind]} RETURNING request_id",
            (now_ms, now_ms, session_id, turn_id)).fetchall()
        out.extend((kind, r[0]) for r in rows)
    return out


def interrupt_pending(conn: sqlite3.Connection, now_ms: int) -> dict[str, int]:
    """Boot fence: nothing asked before the restart can be answered after it. A request already past
    its deadline expired (at its ``expires_at``): it says ``expired``, as it did before the restart."""
    out: dict[str, int] = {}
    for kind, table in _TABLE.items():
        conn.execute(f"UPDATE {table} SET status = 'expired', updated_at = ?, resolved_at = expires_at "
                     f"WHERE {_PENDING[kind]} AND expires_at IS NOT NULL AND expires_at <= ?", (now_ms, now_ms))
        out[kind] = conn.execute(
            f"UPDATE {table} SET status = 'interrupted', updated_at = ?, resolved_at = ? WHERE {_PENDING[kind]}",
            (now_ms, now_ms)).rowcount
    return out


def decisions_for_turns(conn: sqlite3.Connection, session_id: str, turn_ids: Iterable[str],
                        now_ms: int | None = None) -> Readable[dict[str, Any]]:
    """Every request of these turns that is no longer pending, oldest first (``session.get``).

    A row still ``pending`` past its deadline at ``now_ms`` is shown ``expired`` (resolved at its
    deadline), as an answer or the next restart would settle it: a read does not write, and the
    request is in neither ``approvals.pending`` nor the decisions otherwise. A row whose record is
    damaged is named in ``unreadable`` (request ids, sorted) instead: one decision's damage never costs
    the messages' page."""
    ids = sorted(set(turn_ids))
    out: list[dict[str, Any]] = []
    unreadable: list[str] = []
    lapsed_at = -1 if now_ms is None else now_ms  # one statement shape (prepared once per connection)
    for kind in KINDS:
        sql, row = _select(kind)
        for marks, chunk in in_chunks(ids):
            found = readable(conn.execute(
                f"{sql} WHERE session_id = ? AND turn_id IN ({marks}) AND (status <> 'pending' "
                "OR (status = 'pending' AND expires_at IS NOT NULL AND expires_at <= ?))",
                (session_id, *chunk, lapsed_at)).fetchall(), row, lambda r: str(r[0]))  # request_id: column 1
            out.extend(found.items)
            unreadable.extend(found.unreadable)
    for decision in out:
        if decision["status"] == "pending":
            decision.update(status="expired", resolvedAt=decision["expiresAt"])
    out.sort(key=lambda r: (r.get("resolvedAt") or r["createdAt"], r["requestId"]))
    return Readable(out, sorted(unreadable))


# ---------------------------------------------------------------------------
# permission rules


def _rule(r: Sequence[Any]) -> dict[str, Any]:
    rid, scope, sid, pid, tool, decision, source, created = r
    out = {"id": rid, "scope": scope, "sessionId": sid, "projectId": pid, "tool": tool, "decision": decision,
           "sourceRequestId": source, "createdAt": created}
    return {k: v for k, v in out.items() if v is not None}


def get_rule(conn: sqlite3.Connection, rule_id: str) -> dict[str, Any] | None:
    found = conn.execute(f"SELECT {_RULE_COLS} FROM permission_rules WHERE id = ?", (rule_id,)).fetchone()
    return _rule(found) if found else None


def matching_rule(conn: sqlite3.Connection, session_id: str, project_id: int | None,
                  tool: str) -> dict[str, Any] | None:
    """The most specific rule covering ``tool`` here: this session's, then the project's, then a global one."""
    found = conn.execute(
        f"SELECT {_RULE_COLS} FROM permission_rules WHERE tool = ? AND ("
        "(scope = 'session' AND session_id = ?) OR (scope = 'project' AND project_id IS ? AND project_id IS NOT NULL) "
        "OR scope = 'global') ORDER BY CASE scope WHEN 'session' THEN 0 WHEN 'project' THEN 1 ELSE 2 END LIMIT 1",
        (tool, session_id, project_id)).fetchone()
    return _rule(found) if found else None


def upsert_rule(conn: sqlite3.Connection, *, rule_id: str, scope: str, session_id: str, project_id: int | None,
                tool: str, decision: str, source_request_id: str, now_ms: int) -> dict[str, Any]:
    """Remember a choice; a later choice for the same scope and tool replaces the earlier one."""
    if scope not in RULE_SCOPES:
        raise InvalidInput(f"rule scope must be one of {', '.join(RULE_SCOPES)}", data={"field": "scope"})
    if scope == "project" and project_id is None:
        raise InvalidInput("a project rule needs a session with a project", data={"field": "remember"})
    sid = session_id if scope == "session" else None
    pid = project_id if scope == "project" else None
    conn.execute(
        "DELETE FROM permission_rules WHERE scope = ? AND COALESCE(session_id, '') = ? "
        "AND COALESCE(project_id, 0) = ? AND tool = ?", (scope, sid or "", pid or 0, tool))
    conn.execute(
        f"INSERT INTO permission_rules({_RULE_COLS}) VALUES (?,?,?,?,?,?,?,?)",
        (rule_id, scope, sid, pid, tool, decision, source_request_id, now_ms))
    found = get_rule(conn, rule_id)
    assert found is not None
    return found


def link_rule(conn: sqlite3.Connection, request_id: str, rule_id: str) -> None:
    conn.execute("UPDATE approvals SET rule_id = ? WHERE request_id = ?", (rule_id, request_id))


def list_rules(conn: sqlite3.Connection, *, session_id: str | None = None,
               project_id: int | None = None) -> list[dict[str, Any]]:
    """Every rule, or those that apply to a session (its own, its project's, global ones)."""
    if session_id is None and project_id is None:
        rows = conn.execute(f"SELECT {_RULE_COLS} FROM permission_rules ORDER BY created_at, id")
    else:
        rows = conn.execute(
            f"SELECT {_RULE_COLS} FROM permission_rules WHERE (scope = 'session' AND session_id IS ?) "
            "OR (scope = 'project' AND project_id IS ? AND project_id IS NOT NULL) OR scope = 'global' "
            "ORDER BY created_at, id", (session_id, project_id))
    return [_rule(r) for r in rows]


def delete_rule(conn: sqlite3.Connection, rule_id: str) -> bool:
    return conn.execute("DELETE FROM permission_rules WHERE id = ?", (rule_id,)).rowcount > 0


# ---------------------------------------------------------------------------
# the transcript line


def decision_record(kind: Kind, row: Mapping[str, Any], *, status: str, decided_at_ms: int, by: str,
                    responder: str | None = None, option: Mapping[str, str] | None = None,
                    answer: Mapping[str, Any] | None = None, rule_id: str | None = None,
                    receipt: ReceiptKey | None = None, response: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``approval_decision`` line of a decision (``type`` first, then ``id`` = the request id).

    ``by`` is ``user`` (``responder``: the answering client's id) or ``rule``. ``response``: the answer the
    call with ``receipt`` gives, carried by the receipt (``extra.response``): a database rebuilt without the
    request's row restores the receipt with it (:func:`apply_decision_lines`).
    """
    rec: dict[str, Any] = {"type": DECISION_LINE, "id": row["requestId"], "requestKind": kind,
                           "turnId": row["turnId"], "status": status, "by": by,
                           "decidedAt": ms_to_rfc3339(decided_at_ms), "decidedAtMs": decided_at_ms}
    if responder is not None:
        rec["respondedBy"] = responder
    if row.get("toolCallId"):
        rec["toolCallId"] = row["toolCallId"]
    if kind == "approval":
        rec["tool"] = row["tool"]
        if option is not None:
            rec["optionId"] = option["id"]
            rec["remember"] = option["remember"]
    else:
        rec["question"] = row["question"]
        rec["answer"] = dict(answer or {})
    if rule_id is not None:
        rec["ruleId"] = rule_id
    if receipt is not None:
        rec["receipt"] = receipts.file_record(receipt, **({"response": dict(response)} if response else {}))
    return rec


def _find_decision_lines(path: Path, ids: set[str]) -> dict[str, dict[str, Any]]:
    """The newest ``approval_decision`` line of each id in ``ids`` (a whole-file scan; boot only)."""
    found: dict[str, dict[str, Any]] = {}
    for rec in lines_naming(path, DECISION_LINE.encode()):
        if rec.get("type") == DECISION_LINE and rec.get("id") in ids:
            found[str(rec["id"])] = rec
    return found


def apply_recorded_decisions(conn: sqlite3.Connection, transcript_of: Callable[[str], Path], now_ms: int) -> int:
    """Boot, before the fence: a pending row whose decision line is in its transcript takes that decision.

    (The host died after the line was fsynced and before the row changed.)
    The answer's receipt, carried in the line, is stored again with the
    response computed from the resolved rows.
    """
    by_session: dict[str, list[tuple[Kind, dict[str, Any]]]] = {}
    for kind in KINDS:
        for row in list_pending(conn, kind, None, -1, lenient=True).items:  # a damaged one too: its deny
            by_session.setdefault(row["sessionId"], []).append((kind, row))
    applied = 0
    for sid, pending in sorted(by_session.items()):
        lines = _find_decision_lines(transcript_of(sid), {r["requestId"] for _, r in pending})
        applied += _apply_decisions(conn, sid, lines, pending, now_ms)
    return applied


def apply_decision_lines(conn: sqlite3.Connection, session_id: str, records: Sequence[Mapping[str, Any]],
                         now_ms: int) -> int:
    """The same for decision lines a catch-up indexes (lines past the index mark: a failed or interrupted
    answer wrote its line, its row stayed pending): each still-pending request takes the decision its line
    records, and the answer's receipt; a retry of that answer is then answered from it, not decided twice."""
    lines = {str(rec["id"]): dict(rec) for rec in records if isinstance(rec.get("id"), str)}
    pending = [(kind, row) for kind in KINDS for row in list_pending(conn, kind, session_id, -1, lenient=True).items
               if row["requestId"] in lines]
    for rec in records:  # a request the database lost (rebuilt): an answer's receipt, with the answer it gave
        _restore_carried(conn, session_id, rec, now_ms)
    return _apply_decisions(conn, session_id, lines, pending, now_ms) if pending else 0


def _restore_carried(conn: sqlite3.Connection, session_id: str, rec: Mapping[str, Any], now_ms: int) -> None:
    """The receipt of a decision line whose request has no row, restored with the answer it carries."""
    raw = rec.get("receipt")
    key = receipts.key_of_record(raw)
    kind, request_id = rec.get("requestKind"), rec.get("id")
    extra = raw.get("extra") if isinstance(raw, Mapping) else None
    said = extra.get("response") if isinstance(extra, Mapping) else None
    if (key is None or kind not in KINDS or not isinstance(request_id, str) or not isinstance(said, Mapping)
            or not isinstance(said.get("request"), Mapping) or said["request"].get("requestId") != request_id):
        return
    known = conn.execute(f"SELECT 1 FROM {_TABLE[kind]} WHERE request_id = ?", (request_id,)).fetchone()
    if known is None and not receipts.exists(conn, key.client_id, key.submission_id):
        at = rec.get("decidedAtMs")
        receipts.store(conn, key, dict(said), session_id=session_id, now_ms=at if isinstance(at, int) else now_ms)


def _apply_decisions(conn: sqlite3.Connection, sid: str, lines: Mapping[str, Mapping[str, Any]],
                     pending: list[tuple[Kind, dict[str, Any]]], now_ms: int) -> int:
    """Each pending row whose request has a line in ``lines`` (request id → its newest decision line)."""
    applied = 0
    for kind, row in pending:
        rec = lines.get(row["requestId"])
        if rec is None or rec.get("requestKind") != kind:
            continue
        at = rec.get("decidedAtMs")
        at = at if isinstance(at, int) else rfc3339_to_ms(rec.get("decidedAt"), now_ms)
        status = rec.get("status")
        if status not in ("allowed", "denied", "answered"):
            continue
        resolve(conn, kind, row["requestId"], status=str(status),
                option_id=rec.get("optionId") if kind == "approval" else None,
                answer=rec.get("answer") if kind == "interaction" else None,
                responder=str(rec.get("respondedBy") or rec.get("by")), now_ms=at)
        if kind == "approval" and status == "denied":  # the audit row the crash kept from landing
            audit.record_denied(conn, row, by=str(rec.get("by") or "user"), now_ms=at,
                                rule_id=rec.get("ruleId"), option_id=rec.get("optionId"))
        remember = rec.get("remember")
        if kind == "approval" and remember in ("session", "project", "global"):
            project = conn.execute("SELECT project_id FROM sessions WHERE id = ?", (sid,)).fetchone()
            rule_id = rule_id_for(row["requestId"])
            upsert_rule(conn, rule_id=rule_id, scope=str(remember), session_id=sid,
                        project_id=project[0] if project else None, tool=row["tool"],
                        decision="allow" if status == "allowed" else "deny",
                        source_request_id=row["requestId"], now_ms=at)
            link_rule(conn, row["requestId"], rule_id)
        key = receipts.key_of_record(rec.get("receipt"))
        if key is not None and not receipts.exists(conn, key.client_id, key.submission_id):
            receipts.store(conn, key, response_of(conn, kind, row["requestId"], lenient=True), session_id=sid,
                           now_ms=at)
        applied += 1
    return applied


RESPONDER_KINDS = frozenset({"ui", "test"})
"""Who answers a user request (seed 000 §2 "user RPC state", pushed to UI clients; §11.19 "no background path
auto-approves"): a person at a UI, or a test standing in for one. Never the agent sidecar that asked, nor the
command line (the host's own tools and scripts: unattended)."""


def check_responder(client_kind: str) -> None:
    """Only a UI (or a test standing in for one) answers an approval, a question or a plan/goal."""
    if client_kind not in RESPONDER_KINDS:
        who = "the agent sidecar" if client_kind == "agent" else f"a {client_kind} connection"
        raise PermissionDenied(f"{who} cannot answer a user request; a UI must",
                               data={"clientKind": client_kind})


def rule_id_for(request_id: str) -> str:
    """The id of the rule an answer to ``request_id`` remembers (the same after a boot repair)."""
    return f"rule_{request_id}"
