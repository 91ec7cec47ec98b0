"""In-flight checkpoint rules (D299, D327) and the steering replacement rules, one test each."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import trio

from store.transcripts.records import ms_to_rfc3339
from tests.hostkit import client_for, index_caught_up, inprocess_host, msg
from tests.turns.turnkit import assistant, end, new_session, rpc_error, start


def ckpt(root: Path, sid: str) -> Path:
    return root / "sessions" / f"{sid}.inflight.json"


async def save(c, sid, tid, message):
    return await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": tid, "message": message})


def index_row(root: Path, mid: str):
    conn = sqlite3.connect(root / "pi.sqlite")
    try:
        return conn.execute("SELECT seq, turn_id, text FROM messages WHERE id = ?", (mid,)).fetchone()
    finally:
        conn.close()


async def setup(c):
    sid = await new_session(c)
    await start(c, sid, "t1")
    await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1", "message": msg("u1", "question")})
    return sid


async def test_save_replaces_the_checkpoint_atomically(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await setup(c)
            assert await save(c, sid, "t1", assistant("a1", "partial")) == {"saved": True}
            assert await save(c, sid, "t1", assistant("a1", "partial and more", "streaming")) == {"saved": True}
            body = json.loads(ckpt(tmp_path, sid).read_bytes())
            assert body["schema"] == 1 and body["sessionId"] == sid and body["turnId"] == "t1"
            assert isinstance(body["savedAt"], str)  # an RFC 3339 time, like every time in a file (below)
            assert body["message"]["id"] == "a1" and body["message"]["blocks"][0]["text"] == "partial and more"
            assert oct(os.stat(ckpt(tmp_path, sid)).st_mode & 0o777) == "0o600"
            assert [n for n in os.listdir(tmp_path / "sessions") if ".tmp." in n] == []
            # the checkpoint never reaches the transcript or the index
            assert b"partial" not in (tmp_path / "sessions" / f"{sid}.jsonl").read_bytes()
            await index_caught_up(host)
            assert index_row(tmp_path, "a1") is None


async def test_the_checkpoint_file_spells_its_time_in_rfc3339_and_an_older_integer_still_reads(tmp_path):
    """Seed 003 §2.1: "Timestamps in files are RFC3339 wire spellings; the DB index keeps integer ms". The
    checkpoint file is one of those files; the wire keeps integer ms (``savedAt`` in ``session.get``)."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await setup(c)
            assert await save(c, sid, "t1", assistant("a1", "partial")) == {"saved": True}
            body = json.loads(ckpt(tmp_path, sid).read_bytes())
            wire = (await c.call("session.get", {"sessionId": sid}))["inflight"]["savedAt"]
            assert isinstance(wire, int)
            assert body["savedAt"] == ms_to_rfc3339(wire)
            # a checkpoint an earlier build wrote (integer ms, no CRC) still reads with its time
            older = {"schema": 1, "sessionId": sid, "turnId": "t1", "savedAt": 1785056701500,
                     "message": assistant("a1", "older")}
            ckpt(tmp_path, sid).write_bytes(json.dumps(older).encode())
            assert (await c.call("session.get", {"sessionId": sid}))["inflight"]["savedAt"] == 1785056701500


async def test_empty_message_is_a_no_op(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await setup(c)
            empty = {"id": "a1", "role": "assistant", "blocks": [{"type": "text", "text": "  "},
                                                                 {"type": "thinking", "text": ""}]}
            assert await save(c, sid, "t1", empty) == {"saved": False, "reason": "empty"}
            assert await save(c, sid, "t1", {"id": "a1", "role": "assistant", "blocks": []}) == {
                "saved": False, "reason": "empty"}
            assert not ckpt(tmp_path, sid).exists()


async def test_final_append_with_same_id_removes_it(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await setup(c)
            await save(c, sid, "t1", assistant("a1", "partial"))
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1", "message": msg("x1", "other")})
            assert ckpt(tmp_path, sid).exists()  # another id does not remove it
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                   "message": assistant("a1", "final answer")})
            assert not ckpt(tmp_path, sid).exists()


async def test_late_checkpoint_for_an_indexed_id_is_dropped(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await setup(c)
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                   "message": assistant("a1", "final answer")})
            late = await save(c, sid, "t1", assistant("a1", "final ans"))
            assert late == {"saved": False, "reason": "already_indexed"}
            assert not ckpt(tmp_path, sid).exists()


