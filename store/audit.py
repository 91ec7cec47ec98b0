"""The audit log (seed 003 §4.13): append-only rows, read newest first, pruned at boot (§8). SQL only.

Rows are written by whoever records the event, in the transaction that records it:

* ``tool_execute`` — a Write/Edit (or file-effect) tool result, with its artifacts
  (``store.artifacts.record_effects``, inside the index transaction of the result's line);
* ``tool_denied`` — a tool permission request answered "deny", by the user
  (``approvals.respond``), by a stored rule (``approvals.request``), or applied at boot
  from the decision line a crash left (``store.approvals.apply_recorded_decisions``);
* ``turn_interrupted`` (the boot fence), ``inflight_promoted`` (boot promotion).

:func:`list_rows` pages with keyset cursors on ``(ts, id)`` newest first; the
session filter uses ``idx_audit_session`` and the time range ``idx_audit_ts``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

__all__ = ["DENIED", "EXECUTE", "KNOWN_KINDS", "list_rows", "record", "record_denied"]

EXECUTE = "tool_execute"
DENIED = "tool_denied"
KNOWN_KINDS = (EXECUTE, DENIED, "turn_interrupted", "inflight_promoted")


def record(conn: sqlite3.Connection, kind: str, session_id: str | None, payload: Mapping[str, Any],
           now_ms: int) -> int:
    """Append one row; its id."""
    row = conn.execute(
        "INSERT INTO audit_log(ts, kind, session_id, payload_json) VALUES (?, ?, ?, ?) RETURNING id",
        (now_ms, kind, session_id, orjson.dumps(dict(payload)).decode()),
    ).fetchone()
    return int(row[0])


def record_denied(conn: sqlite3.Connection, request: Mapping[str, Any], *, by: str, now_ms: int,
                  rule_id: str | None = None, option_id: str | None = None) -> int:
    """``tool_denied`` for an approval request (``store.approvals`` row shape) that was just denied."""
    payload: dict[str, Any] = {"requestId": request.get("requestId"), "tool": request.get("tool"), "by": by}
    for key, value in (("turnId", request.get("turnId")), ("toolCallId", request.get("toolCallId")),
                       ("ruleId", rule_id), ("optionId", option_id)):
        if value is not None:
            payload[key] = value
    return record(conn, DENIED, str(request["sessionId"]) if request.get("sessionId") else None, payload, now_ms)


def list_rows(conn: sqlite3.Connection, *, session_id: str | None, kind: str | None, since: int | None,
              until: int | None, limit: int, cursor: Sequence[Any] | None
              ) -> tuple[list[dict[str, Any]], list[Any] | None]:
    """Newest first (``ts`` then ``id`` descending); ``since`` inclusive, ``until`` exclusive."""
    where: list[str] = []
    args: list[Any] = []
    for cond, value in (("session_id = ?", session_id), ("kind = ?", kind), ("ts >= ?", since),
                        ("ts < ?", until)):
        if value is not None:
            where.append(cond)
            args.append(value)
    if cursor is not None:
        ts, rid = cursor
        where.append("(ts < ? OR (ts = ? AND id < ?))")
        args += [ts, ts, rid]
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    rows = conn.execute(
        f"SELECT id, ts, kind, session_id, payload_json FROM audit_log {clause} ORDER BY ts DESC, id DESC LIMIT ?",
        (*args, limit + 1),
    ).fetchall()
    items: list[dict[str, Any]] = []
    for rid, ts, k, sid, payload in rows[:limit]:
        try:
            body = orjson.loads(payload)
        except orjson.JSONDecodeError:
            body = {"unreadable": True}
        item: dict[str, Any] = {"id": rid, "ts": ts, "kind": k,
                                "payload": body if isinstance(body, dict) else {"value": body}}
        if sid is not None:
            item["sessionId"] = sid
        items.append(item)
    more = len(rows) > limit
    return items, ([items[-1]["ts"], items[-1]["id"]] if more and items else None)
