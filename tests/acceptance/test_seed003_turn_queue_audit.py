"""Seed 003 §4.6 (turns), §4.6b (the host-owned turn queue) and §11 items 18-19, read by an outsider and probed
where a reader of the seed alone would push: retries after a SIGKILL at several moments of a queue write (one row,
one effect), several clients pushing into a full queue at once (never a ninth entry), "send now" and reorder at the
edges (first/last, removed neighbours, promoted entries), bad input refused with a clear code and nothing changed
(not even a position used up), attachments kept through a restart, every queue held after a restart until a
controller attaches and then drained one entry per terminal turn event, and a restart cutting a queue turn that
waits on a person. Black-box against real ``pi-host serve`` processes over WebSocket (the methods of
protocol/README.md), the database read only after its host was killed.

Two clauses failed and were fixed with their tests here: a reorder next to a prompt offered again (listed first
after a restart or a new controller) answered without moving anything in the list, and a UI (or any client that
is not the sidecar) could ``queueTake`` with the controller's listed id, handing prompts to no turn.

Already held elsewhere (not repeated here): the basic push/list/remove/prioritize/reorder moves and a restart
(test_seed003_write_paths_outsider ``test_queue_positions_idempotency_cap_priority_and_restart``), positions
growing past removed tail entries across kills (same module), a taken entry offered again after a kill (same
module), two connections racing pushes, reorders and takes (test_dbstate_outsider), the store's transition table
and planners (tests/queue/test_store_queue.py), a kill between a push's answer file and its commit
(tests/queue/test_queue_receipt_file.py), item 18 for every approval kind and state (tests/approvals/test_restart.py,
test_seed003_acceptance_adversarial ``test_item18_...``), item 19 for plans.submit and startTurn
(test_seed003_acceptance_adversarial ``test_item19_...``, tests/queue/test_plan_requires_interactive.py), turn rows
cascading with their session and kill -9 aborting a running turn (test_seed003_runs_outsider)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.models_queue import QueuePushResult, QueueState, QueueTakeResult
from runtime.client import ClientClosed, HostClient
from tests.acceptance.outsiderkit import (
    all_at_once,
    client,
    code_of,
    data_dir,
    error_of,
    file_block,
    killed_during,
    outcome,
    put_file,
    real_host,
    say,
    shared_host,
)
from tests.hostkit import HostProcess, call_killed_at, msg, start_host_process


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    """One host for the probes that never restart it (each works in sessions of its own)."""
    yield from shared_host(tmp_path_factory, "turnqueue")


def _push(sid: str, content: str, key: str | None = None, principal: str = "ui", mode: str = "ask",
          **extra: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"sessionId": sid, "principal": principal, "content": content, "permissionMode": mode,
                              **extra}
    if key is not None:
        params["idempotencyKey"] = key
    return params


async def _pushed(c: HostClient, params: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = await c.call("session.queuePush", params)
    QueuePushResult.model_validate(result)
    return result


async def _state(c: HostClient, sid: str) -> dict[str, Any]:
    state: dict[str, Any] = await c.call("session.queueList", {"sessionId": sid})
    QueueState.model_validate(state)
    return state


async def _ids(c: HostClient, sid: str) -> list[str]:
    return [e["id"] for e in (await _state(c, sid))["entries"]]


async def _take(c: HostClient, sid: str, ctl: str, **extra: Any) -> dict[str, Any]:
    result: dict[str, Any] = await c.call("session.queueTake", {"sessionId": sid, "controllerId": ctl, **extra})
    QueueTakeResult.model_validate(result)
    return result


async def _next_position(c: HostClient, sid: str) -> int:
    """The position a new push gets now (the push is removed again): shows whether refused calls used one up."""
    entry = (await _pushed(c, _push(sid, "probe")))["entry"]
    await c.call("session.queueRemove", {"sessionId": sid, "entryId": entry["id"]})
    position: int = entry["position"]
    return position


async def _run_turn(c: HostClient, sid: str, ctl: str, turn: str) -> dict[str, Any] | None:
    """One queue turn as the sidecar runs it: take, start, the prompt's line, completed. The entry, or None."""
    entry: dict[str, Any] | None = (await _take(c, sid, ctl)).get("entry")
    if entry is None:
        return None
    await c.call("session.startTurn", {"sessionId": sid, "turnId": turn})
    await say(c, sid, f"{turn}-prompt", entry["content"], turnId=turn)
    await c.call("session.endTurn", {"sessionId": sid, "turnId": turn, "status": "completed",
                                     "createNotification": False})
    return entry


