"""The ordering point: a connection's requests reach their session actor in frame order.

Generated from the route table: every session-routed method is pipelined
between two appends to its session (as separate frames and as one batch, with
and without a receipt key), and the session actor must have taken the three
requests in exactly that order, whatever the method awaits before its effect
(a receipt lookup, a target lookup). The delete case is also checked by its
effect: no acknowledged message may live in a deleted session.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.session import SessionActor
from runtime.client import RpcError
from runtime.routes import ROUTES, Via
from tests.hostkit import client_for, inprocess_host, msg
from tests.pipeline.scenarios import SCENARIOS, Scenario, new_session, one_session, with_review_snapshot

SESSION_ROUTED = sorted(name for name, route in ROUTES.items() if route.via is Via.SESSION)

async def with_environment(c: Any, root: Any) -> dict[str, Any]:
    sid = await new_session(c)
    await c.call("session.startTurn", {"sessionId": sid, "turnId": "t-env", "environment": {"version": 1}})
    return {"sid": sid}


READS: dict[str, Scenario] = {
    "session.verifyEnvironment": Scenario(with_environment, lambda v: {"sessionId": v["sid"], "turnId": "t-env"},
                                          lambda v: ("", {})),
    "session.get": Scenario(one_session, lambda v: {"sessionId": v["sid"]}, lambda v: ("", {})),
    "session.queueList": Scenario(one_session, lambda v: {"sessionId": v["sid"]}, lambda v: ("", {})),
    "session.listRevisions": Scenario(one_session, lambda v: {"sessionId": v["sid"]}, lambda v: ("", {})),
    "session.tree": Scenario(one_session, lambda v: {"sessionId": v["sid"]}, lambda v: ("", {})),
    "session.context": Scenario(one_session, lambda v: {"sessionId": v["sid"]}, lambda v: ("", {})),
    "session.export": Scenario(one_session, lambda v: {"sessionId": v["sid"]}, lambda v: ("", {})),
    "review.list": Scenario(one_session, lambda v: {"sessionId": v["sid"]}, lambda v: ("", {})),
    "review.get": Scenario(with_review_snapshot, lambda v: {"sessionId": v["sid"], "snapshotId": v["snap"]},
                           lambda v: ("", {})),
}


def scenario_of(method: str) -> Scenario:
    return SCENARIOS.get(method) or READS[method]


def test_every_session_route_is_covered() -> None:
    assert {m for m in SESSION_ROUTED if m not in SCENARIOS} == set(READS)


def _journal(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str | None]]:
    """(session, method, message id of an append) in the order session actors take their calls."""
    seen: list[tuple[str, str, str | None]] = []
    original = SessionActor.handle_batch

    async def spy(self: SessionActor, batch: list[Any]) -> None:
        for env in batch:
            name = env.msg.op.name
            mid = env.msg.params.message.id if name == "session.appendMessage" else None
            seen.append((self.sid, name, mid))
        await original(self, batch)

    monkeypatch.setattr(SessionActor, "handle_batch", spy)
    return seen


def _target(method: str, params: dict[str, Any], v: dict[str, Any]) -> str:
    return str(params.get("sessionId") or v.get("sid") or "")


@pytest.mark.parametrize("framing", ["frames", "batch"])
@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
@pytest.mark.parametrize("method", SESSION_ROUTED)
async def test_requests_reach_the_actor_in_frame_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       method: str, keyed: bool, framing: str) -> None:
    scenario = scenario_of(method)
    root = tmp_path / "data"
    seen = _journal(monkeypatch)
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host, "c", kind=scenario.kind) as c:
            v = await scenario.setup(c, root)
            params = scenario.params(v)
            if method == "session.create":
                params = {**params, "sessionId": "pipelined"}
            sid = _target(method, params, v)
            if keyed and method in SCENARIOS:  # reads take no receipt key
                params = {**params, "submissionId": f"k-{method}"}
            calls = [
                ("session.appendMessage", {"sessionId": sid, "message": msg("before", "x")}),
                (method, params),
                ("session.appendMessage", {"sessionId": sid, "message": msg("after", "y")}),
            ]
            start = len(seen)
            send = c.pipelined if framing == "frames" else c.batch
            results = await send(calls)
            taken = [(s, name, mid) for s, name, mid in seen[start:] if s == sid or name == method]
            names = [(name, mid) for _, name, mid in taken]
            assert names == [("session.appendMessage", "before"), (method, None if method != "session.appendMessage"
                                                                   else "m1"),
                             ("session.appendMessage", "after")], (method, results)
            if method == "session.create":
                assert isinstance(results[0], RpcError) and results[0].data_code == "SESSION_NOT_FOUND"
                assert not isinstance(results[2], RpcError)
            else:
                assert not isinstance(results[0], RpcError), results[0]
                assert not isinstance(results[1], RpcError), (method, results[1])


def _messages_of(root: Path, sid: str) -> list[str]:
    conn = sqlite3.connect(f"file:{root / 'pi.sqlite'}?mode=ro", uri=True)
    try:
        return [r[0] for r in conn.execute("SELECT id FROM messages WHERE session_id = ?", (sid,))]
    finally:
        conn.close()


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
@pytest.mark.parametrize("framing", ["frames", "batch"])
async def test_delete_then_append_leaves_no_acknowledged_message(tmp_path: Path, keyed: bool, framing: str) -> None:
    """The defect: a keyed delete awaited a receipt lookup before enqueueing; the append overtook it."""
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host) as c:
            sid = await new_session(c)
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m0", "kept?")})
            delete: dict[str, Any] = {"sessionId": sid}
            append: dict[str, Any] = {"sessionId": sid, "message": msg("m1", "late")}
            if keyed:
                delete["submissionId"] = "del-1"
                append["submissionId"] = "app-1"
            send = c.pipelined if framing == "frames" else c.batch
            deleted, appended = await send([("session.delete", delete), ("session.appendMessage", append)])
            assert deleted == {"sessionId": sid, "deleted": True}
            assert isinstance(appended, RpcError) and appended.data_code == "SESSION_NOT_FOUND"
            assert not (root / "sessions" / f"{sid}.jsonl").exists()
            assert _messages_of(root, sid) == []
            with pytest.raises(RpcError) as err:
                await c.call("session.get", {"sessionId": sid})
            assert err.value.data_code == "SESSION_NOT_FOUND"
