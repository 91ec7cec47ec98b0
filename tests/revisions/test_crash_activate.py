"""A branch switch cut after its rewrite, before its rows changed: the retry's answer is the switch's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import ClientClosed, HostClient, open_client
from tests.hostkit import call_killed_at, client_for, inprocess_host, msg, start_host_process


@pytest.mark.parametrize("point", ["rewrite.after_rename", "session.activateRevision.before_commit"])
async def test_an_activate_revision_retried_after_a_kill_answers_the_rows_it_left(tmp_path: Path, point: str) -> None:
    """Boot rebuilt the switch's answer from its header receipt while the branch rows were still as
    before the switch (the DB writer never ran the handler's step): the retry answered
    [{1, isActive: false}] for good, where listRevisions said [{1, active}, {2}]."""
    root = tmp_path / "data"
    params = {"rootUserId": "u1", "revisionIndex": 1, "submissionId": "K2"}
    with trio.fail_after(90):
        async with inprocess_host(root) as host, client_for(host, "crash") as c:
            sid = (await c.call("session.create", {"title": "t"}))["id"]
            for m in (msg("u0", "q0"), msg("a0", "r0", role="assistant"), msg("u1", "q1"),
                      msg("a1", "r1", role="assistant")):
                await c.call("session.appendMessage", {"sessionId": sid, "message": m})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate",
                                                  "submissionId": "K1"})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a1b", "r1b", role="assistant")})
        crashing = start_host_process(root, env={"RT_CRASHPOINT": f"{point}:1"})
        try:
            async with open_client(crashing.url, crashing.token, client_id="crash", client_kind="test") as c:
                await c.call("session.activateRevision", {"sessionId": sid, **params})
        except (ClientClosed, OSError):
            pass
        await trio.to_thread.run_sync(lambda: crashing.proc.communicate(timeout=30))
        assert crashing.proc.returncode == -9
        async with inprocess_host(root) as host, client_for(host, "crash") as c:
            again = await c.call("session.activateRevision", {"sessionId": sid, **params})
            listed = (await c.call("session.listRevisions", {"sessionId": sid, "rootUserId": "u1"}))["revisions"]
            assert [(r["revisionIndex"], r["isActive"]) for r in again["revisions"]] == [(1, True), (2, False)]
            assert again["revisions"] == listed
            assert [m["id"] for m in (await c.call("session.get", {"sessionId": sid}))["messages"]] == \
                ["u0", "a0", "u1", "a1"]


async def _nested_switch_setup(c: HostClient, sid: str) -> None:
    """q1's branch B holds q2 with two replies (b2, then the newer b2x); b2 chosen and grown (q3 deleted, a3),
    then q1 switched to its branch A: switching back to B follows q2's newest reply (seed 000 §3.2)."""
    steps: list[tuple[str, dict[str, Any]]] = [
        ("m", msg("q1", "first question")), ("m", msg("a1", "reply A", role="assistant")),
        ("cut", {"messageId": "a1"}), ("m", msg("b1", "reply B", role="assistant")),
        ("m", msg("q2", "second question")), ("m", msg("b2", "second reply", role="assistant")),
        ("cut", {"messageId": "b2"}), ("m", msg("b2x", "second reply, newest", role="assistant")),
        ("switch", {"rootUserId": "q2", "revisionIndex": 1}), ("m", msg("q3", "third question")),
        ("m", msg("a3", "third reply", role="assistant")), ("delete", {"messageId": "q3"}),
        ("switch", {"rootUserId": "q1", "revisionIndex": 1})]
    methods = {"m": "session.appendMessage", "cut": "session.truncateFrom", "switch": "session.activateRevision",
               "delete": "session.deleteMessage"}
    for kind, body in steps:
        params = {"sessionId": sid, **({"message": body} if kind == "m" else body)}
        if kind == "cut":
            params["mode"] = "regenerate"
        await c.call(methods[kind], params)


@pytest.mark.parametrize(("point", "nth"), [("revisions.after_write", 1), ("revisions.after_write", 2),
                                            ("rewrite.after_rename", 1), ("session.activateRevision.before_commit", 1)])
async def test_a_switch_that_follows_the_newest_descendant_killed_midway_is_finished_once_by_its_retry(
        tmp_path: Path, point: str, nth: int) -> None:
    """The switch back to B stores the q2 variant it leaves (b2 with q3 deleted and a3) before the rewrite that
    puts q2's newest reply b2x live. Killed after the leaving branch A's line, after that line (the second),
after the rename, or before the commit, its
    keyed retry answers the switch, the history follows b2x, and the b2 variant comes back whole (q3 still
    deleted), its line written once."""
    root = tmp_path / "data"
    root.mkdir()
    with trio.fail_after(90):
        async with inprocess_host(root) as host, client_for(host, "crash") as c:
            sid = str((await c.call("session.create", {"title": "t"}))["id"])
            await _nested_switch_setup(c, sid)
        params = {"sessionId": sid, "rootUserId": "q1", "revisionIndex": 2, "submissionId": "back-to-B"}
        await call_killed_at(root, point, "session.activateRevision", params, nth=nth, client_id="crash",
                             client_kind="test")
        async with inprocess_host(root) as host, client_for(host, "crash") as c:
            again = await c.call("session.activateRevision", params)
            assert [(r["revisionIndex"], r["isActive"]) for r in again["revisions"]] == [(1, False), (2, True)]
            ctx = await c.call("session.context", {"sessionId": sid})
            assert [m["id"] for m in ctx["messages"]] == ["q1", "b1", "q2", "b2x"]
            listed = (await c.call("session.listRevisions", {"sessionId": sid, "rootUserId": "q2"}))["revisions"]
            assert [(r["revisionIndex"], r["isActive"]) for r in listed] == [(1, False), (2, True)]
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "q2", "revisionIndex": 1})
            page = (await c.call("session.get", {"sessionId": sid}))["messages"]
            assert [(m["id"], bool(m.get("deleted"))) for m in page] == [
                ("q1", False), ("b1", False), ("q2", False), ("b2", False), ("q3", True), ("a3", False)]
        lines = [json.loads(line) for line in (root / "sessions" / f"{sid}.revisions.jsonl").read_text().splitlines()]
        grown = [ln for ln in lines if ln.get("type") == "revision" and ln["rootUserId"] == "q2"
                 and ln["revisionIndex"] == 1 and [m["id"] for m in ln["messages"]] == ["q2", "b2", "q3", "a3"]]
        assert len(grown) == 1
