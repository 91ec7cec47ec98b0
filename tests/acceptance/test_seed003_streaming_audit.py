"""Seed 003 "Active-turn steering transcript reservations" (the session.appendMessage paragraph), §5's turn-terminal
row (recoverInflight: a leftover checkpoint promoted under its turn) and §11 items 3 and 4, audited as an outsider
would test them: the points the adversarial acceptance file checks loosely or not at all. Every rule against a
real ``pi-host serve`` process, across a SIGKILL restart, over the documented wire protocol; every answer is
validated against its protocol model.

- a completed message's replay answers its first answer (``replayed`` aside) and writes no byte, also after a restart;
- a terminal assistant replacing a streaming reservation changes that row and its search text only (session.get
  order and every other row, ``search.sessions`` old and new text, the turn list);
- after the settled final: a late partial, the same final and another final change nothing, also after a restart
  (protocol README: ``replayed: true`` / ``IDEMPOTENCY_CONFLICT``; a checkpoint: ``already_indexed``);
- recovery promotes the newest checkpoint in the reservation's position, and the reservation's provisional text
  leaves search with it;
- a turn end (completed / error) keeps a streaming reservation's newer checkpoint for recovery;
- a final killed right after its line is durable wins over the leftover checkpoint at the next boot;
- a row recovery promoted takes one final and is settled after it; session.recoverInflight promotes the newer
  checkpoint the same way; one JSON-RPC batch of snapshots answers as the calls one by one would;
- a remapped id is what the transcript file holds, once, and the original spelling never reaches that file
  (also for a reservation recovery settles, after the owner session is deleted, and for the same fresh ids
  raced into two sessions);
- ``meta.steering`` round-trips as ``UiMessage.steering``, after a restart and after the index is lost.

Where the seed is loose the answers follow protocol/README.md ("A streaming snapshot of an id already stored
is replayed, whatever its content"; another final is ``IDEMPOTENCY_CONFLICT``) and docs/DESIGN.md (the
replacement is a later line with the same id: readers keep the last content at the first position, so the
file only grows while the read changes exactly that row)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from protocol.models_appends import AppendMessageResult
from protocol.models_inflight import SaveInflightResult
from protocol.models_search import SearchSessionsResult
from protocol.models_session import SessionGetResult
from protocol.models_usage import ListTurnsResult
from runtime.client import ClientClosed, HostClient, open_client
from tests.acceptance.outsiderkit import client, code_of, data_dir, real_host
from tests.hostkit import msg, start_host_process


async def append(c: HostClient, sid: str, message: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """``session.appendMessage``; its answer, validated."""
    result: dict[str, Any] = await c.call("session.appendMessage", {"sessionId": sid, "message": message, **extra})
    AppendMessageResult.model_validate(result)
    return result


async def full(c: HostClient, sid: str) -> dict[str, Any]:
    result: dict[str, Any] = await c.call("session.get", {"sessionId": sid, "full": True})
    SessionGetResult.model_validate(result)
    return result


async def checkpoint(c: HostClient, sid: str, turn: str, message: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = await c.call("session.saveInflightMessage",
                                          {"sessionId": sid, "turnId": turn, "message": message})
    SaveInflightResult.model_validate(result)
    return result


async def sessions_matching(c: HostClient, query: str) -> dict[str, list[str]]:
    """``search.sessions``: each matching session and the ids of its matching messages."""
    result = await c.call("search.sessions", {"query": query})
    SearchSessionsResult.model_validate(result)
    return {r["sessionId"]: sorted(s["messageId"] for s in r["snippets"]) for r in result["results"]}


async def turns(c: HostClient, sid: str) -> list[dict[str, Any]]:
    result = await c.call("session.listTurns", {"sessionId": sid})
    ListTurnsResult.model_validate(result)
    listed: list[dict[str, Any]] = result["turns"]
    return listed


def streaming(mid: str, text: str, turn: str) -> dict[str, Any]:
    return msg(mid, text, role="assistant", turnId=turn, meta={"status": "streaming"})


def drop_index(root: Path) -> None:
    for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
        (root / name).unlink(missing_ok=True)


def without_replayed(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k != "replayed"}


async def test_a_completed_message_replay_answers_its_first_answer_and_writes_nothing(tmp_path: Path) -> None:
    """"session.appendMessage retains idempotent replay for completed messages": the same user row and the same
    completed assistant row sent again (unkeyed, and keyed under a new submissionId) answer what they first
    answered with ``replayed: true``; the transcript file keeps every byte, also when the replay comes after a
    SIGKILL restart."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            rows = [msg("u1", "ask the aardvark", turnId="t1"),
                    msg("a1", "aardvark answer", role="assistant", turnId="t1", meta={"status": "completed"})]
            first = [await append(c, sid, m) for m in rows]
            assert [a["replayed"] for a in first] == [False, False]
            await c.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed"})
            transcript = root / "sessions" / f"{sid}.jsonl"
            on_disk = transcript.read_bytes()
            view = await full(c, sid)
            for m, answer in zip(rows, first, strict=True):
                again = await append(c, sid, m)
                assert again["replayed"] is True and without_replayed(again) == without_replayed(answer)
                keyed = await append(c, sid, m, submissionId=f"retry-{m['id']}")
                assert keyed["replayed"] is True and without_replayed(keyed) == without_replayed(answer)
            late = await append(c, sid, streaming("a1", "a streaming snapshot after all", "t1"))
            assert late["replayed"] is True and late["message"]["seq"] == first[1]["message"]["seq"]
            assert transcript.read_bytes() == on_disk
            assert (await full(c, sid))["messages"] == view["messages"]
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            for m, answer in zip(rows, first, strict=True):
                again = await append(c, sid, m)
                assert again["replayed"] is True and without_replayed(again) == without_replayed(answer)
            assert transcript.read_bytes() == on_disk
            assert [m["id"] for m in (await full(c, sid))["messages"]] == ["u1", "a1"]


