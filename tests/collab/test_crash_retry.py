"""collab.* killed at each fault point, restarted, retried: one effect and the first try's answer (§11.21).

A `pi-host serve` process SIGKILLs itself at a named point (``RT_CRASHPOINT``) inside the call; a host
is started on its data directory in this process and the same call is retried: with the same clientId
+ submissionId, then without a submissionId (the same deliveryId + turnId). collab.begin writes the
target's input line before its ledger commit: a kill between the two left the line, the delivery
unbound (still queued and held with its admission, or interrupted once boot consumed the admission
its cut turn had taken), and every retry was CONFLICT (the restart aborted the turn). Now the line is
the proof that its turn began the delivery: boot (or the first begin that finds the line) records what
the ledger lacks, the retry answers what the first try answered, and no other turn can begin the
delivery again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import ClientClosed, ClientEvent, HostClient, RpcError, open_client
from runtime.datadir import DataDir
from tests.hostkit import client_for, inprocess_host, start_host_process

SRC, TGT, CLIENT = "src", "tgt", "controller-1"
# after the input line is durable (before the commit, or after it): the begin has happened
AFTER_LINE = ["append.after_write", "append.after_fsync", "queue.between_effects", "collab.begin.before_commit",
              "collab.begin.after_commit"]


async def _setup(root: Path) -> str:
    """Two sessions and one queued delivery (with its admission in the target's queue)."""
    async with inprocess_host(root) as host, client_for(host, CLIENT, kind="agent") as c:
        for sid in (SRC, TGT):
            await c.call("session.create", {"sessionId": sid, "title": sid})
        out = await c.call("collab.deliver", {"pluginId": "team", "sourceSessionId": SRC, "targetSessionId": TGT,
                                              "kind": "task", "content": "review it", "idempotencyKey": "k1",
                                              "notifyOnCompletion": True})
        return str(out["delivery"]["id"])


async def _killed_during(root: Path, point: str, steps: list[tuple[str, dict[str, Any]]]) -> None:
    """Run ``steps`` on a host process that SIGKILLs itself at the first hit of ``point`` (in the last step)."""
    crashing = start_host_process(root, env={"RT_CRASHPOINT": f"{point}:1"})
    with trio.fail_after(60):
        try:
            async with open_client(crashing.url, crashing.token, client_id=CLIENT, client_kind="agent") as c:
                for method, params in steps:
                    await c.call(method, params)
        except (ClientClosed, OSError):
            pass
        await trio.to_thread.run_sync(lambda: crashing.proc.communicate(timeout=30))
    assert crashing.proc.returncode == -9, f"the host did not die at {point}"


def _begin(did: str, turn: str = "t1", **extra: Any) -> tuple[str, dict[str, Any]]:
    return "collab.begin", {"sessionId": TGT, "deliveryId": did, "turnId": turn, **extra}


def _turn_steps(did: str, taken: bool) -> list[tuple[str, dict[str, Any]]]:
    """The controller's turn t1 in the target (having taken the delivery's admission first, or not)."""
    control = {"sessionId": TGT, "controllerId": "ctl"}
    steps = [("session.queueAttach", control), ("session.queueTake", control)] if taken else []
    return [*steps, ("session.startTurn", {"sessionId": TGT, "turnId": "t1"})]


def _input_lines(root: Path, did: str) -> list[dict[str, Any]]:
    lines = DataDir(root).transcript(TGT).read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [r for r in records if r.get("type") == "message"
            and (r.get("meta") or {}).get("sessionMessage", {}).get("deliveryId") == did]


async def _events_until_marker(c: HostClient, ui: HostClient) -> list[ClientEvent]:
    """The events ``ui`` got so far: a rename of the target is the marker that ends them."""
    await c.call("session.rename", {"sessionId": TGT, "title": "marker"})
    got: list[ClientEvent] = []
    with trio.fail_after(10):
        async for event in ui:
            if event.topic == "session.updated":
                return got
            got.append(event)
    return got


async def _rpc_error(coro: Any) -> RpcError:
    with pytest.raises(RpcError) as info:
        await coro
    return info.value


def _assert_first_answer(answer: dict[str, Any], did: str) -> None:
    """What the first try answered: the delivery running in t1 since its input row, and that row."""
    delivery, message = answer["delivery"], answer["message"]
    assert (delivery["id"], delivery["status"], delivery["turnId"]) == (did, "running", "t1")
    assert (message["id"], message["sessionId"], message["turnId"], message["role"]) == \
        (f"collab-{did}", TGT, "t1", "user")
    assert delivery["updatedAt"] == message["createdAt"]
    assert "result" not in delivery and "callbackId" not in delivery


@pytest.mark.parametrize("taken", [False, True], ids=["admission-queued", "admission-taken"])
@pytest.mark.parametrize("point", AFTER_LINE)
async def test_a_begin_killed_after_its_input_line_is_retried_to_one_effect_and_its_answer(
        tmp_path: Path, point: str, taken: bool) -> None:
    did = await _setup(tmp_path)
    keyed = _begin(did, submissionId="begin-1")
    await _killed_during(tmp_path, point, [*_turn_steps(did, taken), keyed])
    assert len(_input_lines(tmp_path, did)) == 1  # the line was durable before the kill
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, CLIENT, kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            await ui.subscribe(["collab.delivery", "session.queue", "session.message", "session.updated"],
                               session_id=TGT)
            first = await c.call(*keyed)
            _assert_first_answer(first, did)
            assert await c.call(*_begin(did)) == first  # the same deliveryId + turnId, no submissionId
            assert await c.call(*keyed) == first
            events = await _events_until_marker(c, ui)
            # exactly one effect: one input line, the delivery bound to t1 once (cut with its turn), no admission
            assert len(_input_lines(tmp_path, did)) == 1
            got = await c.call("collab.get", {"deliveryId": did})
            assert (got["status"], got["turnId"]) == ("interrupted", "t1")
            assert (await c.call("session.queueList", {"sessionId": TGT}))["entries"] == []
            page = await c.call("session.get", {"sessionId": TGT, "full": True})
            assert [m["id"] for m in page["messages"] if m.get("sessionMessage")] == [f"collab-{did}"]
            # boot recorded the cut begin (or the commit had): the retries change nothing more
            assert not [e for e in events if e.topic == "collab.delivery"]
            assert not [e for e in events if e.topic == "session.message"]  # no second input row announced
            # never replayed: no other turn begins it
            await c.call("session.startTurn", {"sessionId": TGT, "turnId": "t2"})
            err = await _rpc_error(c.call(*_begin(did, "t2")))
            assert err.data_code == "CONFLICT"
            assert len(_input_lines(tmp_path, did)) == 1
            assert await c.call(*_begin(did)) == first


async def test_the_keyless_retry_answers_exactly_what_the_stored_receipt_holds(tmp_path: Path) -> None:
    """Killed after the commit, the keyed retry gets the first try's stored answer: the keyless retry
    (after the restart interrupted the delivery) answers the very same."""
    did = await _setup(tmp_path)
    keyed = _begin(did, submissionId="begin-1")
    await _killed_during(tmp_path, "collab.begin.after_commit", [*_turn_steps(did, False), keyed])
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, CLIENT, kind="agent") as c:
            stored = await c.call(*keyed)
            assert await c.call(*_begin(did)) == stored
            assert await c.call(*_begin(did, submissionId="another-key")) == stored


