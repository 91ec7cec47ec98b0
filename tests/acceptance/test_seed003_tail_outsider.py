"""The tail of seed 003 read by an outsider, statement by statement: "Active-turn steering transcript
reservations" at its worst moments (a kill with a newer checkpoint on disk, a final that would change the
reservation's role or turn, D597's prefix on the wire), "12. Native Pi session authority" (reads that
never touch pi's bytes or mtime, a fork killed before its receipt and retried, bad forks), "Provider display
order", §2.0 review snapshots (a record killed between its two files, paths outside the workspace, Git) and
§4.7a (delegate replies are never checkpointed). Black-box against real ``pi-host serve`` processes; what
the other ``test_seed003_*_outsider`` modules already probe is not repeated."""

from __future__ import annotations

import base64
import json
import os
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import ClientClosed, HostClient, RpcError, open_client
from tests.acceptance.outsiderkit import code_of, data_dir, error_of, real_host, say
from tests.hostkit import HostProcess, call_killed_at, msg, start_host_process


async def _full(c: HostClient, sid: str) -> dict[str, Any]:
    result: dict[str, Any] = await c.call("session.get", {"sessionId": sid, "full": True})
    return result


async def _hits(c: HostClient, query: str) -> list[tuple[str, str]]:
    found = (await c.call("search.query", {"query": query}))["results"]
    return [(h["sessionId"], h["messageId"]) for h in found]


async def _killed_at(root: Path, point: str, method: str, params: dict[str, Any], *extra: str) -> None:
    """``method`` on a host (``serve`` arguments ``extra``) armed to SIGKILL itself at the first hit of
    ``point``; the host died there without answering."""
    crashing = start_host_process(root, *extra, env={"RT_CRASHPOINT": f"{point}:1"})
    try:
        with trio.fail_after(60):
            try:
                async with open_client(crashing.url, crashing.token, client_id="outsider", client_kind="agent") as c:
                    answered = await c.call(method, params)
                    raise AssertionError(f"the host answered {answered!r} instead of dying at {point}")
            except (ClientClosed, OSError):
                pass
            await trio.to_thread.run_sync(crashing.reap)
    finally:
        crashing.kill9()
    assert crashing.proc.returncode == -9, f"the host did not die at {point}"


# ------------------------------------------------------------------ active-turn steering reservations


async def _reservation(c: HostClient, earlier_turn: str | None = None) -> str:
    """A running turn t1 holding u1, the streaming reservation a1 and the steering row s1 after it (after a
    completed ``earlier_turn`` holding u0, when given)."""
    sid: str = (await c.call("session.create", {}))["id"]
    if earlier_turn is not None:
        await c.call("session.startTurn", {"sessionId": sid, "turnId": earlier_turn})
        await say(c, sid, "u0", "earlier", turnId=earlier_turn)
        await c.call("session.endTurn", {"sessionId": sid, "turnId": earlier_turn, "status": "completed",
                                         "createNotification": False})
    await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
    await say(c, sid, "u1", "ask", turnId="t1")
    await say(c, sid, "a1", "provisional", role="assistant", turnId="t1", meta={"status": "streaming"})
    await say(c, sid, "s1", "steer", meta={"steering": True})
    return sid


async def test_a_final_killed_before_its_answer_wins_over_a_newer_checkpoint_on_disk(tmp_path: Path) -> None:
    """"Late partial snapshots ... cannot overwrite the settled result" at the worst moment: the reservation
    has a checkpoint whose text is newer than the reservation's, the terminal final's line is durable, and
    the host dies before it answers (before the index knows the final and before the checkpoint goes; the
    turn still running). Boot must not promote the checkpoint over the final: one a1 row, the final's
    content, in the reserved position, no checkpoint left; the retry with the same key is a replay; search
    finds the final only."""
    root = data_dir(tmp_path)
    final = msg("a1", "settled heron answer", role="assistant", turnId="t1", meta={"status": "completed"})
    # the 4th durable append of this host is the final's (u1, a1 and s1 come first)
    crashing = start_host_process(root, env={"RT_CRASHPOINT": "append.after_fsync:4"})
    with trio.fail_after(120):
        try:
            async with open_client(crashing.url, crashing.token, client_id="outsider", client_kind="agent") as c:
                sid = await _reservation(c)
                saved = await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1", "message": msg(
                    "a1", "provisional plus checkpoint marmot", role="assistant", turnId="t1",
                    meta={"status": "streaming"})})
                assert saved["saved"] is True
                assert (root / "sessions" / f"{sid}.inflight.json").exists()
                with pytest.raises((ClientClosed, OSError)):
                    await c.call("session.appendMessage", {"sessionId": sid, "submissionId": "final-1",
                                                           "message": final})
        except (ClientClosed, OSError):
            pass
        await trio.to_thread.run_sync(crashing.reap)
        assert crashing.proc.returncode == -9
        assert b"settled heron answer" in (root / "sessions" / f"{sid}.jsonl").read_bytes()
        async with real_host(root, kind="agent") as (proc, c):
            view = await _full(c, sid)
            assert [m["id"] for m in view["messages"]] == ["u1", "a1", "s1"]
            assert view["messages"][1]["blocks"] == final["blocks"]
            assert view["messages"][1].get("turnId") == "t1"
            assert not view.get("inflight")
            seq = view["messages"][1]["seq"]
            again = await c.call("session.appendMessage", {"sessionId": sid, "submissionId": "final-1",
                                                           "message": final})
            assert again["message"]["seq"] == seq
            assert [m["id"] for m in (await _full(c, sid))["messages"]] == ["u1", "a1", "s1"]
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": view["messages"]})
            assert await _hits(c, "marmot") == [] and await _hits(c, "heron") == [(sid, "a1")]
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            assert (await _full(c, sid))["messages"][1]["blocks"] == final["blocks"]
            assert not (root / "sessions" / f"{sid}.inflight.json").exists()