async def test_a_delegates_reply_is_never_checkpointed(tmp_path):
    """Seed §2.1: delegate (subagent-attributed) replies are not checkpointed; the parent's still is."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await setup(c)
            for meta in ({"parentToolCallId": "task1"}, {"agentName": "code-reviewer"}):
                sub = {**assistant("d1", "reviewing..."), "meta": meta}
                assert await save(c, sid, "t1", sub) == {"saved": False, "reason": "delegate"}
                assert not ckpt(tmp_path, sid).exists()
            assert "inflight" not in await c.call("session.get", {"sessionId": sid})
            assert await save(c, sid, "t1", assistant("a1", "parent reply")) == {"saved": True}
            sub = {**assistant("d2", "more"), "meta": {"parentToolCallId": "task1"}}
            assert await save(c, sid, "t1", sub) == {"saved": False, "reason": "delegate"}
            page = await c.call("session.get", {"sessionId": sid})
            assert page["inflight"]["message"]["id"] == "a1"  # the parent's checkpoint is untouched


async def test_end_turn_completed_keeps_an_unindexed_checkpoint(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await setup(c)
            await save(c, sid, "t1", assistant("a1", "the whole reply"))
            await end(c, sid, "t1")
            assert ckpt(tmp_path, sid).exists()  # left for the outbox's append or boot
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                   "message": assistant("a1", "the whole reply")})
            assert not ckpt(tmp_path, sid).exists()


async def test_end_turn_completed_or_error_removes_a_checkpoint_whose_id_is_indexed(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            for status in ("completed", "error"):
                sid = await setup(c)
                await save(c, sid, "t1", assistant("a1" + status, "reply"))
                # the final row's line is durable but the append fails right after its fsync, so the
                # append path never removes the checkpoint; the next request indexes the line
                host.faults.add("append.after_fsync", nth=host.faults.hits("append.after_fsync") + 1)
                await rpc_error(c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                                 "message": assistant("a1" + status, "reply")}))
                host.faults.clear()
                await c.call("session.get", {"sessionId": sid})
                await index_caught_up(host)
                assert index_row(tmp_path, "a1" + status) is not None and ckpt(tmp_path, sid).exists()
                await end(c, sid, "t1", status)
                assert not ckpt(tmp_path, sid).exists(), status
                await c.call("session.delete", {"sessionId": sid})


async def test_end_turn_aborted_never_touches_the_checkpoint(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await setup(c)
            await save(c, sid, "t1", assistant("a1", "reply so far"))
            before = ckpt(tmp_path, sid).read_bytes()
            await end(c, sid, "t1", "aborted")
            assert ckpt(tmp_path, sid).read_bytes() == before
            # the runtime's own aborted final row is what removes it
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                   "message": assistant("a1", "reply so far", "aborted")})
            assert not ckpt(tmp_path, sid).exists()


async def test_checkpoint_validation(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await setup(c)
            err = await rpc_error(save(c, sid, "t1", msg("u2", "user text")))
            assert err.data_code == "INVALID_PARAMS"
            err = await rpc_error(save(c, sid, "nope", assistant("a1", "x")))
            assert err.data_code == "NOT_FOUND"
            other = await new_session(c)
            err = await rpc_error(save(c, other, "t1", assistant("a1", "x")))
            assert err.data_code == "NOT_FOUND"
            # seed 003 §2.1: a recovered reply is promoted under its turn; a message naming another turn
            # is refused, as session.appendMessage refuses it
            err = await rpc_error(save(c, sid, "t1", {**assistant("a1", "x"), "turnId": "t-other"}))
            assert err.data_code == "INVALID_PARAMS" and not ckpt(tmp_path, sid).exists()
            assert (await save(c, sid, "t1", {**assistant("a1", "x"), "turnId": "t1"}))["saved"] is True


# ---------------------------------------------------------------------- steering


async def test_streaming_row_keeps_accepting_checkpoints_including_empty_reservation(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await setup(c)
            reservation = {"id": "a1", "role": "assistant", "blocks": [], "meta": {"status": "streaming"}}
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1", "message": reservation})
            assert await save(c, sid, "t1", reservation) == {"saved": True}
            assert ckpt(tmp_path, sid).exists()
            # the provisional streaming row arriving again does not remove the checkpoint
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1", "message": reservation})
            assert await save(c, sid, "t1", assistant("a1", "growing", "streaming")) == {"saved": True}
            assert json.loads(ckpt(tmp_path, sid).read_bytes())["message"]["blocks"][0]["text"] == "growing"


async def test_terminal_assistant_replaces_streaming_row_in_place(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await setup(c)
            first = await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                           "message": assistant("a1", "thinking so far", "streaming")})
            await save(c, sid, "t1", assistant("a1", "thinking so far and more", "streaming"))
            steer = await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                           "message": msg("s1", "also do X", meta={"steering": True})})
            final = await c.call("session.appendMessage", {"sessionId": sid, "message":
                                                           assistant("a1", "settled answer", "completed")})
            assert final["replayed"] is False
            assert final["message"]["seq"] == first["message"]["seq"] and final["message"]["turnId"] == "t1"
            assert steer["message"]["seq"] == first["message"]["seq"] + 1
            got = await c.call("session.get", {"sessionId": sid})
            assert [m["id"] for m in got["messages"]] == ["u1", "a1", "s1"]
            assert got["messages"][1]["blocks"][0]["text"] == "settled answer"
            await index_caught_up(host)
            assert index_row(tmp_path, "a1") == (first["message"]["seq"], "t1", "settled answer")
            assert not ckpt(tmp_path, sid).exists()


async def test_late_partial_snapshot_cannot_overwrite_settled_result(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await setup(c)
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                   "message": assistant("a1", "partial", "streaming")})
            await c.call("session.appendMessage",
                         {"sessionId": sid, "message": assistant("a1", "settled", "completed")})
            late = await c.call("session.appendMessage", {"sessionId": sid,
                                                          "message": assistant("a1", "partial longer", "streaming")})
            assert late["replayed"] is True
            assert await save(c, sid, "t1", assistant("a1", "partial longer", "streaming")) == {
                "saved": False, "reason": "already_indexed"}
            got = await c.call("session.get", {"sessionId": sid})
            assert got["messages"][1]["blocks"][0]["text"] == "settled"
            await index_caught_up(host)
            assert index_row(tmp_path, "a1")[2] == "settled"


async def test_duplicate_terminal_snapshot_cannot_overwrite_settled_result(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await setup(c)
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                   "message": assistant("a1", "partial", "streaming")})
            await c.call("session.appendMessage",
                         {"sessionId": sid, "message": assistant("a1", "settled", "completed")})
            dup = await rpc_error(c.call("session.appendMessage", {
                "sessionId": sid, "message": assistant("a1", "another ending", "completed")}))
            assert dup.data_code == "IDEMPOTENCY_CONFLICT"  # other content under a settled id (issue 25)
            same = await c.call("session.appendMessage",
                                {"sessionId": sid, "message": assistant("a1", "settled", "completed")})
            assert same["replayed"] is True
            got = await c.call("session.get", {"sessionId": sid})
            assert got["messages"][1]["blocks"][0]["text"] == "settled"
            await index_caught_up(host)
            assert index_row(tmp_path, "a1")[2] == "settled"


async def test_checkpoint_follows_the_cross_session_id_remap(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            first = await setup(c)
            await c.call("session.appendMessage", {"sessionId": first, "turnId": "t1",
                                                   "message": assistant("a1", "done")})
            second = await new_session(c)
            await start(c, second, "t2")
            assert await save(c, second, "t2", assistant("a1", "partial")) == {"saved": True}
            assert json.loads(ckpt(tmp_path, second).read_bytes())["message"]["id"] == f"{second}:a1"
            r = await c.call("session.appendMessage", {"sessionId": second, "turnId": "t2",
                                                       "message": assistant("a1", "final")})
            assert r["message"]["id"] == f"{second}:a1"
            assert not ckpt(tmp_path, second).exists()


async def test_failed_checkpoint_write_leaves_the_previous_checkpoint(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await setup(c)
            await save(c, sid, "t1", assistant("a1", "version one"))
            host.faults.add("inflight.after_tmp_fsync", nth=host.faults.hits("inflight.after_tmp_fsync") + 1,
                            action="eio")
            err = await rpc_error(save(c, sid, "t1", assistant("a1", "version two")))
            host.faults.clear()
            assert err.data_code == "IO_ERROR"
            body = json.loads(ckpt(tmp_path, sid).read_bytes())
            assert body["message"]["blocks"][0]["text"] == "version one"
            assert [n for n in os.listdir(tmp_path / "sessions") if ".tmp." in n] == []
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                   "message": assistant("a1", "final")})
            assert not ckpt(tmp_path, sid).exists()


def transcript_messages(root: Path, sid: str) -> list[dict]:
    lines = [json.loads(raw) for raw in (root / "sessions" / f"{sid}.jsonl").read_bytes().splitlines() if raw]
    return [line for line in lines if line.get("type") == "message"]


async def test_the_remap_holds_after_the_other_sessions_row_is_gone(tmp_path):
    """D444: a replay of the original id is a no-op against the remapped row, also once the session that
    held the id deleted or rewrote its row away; a streaming reservation stored under the remapped id is
    still replaced by its final (and its checkpoint removed), never written again as a second reply."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            a = await new_session(c)
            await c.call("session.appendMessage", {"sessionId": a, "message": msg("m0", "first")})
            await c.call("session.appendMessage", {"sessionId": a, "message": msg("m1", "hello")})
            await c.call("session.appendMessage", {"sessionId": a, "message": assistant("a1", "a's reply")})
            b = await setup(c)
            held = await c.call("session.appendMessage", {"sessionId": b, "message": msg("m1", "hello")})
            assert held["message"]["id"] == f"{b}:m1" and held["remappedFrom"] == "m1"
            first = await c.call("session.appendMessage", {"sessionId": b, "turnId": "t1",
                                                           "message": assistant("a1", "partial", "streaming")})
            assert first["message"]["id"] == f"{b}:a1"
            assert await save(c, b, "t1", assistant("a1", "partial more", "streaming")) == {"saved": True}
            await c.call("session.truncateFrom", {"sessionId": a, "messageId": "m1", "mode": "edit"})
            again = await c.call("session.appendMessage", {"sessionId": b, "message": msg("m1", "hello")})
            assert again["replayed"] is True and again["message"]["id"] == f"{b}:m1"
            await c.call("session.delete", {"sessionId": a})
            assert await save(c, b, "t1", assistant("a1", "partial more still", "streaming")) == {"saved": True}
            assert json.loads(ckpt(tmp_path, b).read_bytes())["message"]["id"] == f"{b}:a1"
            final = await c.call("session.appendMessage", {"sessionId": b, "turnId": "t1",
                                                           "message": assistant("a1", "final answer")})
            assert final["message"]["id"] == f"{b}:a1" and final["message"]["seq"] == first["message"]["seq"]
            assert not ckpt(tmp_path, b).exists()
            await end(c, b, "t1")
            want = ["u1", f"{b}:m1", f"{b}:a1"]
            assert [m["id"] for m in (await c.call("session.get", {"sessionId": b}))["messages"]] == want
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            got = (await c.call("session.get", {"sessionId": b}))["messages"]
            assert [m["id"] for m in got] == want and got[2]["blocks"][0]["text"] == "final answer"