async def test_a_begin_from_the_next_turn_finds_the_input_line_and_records_the_cut_one(tmp_path: Path) -> None:
    """No retry came. Its input already landed in t1: t1 began it and the restart cut it, so boot binds it
    to t1 (interrupted, its admission consumed: no queue entry hands it out again), a begin from the next
    turn is CONFLICT naming t1, and t1's retry still gets its answer."""
    did = await _setup(tmp_path)
    await _killed_during(tmp_path, "collab.begin.before_commit", [*_turn_steps(did, False), _begin(did)])
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, CLIENT, kind="agent") as c:
            got = await c.call("collab.get", {"deliveryId": did})
            assert (got["status"], got["turnId"]) == ("interrupted", "t1")  # recorded by boot
            assert (await c.call("session.queueList", {"sessionId": TGT}))["entries"] == []
            await c.call("session.startTurn", {"sessionId": TGT, "turnId": "t2"})
            err = await _rpc_error(c.call(*_begin(did, "t2", submissionId="begin-2")))
            assert err.data_code == "CONFLICT" and err.data["turnId"] == "t1"
            got = await c.call("collab.get", {"deliveryId": did})
            assert (got["status"], got["turnId"]) == ("interrupted", "t1")
            assert (await c.call("session.queueList", {"sessionId": TGT}))["entries"] == []
            _assert_first_answer(await c.call(*_begin(did)), did)
            assert len(_input_lines(tmp_path, did)) == 1


