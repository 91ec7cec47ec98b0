"""A pending request whose stored record is damaged (only the database holds it) costs that request, never the
others: ``approvals.pending`` / ``interactions.pending`` list the ones that read and name the damaged one in
``unreadable``. Before, both listings answered CORRUPT_DATA, so a person saw none of their pending prompts.

What a person can do with the damaged one: deny it (``approvals.respond`` with ``optionId`` ``deny``, the answer
that is safe whatever was offered), so the turn waiting on it goes on; an allow is refused (what it would allow is
not known). The turn's end cancels it whatever its damage, as it cancels any pending request; before, the end of
that turn answered CORRUPT_DATA, so the turn could not end."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import trio

from protocol.models_approvals import (
    ApprovalRequest,
    ApprovalsPendingResult,
    ApprovalsRespondResult,
    InteractionRequest,
    InteractionsPendingResult,
)
from protocol.models_turns import EndTurnResult
from tests.approvals.test_approvals_host import (
    answer,
    ask,
    decision_lines,
    next_event,
    respond_failing_before_commit,
    session_with_turn,
    turn_of,
)
from tests.dbkit import rows
from tests.hostkit import client_for, inprocess_host
from tests.turns.turnkit import end, rpc_error


def damage(root: Path, table: str, column: str, request_id: str, value: str = '[{"id":"deny","lab') -> None:
    """A changed byte inside the record: a JSON column that no longer parses, or a value outside its CHECK (the
    host wrote neither; SQLite checks a CHECK on writes only, so the row is changed with the checks off)."""
    conn = sqlite3.connect(root / "pi.sqlite")
    try:
        conn.execute("PRAGMA ignore_check_constraints = ON")
        with conn:
            changed = conn.execute(f"UPDATE {table} SET {column} = ? WHERE request_id = ?",
                                   (value, request_id)).rowcount
        assert changed == 1
    finally:
        conn.close()


async def test_a_damaged_pending_approval_is_named_and_can_be_denied(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid = await session_with_turn(c)
            intact = (await ask(c, sid, toolCallId="call-1"))["request"]["requestId"]
            damaged = (await ask(c, sid, toolCallId="call-2"))["request"]["requestId"]
            risky = (await ask(c, sid, toolCallId="call-3"))["request"]["requestId"]
            damage(tmp_path, "approvals", "options_json", damaged)
            damage(tmp_path, "approvals", "risk", risky, "higt")
            for params in ({"sessionId": sid}, {}):  # one session's, and every session's
                listed = ApprovalsPendingResult.model_validate(await ui.call("approvals.pending", params))
                assert [r.request_id for r in listed.pending] == [intact]
                assert sorted(listed.unreadable or []) == sorted([damaged, risky])
            # an allow of what is not known is refused; a deny goes through, and the sidecar hears it
            refused = await rpc_error(answer(ui, sid, damaged, "allow_once"))
            assert refused.data_code == "CORRUPT_DATA"
            await c.subscribe(["approval.resolved"], session_id=sid)
            denied = ApprovalsRespondResult.model_validate(await answer(ui, sid, damaged, "deny"))
            assert (denied.request.request_id, denied.request.status, denied.request.option_id) == (
                damaged, "denied", "deny")
            assert denied.request.options == []  # they no longer read: none is shown
            heard = await next_event(c, "approval.resolved")
            assert heard.data["request"]["requestId"] == damaged and heard.data["request"]["status"] == "denied"
            line = next(rec for rec in decision_lines(tmp_path, sid) if rec["id"] == damaged)
            assert (line["status"], line["optionId"], line["remember"]) == ("denied", "deny", "once")
            # answered once: a second deny is the CONFLICT any answered request gives
            assert (await rpc_error(answer(ui, sid, damaged, "deny"))).data_code == "CONFLICT"
            listed = ApprovalsPendingResult.model_validate(await ui.call("approvals.pending", {"sessionId": sid}))
            assert [r.request_id for r in listed.pending] == [intact] and listed.unreadable == [risky]
            # the intact one answers as before
            assert (await answer(ui, sid, intact))["request"]["status"] == "allowed"


async def test_the_turn_ends_past_damaged_pending_requests_and_cancels_them(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid = await session_with_turn(c)
            asked = await c.call("interactions.request", {
                "sessionId": sid, "turnId": turn_of(sid), "question": "which file?",
                "choices": [{"id": "a", "label": "a.py"}, {"id": "b", "label": "b.py"}]})
            question = asked["request"]["requestId"]
            risky = (await ask(c, sid, toolCallId="call-1"))["request"]["requestId"]
            damage(tmp_path, "interactions", "choices_json", question)
            damage(tmp_path, "approvals", "risk", risky, "higt")
            listed = InteractionsPendingResult.model_validate(await ui.call("interactions.pending", {"sessionId": sid}))
            assert listed.pending == [] and listed.unreadable == [question]
            # its choices no longer read: an answer cannot be checked against them
            refused = await rpc_error(ui.call("interactions.respond", {"sessionId": sid, "requestId": question,
                                                                       "answer": {"choiceIds": ["a"]}}))
            assert refused.data_code == "CORRUPT_DATA"
            await ui.subscribe(["interaction.resolved", "approval.resolved"], session_id=sid)
            ended = EndTurnResult.model_validate(await end(c, sid, turn_of(sid)))
            assert ended.turn.status == "completed"
            # its risk is damaged: cancelled and announced all the same, the risk a stand-in named in `unreadable`
            heard = await next_event(ui, "approval.resolved")
            gone = ApprovalRequest.model_validate(heard.data["request"])
            assert (gone.request_id, gone.status, gone.risk, gone.unreadable) == (risky, "cancelled", "high",
                                                                                   ["risk"])
            heard = await next_event(ui, "interaction.resolved")
            cancelled = InteractionRequest.model_validate(heard.data["request"])
            assert (cancelled.request_id, cancelled.status, cancelled.choices) == (question, "cancelled", [])
            assert cancelled.unreadable == ["choices"]
            for method in ("interactions.pending", "approvals.pending"):
                assert await ui.call(method, {"sessionId": sid}) == {"pending": []}
    conn = sqlite3.connect(tmp_path / "pi.sqlite")
    try:
        assert conn.execute("SELECT status FROM approvals WHERE request_id = ?", (risky,)).fetchone() == (
            "cancelled",)
    finally:
        conn.close()


async def test_an_approval_whose_risk_or_status_is_damaged_can_be_denied_and_its_turn_ends_past_it(
        tmp_path: Path) -> None:
    """Its risk or its status outside its set: a deny goes through (the answer safe whatever the record said),
    the sidecar hears it, the decision line is written; an allow is refused. A damaged status of a request never
    settled (no resolution time) is pending: the turn's end cancels it and announces it. Before, the deny was
    CORRUPT_DATA, the turn's end cancelled a damaged risk without a word and left a damaged status alone."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid = await session_with_turn(c)
            risky = (await ask(c, sid, toolCallId="call-1"))["request"]["requestId"]
            unsure = (await ask(c, sid, toolCallId="call-2"))["request"]["requestId"]
            left = (await ask(c, sid, toolCallId="call-3"))["request"]["requestId"]
            damage(tmp_path, "approvals", "risk", risky, "higt")
            damage(tmp_path, "approvals", "status", unsure, "pendinf")
            damage(tmp_path, "approvals", "status", left, "pendinf")
            await c.subscribe(["approval.resolved"], session_id=sid)
            for rid, field in ((risky, "risk"), (unsure, "status")):
                refused = await rpc_error(answer(ui, sid, rid, "allow_once"))
                assert refused.data_code == "CORRUPT_DATA"
                denied = ApprovalsRespondResult.model_validate(await answer(ui, sid, rid, "deny"))
                assert (denied.request.request_id, denied.request.status, denied.request.option_id) == (
                    rid, "denied", "deny")
                assert denied.request.unreadable == ([field] if field == "risk" else None)
                heard = ApprovalRequest.model_validate((await next_event(c, "approval.resolved")).data["request"])
                assert (heard.request_id, heard.status) == (rid, "denied")
                line = next(rec for rec in decision_lines(tmp_path, sid) if rec["id"] == rid)
                assert (line["status"], line["optionId"]) == ("denied", "deny")
                assert (await rpc_error(answer(ui, sid, rid, "deny"))).data_code == "CONFLICT"
            ended = EndTurnResult.model_validate(await end(c, sid, turn_of(sid)))
            assert ended.turn.status == "completed"
            heard = ApprovalRequest.model_validate((await next_event(c, "approval.resolved")).data["request"])
            assert (heard.request_id, heard.status, heard.unreadable) == (left, "cancelled", None)


