"""Boot recovery: the interruption fence and the in-flight sweep (seed §3, §11 items 3 and 18)."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
import trio

from runtime.boot import run_boot
from runtime.client import open_client
from runtime.datadir import DataDir
from store.faults import NO_FAULTS, Faults, InjectedFault
from store.inflight import sweep
from tests.hostkit import client_for, index_caught_up, inprocess_host, msg, start_host_process
from tests.turns.turnkit import assistant, end, new_session, rpc_error, start


def ckpt(root: Path, sid: str) -> Path:
    return root / "sessions" / f"{sid}.inflight.json"


def message_lines(root: Path, sid: str, mid: str) -> list[dict]:
    out = []
    for line in (root / "sessions" / f"{sid}.jsonl").read_bytes().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("type") == "message" and rec.get("id") == mid:
            out.append(rec)
    return out


def db_rows(root: Path, sql: str, *args):
    conn = sqlite3.connect(root / "pi.sqlite")
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


async def prepare(root: Path, *, end_status: str | None, streaming_row: bool = False) -> str:
    """A session whose turn t1 left checkpoint a1 behind (its final row never landed)."""
    async with inprocess_host(root) as host, client_for(host) as c:
        sid = await new_session(c)
        await start(c, sid, "t1")
        await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1", "message": msg("u1", "question")})
        if streaming_row:
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                   "message": assistant("a1", "first words", "streaming")})
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                   "message": msg("s1", "steer", meta={"steering": True})})
        await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1",
                                                     "message": assistant("a1", "the reply so far", "streaming")})
        if end_status is not None:
            await end(c, sid, "t1", end_status)
        return sid


async def test_leftover_of_a_completed_turn_is_promoted_complete(tmp_path):
    with trio.fail_after(60):
        sid = await prepare(tmp_path, end_status="completed")
        assert ckpt(tmp_path, sid).exists()
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            status = await c.call("host.status", {})
            assert status["boot"]["inflight"]["promoted"] == 1
            assert status["boot"]["inflight"]["promotedIds"] == [
                {"sessionId": sid, "messageId": "a1", "status": "completed"}]
            got = await c.call("session.get", {"sessionId": sid})
            a1 = got["messages"][-1]
            assert a1["id"] == "a1" and a1["turnId"] == "t1" and a1["meta"]["status"] == "completed"
            assert a1["blocks"][0]["text"] == "the reply so far" and "interrupted" not in a1["meta"]
            assert not ckpt(tmp_path, sid).exists()
            await index_caught_up(host)
            assert db_rows(tmp_path, "SELECT turn_id FROM messages WHERE id = 'a1'") == [("t1",)]
            assert db_rows(tmp_path, "SELECT status FROM turns WHERE id = 't1'") == [("completed",)]


async def test_leftover_of_a_running_turn_is_promoted_aborted_under_the_aborted_turn(tmp_path):
    with trio.fail_after(60):
        sid = await prepare(tmp_path, end_status=None)
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            boot = (await c.call("host.status", {}))["boot"]
            assert boot["fence"]["abortedTurns"] == ["t1"]
            assert boot["inflight"]["promoted"] == 1
            got = await c.call("session.get", {"sessionId": sid})
            assert [m["id"] for m in got["messages"]] == ["u1", "a1"]
            meta = got["messages"][1]["meta"]
            assert meta["status"] == "aborted" and meta["interrupted"] is True
            await index_caught_up(host)
            assert db_rows(tmp_path, "SELECT status, error_code FROM turns") == [("aborted", "INTERRUPTED")]
            assert db_rows(tmp_path, "SELECT turn_id FROM messages WHERE id = 'a1'") == [("t1",)]
            kinds = [k for (k,) in db_rows(tmp_path, "SELECT kind FROM audit_log ORDER BY id")]
            assert kinds == ["turn_interrupted", "inflight_promoted"]
            # no notification for an aborted turn, nothing replayed
            assert db_rows(tmp_path, "SELECT COUNT(*) FROM notifications") == [(0,)]
            assert db_rows(tmp_path, "SELECT COUNT(*) FROM turns") == [(1,)]


async def test_the_final_reply_arriving_after_promotion_replaces_the_promoted_row(tmp_path):
    """Seed 003 §5: the terminal append replaces what stands in for it. Before, the sidecar's (or an
    outbox's) final append after the boot promotion answered ``replayed: true`` and wrote nothing: the
    transcript kept the partial reply, the complete one was lost while its sender believed it stored."""
    with trio.fail_after(60):
        sid = await prepare(tmp_path, end_status=None)
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            final = assistant("a1", "the reply so far, and the rest of it", "completed")
            params = {"sessionId": sid, "turnId": "t1", "message": final, "submissionId": "final-a1"}
            got = await c.call("session.appendMessage", params)
            assert got["replayed"] is False and got["message"]["seq"] == 2  # the promoted row's place
            assert await c.call("session.appendMessage", params) == got  # its retry: the receipt
            page = await c.call("session.get", {"sessionId": sid})
            assert [(m["id"], m["blocks"][0]["text"]) for m in page["messages"]] == [
                ("u1", "question"), ("a1", "the reply so far, and the rest of it")]
            hits = await c.call("search.query", {"query": "rest of it"})
            assert [h["messageId"] for h in hits["results"]] == ["a1"]
            # settled now: other content under the id is refused, a late partial changes nothing
            other = assistant("a1", "something else", "completed")
            err = await rpc_error(c.call("session.appendMessage", {"sessionId": sid, "message": other}))
            assert err.data_code == "IDEMPOTENCY_CONFLICT"
            late = await c.call("session.appendMessage", {"sessionId": sid, "message": assistant(
                "a1", "the reply", "streaming")})
            assert late["replayed"] is True
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            page = await c.call("session.get", {"sessionId": sid})
            assert [m["blocks"][0]["text"] for m in page["messages"]] == [
                "question", "the reply so far, and the rest of it"]


async def test_stale_responses_after_restart_are_refused(tmp_path):
    """Seed §11 item 18, the turn part: the fence aborts, nothing is replayed, stale updates fail."""
    with trio.fail_after(60):
        sid = await prepare(tmp_path, end_status=None)
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            err = await rpc_error(end(c, sid, "t1", "completed"))
            assert err.data_code == "CONFLICT"
            err = await rpc_error(c.call("session.saveInflightMessage", {
                "sessionId": sid, "turnId": "t1", "message": assistant("a2", "late words")}))
            assert err.data_code == "CONFLICT"
            assert not ckpt(tmp_path, sid).exists()
            # aborting again is the settled state: a no-op without a notification
            again = await end(c, sid, "t1", "aborted")
            assert again["turn"]["status"] == "aborted" and "notification" not in again
            # the session keeps working: a new turn starts normally
            fresh = await start(c, sid, "t2")
            assert fresh["status"] == "running"


async def test_steering_leftover_replaces_the_streaming_row_in_its_position(tmp_path):
    with trio.fail_after(60):
        sid = await prepare(tmp_path, end_status=None, streaming_row=True)
        seq_before = db_rows(tmp_path, "SELECT seq FROM messages WHERE id = 'a1'")
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            got = await c.call("session.get", {"sessionId": sid})
            assert [m["id"] for m in got["messages"]] == ["u1", "a1", "s1"]
            assert got["messages"][1]["blocks"][0]["text"] == "the reply so far"
            assert got["messages"][1]["meta"]["status"] == "aborted"
            await index_caught_up(host)
            assert db_rows(tmp_path, "SELECT seq, turn_id, text FROM messages WHERE id = 'a1'") == [
                (seq_before[0][0], "t1", "the reply so far")]
            assert not ckpt(tmp_path, sid).exists()


@pytest.mark.parametrize("point", ["inflight.after_append", "inflight.before_commit", "inflight.before_remove"])
async def test_crash_during_boot_promotion_promotes_once(tmp_path, point):
    with trio.fail_after(60):
        sid = await prepare(tmp_path, end_status=None)
        data = DataDir(tmp_path)
        faults = Faults()
        faults.add(point, nth=1, action="raise")

        def crashing_sweep(conn, data_dir, now_ms):
            return sweep(conn, sessions_dir=data_dir.sessions_dir, quarantine_dir=data_dir.quarantine_dir,
                         transcript_path=data_dir.transcript, now_ms=now_ms, faults=faults)

        with pytest.raises(InjectedFault):
            run_boot(data, faults=NO_FAULTS, now_ms=lambda: 1_800_000_000_000, inflight_sweep=crashing_sweep)
        assert ckpt(tmp_path, sid).exists()
        assert len(message_lines(tmp_path, sid, "a1")) == 1
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            inflight = (await c.call("host.status", {}))["boot"]["inflight"]
            assert inflight["promoted"] + inflight["removed"] == 1
            got = await c.call("session.get", {"sessionId": sid})
            assert [m["id"] for m in got["messages"]] == ["u1", "a1"]
            assert got["messages"][1]["meta"]["status"] == "aborted"
            assert not ckpt(tmp_path, sid).exists()
            await index_caught_up(host)
            assert db_rows(tmp_path, "SELECT COUNT(*) FROM messages WHERE id = 'a1'") == [(1,)]
            # at most one extra (identical, deduplicated keep-last) line for the re-promotion
            lines = message_lines(tmp_path, sid, "a1")
            assert 1 <= len(lines) <= 2 and all(line["meta"]["status"] == "aborted" for line in lines)


async def test_unreadable_or_orphaned_checkpoints_are_quarantined(tmp_path):
    with trio.fail_after(60):
        sid = await prepare(tmp_path, end_status="completed")
        ckpt(tmp_path, sid).write_bytes(b"{not json")
        (tmp_path / "sessions" / "ghost.inflight.json").write_bytes(json.dumps({
            "schema": 1, "sessionId": "ghost", "turnId": "t", "savedAt": 1,
            "message": {"id": "g1", "role": "assistant", "blocks": [{"type": "text", "text": "x"}]}}).encode())
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            inflight = (await c.call("host.status", {}))["boot"]["inflight"]
            assert inflight["promoted"] == 0 and len(inflight["quarantined"]) == 2
            assert sorted(n.split(".inflight.json")[0] for n in os.listdir(tmp_path / "quarantine")) == sorted(
                [sid, "ghost"])
            assert not ckpt(tmp_path, sid).exists()


def _call(url: str, token: str, calls: list[tuple[str, dict]]) -> list:
    async def run() -> list:
        async with open_client(url, token, client_id="chaos", client_kind="test") as c:
            return [await c.call(m, p) for m, p in calls]

    return trio.run(run)


def _close_pipes(proc) -> None:
    for pipe in (proc.proc.stdout, proc.proc.stderr):
        if pipe is not None:
            pipe.close()


def test_kill9_during_running_turn(tmp_path):
    """Seed §11 item 3 with a real process: SIGKILL mid-turn, torn trailing line, restart."""
    proc = start_host_process(tmp_path)
    try:
        sid = _call(proc.url, proc.token, [("session.create", {"title": "crashy"})])[0]["id"]
        calls: list[tuple[str, dict]] = [("session.startTurn", {"sessionId": sid, "turnId": "t1"})]
        calls += [("session.appendMessage", {"sessionId": sid, "turnId": "t1", "message": msg(f"m{i}", f"line {i}")})
                  for i in range(5)]
        calls += [("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1",
                                                   "message": assistant("a1", "streamed so far", "streaming")})]
        _call(proc.url, proc.token, calls)
    finally:
        proc.kill9()
        _close_pipes(proc)
    transcript = tmp_path / "sessions" / f"{sid}.jsonl"
    durable = transcript.read_bytes()
    with open(transcript, "ab") as fh:  # a crash mid-append leaves a torn trailing line
        fh.write(b'{"type":"message","id":"m9","role":"user","blo')
    proc = start_host_process(tmp_path)
    try:
        status, got, stale = _call(proc.url, proc.token, [
            ("host.status", {}), ("session.get", {"sessionId": sid}),
            ("notifications.list", {}),
        ])
        assert status["boot"]["fence"]["abortedTurns"] == ["t1"]
        assert status["boot"]["inflight"]["promoted"] == 1
        assert [m["id"] for m in got["messages"]] == ["m0", "m1", "m2", "m3", "m4", "a1"]
        assert got["messages"][-1]["meta"]["status"] == "aborted"
        assert stale["notifications"] == []
        # the file is intact up to the last fsynced line, the torn tail is quarantined, not dropped
        data = transcript.read_bytes()
        assert data.startswith(durable) and b'"m9"' not in data
        assert any(n.startswith(f"{sid}.jsonl.torn-") for n in os.listdir(tmp_path / "sessions"))
        assert db_rows(tmp_path, "SELECT status FROM turns WHERE id = 't1'") == [("aborted",)]
        assert db_rows(tmp_path, "PRAGMA integrity_check") == [("ok",)]
    finally:
        proc.terminate()
        _close_pipes(proc)


async def test_a_checkpoint_whose_bytes_changed_and_still_parse_is_quarantined_not_promoted(tmp_path):
    """RELIABILITY rule 9: a checkpoint carries a CRC and boot promotes only a valid one. Before, a byte
    changed on disk in the reply's text (still JSON) was promoted as the reply: "the reply so far" came
    back as "the reply so fbr", acknowledged by nobody. Now it is quarantined (kept, never deleted)."""
    with trio.fail_after(60):
        sid = await prepare(tmp_path, end_status="completed")
        body = ckpt(tmp_path, sid).read_bytes()
        assert body.count(b"so far") == 1 and b'"crc32":' in body
        ckpt(tmp_path, sid).write_bytes(body.replace(b"so far", b"so fbr"))
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            inflight = (await c.call("host.status", {}))["boot"]["inflight"]
            assert inflight["promoted"] == 0 and len(inflight["quarantined"]) == 1
            ids = [m["id"] for m in (await c.call("session.get", {"sessionId": sid}))["messages"]]
            assert ids == ["u1"]
        (kept,) = os.listdir(tmp_path / "quarantine")
        assert kept.startswith(f"{sid}.inflight.json") and b"so fbr" in (tmp_path / "quarantine" / kept).read_bytes()


async def test_a_checkpoint_an_earlier_build_wrote_without_a_crc_is_still_promoted(tmp_path):
    """A file written before the CRC (schema 1, no ``crc32``) is read as before."""
    with trio.fail_after(60):
        sid = await prepare(tmp_path, end_status="completed")
        body = json.loads(ckpt(tmp_path, sid).read_bytes())
        del body["crc32"]
        ckpt(tmp_path, sid).write_bytes(json.dumps(body).encode())
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            assert (await c.call("host.status", {}))["boot"]["inflight"]["promoted"] == 1
            got = (await c.call("session.get", {"sessionId": sid}))["messages"]
            assert [m["id"] for m in got] == ["u1", "a1"] and got[1]["blocks"][0]["text"] == "the reply so far"

async def session_with_a_reply_left(c, end_status: str) -> str:
    """A new session whose turn ``t1`` ended ``end_status`` (completed/error) with its reply ``a1`` only in the
    checkpoint file: the final row never landed, so the checkpoint is kept for the outbox or boot (D327)."""
    sid = await new_session(c)
    await start(c, sid, "t1")
    await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1", "message": msg("u1", "question")})
    await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1",
                                                 "message": assistant("a1", "the reply so far", "streaming")})
    await end(c, sid, "t1", end_status)
    return sid



@pytest.mark.parametrize(("end_status", "settled_as"), [("completed", "completed"), ("error", "aborted")])
async def test_the_next_turns_checkpoint_never_overwrites_the_reply_the_turn_before_left(
        tmp_path, end_status, settled_as):
    """Seed 003 §2.1/§5 (D327): a completed/error turn end keeps a checkpoint whose final row never
    landed, for the outbox or boot to settle. The session has one checkpoint file, and the next turn's
    first checkpoint replaced it: the reply was gone (boot promoted only the new turn's), the transcript
    answered ``u1`` with nothing. Now the next turn's start settles the leftover as boot would (the
    order a restart between the turns gives), and a checkpoint never replaces one an ended turn left."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await session_with_a_reply_left(c, end_status)
            await start(c, sid, "t2")
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t2", "message": msg("u2", "again")})
            saved = await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t2",
                                                                 "message": assistant("a2", "second reply")})
            assert saved == {"saved": True}
            page = await c.call("session.get", {"sessionId": sid})
            assert [m["id"] for m in page["messages"]] == ["u1", "a1", "u2"]  # settled when t2 started
            a1 = page["messages"][1]
            assert a1["blocks"][0]["text"] == "the reply so far" and a1["turnId"] == "t1"
            assert a1["meta"]["status"] == settled_as and a1["meta"]["recoveredFrom"] == "inflight"
            assert page["inflight"]["message"]["id"] == "a2"
            audit = db_rows(tmp_path, "SELECT payload_json FROM audit_log WHERE kind = 'inflight_promoted'")
            assert [json.loads(p)["messageId"] for (p,) in audit] == ["a1"]
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            page = await c.call("session.get", {"sessionId": sid})
            assert [(m["id"], m["meta"]["status"]) for m in page["messages"] if m["role"] == "assistant"] == [
                ("a1", settled_as), ("a2", "aborted")]