async def test_a_final_may_not_change_the_reservations_role_or_turn_and_an_error_final_settles_it(
        tmp_path: Path) -> None:
    """The narrow exception lets "a terminal assistant replace an indexed streaming assistant with the same
    session/message id", "retaining sequence, owning turn": a user row under the reservation's id, and a
    final naming another turn, are refused (IDEMPOTENCY_CONFLICT) and change no byte of the transcript; an
    error final is terminal too, so a later completed final is refused and the settled row survives a kill."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid = await _reservation(c, earlier_turn="t0")
            file = root / "sessions" / f"{sid}.jsonl"
            before = file.read_bytes()
            as_user = msg("a1", "a prompt under the reply's id")
            assert await code_of(c, "session.appendMessage", {"sessionId": sid, "message": as_user}) == \
                "IDEMPOTENCY_CONFLICT"
            moved = msg("a1", "final for another turn", role="assistant", turnId="t0", meta={"status": "completed"})
            assert await code_of(c, "session.appendMessage", {"sessionId": sid, "message": moved}) == \
                "IDEMPOTENCY_CONFLICT"
            assert file.read_bytes() == before
            failed = await say(c, sid, "a1", "partial then failure", role="assistant", turnId="t1",
                               meta={"status": "error", "error": "provider went away"})
            assert failed.get("replayed") is not True
            late = msg("a1", "a completed final after the error", role="assistant", turnId="t1",
                       meta={"status": "completed"})
            assert await code_of(c, "session.appendMessage", {"sessionId": sid, "message": late}) == \
                "IDEMPOTENCY_CONFLICT"
            view = await _full(c, sid)
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            again = await _full(c, sid)
            assert [m["id"] for m in again["messages"]] == ["u0", "u1", "a1", "s1"]
            assert again["messages"][2]["blocks"] == [{"type": "text", "text": "partial then failure"}]
            assert again["messages"][2].get("turnId") == "t1"
            assert again["messages"] == view["messages"]


async def test_every_reservation_of_a_steered_turn_is_recovered_in_its_own_position(tmp_path: Path) -> None:
    """"Recovery promotes the latest checkpoint in that same position", for a turn steered twice: three
    reservations (the middle one checkpointed further, the last one empty) between two steering rows, then
    SIGKILL. Each comes back in its position, the middle one with its checkpoint's content, none still
    streaming; a final sent after the restart replaces each in place."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid = await _reservation(c)
            await say(c, sid, "a2", "second provisional", role="assistant", turnId="t1", meta={"status": "streaming"})
            await say(c, sid, "s2", "steer again", meta={"steering": True})
            await say(c, sid, "a3", "", role="assistant", turnId="t1", blocks=[], meta={"status": "streaming"})
            saved = await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1", "message": msg(
                "a2", "second provisional, checkpointed", role="assistant", turnId="t1", meta={"status": "streaming"})})
            assert saved["saved"] is True
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            view = (await _full(c, sid))["messages"]
            assert [m["id"] for m in view] == ["u1", "a1", "s1", "a2", "s2", "a3"]
            replies = [m for m in view if m["role"] == "assistant"]
            assert [[b["text"] for b in m["blocks"]] for m in replies] == [
                ["provisional"], ["second provisional, checkpointed"], []]
            assert all(m["meta"]["status"] == "aborted" and m["turnId"] == "t1" for m in replies)
            for m in replies:
                final = await say(c, sid, m["id"], f"final {m['id']}", role="assistant", turnId="t1",
                                  meta={"status": "completed"})
                assert final["message"]["seq"] == m["seq"]
            again = (await _full(c, sid))["messages"]
            assert [(m["id"], m["blocks"][0]["text"]) for m in again] == [
                ("u1", "ask"), ("a1", "final a1"), ("s1", "steer"), ("a2", "final a2"), ("s2", "steer again"),
                ("a3", "final a3")]


