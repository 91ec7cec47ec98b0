"""Issue 24 part 4: the audit log (seed 003 §4.13, §8) — ``tool_denied`` rows in the transaction of the denial,
a paged and filtered read (``audit.list``), pruning of rows older than 90 days at boot.

Each test's docstring quotes the spec line it holds the host to.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from store import approvals, audit
from store.fence import DAY_MS, retention
from store.jsonio import dumps_line
from tests.dbkit import NOW, add_session, tx
from tests.hostkit import client_for, inprocess_host


async def _turn(c: HostClient) -> str:
    sid: str = (await c.call("session.create", {"title": "t"}))["id"]
    await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1", "environment": {
        "version": 1, "model": {"id": "fake"}, "systemPrompt": "be brief"}})
    return sid


async def test_a_denied_approval_writes_a_tool_denied_row(tmp_path: Path) -> None:
    """Seed 003 §4.13: "kind TEXT NOT NULL, -- tool_execute | tool_denied | …". A user's deny and a stored
    deny rule each leave one ``tool_denied`` row, committed with the request's resolution (same time, and
    only for denials: an allow leaves none)."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await _turn(c)
            allowed = await c.call("approvals.request", {"sessionId": sid, "turnId": "t1", "tool": "Read",
                                                         "risk": "low"})
            await c.call("approvals.respond", {"sessionId": sid, "optionId": "allow_once",
                                               "requestId": allowed["request"]["requestId"]})
            asked = await c.call("approvals.request", {"sessionId": sid, "turnId": "t1", "tool": "Bash",
                                                       "risk": "high", "toolCallId": "call_1"})
            rid = asked["request"]["requestId"]
            denied = await c.call("approvals.respond", {"sessionId": sid, "optionId": "deny", "requestId": rid})
            listed = await c.call("audit.list", {"sessionId": sid})
            assert [e["kind"] for e in listed["entries"]] == ["tool_denied"]
            [entry] = listed["entries"]
            assert entry["payload"] == {"requestId": rid, "tool": "Bash", "by": "user", "turnId": "t1",
                                        "toolCallId": "call_1", "optionId": "deny"}
            assert entry["ts"] == denied["request"]["resolvedAt"] and entry["sessionId"] == sid
            # a remembered deny: the next request for the tool is denied by the rule, audited as such
            custom = [{"id": "ok", "decision": "allow"}, {"id": "never", "decision": "deny", "remember": "session"}]
            asked = await c.call("approvals.request", {"sessionId": sid, "turnId": "t1", "tool": "Edit",
                                                       "risk": "low", "options": custom})
            await c.call("approvals.respond", {"sessionId": sid, "optionId": "never",
                                               "requestId": asked["request"]["requestId"]})
            ruled = await c.call("approvals.request", {"sessionId": sid, "turnId": "t1", "tool": "Edit",
                                                       "risk": "low"})
            assert ruled["request"]["status"] == "denied"
            rows = (await c.call("audit.list", {"sessionId": sid, "kind": "tool_denied"}))["entries"]
            assert [(r["payload"]["requestId"], r["payload"]["by"]) for r in rows] == [
                (ruled["request"]["requestId"], "rule"), (asked["request"]["requestId"], "user"), (rid, "user")]
            assert rows[0]["payload"]["ruleId"] == ruled["rule"]["id"]


def test_a_denial_recovered_at_boot_writes_its_audit_row(tmp_path: Path, conn: sqlite3.Connection) -> None:
    """Seed 003 §4.13 (``tool_denied``): a host killed after the decision line and before the row changed
    applies the line at boot; the audit row lands in that same transaction, once."""
    add_session(conn, "s")
    conn.execute("INSERT INTO turns(id, session_id, started_at, status) VALUES ('t1', 's', 0, 'running')")
    row, _ = tx(conn)(lambda c: approvals.insert_approval(
        c, request_id="apr_1", session_id="s", turn_id="t1", tool_call_id=None, tool="Bash", args_summary="",
        risk="high", options=approvals.default_options(False), requested_by="ui", expires_at=None, now_ms=NOW))
    transcript = tmp_path / "s.jsonl"
    deny = {"id": "deny", "label": "Deny", "decision": "deny", "remember": "once"}
    transcript.write_bytes(dumps_line(approvals.decision_record(
        "approval", row, status="denied", decided_at_ms=NOW + 5, by="user", responder="ui", option=deny)))
    assert tx(conn)(lambda c: approvals.apply_recorded_decisions(c, lambda sid: transcript, NOW + 9)) == 1
    assert tx(conn)(lambda c: approvals.apply_recorded_decisions(c, lambda sid: transcript, NOW + 9)) == 0
    items, _ = audit.list_rows(conn, session_id="s", kind=None, since=None, until=None, limit=10, cursor=None)
    assert [(i["kind"], i["ts"], i["payload"]["requestId"], i["payload"]["by"]) for i in items] == [
        ("tool_denied", NOW + 5, "apr_1", "user")]


