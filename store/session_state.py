"""What a session summary derives from other rows: its projected state and its latest turn.

Seed 003 §4.5: a live ``pending`` row in ``plan_approvals`` (one whose
``expires_at`` has not passed: expiry returns the session to ``planning``
even before anything marks the row ``expired``) projects
``awaiting_approval``; an execution ``queued`` or ``running`` projects that
state; otherwise a Plan or Goal session is ``planning``; an Agent session with
no execution has no projected state. The row's ``kind`` (plan | goal) is the
``contractKind``. §4.6: the latest turn (``idx_turns_session``) gives the
failed/aborted badge. Both are read, never stored, so they cannot go stale.

A value they come from that is damaged (an ``execution_state``, a ``kind`` or a turn ``status`` outside its set:
SQLite checks a CHECK on writes only) is not shown: ``state`` (with its ``contractKind``), ``contractKind`` or
``latestTurn`` is left out and named in the summary's own ``unreadable``, so the summary still reads (and the
session still lists). A damaged execution state ranks as ``running`` (it may be) and is never ``planning``.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Mapping
from typing import Any

from store.indexing.sql_lists import in_chunks
from store.plans import EXECUTION_MAY_RUN, LIVE_PENDING
from store.rules import TURN_ENDED

__all__ = ["DERIVED", "projections", "with_projection"]

DERIVED = ("state", "contractKind", "latestTurn", "unreadable")
"""The summary fields this module derives."""

_STATE_RANK = {"awaiting_approval": 0, "running": 1, "queued": 2}


def projections(conn: sqlite3.Connection, modes: Mapping[str, str],
                now_ms: int | None = None, *, plans: bool = True, turns: bool = True) -> dict[str, dict[str, Any]]:
    """``session id → {state?, contractKind?, latestTurn?}`` for the sessions in ``modes`` (id → mode).

    ``now_ms``: the host's clock, which decides whether a pending row is still live (the wall clock
    when not given). ``plans`` / ``turns`` False: the caller knows, from the same snapshot, that these
    sessions have no ``plan_approvals`` / ``turns`` row (``index.session_row_present``): not read."""
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    out: dict[str, dict[str, Any]] = {sid: {} for sid in modes}
    ranks: dict[str, int] = {}
    ids = list(modes) if plans or turns else []
    for marks, chunk in in_chunks(ids):
        for sid, kind, status, execution in () if not plans else conn.execute(
            "SELECT session_id, kind, status, execution_state FROM plan_approvals "
            f"WHERE session_id IN ({marks}) AND ({LIVE_PENDING} OR {EXECUTION_MAY_RUN})",
            (*chunk, now),
        ):
            # an execution state outside its set may be running (plans.EXECUTION_MAY_RUN): ranked as running,
            # shown as no state, named
            state = "awaiting_approval" if status == "pending" else \
                str(execution) if execution in ("queued", "running") else None
            rank = _STATE_RANK[state or "running"]
            if sid not in ranks or rank < ranks[sid]:
                ranks[sid] = rank
                out[sid].update(state=state, contractKind=kind)
                _unread(out[sid], "state", state is None)
                if state is None:
                    out[sid].pop("contractKind")  # the kind of a state not shown
                    _unread(out[sid], "contractKind", False)
                else:
                    _unread(out[sid], "contractKind", kind not in _KINDS)
        for sid, tid, status, error_code, ended_at in () if not turns else conn.execute(
            "SELECT t.session_id, t.id, t.status, t.error_code, t.ended_at FROM turns t "
            f"WHERE t.session_id IN ({marks}) AND t.id = (SELECT i.id FROM turns i WHERE i.session_id = t.session_id "
            "ORDER BY i.started_at DESC, i.id DESC LIMIT 1)",
            chunk,
        ):
            latest = {"id": tid, "status": status, "errorCode": error_code, "endedAt": ended_at}
            out[sid]["latestTurn"] = {k: v for k, v in latest.items() if v is not None}
            _unread(out[sid], "latestTurn", status not in TURN_STATUSES)
    for sid, mode in modes.items():
        if sid not in ranks and mode in ("plan", "goal"):
            out[sid].update(state="planning", contractKind=mode)
    return out


_KINDS = ("plan", "goal")
TURN_STATUSES = ("running", *TURN_ENDED)


def _unread(summary: dict[str, Any], part: str, damaged: bool) -> None:
    """``part`` was just set from a stored value: left out and named in ``unreadable`` when it is damaged."""
    named = [p for p in summary.get("unreadable", []) if p != part]
    if damaged:
        summary.pop(part)
        named.append(part)
    if named:
        summary["unreadable"] = sorted(named)
    else:
        summary.pop("unreadable", None)


def with_projection(conn: sqlite3.Connection, rows: Iterable[dict[str, Any]], now_ms: int | None = None, *,
                    plans: bool = True, turns: bool = True) -> None:
    """Add the derived fields to session rows (in place); ``plans`` / ``turns``: as :func:`projections`."""
    rows = list(rows)
    found = projections(conn, {r["id"]: r.get("mode") or "agent" for r in rows}, now_ms, plans=plans, turns=turns)
    for row in rows:
        for key in DERIVED:
            row.pop(key, None)
        row.update(found.get(row["id"], {}))