async def test_a_host_starts_on_a_damaged_pending_request_and_its_fence_settles_it(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = await session_with_turn(c)
            damaged = (await ask(c, sid, toolCallId="call-1"))["request"]["requestId"]
        damage(tmp_path, "approvals", "options_json", damaged)
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
            assert await ui.call("approvals.pending", {}) == {"pending": []}
            refused = await rpc_error(answer(ui, sid, damaged, "deny"))
            assert refused.data_code == "CONFLICT" and refused.data["status"] == "interrupted"
            assert list((tmp_path / "quarantine").glob("pi.sqlite.corrupt-*")) == []  # no rebuild for one record


async def test_the_expiry_timer_expires_a_damaged_request_and_the_others_after_it(tmp_path: Path) -> None:
    """Before, reading the expired row back for its announcement raised inside the timer's transaction: nothing
    expired, this request nor any other, and the sidecars waiting on them were never told. A request whose status
    is damaged (after the timer read its deadline) is in no index of pending rows: before, the timer looked for
    lapsed requests through that index only, found nothing, and the sidecar waiting on it never heard (until its
    turn ended or a restart); now its wake-ups find it (the in-session path of a real host)."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = await session_with_turn(c)
            await c.subscribe(["approval.resolved"], session_id=sid)
            now = host.services.now_ms()
            damaged = (await ask(c, sid, toolCallId="call-1", expiresAt=now + 3000))["request"]["requestId"]
            unsure = (await ask(c, sid, toolCallId="call-3", expiresAt=now + 3100))["request"]["requestId"]
            intact = (await ask(c, sid, toolCallId="call-2", expiresAt=now + 3200))["request"]["requestId"]
            damage(tmp_path, "approvals", "options_json", damaged)
            damage(tmp_path, "approvals", "status", unsure, "pendinf")
            heard = [(await next_event(c, "approval.resolved", 30)).data["request"] for _ in range(3)]
            assert [(r["requestId"], r["status"], r["resolvedAt"]) for r in heard] == [
                (damaged, "expired", now + 3000), (unsure, "expired", now + 3100), (intact, "expired", now + 3200)]
            assert heard[0]["options"] == [] and heard[1]["options"] != [] and heard[2]["options"] != []
    assert rows(tmp_path, "SELECT request_id, status FROM approvals WHERE request_id = ?", unsure) == [
        (unsure, "expired")]


async def test_a_deny_of_a_damaged_approval_whose_line_landed_before_a_crash_is_applied_at_boot(
        tmp_path: Path) -> None:
    """The deny's decision line is fsynced, its transaction never commits. Before, boot's replay read only the
    pending requests that read: the damaged one kept its line unapplied, the fence interrupted it, and the
    retried deny answered CONFLICT (interrupted) instead of the denial the person gave."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid = await session_with_turn(c, tmp_path)
            rid = (await ask(c, sid))["request"]["requestId"]
            damage(tmp_path, "approvals", "risk", rid, "higt")
            params = {"sessionId": sid, "requestId": rid, "optionId": "deny", "submissionId": "deny-1"}
            await respond_failing_before_commit(host, ui, tmp_path, params)
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
            assert host.boot.report["decisionsRecovered"] == 1
            assert rows(tmp_path, "SELECT status, option_id FROM approvals") == [("denied", "deny")]
            retried = ApprovalsRespondResult.model_validate(await ui.call("approvals.respond", params))
            assert (retried.request.status, retried.request.unreadable) == ("denied", ["risk"])



async def test_a_pending_request_whose_status_is_damaged_is_named_by_the_pending_listings(tmp_path: Path) -> None:
    """A request never settled (no resolution time) whose status is outside its set is still pending (a deny,
    its turn's end, its expiry settle it): the listings name it in ``unreadable``. Before, both listings read
    ``status = 'pending'`` only, so such a request dropped out of them without a word: a person never saw it."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid = await session_with_turn(c)
            intact = (await ask(c, sid, toolCallId="call-1"))["request"]["requestId"]
            unsure = (await ask(c, sid, toolCallId="call-2"))["request"]["requestId"]
            settled = (await ask(c, sid, toolCallId="call-3"))["request"]["requestId"]
            await answer(ui, sid, settled, "deny")
            question = (await c.call("interactions.request", {
                "sessionId": sid, "turnId": turn_of(sid), "question": "which file?",
                "choices": [{"id": "a", "label": "a.py"}]}))["request"]["requestId"]
            damage(tmp_path, "approvals", "status", unsure, "pendinf")
            damage(tmp_path, "approvals", "status", settled, "denief")  # settled: not pending, not listed
            damage(tmp_path, "interactions", "status", question, "pendinf")
            for params in ({"sessionId": sid}, {}):  # one session's, and every session's
                listed = ApprovalsPendingResult.model_validate(await ui.call("approvals.pending", params))
                assert ([r.request_id for r in listed.pending], listed.unreadable) == ([intact], [unsure])
                asked = InteractionsPendingResult.model_validate(await ui.call("interactions.pending", params))
                assert (asked.pending, asked.unreadable) == ([], [question])
            # the one it names can be denied, and then no longer pends
            await answer(ui, sid, unsure, "deny")
            listed = ApprovalsPendingResult.model_validate(await ui.call("approvals.pending", {"sessionId": sid}))
            assert ([r.request_id for r in listed.pending], listed.unreadable) == ([intact], None)


async def test_a_pending_request_whose_time_is_damaged_is_named_not_a_failed_listing(tmp_path: Path) -> None:
    """A stored time that is no longer milliseconds (SQLite keeps any value a column is given): the listings name
    that request in ``unreadable`` and list the others. Before, the result no longer matched its model and the
    whole listing was INTERNAL: every pending prompt hidden by one damaged time."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid = await session_with_turn(c)
            intact = (await ask(c, sid, toolCallId="call-1"))["request"]["requestId"]
            dated = (await ask(c, sid, toolCallId="call-2"))["request"]["requestId"]
            question = (await c.call("interactions.request", {
                "sessionId": sid, "turnId": turn_of(sid), "question": "which file?",
                "choices": [{"id": "a", "label": "a.py"}]}))["request"]["requestId"]
            damage(tmp_path, "approvals", "created_at", dated, "yesterday")
            damage(tmp_path, "interactions", "updated_at", question, "-1")
            for params in ({"sessionId": sid}, {}):  # one session's, and every session's
                listed = ApprovalsPendingResult.model_validate(await ui.call("approvals.pending", params))
                assert ([r.request_id for r in listed.pending], listed.unreadable) == ([intact], [dated])
                asked = InteractionsPendingResult.model_validate(await ui.call("interactions.pending", params))
                assert (asked.pending, asked.unreadable) == ([], [question])
