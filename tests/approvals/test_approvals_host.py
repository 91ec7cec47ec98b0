"""Pending user requests on a real host: approvals, interactions, permission rules — one test per rule.

The sidecar (clientKind ``agent``) asks, a UI answers. Every event payload is
validated against its model by the test host.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import ClientEvent, HostClient, RpcError
from tests.dbkit import rows
from tests.hostkit import client_for, inprocess_host, msg
from tests.turns.turnkit import end, rpc_error, start

DECISION_PREFIX = b'{"type":"approval_decision"'


def decision_lines(root: Path, sid: str) -> list[dict[str, Any]]:
    data = (root / "sessions" / f"{sid}.jsonl").read_bytes()
    return [json.loads(line) for line in data.splitlines() if line.startswith(DECISION_PREFIX)]


def turn_of(sid: str) -> str:
    return f"t-{sid}"


async def respond_failing_before_commit(host: Any, ui: HostClient, root: Path, params: dict[str, Any]) -> None:
    """``approvals.respond`` whose decision line is fsynced and whose transaction never commits (a fault
    raised before the commit): the request is still pending, its one decision line stands."""
    host.faults.add("approvals.respond.before_commit", action="raise")
    await rpc_error(ui.call("approvals.respond", params))
    host.faults.clear()
    assert rows(root, "SELECT status FROM approvals") == [("pending",)]
    assert len(decision_lines(root, params["sessionId"])) == 1


async def session_with_turn(c: HostClient, root: Path | None = None) -> str:
    fields: dict[str, Any] = {"title": "approvals"}
    if root is not None:
        ws = root.parent / f"{root.name}-project"
        ws.mkdir(exist_ok=True)
        fields["projectPath"] = str(ws)
    sid = str((await c.call("session.create", fields))["id"])
    tid = turn_of(sid)
    await start(c, sid, tid)
    await c.call("session.appendMessage", {"sessionId": sid, "turnId": tid, "message": msg(f"{sid}-u", "go")})
    return sid


async def ask(c: HostClient, sid: str, tool: str = "Bash", tid: str | None = None, **extra: Any) -> dict[str, Any]:
    params = {"sessionId": sid, "turnId": tid or turn_of(sid), "tool": tool, "argsSummary": f"run {tool}",
              "risk": "medium", **extra}
    result: dict[str, Any] = await c.call("approvals.request", params)
    return result


async def answer(c: HostClient, sid: str, rid: str, option: str = "allow_once", **extra: Any) -> Any:
    return await c.call("approvals.respond", {"sessionId": sid, "requestId": rid, "optionId": option, **extra})


async def next_event(c: HostClient, topic: str, limit: float = 5.0) -> ClientEvent:
    with trio.fail_after(limit):
        async for event in c:
            if event.topic == topic:
                return event
    raise AssertionError(f"no {topic} event")


async def test_a_request_waits_pending_and_the_ui_and_the_sidecar_hear_about_it(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as sidecar, \
                client_for(host, "ui", kind="ui") as ui:
            sid = await session_with_turn(sidecar)
            await ui.subscribe(["approval.requested", "approval.resolved"], session_id=sid)
            await sidecar.subscribe(["approval.resolved"], session_id=sid)
            asked = await ask(sidecar, sid, toolCallId="call-1", expiresAt=10**13)
            request = asked["request"]
            assert request["status"] == "pending" and request["requestedBy"] == "sidecar"
            assert [o["id"] for o in request["options"]] == ["allow_once", "allow_session", "deny"]  # no project
            seen = await next_event(ui, "approval.requested")
            assert seen.data["request"]["requestId"] == request["requestId"]
            answered = await answer(ui, sid, request["requestId"])
            assert answered["request"]["status"] == "allowed" and answered["request"]["respondedBy"] == "ui"
            heard = await next_event(sidecar, "approval.resolved")
            assert heard.data["request"]["status"] == "allowed" and heard.data["request"]["optionId"] == "allow_once"


async def test_pending_lists_one_session_or_all_and_hides_expired_rows(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            a = await session_with_turn(c)
            b = await session_with_turn(c)
            ra = (await ask(c, a))["request"]["requestId"]
            rb = (await ask(c, b, expiresAt=host.services.now_ms() + 10**7))["request"]["requestId"]
            await ask(c, b, "Edit", expiresAt=1)  # already past its deadline
            assert [r["requestId"] for r in (await c.call("approvals.pending", {"sessionId": a}))["pending"]] == [ra]
            everywhere = {r["requestId"] for r in (await c.call("approvals.pending", {}))["pending"]}
            assert everywhere == {ra, rb}


async def test_a_request_is_answered_exactly_once(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui-1", kind="ui") as ui1, client_for(host, "ui-2", kind="ui") as ui2:
            sid = await session_with_turn(c)
            rid = (await ask(c, sid))["request"]["requestId"]
            outcomes: list[Any] = [None, None]

            async def send(i: int, ui: HostClient, option: str) -> None:
                try:
                    outcomes[i] = await answer(ui, sid, rid, option)
                except RpcError as exc:
                    outcomes[i] = exc

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send, 0, ui1, "allow_once")
                nursery.start_soon(send, 1, ui2, "deny")
            errors = [o for o in outcomes if isinstance(o, RpcError)]
            assert len(errors) == 1 and errors[0].data_code == "CONFLICT"
            won = next(o for o in outcomes if not isinstance(o, RpcError))
            assert rows(tmp_path, "SELECT status FROM approvals") == [(won["request"]["status"],)]
            assert len(decision_lines(tmp_path, sid)) == 1
            late = await rpc_error(answer(ui1, sid, rid, "allow_once"))
            assert late.data_code == "CONFLICT" and late.data["status"] == won["request"]["status"]


async def test_an_answer_for_another_session_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            a = await session_with_turn(c)
            b = await session_with_turn(c)
            rid = (await ask(c, a))["request"]["requestId"]
            err = await rpc_error(answer(ui, b, rid))
            assert err.data_code == "CONFLICT"
            assert rows(tmp_path, "SELECT status FROM approvals") == [("pending",)]
            assert decision_lines(tmp_path, a) == [] and decision_lines(tmp_path, b) == []


async def test_a_late_answer_is_refused_and_the_request_expires(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid = await session_with_turn(c)
            await c.subscribe(["approval.resolved"], session_id=sid)
            rid = (await ask(c, sid, expiresAt=host.services.now_ms() + 300))["request"]["requestId"]
            await trio.sleep(0.4)
            err = await rpc_error(answer(ui, sid, rid))
            assert err.data_code == "CONFLICT" and err.data["status"] == "expired"
            assert rows(tmp_path, "SELECT status FROM approvals") == [("expired",)]
            assert (await next_event(c, "approval.resolved")).data["request"]["status"] == "expired"
            assert decision_lines(tmp_path, sid) == []


async def test_a_request_past_its_deadline_reads_expired_before_anything_touches_it(tmp_path: Path) -> None:
    """It left ``approvals.pending`` at its deadline; ``session.get``'s decisions did not list it until an
    answer or a restart wrote ``expired``: for that while it was in no read. Since the host's expiry timer
    (``runtime/request_expiry.py``) the row is written ``expired`` at its deadline too."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = await session_with_turn(c)
            deadline = host.services.now_ms() + 300
            rid = (await ask(c, sid, expiresAt=deadline))["request"]["requestId"]
            assert "decisions" not in await c.call("session.get", {"sessionId": sid})  # pending, in time
            await trio.sleep(0.4)
            assert (await c.call("approvals.pending", {"sessionId": sid}))["pending"] == []
            shown = (await c.call("session.get", {"sessionId": sid}))["decisions"]
            assert [(d["requestId"], d["status"], d["resolvedAt"]) for d in shown] == [(rid, "expired", deadline)]
            with trio.fail_after(5):  # the expiry timer's transaction, at the deadline
                while rows(tmp_path, "SELECT status FROM approvals") != [("expired",)]:  # noqa: ASYNC110 - the row is in another thread's database: no event to wait on here
                    await trio.sleep(0.05)
            again = (await c.call("session.get", {"sessionId": sid}))["decisions"]
            assert [(d["requestId"], d["status"], d["resolvedAt"]) for d in again] == [(rid, "expired", deadline)]