async def test_audit_list_pages_and_filters_by_session_kind_and_time(tmp_path: Path) -> None:
    """Seed 003 §4.13: "Append-only; now indexed and prunable" (``idx_audit_ts``, ``idx_audit_session``):
    ``audit.list`` reads it newest first, by session, kind and time range, with cursors bound to the filter."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            a = (await c.call("session.create", {"title": "a"}))["id"]
            b = (await c.call("session.create", {"title": "b"}))["id"]

            def seed(conn: Any) -> None:
                for i in range(7):
                    audit.record(conn, "tool_execute" if i % 2 else "tool_denied", a if i < 5 else b,
                                 {"n": i}, NOW + 1000 * i)
                audit.record(conn, "turn_interrupted", None, {"n": 7}, NOW + 7000)

            await host.services.db.write(seed, durable=True)
            seen: list[int] = []
            cursor = None
            while True:
                page = await c.call("audit.list", {"sessionId": a, "limit": 2,
                                                   **({"cursor": cursor} if cursor else {})})
                seen += [e["payload"]["n"] for e in page["entries"]]
                cursor = page.get("nextCursor")
                if cursor is None:
                    break
            assert seen == [4, 3, 2, 1, 0]
            kinds = await c.call("audit.list", {"kind": "tool_execute"})
            assert [e["payload"]["n"] for e in kinds["entries"]] == [5, 3, 1]
            window = await c.call("audit.list", {"since": NOW + 2000, "until": NOW + 6000})
            assert [e["payload"]["n"] for e in window["entries"]] == [5, 4, 3, 2]
            everything = await c.call("audit.list", {})
            assert [e["payload"]["n"] for e in everything["entries"]][:2] == [7, 6]
            assert "sessionId" not in everything["entries"][0]
            first = await c.call("audit.list", {"sessionId": a, "limit": 1})
            with pytest.raises(RpcError) as exc:  # a cursor is bound to the filter it was issued for
                await c.call("audit.list", {"sessionId": b, "cursor": first["nextCursor"]})
            assert exc.value.data_code == "INVALID_CURSOR"
            # since inclusive, until exclusive: since == until is the empty range, since after until a mistake
            assert (await c.call("audit.list", {"since": NOW + 2000, "until": NOW + 2000}))["entries"] == []
            with pytest.raises(RpcError) as exc:
                await c.call("audit.list", {"since": NOW + 1, "until": NOW})
            assert exc.value.data_code == "INVALID_PARAMS"


def test_retention_prunes_audit_rows_older_than_90_days(conn: sqlite3.Connection) -> None:
    """Seed 003 §8: "audit_log: prune rows older than 90 days (configurable) at boot"."""
    add_session(conn, "s")
    for age_days, n in ((91, 0), (90, 1), (89, 2), (0, 3)):
        audit.record(conn, "tool_execute", "s", {"n": n}, NOW - age_days * DAY_MS - (1 if n == 0 else 0))
    assert retention(conn, now_ms=NOW)["auditPruned"] == 1
    items, _ = audit.list_rows(conn, session_id=None, kind=None, since=None, until=None, limit=10, cursor=None)
    assert [i["payload"]["n"] for i in items] == [3, 2, 1]
    assert retention(conn, now_ms=NOW, audit_days=30)["auditPruned"] == 2  # configurable


async def test_boot_prunes_old_audit_rows(tmp_path: Path) -> None:
    """Seed 003 §8: "audit_log: prune rows older than 90 days (configurable) at boot" — through a real host
    restart: a row older than 90 days is gone, a recent one stays, the boot report counts the pruned row."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "t"}))["id"]
            now = host.services.now_ms()

            def seed(conn: Any) -> None:
                audit.record(conn, "tool_execute", sid, {"n": "old"}, now - 91 * DAY_MS)
                audit.record(conn, "tool_execute", sid, {"n": "new"}, now - 89 * DAY_MS)

            await host.services.db.write(seed, durable=True)
            assert len((await c.call("audit.list", {"sessionId": sid}))["entries"]) == 2
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            entries = (await c.call("audit.list", {"sessionId": sid}))["entries"]
            assert [e["payload"]["n"] for e in entries] == ["new"]
            status = await c.call("host.status", {})
            assert status["boot"]["retention"]["auditPruned"] == 1


def test_boot_keeps_the_newest_100_runs_in_the_listing_order_when_start_times_tie(conn: sqlite3.Connection) -> None:
    """Seed 003 §8: "task_runs: keep last 100 per task (prune with the same boot pass)". "Last" is the order
    tasks.runs lists and the insert-time cap keeps, (started_at DESC, id DESC): the boot pass ordered by
    started_at alone, so among runs sharing a start time it could drop one of the newest 100 and keep the
    101st (runs an older build recorded, or a task imported with its history)."""
    conn.execute("INSERT INTO scheduled_tasks (id, title, prompt, created_at, updated_at) "
                 "VALUES ('t', 't', 'p', ?, ?)", (NOW, NOW))
    ids = [f"r{i:03d}" for i in range(103)]
    for rid in ids:  # the oldest id first: the table's own order is the reverse of (started_at, id) DESC
        conn.execute("INSERT INTO task_runs (id, task_id, status, started_at) VALUES (?, 't', 'completed', ?)",
                     (rid, NOW))
    assert retention(conn, now_ms=NOW)["taskRunsPruned"] == 3
    kept = [r[0] for r in conn.execute("SELECT id FROM task_runs ORDER BY id DESC")]
    assert kept == sorted(ids, reverse=True)[:100]
