"""Usage rollups (seed 003 §4.6): per session and model, tokens per day, retry lineage."""

from __future__ import annotations

import datetime
import sqlite3
from pathlib import Path

import trio

from store import usage
from store.usage import DAY_MS
from tests.dbkit import NOW
from tests.hostkit import client_for, inprocess_host
from tests.turns.turnkit import end, rpc_error, start


def _turn(conn: sqlite3.Connection, tid: str, sid: str, ended: int | None, tin: int, tout: int, micros: int,
          status: str = "completed", model: str = "m1") -> None:
    conn.execute("INSERT INTO turns(id, session_id, status, provider_id, model_id, input_tokens, output_tokens, "
                 "cost_micros, started_at, ended_at) VALUES (?, ?, ?, 'p', ?, ?, ?, ?, ?, ?)",
                 (tid, sid, status, model, tin, tout, micros, (ended or NOW) - 10, ended))


def _session(conn: sqlite3.Connection, sid: str) -> None:
    conn.execute("INSERT INTO sessions(id, created_at, updated_at) VALUES (?, 1, 1)", (sid,))


def test_cost_comes_from_the_usage_report_in_micro_units() -> None:
    assert usage.cost_micros({"cost": {"total": 0.0117, "input": 0.01}}) == 11700
    assert usage.cost_micros({"cost": 2}) == 2_000_000
    for junk in (None, {}, {"cost": "1"}, {"cost": {"total": -1}}, {"cost": True}, {"cost": float("nan")}):
        assert usage.cost_micros(junk) == 0