def _rows(data: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows of the database of a host that is no longer running."""
    conn = sqlite3.connect(data / "pi.sqlite")
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


# ------------------------------------------------------------------- §4.6b positions and idempotency keys

async def test_a_retried_push_is_the_same_row_wherever_the_entry_went_and_a_changed_input_conflicts(
        shared: HostProcess) -> None:
    """§4.6b "principal plus idempotency_key make a retried push return the same row; a reused key with a
    different input_hash fails with IDEMPOTENCY_CONFLICT": the retry answers the very row (id, position,
    createdAt) while it waits, after it was promoted, after it was removed and after it was handed out, and
    never queues the prompt again. The key is the principal's and the session's: another principal, or the same
    key in another session, is a new row. The same attachments with their keys in another order, or none sent
    as ``[]``, are the same input; changing any part of it (content, permission mode, an attachment, their
    number) is IDEMPOTENCY_CONFLICT and changes nothing, not even the next position."""
    with trio.fail_after(60):
        async with client(shared, "keys-ui") as c, client(shared, "keys-agent", kind="agent") as agent:
            sid = (await c.call("session.create", {}))["id"]
            other = (await c.call("session.create", {}))["id"]
            att = [{"type": "attachment", "kind": "file", "name": "spec.md", "ref": "/w/spec.md"}]
            first = [(await _pushed(c, _push(sid, f"p{i}", key=f"k{i}", attachments=att)))["entry"]
                     for i in range(4)]
            assert [e["position"] for e in first] == [1, 2, 3, 4]
            for i, entry in enumerate(first):
                again = await _pushed(c, _push(sid, f"p{i}", key=f"k{i}", attachments=att))
                assert again == {"entry": entry, "replayed": True}
            await c.call("session.queuePrioritize", {"sessionId": sid, "entryId": first[2]["id"]})
            promoted = await _pushed(c, _push(sid, "p2", key="k2", attachments=att))
            assert promoted["replayed"] is True and promoted["entry"]["id"] == first[2]["id"]
            await c.call("session.queueRemove", {"sessionId": sid, "entryId": first[1]["id"]})
            removed = await _pushed(c, _push(sid, "p1", key="k1", attachments=att))
            assert removed["replayed"] is True and removed["entry"]["id"] == first[1]["id"]
            await agent.call("session.queueAttach", {"sessionId": sid, "controllerId": "keys-ctl"})
            handed = await _run_turn(agent, sid, "keys-ctl", "keys-t1")
            assert handed is not None and handed["id"] == first[2]["id"]  # promoted: delivered first
            delivered = await _pushed(c, _push(sid, "p2", key="k2", attachments=att))
            assert delivered["replayed"] is True and delivered["entry"]["id"] == first[2]["id"]
            assert await _ids(c, sid) == [first[0]["id"], first[3]["id"]]

            # the input is what it says, not how it is spelled: keys in another order, no attachments as []
            reordered = [dict(reversed(list(att[0].items())))]
            assert (await _pushed(c, _push(sid, "p0", key="k0", attachments=reordered)))["entry"] == first[0]
            bare = (await _pushed(c, _push(sid, "bare", key="bare")))["entry"]
            assert await _pushed(c, _push(sid, "bare", key="bare", attachments=[])) == {"entry": bare,
                                                                                      "replayed": True}
            await c.call("session.queueRemove", {"sessionId": sid, "entryId": bare["id"]})
            bob = await _pushed(c, _push(sid, "p0", key="k0", principal="bob", attachments=att))
            elsewhere = await _pushed(c, _push(other, "p0", key="k0", attachments=att))
            assert bob["replayed"] is False and bob["entry"]["id"] != first[0]["id"]
            assert elsewhere["replayed"] is False and elsewhere["entry"]["position"] == 1

            before = await _state(c, sid)
            for changed in (_push(sid, "p0 changed", key="k0", attachments=att),
                            _push(sid, "p0", key="k0", mode="auto", attachments=att),
                            _push(sid, "p0", key="k0"),
                            _push(sid, "p0", key="k0", attachments=[{**att[0], "name": "other.md"}]),
                            _push(sid, "p0", key="k0", attachments=att * 2),
                            _push(sid, "p1 changed", key="k1", attachments=att),  # removed: still its key
                            _push(sid, "p2 changed", key="k2", attachments=att)):  # delivered: still its key
                code, data = await error_of(c, "session.queuePush", changed)
                assert code == "IDEMPOTENCY_CONFLICT", changed
                assert data.get("idempotencyKey") == changed["idempotencyKey"]
            assert await _state(c, sid) == before
            assert await _next_position(c, sid) == bob["entry"]["position"] + 1


# ------------------------------------------------------------------------------- bad input changes nothing

async def test_bad_queue_input_is_refused_with_a_clear_code_and_changes_nothing(shared: HostProcess) -> None:
    """Every refused queue call names its reason with a stable code, and leaves the queue as it was: the
    same entries in the same order with the same positions and priorities, and no position used up (the next
    push still gets the next one)."""
    with trio.fail_after(60):
        async with client(shared, "bad-ui") as c, client(shared, "bad-agent", kind="agent") as agent:
            sid = (await c.call("session.create", {}))["id"]
            other = (await c.call("session.create", {}))["id"]
            ids = [(await _pushed(c, _push(sid, f"p{i}", key=f"k{i}")))["entry"]["id"] for i in range(3)]
            foreign = (await _pushed(c, _push(other, "not yours")))["entry"]["id"]
            await c.call("session.queuePrioritize", {"sessionId": sid, "entryId": ids[2]})
            before = await _state(c, sid)
            bad: list[tuple[str, dict[str, Any], str]] = [
                ("session.queuePush", _push(sid, "x", mode="yolo"), "INVALID_PARAMS"),
                ("session.queuePush", _push(sid, "x", principal=""), "INVALID_PARAMS"),
                ("session.queuePush", _push(sid, "x", key=""), "INVALID_PARAMS"),
                ("session.queuePush", _push(sid, "x", principal="p" * 201), "INVALID_PARAMS"),
                ("session.queuePush", {"sessionId": sid, "principal": "ui", "permissionMode": "ask"},
                 "INVALID_PARAMS"),
                ("session.queuePush", _push(sid, 42), "INVALID_PARAMS"),  # type: ignore[arg-type]
                ("session.queuePush", _push(sid, "x", attachments=[{"type": "attachment", "kind": "file",
                                                                     "name": "a", "data": "aGk="}]),
                 "INVALID_PARAMS"),
                ("session.queuePush", _push(sid, "x", attachments=[{"path": "/w/../etc/passwd"}]), "INVALID_PARAMS"),
                ("session.queuePush", _push(sid, "x", attachments=[{"path": f"/w/{i}"} for i in range(65)]),
                 "INVALID_PARAMS"),
                ("session.queuePush", _push(sid, "x", attachments="/w/a"), "INVALID_PARAMS"),
                ("session.queuePush", _push(sid, "x", attachments=[["/w/a"]]), "INVALID_PARAMS"),
                ("session.queuePush", _push(sid, "x", attachments=[{"path": "/w/a\x00b"}]), "INVALID_PARAMS"),
                ("session.queuePush", _push(sid, "x", attachments=[{"type": "attachment", "kind": "file",
                                                                     "name": "n", "ref": "notes.txt"}]),
                 "INVALID_PARAMS"),
                ("session.queuePush", _push(sid, "x" * 1_000_001), "INVALID_PARAMS"),
                ("session.queuePush", _push(sid, "x", sessionMessageId="not an id"), "INVALID_PARAMS"),
                ("session.queuePush", _push(sid, "x", surprise=True), "INVALID_PARAMS"),
                ("session.queuePush", _push("no-such-session", "x"), "SESSION_NOT_FOUND"),
                ("session.queuePush", _push("../escape", "x"), "INVALID_PARAMS"),
                ("session.queueRemove", {"sessionId": sid, "entryId": "q_nope"}, "NOT_FOUND"),
                ("session.queueRemove", {"sessionId": sid, "entryId": foreign}, "NOT_FOUND"),
                ("session.queuePrioritize", {"sessionId": sid, "entryId": foreign}, "NOT_FOUND"),
                ("session.queueReorder", {"sessionId": sid, "entryId": foreign, "direction": "up"}, "NOT_FOUND"),
                ("session.queueReorder", {"sessionId": sid, "entryId": ids[1], "direction": "sideways"},
                 "INVALID_PARAMS"),
                ("session.queueReorder", {"sessionId": sid, "entryId": ids[1]}, "INVALID_PARAMS"),
                ("session.queueReorder", {"sessionId": sid, "entryId": ids[2], "direction": "down"}, "CONFLICT"),
                ("session.queueReorder", {"sessionId": sid, "entryId": ids[0], "direction": "up"}, "CONFLICT"),
                ("session.queueReorder", {"sessionId": sid, "entryId": ids[1], "direction": "down"}, "CONFLICT"),
                ("session.queueList", {"sessionId": "no-such-session"}, "SESSION_NOT_FOUND"),
                ("session.queueAttach", {"sessionId": sid, "controllerId": "ui-wants-control"}, "CONFLICT"),
            ]
            for method, params, expected in bad:
                code, _data = await error_of(c, method, params)
                assert code == expected, (method, params, code)
            # the sidecar: a controller that is not the attached one takes nothing
            await agent.call("session.queueAttach", {"sessionId": sid, "controllerId": "bad-ctl"})
            assert await code_of(agent, "session.queueTake", {"sessionId": sid, "controllerId": "imposter"}) \
                == "CONFLICT"
            after = await _state(c, sid)
            assert after["entries"] == before["entries"]
            assert await _ids(c, other) == [foreign]
            assert await _next_position(c, sid) == 4


# ------------------------------------------------------------------------ §4.6b at most eight, under races

async def test_clients_pushing_into_a_nearly_full_queue_at_once_never_make_a_ninth_entry(
        shared: HostProcess) -> None:
    """§4.6b "A session holds at most eight entries", with four connections pushing at once: into a queue
    of five, twelve distinct prompts and one prompt all four push under the same key admit exactly three
    rows (that key's answers name one row or are all LIMIT_EXCEEDED); a retry of a queued key into the full
    queue is still answered as the same row. A prompt handed out whose turn has not run still holds its
    place (it may wait again), so the races around a take admit no ninth either; removals racing pushes
    end with at most eight, every admitted prompt listed."""
    with trio.fail_after(90):
        async with client(shared, "race-0") as c0, client(shared, "race-1") as c1, \
                client(shared, "race-2") as c2, client(shared, "race-3", kind="agent") as c3:
            clients = [c0, c1, c2, c3]
            sid = (await c0.call("session.create", {}))["id"]
            seeded = [(await _pushed(c0, _push(sid, f"seed{i}", key=f"seed{i}")))["entry"] for i in range(5)]
            calls = [(c, "session.queuePush", _push(sid, f"r{n}-{i}", key=f"r{n}-{i}"))
                     for n, c in enumerate(clients) for i in range(3)]
            calls += [(c, "session.queuePush", _push(sid, "shared ✓", key="shared")) for c in clients]
            answers = await all_at_once(calls)
            assert all(isinstance(a, dict) or a == "LIMIT_EXCEEDED" for a in answers), answers
            listed = await _state(c0, sid)
            assert len(listed["entries"]) == 8
            ids = {e["id"] for e in listed["entries"]}
            admitted = {a["entry"]["id"] for a in answers if isinstance(a, dict)}
            assert admitted <= ids and len(admitted) == 3, answers
            shared_answers = answers[12:]
            shared_ids = {a["entry"]["id"] for a in shared_answers if isinstance(a, dict)}
            assert len(shared_ids) <= 1
            if shared_ids:
                assert all(isinstance(a, dict) for a in shared_answers), shared_answers
                assert sum(not a["replayed"] for a in shared_answers) == 1
            positions = [e["position"] for e in listed["entries"]]
            assert len(set(positions)) == 8 and positions == sorted(positions)
            again = await _pushed(c1, _push(sid, "seed0", key="seed0"))
            assert again == {"entry": seeded[0], "replayed": True}

            # one handed out (no turn yet) + one removed: seven listed, the taken one still holds its place
            await c3.call("session.queueAttach", {"sessionId": sid, "controllerId": "race-ctl"})
            taken = (await _take(c3, sid, "race-ctl"))["entry"]
            assert taken["id"] == seeded[0]["id"]
            assert len((await _state(c0, sid))["entries"]) == 7
            answers = await all_at_once([(c, "session.queuePush", _push(sid, f"t{n}", key=f"t{n}"))
                                         for n, c in enumerate(clients)])
            assert answers == ["LIMIT_EXCEEDED"] * 4
            calls = [(c0, "session.queueRemove", {"sessionId": sid, "entryId": e["id"]})
                     for e in (await _state(c0, sid))["entries"][:2]]
            calls += [(c, "session.queuePush", _push(sid, f"u{n}-{i}", key=f"u{n}-{i}"))
                      for n, c in enumerate(clients) for i in range(2)]
            answers = await all_at_once(calls)
            after = await _state(c0, sid)
            admitted = {a["entry"]["id"] for a in answers[2:] if isinstance(a, dict)}
            assert len(after["entries"]) <= 7 and admitted <= {e["id"] for e in after["entries"]}
            assert len(admitted) == len(after["entries"]) - 5
            # the taken prompt's turn runs: it leaves the queue and frees its place, and never comes back
            await c3.call("session.startTurn", {"sessionId": sid, "turnId": "race-t1"})
            await say(c3, sid, "race-t1-prompt", taken["content"], turnId="race-t1")
            await c3.call("session.endTurn", {"sessionId": sid, "turnId": "race-t1", "status": "completed",
                                              "createNotification": False})
            room = 8 - len(after["entries"])
            answers = await all_at_once([(c, "session.queuePush", _push(sid, f"v{n}-{i}", key=f"v{n}-{i}"))
                                         for n, c in enumerate(clients) for i in range(3)])
            assert sum(isinstance(a, dict) for a in answers) == room
            final = await _state(c0, sid)
            assert len(final["entries"]) == 8 and taken["id"] not in {e["id"] for e in final["entries"]}


async def test_send_now_clicks_and_a_delete_racing_from_several_clients(shared: HostProcess) -> None:
    """§4.6b "a promotion writes MAX(priority) + 1 inside the session": four people clicking "send now" on
    four entries at once get four distinct numbers 1-4, listed in that order; all four clicking one entry
    promote it once. "Deleting the session cascades to its entries": pushes racing the delete either land
    before it (and go with it) or find no session; nothing of the queue is left to a session created again
    under the id."""
    with trio.fail_after(60):
        async with client(shared, "click-0") as c0, client(shared, "click-1") as c1, \
                client(shared, "click-2") as c2, client(shared, "click-3") as c3:
            clients = [c0, c1, c2, c3]
            sid = (await c0.call("session.create", {}))["id"]
            ids = [(await _pushed(c0, _push(sid, f"p{i}")))["entry"]["id"] for i in range(6)]
            answers = await all_at_once([(c, "session.queuePrioritize", {"sessionId": sid, "entryId": ids[5 - n]})
                                         for n, c in enumerate(clients)])
            assert all(isinstance(a, dict) for a in answers), answers
            listed = (await _state(c0, sid))["entries"]
            assert [x.get("priority") for x in listed] == [1, 2, 3, 4, None, None]
            assert {x["id"] for x in listed[:4]} == set(ids[2:])
            assert [x["id"] for x in listed[4:]] == ids[:2]
            answers = await all_at_once([(c, "session.queuePrioritize", {"sessionId": sid, "entryId": ids[0]})
                                         for c in clients])
            assert all(isinstance(a, dict) for a in answers), answers
            assert [x.get("priority") for x in (await _state(c0, sid))["entries"]] == [1, 2, 3, 4, 5, None]

            doomed = (await c0.call("session.create", {"sessionId": "queue-doomed"}))["id"]
            await _pushed(c0, _push(doomed, "early", key="early"))
            calls = [(c, "session.queuePush", _push(doomed, f"late{n}-{i}", key=f"late{n}-{i}"))
                     for n, c in enumerate(clients) for i in range((2, 1, 2, 1)[n])]
            calls.insert(3, (c0, "session.delete", {"sessionId": doomed}))
            answers = await all_at_once(calls)
            assert isinstance(answers[3], dict), answers[3]
            refused = [a for a in answers if not isinstance(a, dict)]
            assert all(a == "SESSION_NOT_FOUND" for a in refused), refused
            await c0.call("session.create", {"sessionId": doomed})
            assert (await _state(c0, doomed))["entries"] == []
            fresh = await _pushed(c1, _push(doomed, "early", key="early"))
            assert fresh["replayed"] is False and fresh["entry"]["position"] == 1


# ---------------------------------------------------------------------- §4.6b "send now" and queueReorder

async def test_send_now_and_reorder_at_the_edges(shared: HostProcess) -> None:
    """§4.6b "a promotion writes MAX(priority) + 1 inside the session, so promoted entries are delivered first
    in click order and the remaining entries keep their position order. queueReorder swaps two adjacent
    non-promoted position values and refuses a promoted entry": the first moved up and the last moved down are
    refused; a neighbour removed leaves the next entry adjacent; a promoted entry is skipped as a neighbour
    (the unpromoted entry below it is the first of the reorderable ones) and is refused itself; a second click
    on a promoted entry keeps its click order; the delivery order the sidecar drains is the order listed."""
    with trio.fail_after(60):
        async with client(shared, "order-ui") as c, client(shared, "order-agent", kind="agent") as agent:
            sid = (await c.call("session.create", {}))["id"]
            e = {x: (await _pushed(c, _push(sid, x)))["entry"] for x in "abcdefg"}

            def reorder(x: str, direction: str) -> dict[str, Any]:
                return {"sessionId": sid, "entryId": e[x]["id"], "direction": direction}

            async def names() -> list[str]:
                by_id = {v["id"]: k for k, v in e.items()}
                return [by_id[i] for i in await _ids(c, sid)]

            async def positions() -> dict[str, int]:
                by_id = {v["id"]: k for k, v in e.items()}
                return {by_id[x["id"]]: x["position"] for x in (await _state(c, sid))["entries"]}

            for x, direction in (("a", "up"), ("g", "down")):
                assert await code_of(c, "session.queueReorder", reorder(x, direction)) == "CONFLICT"
            assert await names() == list("abcdefg")
            await c.call("session.queueRemove", {"sessionId": sid, "entryId": e["b"]["id"]})
            state = await c.call("session.queueReorder", reorder("c", "up"))  # b is gone: c and a are adjacent
            QueueState.model_validate(state)
            assert await names() == list("cadefg")
            assert await positions() == {"c": 1, "a": 3, "d": 4, "e": 5, "f": 6, "g": 7}
            await c.call("session.queueRemove", {"sessionId": sid, "entryId": e["g"]["id"]})
            assert await code_of(c, "session.queueReorder", reorder("f", "down")) == "CONFLICT"  # f is last now

            await c.call("session.queuePrioritize", {"sessionId": sid, "entryId": e["e"]["id"]})
            state = await c.call("session.queuePrioritize", {"sessionId": sid, "entryId": e["a"]["id"]})
            assert [x.get("priority") for x in state["entries"]] == [1, 2, None, None, None]
            assert await names() == list("eacdf")
            again = await c.call("session.queuePrioritize", {"sessionId": sid, "entryId": e["e"]["id"]})
            assert again == state  # a second click changes nothing
            before = await _state(c, sid)
            for x, direction in (("e", "up"), ("e", "down"), ("a", "up"), ("a", "down"), ("c", "up")):
                assert await code_of(c, "session.queueReorder", reorder(x, direction)) == "CONFLICT", (x, direction)
            assert await _state(c, sid) == before
            await c.call("session.queueReorder", reorder("f", "up"))  # f and d swap, the promoted ones stay
            assert await names() == list("eacfd")
            await c.call("session.queueRemove", {"sessionId": sid, "entryId": e["e"]["id"]})
            state = await c.call("session.queuePrioritize", {"sessionId": sid, "entryId": e["d"]["id"]})
            assert [(x["content"], x.get("priority")) for x in state["entries"]] == [
                ("a", 2), ("d", 3), ("c", None), ("f", None)]

            await agent.call("session.queueAttach", {"sessionId": sid, "controllerId": "order-ctl"})
            drained = []
            for n in range(5):
                entry = await _run_turn(agent, sid, "order-ctl", f"order-t{n}")
                if entry is None:
                    break
                drained.append(entry["content"])
            assert drained == list("adcf")


async def test_a_reorder_moves_what_the_list_shows_also_beside_a_prompt_offered_again(shared: HostProcess) -> None:
    """§4.6b "queueReorder swaps two adjacent non-promoted position values", read as a person clicking the
    arrows reads it: the entries are adjacent in the list they see. A prompt handed out and offered again (a
    controller attached meanwhile, as a restarted sidecar does) is listed first whatever its position, so it
    is nobody's neighbour and cannot be moved itself (CONFLICT, nothing changes); every reorder that answers
    moves its entry in the listed order, and the next take hands out the listed first.

    Before the fix the host answered the reorder and changed nothing visible: the entry below the offered one
    "moved up" by swapping position values with it (still listed first), and the offered one "moved down"
    past the entry two places below it."""
    with trio.fail_after(60):
        async with client(shared, "offered-agent", kind="agent") as agent:
            sid = (await agent.call("session.create", {}))["id"]
            e = {x: (await _pushed(agent, _push(sid, x)))["entry"] for x in "abcd"}
            by_id = {v["id"]: k for k, v in e.items()}

            async def names() -> list[str]:
                return [by_id[i] for i in await _ids(agent, sid)]

            await agent.call("session.queueAttach", {"sessionId": sid, "controllerId": "first-ctl"})
            assert (await _take(agent, sid, "first-ctl"))["entry"]["id"] == e["a"]["id"]
            await agent.call("session.queueAttach", {"sessionId": sid, "controllerId": "second-ctl"})
            before = await _state(agent, sid)
            assert await names() == list("abcd")
            for x, direction in (("a", "down"), ("a", "up"), ("b", "up")):
                code = await code_of(agent, "session.queueReorder",
                                     {"sessionId": sid, "entryId": e[x]["id"], "direction": direction})
                assert code == "CONFLICT", (x, direction)
                assert await _state(agent, sid) == before, (x, direction)
            await agent.call("session.queueReorder", {"sessionId": sid, "entryId": e["b"]["id"], "direction": "down"})
            assert await names() == list("acbd")
            await agent.call("session.queueReorder", {"sessionId": sid, "entryId": e["d"]["id"], "direction": "up"})
            assert await names() == list("acdb")
            assert (await _take(agent, sid, "second-ctl"))["entry"]["id"] == e["a"]["id"]
            assert await names() == list("cdb")


async def test_only_the_sidecar_takes_from_the_queue_it_controls(shared: HostProcess) -> None:
    """§4.6b "The headless Agent Host module is the only writer ... the store never starts a turn", and
    protocol/README: ``agent`` is "the only kind that may control a session's turn queue", ``queueTake`` is
    "controller only". A UI, a CLI or a plugin that read the controller's id from ``queueList`` and sends it
    with ``queueTake`` is refused (CONFLICT naming its kind; a plugin, whose session this is not, may be refused
    earlier, PERMISSION_DENIED) and nothing is handed out: the sidecar's next take
    still gets the first prompt and every prompt reaches a turn.

    Before the fix such a take was answered: each one handed out the next prompt to a client that runs no
    turn, and the next take consumed it ("the controller moved on"), so three of four prompts were lost."""
    with trio.fail_after(60):
        async with client(shared, "take-agent", kind="agent") as agent, client(shared, "take-ui") as ui, \
                client(shared, "take-cli", kind="cli") as cli, \
                client(shared, "take-plugin", kind="plugin", plugin_id="taker") as plugin:
            sid = (await ui.call("session.create", {}))["id"]
            ids = [(await _pushed(ui, _push(sid, x)))["entry"]["id"] for x in "abcd"]
            await agent.call("session.queueAttach", {"sessionId": sid, "controllerId": "take-ctl"})
            controller = (await _state(ui, sid))["controllerId"]
            assert controller == "take-ctl"
            for other, kind in ((ui, "ui"), (cli, "cli"), (plugin, "plugin")):
                take = {"sessionId": sid, "controllerId": controller}
                code, detail = await error_of(other, "session.queueTake", take)
                if kind == "plugin" and code == "PERMISSION_DENIED":
                    continue  # a plugin may not touch a session it does not own at all
                assert (code, detail.get("clientKind")) == ("CONFLICT", kind)
                assert await _ids(ui, sid) == ids
            ran = [await _run_turn(agent, sid, "take-ctl", f"take-t{n}") for n in range(5)]
            assert [x["id"] for x in ran if x is not None] == ids and ran[-1] is None


# ---------------------------------------------------- §4.6b SIGKILL at several moments of a queue write

async def test_queue_writes_killed_at_each_moment_have_one_effect_after_their_retry(tmp_path: Path) -> None:
    """Every acknowledged queue change, retried after a SIGKILL at some step of its write (between its
    effects, after they were applied, before the commit, after the commit and before the answer), has exactly
    one effect: a push keyed by its idempotency key, by its command receipt, or both, is one row (the retry
    answers it, a second retry answers the same); a promotion is one MAX+1 (the next promotion is the next
    number); a keyed reorder swaps once (the retry does not swap back); a keyed removal removes once and its
    position is never used again; a take killed after its commit hands its prompt out to the turn that runs
    it, once."""
    data = data_dir(tmp_path)
    with trio.fail_after(150):
        async with real_host(data, client_id="killed") as (_proc, c):
            sid = (await c.call("session.create", {}))["id"]
            base = [(await _pushed(c, _push(sid, f"base{i}")))["entry"] for i in range(3)]
        pushes: list[tuple[str, dict[str, Any]]] = [
            ("queue.between_effects", _push(sid, "k+s between", key="kb", submissionId="sb")),
            ("queue.after_apply", _push(sid, "k after apply", key="ka")),
            ("index.before_commit", _push(sid, "s before commit", submissionId="sc")),
            ("index.after_commit", _push(sid, "k after commit", key="kc")),
            ("index.after_commit", _push(sid, "s after commit", submissionId="sd")),
            ("index.after_commit", _push(sid, "k+s after commit", key="ke", submissionId="se")),
        ]
        for point, params in pushes:
            await call_killed_at(data, point, "session.queuePush", params, client_id="killed")
        edits: list[tuple[str, dict[str, Any]]] = [
            ("session.queuePrioritize", {"sessionId": sid, "entryId": base[1]["id"], "submissionId": "pr"}),
            ("session.queueReorder", {"sessionId": sid, "entryId": base[2]["id"], "direction": "up",
                                      "submissionId": "ro"}),
            ("session.queueRemove", {"sessionId": sid, "entryId": base[0]["id"], "submissionId": "rm"}),
        ]
        for method, params in edits:
            await call_killed_at(data, "index.after_commit", method, params, client_id="killed")
        async with real_host(data, client_id="killed") as (proc, c), client(proc, "reloaded") as reloaded:
            for _point, params in pushes:
                # a push keyed only by its idempotency key is retried by a UI that reloaded (another client id):
                # the key is the principal's, not the connection's
                by = c if "submissionId" in params else reloaded
                first = await _pushed(by, params)
                again = await _pushed(by, params)
                assert again["entry"] == first["entry"], params
                assert first["replayed"] is (params.get("idempotencyKey") in ("kc", "ke") and by is reloaded), params
            for method, params in edits:
                first = await c.call(method, params)
                assert await c.call(method, params) == first, method
            state = await _state(c, sid)
            contents = [x["content"] for x in state["entries"]]
            assert sorted(contents) == sorted(["base1", "base2"] + [p["content"] for _pt, p in pushes])
            # the pushes killed after their commit took positions 4-6; the retries of the others 7-9
            assert [(x["content"], x.get("priority")) for x in state["entries"]] == [
                ("base1", 1), ("base2", None), ("k after commit", None), ("s after commit", None),
                ("k+s after commit", None), ("k+s between", None), ("k after apply", None),
                ("s before commit", None)]
            pos = {x["content"]: x["position"] for x in state["entries"]}
            assert pos["base2"] == 1  # swapped with base1 once (base0 was still there, first, then removed)
            assert len(set(pos.values())) == len(pos) and max(pos.values()) == 9
            other = await c.call("session.queuePrioritize", {"sessionId": sid, "entryId": state["entries"][3]["id"]})
            assert [x.get("priority") for x in other["entries"][:2]] == [1, 2]
            assert await code_of(c, "session.queueRemove", {"sessionId": sid, "entryId": base[0]["id"]}) \
                == "NOT_FOUND"
            await c.call("session.queueRemove", {"sessionId": sid, "entryId": state["entries"][-1]["id"]})
            assert (await _pushed(c, _push(sid, "next")))["entry"]["position"] == 10
            order = [x["id"] for x in (await _state(c, sid))["entries"]]
        # the attach lives in the host's memory: the host that dies at the take's commit is attached first
        await killed_during(data, "index.after_commit:1", [
            ("session.queueAttach", {"sessionId": sid, "controllerId": "kill-ctl"}),
            ("session.queueTake", {"sessionId": sid, "controllerId": "kill-ctl", "submissionId": "tk"})],
            kind="agent")
        async with real_host(data, kind="agent") as (_proc, agent):
            replay = await _take(agent, sid, "kill-ctl", submissionId="tk")
            assert replay["entry"]["id"] == order[0]
            state = await _state(agent, sid)
            assert state["held"] is True and [x["id"] for x in state["entries"]] == order  # offered again, first
            await agent.call("session.queueAttach", {"sessionId": sid, "controllerId": "kill-ctl"})
            ran = [await _run_turn(agent, sid, "kill-ctl", f"kt{n}") for n in range(len(order) + 1)]
            assert [x["id"] for x in ran if x is not None] == order and ran[-1] is None
            view = await agent.call("session.get", {"sessionId": sid, "full": True})
            prompts = [m["blocks"][0]["text"] for m in view["messages"]]
            assert len(prompts) == len(order) == len(set(prompts))
        rows = _rows(data, "SELECT count(*) FROM turn_queue WHERE session_id = ?", sid)
        assert rows == [(0,)]


async def test_racing_pushes_killed_at_a_commit_are_retried_into_exactly_the_room_left(tmp_path: Path) -> None:
    """§4.6b "at most eight entries" and "a retried push return[s] the same row", together across a SIGKILL:
    four clients push into a queue of six at once, each keyed by its idempotency key and its command receipt,
    on a host that dies right after its first commit (some of the pushes may be in it, none is answered). All
    four retry at once on the next host: exactly two prompts are admitted over both hosts, the others are
    LIMIT_EXCEEDED, a second retry answers each the same, and the database holds eight rows, each prompt once."""
    data = data_dir(tmp_path)
    names = [f"racer-{n}" for n in range(4)]
    with trio.fail_after(120):
        async with real_host(data) as (_proc, c):
            sid = (await c.call("session.create", {}))["id"]
            for i in range(6):
                await _pushed(c, _push(sid, f"seed{i}"))
        params = [_push(sid, f"race {n}", key=f"race-{n}", submissionId=f"sub-{n}") for n in range(4)]
        crashing = start_host_process(data, env={"RT_CRASHPOINT": "index.after_commit:1"})
        try:
            answered: list[Any] = []

            async def push_until_killed(n: int) -> None:
                try:
                    async with client(crashing, names[n]) as c:
                        answered.append(await outcome(c, "session.queuePush", params[n]))
                except (ClientClosed, OSError):
                    pass

            async with trio.open_nursery() as nursery:
                for n in range(4):
                    nursery.start_soon(push_until_killed, n)
            await trio.to_thread.run_sync(crashing.reap)
        finally:
            crashing.kill9()
        assert crashing.proc.returncode == -9 and answered == [], answered
        async with real_host(data) as (proc, c):
            async with client(proc, names[0]) as r0, client(proc, names[1]) as r1, \
                    client(proc, names[2]) as r2, client(proc, names[3]) as r3:
                racers = [r0, r1, r2, r3]
                calls = [(racers[n], "session.queuePush", params[n]) for n in range(4)]
                first = await all_at_once(calls)
                assert sum(isinstance(a, dict) for a in first) == 2 and first.count("LIMIT_EXCEEDED") == 2, first
                again = await all_at_once(calls)
                for a, b in zip(first, again, strict=True):
                    assert a == b or (isinstance(a, dict) and isinstance(b, dict) and a["entry"] == b["entry"]), (a, b)
                listed = (await _state(c, sid))["entries"]
                admitted = sorted(a["entry"]["content"] for a in first if isinstance(a, dict))
                assert sorted(x["content"] for x in listed[6:]) == admitted and len(listed) == 8
        rows = _rows(data, "SELECT content FROM turn_queue WHERE session_id = ? ORDER BY position", sid)
        assert [r[0] for r in rows] == [x["content"] for x in listed]


async def test_a_queue_prompt_killed_after_its_line_landed_is_not_queued_again(tmp_path: Path) -> None:
    """§11.3/§11.4 with §4.6b: a SIGKILL right after a queue turn's prompt line was fsynced, before the index
    took it or the sidecar heard back. After the restart the turn is aborted, the prompt is in the transcript
    once, and the entry it came from is not waiting again (its prompt landed: re-queueing it would send the
    person's words twice); the next prompt is the next one handed out, and a retry of the first prompt's push
    (its idempotency key) is answered as that row, not queued."""
    data = data_dir(tmp_path)
    with trio.fail_after(120):
        sid = "landed"
        answers = await killed_during(data, "append.after_fsync:1", [
            ("session.create", {"sessionId": sid}),
            ("session.queuePush", _push(sid, "only once ✓", key="once")),
            ("session.queuePush", _push(sid, "the next one", key="next")),
            ("session.queueAttach", {"sessionId": sid, "controllerId": "ctl"}),
            ("session.queueTake", {"sessionId": sid, "controllerId": "ctl"}),
            ("session.startTurn", {"sessionId": sid, "turnId": "lt"}),
            ("session.appendMessage", {"sessionId": sid, "message": msg("lt-prompt", "only once ✓", turnId="lt")})],
            kind="agent")
        first = answers[1]["entry"]
        assert answers[4]["entry"]["id"] == first["id"]
        async with real_host(data, kind="agent") as (_proc, agent):
            turns = (await agent.call("session.listTurns", {"sessionId": "landed"}))["turns"]
            assert [(t["id"], t["status"]) for t in turns] == [("lt", "aborted")]
            view = await agent.call("session.get", {"sessionId": "landed", "full": True})
            assert [(m["id"], m["blocks"][0]["text"]) for m in view["messages"]] == [("lt-prompt", "only once ✓")]
            state = await _state(agent, "landed")
            assert [x["content"] for x in state["entries"]] == ["the next one"] and state["held"] is True
            again = await _pushed(agent, _push("landed", "only once ✓", key="once"))
            assert again["replayed"] is True and again["entry"]["id"] == first["id"]
            await agent.call("session.queueAttach", {"sessionId": "landed", "controllerId": "ctl"})
            assert (await _take(agent, "landed", "ctl"))["entry"]["content"] == "the next one"


# ------------------------------------------------- §4.6b restart: held, attachments kept, drained, cascade

async def test_after_a_restart_every_queue_is_held_until_a_controller_attaches_then_drains_one_per_turn_end(
        tmp_path: Path) -> None:
    """§4.6b "attachments_json keeps the prompt's attachment references", "After a restart the module lists
    every entry, holds each session's queue until a controller attaches, and drains one entry after the active
    turn's terminal event. Deleting the session cascades to its entries." Two sessions' queues (a promoted
    entry, blob and path attachments) survive a SIGKILL exactly, both held (the attachment GC keeps the blob a
    queued or handed-out prompt names and sweeps a loose one): nothing is handed out before an
    attach, a UI cannot attach, attaching one session releases that one only; while a turn runs nothing is
    handed out, each terminal event (completed, error, aborted) lets the next one go, in delivery order; the
    deleted session's rows and turns are gone from the database."""
    data = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(data, client_id="ui") as (proc, c):
            blob = await put_file(c, b"q", 2048)
            loose = await put_file(c, b"l", 2048)  # referenced by nothing: the GC below does sweep
            await c.call("settings.update", {"ns": "app", "values": {"attachmentUnreferencedGraceMs": 0}})
            att = [file_block(blob), {"path": "notes/todo.md", "note": "caller's own ✓"}]
            one = (await c.call("session.create", {}))["id"]
            two = (await c.call("session.create", {}))["id"]
            e1 = [(await _pushed(c, _push(one, f"one-{i}", key=f"k{i}", attachments=att if i == 1 else None)))
                  ["entry"] for i in range(4)]
            e2 = [(await _pushed(c, _push(two, f"two-{i}", key=f"k{i}")))["entry"] for i in range(2)]
            await c.call("session.queuePrioritize", {"sessionId": one, "entryId": e1[2]["id"]})
            before_one, before_two = await _state(c, one), await _state(c, two)
            assert [x["attachments"] for x in before_one["entries"]] == [[], [], att, []]  # one-2 promoted
        async with real_host(data, kind="agent", client_id="sidecar") as (proc, agent):
            async with client(proc, "ui", kind="ui") as ui:
                s1, s2 = await _state(agent, one), await _state(agent, two)
                assert (s1["held"], s2["held"]) == (True, True)
                assert s1["entries"] == before_one["entries"] and s2["entries"] == before_two["entries"]
                assert (await _take(agent, one, "ctl"))["reason"] == "held"
                swept = (await ui.call("attachments.gc", {}))["unreferencedEvicted"]
                assert swept == [loose["ref"].removeprefix("attachments/")]  # the queued prompt's blob stays
                assert await code_of(ui, "session.queueAttach", {"sessionId": one, "controllerId": "ctl"}) \
                    == "CONFLICT"
                attached = await agent.call("session.queueAttach", {"sessionId": one, "controllerId": "ctl"})
                assert attached["held"] is False and attached["controllerId"] == "ctl"
                assert (await _state(agent, two))["held"] is True
                assert (await _take(agent, two, "ctl"))["reason"] == "held"
                await agent.call("session.startTurn", {"sessionId": one, "turnId": "manual"})
                assert (await _take(agent, one, "ctl"))["reason"] == "turnRunning"
                await agent.call("session.endTurn", {"sessionId": one, "turnId": "manual", "status": "aborted"})
                drained = []
                for n, status in enumerate(("completed", "error", "aborted", "completed")):
                    taken = await _take(agent, one, "ctl")
                    entry = taken["entry"]
                    drained.append(entry["content"])
                    if entry["content"] == "one-1":
                        assert entry["attachments"] == att
                        assert (await ui.call("attachments.gc", {}))["unreferencedEvicted"] == []  # handed out
                    turn = f"drain-{n}"
                    await agent.call("session.startTurn", {"sessionId": one, "turnId": turn})
                    await say(agent, one, f"{turn}-prompt", entry["content"], turnId=turn)
                    assert (await _take(agent, one, "ctl"))["reason"] == "turnRunning"
                    await agent.call("session.endTurn", {"sessionId": one, "turnId": turn, "status": status,
                                                         "createNotification": False})
                assert drained == ["one-2", "one-0", "one-1", "one-3"]
                assert (await _take(agent, one, "ctl"))["reason"] == "empty"
                assert (await _state(agent, one))["entries"] == []
                await agent.call("session.queueAttach", {"sessionId": two, "controllerId": "ctl"})
                assert (await _take(agent, two, "ctl"))["entry"]["id"] == e2[0]["id"]
                await agent.call("session.startTurn", {"sessionId": two, "turnId": "two-t"})
                await ui.call("session.delete", {"sessionId": two})
                assert await code_of(ui, "session.queueList", {"sessionId": two}) == "SESSION_NOT_FOUND"
        assert _rows(data, "SELECT count(*) FROM turn_queue WHERE session_id = ?", two) == [(0,)]
        assert _rows(data, "SELECT count(*) FROM turns WHERE session_id = ?", two) == [(0,)]
        assert _rows(data, "SELECT count(*) FROM kv WHERE ns = 'queue' AND key = ?", two) == [(0,)]
        assert _rows(data, "SELECT count(*) FROM turn_queue WHERE session_id = ?", one) == [(0,)]


# ------------------------------------------------------------------------------- §11 item 18 with the queue

async def test_item18_a_restart_cuts_a_queue_turn_waiting_on_a_person_and_replays_nothing(tmp_path: Path) -> None:
    """§11.18 "Full process restart marks pending/queued/running approval rows interrupted, aborts associated
    turns, performs no replay ... and rejects stale responses", for a turn the queue began: its tool
    permission and question pending, a plan approval pending in another session. After the SIGKILL: the turn
    is aborted, both requests are interrupted and their late answers CONFLICT, the sidecar's late checkpoint
    and endTurn CONFLICT, the plan session is still plan, nothing is pending; the prompt whose turn was cut
    before it landed waits again (same content and key, a new entry id, first), the queue is held and no turn
    runs, and the transcript holds nothing the restart wrote for the turn but its settled state."""
    data = data_dir(tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    with trio.fail_after(120):
        async with real_host(data, kind="agent", client_id="sidecar") as (proc, agent):
            async with client(proc, "ui", kind="ui") as ui:
                sid = (await ui.call("session.create", {"projectPath": str(ws)}))["id"]
                plan = (await ui.call("session.create", {"projectPath": str(ws), "mode": "plan"}))["id"]
                first = (await _pushed(ui, _push(sid, "fix the build", key="fix")))["entry"]
                second = (await _pushed(ui, _push(sid, "then the docs", key="docs")))["entry"]
                await agent.call("session.queueAttach", {"sessionId": sid, "controllerId": "ctl"})
                assert (await _take(agent, sid, "ctl"))["entry"]["id"] == first["id"]
                await agent.call("session.startTurn", {"sessionId": sid, "turnId": "qt"})
                tool = (await agent.call("approvals.request", {"sessionId": sid, "turnId": "qt", "tool": "Bash",
                                                               "risk": "high"}))["request"]
                question = (await agent.call("interactions.request", {
                    "sessionId": sid, "turnId": "qt", "question": "Which branch?", "allowFreeText": True}))["request"]
                await agent.call("session.startTurn", {"sessionId": plan, "turnId": "pt"})
                proposal = await agent.call("plans.submit", {
                    "sessionId": plan, "turnId": "pt", "toolCallId": "c1", "kind": "plan", "markdown": "# P\n",
                    "workspaceRoot": str(ws)})
                assert tool["status"] == question["status"] == "pending"
        async with real_host(data, kind="agent", client_id="sidecar") as (proc, agent):
            async with client(proc, "ui", kind="ui") as ui:
                turns = (await agent.call("session.listTurns", {"sessionId": sid}))["turns"]
                assert [(t["id"], t["status"]) for t in turns] == [("qt", "aborted")]
                assert (await ui.call("approvals.pending", {}))["pending"] == []
                assert (await ui.call("interactions.pending", {}))["pending"] == []
                assert (await ui.call("plans.pending", {}))["pending"] == []
                code, detail = await error_of(ui, "approvals.respond", {"sessionId": sid,
                                                                        "requestId": tool["requestId"],
                                                                        "optionId": "allow_once"})
                assert (code, detail.get("status")) == ("CONFLICT", "interrupted")
                code, detail = await error_of(ui, "interactions.respond", {
                    "sessionId": sid, "requestId": question["requestId"], "answer": {"text": "main"}})
                assert (code, detail.get("status")) == ("CONFLICT", "interrupted")
                assert await code_of(ui, "plans.respond", {"requestId": proposal["requestId"],
                                                           "action": "approve"}) == "CONFLICT"
                assert (await ui.call("session.get", {"sessionId": plan}))["session"]["mode"] == "plan"
                assert await code_of(agent, "session.saveInflightMessage", {
                    "sessionId": sid, "turnId": "qt",
                    "message": {"id": "late", "role": "assistant", "blocks": [{"type": "text", "text": "x"}],
                                "turnId": "qt"}}) == "CONFLICT"
                assert await code_of(agent, "session.endTurn", {"sessionId": sid, "turnId": "qt",
                                                                "status": "completed"}) == "CONFLICT"
                state = await _state(ui, sid)
                assert state["held"] is True
                assert [(x["content"], x["idempotencyKey"]) for x in state["entries"]] == [
                    ("fix the build", "fix"), ("then the docs", "docs")]
                assert state["entries"][0]["id"] != first["id"] and state["entries"][1]["id"] == second["id"]
                again = await _pushed(ui, _push(sid, "fix the build", key="fix"))
                assert again["replayed"] is True and again["entry"]["id"] == state["entries"][0]["id"]
                view = await ui.call("session.get", {"sessionId": sid, "full": True})
                assert [m for m in view["messages"] if m["role"] == "user"] == []
                assert not [t for t in (await agent.call("session.listTurns", {"sessionId": sid}))["turns"]
                            if t["status"] == "running"]


# -------------------------------------------------------------------- §11 item 19 and the queue, §4.6 turns

async def test_item19_an_unattended_plan_run_queues_nothing_and_uses_no_position(shared: HostProcess) -> None:
    """§11.19 "A scheduled or unattended Plan or Goal run fails before provider/artifact/queue work with
    PLAN_REQUIRES_INTERACTIVE_SESSION": a run cannot start in a plan or goal session at all; a session switched
    to plan (or goal) under a running run refuses a push into its queue, keyed or not, with that code, leaving
    no row, no key and no position behind; once the run ended, the same keyed push is admitted as a new row
    at the next position."""
    with trio.fail_after(60):
        async with client(shared, "run-agent", kind="agent") as agent:
            for mode in ("plan", "goal"):
                task = await agent.call("tasks.create", {"title": mode, "prompt": "p"})
                contract = (await agent.call("session.create", {"mode": mode}))["id"]
                assert await code_of(agent, "tasks.startRun", {"taskId": task["id"], "sessionId": contract}) \
                    == "PLAN_REQUIRES_INTERACTIVE_SESSION"
                sid = (await agent.call("session.create", {}))["id"]
                before = (await _pushed(agent, _push(sid, "agent work")))["entry"]
                run = await agent.call("tasks.startRun", {"taskId": task["id"], "sessionId": sid})
                await agent.call("session.update", {"sessionId": sid, "mode": mode})
                for params in (_push(sid, "unattended", key="u"), _push(sid, "unattended", submissionId=f"s-{mode}")):
                    code, detail = await error_of(agent, "session.queuePush", params)
                    assert code == "PLAN_REQUIRES_INTERACTIVE_SESSION" and detail.get("sessionId") == sid
                assert await _ids(agent, sid) == [before["id"]]
                await agent.call("tasks.finishRun", {"runId": run["id"], "status": "completed"})
                admitted = await _pushed(agent, _push(sid, "unattended", key="u"))
                assert admitted["replayed"] is False and admitted["entry"]["position"] == before["position"] + 1


async def test_turn_rows_keep_their_run_time_snapshot_and_refuse_stale_or_bad_updates(shared: HostProcess) -> None:
    """§4.6 "one row per agent run": status running | completed | aborted | error, provider_id / model_id a
    snapshot at run time (a later model switch of the session leaves the turn's; a start that names none takes
    the session's at that moment), error_code and usage kept,
    ended_at set only at the end, retry lineage to an ended turn of the same session. A second running turn,
    an unknown status, an unknown turn, a different terminal status after the first, an ended turn's id
    started again and a retry of a turn of another session are refused with their codes and change no row."""
    with trio.fail_after(60):
        async with client(shared, "turn-agent", kind="agent") as agent:
            sid = (await agent.call("session.create", {"providerId": "prov-a", "modelId": "model-a"}))["id"]
            started = await agent.call("session.startTurn", {"sessionId": sid, "turnId": "t1", "providerId": "prov-a",
                                                             "modelId": "model-a"})
            assert started["status"] == "running" and started.get("endedAt") is None
            code, detail = await error_of(agent, "session.startTurn", {"sessionId": sid, "turnId": "t2"})
            assert (code, detail.get("runningTurnId")) == ("CONFLICT", "t1")
            await agent.call("session.update", {"sessionId": sid, "modelId": "model-b"})
            for bad, expected in (({"turnId": "t1", "status": "running"}, "INVALID_PARAMS"),
                                  ({"turnId": "t1", "status": "done"}, "INVALID_PARAMS"),
                                  ({"turnId": "t-missing", "status": "completed"}, "NOT_FOUND")):
                assert await code_of(agent, "session.endTurn", {"sessionId": sid, **bad}) == expected, bad
            ended = await agent.call("session.endTurn", {
                "sessionId": sid, "turnId": "t1", "status": "error", "errorCode": "PROVIDER_429",
                "usage": {"inputTokens": 120, "outputTokens": 7, "cacheRead": 3}, "createNotification": False})
            turn = ended["turn"]
            assert (turn["status"], turn["errorCode"], turn["modelId"], turn["providerId"]) == (
                "error", "PROVIDER_429", "model-a", "prov-a")
            assert (turn["inputTokens"], turn["outputTokens"]) == (120, 7) and turn["usage"]["cacheRead"] == 3
            assert turn["endedAt"] >= turn["startedAt"]
            assert await code_of(agent, "session.endTurn", {"sessionId": sid, "turnId": "t1",
                                                            "status": "completed"}) == "CONFLICT"
            listed = (await agent.call("session.listTurns", {"sessionId": sid}))["turns"]
            assert [(t["id"], t["status"], t["modelId"]) for t in listed] == [("t1", "error", "model-a")]
            other = (await agent.call("session.create", {}))["id"]
            for bad, expected in (({"sessionId": other, "turnId": "x1", "retryOf": "t1"}, "NOT_FOUND"),  # elsewhere
                                  ({"sessionId": sid, "turnId": "x2", "retryOf": "t-missing"}, "NOT_FOUND"),
                                  ({"sessionId": sid, "turnId": "t1"}, "CONFLICT")):  # an ended turn's id again
                assert await code_of(agent, "session.startTurn", bad) == expected, bad
            assert (await agent.call("session.listTurns", {"sessionId": other}))["turns"] == []
            nxt = await agent.call("session.startTurn", {"sessionId": sid, "turnId": "t2",  # no model given
                                                         "retryOf": "t1"})
            assert nxt["retryOf"] == "t1"
            assert (nxt["status"], nxt["providerId"], nxt["modelId"]) == ("running", "prov-a", "model-b")
            listed = (await agent.call("session.listTurns", {"sessionId": sid}))["turns"]
            assert [(t["id"], t["modelId"]) for t in listed] == [("t2", "model-b"), ("t1", "model-a")]
