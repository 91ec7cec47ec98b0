"""One approval whose stored record is damaged (a byte of its ``options_json`` changed in the database, which
alone holds it) costs that decision, never the page of messages that shows its turn: ``session.get`` answers
the window, names the damaged request in ``unreadableDecisions`` and shows the other decisions. Before, every
page showing that turn answered CORRUPT_DATA, so the session's acknowledged messages no longer read."""

from __future__ import annotations

from pathlib import Path

import trio

from protocol.models_session import SessionGetResult
from runtime.client import HostClient
from store import approvals
from tests.approvals.test_approvals_host import answer, ask, session_with_turn, turn_of
from tests.approvals.test_damaged_pending import damage
from tests.dbkit import add_session, fresh_db
from tests.hostkit import client_for, inprocess_host, msg


async def test_a_damaged_decision_is_named_and_the_page_still_reads(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid = await session_with_turn(c)
            intact = (await ask(c, sid, toolCallId="call-1"))["request"]["requestId"]
            await answer(ui, sid, intact, "deny")
            damaged = (await ask(c, sid, toolCallId="call-2"))["request"]["requestId"]
            await answer(ui, sid, damaged, "allow_once")
            for i in range(3):
                await c.call("session.appendMessage", {"sessionId": sid, "turnId": turn_of(sid),
                                                       "message": msg(f"{sid}-a{i}", f"after {i}")})
            before = SessionGetResult.model_validate(await ui.call("session.get", {"sessionId": sid}))
            assert before.unreadable_decisions is None and len(before.decisions or []) == 2
            damage(tmp_path, "approvals", "options_json", damaged)
            await check_page(ui, sid, before, intact, damaged)
    # a host started on it (the session's first read there, with no actor running) reads the page the same way
    async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
        await check_page(ui, sid, before, intact, damaged)
        # pending requests (none here) are read as before
        assert (await ui.call("approvals.pending", {"sessionId": sid}))["pending"] == []


async def check_page(ui: HostClient, sid: str, before: SessionGetResult, intact: str, damaged: str) -> None:
    page = SessionGetResult.model_validate(await ui.call("session.get", {"sessionId": sid}))
    assert [m.id for m in page.messages] == [m.id for m in before.messages]
    assert page.total_messages == before.total_messages == 4
    assert page.unreadable_decisions == [damaged]
    assert [d.request_id for d in page.decisions or []] == [intact]


def test_the_store_names_the_damaged_request_and_keeps_the_others(tmp_path: Path) -> None:
    conn = fresh_db(tmp_path / "pi.sqlite")
    add_session(conn, "s1")
    conn.execute("INSERT INTO turns(id, session_id, status, started_at) VALUES ('t1', 's1', 'completed', 1)")
    for rid, options in (("r-ok", '[{"id":"deny","label":"Deny","decision":"deny","remember":"once"}]'),
                         ("r-bad", '[{"id":"deny","lab')):
        conn.execute(
            "INSERT INTO approvals(request_id, session_id, turn_id, tool, args_summary, risk, options_json, "
            "requested_by, status, option_id, created_at, updated_at, resolved_at) "
            "VALUES (?, 's1', 't1', 'Bash', 'run', 'low', ?, 'agent', 'denied', 'deny', 1, 2, 2)", (rid, options))
    found = approvals.decisions_for_turns(conn, "s1", ["t1"], 10)
    assert [d["requestId"] for d in found.items] == ["r-ok"]
    assert found.unreadable == ["r-bad"]