async def _steered(c: HostClient) -> tuple[str, str, dict[str, Any]]:
    """A session with a finished turn t0 (u0, a0) and a running turn t1 holding u1, the streaming reservation a1
    ("provisional ocelot"), the steering row s1 and a tool row a2 after it; a second
    session with a row of its own. The two session ids and a1's reservation answer."""
    sid = (await c.call("session.create", {}))["id"]
    other = (await c.call("session.create", {}))["id"]
    await append(c, other, msg("o1", "unrelated marmot"))
    await c.call("session.startTurn", {"sessionId": sid, "turnId": "t0"})
    await append(c, sid, msg("u0", "earlier question", turnId="t0"))
    await append(c, sid, msg("a0", "earlier answer", role="assistant", turnId="t0"))
    await c.call("session.endTurn", {"sessionId": sid, "turnId": "t0", "status": "completed"})
    await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
    await append(c, sid, msg("u1", "now the real question", turnId="t1"))
    reserved = await append(c, sid, streaming("a1", "provisional ocelot", "t1"))
    steer = await append(c, sid, msg("s1", "steer: mention the heron", meta={"steering": True}))
    assert not steer["replayed"]
    await append(c, sid, msg("a2", "a tool ran meanwhile", role="tool", toolName="Bash", turnId="t1"))
    return sid, other, reserved


