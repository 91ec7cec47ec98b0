"""Bad input in-flight recovery, compaction checkpoints and the session lifecycle once
accepted or answered oddly: each now gets a clear error and changes nothing (ARCHITECTURE, "Bad input
gets a clear error and changes nothing"). One test per finding, against a real in-process host."""

from __future__ import annotations

from pathlib import Path

import trio

from tests.hostkit import client_for, inprocess_host, msg
from tests.turns.turnkit import assistant, new_session, rpc_error, start


async def test_recover_inflight_naming_another_sessions_turn_is_not_found(tmp_path: Path) -> None:
    """``session.recoverInflight`` with the turnId of another session's turn answered ``action: "none"``, as if
    there were nothing to recover; ``session.endTurn`` of that turn is NOT_FOUND. Now the same NOT_FOUND,
    and the other session's running turn and checkpoint are untouched."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            a, b = await new_session(c, "a"), await new_session(c, "b")
            await start(c, a, "ta")
            await c.call("session.appendMessage", {"sessionId": a, "turnId": "ta", "message": msg("u1", "q")})
            await c.call("session.saveInflightMessage", {"sessionId": a, "turnId": "ta",
                                                         "message": assistant("a1", "partial", turnId="ta")})
            ended = await rpc_error(c.call("session.endTurn", {"sessionId": b, "turnId": "ta",
                                                               "status": "completed"}))
            assert ended.data_code == "NOT_FOUND"
            err = await rpc_error(c.call("session.recoverInflight", {"sessionId": b, "turnId": "ta"}))
            assert err.data_code == ended.data_code
            turns = (await c.call("session.listTurns", {"sessionId": a}))["turns"]
            assert [(t["id"], t["status"]) for t in turns] == [("ta", "running")]
            got = await c.call("session.get", {"sessionId": a})
            assert [m["id"] for m in got["messages"]] == ["u1"] and got["inflight"]["message"]["id"] == "a1"
            unknown = await rpc_error(c.call("session.recoverInflight", {"sessionId": b, "turnId": "nope"}))
            assert unknown.data_code == "NOT_FOUND"
            # the session's own turn is recovered as before
            out = await c.call("session.recoverInflight", {"sessionId": a, "turnId": "ta"})
            assert out["action"] == "promoted" and out["turn"]["status"] == "aborted"


async def test_a_checkpoint_keeping_from_after_its_boundary_is_refused(tmp_path: Path) -> None:
    """Seed 003 §2.1: ``throughMessageId`` is the durable transcript boundary and ``firstKeptMessageId`` the
    first message the summary keeps (``m2`` through ``m3`` in the seed's line): a first kept message further
    than one past the boundary (m3 with m1: m2 neither summarized nor kept) describes no context.
    INVALID_PARAMS naming the field, no line written; up to the message right after the boundary is kept."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            for i in (1, 2, 3):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"text {i}")})
            bad = {"id": "cp1", "summary": "s", "tokensBefore": 10, "firstKeptMessageId": "m3",
                   "throughMessageId": "m1"}
            err = await rpc_error(c.call("session.appendCompaction", {"sessionId": sid, "compaction": bad}))
            assert err.data_code == "INVALID_PARAMS" and err.data.get("field") == "compaction.firstKeptMessageId"
            assert (await c.call("session.get", {"sessionId": sid})).get("compactions", []) == []
            for first, through in (("m2", "m3"), ("m3", "m3"), ("m2", "m1")):
                good = {"id": f"cp-{first}" + ("-m1" if through == "m1" else ""), "summary": "s", "tokensBefore": 10,
                        "firstKeptMessageId": first, "throughMessageId": through}
                await c.call("session.appendCompaction", {"sessionId": sid, "compaction": good})
            got = await c.call("session.get", {"sessionId": sid})
            assert [cp["id"] for cp in got["compactions"]] == ["cp-m2", "cp-m3", "cp-m2-m1"]


async def test_a_task_run_finished_completed_with_an_error_code_is_refused(tmp_path: Path) -> None:
    """``session.endTurn`` refuses ``errorCode`` on a completed turn (INVALID_PARAMS); ``tasks.finishRun`` stored
    a ``completed`` run carrying an ``errorCode``, a run that both succeeded and failed. Now the same
    INVALID_PARAMS naming ``errorCode``, the run still running; an error or aborted run keeps its code."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            task = await c.call("tasks.create", {"title": "T", "prompt": "p"})
            await c.call("tasks.startRun", {"taskId": task["id"], "runId": "r1"})
            err = await rpc_error(c.call("tasks.finishRun", {"runId": "r1", "status": "completed",
                                                             "errorCode": "E_X"}))
            assert err.data_code == "INVALID_PARAMS" and "errorCode" in str(err.data), err.data
            runs = (await c.call("tasks.runs", {"taskId": task["id"]}))["runs"]
            assert [(r["id"], r["status"], r.get("errorCode")) for r in runs] == [("r1", "running", None)]
            done = await c.call("tasks.finishRun", {"runId": "r1", "status": "aborted", "errorCode": "E_X"})
            assert (done["status"], done["errorCode"]) == ("aborted", "E_X")