async def test_a_checkpoint_never_replaces_the_reply_an_ended_turn_left_even_when_the_start_could_not_settle_it(
        tmp_path):
    """The same leftover, when the next turn's start could not write it (a full disk there): that turn is
    started all the same (its answer says so), and its first checkpoint settles the leftover first."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path, faults_spec="append.before_write:2:enospc") as host, \
                client_for(host) as c:
            sid = await session_with_a_reply_left(c, "completed")
            assert (await start(c, sid, "t2"))["status"] == "running"  # started, though a1 could not be written
            assert json.loads(ckpt(tmp_path, sid).read_bytes())["message"]["id"] == "a1"  # still there
            saved = await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t2",
                                                                 "message": assistant("a2", "second reply")})
            assert saved == {"saved": True}
            page = await c.call("session.get", {"sessionId": sid})
            assert [(m["id"], m["meta"]["status"]) for m in page["messages"] if m["role"] == "assistant"] == [
                ("a1", "completed")]
            assert page["inflight"]["message"]["id"] == "a2"


async def test_a_keyed_start_that_settles_the_leftover_answers_its_turn_and_keeps_its_receipt(tmp_path):
    """The same leftover, settled by a keyed ``session.startTurn`` (``submissionId``, as every client
    retrying safely sends it): the promotion is not the call's effect, so its commit carries no receipt.
    It carried the start's: the start answered INTERNAL (its handler answered the turn, the receipt held
    the promoted message's ref) and a retry was answered with that ref instead of the turn. Found by
    tests/integrity/test_cross_connection_races.py under PIHOST_SOAK=1 (seeds 4 and 8)."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await session_with_a_reply_left(c, "completed")
            first = await start(c, sid, "t2", submissionId="start-t2")
            assert first["id"] == "t2" and first["status"] == "running"
            assert await start(c, sid, "t2", submissionId="start-t2") == first  # the retry: the same answer
            page = await c.call("session.get", {"sessionId": sid})
            assert [(m["id"], m["meta"]["status"]) for m in page["messages"] if m["role"] == "assistant"] == [
                ("a1", "completed")]
        async with inprocess_host(tmp_path) as host, client_for(host) as c:  # the receipt, from the database
            assert await start(c, sid, "t2", submissionId="start-t2") == first


async def test_a_keyed_checkpoint_that_settles_the_leftover_keeps_its_own_answer_as_its_receipt(tmp_path):
    """The leftover the start could not write (a full disk there), settled by the new turn's first keyed
    ``session.saveInflightMessage``: the promotion's commit stored the save's receipt with the promoted
    message's ref (the save's own receipt row was then ignored), so the retry was answered that ref
    (``{"id": "a1", ...}``)."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path, faults_spec="append.before_write:2:enospc") as host, \
                client_for(host) as c:
            sid = await session_with_a_reply_left(c, "completed")
            assert (await start(c, sid, "t2"))["status"] == "running"  # started, though a1 could not be written
            params = {"sessionId": sid, "turnId": "t2", "message": assistant("a2", "second reply"),
                      "submissionId": "save-a2"}
            assert await c.call("session.saveInflightMessage", params) == {"saved": True}
            page = await c.call("session.get", {"sessionId": sid})
            assert [(m["id"], m["meta"]["status"]) for m in page["messages"] if m["role"] == "assistant"] == [
                ("a1", "completed")]
        async with inprocess_host(tmp_path) as host, client_for(host) as c:  # the retry, from its receipt row
            assert await c.call("session.saveInflightMessage", params) == {"saved": True}