async def test_a_terminal_final_changes_exactly_its_row_and_search_text(tmp_path: Path) -> None:
    """"It updates exactly that transcript line and search text, retaining sequence, owning turn and every
    other row": a final without ``turnId`` replaces the reservation a1 at its seq, under t1; every other row of
    the session (and the other session) reads back unchanged; ``search.sessions`` finds the final's word and
    no longer the provisional one; the turn list is unchanged; the transcript file only grew. The same after a
    SIGKILL restart and after the index is rebuilt from the files (where a late partial and another final are
    still no-ops)."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid, other, reserved = await _steered(c)
            before = await full(c, sid)
            other_before = await full(c, other)
            turns_before = await turns(c, sid)
            assert await sessions_matching(c, "ocelot") == {sid: ["a1"]}
            transcript = root / "sessions" / f"{sid}.jsonl"
            bytes_before = transcript.read_bytes()
            await c.call("session.startTurn", {"sessionId": other, "turnId": "t9"})
            for wrong in (msg("a1", "settled heron", role="assistant", turnId="t9", meta={"status": "completed"}),
                          msg("a1", "settled heron", role="user", meta={"status": "completed"})):
                assert await code_of(c, "session.appendMessage", {"sessionId": sid, "message": wrong}) \
                    == "IDEMPOTENCY_CONFLICT", wrong
            assert transcript.read_bytes() == bytes_before
            final = await append(c, sid, msg("a1", "settled heron", role="assistant",
                                             meta={"status": "completed"}))
            assert final["replayed"] is False
            assert final["message"]["seq"] == reserved["message"]["seq"]
            assert final["message"]["turnId"] == "t1"

            async def check(restarted: bool) -> None:
                after = await full(c, sid)
                ids = [m["id"] for m in after["messages"]]
                assert ids == ["u0", "a0", "u1", "a1", "s1", "a2"]
                assert [m["seq"] for m in after["messages"]] == [m["seq"] for m in before["messages"]]
                for old, new in zip(before["messages"], after["messages"], strict=True):
                    if old["id"] != "a1":
                        assert new == old
                a1 = after["messages"][3]
                assert a1["blocks"] == [{"type": "text", "text": "settled heron"}]
                assert a1["turnId"] == "t1" and a1["meta"]["status"] == "completed"
                assert after["messages"][4].get("steering") is True
                assert after["messages"][4]["meta"] == {"steering": True}
                assert after["session"]["messageCount"] == before["session"]["messageCount"] == 6
                assert await sessions_matching(c, "heron") == {sid: ["a1", "s1"]}
                assert await sessions_matching(c, "ocelot") == {}
                assert (await full(c, other))["messages"] == other_before["messages"]
                listed = await turns(c, sid)
                if restarted:  # §11.3: the restart aborted the running turn t1, and nothing else
                    assert {t["id"]: t["status"] for t in listed} == {"t0": "completed", "t1": "aborted"}
                    listed = [t if t["id"] != "t1" else next(b for b in turns_before if b["id"] == "t1")
                              for t in listed]
                assert listed == turns_before

            await check(False)
            assert transcript.read_bytes().startswith(bytes_before)
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            await check(True)
            proc.kill9()
        drop_index(root)
        async with real_host(root, kind="agent") as (proc, c):
            after = await full(c, sid)
            assert [m["id"] for m in after["messages"]] == ["u0", "a0", "u1", "a1", "s1", "a2"]
            assert after["messages"][3]["blocks"] == [{"type": "text", "text": "settled heron"}]
            assert after["messages"][4].get("steering") is True
            assert await sessions_matching(c, "heron") == {sid: ["a1", "s1"]}
            assert await sessions_matching(c, "ocelot") == {}
            # the index rebuilt from the files knows a1 is settled: a late partial and another final change nothing
            late = await append(c, sid, streaming("a1", "provisional ocelot, late", "t1"))
            assert late["replayed"] is True and late["message"]["seq"] == after["messages"][3]["seq"]
            assert await code_of(c, "session.appendMessage", {"sessionId": sid, "message": msg(
                "a1", "another ocelot final", role="assistant", turnId="t1", meta={"status": "completed"})}) \
                == "IDEMPOTENCY_CONFLICT"
            assert (await full(c, sid))["messages"] == after["messages"]
            assert await sessions_matching(c, "ocelot") == {}


async def test_late_partials_and_duplicate_finals_never_overwrite_the_settled_result_across_a_restart(
        tmp_path: Path) -> None:
    """"Late partial snapshots and duplicate terminal snapshots cannot overwrite the settled result", answered
    as protocol/README.md has it: a streaming snapshot of a stored id is replayed whatever its content, the same
    final is replayed, another final is IDEMPOTENCY_CONFLICT, a checkpoint is dropped as ``already_indexed`` —
    before and after a SIGKILL restart (the index then rebuilt its notion of streaming rows), with no byte
    written by any of them and no stale word in search."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid, _, reserved = await _steered(c)
            final_msg = msg("a1", "settled heron", role="assistant", turnId="t1", meta={"status": "completed"})
            final = await append(c, sid, final_msg)
            transcript = root / "sessions" / f"{sid}.jsonl"
            settled_bytes = transcript.read_bytes()
            settled = (await full(c, sid))["messages"]

            async def no_op_attempts() -> None:
                late = await append(c, sid, streaming("a1", "provisional ocelot and stale ibis", "t1"))
                assert late["replayed"] is True and late["message"]["seq"] == reserved["message"]["seq"]
                empty_late = await append(c, sid, streaming("a1", "", "t1") | {"blocks": []})
                assert empty_late["replayed"] is True
                dup = await append(c, sid, final_msg)
                assert dup["replayed"] is True and without_replayed(dup) == without_replayed(final)
                assert await code_of(c, "session.appendMessage", {"sessionId": sid, "message": msg(
                    "a1", "another stale ibis final", role="assistant", turnId="t1",
                    meta={"status": "completed"})}) == "IDEMPOTENCY_CONFLICT"
                cp = await checkpoint(c, sid, "t1", streaming("a1", "stale ibis checkpoint", "t1"))
                assert cp == {"saved": False, "reason": "already_indexed"}
                view = await full(c, sid)
                assert view["messages"] == settled and not view.get("inflight")
                assert await sessions_matching(c, "ibis") == {}
                assert transcript.read_bytes() == settled_bytes

            await no_op_attempts()
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            assert (await c.call("host.status", {}))["boot"]["inflightPromoted"] == 0
            # the restart aborted t1: a checkpoint now is refused for its turn, not saved
            assert await code_of(c, "session.saveInflightMessage", {"sessionId": sid, "turnId": "t1", "message":
                                 streaming("a1", "stale ibis checkpoint", "t1")}) == "CONFLICT"
            late = await append(c, sid, streaming("a1", "provisional ocelot and stale ibis", "t1"))
            assert late["replayed"] is True
            assert (await append(c, sid, final_msg))["replayed"] is True
            assert await code_of(c, "session.appendMessage", {"sessionId": sid, "message": msg(
                "a1", "another stale ibis final", role="assistant", turnId="t1",
                meta={"status": "completed"})}) == "IDEMPOTENCY_CONFLICT"
            view = await full(c, sid)
            assert [{k: v for k, v in m.items() if k != "seq"} for m in view["messages"]] == \
                [{k: v for k, v in m.items() if k != "seq"} for m in settled]
            assert await sessions_matching(c, "ibis") == {}
            assert transcript.read_bytes() == settled_bytes


