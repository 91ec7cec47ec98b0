"""Seed 003 §4.11: an unattended run never does Plan/Goal work, even when its session is switched to a
contract mode after the run started; a task edit never silently changes the task's mode."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from store import tasks
from store.errors import PlanRequiresInteractiveSession
from tests.dbkit import add_session, fresh_db
from tests.hostkit import client_for, inprocess_host

REFUSED = "PLAN_REQUIRES_INTERACTIVE_SESSION"
T0 = 1_700_000_000_000


async def _err(call: Any) -> RpcError:
    with pytest.raises(RpcError) as exc:
        await call
    return exc.value


def _leftovers(data: Path, ws: Path) -> list[str]:
    intents = [n for n in os.listdir(data / "sessions") if n.endswith(".plan-intent.json")]
    return intents + [f for _, _, files in os.walk(ws / ".pi") for f in files]


async def _turn_ids(c: HostClient, sid: str) -> list[str]:
    return [t["id"] for t in (await c.call("session.listTurns", {"sessionId": sid}))["turns"]]


@pytest.mark.parametrize("kind", ["plan", "goal"])
async def test_a_running_run_whose_session_switched_to_a_contract_mode_is_refused(
        tmp_path: Path, kind: str) -> None:
    ws, data = tmp_path / "ws", tmp_path / "data"
    ws.mkdir()
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "s", "projectPath": str(ws)}))["id"]
            task = await c.call("tasks.create", {"title": "agent", "prompt": "p"})
            run = await c.call("tasks.startRun", {"taskId": task["id"], "sessionId": sid})
            assert run["status"] == "running"
            await c.call("session.update", {"sessionId": sid, "mode": kind})

            err = await _err(c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"}))
            assert err.data_code == REFUSED
            assert await _turn_ids(c, sid) == []
            err = await _err(c.call("plans.submit", {
                "sessionId": sid, "turnId": "t1", "toolCallId": "c1", "kind": kind, "markdown": "# x\n",
                "workspaceRoot": str(ws)}))
            assert err.data_code == REFUSED
            assert _leftovers(data, ws) == []  # no intent, no .pi/<kind>/*.md
            assert (await c.call("plans.pending", {}))["pending"] == []

            # Ended, the run no longer holds the session: interactive Plan/Goal work proceeds.
            await c.call("tasks.finishRun", {"runId": run["id"], "status": "error", "errorCode": REFUSED})
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t2"})
            assert await _turn_ids(c, sid) == ["t2"]
            req = await c.call("plans.submit", {
                "sessionId": sid, "turnId": "t2", "toolCallId": "c2", "kind": kind, "markdown": "# x\n",
                "workspaceRoot": str(ws)})
            assert req["status"] == "pending"


async def test_an_agent_session_keeps_running_its_task_run(tmp_path: Path) -> None:
    """The refusal is only for contract modes: the run's own agent turns are untouched."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "s"}))["id"]
            task = await c.call("tasks.create", {"title": "agent", "prompt": "p"})
            await c.call("tasks.startRun", {"taskId": task["id"], "sessionId": sid})
            turn = await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            assert turn["status"] == "running"


def test_require_interactive_names_the_running_run(tmp_path: Path) -> None:
    conn = fresh_db(tmp_path / "pi.sqlite")
    add_session(conn, "s1")
    tasks.create_task(conn, task_id="a", title="a", prompt="p", now_ms=T0)
    tasks.require_interactive(conn, "s1", "plan", work="start a turn")  # no run yet
    run = tasks.start_run(conn, task_id="a", run_id="r1", session_id="s1", now_ms=T0)
    tasks.require_interactive(conn, "s1", "agent", work="start a turn")
    with pytest.raises(PlanRequiresInteractiveSession) as exc:
        tasks.require_interactive(conn, "s1", "goal", work="start a turn")
    assert exc.value.data == {"sessionId": "s1", "mode": "goal", "runId": run["id"], "taskId": "a"}
    tasks.finish_run(conn, run_id="r1", status="completed", error_code=None, now_ms=T0 + 1)
    tasks.require_interactive(conn, "s1", "goal", work="start a turn")


@pytest.mark.parametrize("mode", ["plan", "goal"])
async def test_a_replacement_config_keeps_the_task_mode(tmp_path: Path, mode: str) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            task = await c.call("tasks.create", {"title": "P", "prompt": "p", "mode": mode, "config": {"notify": 1}})
            for config in ({"notify": 2}, {"notify": 3, "mode": None}):
                kept = await c.call("tasks.update", {"taskId": task["id"], "config": config})
                assert (kept["mode"], kept["config"]["mode"], kept["config"]["notify"]) == (mode, mode,
                                                                                             config["notify"])
            err = await _err(c.call("tasks.startRun", {"taskId": task["id"]}))
            assert err.data_code == REFUSED  # still a contract-mode task: it never runs unattended
            # A mode change is explicit: the top-level field, or the mode inside the replacement config.
            agent = await c.call("tasks.update", {"taskId": task["id"], "mode": "agent", "config": {"notify": 4}})
            assert (agent["mode"], agent["config"]["notify"]) == ("agent", 4)
            back = await c.call("tasks.update", {"taskId": task["id"], "config": {"mode": mode}})
            assert back["mode"] == mode and "notify" not in back["config"]
            switched = await c.call("tasks.update", {"taskId": task["id"], "config": {"mode": "agent", "x": 1}})
            assert switched["mode"] == "agent"
            assert (await c.call("tasks.update", {"taskId": task["id"], "config": {}}))["mode"] == "agent"
