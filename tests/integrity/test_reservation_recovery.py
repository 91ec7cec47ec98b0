"""Seed 003 "Active-turn steering transcript reservations" and §2.1 / §5 (D299, D327) at boot recovery, from
outside: a streaming reservation (an assistant row appended with ``meta.status: "streaming"``) whose client
never saved an in-flight checkpoint for it (a client that died between the two, a plugin that never
checkpoints) must not read back as a live stream forever after the host stops.

"The host stores the provisional row and an in-flight checkpoint, including an empty reservation so crash
recovery can settle it." and "The boot sweep promotes a leftover checkpoint whose final row never landed: as
complete when the turn already completed, otherwise as aborted under an aborted turn." A reservation without
its checkpoint is settled the same way from what the row holds: every test here keeps a checkpointed twin
next to it in the same host and asks that both read back settled alike. Real ``pi-host serve`` processes
(SIGKILL or SIGTERM, then a restart), the documented wire protocol only."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import ClientClosed, HostClient, RpcError, open_client
from tests.hostkit import HostProcess, boot_killed_at, faulted_client, msg, start_host_process

SIDECAR = "reservation-sidecar"


@asynccontextmanager
async def host(root: Path) -> AsyncIterator[tuple[HostProcess, HostClient]]:
    """A ``pi-host serve`` process on ``root`` and an agent client of it (always the same ``clientId``, so a
    keyed request retried after a restart is the same request); SIGKILLed on exit unless already stopped."""
    proc = start_host_process(root)
    try:
        async with open_client(proc.url, proc.token, client_id=SIDECAR, client_kind="agent") as c:
            yield proc, c
    finally:
        proc.kill9()


def turn(sid: str) -> str:
    """The session's turn (turn ids are the host's, across sessions)."""
    return f"t-{sid}"


def mid(sid: str, name: str) -> str:
    """The session's message ``name`` (message ids are the host's, across sessions)."""
    return f"{sid}.{name}"


def reservation_params(sid: str, text: str) -> dict[str, Any]:
    """The keyed append that reserves ``a1``'s position while it streams (its provisional snapshot)."""
    return {"sessionId": sid, "turnId": turn(sid), "submissionId": f"reserve-{sid}",
            "message": msg(mid(sid, "a1"), text, role="assistant", turnId=turn(sid),
                           meta={"status": "streaming"})}


async def reserve(c: HostClient, *, checkpoint: bool, text: str = "provisional koala") -> tuple[str, dict[str, Any]]:
    """A new session whose running turn t1 holds u1, the streaming reservation a1 (``text``) and the steering
    row s1 after it; with ``checkpoint`` the client also saved the (same) in-flight checkpoint, as the seed
    has it do. The session id and the reservation's answer."""
    sid: str = (await c.call("session.create", {}))["id"]
    await c.call("session.startTurn", {"sessionId": sid, "turnId": turn(sid)})
    await c.call("session.appendMessage",
                 {"sessionId": sid, "turnId": turn(sid), "message": msg(mid(sid, "u1"), "ask")})
    reserved: dict[str, Any] = await c.call("session.appendMessage", reservation_params(sid, text))
    if checkpoint:
        saved = await c.call("session.saveInflightMessage", {
            "sessionId": sid, "turnId": turn(sid),
            "message": msg(mid(sid, "a1"), text, role="assistant", turnId=turn(sid),
                           meta={"status": "streaming"})})
        assert saved["saved"] is True
    await c.call("session.appendMessage",
                 {"sessionId": sid, "message": msg(mid(sid, "s1"), "steer", meta={"steering": True})})
    return sid, reserved


async def full(c: HostClient, sid: str) -> dict[str, Any]:
    result: dict[str, Any] = await c.call("session.get", {"sessionId": sid, "full": True})
    return result


def settled_meta(row: dict[str, Any]) -> dict[str, Any]:
    """What settling decided about a row (its content aside)."""
    meta = row.get("meta") or {}
    return {k: meta.get(k) for k in ("status", "interrupted", "recoveredFrom")}