async def test_steering_into_a_delivery_turn_is_exempt_from_the_delivery_content_contract(tmp_path: Path) -> None:
    """Steering "into a claimed collaboration delivery turn is extra human input: ... is exempt from the
    delivery content/attachment contract, does not inherit the delivery origin": a steering row longer than
    any delivery's content (MAX_TEXT_FIELD) and carrying an attachment is kept whole in the delivery's turn,
    with no provenance of its own, through a SIGKILL; the delivery's input row keeps its provenance."""
    root = data_dir(tmp_path)
    blocks = [{"type": "text", "text": "y" * 1_000_001},
              {"type": "attachment", "kind": "image", "name": "shot.png", "ref": "/tmp/shot.png",
               "mimeType": "image/png", "size": 3}]
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            src = (await c.call("session.create", {"permissionMode": "auto"}))["id"]
            dst = (await c.call("session.create", {"permissionMode": "ask"}))["id"]
            did = (await c.call("collab.deliver", {
                "pluginId": "team", "sourceSessionId": src, "targetSessionId": dst, "kind": "task",
                "content": "review the parser", "idempotencyKey": "k1"}))["delivery"]["id"]
            assert await code_of(c, "collab.deliver", {
                "pluginId": "team", "sourceSessionId": src, "targetSessionId": dst, "kind": "task",
                "content": "z" * 1_000_001, "idempotencyKey": "k2"}) == "INVALID_PARAMS"  # the delivery's contract
            await c.call("session.startTurn", {"sessionId": dst, "turnId": "t1"})
            await c.call("collab.begin", {"sessionId": dst, "deliveryId": did, "turnId": "t1"})
            await c.call("session.appendMessage", {"sessionId": dst, "message": {
                "id": "s1", "role": "user", "turnId": "t1", "blocks": blocks, "meta": {"steering": True}}})
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            rows = (await _full(c, dst))["messages"]
    assert [m["id"] for m in rows] == [f"collab-{did}", "s1"]
    assert rows[0]["sessionMessage"]["deliveryId"] == did
    steer = rows[1]
    assert steer["blocks"] == blocks and steer["turnId"] == "t1" and steer.get("steering") is True
    assert steer["meta"] == {"steering": True} and steer.get("sessionMessage") is None


async def test_a_refused_append_carries_the_permission_denied_prefix_on_the_wire(tmp_path: Path) -> None:
    """D597: the outbox drops "a permanently rejected append whose host error carries a PERMISSION_DENIED:
    prefix" by the message text: a plugin's append to a session it does not own is refused with that prefix
    (and ``data.code``), and nothing is written."""
    root = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(root, kind="agent") as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await say(c, sid, "u1", "mine")
            before = (root / "sessions" / f"{sid}.jsonl").read_bytes()
            async with open_client(proc.url, proc.token, client_id="plug", client_kind="plugin",
                                   plugin_id="team") as p:
                with pytest.raises(RpcError) as refused:
                    await p.call("session.appendMessage", {"sessionId": sid, "message": msg("x1", "intruder")})
            assert refused.value.data_code == "PERMISSION_DENIED"
            assert refused.value.message.startswith("PERMISSION_DENIED: ")
            assert (root / "sessions" / f"{sid}.jsonl").read_bytes() == before
            assert [m["id"] for m in (await _full(c, sid))["messages"]] == ["u1"]


# --------------------------------------------------------------------------------- §4.7a delegate replies


