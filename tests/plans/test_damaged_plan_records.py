"""A plan/goal approval whose stored record is damaged (a kind, a status, a permission mode or an execution state
outside its set; SQLite checks a CHECK on writes only) is never answered, approved or announced with a value the
host did not write: ``plans.respond`` and the execution methods of it are CORRUPT_DATA. Before, get_request and
get_execution passed the stored values unchecked: a request whose kind no longer read was approved (the session
switched to agent mode) and answered with that kind."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import trio

from protocol.models_plans import PlansPendingResult
from protocol.models_session import SessionListResult
from store import plans
from store.fence import interruption_fence
from tests.dbkit import NOW, add_session, fresh_db
from tests.hostkit import client_for, inprocess_host
from tests.integrity.test_damaged_listings import damage
from tests.plans.test_executions import approved, contract_session, submit
from tests.turns.turnkit import rpc_error, start


def mode_of(root: Path, sid: str) -> str:
    conn = sqlite3.connect(root / "pi.sqlite")
    try:
        return str(conn.execute("SELECT mode FROM sessions WHERE id = ?", (sid,)).fetchone()[0])
    finally:
        conn.close()


async def test_a_request_whose_kind_is_damaged_is_not_approved(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid, ws = await contract_session(c, tmp_path / "p")
            rid = (await submit(c, sid, ws))["requestId"]
            damage(tmp_path, "UPDATE plan_approvals SET kind = 'plab' WHERE request_id = ?", rid)
            for action in ("approve", "reject"):
                err = await rpc_error(ui.call("plans.respond", {"requestId": rid, "action": action}))
                assert (err.data_code, err.data["requestId"]) == ("CORRUPT_DATA", rid), action
            assert mode_of(tmp_path, sid) == "plan"  # not switched to agent by an approval of an unreadable request


async def test_an_execution_whose_record_is_damaged_is_not_started_or_announced(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid, execution = await approved(c, ui, tmp_path / "p")
            damage(tmp_path, "UPDATE plan_approvals SET target_permission_mode = 'sure' WHERE execution_id = ?",
                   execution)
            await start(c, sid, "t1")
            err = await rpc_error(c.call("plans.startExecution", {"sessionId": sid, "executionId": execution,
                                                                  "turnId": "t1"}))
            assert err.data_code == "CORRUPT_DATA"


async def test_a_session_whose_contract_kind_or_latest_turn_is_damaged_still_lists_without_that_part(
        tmp_path: Path) -> None:
    """Before, session.get and session.list sent the stored kind and turn status as they were: the result no longer
    matched its protocol model and the call answered INTERNAL, session.list for every session."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid, ws = await contract_session(c, tmp_path / "p")
            rid = (await submit(c, sid, ws))["requestId"]
            other = str((await c.call("session.create", {"title": "other"}))["id"])
            await start(c, other, "t1")
            damage(tmp_path, "UPDATE plan_approvals SET kind = 'plab' WHERE request_id = ?", rid)
            damage(tmp_path, "UPDATE turns SET status = 'runnimg' WHERE id = 't1'")
            listed = {s.id: s for s in SessionListResult.model_validate(await ui.call("session.list", {})).sessions}
            held = listed[sid]
            assert (held.state, held.contract_kind, held.unreadable) == ("awaiting_approval", None, ["contractKind"])
            assert (listed[other].latest_turn, listed[other].unreadable) == (None, ["latestTurn"])
            page = await ui.call("session.get", {"sessionId": other, "messageLimit": 1})
            assert page["session"]["unreadable"] == ["latestTurn"] and "latestTurn" not in page["session"]