async def check_settled(c: HostClient, sid: str, twin: str, reserved: dict[str, Any], *, status: str,
                        text: str = "provisional koala") -> None:
    """``sid``'s reservation (no checkpoint) reads back settled exactly like ``twin``'s (checkpointed), with
    its own content, once, in its own position and turn."""
    for session in (sid, twin):
        view = await full(c, session)
        assert [m["id"] for m in view["messages"]] == [mid(session, x) for x in ("u1", "a1", "s1")], \
            (session, view["messages"])
        assert not view.get("inflight"), (session, view.get("inflight"))
    view, twin_view = await full(c, sid), await full(c, twin)
    a1, twin_a1 = view["messages"][1], twin_view["messages"][1]
    assert settled_meta(a1) == settled_meta(twin_a1), (a1, twin_a1)
    expected = {"status": status, "interrupted": True if status == "aborted" else None,
                "recoveredFrom": "inflight"}
    assert settled_meta(a1) == expected, a1
    assert a1["blocks"] == [{"type": "text", "text": text}]
    assert a1.get("turnId") == turn(sid) and a1["role"] == "assistant"
    assert a1["seq"] == reserved["message"]["seq"]
    turns = (await c.call("session.listTurns", {"sessionId": sid}))["turns"]
    assert [t["id"] for t in turns] == [turn(sid)]


async def check_retry_and_final(c: HostClient, sid: str, reserved: dict[str, Any]) -> None:
    """The reservation's keyed request retried answers what it answered; then the final of a1 (sent again
    after the restart) replaces the settled row in place (protocol README: a row promoted after a crash "is
    replaced the same way by the final of its id")."""
    again = await c.call("session.appendMessage", reservation_params(sid, "provisional koala"))
    assert again == reserved, (again, reserved)
    final = await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
        mid(sid, "a1"), "the whole koala reply", role="assistant", turnId=turn(sid),
        meta={"status": "completed"})})
    assert final["message"]["seq"] == reserved["message"]["seq"]
    assert not final.get("replayed")
    view = await full(c, sid)
    assert [m["id"] for m in view["messages"]] == [mid(sid, x) for x in ("u1", "a1", "s1")]
    assert view["messages"][1]["blocks"] == [{"type": "text", "text": "the whole koala reply"}]
    assert view["messages"][1]["meta"]["status"] == "completed"


async def boot_settles_once(root: Path, sids: list[str]) -> None:
    """A further restart finds nothing to settle and changes nothing."""
    async with host(root) as (proc, c):
        before = {sid: await full(c, sid) for sid in sids}
        proc.kill9()
    async with host(root) as (proc, c):
        assert (await c.call("host.status", {}))["boot"]["inflightPromoted"] == 0
        for sid in sids:
            assert (await full(c, sid))["messages"] == before[sid]["messages"]


async def test_sigkill_settles_an_uncheckpointed_reservation_like_a_checkpointed_one(tmp_path: Path) -> None:
    """SIGKILL mid-turn: the reservation without a checkpoint is settled as aborted + interrupted under its
    (fenced) turn, with its own content, at its position, exactly once, like its checkpointed twin."""
    root = tmp_path / "data"
    with trio.fail_after(90):
        async with host(root) as (proc, c):
            sid, reserved = await reserve(c, checkpoint=False)
            twin, _ = await reserve(c, checkpoint=True)
            proc.kill9()
        async with host(root) as (proc, c):
            status = await c.call("host.status", {})
            assert status["boot"]["inflightPromoted"] >= 1
            await check_settled(c, sid, twin, reserved, status="aborted")
            turns = (await c.call("session.listTurns", {"sessionId": sid}))["turns"]
            assert turns[0]["status"] == "aborted"
            proc.kill9()
        await boot_settles_once(root, [sid, twin])
        async with host(root) as (proc, c):
            await check_retry_and_final(c, sid, reserved)


async def test_sigterm_settles_an_uncheckpointed_reservation_too(tmp_path: Path) -> None:
    """A clean stop (SIGTERM) mid-turn leaves the same reservation behind: the next boot settles it alike."""
    root = tmp_path / "data"
    with trio.fail_after(90):
        async with host(root) as (proc, c):
            sid, reserved = await reserve(c, checkpoint=False)
            twin, _ = await reserve(c, checkpoint=True)
            assert await trio.to_thread.run_sync(proc.terminate) == 0
        async with host(root) as (proc, c):
            await check_settled(c, sid, twin, reserved, status="aborted")
            await check_retry_and_final(c, sid, reserved)