async def test_a_delegate_reply_is_never_checkpointed_and_a_kill_promotes_nothing(tmp_path: Path) -> None:
    """§4.7a / §2.1: "Delegate replies are not checkpointed": a checkpoint of a subagent-attributed reply
    (meta.parentToolCallId / meta.agentName) is dropped (reason ``delegate``), no in-flight file appears, and
    a SIGKILL of the running turn promotes nothing; its final row then lands in the session's own transcript
    file and index, attribution in the line's meta."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            await say(c, sid, "u1", "delegate it", turnId="t1")
            for meta in ({"parentToolCallId": "task-1"}, {"agentName": "code-reviewer"},
                         {"parentToolCallId": "task-1", "agentName": "code-reviewer"}):
                dropped = await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1", "message": msg(
                    "d1", "delegate ocelot words", role="assistant", turnId="t1", meta=meta)})
                assert (dropped["saved"], dropped.get("reason")) == (False, "delegate")
                assert not (root / "sessions" / f"{sid}.inflight.json").exists()
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            view = await _full(c, sid)
            assert [m["id"] for m in view["messages"]] == ["u1"]
            assert await _hits(c, "ocelot") == []
            # its final row is stored like any other: the same transcript file, the same index
            attribution = {"parentToolCallId": "task-1", "agentName": "code-reviewer"}
            await say(c, sid, "d1", "delegate ocelot words", role="assistant", meta=attribution)
            assert await _hits(c, "ocelot") == [(sid, "d1")]
            line = (root / "sessions" / f"{sid}.jsonl").read_bytes().splitlines()[-1]
            assert {k: json.loads(line)["meta"][k] for k in attribution} == attribution


# -------------------------------------------------------------------------- 12. native pi sessions


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


_TS = "2026-03-01T10:00:0{}.000Z"
_UNKNOWN = _line({"type": "future_widget", "id": "e4", "parentId": "e3", "timestamp": _TS.format(4),
                  "widget": {"deep": [1, 2.5, None]}, "novelField": True})
# the last entry carries an unknown field and has no final newline (pi may still be writing the next one)
_LAST = json.dumps({"type": "message", "id": "e5", "parentId": "e4", "timestamp": _TS.format(5),
                    "message": {"role": "user", "content": [{"type": "text", "text": "last quokka words"}],
                                "timestamp": 1772359205000}, "unknownField": 7}).encode()


def _native_file(root: Path) -> Path:
    """A pi v3 session (a model change, an exchange, an unknown entry, a last line without newline) and a
    pi v1 session beside it, under ``root``."""
    project = root / "--home-ada-proj--"
    project.mkdir(parents=True)
    path = project / "2026-03-01T10-00-00-000Z_s-native-1.jsonl"
    path.write_bytes(b"".join([
        _line({"type": "session", "version": 3, "id": "s-native-1", "timestamp": _TS.format(0),
               "cwd": "/home/ada/proj"}),
        _line({"type": "model_change", "id": "e1", "parentId": None, "timestamp": _TS.format(1),
               "provider": "anthropic", "modelId": "claude-x"}),
        _line({"type": "message", "id": "e2", "parentId": "e1", "timestamp": _TS.format(2),
               "message": {"role": "user", "content": [{"type": "text", "text": "hello pangolin"}],
                           "timestamp": 1772359202000}}),
        _line({"type": "message", "id": "e3", "parentId": "e2", "timestamp": _TS.format(3),
               "message": {"role": "assistant", "content": [{"type": "text", "text": "hi there"}],
                           "provider": "anthropic", "model": "claude-x", "stopReason": "stop"}}),
        _UNKNOWN, _LAST]))
    (project / "2026-02-01T10-00-00-000Z_s-old.jsonl").write_bytes(b"".join([
        _line({"type": "session", "id": "s-old", "timestamp": _TS.format(0), "cwd": "/home/ada/proj"}),
        _line({"type": "message", "timestamp": _TS.format(1),
               "message": {"role": "user", "content": [{"type": "text", "text": "old format"}]}})]))
    old = 1_700_000_000_000_000_000
    for p in project.iterdir():
        os.utime(p, ns=(old, old))
    return path


def _tree(root: Path) -> dict[str, tuple[bytes, int, int, int]]:
    """Every file under ``root``: its bytes, mtime, inode and mode."""
    out: dict[str, tuple[bytes, int, int, int]] = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        if p.is_file():
            out[str(p.relative_to(root))] = (p.read_bytes(), st.st_mtime_ns, st.st_ino, st.st_mode)
    return out


@asynccontextmanager
async def _native_host(root: Path, pi_root: Path, **env: str) -> AsyncIterator[tuple[HostProcess, HostClient]]:
    proc = start_host_process(root, "--native-pi-root", str(pi_root), env=env or None)
    try:
        async with open_client(proc.url, proc.token, client_id="outsider", client_kind="ui") as c:
            yield proc, c
    finally:
        proc.kill9()


NATIVE = "native-pi:s-native-1"


async def test_native_reads_never_touch_pis_bytes_or_mtime_nor_copy_the_session_here(tmp_path: Path) -> None:
    """§12: native sessions "are never inserted into SQLite and never copied to the Desktop transcript
    directory"; detail reads take "an immutable byte snapshot" and never "repair a missing newline or rewrite
    an older format"; "Unknown/custom entries and unknown fields remain in the source bytes". Every read a
    client can make (list pages, get whole/window/around, export md and jsonl, every refused mutation) leaves
    each file under the pi root byte-, mtime- and inode-identical, adds none, and the host holds no row and
    no file for them; the last line without a newline is read as the complete entry it is."""
    root = data_dir(tmp_path)
    pi_root = tmp_path / "pi"
    _native_file(pi_root)
    before = _tree(pi_root)
    folders = {p: p.stat().st_mtime_ns for p in [pi_root, *pi_root.rglob("*")] if p.is_dir()}
    with trio.fail_after(90):
        async with _native_host(root, pi_root) as (proc, c):
            listed = (await c.call("session.list", {}))["sessions"]
            assert {s["id"] for s in listed} == {NATIVE, "native-pi:s-old"}
            assert all(s["source"] == "native-pi" and s["native"]["readOnly"] for s in listed)
            assert [s["id"] for s in (await c.call("session.list", {"limit": 1}))["sessions"]] == [listed[0]["id"]]
            view = await _full(c, NATIVE)
            assert [m["blocks"][0]["text"] for m in view["messages"]] == ["hello pangolin", "hi there",
                                                                          "last quokka words"]
            last = await c.call("session.get", {"sessionId": NATIVE, "messageLimit": 1})
            assert [m["id"] for m in last["messages"]] == [view["messages"][-1]["id"]]
            await c.call("session.get", {"sessionId": NATIVE, "messageAround": view["messages"][1]["id"]})
            old = await _full(c, "native-pi:s-old")
            assert [m["blocks"][0]["text"] for m in old["messages"]] == ["old format"]
            for fmt in ("md", "jsonl"):
                out = await c.call("session.export", {"sessionId": NATIVE, "format": fmt})
                assert "last quokka words" in out["content"]
            for method, extra in (("session.rename", {"title": "x"}), ("session.delete", {}),
                                  ("session.appendMessage", {"message": msg("m9", "x")}),
                                  ("session.truncateFrom", {"messageId": view["messages"][1]["id"]})):
                assert await code_of(c, method, {"sessionId": NATIVE, **extra}) == "UNSUPPORTED_FOR_NATIVE_SESSION"
            assert await _hits(c, "pangolin") == []  # never indexed
            proc.kill9()
    assert _tree(pi_root) == before
    assert {p: p.stat().st_mtime_ns for p in folders} == folders  # nothing made and removed there either
    assert not [p for p in (root / "sessions").iterdir() if "native" in p.name]
    conn = sqlite3.connect(root / "pi.sqlite")
    try:
        assert conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 0
        assert conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0
    finally:
        conn.close()


async def test_a_native_fork_killed_before_its_receipt_and_retried_writes_exactly_one_child(tmp_path: Path) -> None:
    """§12: "A native fork writes exactly one new v3 JSONL child in the parent's session directory" and "The
    parent file, its leaf, and any live runtime are never modified"; README §4: a keyed retry "after a crash
    finds the child already written instead of writing another". SIGKILL after the child is published and
    before the receipt commits; the retry with the same key answers that child, no second child and no
    staging file is left, the parent keeps its bytes and mtime, and the child carries the branch's raw lines
    (the unknown entry verbatim, the unterminated last line now terminated) after a v3 header naming its
    parent. The same key for another request (another title, message or parent) is IDEMPOTENCY_CONFLICT
    and writes nothing, before the receipt exists as after; a retry still finds its child when pi has
    appended to the parent since the crash."""
    root = data_dir(tmp_path)
    pi_root = tmp_path / "pi"
    parent = _native_file(pi_root)
    fork = {"sessionId": NATIVE, "title": "child of pangolin", "submissionId": "fork-1"}
    with trio.fail_after(120):
        early = {"sessionId": NATIVE, "throughMessageId": f"{NATIVE}:e2", "submissionId": "fork-2"}
        await _killed_at(root, "session.fork.before_commit", "session.fork", early, "--native-pi-root", str(pi_root))
        before = _tree(pi_root)
        await _killed_at(root, "session.fork.before_commit", "session.fork", fork, "--native-pi-root", str(pi_root))
        assert len(list(parent.parent.iterdir())) == 4  # each child was published before its kill
        published = _tree(pi_root)
        async with _native_host(root, pi_root) as (proc, c):
            first = (await _full(c, NATIVE))["messages"][0]["id"]
            for other in ({"title": "another title"}, {"throughMessageId": first}, {"title": None},
                          {"sessionId": "native-pi:s-old"}):
                assert await code_of(c, "session.fork", {**fork, **other}) == "IDEMPOTENCY_CONFLICT", other
            # and the other way round: a fork at the first message killed, then its key for the whole branch
            assert await code_of(c, "session.fork", {**early, "throughMessageId": None}) == "IDEMPOTENCY_CONFLICT"
            early_child = await c.call("session.fork", early)
            assert early_child["messageCount"] == 1
            assert _tree(pi_root) == published
            # pi goes on writing the parent after the crash; the retry still finds the child it forked
            now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            grown = parent.read_bytes() + b"\n" + _line({
                "type": "message", "id": "e6", "parentId": "e5", "timestamp": now,
                "message": {"role": "assistant", "content": [{"type": "text", "text": "pi wrote more"}],
                            "provider": "anthropic", "model": "claude-x", "stopReason": "stop"}})
            parent.write_bytes(grown)
            before[str(parent.relative_to(pi_root))] = _tree(pi_root)[str(parent.relative_to(pi_root))]
            child = await c.call("session.fork", fork)
            assert await c.call("session.fork", fork) == child
            assert child["id"].startswith("native-pi:") and child["title"] == "child of pangolin"
            assert child["native"] == {"version": 3, "readOnly": True}
            assert await code_of(c, "session.fork", {**fork, "title": "another title"}) == "IDEMPOTENCY_CONFLICT"
            assert [m["blocks"][0]["text"] for m in (await _full(c, NATIVE))["messages"]][-1] == "pi wrote more"
            listed = [s["id"] for s in (await c.call("session.list", {}))["sessions"]]
            assert sorted(listed) == sorted([NATIVE, "native-pi:s-old", early_child["id"], child["id"]])
            got = await _full(c, child["id"])
            assert [m["blocks"][0]["text"] for m in got["messages"]] == ["hello pangolin", "hi there",
                                                                         "last quokka words"]
            # "that path stays inside the sidecar": no answer names the parent's file
            exported = [await c.call("session.export", {"sessionId": child["id"], "format": fmt})
                        for fmt in ("md", "jsonl")]
            seen = json.dumps([child, got, exported, await c.call("session.list", {})])
            assert str(pi_root) not in seen and parent.name not in seen
            proc.kill9()
    after = _tree(pi_root)
    assert {k: v for k, v in after.items() if k in before} == before
    new = [k for k in after if k not in before]
    assert len(new) == 1 and new[0].endswith(f"_{child['id'].removeprefix('native-pi:')}.jsonl")
    data = after[new[0]][0]
    assert data.endswith(b"\n")
    lines = data.split(b"\n")[:-1]
    header = json.loads(lines[0])
    assert header["type"] == "session" and header["version"] == 3
    assert header["parentSession"] == str(parent.resolve())
    assert _UNKNOWN in data and _LAST + b"\n" in data
    assert json.loads(lines[-1]) == {**json.loads(lines[-1]), "type": "session_info", "name": "child of pangolin"}


async def test_a_native_fork_with_bad_input_writes_nothing(tmp_path: Path) -> None:
    """§12 forks "fail closed without returning a child": an unknown message (MESSAGE_NOT_FOUND), a pi v1
    session (only "exact-v3" files: UNSUPPORTED_FOR_NATIVE_SESSION), an unknown native id
    (SESSION_NOT_FOUND), a malformed one (INVALID_PARAMS) and a message of another session; none of them
    leaves a file; a fork at an earlier message keeps exactly that prefix of the current branch; a keyed
    fork raced from four connections writes one child."""
    root = data_dir(tmp_path)
    pi_root = tmp_path / "pi"
    parent = _native_file(pi_root)
    before = _tree(pi_root)
    with trio.fail_after(90):
        async with _native_host(root, pi_root) as (proc, c):
            first = (await _full(c, NATIVE))["messages"][0]["id"]
            old_msg = (await _full(c, "native-pi:s-old"))["messages"][0]["id"]
            for params, code in (
                    ({"sessionId": NATIVE, "throughMessageId": f"{NATIVE}:nope"}, "MESSAGE_NOT_FOUND"),
                    ({"sessionId": NATIVE, "throughMessageId": old_msg}, "MESSAGE_NOT_FOUND"),
                    ({"sessionId": "native-pi:s-old"}, "UNSUPPORTED_FOR_NATIVE_SESSION"),
                    ({"sessionId": "native-pi:missing"}, "SESSION_NOT_FOUND"),
                    ({"sessionId": "native-pi:../../etc"}, "INVALID_PARAMS")):
                assert await code_of(c, "session.fork", params) == code, params
            assert _tree(pi_root) == before
            early = await c.call("session.fork", {"sessionId": NATIVE, "throughMessageId": first})
            assert [m["blocks"][0]["text"] for m in (await _full(c, early["id"]))["messages"]] == ["hello pangolin"]
            # one keyed fork sent again at once from four connections of the client (a reconnect racing its
            # first try): one child, answered to all four
            answers: list[str] = []

            async def fork_once() -> None:
                async with open_client(proc.url, proc.token, client_id="outsider", client_kind="ui") as again:
                    child = await again.call("session.fork", {"sessionId": NATIVE, "submissionId": "f-1"})
                    answers.append(child["id"])

            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(fork_once)
            assert len(answers) == 4 and len(set(answers)) == 1
            proc.kill9()
    after = _tree(pi_root)
    assert {k: v for k, v in after.items() if k in before} == before
    assert len(after) == len(before) + 2 and parent.exists()


# ------------------------------------------------------------------------------ provider display order


async def _order(c: HostClient) -> list[str]:
    return [p["id"] for p in (await c.call("providers.list", {}))["providers"]]


async def test_provider_display_order_rules_through_a_kill(tmp_path: Path) -> None:
    """"Provider display order": "missing metadata preserves creation order, new IDs follow saved IDs, and
    deleted IDs are ignored"; "This preference does not rewrite provider configuration". Unknown and
    deleted ids in a reorder are ignored, a repeated id is INVALID_PARAMS and changes nothing; no provider
    row changes (``updatedAt`` included); SIGKILL right after the answer: the retry with the same key
    answers the same and the order survives; the same key for another order is IDEMPOTENCY_CONFLICT."""
    root = data_dir(tmp_path)
    ids = ["zeta", "yak", "mango", "alpha"]
    with trio.fail_after(90):
        async with real_host(root) as (proc, c):
            for pid in ids:
                await c.call("providers.create", {"id": pid, "name": pid.upper(), "config": {"x": pid}})
            assert await _order(c) == ids  # creation order, not id order
            rows = {p["id"]: p for p in (await c.call("providers.list", {}))["providers"]}
            await c.call("providers.delete", {"providerId": "yak"})
            assert await code_of(c, "providers.reorder", {"providerIds": ["alpha", "alpha"]}) == "INVALID_PARAMS"
            # "Host-core owns updates through providers.reorder": not a settings key, not a plugin's to set
            code, data = await error_of(c, "settings.set", {"ns": "app", "key": "providers.order", "value": ["alpha"]})
            assert (code, data.get("owner")) == ("INVALID_PARAMS", "providers.reorder")
            async with open_client(proc.url, proc.token, client_id="plug", client_kind="plugin",
                                   plugin_id="team") as plugin:
                assert await code_of(plugin, "providers.reorder", {"providerIds": ["alpha"]}) == "PERMISSION_DENIED"
            assert await _order(c) == ["zeta", "mango", "alpha"]
            proc.kill9()
        reorder = {"providerIds": ["ghost", "alpha", "yak", "mango"], "submissionId": "order-1"}
        async with real_host(root) as (proc, c):
            assert await c.call("providers.reorder", reorder) == {"providerIds": ["alpha", "mango"]}
            proc.kill9()  # right after the answer
        async with real_host(root) as (proc, c):
            assert await _order(c) == ["alpha", "mango", "zeta"]  # the saved order; zeta (unnamed) follows
            assert await c.call("providers.reorder", reorder) == {"providerIds": ["alpha", "mango"]}
            assert await code_of(c, "providers.reorder", {**reorder, "providerIds": ["zeta"]}) == \
                "IDEMPOTENCY_CONFLICT"
            await c.call("providers.create", {"id": "beta", "name": "BETA"})
            await c.call("providers.create", {"id": "yak", "name": "YAK again"})
            assert await _order(c) == ["alpha", "mango", "zeta", "beta", "yak"]
            now = {p["id"]: p for p in (await c.call("providers.list", {}))["providers"]}
            for pid in ("zeta", "mango", "alpha"):
                assert now[pid] == rows[pid]


# ------------------------------------------------------------------------------ §2.0 review snapshots


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "proj"
    ws.mkdir()
    (ws / "notes.md").write_bytes(b"after the edit\n")
    return ws


def _record(sid: str, **extra: Any) -> dict[str, Any]:
    return {"sessionId": sid, "path": "notes.md", "beforeBase64": base64.b64encode(b"before\n").decode(),
            "toolName": "Edit", "toolCallId": "call-1", "messageId": "m1", **extra}


@pytest.mark.parametrize("point", ["review.meta.after_tmp_write", "review.before.after_rename"])
async def test_a_review_record_killed_between_its_files_makes_one_snapshot_on_retry(
        tmp_path: Path, workspace: Path, point: str) -> None:
    """§2.0: "the previous bytes and hashes live outside the workspace in review-changes/<sessionId>/
    <snapshotId>/". SIGKILL while the snapshot's files are being written; the keyed retry answers one
    snapshot whose before bytes read back, review.list shows exactly it, and nothing was added to the
    workspace."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid = (await c.call("session.create", {"projectPath": str(workspace)}))["id"]
            proc.kill9()
        params = _record(sid, submissionId="rv-1")
        await call_killed_at(root, point, "review.record", params, client_id="outsider", client_kind="agent")
        async with real_host(root, kind="agent") as (proc, c):
            first = await c.call("review.record", params)
            assert await c.call("review.record", params) == first
            snap = first["snapshot"]
            listed = (await c.call("review.list", {"sessionId": sid}))["snapshots"]
            assert [s["snapshotId"] for s in listed] == [snap["snapshotId"]]
            got = await c.call("review.get", {"sessionId": sid, "snapshotId": snap["snapshotId"],
                                              "includeBefore": True})
            assert base64.b64decode(got["beforeBase64"]) == b"before\n"
    assert os.listdir(workspace) == ["notes.md"]
    assert os.listdir(root / "review-changes" / sid) == [snap["snapshotId"]]


