"""session.context's latest Turn context, through the real gateway (seed 000 §4).

"buildSessionContext reverses the leaf-to-root path, omits tombstones and system
notices, and produces provider-neutral messages plus the latest Turn context."
A turn's context is the run environment snapshot ``session.startTurn`` stored;
the latest is that of the newest turn on the active branch (``store/context.py``).
Every result is checked against its wire model and the committed, closed schema.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from tests.hostkit import client_for, inprocess_host, msg
from tests.protocol.test_results_validate import check


def env(prompt: str) -> dict[str, Any]:
    return {"version": 1, "systemPrompt": prompt, "model": {"id": "m-test"}}


async def context(c: HostClient, sid: str) -> dict[str, Any]:
    got = await c.call("session.context", {"sessionId": sid})
    check("session.context", got)
    return got


def prompt_of(ctx: dict[str, Any]) -> tuple[str, str] | None:
    tc = ctx["turnContext"]
    return None if tc is None else (tc["turnId"], tc["snapshot"]["systemPrompt"])


async def start(c: HostClient, sid: str, turn_id: str, prompt: str | None, **extra: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"sessionId": sid, "turnId": turn_id, **extra}
    if prompt is not None:
        params["environment"] = env(prompt)
    return await c.call("session.startTurn", params)


async def end(c: HostClient, sid: str, turn_id: str, status: str = "completed") -> None:
    await c.call("session.endTurn", {"sessionId": sid, "turnId": turn_id, "status": status,
                                     "createNotification": False})


async def exchange(c: HostClient, sid: str, turn_id: str, uid: str, aid: str, prompt: str | None) -> None:
    """One whole turn: start (with a snapshot when ``prompt``), user and assistant message, end."""
    await start(c, sid, turn_id, prompt)
    await c.call("session.appendMessage", {"sessionId": sid, "message": msg(uid, f"q {uid}", turnId=turn_id)})
    await c.call("session.appendMessage",
                 {"sessionId": sid, "message": msg(aid, f"a {aid}", role="assistant", turnId=turn_id)})
    await end(c, sid, turn_id)


async def test_context_returns_the_latest_turn_context(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="agent") as c:
            sid = (await c.call("session.create", {}))["id"]
            assert (await context(c, sid))["turnContext"] is None  # no turn yet
            started = await start(c, sid, "t1", "one")
            # the running turn is the latest even before its first message (what the model is about to get)
            ctx = await context(c, sid)
            assert prompt_of(ctx) == ("t1", "one")
            assert ctx["turnContext"]["digest"] == started["environmentDigest"]
            assert ctx["turnContext"]["version"] == 1
            assert ctx["turnContext"]["snapshot"]["model"] == {"id": "m-test"}
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u1", "q", turnId="t1")})
            await c.call("session.appendMessage",
                         {"sessionId": sid, "message": msg("a1", "a", role="assistant", turnId="t1")})
            await end(c, sid, "t1")
            assert prompt_of(await context(c, sid)) == ("t1", "one")

            # t2 is tied to the branch only by its bound input (the message carries no turnId)
            blocks = [{"type": "text", "text": "q2"}]
            await start(c, sid, "t2", "two", input={"messageId": "u2", "blocks": blocks})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u2", "q2")})
            await end(c, sid, "t2", "aborted")
            ctx = await context(c, sid)
            assert prompt_of(ctx) == ("t2", "two")
            assert ctx["turnContext"]["input"]["messageId"] == "u2"
            assert ctx["turnContext"]["input"]["blocks"] == blocks

            # a later turn without a snapshot has no context: the latest stays t2's
            await exchange(c, sid, "t3", "u3", "a3", None)
            assert prompt_of(await context(c, sid)) == ("t2", "two")

            await exchange(c, sid, "t4", "u4", "a4", "four")
            assert prompt_of(await context(c, sid)) == ("t4", "four")
            # a tombstone hides the messages, not the turn they ran in; a checkpoint moves the messages only
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "a4"})
            await c.call("session.appendCompaction", {"sessionId": sid, "compaction": {
                "id": "c1", "summary": "so far", "throughMessageId": "a3", "tokensBefore": 10}})
            ctx = await context(c, sid)
            assert [m["id"] for m in ctx["messages"]] == ["c1", "u4"]
            assert prompt_of(ctx) == ("t4", "four")


async def test_turn_context_follows_the_active_branch(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="agent") as c:
            sid = (await c.call("session.create", {}))["id"]
            await exchange(c, sid, "t1", "u1", "a1", "one")
            await exchange(c, sid, "t2", "u2", "a2", "two")
            assert prompt_of(await context(c, sid)) == ("t2", "two")
            # regenerate a2 under a new turn: u2 (t2) stays, the new reply is t3's
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u2"})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a2", "mode": "regenerate"})
            assert prompt_of(await context(c, sid)) == ("t2", "two")
            await start(c, sid, "t3", "three")
            await c.call("session.appendMessage",
                         {"sessionId": sid, "message": msg("a2b", "b", role="assistant", turnId="t3")})
            await end(c, sid, "t3")
            assert prompt_of(await context(c, sid)) == ("t3", "three")
            # switching back to the first variant: t3 is only on an archived branch now
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u2", "revisionIndex": 1})
            ctx = await context(c, sid)
            assert [m["id"] for m in ctx["messages"]] == ["u1", "a1", "u2", "a2"]
            assert prompt_of(ctx) == ("t2", "two")
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u2", "revisionIndex": 2})
            assert prompt_of(await context(c, sid)) == ("t3", "three")
            # editing u2 leaves u1/a1: the latest turn on the branch is t1 again
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u2", "mode": "edit"})
            ctx = await context(c, sid)
            assert [m["id"] for m in ctx["messages"]] == ["u1", "a1"]
            assert prompt_of(ctx) == ("t1", "one")
            await start(c, sid, "t4", "four")
            assert prompt_of(await context(c, sid)) == ("t4", "four")


async def test_turn_context_survives_a_restart(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="agent") as c:
            sid = (await c.call("session.create", {}))["id"]
            await exchange(c, sid, "t1", "u1", "a1", "one")
            await exchange(c, sid, "t2", "u2", "a2", "two")
            before = await context(c, sid)
            assert prompt_of(before) == ("t2", "two")
            # a turn still running when the host stops: the boot fence ends it, its message keeps it latest
            await start(c, sid, "t3", "three")
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u3", "q3", turnId="t3")})
            running = await context(c, sid)
            assert prompt_of(running) == ("t3", "three")
        async with inprocess_host(tmp_path) as host, client_for(host, kind="agent") as c:
            assert _turn_status(tmp_path, "t3") == "aborted"  # the boot fence ended it
            after = await context(c, sid)
            assert after == running
            turn = await c.call("session.turnEnvironment", {"turnId": "t3"})
            assert after["turnContext"]["digest"] == turn["digest"]
            assert after["turnContext"]["snapshot"] == turn["snapshot"]


def _turn_status(root: Path, turn_id: str) -> str:
    conn = sqlite3.connect(f"file:{root / 'pi.sqlite'}?mode=ro", uri=True)
    try:
        return str(conn.execute("SELECT status FROM turns WHERE id = ?", (turn_id,)).fetchone()[0])
    finally:
        conn.close()


def _tamper(root: Path) -> None:
    conn = sqlite3.connect(root / "pi.sqlite")
    try:
        with conn:
            conn.execute("UPDATE run_snapshots SET snapshot_json = replace(snapshot_json, '\"two\"', '\"owt\"') "
                         "WHERE turn_id = 't2'")
    finally:
        conn.close()


async def test_a_tampered_latest_turn_context_is_corrupt_data(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="agent") as c:
            sid = (await c.call("session.create", {}))["id"]
            await exchange(c, sid, "t1", "u1", "a1", "one")
            await exchange(c, sid, "t2", "u2", "a2", "two")
        _tamper(tmp_path)
        async with inprocess_host(tmp_path) as host, client_for(host, kind="agent") as c:
            with pytest.raises(RpcError) as err:
                await c.call("session.context", {"sessionId": sid})
            assert err.value.data_code == "CORRUPT_DATA"
            # a newer turn's snapshot supersedes it
            await exchange(c, sid, "t3", "u3", "a3", "three")
            assert prompt_of(await context(c, sid)) == ("t3", "three")
