"""A turn's normalized input bound to its run environment snapshot, checked on recovery (seed 000 §4).

Reproduces: a snapshot recorded for one prompt was accepted by the recovery gate for whatever message
later stood under the turn (an edited or replaced prompt re-ran with the old snapshot), and the host
kept no normalized input to recover a turn whose message never landed.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from store import bindings
from store.errors import CorruptData
from store.snapshots import bind_input, load_snapshot, prepare_input, prepare_snapshot, store_snapshot
from tests.dbkit import NOW, conn  # noqa: F401 - the conn fixture
from tests.hostkit import client_for, inprocess_host
from tests.turns.turnkit import end, rpc_error, start

ENV = {"version": 1, "executionBindings": {"modelId": "sonnet"}}
BLOCKS = [{"type": "text", "text": "refactor the parser"}]


def user(mid: str, blocks: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": mid, "role": "user", "blocks": blocks}


async def test_recovery_refuses_a_snapshot_whose_input_binding_does_not_match(tmp_path: Path) -> None:
    """Seed 000 §4: "Before execution, runTurn stores normalized input and a versioned RunEnvironmentSnapshot
    with a SHA-256 integrity digest. ... Recovery rejects invalid versions, digest mismatch, binding drift,
    or oversized structure" — the transcript's message under the input's id must be the stored input."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = str((await c.call("session.create", {"modelId": "sonnet"}))["id"])
            await start(c, sid, "t1", environment=ENV, input={"messageId": "u1", "blocks": BLOCKS})
            stored = await c.call("session.turnEnvironment", {"turnId": "t1"})
            assert stored["input"]["messageId"] == "u1" and stored["input"]["blocks"] == BLOCKS
            digest = stored["input"]["digest"]
            assert len(digest) == 64
            # before the message landed, recovery runs on the stored input
            ok = await c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t1"})
            assert ok["inputDigest"] == digest
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1", "message": user("u1", BLOCKS)})
            ok = await c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t1"})
            assert ok["inputDigest"] == digest
            # another message under that id: the snapshot is not reused for it
            edited = [{"type": "text", "text": "delete the parser"}]
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": [user("u1", edited)]})
            err = await rpc_error(c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t1"}))
            assert err.data_code == "ENVIRONMENT_DRIFT"
            (found,) = err.data["drift"]
            assert found["field"] == "input" and found["snapshot"] == digest and found["current"] != digest
            # put back exactly: it binds again
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": [user("u1", BLOCKS)]})
            await c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t1"})


async def test_an_input_needs_a_snapshot_and_binds_once(tmp_path: Path) -> None:
    """Seed 000 §4: runTurn "stores normalized input and a versioned RunEnvironmentSnapshot" — together: an
    input without a snapshot is INVALID_PARAMS (nothing is created); a retry of the start with the same
    input is the same turn, another input for it is CONFLICT."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = str((await c.call("session.create", {}))["id"])
            err = await rpc_error(start(c, sid, "t0", input={"messageId": "u1", "blocks": BLOCKS}))
            assert err.data_code == "INVALID_PARAMS"
            assert (await c.call("session.get", {"sessionId": sid}))["session"].get("latestTurn") is None
            first = await start(c, sid, "t1", environment=ENV, input={"messageId": "u1", "blocks": BLOCKS})
            assert await start(c, sid, "t1", environment=ENV, input={"messageId": "u1", "blocks": BLOCKS}) == first
            err = await rpc_error(start(c, sid, "t1", environment=ENV,
                                        input={"messageId": "u1", "blocks": [{"type": "text", "text": "x"}]}))
            assert err.data_code == "CONFLICT"
            await end(c, sid, "t1")


def test_a_damaged_stored_input_is_corrupt_data(conn: sqlite3.Connection) -> None:  # noqa: F811
    """Seed 000 §4: "Recovery rejects ... digest mismatch" — of the stored input as of the snapshot."""
    conn.execute("INSERT INTO sessions(id, created_at, updated_at) VALUES ('s1', 1, 1)")
    conn.execute("INSERT INTO turns(id, session_id, started_at) VALUES ('t1', 's1', 1)")
    store_snapshot(conn, "t1", prepare_snapshot(ENV), NOW)
    bind_input(conn, "t1", prepare_input("u1", BLOCKS))
    assert load_snapshot(conn, "t1")["input"]["blocks"] == BLOCKS
    conn.execute("UPDATE run_snapshots SET input_json = replace(input_json, 'parser', 'lexer')")
    with pytest.raises(CorruptData):
        load_snapshot(conn, "t1")
    with pytest.raises(CorruptData):
        bindings.verify(conn, "s1", "t1", input_record=lambda mid: None)
