"""A turn whose stored status is damaged (a value outside its set, written by nothing the host runs) while it
runs "may still be running", as a task run with a damaged status does (tests/tasks/test_damaged_run_status.py):
a second turn of its session is refused (CONFLICT naming it, ``data.damaged``) and the queue hands nothing out
under it, instead of a second turn running beside it. The ways out: its end settles it (``session.endTurn``
accepts it), the boot fence aborts it, or the record is repaired. Before, these checks read ``status =
'running'`` only: a damaged status counted as ended, a second turn started, and the damaged turn could neither
be ended (CORRUPT_DATA) nor was it fenced."""

from __future__ import annotations

from pathlib import Path

import trio

from store import turns
from store.fence import interruption_fence
from tests.dbkit import NOW, add_session, fresh_db
from tests.hostkit import client_for, inprocess_host
from tests.integrity.test_damaged_listings import damage
from tests.turns.turnkit import end, new_session, rpc_error, start

BAD = "runnimg"


async def test_a_turn_with_a_damaged_status_holds_its_session_until_its_end_settles_it(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = await new_session(c)
            await start(c, sid, "t1")
            damage(tmp_path, "UPDATE turns SET status = ? WHERE id = 't1'", BAD)
            refused = await rpc_error(start(c, sid, "t2"))
            assert refused.data_code == "CONFLICT"
            assert refused.data["runningTurnId"] == "t1" and refused.data["damaged"] is True
            await c.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl"})
            await c.call("session.queuePush", {"sessionId": sid, "principal": "ui", "content": "next",
                                               "permissionMode": "ask"})
            took = await c.call("session.queueTake", {"sessionId": sid, "controllerId": "ctl"})
            assert took == {"entry": None, "reason": "turnRunning"}
            ended = await end(c, sid, "t1", "aborted")
            assert ended["turn"]["status"] == "aborted"
            assert (await start(c, sid, "t2"))["status"] == "running"


def test_the_boot_fence_aborts_a_turn_whose_status_is_damaged(tmp_path: Path) -> None:
    conn = fresh_db(tmp_path / "pi.sqlite")
    add_session(conn, "s1")
    turns.start_turn(conn, session_id="s1", turn_id="t1", provider_id=None, model_id=None, snapshot=None, now_ms=NOW)
    conn.execute("PRAGMA ignore_check_constraints = ON")
    assert conn.execute("UPDATE turns SET status = ? WHERE id = 't1'", (BAD,)).rowcount == 1
    assert interruption_fence(conn, now_ms=NOW + 1, boot_id="b")["abortedTurns"] == ["t1"]
    turn = turns.get_turn(conn, "t1")
    assert turn is not None and (turn["status"], turn["errorCode"]) == ("aborted", turns.INTERRUPTED)