async def test_a_checkpoint_never_replaces_a_user_row_marked_streaming(tmp_path):
    """Only an assistant line awaits its final: a user message whose meta says ``status: streaming`` is
    settled. An assistant checkpoint under its id was saved, and recovery then served the user's prompt
    as the assistant's partial reply."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            await start(c, sid, "t1")
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1", "message": msg(
                "u1", "my prompt", meta={"status": "streaming"})})
            assert await save(c, sid, "t1", assistant("u1", "assistant text", "streaming")) == {
                "saved": False, "reason": "already_indexed"}
            err = await rpc_error(c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                                   "message": assistant("u1", "final")}))
            assert err.data_code == "IDEMPOTENCY_CONFLICT"
            await c.call("session.recoverInflight", {"sessionId": sid, "turnId": "t1"})
            got = (await c.call("session.get", {"sessionId": sid}))["messages"]
            assert [(m["id"], m["role"], m["blocks"][0]["text"]) for m in got] == [("u1", "user", "my prompt")]


async def test_the_replacing_final_keeps_the_owning_turn_in_the_transcript(tmp_path):
    """Seed 003: the terminal assistant replaces the streaming row 'retaining sequence, owning turn'.
    A final sent without its turnId (the outbox's) is written with the reservation's turn, so a rebuilt
    index and session.context keep it; a final naming another turn is refused."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await setup(c)
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                   "message": assistant("a1", "partial", "streaming")})
            other = await rpc_error(c.call("session.appendMessage", {
                "sessionId": sid, "message": assistant("a1", "final", turnId="tX")}))
            assert other.data_code == "IDEMPOTENCY_CONFLICT"
            final = await c.call("session.appendMessage", {"sessionId": sid, "message": assistant("a1", "final")})
            assert final["message"]["turnId"] == "t1"
            assert [m.get("turnId") for m in transcript_messages(tmp_path, sid)][-1] == "t1"
            context = await c.call("session.context", {"sessionId": sid})
            assert [m.get("turnId") for m in context["messages"]] == ["t1", "t1"]
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (tmp_path / name).unlink(missing_ok=True)
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            got = (await c.call("session.get", {"sessionId": sid}))["messages"]
            assert [(m["id"], m.get("turnId")) for m in got] == [("u1", "t1"), ("a1", "t1")]