async def test_an_empty_uncheckpointed_reservation_is_settled_too(tmp_path: Path) -> None:
    """An empty reservation ("including an empty reservation so crash recovery can settle it") whose
    checkpoint never came: settled, still empty, not left streaming."""
    root = tmp_path / "data"
    with trio.fail_after(90):
        async with host(root) as (proc, c):
            sid: str = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": turn(sid)})
            await c.call("session.appendMessage",
                         {"sessionId": sid, "turnId": turn(sid), "message": msg(mid(sid, "u1"), "ask")})
            reserved = await c.call("session.appendMessage", {"sessionId": sid, "turnId": turn(sid), "message": {
                "id": mid(sid, "a1"), "role": "assistant", "turnId": turn(sid), "blocks": [],
                "meta": {"status": "streaming"}}})
            proc.kill9()
        async with host(root) as (proc, c):
            view = await full(c, sid)
            assert [m["id"] for m in view["messages"]] == [mid(sid, x) for x in ("u1", "a1")]
            a1 = view["messages"][1]
            assert settled_meta(a1) == {"status": "aborted", "interrupted": True, "recoveredFrom": "inflight"}
            assert a1["seq"] == reserved["message"]["seq"] and not a1.get("blocks")


async def test_a_reservation_whose_turn_already_ended_settles_as_its_turn_ended(tmp_path: Path) -> None:
    """The reservation's turn had ended before the crash (its final never landed): completed → the row is
    settled complete, aborted (a user Stop) → aborted + interrupted; each like its checkpointed twin."""
    root = tmp_path / "data"
    with trio.fail_after(90):
        async with host(root) as (proc, c):
            done, done_reserved = await reserve(c, checkpoint=False)
            done_twin, _ = await reserve(c, checkpoint=True)
            stopped, stopped_reserved = await reserve(c, checkpoint=False)
            stopped_twin, _ = await reserve(c, checkpoint=True)
            for sid in (done, done_twin):
                await c.call("session.endTurn", {"sessionId": sid, "turnId": turn(sid), "status": "completed"})
            for sid in (stopped, stopped_twin):
                await c.call("session.endTurn", {"sessionId": sid, "turnId": turn(sid), "status": "aborted"})
            proc.kill9()
        async with host(root) as (proc, c):
            await check_settled(c, done, done_twin, done_reserved, status="completed")
            await check_settled(c, stopped, stopped_twin, stopped_reserved, status="aborted")
            proc.kill9()
        await boot_settles_once(root, [done, done_twin, stopped, stopped_twin])
        async with host(root) as (proc, c):
            await check_retry_and_final(c, done, done_reserved)
            await check_retry_and_final(c, stopped, stopped_reserved)


async def test_a_boot_killed_while_settling_a_reservation_settles_it_once(tmp_path: Path) -> None:
    """The settling boot itself is SIGKILLed after the settled line is durable, and before its index commit:
    the boot after it reads the reservation settled once, in place, and its keyed retry answers as before."""
    root = tmp_path / "data"
    with trio.fail_after(90):
        async with host(root) as (proc, c):
            sid, reserved = await reserve(c, checkpoint=False)
            proc.kill9()
        for point in ("inflight.after_append", "inflight.before_commit"):
            copy = tmp_path / point
            shutil.copytree(root, copy, symlinks=True)
            assert await trio.to_thread.run_sync(boot_killed_at, copy, point), point
            async with host(copy) as (proc, c):
                view = await full(c, sid)
                assert [m["id"] for m in view["messages"]] == [mid(sid, x) for x in ("u1", "a1", "s1")], point
                a1 = view["messages"][1]
                assert settled_meta(a1) == {"status": "aborted", "interrupted": True,
                                            "recoveredFrom": "inflight"}, (point, a1)
                assert a1["seq"] == reserved["message"]["seq"], point
                assert a1["blocks"] == [{"type": "text", "text": "provisional koala"}], point
                await check_retry_and_final(c, sid, reserved)


async def refusal(c: HostClient, method: str, params: dict[str, Any]) -> tuple[str | None, str]:
    """The call's error code and message; it must fail."""
    try:
        answered = await c.call(method, params)
    except RpcError as failed:
        return failed.data_code, failed.message
    raise AssertionError(f"{method} answered {answered!r}")