async def test_an_execution_whose_state_is_damaged_may_be_running_until_its_turn_ends_it(tmp_path: Path) -> None:
    """Before, every check read execution_state IN ('queued', 'running'): a damaged state counted as ended, so the
    session could leave agent mode while the execution may still run, its turn's end left it as it was, and
    plans.finishExecution answered CONFLICT "already ended"."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid, execution = await approved(c, ui, tmp_path / "p")
            await start(c, sid, "t1")
            await c.call("plans.startExecution", {"sessionId": sid, "executionId": execution, "turnId": "t1"})
            damage(tmp_path, "UPDATE plan_approvals SET execution_state = 'runnimg' WHERE execution_id = ?",
                   execution)
            refused = await rpc_error(ui.call("session.update", {"sessionId": sid, "mode": "plan"}))
            assert refused.data_code == "CONFLICT"
            assert refused.data["executionId"] == execution and refused.data["damaged"] is True
            summary = (await ui.call("session.get", {"sessionId": sid, "messageLimit": 1}))["session"]
            assert summary["unreadable"] == ["state"] and "state" not in summary and "contractKind" not in summary
            done = await c.call("plans.finishExecution", {"sessionId": sid, "executionId": execution,
                                                          "turnId": "t1", "outcome": "failed"})
            assert done["approval"]["executionState"] == "failed"
            assert (await ui.call("session.update", {"sessionId": sid, "mode": "plan"}))["mode"] == "plan"


def test_the_turn_end_and_the_boot_fence_end_an_execution_whose_state_is_damaged(tmp_path: Path) -> None:
    conn = fresh_db(tmp_path / "pi.sqlite")
    add_session(conn, "s1")
    conn.execute("PRAGMA ignore_check_constraints = ON")
    for rid, turn in (("r1", "t1"), ("r2", "t2")):
        conn.execute(
            "INSERT INTO plan_approvals(request_id, session_id, turn_id, tool_call_id, kind, plan_json, title, "
            "question, status, created_at, updated_at, artifact_relative_path, artifact_sha256, "
            "artifact_size_bytes, execution_id, execution_state, execution_turn_id) VALUES "
            "(?, 's1', 't0', ?, 'plan', 'm', 't', 'q', 'approved', ?, ?, '.pi/plan/x.md', 'h', 1, ?, 'runnimg', ?)",
            (rid, f"c-{rid}", NOW, NOW, f"e-{rid}", turn))
    ended = plans.settle_for_turn(conn, "s1", "t1", "error", "BOOM", NOW + 1)
    assert [e["executionId"] for e in ended] == ["e-r1"] and ended[0]["executionState"] == "failed"
    assert interruption_fence(conn, now_ms=NOW + 2, boot_id="b")["interruptedExecutions"] == 1
    assert plans.get_execution(conn, "s1", "e-r2")["executionState"] == "interrupted"


def test_the_boot_fence_settles_a_request_whose_status_is_damaged(tmp_path: Path) -> None:
    """Before, the fence interrupted (and expired) plan approvals by ``status = 'pending'`` only: one whose status is
    damaged and never settled (no resolved_at) stayed so across every restart, unanswerable (CORRUPT_DATA). Now one
    past its deadline is expired at it and the others are interrupted; a settled one (resolved_at set) is left."""
    conn = fresh_db(tmp_path / "pi.sqlite")
    for sid in ("s1", "s2", "s3", "s4"):
        add_session(conn, sid, mode="plan")
    conn.execute("PRAGMA ignore_check_constraints = ON")
    for rid, sid, status, expires, resolved in (("r1", "s1", "pendinf", NOW + 1, None),
                                                ("r2", "s2", "pendinf", None, None),
                                                ("r3", "s3", "rejectd", NOW - 5, NOW - 10),
                                                ("r4", "s4", "pending", None, None)):
        conn.execute(
            "INSERT INTO plan_approvals(request_id, session_id, turn_id, tool_call_id, kind, plan_json, title, "
            "question, status, created_at, updated_at, expires_at, resolved_at, artifact_relative_path, "
            "artifact_sha256, artifact_size_bytes) VALUES "
            "(?, ?, 't0', ?, 'plan', 'm', 't', 'q', ?, ?, ?, ?, ?, '.pi/plan/x.md', 'h', 1)",
            (rid, sid, f"c-{rid}", status, NOW - 20, NOW - 20, expires, resolved))
    conn.execute("PRAGMA ignore_check_constraints = OFF")
    assert interruption_fence(conn, now_ms=NOW + 2, boot_id="b")["interruptedApprovals"] == 2
    got = {r[0]: r[1:] for r in conn.execute("SELECT request_id, status, resolved_at FROM plan_approvals")}
    assert got == {"r1": ("expired", NOW + 1), "r2": ("interrupted", NOW + 2), "r3": ("rejectd", NOW - 10),
                   "r4": ("interrupted", NOW + 2)}


async def test_a_pending_request_whose_status_is_damaged_is_named_by_plans_pending(tmp_path: Path) -> None:
    """A plan approval never settled (no resolution time) whose status is outside its set still pends (its
    deadline expires it, the boot fence interrupts it): ``plans.pending`` names it in ``unreadable`` and an answer
    of it is CORRUPT_DATA. Before, the listing read ``status = 'pending'`` only, so it dropped out without a word."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid, ws = await contract_session(c, tmp_path / "p")
            rid = (await submit(c, sid, ws))["requestId"]
            damage(tmp_path, "UPDATE plan_approvals SET status = 'pendinf' WHERE request_id = ?", rid)
            for params in ({"sessionId": sid}, {}):  # one session's, and every session's
                listed = PlansPendingResult.model_validate(await ui.call("plans.pending", params))
                assert (listed.pending, listed.unreadable) == ([], [rid])
            err = await rpc_error(ui.call("plans.respond", {"requestId": rid, "action": "reject"}))
            assert (err.data_code, err.data["requestId"]) == ("CORRUPT_DATA", rid)


async def test_a_pending_request_whose_time_is_damaged_is_named_not_a_failed_listing(tmp_path: Path) -> None:
    """A stored time that is no longer milliseconds: ``plans.pending`` names the request and ``plans.respond`` of
    it is CORRUPT_DATA. Before, its result no longer matched its model: the listing was INTERNAL, hiding all."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid, ws = await contract_session(c, tmp_path / "p")
            rid = (await submit(c, sid, ws))["requestId"]
            damage(tmp_path, "UPDATE plan_approvals SET created_at = 'yesterday' WHERE request_id = ?", rid)
            for params in ({"sessionId": sid}, {}):  # one session's, and every session's
                listed = PlansPendingResult.model_validate(await ui.call("plans.pending", params))
                assert (listed.pending, listed.unreadable) == ([], [rid])
            err = await rpc_error(ui.call("plans.respond", {"requestId": rid, "action": "approve"}))
            assert (err.data_code, err.data["requestId"]) == ("CORRUPT_DATA", rid)
            assert mode_of(tmp_path, sid) == "plan"