async def test_recovery_promotes_the_newest_checkpoint_in_place_and_the_provisional_text_leaves_search(
        tmp_path: Path) -> None:
    """"The host stores the provisional row and an in-flight checkpoint ... Recovery promotes the latest
    checkpoint in that same position" (§5: "a promoted checkpoint gets an index row under the turn"): a
    non-empty reservation, a steering row and a later row after it, three checkpoints, SIGKILL. After the
    restart a1 holds the newest checkpoint at its reserved seq (not at the end), aborted + interrupted under t1;
    its provisional word is gone from search and the newest one found; a second restart changes nothing."""
    root = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(root, kind="agent") as (proc, c):
            sid, _, reserved = await _steered(c)
            for text in ("chunk one", "chunk one, chunk two", "chunk one, chunk two, final quokka"):
                assert (await checkpoint(c, sid, "t1", streaming("a1", text, "t1")))["saved"] is True
            before = await full(c, sid)
            assert before["inflight"]["message"]["id"] == "a1"
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            status = await c.call("host.status", {})
            assert status["boot"]["inflightPromoted"] >= 1
            view = await full(c, sid)
            assert [m["id"] for m in view["messages"]] == ["u0", "a0", "u1", "a1", "s1", "a2"]
            a1 = view["messages"][3]
            assert a1["seq"] == reserved["message"]["seq"]
            assert a1["blocks"] == [{"type": "text", "text": "chunk one, chunk two, final quokka"}]
            assert a1["turnId"] == "t1"
            assert a1["meta"]["status"] == "aborted" and a1["meta"]["interrupted"] is True
            assert a1["meta"]["recoveredFrom"] == "inflight"
            for old, new in zip(before["messages"], view["messages"], strict=True):
                if old["id"] != "a1":
                    assert new == old
            assert view["messages"][4].get("steering") is True
            assert not view.get("inflight")
            assert await sessions_matching(c, "quokka") == {sid: ["a1"]}
            assert await sessions_matching(c, "ocelot") == {}
            listed = await turns(c, sid)
            assert sorted((t["id"], t["status"]) for t in listed) == [("t0", "completed"), ("t1", "aborted")]
            settled = view["messages"]
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            assert (await c.call("host.status", {}))["boot"]["inflightPromoted"] == 0
            assert (await full(c, sid))["messages"] == settled
            assert await sessions_matching(c, "ocelot") == {}