async def test_a_remapped_long_id_stays_a_usable_wire_id(tmp_path):
    """D444 + the 200-character wire id limit: '{sessionId}:{id}' of a 190-character id is 223 characters,
    which no method accepted back (messageAround from a search hit, deleteMessage, fork, truncateFrom).
    Such an id is remapped to '{sessionId}:sha256={40 hex}'; the client's id still finds it."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            a, b = await new_session(c), await new_session(c)
            long_id = "m" * 190
            await c.call("session.appendMessage", {"sessionId": a, "message": msg(long_id, "first copy")})
            got = await c.call("session.appendMessage", {"sessionId": b, "message": msg(long_id, "second copy")})
            mid = got["message"]["id"]
            assert got["remappedFrom"] == long_id and len(mid) <= 200 and mid.startswith(f"{b}:sha256=")
            replay = await c.call("session.appendMessage", {"sessionId": b, "message": msg(long_id, "second copy")})
            assert replay["replayed"] is True and replay["message"]["id"] == mid
            hit = (await c.call("search.query", {"query": "second copy"}))["results"][0]
            assert hit["messageId"] == mid
            page = await c.call("session.get", {"sessionId": b, "messageAround": mid, "messageLimit": 3})
            assert [m["id"] for m in page["messages"]] == [mid]
            await c.call("session.deleteMessage", {"sessionId": b, "messageId": long_id})  # the client's id
            assert [m.get("deleted") for m in (await c.call("session.get", {"sessionId": b}))["messages"]] == [True]


async def test_the_replacing_final_is_acknowledged_with_its_own_time(tmp_path):
    """The acknowledged answer of a final that replaced a streaming row carried the reservation's
    createdAt; reads, and the answer a retry rebuilt from the line's receipt after a crash, carry the
    final line's. One answer now."""
    from store.transcripts.records import rfc3339_to_ms
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await setup(c)
            first = await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1", "message": assistant(
                "a1", "partial", "streaming", createdAt="2026-01-01T00:00:00.000Z")})
            final = {"sessionId": sid, "turnId": "t1", "submissionId": "fin-1",
                     "message": assistant("a1", "final", createdAt="2026-01-01T00:00:05.000Z")}
            acked = await c.call("session.appendMessage", final)
            assert acked["message"]["createdAt"] == rfc3339_to_ms("2026-01-01T00:00:05.000Z", 0) \
                != first["message"]["createdAt"]
            got = (await c.call("session.get", {"sessionId": sid}))["messages"][1]
            assert rfc3339_to_ms(got["createdAt"], 0) == acked["message"]["createdAt"]
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):  # the receipt is rebuilt from the line
            (tmp_path / name).unlink(missing_ok=True)
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            again = await c.call("session.appendMessage", final)
            # (turn rows are database state: a rebuilt index binds the line to no turn row)
            assert again["message"]["createdAt"] == acked["message"]["createdAt"]
            assert {**again["message"], "turnId": "t1"} == acked["message"]