async def test_review_snapshots_refuse_outside_paths_and_outlive_a_git_commit(tmp_path: Path, workspace: Path) -> None:
    """§2.0 / README: the path must stay inside the session's workspace (``outside_workspace``), an unknown
    session is SESSION_NOT_FOUND, a missing file NOT_FOUND: each writes nothing; "A snapshot is never
    inferred from Git, so a later commit does not remove historical review evidence": after a commit of the
    workspace and a restart the snapshot is listed and restorable."""
    root = data_dir(tmp_path)
    outside = tmp_path / "outside.md"
    outside.write_bytes(b"x\n")
    (workspace / "linked").symlink_to(tmp_path, target_is_directory=True)  # a folder link out of it
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid = (await c.call("session.create", {"projectPath": str(workspace)}))["id"]
            for path in ("../outside.md", str(outside), "linked/outside.md", str(workspace / "linked" / "outside.md")):
                code, data = await error_of(c, "review.record", _record(sid, path=path))
                assert (code, data.get("reason")) == ("INVALID_PARAMS", "outside_workspace")
            assert await code_of(c, "review.record", _record("no-such-session")) == "SESSION_NOT_FOUND"
            assert await code_of(c, "review.record", _record(sid, path="missing.md")) == "NOT_FOUND"
            assert not (root / "review-changes" / sid).exists() or not list((root / "review-changes" / sid).iterdir())
            snap = (await c.call("review.record", _record(sid)))["snapshot"]
            git = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a",
                   "GIT_COMMITTER_EMAIL": "a@b", "HOME": str(tmp_path)}
            for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "edit"]):
                await trio.run_process(["git", *argv], cwd=workspace, env={**os.environ, **git},
                                       capture_stdout=True, capture_stderr=True)
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            assert [s["snapshotId"] for s in (await c.call("review.list", {"sessionId": sid}))["snapshots"]] == \
                [snap["snapshotId"]]
            await c.call("review.restore", {"sessionId": sid, "snapshotId": snap["snapshotId"]})
    assert (workspace / "notes.md").read_bytes() == b"before\n"