async def test_the_sidecar_cannot_answer_its_own_request(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = await session_with_turn(c)
            rid = (await ask(c, sid))["request"]["requestId"]
            err = await rpc_error(answer(c, sid, rid))
            assert err.data_code == "PERMISSION_DENIED"
            assert rows(tmp_path, "SELECT status FROM approvals") == [("pending",)]


async def test_an_option_the_prompt_did_not_offer_is_invalid(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid = await session_with_turn(c)
            options = [{"id": "yes", "decision": "allow"}, {"id": "no", "decision": "deny"}]
            rid = (await ask(c, sid, options=options))["request"]["requestId"]
            err = await rpc_error(answer(ui, sid, rid, "allow_once"))
            assert err.data_code == "INVALID_PARAMS"
            err = await rpc_error(ask(c, sid, "Edit", options=[{"id": "yes", "decision": "allow"}]))
            assert err.data_code == "INVALID_PARAMS"  # no way to deny
            assert (await answer(ui, sid, rid, "no"))["request"]["status"] == "denied"


async def test_the_decision_is_an_approval_decision_line_and_session_get_shows_it(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid = await session_with_turn(c)
            rid = (await ask(c, sid, toolCallId="call-9"))["request"]["requestId"]
            await answer(ui, sid, rid, "deny", submissionId="ui-answer-1")
            [line] = decision_lines(tmp_path, sid)
            assert list(line)[:2] == ["type", "id"] and line["id"] == rid
            assert line["requestKind"] == "approval" and line["status"] == "denied" and line["by"] == "user"
            assert line["turnId"] == turn_of(sid) and line["toolCallId"] == "call-9" and line["tool"] == "Bash"
            assert line["optionId"] == "deny" and line["receipt"]["submissionId"] == "ui-answer-1"
            page = await ui.call("session.get", {"sessionId": sid})
            assert [(d["requestId"], d["status"]) for d in page["decisions"]] == [(rid, "denied")]
            assert rows(tmp_path, "SELECT indexed_len FROM sessions")[0][0] == \
                (tmp_path / "sessions" / f"{sid}.jsonl").stat().st_size  # the index covers the line


async def test_a_remembered_answer_becomes_a_rule_that_answers_at_once(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            a = await session_with_turn(c, tmp_path)
            b = await session_with_turn(c, tmp_path)  # same project
            first = (await ask(c, a))["request"]
            assert "allow_project" in [o["id"] for o in first["options"]]
            answered = await answer(ui, a, first["requestId"], "allow_project")
            rule = answered["rule"]
            assert rule["scope"] == "project" and rule["tool"] == "Bash" and rule["decision"] == "allow"
            await ui.subscribe(["approval.requested", "approval.resolved"], session_id=b)
            at_once = await ask(c, b)
            assert at_once["request"]["status"] == "allowed" and at_once["request"]["respondedBy"] == "rule"
            assert at_once["rule"]["id"] == rule["id"] and at_once["request"]["ruleId"] == rule["id"]
            assert (await next_event(ui, "approval.resolved")).data["request"]["status"] == "allowed"
            [line] = decision_lines(tmp_path, b)
            assert line["by"] == "rule" and line["ruleId"] == rule["id"]
            assert (await ask(c, b, "Edit"))["request"]["status"] == "pending"  # another tool asks
            assert [r["id"] for r in (await c.call("approvals.rules", {"sessionId": b}))["rules"]] == [rule["id"]]
            assert await c.call("approvals.removeRule", {"ruleId": rule["id"]}) == {"removed": True}
            assert (await ask(c, b))["request"]["status"] == "pending"


async def test_the_most_specific_rule_wins(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            a = await session_with_turn(c, tmp_path)
            b = await session_with_turn(c, tmp_path)  # same project
            never = [{"id": "never", "decision": "deny", "remember": "session"}, {"id": "ok", "decision": "allow"}]
            await answer(ui, a, (await ask(c, a, options=never))["request"]["requestId"], "never")
            await answer(ui, b, (await ask(c, b))["request"]["requestId"], "allow_project")
            assert (await ask(c, a, toolCallId="x"))["request"]["status"] == "denied"  # a's own rule first
            assert (await ask(c, b, toolCallId="x"))["request"]["status"] == "allowed"  # the project's
            scopes = {r["scope"] for r in (await c.call("approvals.rules", {"sessionId": a}))["rules"]}
            assert scopes == {"session", "project"}


async def test_only_a_running_turn_can_ask(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = await session_with_turn(c)
            assert (await rpc_error(ask(c, sid, tid="nope"))).data_code == "NOT_FOUND"
            await end(c, sid, turn_of(sid))
            assert (await rpc_error(ask(c, sid))).data_code == "CONFLICT"
            assert rows(tmp_path, "SELECT COUNT(*) FROM approvals") == [(0,)]


async def test_the_same_tool_call_asking_again_gets_its_first_request(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = await session_with_turn(c)
            first = await ask(c, sid, toolCallId="call-1")
            assert await ask(c, sid, toolCallId="call-1") == first
            err = await rpc_error(ask(c, sid, "Edit", toolCallId="call-1"))
            assert err.data_code == "CONFLICT"
            assert rows(tmp_path, "SELECT COUNT(*) FROM approvals") == [(1,)]


async def test_a_turn_end_cancels_what_it_still_asked(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid = await session_with_turn(c)
            rid = (await ask(c, sid))["request"]["requestId"]
            qid = (await c.call("interactions.request", {"sessionId": sid, "turnId": turn_of(sid), "question": "?",
                                                         "allowFreeText": True}))["request"]["requestId"]
            await ui.subscribe(["approval.resolved", "interaction.resolved"], session_id=sid)
            await end(c, sid, turn_of(sid), "aborted")
            statuses = {(await next_event(ui, "approval.resolved")).data["request"]["status"],
                        (await next_event(ui, "interaction.resolved")).data["request"]["status"]}
            assert statuses == {"cancelled"}
            assert (await rpc_error(answer(ui, sid, rid))).data["status"] == "cancelled"
            err = await rpc_error(ui.call("interactions.respond", {"sessionId": sid, "requestId": qid,
                                                                   "answer": {"text": "late"}}))
            assert err.data_code == "CONFLICT"


async def test_a_rewrite_that_cuts_a_running_turn_cancels_what_it_still_asked(tmp_path: Path) -> None:
    """``session.truncateFrom`` aborts the running turn whose reply it cuts; that turn's pending requests
    end with it (``cancelled``, announced), exactly as a turn end does."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid = await session_with_turn(c)
            rid = (await ask(c, sid))["request"]["requestId"]
            await ui.subscribe(["approval.resolved", "turn.ended"], session_id=sid)
            await ui.call("session.truncateFrom", {"sessionId": sid, "messageId": f"{sid}-u"})
            ended = await next_event(ui, "turn.ended")
            assert ended.data["turn"]["id"] == turn_of(sid) and ended.data["turn"]["status"] == "aborted"
            assert (await next_event(ui, "approval.resolved")).data["request"]["status"] == "cancelled"
            assert (await c.call("approvals.pending", {"sessionId": sid})) == {"pending": []}
            assert (await rpc_error(answer(ui, sid, rid))).data["status"] == "cancelled"


async def test_interactions_take_choices_or_free_text_as_the_question_allows(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid = await session_with_turn(c)
            asked = await c.call("interactions.request", {
                "sessionId": sid, "turnId": turn_of(sid), "question": "Which files?", "multiple": True,
                "choices": [{"id": "a", "label": "a.py"}, {"id": "b", "label": "b.py"}]})
            qid = asked["request"]["requestId"]
            assert (await c.call("interactions.pending", {"sessionId": sid}))["pending"][0]["requestId"] == qid

            async def reply(**answer_: Any) -> Any:
                return await ui.call("interactions.respond", {"sessionId": sid, "requestId": qid, "answer": answer_})

            assert (await rpc_error(reply(choiceIds=["c"]))).data_code == "INVALID_PARAMS"
            assert (await rpc_error(reply(text="free"))).data_code == "INVALID_PARAMS"  # no free text here
            assert (await rpc_error(reply())).data_code == "INVALID_PARAMS"
            done = await reply(choiceIds=["a", "b"])
            assert done["request"]["status"] == "answered" and done["request"]["answer"] == {"choiceIds": ["a", "b"]}
            [line] = decision_lines(tmp_path, sid)
            assert line["requestKind"] == "interaction" and line["answer"] == {"choiceIds": ["a", "b"]}
            assert line["question"] == "Which files?"
            err = await rpc_error(c.call("interactions.request", {"sessionId": sid, "turnId": turn_of(sid),
                                                                  "question": "?"}))
            assert err.data_code == "INVALID_PARAMS"  # neither choices nor free text


async def test_a_rewrite_keeps_the_decisions_of_the_messages_it_keeps(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid = await session_with_turn(c)
            kept = (await ask(c, sid))["request"]["requestId"]
            await answer(ui, sid, kept)
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": turn_of(sid),
                                                   "message": msg("later", "a later question")})
            cut = (await ask(c, sid, "Edit"))["request"]["requestId"]
            await answer(ui, sid, cut)
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "later"})
            assert [d["id"] for d in decision_lines(tmp_path, sid)] == [kept]


async def test_a_decision_whose_line_landed_before_a_crash_is_applied_at_boot(tmp_path: Path) -> None:
    """The line is fsynced, the transaction never commits: boot applies it and restores the receipt."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid = await session_with_turn(c, tmp_path)
            rid = (await ask(c, sid))["request"]["requestId"]
            params = {"sessionId": sid, "requestId": rid, "optionId": "allow_project", "submissionId": "ans-1"}
            await respond_failing_before_commit(host, ui, tmp_path, params)
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
            assert host.boot.report["decisionsRecovered"] == 1
            assert rows(tmp_path, "SELECT status, option_id, responded_by FROM approvals") == \
                [("allowed", "allow_project", "ui")]
            assert rows(tmp_path, "SELECT id, scope, tool FROM permission_rules") == [
                (f"rule_{rid}", "project", "Bash")]
            retried = await ui.call("approvals.respond", params)
            assert retried["request"]["status"] == "allowed" and retried["rule"]["id"] == f"rule_{rid}"


@pytest.mark.parametrize("kind", ["approval", "interaction"])
async def test_a_pending_request_of_a_deleted_session_goes_with_it(tmp_path: Path, kind: str) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = await session_with_turn(c)
            if kind == "approval":
                await ask(c, sid)
            else:
                await c.call("interactions.request", {"sessionId": sid, "turnId": turn_of(sid), "question": "?",
                                                      "allowFreeText": True})
            await c.call("session.delete", {"sessionId": sid})
            table = "approvals" if kind == "approval" else "interactions"
            assert rows(tmp_path, f"SELECT COUNT(*) FROM {table}") == [(0,)]