async def test_a_remapped_id_is_the_only_spelling_in_the_transcript_file(tmp_path: Path) -> None:
    """"If messages.id already belongs to another session, the host remaps to {sessionId}:{id} before any JSONL
    write; a replay of the original id is a no-op against that remapped row": the colliding session's file holds
    the remapped id exactly once and never the bare one, after replays before and after a SIGKILL restart; the
    owner's file is unchanged; a streaming reservation under a taken id is remapped the same way and its final
    (sent under the original id) replaces that remapped row."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            owner = (await c.call("session.create", {}))["id"]
            sid = (await c.call("session.create", {}))["id"]
            await append(c, owner, msg("shared-u", "owner's words"))
            await append(c, owner, msg("shared-a", "owner's reply", role="assistant"))
            owner_file = root / "sessions" / f"{owner}.jsonl"
            owner_bytes = owner_file.read_bytes()
            first = await append(c, sid, msg("shared-u", "collider's words"))
            assert first["remappedFrom"] == "shared-u" and first["message"]["id"] == f"{sid}:shared-u"
            again = await append(c, sid, msg("shared-u", "collider's words"))
            assert again["replayed"] is True and again["message"] == first["message"]
            assert await code_of(c, "session.appendMessage", {"sessionId": sid, "message": msg(
                "shared-u", "collider's other words")}) == "IDEMPOTENCY_CONFLICT"
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            reserved = await append(c, sid, streaming("shared-a", "provisional tapir", "t1"))
            assert reserved["remappedFrom"] == "shared-a" and reserved["message"]["id"] == f"{sid}:shared-a"
            await append(c, sid, msg("s1", "steer", meta={"steering": True}))
            final = await append(c, sid, msg("shared-a", "settled tapir", role="assistant",
                                             meta={"status": "completed"}))
            assert final["replayed"] is False and final["message"]["id"] == f"{sid}:shared-a"
            assert final["message"]["seq"] == reserved["message"]["seq"]
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            assert (await append(c, sid, msg("shared-u", "collider's words")))["replayed"] is True
            late = await append(c, sid, streaming("shared-a", "late tapir", "t1"))
            assert late["replayed"] is True and late["message"]["id"] == f"{sid}:shared-a"
            view = await full(c, sid)
            assert [(m["id"], m["blocks"][0]["text"]) for m in view["messages"]] == [
                (f"{sid}:shared-u", "collider's words"), (f"{sid}:shared-a", "settled tapir"), ("s1", "steer")]
            assert [m["id"] for m in (await full(c, owner))["messages"]] == ["shared-u", "shared-a"]
        data = (root / "sessions" / f"{sid}.jsonl").read_bytes()
        assert data.count(f'"id":"{sid}:shared-u"'.encode()) == 1
        assert b'"id":"shared-u"' not in data and b'"id":"shared-a"' not in data
        assert owner_file.read_bytes() == owner_bytes


async def test_a_turn_end_keeps_the_newer_checkpoint_of_a_streaming_reservation_for_recovery(
        tmp_path: Path) -> None:
    """§5 "completed/error: remove the in-flight checkpoint only when its id is already indexed" meets "Further
    stream checkpoints remain valid while the indexed assistant has status: streaming": a reservation's id is
    indexed, but only as the provisional row, so the turn end (completed, and error) must not drop the newer
    checkpoint. The final never lands, SIGKILL: recovery promotes that newest checkpoint in the reserved
    position (complete when the turn completed, aborted + interrupted when it failed), not the provisional text."""
    for status in ("completed", "error"):
        root = tmp_path / status
        root.mkdir()
        with trio.fail_after(90):
            async with real_host(root, kind="agent") as (proc, c):
                sid, _, reserved = await _steered(c)
                saved = await checkpoint(c, sid, "t1", streaming("a1", "newer wallaby", "t1"))
                assert saved["saved"] is True
                await c.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": status})
                assert (await full(c, sid))["messages"][3]["meta"]["status"] == "streaming"
                proc.kill9()
            async with real_host(root, kind="agent") as (proc, c):
                view = await full(c, sid)
                assert [m["id"] for m in view["messages"]] == ["u0", "a0", "u1", "a1", "s1", "a2"]
                a1 = view["messages"][3]
                assert a1["seq"] == reserved["message"]["seq"] and a1["turnId"] == "t1"
                assert a1["blocks"] == [{"type": "text", "text": "newer wallaby"}], (status, a1)
                assert a1["meta"]["recoveredFrom"] == "inflight"
                if status == "completed":
                    assert a1["meta"]["status"] == "completed"
                else:
                    assert a1["meta"]["status"] == "aborted" and a1["meta"]["interrupted"] is True
                assert await sessions_matching(c, "wallaby") == {sid: ["a1"]}
                assert await sessions_matching(c, "ocelot") == {}


async def test_one_batch_of_snapshots_settles_as_the_same_calls_one_by_one(tmp_path: Path) -> None:
    """The rules inside one append group (a JSON-RPC batch: the host plans every entry together): the
    reservation, a further partial, the final, a late partial, the same final, another final and the steering
    row, in one frame. Each answers as it would alone (replayed / replaced / IDEMPOTENCY_CONFLICT), the final
    holds the reservation's seq, the rows read u1, a1, s1, and a SIGKILL restart reads the same."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            await append(c, sid, msg("u1", "ask", turnId="t1"))
            final = msg("a1", "settled numbat", role="assistant", turnId="t1", meta={"status": "completed"})
            calls = [streaming("a1", "partial", "t1"), streaming("a1", "partial, more", "t1"), final,
                     streaming("a1", "partial, stale bilby", "t1"), final,
                     msg("a1", "other bilby final", role="assistant", turnId="t1", meta={"status": "completed"}),
                     msg("s1", "steer", meta={"steering": True})]
            answers = await c.batch([("session.appendMessage", {"sessionId": sid, "message": m}) for m in calls])
            ok = [a for a in answers if isinstance(a, dict)]
            for a in ok:
                AppendMessageResult.model_validate(a)
            assert [a["replayed"] if isinstance(a, dict) else a.data_code for a in answers] == [
                False, True, False, True, True, "IDEMPOTENCY_CONFLICT", False]
            assert len({a["message"]["seq"] for a in answers[:5]}) == 1
            view = await full(c, sid)
            rows = [(m["id"], m["blocks"][0]["text"], (m.get("meta") or {}).get("status")) for m in view["messages"]]
            assert rows == [("u1", "ask", None), ("a1", "settled numbat", "completed"), ("s1", "steer", None)]
            assert await sessions_matching(c, "bilby") == {}
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            view = await full(c, sid)
            assert [(m["id"], m["blocks"][0]["text"]) for m in view["messages"]] == [
                ("u1", "ask"), ("a1", "settled numbat"), ("s1", "steer")]
            assert await sessions_matching(c, "numbat") == {sid: ["a1"]}


