"""Live replies: ``session.inflight`` previews, ``session.get`` → ``inflight``, ``session.recoverInflight``.

One test per rule. The host validates every event payload against its model
(test hosts run with ``validate_results``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from runtime.client import ClientEvent, HostClient
from store.inflight import promoted_record, read_checkpoint
from tests.dbkit import rows
from tests.hostkit import client_for, inprocess_host, msg
from tests.turns.turnkit import assistant, end, new_session, rpc_error, start

INTERVAL = 0.2


def ckpt(root: Path, sid: str) -> Path:
    return root / "sessions" / f"{sid}.inflight.json"


async def save(c: HostClient, sid: str, tid: str, message: dict[str, Any]) -> Any:
    return await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": tid, "message": message})


async def setup(c: HostClient) -> str:
    sid = await new_session(c)
    await start(c, sid, "t1")
    await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1", "message": msg("u1", "question")})
    return sid


async def events_until(c: HostClient, done: Any, limit: float = 5.0) -> list[ClientEvent]:
    got: list[ClientEvent] = []
    with trio.move_on_after(limit):
        async for event in c:
            got.append(event)
            if done(event):
                break
    return got


async def test_a_subscribed_ui_sees_each_saved_checkpoint_as_a_transient_preview(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path, inflight_event_interval=INTERVAL) as host, \
                client_for(host, "sidecar", kind="agent") as sidecar, client_for(host, "ui", kind="ui") as ui:
            sid = await setup(sidecar)
            await ui.subscribe(["session.inflight"], session_id=sid)
            await save(sidecar, sid, "t1", assistant("a1", "The answer is"))
            [event] = await events_until(ui, lambda e: True)
            assert event.topic == "session.inflight" and event.transient and event.session_id == sid
            assert event.data["turnId"] == "t1" and isinstance(event.data["savedAt"], int)
            message = event.data["message"]
            assert message["id"] == "a1" and message["inflight"] is True
            assert message["blocks"] == [{"type": "text", "text": "The answer is"}]


async def test_previews_coalesce_per_message_the_newest_wins_at_a_bounded_rate(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path, inflight_event_interval=INTERVAL) as host, \
                client_for(host, "sidecar", kind="agent") as sidecar, client_for(host, "ui", kind="ui") as ui:
            sid = await setup(sidecar)
            await ui.subscribe(["session.inflight"], session_id=sid)
            t0 = trio.current_time()
            for i in range(30):  # as fast as the host takes them: far more often than the interval
                await save(sidecar, sid, "t1", assistant("a1", "word " * (i + 1)))
            elapsed = trio.current_time() - t0
            got = await events_until(ui, lambda e: e.data["message"]["blocks"][0]["text"] == "word " * 30)
            texts = [e.data["message"]["blocks"][0]["text"] for e in got]
            assert texts[-1] == "word " * 30  # the newest checkpoint always arrives
            assert len(texts) <= 2 + elapsed / INTERVAL  # at most one per interval, plus the first
            assert len(texts) < 30
            assert [len(t) for t in texts] == sorted(len(t) for t in texts)  # never an older one after a newer


async def test_no_preview_arrives_after_the_final_message(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path, inflight_event_interval=1.0) as host, \
                client_for(host, "sidecar", kind="agent") as sidecar, client_for(host, "ui", kind="ui") as ui:
            sid = await setup(sidecar)
            await ui.subscribe(["session.inflight", "session.message"], session_id=sid)
            await save(sidecar, sid, "t1", assistant("a1", "par"))
            await save(sidecar, sid, "t1", assistant("a1", "partial"))  # throttled: pending for 1 s
            await sidecar.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                         "message": assistant("a1", "partial and final")})
            got = await events_until(ui, lambda e: False, limit=1.5)
            kinds = [(e.topic, e.data["message"]["id"]) for e in got]
            assert kinds == [("session.inflight", "a1"), ("session.message", "a1")]
            assert got[0].cursor <= got[1].cursor


async def test_session_get_returns_the_current_reply_after_the_newest_window(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as sidecar, \
                client_for(host, "ui", kind="ui") as ui:
            sid = await setup(sidecar)
            for i in range(5):
                await sidecar.call("session.appendMessage", {"sessionId": sid, "message": msg(f"x{i}", f"m {i}")})
            page = await ui.call("session.get", {"sessionId": sid, "messageLimit": 3})
            assert "inflight" not in page
            await save(sidecar, sid, "t1", assistant("a1", "half of the answer " * 10))
            page = await ui.call("session.get", {"sessionId": sid, "messageLimit": 3, "contentLimit": 20})
            live = page["inflight"]
            assert live["turnId"] == "t1" and live["sessionId"] == sid
            assert live["message"]["id"] == "a1" and live["message"]["inflight"] is True
            assert live["message"]["blocks"][0]["text"] == ("half of the answer " * 10)[:20]
            assert live["message"]["blocks"][0]["truncated"] is True
            assert [m["id"] for m in page["messages"]] == ["x2", "x3", "x4"]  # not a row of the window
            older = await ui.call("session.get", {"sessionId": sid, "messageLimit": 3, "messageBefore": 3})
            assert older["hasMoreAfter"] and "inflight" not in older  # only with the newest window
            await sidecar.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                         "message": assistant("a1", "the whole answer")})
            page = await ui.call("session.get", {"sessionId": sid, "messageLimit": 3})
            assert "inflight" not in page and page["messages"][-1]["id"] == "a1"


async def test_a_ui_on_a_fresh_actor_gets_the_checkpoint_too(tmp_path: Path) -> None:
    """The cold path (no actor state): the checkpoint file is found, not only a memo."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as sidecar:
            sid = await setup(sidecar)
            await save(sidecar, sid, "t1", assistant("a1", "so far"))
            assert host.kill_actor(f"session:{sid}")
            await trio.sleep(0.1)
            async with client_for(host, "ui", kind="ui") as ui:
                page = await ui.call("session.get", {"sessionId": sid})
            assert page["inflight"]["message"]["blocks"][0]["text"] == "so far"