def test_history_groups_ended_turns_by_day_in_the_callers_offset(conn: sqlite3.Connection) -> None:
    _session(conn, "s1")
    _session(conn, "s2")
    day0 = (NOW // DAY_MS) * DAY_MS  # 00:00 UTC today
    _turn(conn, "a", "s1", day0 + 1000, 10, 1, 100)  # today, early morning UTC
    _turn(conn, "b", "s1", day0 - 1000, 20, 2, 200)  # yesterday, just before midnight UTC
    _turn(conn, "c", "s2", day0 - 3 * DAY_MS, 40, 4, 400, status="error")
    _turn(conn, "old", "s2", day0 - 40 * DAY_MS, 99, 9, 999)  # outside the window
    _turn(conn, "running", "s2", None, 5, 5, 5, status="running")  # never ended: not in the history
    got = usage.history(conn, now_ms=NOW, days=7)
    assert [(d["day"], d["turns"], d["inputTokens"], d["costMicros"], d["failedTurns"]) for d in got] == [
        (_day(day0 - 3 * DAY_MS), 1, 40, 400, 1), (_day(day0 - DAY_MS), 1, 20, 200, 0), (_day(day0), 1, 10, 100, 0)]
    shifted = usage.history(conn, now_ms=NOW, days=7, utc_offset_minutes=-120)  # two hours behind UTC
    assert [d["inputTokens"] for d in shifted if d["day"] == _day(day0 - DAY_MS)] == [30]  # a moved back a day
    assert [d["inputTokens"] for d in usage.history(conn, now_ms=NOW, days=7, session_id="s2")] == [40]
    plan = conn.execute("EXPLAIN QUERY PLAN SELECT (ended_at + 0) / 86400000 AS day, COUNT(*) FROM turns "
                        "WHERE ended_at >= ? GROUP BY day", (NOW,)).fetchall()
    assert any("idx_turns_ended_at" in str(row[-1]) for row in plan)


def _day(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).date().isoformat()


def test_session_usage_sums_per_model_with_failed_and_aborted_counts(conn: sqlite3.Connection) -> None:
    _session(conn, "s1")
    _turn(conn, "a", "s1", NOW, 100, 10, 1000, model="big")
    _turn(conn, "b", "s1", NOW, 50, 5, 500, status="error", model="big")
    _turn(conn, "c", "s1", NOW, 7, 1, 70, status="aborted", model="small")
    got = usage.session_usage(conn, "s1")
    assert got["total"] == {"turns": 3, "inputTokens": 157, "outputTokens": 16, "costMicros": 1570,
                            "failedTurns": 1, "abortedTurns": 1}
    assert [(m["modelId"], m["turns"], m["costMicros"]) for m in got["byModel"]] == [("big", 2, 1500),
                                                                                     ("small", 1, 70)]
    plan = conn.execute("EXPLAIN QUERY PLAN SELECT COUNT(*) FROM turns WHERE session_id = ?", ("s1",)).fetchall()
    assert any("idx_turns_session" in str(row[-1]) for row in plan)


def test_sums_past_int64_read_back_capped_instead_of_failing(conn: sqlite3.Connection) -> None:
    """Two turns of 2**62 input tokens each (accepted: each is a valid int64) made SQLite's SUM raise
    "integer overflow", so usage.session and usage.history answered INTERNAL for good, for every session
    (the global history too). The sums are TOTAL()s, capped at 2**63 - 1."""
    _session(conn, "s1")
    _turn(conn, "a", "s1", NOW, 2**62, 10**15, 0)
    _turn(conn, "b", "s1", NOW, 2**62, 1, 0)
    _turn(conn, "c", "s1", NOW, 7, 1, 70)
    total = usage.session_usage(conn, "s1")["total"]
    assert total["inputTokens"] == usage.INT64_MAX and total["turns"] == 3
    assert [d["inputTokens"] for d in usage.history(conn, now_ms=NOW, days=1)] == [usage.INT64_MAX]
    assert total["outputTokens"] == 10**15 + 2  # exact below 2**53


async def test_usage_methods_roll_up_what_end_turn_recorded(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = str((await c.call("session.create", {"title": "u", "providerId": "anthropic",
                                                       "modelId": "sonnet"}))["id"])
            await start(c, sid, "t1")
            ended = await end(c, sid, "t1", usage={"inputTokens": 1200, "outputTokens": 300,
                                                   "cost": {"total": 0.0105}})
            assert ended["turn"]["costMicros"] == 10500
            await start(c, sid, "t2", modelId="haiku")
            await end(c, sid, "t2", "error", errorCode="OVERLOADED", usage={"inputTokens": 10, "outputTokens": 0})
            got = await c.call("usage.session", {"sessionId": sid})
            assert got["total"]["turns"] == 2 and got["total"]["inputTokens"] == 1210
            assert got["total"]["costMicros"] == 10500 and got["total"]["failedTurns"] == 1
            assert {m["modelId"]: m["inputTokens"] for m in got["byModel"]} == {"sonnet": 1200, "haiku": 10}
            today = await c.call("usage.history", {"days": 1})
            assert [(d["turns"], d["outputTokens"]) for d in today["days"]] == [(2, 300)]
            assert (await rpc_error(c.call("usage.session", {"sessionId": "nope"}))).data_code == "SESSION_NOT_FOUND"


async def test_a_retry_names_the_turn_it_retries(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = str((await c.call("session.create", {"title": "r"}))["id"])
            other = str((await c.call("session.create", {"title": "o"}))["id"])
            await start(c, sid, "t1")
            err = await rpc_error(start(c, sid, "t2", retryOf="t1"))
            assert err.data_code == "CONFLICT"  # t1 is still running
            await end(c, sid, "t1", "error", errorCode="OVERLOADED")
            retried = await start(c, sid, "t2", retryOf="t1")
            assert retried["retryOf"] == "t1"
            await end(c, sid, "t2")
            await start(c, other, "x1")
            assert (await rpc_error(start(c, other, "x2", retryOf="t1"))).data_code == "NOT_FOUND"
            assert (await rpc_error(start(c, sid, "t3", retryOf="nope"))).data_code == "NOT_FOUND"
            page = await c.call("session.listTurns", {"sessionId": sid, "limit": 1})
            assert [(t["id"], t.get("retryOf")) for t in page["turns"]] == [("t2", "t1")]
            rest = await c.call("session.listTurns", {"sessionId": sid, "cursor": page["nextCursor"]})
            assert [(t["id"], t["status"], t.get("retryOf")) for t in rest["turns"]] == [("t1", "error", None)]
            assert rest.get("nextCursor") is None