async def test_a_promoted_row_takes_one_final_and_is_settled_after_it(tmp_path: Path) -> None:
    """protocol/README.md: a row boot promoted from a checkpoint "is replaced the same way by the final of its
    id". Once that final replaced it, the row is settled like any other: another final is
    IDEMPOTENCY_CONFLICT, the same final and a late partial are replayed, also after one more restart."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid, _, reserved = await _steered(c)
            assert (await checkpoint(c, sid, "t1", streaming("a1", "checkpointed dingo", "t1")))["saved"] is True
            proc.kill9()
        final = msg("a1", "the real dingo final", role="assistant", turnId="t1", meta={"status": "completed"})
        other = msg("a1", "a second dingo final", role="assistant", turnId="t1", meta={"status": "completed"})
        for restart in range(2):
            async with real_host(root, kind="agent") as (proc, c):
                if restart == 0:
                    assert (await full(c, sid))["messages"][3]["meta"]["recoveredFrom"] == "inflight"
                    replaced = await append(c, sid, final)
                    assert replaced["replayed"] is False
                    assert replaced["message"]["seq"] == reserved["message"]["seq"]
                assert await code_of(c, "session.appendMessage", {"sessionId": sid, "message": other}) \
                    == "IDEMPOTENCY_CONFLICT"
                assert (await append(c, sid, final))["replayed"] is True
                assert (await append(c, sid, streaming("a1", "late dingo partial", "t1")))["replayed"] is True
                view = await full(c, sid)
                assert [m["id"] for m in view["messages"]] == ["u0", "a0", "u1", "a1", "s1", "a2"]
                assert view["messages"][3]["blocks"] == [{"type": "text", "text": "the real dingo final"}]
                assert await sessions_matching(c, "dingo") == {sid: ["a1"]}
                assert await sessions_matching(c, "second") == {}
                assert await sessions_matching(c, "checkpointed") == {}
                proc.kill9()


async def test_recover_inflight_promotes_the_newer_checkpoint_over_the_provisional_text(tmp_path: Path) -> None:
    """§5 recoverInflight (the sidecar is lost while the host runs) with a reservation whose checkpoint is newer
    than its provisional text: the promoted row holds the checkpoint's content at the reserved seq, the
    provisional word leaves search, and a SIGKILL restart keeps it so."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid, _, reserved = await _steered(c)
            assert (await checkpoint(c, sid, "t1", streaming("a1", "newest platypus", "t1")))["saved"] is True
            got = await c.call("session.recoverInflight", {"sessionId": sid, "turnId": "t1"})
            assert got["action"] == "promoted" and got["message"]["seq"] == reserved["message"]["seq"]
            settled = (await full(c, sid))["messages"]
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            view = await full(c, sid)
            assert view["messages"] == settled
            assert [m["id"] for m in view["messages"]] == ["u0", "a0", "u1", "a1", "s1", "a2"]
            assert view["messages"][3]["blocks"] == [{"type": "text", "text": "newest platypus"}]
            assert view["messages"][3]["meta"]["status"] == "aborted"
            assert await sessions_matching(c, "platypus") == {sid: ["a1"]}
            assert await sessions_matching(c, "ocelot") == {}