async def test_a_checkpoint_save_after_a_failed_transcript_fsync_is_refused_like_an_append(tmp_path: Path) -> None:
    """RELIABILITY rule 7: a failed fsync is fatal for the session's storage until a restart ("mark session
    storage failed, reject writes with a clear error"). A checkpoint is a write of that session's storage (and
    the next boot would promote it into the transcript whose lines the failed fsync may have lost): it is
    refused with the append's error, and the checkpoint saved before the failure is left as it was."""
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with host(root) as (proc, c):
            sid: str = (await c.call("session.create", {}))["id"]
            proc.kill9()
        async with faulted_client(root, "append.fsync:1:eio", client_id=SIDECAR) as c:
            await c.call("session.startTurn", {"sessionId": sid, "turnId": turn(sid)})
            before = msg(mid(sid, "a1"), "saved before", role="assistant", turnId=turn(sid))
            assert (await c.call("session.saveInflightMessage",
                                 {"sessionId": sid, "turnId": turn(sid), "message": before}))["saved"] is True
            prompt = {"sessionId": sid, "turnId": turn(sid), "message": msg(mid(sid, "u1"), "ask")}
            assert (await refusal(c, "session.appendMessage", prompt))[0] == "IO_ERROR"  # the failed fsync
            code, message = await refusal(c, "session.appendMessage", prompt)
            assert code == "IO_ERROR" and "failed earlier" in message, message
            after = msg(mid(sid, "a1"), "saved before, and after", role="assistant", turnId=turn(sid))
            assert await refusal(c, "session.saveInflightMessage",
                                 {"sessionId": sid, "turnId": turn(sid), "message": after}) == (code, message)
            view = await full(c, sid)
            assert view["inflight"]["message"]["blocks"] == before["blocks"]


async def test_transcript_rewrites_after_a_failed_fsync_are_refused_like_an_append(tmp_path: Path) -> None:
    """RELIABILITY rule 7 for the session's other writes: a truncate, a whole-transcript replace, a revision
    save and a revision switch after the failed fsync are refused with the append's error and change no file (a rewrite
    would otherwise acknowledge, from the page cache, a transcript whose last fsync failed)."""
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with host(root) as (proc, c):
            sid: str = (await c.call("session.create", {}))["id"]
            for name in ("u1", "a1", "a1b", "u2"):
                role = "assistant" if name.startswith("a") else "user"
                if name == "a1b":  # a regenerated reply: a1 is archived as a revision of u1's family
                    await c.call("session.truncateFrom",
                                 {"sessionId": sid, "messageId": mid(sid, "a1"), "mode": "regenerate"})
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(mid(sid, name), name,
                                                                                         role=role)})
            proc.kill9()
        files = {p.name: p.read_bytes() for p in (root / "sessions").iterdir() if p.is_file()}
        async with faulted_client(root, "append.fsync:1:eio", client_id=SIDECAR) as c:
            lost = {"sessionId": sid, "message": msg(mid(sid, "u3"), "lost")}
            assert (await refusal(c, "session.appendMessage", lost))[0] == "IO_ERROR"  # the failed fsync
            code, message = await refusal(c, "session.appendMessage", lost)
            assert code == "IO_ERROR" and "failed earlier" in message, message
            for method, params in (
                ("session.truncateFrom", {"sessionId": sid, "messageId": mid(sid, "u2")}),
                ("session.replaceMessages", {"sessionId": sid, "messages": [msg(mid(sid, "u1"), "u1")]}),
                ("session.saveActiveRevision", {"sessionId": sid, "rootUserId": mid(sid, "u1")}),
                ("session.activateRevision", {"sessionId": sid, "rootUserId": mid(sid, "u1"), "revisionIndex": 1}),
                ("session.deleteMessage", {"sessionId": sid, "messageId": mid(sid, "a1")}),  # only a revision holds it
            ):
                assert await refusal(c, method, params) == (code, message), method
            assert [m["id"] for m in (await full(c, sid))["messages"]] == [mid(sid, x) for x in ("u1", "a1b", "u2")]
        after = {p.name: p.read_bytes() for p in (root / "sessions").iterdir() if p.is_file()}
        transcript = f"{sid}.jsonl"
        assert after[transcript].startswith(files[transcript])  # at most the line whose fsync failed, after
        assert {k: v for k, v in after.items() if k != transcript} == \
            {k: v for k, v in files.items() if k != transcript}