async def test_a_damaged_saved_order_reads_as_missing_and_the_next_reorder_replaces_it(tmp_path: Path) -> None:
    """"missing metadata preserves creation order": a saved order that no longer reads as an array of ids
    (not JSON, an object, stray values and repeats) is read as missing or for the ids it still names, never
    an error; the next providers.reorder writes a clean one."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root) as (proc, c):
            for pid in ("z", "y", "x"):
                await c.call("providers.create", {"id": pid, "name": pid})
            await c.call("providers.reorder", {"providerIds": ["x"]})
            proc.kill9()
        for damaged, listed in (("not json", ["z", "y", "x"]), ('{"x": 0}', ["z", "y", "x"]),
                                ('[1, null, "y", "y", "x"]', ["y", "x", "z"])):
            conn = sqlite3.connect(root / "pi.sqlite")
            try:
                conn.execute("UPDATE kv SET value_json = ? WHERE ns = 'app' AND key = 'providers.order'", (damaged,))
                conn.commit()
            finally:
                conn.close()
            async with real_host(root) as (proc, c):
                assert await _order(c) == listed, damaged
                assert await c.call("providers.reorder", {"providerIds": ["x"]}) == {"providerIds": ["x"]}
                assert await _order(c) == ["x", "z", "y"]
                proc.kill9()


async def test_a_delete_killed_after_its_log_leaves_no_review_snapshots_behind(tmp_path: Path, workspace: Path) -> None:
    """§2.0 "The host removes a session's snapshot directory with session.delete": SIGKILL once the delete
    is logged and before its files are gone; after the restart the session and its review-changes/ folder
    are both gone, and the other session's snapshot stays."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid = (await c.call("session.create", {"projectPath": str(workspace)}))["id"]
            keep = (await c.call("session.create", {"projectPath": str(workspace)}))["id"]
            for s in (sid, keep):
                await c.call("review.record", _record(s))
            proc.kill9()
        await call_killed_at(root, "session_delete.after_log", "session.delete", {"sessionId": sid},
                             client_id="outsider", client_kind="agent")
        async with real_host(root, kind="agent") as (proc, c):
            assert await code_of(c, "session.get", {"sessionId": sid}) == "SESSION_NOT_FOUND"
            assert len((await c.call("review.list", {"sessionId": keep}))["snapshots"]) == 1
    assert os.listdir(root / "review-changes") == [keep]