async def _remapped_reservation(c: HostClient) -> tuple[str, str, int]:
    """Two sessions: ``owner`` holds the bare id ``shared-r``; in ``sid`` turn t1's streaming reservation of that
    id is stored remapped as ``{sid}:shared-r``, a steering input after it. Returns ``(owner, sid, the
    reservation's seq)``."""
    owner: str = (await c.call("session.create", {}))["id"]
    await append(c, owner, msg("shared-r", "owner's reply", role="assistant"))
    sid: str = (await c.call("session.create", {}))["id"]
    await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
    await append(c, sid, msg("u1", "ask", turnId="t1"))
    reserved = await append(c, sid, streaming("shared-r", "provisional", "t1"))
    assert reserved["message"]["id"] == f"{sid}:shared-r"
    await append(c, sid, msg("s1", "steer", meta={"steering": True}))
    seq: int = reserved["message"]["seq"]
    return owner, sid, seq


async def test_a_remapped_reservation_recovered_after_a_kill_keeps_the_remapped_spelling_on_disk(
        tmp_path: Path) -> None:
    """The remap "before any JSONL write" for the line recovery writes: a reservation stored as
    {sessionId}:{id}, a checkpoint saved under the original id, SIGKILL. The promoted line carries the remapped
    id (the file never holds the bare one), reads back in the reserved position, and the final under the
    original id then replaces it."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            owner, sid, seq = await _remapped_reservation(c)
            assert (await checkpoint(c, sid, "t1", streaming("shared-r", "checkpoint emu", "t1")))["saved"] is True
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            view = await full(c, sid)
            assert [(m["id"], m["blocks"][0]["text"]) for m in view["messages"]] == [
                ("u1", "ask"), (f"{sid}:shared-r", "checkpoint emu"), ("s1", "steer")]
            final = await append(c, sid, msg("shared-r", "final emu", role="assistant", turnId="t1",
                                             meta={"status": "completed"}))
            assert final["message"]["id"] == f"{sid}:shared-r"
            assert final["message"]["seq"] == seq
            assert [m["blocks"][0]["text"] for m in (await full(c, owner))["messages"]] == ["owner's reply"]
        data = (root / "sessions" / f"{sid}.jsonl").read_bytes()
        assert b'"id":"shared-r"' not in data


async def test_the_same_new_ids_sent_to_two_sessions_at_once_land_once_each(tmp_path: Path) -> None:
    """D444 under a race: two connections append the same fresh ids to two sessions concurrently. For each id
    exactly one session holds it bare and the other as {sessionId}:{id} (its answer says ``remappedFrom``);
    each file holds its own spelling once and never the other session's; a replay from either side is a no-op,
    also after a SIGKILL restart."""
    root = data_dir(tmp_path)
    ids = [f"race-{n}" for n in range(12)]
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            async with client(proc, "second", "agent") as c2:
                a = (await c.call("session.create", {}))["id"]
                b = (await c.call("session.create", {}))["id"]
                answers: dict[str, list[Any]] = {}

                async def send(who: HostClient, sid: str) -> None:
                    answers[sid] = await who.pipelined([
                        ("session.appendMessage", {"sessionId": sid, "message": msg(m, f"{m} text")}) for m in ids])

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(send, c, a)
                    nursery.start_soon(send, c2, b)
            for mid, got_a, got_b in zip(ids, answers[a], answers[b], strict=True):
                AppendMessageResult.model_validate(got_a)
                AppendMessageResult.model_validate(got_b)
                spellings = {got_a["message"]["id"], got_b["message"]["id"]}
                assert mid in spellings and spellings - {mid} in ({f"{a}:{mid}"}, {f"{b}:{mid}"}), spellings
                assert [g.get("remappedFrom") for g in (got_a, got_b)].count(mid) == 1
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            for sid, got in answers.items():
                view = await full(c, sid)
                assert [m["id"] for m in view["messages"]] == [g["message"]["id"] for g in got]
                for mid, first in zip(ids, got, strict=True):
                    again = await append(c, sid, msg(mid, f"{mid} text"))
                    assert again["replayed"] is True and again["message"] == first["message"]
        for sid, got in answers.items():
            data = (root / "sessions" / f"{sid}.jsonl").read_bytes()
            for first in got:
                assert data.count(f'"id":"{first["message"]["id"]}"'.encode()) == 1
            other = b if sid == a else a
            assert f'"id":"{other}:'.encode() not in data


async def test_a_final_killed_right_after_its_line_is_durable_wins_over_the_checkpoint(tmp_path: Path) -> None:
    """§11.4 (kill between the file append and the index commit) where the steering rules meet it: a
    reservation with a newer checkpoint, then its final, and the host dies right after the final's line is
    fsynced (before the checkpoint is removed and before the index knows the final). The final is what landed:
    the boot must not promote the stale checkpoint over it. After the restart a1 holds the final at the
    reserved seq, the checkpoint is gone (no ``inflight``, nothing promoted), and the final sent again is a
    replay; a further restart reads the same."""
    root = data_dir(tmp_path)
    setup_appends = 7  # _steered's appends: o1, u0, a0, u1, a1, s1, a2 (one group each: each is awaited)
    final = msg("a1", "durable final kookaburra", role="assistant", turnId="t1", meta={"status": "completed"})
    crashing = start_host_process(root, env={"RT_CRASHPOINT": f"append.after_fsync:{setup_appends + 1}"})
    answered: Any = None
    try:
        with trio.fail_after(60):
            try:
                async with open_client(crashing.url, crashing.token, client_id="outsider",
                                       client_kind="agent") as c:
                    sid, _, reserved = await _steered(c)
                    saved = await checkpoint(c, sid, "t1", streaming("a1", "stale checkpoint cassowary", "t1"))
                    assert saved["saved"] is True
                    answered = await c.call("session.appendMessage", {"sessionId": sid, "message": final})
            except (ClientClosed, OSError):
                pass
            if answered is None:
                await trio.to_thread.run_sync(crashing.reap)
    finally:
        crashing.kill9()
    assert answered is None and crashing.proc.returncode == -9, answered
    with trio.fail_after(90):
        for _ in range(2):
            async with real_host(root, kind="agent") as (proc, c):
                view = await full(c, sid)
                assert [m["id"] for m in view["messages"]] == ["u0", "a0", "u1", "a1", "s1", "a2"]
                a1 = view["messages"][3]
                assert a1["blocks"] == [{"type": "text", "text": "durable final kookaburra"}], a1
                assert a1["seq"] == reserved["message"]["seq"] and a1["turnId"] == "t1"
                assert a1["meta"] == {"status": "completed"}, a1
                assert not view.get("inflight")
                assert await sessions_matching(c, "cassowary") == {}
                again = await append(c, sid, final)
                assert again["replayed"] is True and again["message"]["seq"] == reserved["message"]["seq"]
                proc.kill9()


async def test_a_remapped_reservation_keeps_its_spelling_after_the_owner_session_is_deleted(tmp_path: Path) -> None:
    """protocol/README.md: every method "finds that spelling within its session, also after the other session's
    row is gone". The owner of the bare id is deleted before (or after) the checkpoint under the bare id is
    saved; SIGKILL: recovery settles the checkpoint into the remapped row, in place, not as a new bare row at
    the end; the final under the bare id then replaces that same row, and a restart reads the same."""
    for n, delete_first in enumerate((True, False)):
        root = tmp_path / f"data{n}"
        root.mkdir()
        with trio.fail_after(90):
            async with real_host(root, kind="agent") as (proc, c):
                owner, sid, seq = await _remapped_reservation(c)
                if delete_first:
                    await c.call("session.delete", {"sessionId": owner})
                saved = await checkpoint(c, sid, "t1", streaming("shared-r", "checkpoint emu", "t1"))
                assert saved["saved"] is True
                if not delete_first:
                    await c.call("session.delete", {"sessionId": owner})
                proc.kill9()
            async with real_host(root, kind="agent") as (proc, c):
                view = await full(c, sid)
                assert [(m["id"], m["blocks"][0]["text"]) for m in view["messages"]] == [
                    ("u1", "ask"), (f"{sid}:shared-r", "checkpoint emu"), ("s1", "steer")], delete_first
                assert view["messages"][1]["seq"] == seq
                final = await append(c, sid, msg("shared-r", "final emu", role="assistant", turnId="t1",
                                                 meta={"status": "completed"}))
                assert final["message"]["id"] == f"{sid}:shared-r" and final["replayed"] is False
                assert final["message"]["seq"] == seq
                proc.kill9()
            async with real_host(root, kind="agent") as (proc, c):
                assert [(m["id"], m["blocks"][0]["text"]) for m in (await full(c, sid))["messages"]] == [
                    ("u1", "ask"), (f"{sid}:shared-r", "final emu"), ("s1", "steer")]
            assert b'"id":"shared-r"' not in (root / "sessions" / f"{sid}.jsonl").read_bytes()