async def test_recover_inflight_settles_an_uncheckpointed_reservation_while_the_host_runs(tmp_path: Path) -> None:
    """The sidecar is lost while the host runs (README §10: "a new one, or the UI: session.recoverInflight
    {turnId}" → the promoted reply and turn.ended aborted). Its reservation had no checkpoint: the call settles
    it from its own content exactly as its checkpointed twin's checkpoint is settled (aborted + interrupted,
    in place, once), instead of answering ``none`` and leaving it streaming until the next boot. A retry, keyed
    or not, changes nothing more; the next boot finds nothing to settle; the final still replaces it."""
    root = tmp_path / "data"
    with trio.fail_after(90):
        async with host(root) as (proc, c):
            sid, reserved = await reserve(c, checkpoint=False)
            twin, _ = await reserve(c, checkpoint=True)
            answers = {}
            for session in (sid, twin):
                answers[session] = await c.call("session.recoverInflight", {
                    "sessionId": session, "turnId": turn(session), "submissionId": f"recover-{session}"})
            for session, got in answers.items():
                assert got["action"] == "promoted", (session, got)
                assert got["turn"]["status"] == "aborted" and got["turn"]["errorCode"] == "SIDECAR_LOST", got
                assert got["message"]["id"] == mid(session, "a1"), got
            assert answers[sid]["message"]["seq"] == reserved["message"]["seq"]
            await check_settled(c, sid, twin, reserved, status="aborted")
            keyed = await c.call("session.recoverInflight", {
                "sessionId": sid, "turnId": turn(sid), "submissionId": f"recover-{sid}"})
            assert keyed == answers[sid]
            unkeyed = await c.call("session.recoverInflight", {"sessionId": sid, "turnId": turn(sid)})
            assert unkeyed["action"] == "none", unkeyed
            await check_settled(c, sid, twin, reserved, status="aborted")
            proc.kill9()
        async with host(root) as (proc, c):
            assert (await c.call("host.status", {}))["boot"]["inflightPromoted"] == 0
            await check_settled(c, sid, twin, reserved, status="aborted")
            await check_retry_and_final(c, sid, reserved)


async def test_recover_inflight_killed_between_the_promoted_line_and_its_commit_settles_once(tmp_path: Path) -> None:
    """SIGKILL after the promoted reservation's line is durable and before its transaction commits (RELIABILITY:
    "a retry after a crash at any moment has exactly one effect"). The next boot indexes that line (the turn is
    fenced); the keyed retry changes nothing more: the row reads settled once, at its position, and a further
    restart finds nothing to settle."""
    root = tmp_path / "data"
    params: dict[str, Any] = {}
    with trio.fail_after(90):
        # u1, the reservation and the steering row are the first three appends: the fourth is the promotion
        proc = start_host_process(root, env={"RT_CRASHPOINT": "append.after_fsync:4"})
        try:
            async with open_client(proc.url, proc.token, client_id=SIDECAR, client_kind="agent") as c:
                sid, reserved = await reserve(c, checkpoint=False)
                params = {"sessionId": sid, "turnId": turn(sid), "submissionId": f"recover-{sid}"}
                with pytest.raises((ClientClosed, OSError)):
                    await c.call("session.recoverInflight", params)
            await trio.to_thread.run_sync(proc.reap)
            assert proc.proc.returncode == -9
        finally:
            proc.kill9()
        async with host(root) as (proc, c):
            retried = await c.call("session.recoverInflight", params)
            assert retried["action"] in ("promoted", "none"), retried
            assert retried["turn"]["status"] == "aborted", retried
            view = await full(c, sid)
            assert [m["id"] for m in view["messages"]] == [mid(sid, x) for x in ("u1", "a1", "s1")]
            a1 = view["messages"][1]
            assert settled_meta(a1) == {"status": "aborted", "interrupted": True, "recoveredFrom": "inflight"}, a1
            assert a1["seq"] == reserved["message"]["seq"]
            assert await c.call("session.recoverInflight", params) == retried
        await boot_settles_once(root, [sid])
    lines = [json.loads(line) for line in (root / "sessions" / f"{sid}.jsonl").read_bytes().splitlines()]
    # the reservation and its one promotion (written before the kill): boot found it settled, the retry too
    assert [r.get("meta", {}).get("status") for r in lines if r.get("id") == mid(sid, "a1")] == ["streaming",
                                                                                              "aborted"]
