"""Usage rollups over ``turns`` (seed 003 §4.6): per session and model, per day, retry lineage.

Token counts and cost are promoted columns (``input_tokens``, ``output_tokens``,
``cost_micros``: §6 "anything filtered or summed is a promoted column"), so a
rollup is one indexed aggregate: a session's turns through
``idx_turns_session``, the token history through ``idx_turns_ended_at`` (turns
by end time). Cost is kept in millionths of the provider's currency unit
(``usage.cost.total`` as the provider reported it); no JSON is read at query
time. SQL only, inside the caller's snapshot.
"""

from __future__ import annotations

import datetime
import sqlite3
from collections.abc import Mapping
from typing import Any, Final

from store.errors import InvalidInput

__all__ = ["DAY_MS", "cost_micros", "history", "list_turns", "session_usage"]

DAY_MS: Final = 86_400_000
MAX_COST: Final = 10**12  # a million currency units per turn: anything above is not a real report


def cost_micros(usage: Mapping[str, Any] | None) -> int:
    """The turn's cost from its usage report: ``cost.total`` (or a bare ``cost``), in micro-units."""
    if not usage:
        return 0
    cost = usage.get("cost")
    if isinstance(cost, Mapping):
        cost = cost.get("total")
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or cost != cost or cost < 0:
        return 0
    return min(int(round(float(cost) * 1_000_000)), MAX_COST)


INT64_MAX: Final = 2**63 - 1


def _total(value: Any) -> int:
    """A ``TOTAL()`` (a float: SQLite's ``SUM`` of integers raises "integer overflow" past 2**63, which
    one client's absurd token counts would make of every later usage read) as a wire integer, at most
    2**63 - 1. Exact up to 2**53, far beyond any real report."""
    return min(int(value or 0), INT64_MAX)


def _sums(row: tuple[Any, ...]) -> dict[str, Any]:
    turns, tin, tout, micros, failed, aborted = row
    return {"turns": int(turns or 0), "inputTokens": _total(tin), "outputTokens": _total(tout),
            "costMicros": _total(micros), "failedTurns": int(failed or 0), "abortedTurns": int(aborted or 0)}


_AGG = ("COUNT(*), TOTAL(input_tokens), TOTAL(output_tokens), TOTAL(cost_micros), "
        "SUM(status = 'error'), SUM(status = 'aborted')")


def session_usage(conn: sqlite3.Connection, session_id: str) -> dict[str, Any]:
    """Totals and per (provider, model) rollups of one session's turns."""
    total = conn.execute(f"SELECT {_AGG} FROM turns WHERE session_id = ?", (session_id,)).fetchone()
    models = []
    for provider, model, *rest in conn.execute(
        f"SELECT provider_id, model_id, {_AGG} FROM turns WHERE session_id = ? "
        "GROUP BY provider_id, model_id ORDER BY TOTAL(cost_micros) DESC, COUNT(*) DESC, provider_id, model_id",
        (session_id,),
    ):
        entry = {"providerId": provider, "modelId": model, **_sums(tuple(rest))}
        models.append({k: v for k, v in entry.items() if v is not None})
    return {"sessionId": session_id, "total": _sums(total), "byModel": models}


def history(conn: sqlite3.Connection, *, now_ms: int, days: int, utc_offset_minutes: int = 0,
            session_id: str | None = None) -> list[dict[str, Any]]:
    """Tokens and cost per day (in the caller's UTC offset) of the turns that ended in the last ``days``
    days, oldest first; days without turns are left out."""
    if not 1 <= days <= 366:
        raise InvalidInput("days must be 1..366", data={"field": "days"})
    offset = utc_offset_minutes * 60_000
    today = (now_ms + offset) // DAY_MS
    since = (today - days + 1) * DAY_MS - offset
    where = "ended_at >= ?"
    args: list[Any] = [since]
    if session_id is not None:
        where += " AND session_id = ?"
        args.append(session_id)
    out = []
    for day, *rest in conn.execute(
        f"SELECT (ended_at + ?) / {DAY_MS} AS day, {_AGG} FROM turns WHERE {where} GROUP BY day ORDER BY day",
        (offset, *args),
    ):
        out.append({"day": _iso_day(int(day)), **_sums(tuple(rest))})
    return out


def _iso_day(day: int) -> str:
    return (datetime.date(1970, 1, 1) + datetime.timedelta(days=day)).isoformat()


def list_turns(conn: sqlite3.Connection, session_id: str, *, limit: int,
               before: tuple[int, str] | None) -> tuple[list[str], tuple[int, str] | None]:
    """Turn ids of a session, newest first (keyset paging on (started_at, id))."""
    where = "session_id = ?"
    args: list[Any] = [session_id]
    if before is not None:
        where += " AND (started_at < ? OR (started_at = ? AND id < ?))"
        args += [before[0], before[0], before[1]]
    rows = conn.execute(f"SELECT started_at, id FROM turns WHERE {where} ORDER BY started_at DESC, id DESC "
                        "LIMIT ?", (*args, limit + 1)).fetchall()
    more = len(rows) > limit
    rows = rows[:limit]
    return [r[1] for r in rows], ((rows[-1][0], rows[-1][1]) if more and rows else None)