async def test_recover_inflight_promotes_as_aborted_and_ends_the_running_turn(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid = await setup(c)
            await ui.subscribe(["turn.ended", "session.message"], session_id=sid)
            await save(c, sid, "t1", assistant("a1", "cut off mid"))
            saved = read_checkpoint(ckpt(tmp_path, sid))
            assert saved is not None
            result = await c.call("session.recoverInflight", {"sessionId": sid, "turnId": "t1"})
            assert result["action"] == "promoted" and result["message"]["id"] == "a1"
            assert result["turn"]["status"] == "aborted" and result["turn"]["errorCode"] == "SIDECAR_LOST"
            assert not ckpt(tmp_path, sid).exists()
            # exactly the record the boot sweep writes for the same checkpoint
            expected = promoted_record(saved, turn_completed=False)
            page = await c.call("session.get", {"sessionId": sid})
            last = page["messages"][-1]
            assert {k: last[k] for k in expected if k != "meta"} == {k: v for k, v in expected.items() if k != "meta"}
            assert last["meta"] == expected["meta"] and last["meta"]["status"] == "aborted"
            assert last["meta"]["interrupted"] is True and last["meta"]["recoveredFrom"] == "inflight"
            assert rows(tmp_path, "SELECT turn_id FROM messages WHERE id = 'a1'") == [("t1",)]
            audit = rows(tmp_path, "SELECT payload_json FROM audit_log WHERE kind = 'inflight_promoted'")
            assert json.loads(audit[0][0])["reason"] == "recoverInflight"
            seen = await events_until(ui, lambda e: e.topic == "turn.ended")
            assert [e.topic for e in seen] == ["session.message", "turn.ended"]
            again = await c.call("session.recoverInflight", {"sessionId": sid, "turnId": "t1"})
            assert again["action"] == "none" and again["turn"]["status"] == "aborted"
            assert rows(tmp_path, "SELECT COUNT(*) FROM messages WHERE id = 'a1'") == [(1,)]


async def test_recover_inflight_of_a_completed_turn_promotes_as_complete(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = await setup(c)
            await save(c, sid, "t1", assistant("a1", "whole reply"))
            await end(c, sid, "t1")  # the final append never came
            result = await c.call("session.recoverInflight", {"sessionId": sid})
            assert result["action"] == "promoted" and result["turn"]["status"] == "completed"
            page = await c.call("session.get", {"sessionId": sid})
            assert page["messages"][-1]["meta"]["status"] == "completed"
            assert "interrupted" not in page["messages"][-1]["meta"]


async def test_recover_inflight_only_removes_a_checkpoint_whose_final_row_landed(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = await setup(c)
            await save(c, sid, "t1", assistant("a1", "reply"))
            # the final row's line is durable but the append fails right after its fsync, so the
            # append path never removes the checkpoint; the next request indexes the line
            host.faults.add("append.after_fsync", nth=host.faults.hits("append.after_fsync") + 1)
            await rpc_error(c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                             "message": assistant("a1", "reply")}))
            host.faults.clear()
            assert ckpt(tmp_path, sid).exists()
            result = await c.call("session.recoverInflight", {"sessionId": sid, "turnId": "t1"})
            assert result["action"] == "removed" and result["turn"]["status"] == "aborted"
            assert not ckpt(tmp_path, sid).exists()
            assert rows(tmp_path, "SELECT COUNT(*) FROM messages WHERE id = 'a1'") == [(1,)]


async def test_recover_inflight_refuses_another_turns_checkpoint(tmp_path: Path) -> None:
    # t2's start settles the checkpoint t1 left (boot's way) unless it cannot write it: a full disk there
    with trio.fail_after(30):
        async with inprocess_host(tmp_path, faults_spec="append.before_write:2:enospc") as host, \
                client_for(host, "sidecar", kind="agent") as c:
            sid = await setup(c)
            await save(c, sid, "t1", assistant("a1", "reply"))
            await end(c, sid, "t1", "aborted")  # its checkpoint stays (one running turn per session)
            await start(c, sid, "t2")
            err = await rpc_error(c.call("session.recoverInflight", {"sessionId": sid, "turnId": "t2"}))
            assert err.data_code == "CONFLICT" and err.data["turnId"] == "t1"
            assert ckpt(tmp_path, sid).exists()
            assert rows(tmp_path, "SELECT status FROM turns WHERE id = 't2'") == [("running",)]


async def test_the_next_turn_settles_the_checkpoint_an_ended_turn_left_so_its_recovery_ends_it(
        tmp_path: Path) -> None:
    """A sidecar lost in t2 (the host calls recoverInflight for it when its connection goes) used to get
    CONFLICT for t1's leftover and left t2 running; t2's start settled that leftover already."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = await setup(c)
            await save(c, sid, "t1", assistant("a1", "reply"))
            await end(c, sid, "t1", "aborted")
            await start(c, sid, "t2")
            assert not ckpt(tmp_path, sid).exists()
            page = await c.call("session.get", {"sessionId": sid})
            assert [(m["id"], m.get("meta", {}).get("status")) for m in page["messages"]] == [
                ("u1", None), ("a1", "aborted")]
            got = await c.call("session.recoverInflight", {"sessionId": sid, "turnId": "t2"})
            assert got["action"] == "none" and got["turn"]["status"] == "aborted"
            assert got["turn"]["errorCode"] == "SIDECAR_LOST"


async def test_recover_inflight_quarantines_an_unreadable_checkpoint(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as c:
            sid = await setup(c)
            ckpt(tmp_path, sid).write_bytes(b"{not json")
            result = await c.call("session.recoverInflight", {"sessionId": sid, "turnId": "t1"})
            assert result["action"] == "quarantined" and result["turn"]["status"] == "aborted"
            assert not ckpt(tmp_path, sid).exists()
            assert any(p.name.startswith(f"{sid}.inflight.json.") for p in (tmp_path / "quarantine").iterdir())