async def test_a_begin_killed_before_its_line_is_refused_and_leaves_the_delivery_held(tmp_path: Path) -> None:
    """Nothing was written: the restart aborted t1, so the retry is CONFLICT and the delivery waits, held
    with its admission, for the controller's next turn (which begins it, with one input line)."""
    did = await _setup(tmp_path)
    keyed = _begin(did, submissionId="begin-1")
    await _killed_during(tmp_path, "append.before_write", [*_turn_steps(did, False), keyed])
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, CLIENT, kind="agent") as c:
            for call in (keyed, _begin(did)):
                assert (await _rpc_error(c.call(*call))).data_code == "CONFLICT"
            assert (await c.call("collab.get", {"deliveryId": did}))["status"] == "queued"
            assert [e["sessionMessageId"] for e in
                    (await c.call("session.queueList", {"sessionId": TGT}))["entries"]] == [did]
            await c.call("session.startTurn", {"sessionId": TGT, "turnId": "t2"})
            began = await c.call(*_begin(did, "t2"))
            assert (began["delivery"]["status"], began["delivery"]["turnId"]) == ("running", "t2")
            assert [r["turnId"] for r in _input_lines(tmp_path, did)] == ["t2"]


async def test_a_begin_retried_after_its_settlement_answers_the_begin(tmp_path: Path) -> None:
    """No crash: the controller's begin answer was lost; its retry comes after the settlement."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, CLIENT, kind="agent") as c:
            for sid in (SRC, TGT):
                await c.call("session.create", {"sessionId": sid, "title": sid})
            sent = await c.call("collab.deliver", {"pluginId": "team", "sourceSessionId": SRC, "targetSessionId": TGT,
                                                   "kind": "task", "content": "x", "idempotencyKey": "k1",
                                                   "notifyOnCompletion": True})
            did = sent["delivery"]["id"]
            await c.call("session.startTurn", {"sessionId": TGT, "turnId": "t1"})
            first = await c.call(*_begin(did))
            await c.call("collab.settle", {"sessionId": TGT, "deliveryId": did, "turnId": "t1",
                                           "status": "completed", "result": "done"})
            assert await c.call(*_begin(did)) == first
            got = await c.call("collab.get", {"deliveryId": did})
            assert got["status"] == "completed" and "callbackId" in got
            assert len(_input_lines(tmp_path, did)) == 1


@pytest.mark.parametrize("point", ["collab.settle.before_commit", "collab.settle.after_commit"])
async def test_a_settlement_killed_at_its_commit_makes_at_most_one_callback(tmp_path: Path, point: str) -> None:
    """Settle writes no line: killed before its commit, the restart interrupted the delivery with its
    turn and the retry is CONFLICT (no callback); killed after it, every retry answers the one settlement
    and its one callback."""
    did = await _setup(tmp_path)
    settle = ("collab.settle", {"sessionId": TGT, "deliveryId": did, "turnId": "t1", "status": "completed",
                                "result": "done", "submissionId": "settle-1"})
    await _killed_during(tmp_path, point, [*_turn_steps(did, False), _begin(did), settle])
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, CLIENT, kind="agent") as c:
            keyless = (settle[0], {k: v for k, v in settle[1].items() if k != "submissionId"})
            if point.endswith("before_commit"):
                for call in (settle, keyless):
                    assert (await _rpc_error(c.call(*call))).data_code == "CONFLICT"
                assert (await c.call("collab.get", {"deliveryId": did}))["status"] == "interrupted"
            else:
                first = await c.call(*settle)
                assert first["delivery"]["status"] == "completed"
                assert await c.call(*keyless) == first and await c.call(*settle) == first
            outgoing = (await c.call("collab.list", {"sessionId": TGT, "direction": "outgoing"}))["deliveries"]
            assert len(outgoing) == (0 if point.endswith("before_commit") else 1)
