"""Seed 003 §11 acceptance items, read adversarially: the variants of items 1, 3, 4, 7, 13, 14, 18, 21 and
the "Active-turn steering transcript reservations" paragraphs that the happy-path acceptance tests leave out
(every block kind at once, a torn tail *and* a checkpoint *and* a running turn in one crash, a rewrite after
a lost index commit, a search needle spanning two messages, concurrent terminal updates, edge hop budgets).
Black-box against real ``pi-host serve`` processes over the documented wire protocol only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from runtime.client import ClientClosed, HostClient, open_client
from tests.acceptance.outsiderkit import code_of, data_dir, error_of, real_host, say
from tests.hostkit import call_killed_at, msg, start_host_process


async def _full(c: HostClient, sid: str) -> dict[str, Any]:
    result: dict[str, Any] = await c.call("session.get", {"sessionId": sid, "full": True})
    return result


def _stable(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as a restart must keep them (``seq`` aside: it is a read projection)."""
    return [{k: v for k, v in m.items() if k != "seq"} for m in messages]


async def _hits(c: HostClient, query: str, **extra: Any) -> list[tuple[str, str]]:
    found = (await c.call("search.query", {"query": query, **extra}))["results"]
    return [(h["sessionId"], h["messageId"]) for h in found]


async def _terminate(proc: Any) -> None:
    """A clean stop (SIGTERM): the host must exit 0."""
    assert await trio.to_thread.run_sync(proc.terminate) == 0


# ------------------------------------------------------------------------------------ item 1: byte-identical

_EVERY_BLOCK = [
    {"type": "thinking", "text": "weighing 漢字 and emoji 🧪", "signature": "sig/+==", "redacted": False},
    {"type": "text", "text": "line one\nline two\t\u2028 end \\ \"quoted\""},
    {"type": "tool_call", "callId": "c-1", "name": "Bash", "args": {"command": "ls -la", "nested": {"a": [1, 2.5,
     None, True]}}, "result": {"stdout": "x" * 200_000, "exitCode": 0}, "status": "success"},
    {"type": "attachment", "kind": "image", "name": "pic.png", "ref": "/tmp/pic.png", "mimeType": "image/png",
     "size": 12, "extra": {"w": 3}},
    {"type": "hostedSearch", "status": "completed", "rounds": [{"id": "r1", "status": "completed", "kind": "search",
     "query": "trio nursery", "futureKey": [1]}], "replay": [{"opaque": True}]},
    {"type": "martian_block_v9", "payload": {"deep": {"deeper": [{"x": 1e-7}, "", {}]}}, "n": 12345678901234567},
    {"type": "image_generation", "status": "done", "items": []},
]


async def test_item1_every_block_kind_usage_and_a_large_tool_result_survive_kill_clean_stop_and_db_loss(
        tmp_path: Path) -> None:
    """§11.1 "Sessions and transcripts survive restart byte-identically (blocks, usage, tool results)" —
    with every known block type, unknown ones, a usage/model meta and a 200 kB tool result in one message;
    identical after a SIGKILL, after a clean restart, and after the whole index is deleted (content reloads
    from sessions/<id>.jsonl). The transcript file itself is never rewritten by any of the restarts."""
    root = data_dir(tmp_path)
    meta = {"usage": {"input": 1830, "output": 412, "cacheRead": 0, "cost": {"total": 0.0123}},
            "modelId": "claude-sonnet-4", "providerId": "anthropic", "stopReason": "toolUse",
            "custom": {"unknownField": [1, {"b": None}]}}
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid = (await c.call("session.create", {"title": "blocks"}))["id"]
            await say(c, sid, "u1", "go")
            await say(c, sid, "a1", "", role="assistant", blocks=_EVERY_BLOCK, meta=meta,
                      createdAt="2026-07-26T09:00:04.120Z")
            await say(c, sid, "t1", "", role="tool", toolName="Bash",
                      blocks=[{"type": "tool_call", "callId": "c-2", "args": {}, "result": {"big": "y" * 50_000},
                               "status": "error", "futureField": 1}])
            before = _stable((await _full(c, sid))["messages"])
            assert before[1]["blocks"] == _EVERY_BLOCK and before[1]["meta"] == meta
            proc.kill9()
        transcript = root / "sessions" / f"{sid}.jsonl"
        on_disk = transcript.read_bytes()
        async with real_host(root, kind="agent") as (proc, c):
            assert _stable((await _full(c, sid))["messages"]) == before
            await _terminate(proc)
        async with real_host(root, kind="agent") as (proc, c):
            assert _stable((await _full(c, sid))["messages"]) == before
            proc.kill9()
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (root / name).unlink(missing_ok=True)
        async with real_host(root, kind="agent") as (proc, c):
            after = await _full(c, sid)
            assert _stable(after["messages"]) == before
            assert after["session"]["title"] == "blocks"
            assert await _hits(c, "line two") == [(sid, "a1")]
        assert transcript.read_bytes() == on_disk


# --------------------------------------------------------------- item 3: crash with a turn, a checkpoint, a tear

async def test_item3_kill_with_running_turn_checkpoint_and_torn_tail_in_one_session(tmp_path: Path) -> None:
    """§11.3 "Kill -9 during a running turn: boot marks the turn aborted, transcript intact up to the last
    fsync'd message line; a torn trailing line is skipped on read" — in one session at once: a running turn,
    an in-flight checkpoint and a torn line after the last whole one. After the restart the turn is aborted,
    the checkpoint is promoted as an interrupted assistant row of that turn, the torn line is gone, the next
    append is a whole line of its own, and a second restart reads the same."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            await say(c, sid, "u1", "question", turnId="t1")
            await say(c, sid, "tool1", "", role="tool", turnId="t1", toolName="Read",
                      blocks=[{"type": "tool_call", "callId": "c1", "args": {"p": "a"}, "result": "ok",
                               "status": "success"}])
            await c.call("session.saveInflightMessage", {
                "sessionId": sid, "turnId": "t1",
                "message": msg("a1", "half of the answer", role="assistant", turnId="t1")})
            proc.kill9()
        transcript = root / "sessions" / f"{sid}.jsonl"
        with transcript.open("ab") as fh:
            fh.write(b'{"type":"message","id":"torn","role":"assistant","blocks":[{"type":"te')
        async with real_host(root, kind="agent") as (proc, c):
            view = await _full(c, sid)
            assert [m["id"] for m in view["messages"]] == ["u1", "tool1", "a1"]
            promoted = view["messages"][2]
            assert promoted["turnId"] == "t1"
            assert promoted["blocks"] == [{"type": "text", "text": "half of the answer"}]
            assert promoted["meta"].get("interrupted") is True
            assert not view.get("inflight")
            turns = (await c.call("session.listTurns", {"sessionId": sid}))["turns"]
            assert [(t["id"] if "id" in t else t["turnId"], t["status"]) for t in turns] == [("t1", "aborted")]
            assert await code_of(c, "session.endTurn",
                                 {"sessionId": sid, "turnId": "t1", "status": "completed"}) == "CONFLICT"
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t2"})
            await say(c, sid, "u2", "again", turnId="t2")
            await c.call("session.endTurn", {"sessionId": sid, "turnId": "t2", "status": "completed"})
            first = _stable((await _full(c, sid))["messages"])
            proc.kill9()
        for line in transcript.read_bytes().splitlines():
            json.loads(line)  # every line whole: the torn bytes never glued onto the next append
        async with real_host(root, kind="agent") as (proc, c):
            assert _stable((await _full(c, sid))["messages"]) == first
            assert [m["id"] for m in first] == ["u1", "tool1", "a1", "u2"]
            notes = (await c.call("notifications.list", {}))["notifications"]
            assert [n["turnId"] for n in notes] == ["t2"]


# ----------------------------------------------------- item 4: lost index commit, then a rewrite self-heals

async def test_item4_lost_index_commit_then_truncate_rewrite_makes_search_find_it(tmp_path: Path) -> None:
    """§11.4 "Kill -9 between file append and index commit: the message still renders after restart; search
    misses it only until the next transcript rewrite" — the rewrite here is a truncateFrom (regenerate) of a
    *later* message, and then a replaceMessages: after each, search finds the once-lost message; the
    session's message count and ids agree with the file."""
    root = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(root, client_id="test") as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await say(c, sid, "u1", "first plain")
            proc.kill9()
        await _append_killed_before_index_commit(root, {"sessionId": sid,
                                                         "message": msg("lost1", "zebracorn appears once")})
        async with real_host(root, client_id="test") as (proc, c):
            view = await _full(c, sid)
            assert [m["id"] for m in view["messages"]] == ["u1", "lost1"]
            await say(c, sid, "a1", "reply", role="assistant")
            await say(c, sid, "u2", "later question")
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u2", "mode": "edit"})
            assert await _hits(c, "zebracorn") == [(sid, "lost1")]
            view = await _full(c, sid)
            assert [m["id"] for m in view["messages"]] == ["u1", "lost1", "a1"]
            assert view["session"]["messageCount"] == 3
            proc.kill9()
        async with real_host(root, client_id="test") as (proc, c):
            assert await _hits(c, "zebracorn") == [(sid, "lost1")]
            kept = (await _full(c, sid))["messages"]
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": kept[:2]})
            assert await _hits(c, "zebracorn") == [(sid, "lost1")]
            assert await _hits(c, "reply") == []


async def test_item4_lost_index_commit_replay_of_the_same_append_is_a_no_op(tmp_path: Path) -> None:
    """§11.4 with the outbox's retry: the append whose index commit was lost is sent again after the restart
    (same id): it is a no-op — one line in the file, one row, one message in the read."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, client_id="test") as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            proc.kill9()
        params = {"sessionId": sid, "message": msg("m1", "sent twice"), "submissionId": "sub-1"}
        await _append_killed_before_index_commit(root, params)
        async with real_host(root, client_id="test") as (proc, c):
            again = await c.call("session.appendMessage", params)
            assert again["message"]["id"] == "m1"
            await say(c, sid, "m2", "next")
            view = await _full(c, sid)
            assert [m["id"] for m in view["messages"]] == ["m1", "m2"]
            assert view["session"]["messageCount"] == 2
        lines = (root / "sessions" / f"{sid}.jsonl").read_bytes().count(b'"id":"m1"')
        assert lines == 1


async def _steered_reservation(c: HostClient, text: str, **extra: Any) -> str:
    """A new session whose running turn t1 holds u1 ("ask"), the streaming reservation a1 (``text``) and the
    steering row s1 after it; the session id."""
    sid: str = (await c.call("session.create", {}))["id"]
    await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
    await say(c, sid, "u1", "ask", turnId="t1")
    await say(c, sid, "a1", text, role="assistant", turnId="t1", meta={"status": "streaming"}, **extra)
    await say(c, sid, "s1", "steer", meta={"steering": True})
    return sid


async def _append_killed_before_index_commit(root: Path, params: dict[str, Any]) -> None:
    """The append on a host armed to SIGKILL itself before the index commit (the append may be answered
    first: it is acknowledged once durable); the host died of it."""
    crashing = start_host_process(root, env={"RT_CRASHPOINT": "index.before_commit:1"})
    try:
        with trio.fail_after(60):
            try:
                async with open_client(crashing.url, crashing.token, client_id="test", client_kind="ui") as c:
                    await c.call("session.appendMessage", params)
                    await c.call("host.status", {})
            except (ClientClosed, OSError):
                pass
            await trio.to_thread.run_sync(crashing.reap)
    finally:
        crashing.kill9()
    assert crashing.proc.returncode == -9


# ------------------------------------------------------------------------------------ item 7: FTS and delete

async def test_item7_cjk_and_ascii_substrings_never_span_two_messages(tmp_path: Path) -> None:
    """§11.7 "FTS finds CJK and ASCII substrings across sessions": a substring inside a message is found in
    every session holding it; a needle whose halves sit in two adjacent messages (or in a thinking block and
    the answer) is found nowhere."""
    root = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(root, kind="agent") as (proc, c):
            a = (await c.call("session.create", {}))["id"]
            b = (await c.call("session.create", {}))["id"]
            await say(c, a, "a1", "前半は東京")
            await say(c, a, "a2", "都庁の話です")
            await say(c, b, "b1", "私は東京都庁で働く")
            await say(c, a, "a3", "abcdef")
            await say(c, a, "a4", "ghijkl")
            await say(c, b, "b2", "xx abcdefghijkl yy")
            await say(c, a, "a5", "", role="assistant",
                      blocks=[{"type": "thinking", "text": "secret 思考内容"}, {"type": "text", "text": "答えです"}])
            assert await _hits(c, "東京都庁") == [(b, "b1")]
            assert await _hits(c, "defghi") == [(b, "b2")]
            assert sorted(await _hits(c, "東京")) == sorted([(a, "a1"), (b, "b1")])
            assert await _hits(c, "思考内容") == []
            assert await _hits(c, "内容答え") == []
            assert await _hits(c, "答えです") == [(a, "a5")]


async def test_item7_delete_removes_every_file_and_its_search_rows_even_after_a_kill(tmp_path: Path) -> None:
    """§11.7 "deleting a session removes its index entries and both session files" — with a revisions file
    and an in-flight checkpoint present too; SIGKILL right after the delete answered, restart: no file is
    back, search, list and get know nothing of it, the other session is untouched."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            gone = (await c.call("session.create", {}))["id"]
            kept = (await c.call("session.create", {}))["id"]
            await say(c, gone, "u1", "quokka shared word")
            await say(c, gone, "a1", "first quokka reply", role="assistant")
            await c.call("session.saveActiveRevision", {"sessionId": gone, "rootUserId": "u1"})
            await c.call("session.truncateFrom", {"sessionId": gone, "messageId": "a1", "mode": "regenerate"})
            await say(c, gone, "a1b", "second quokka reply", role="assistant")
            await c.call("session.startTurn", {"sessionId": gone, "turnId": "t9"})
            await c.call("session.saveInflightMessage", {"sessionId": gone, "turnId": "t9",
                                                         "message": msg("a9", "quokka stream", role="assistant",
                                                                        turnId="t9")})
            await say(c, kept, "k1", "quokka elsewhere")
            sessions = root / "sessions"
            assert (sessions / f"{gone}.revisions.jsonl").exists()
            assert (sessions / f"{gone}.inflight.json").exists()
            await c.call("session.delete", {"sessionId": gone})
            proc.kill9()
        assert sorted(p.name for p in sessions.iterdir() if p.name.startswith(gone)) == []
        async with real_host(root, kind="agent") as (proc, c):
            assert await _hits(c, "quokka") == [(kept, "k1")]
            assert await code_of(c, "session.get", {"sessionId": gone}) == "SESSION_NOT_FOUND"
            listed = (await c.call("session.list", {}))["sessions"]
            assert [s["id"] for s in listed] == [kept]
            assert (await c.call("notifications.list", {}))["notifications"] == []
        assert sorted(p.name for p in sessions.iterdir() if p.name.startswith(gone)) == []


# -------------------------------------------------------------------------- item 13: branches and restarts

def _grew(path: Path, before: bytes) -> bytes:
    now = path.read_bytes() if path.exists() else b""
    assert now.startswith(before), "the revisions file was rewritten"
    return now


async def test_item13_a_branch_that_grew_after_its_archive_comes_back_whole_after_a_kill_and_db_loss(
        tmp_path: Path) -> None:
    """§11.13 + §4.9 (D307): "A branch keeps growing after its archive: later prompts append to it ... so
    every operation that discards the live branch first writes it back". Variant 2 is archived, then two
    more exchanges land on it; switching to variant 1, SIGKILL, restart, switching back must restore all of
    variant 2 (with each message's turn), the root reloads with revisionCount / activeRevision, the
    revisions file only grows, and after the index is lost the variants are still listed and switchable."""
    root = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(root, kind="agent") as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            revisions = root / "sessions" / f"{sid}.revisions.jsonl"
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            await say(c, sid, "u1", "pick a colour", turnId="t1")
            await say(c, sid, "a1", "crimson", role="assistant", turnId="t1")
            await c.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed"})
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            seen = _grew(revisions, b"")
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            seen = _grew(revisions, seen)
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t2"})
            await say(c, sid, "a1b", "teal", role="assistant", turnId="t2")
            await c.call("session.endTurn", {"sessionId": sid, "turnId": "t2", "status": "completed"})
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            seen = _grew(revisions, seen)
            for n in (3, 4):  # the branch grows after its archive
                await c.call("session.startTurn", {"sessionId": sid, "turnId": f"t{n}"})
                await say(c, sid, f"u{n}", f"follow-up {n} ocelot", turnId=f"t{n}")
                await say(c, sid, f"a{n}", f"answer {n}", role="assistant", turnId=f"t{n}")
                await c.call("session.endTurn", {"sessionId": sid, "turnId": f"t{n}", "status": "completed"})
            variant2 = _stable((await _full(c, sid))["messages"])
            assert [m["id"] for m in variant2] == ["u1", "a1b", "u3", "a3", "u4", "a4"]
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 1})
            seen = _grew(revisions, seen)
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            view = await _full(c, sid)
            assert [m["id"] for m in view["messages"]] == ["u1", "a1"]
            assert (view["messages"][0]["meta"]["revisionCount"], view["messages"][0]["meta"]["activeRevision"]) \
                == (2, 1)
            assert await _hits(c, "ocelot") == []
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 2})
            seen = _grew(revisions, seen)
            back = _stable((await _full(c, sid))["messages"])
            assert [m["id"] for m in back] == [m["id"] for m in variant2]
            assert [m.get("turnId") for m in back[1:]] == [m.get("turnId") for m in variant2[1:]]
            assert [m["blocks"] for m in back] == [m["blocks"] for m in variant2]
            assert sorted(await _hits(c, "ocelot")) == [(sid, "u3"), (sid, "u4")]
            proc.kill9()
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (root / name).unlink(missing_ok=True)
        async with real_host(root, kind="agent") as (proc, c):
            listed = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
            assert sorted((r["revisionIndex"], r["isActive"]) for r in listed) == [(1, False), (2, True)]
            assert [m["id"] for m in (await _full(c, sid))["messages"]] == [m["id"] for m in variant2]
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 1})
            assert [m["id"] for m in (await _full(c, sid))["messages"]] == ["u1", "a1"]
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 2})
            assert [m["id"] for m in (await _full(c, sid))["messages"]] == [m["id"] for m in variant2]
            _grew(revisions, seen)


async def test_item13_repeated_turns_over_one_live_branch_cost_the_revisions_file_nothing(tmp_path: Path) -> None:
    """§11.13 "A branch that is still live is referenced, not copied, so repeated turns over one branch cost
    the file nothing": archiving the same live branch after every turn, while a 40 kB message sits in it,
    adds no bytes that grow with the branch (each archive is at most one constant-size reference line)."""
    root = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(root, kind="agent") as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            revisions = root / "sessions" / f"{sid}.revisions.jsonl"
            await say(c, sid, "u1", "start")
            await say(c, sid, "a1", "z" * 40_000, role="assistant")
            sizes = []
            for n in range(2, 7):
                await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
                sizes.append(revisions.stat().st_size if revisions.exists() else 0)
                await say(c, sid, f"u{n}", "w" * 5_000)
                await say(c, sid, f"a{n}", "q" * 5_000, role="assistant")
            growth = [b - a for a, b in zip(sizes, sizes[1:], strict=False)]
            assert sizes[0] < 1_000 and all(g < 1_000 for g in growth), sizes
            root_meta = (await _full(c, sid))["messages"][0]["meta"]
            assert (root_meta["revisionCount"], root_meta["activeRevision"]) == (1, 1)


# ---------------------------------------------------------------- item 14: concurrent terminal updates

async def test_item14_concurrent_terminal_updates_make_one_notification_and_abort_makes_none(
        tmp_path: Path) -> None:
    """§11.14 "repeated terminal updates do not duplicate it, aborted turns create none": two endTurn
    (completed) for one turn sent at once from two clients give one notification (exactly one reply carries
    it); completed racing error: one wins, the loser is CONFLICT, one notification of the winner's kind;
    aborted then completed: CONFLICT, none. All of it holds after a SIGKILL + restart."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            async with open_client(proc.url, proc.token, client_id="second", client_kind="agent") as c2:
                sid = (await c.call("session.create", {}))["id"]
                results: list[Any] = []

                async def end(client: HostClient, turn: str, status: str) -> None:
                    try:
                        results.append(await client.call("session.endTurn",
                                                         {"sessionId": sid, "turnId": turn, "status": status}))
                    except Exception as failed:  # noqa: BLE001 - the loser's error code is the assertion
                        results.append(getattr(failed, "data_code", repr(failed)))

                await c.call("session.startTurn", {"sessionId": sid, "turnId": "same"})
                async with trio.open_nursery() as nursery:
                    for client in (c, c2, c, c2):
                        nursery.start_soon(end, client, "same", "completed")
                assert sum(1 for r in results if isinstance(r, dict) and r.get("notification")) == 1
                assert all(isinstance(r, dict) and r["turn"]["status"] == "completed" for r in results)
                results.clear()
                await c.call("session.startTurn", {"sessionId": sid, "turnId": "race"})
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(end, c, "race", "completed")
                    nursery.start_soon(end, c2, "race", "error")
                winners = [r for r in results if isinstance(r, dict)]
                assert len(winners) == 1 and results.count("CONFLICT") == 1, results
                kind = {"completed": "task.completed", "error": "task.failed"}[winners[0]["turn"]["status"]]
                assert winners[0]["notification"]["kind"] == kind
                await c.call("session.startTurn", {"sessionId": sid, "turnId": "stop"})
                assert (await c.call("session.endTurn", {"sessionId": sid, "turnId": "stop",
                                                         "status": "aborted"})).get("notification") is None
                assert await code_of(c, "session.endTurn",
                                     {"sessionId": sid, "turnId": "stop", "status": "completed"}) == "CONFLICT"
                listed = (await c.call("notifications.list", {}))["notifications"]
                assert sorted(n["turnId"] for n in listed) == ["race", "same"]
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            listed = (await c.call("notifications.list", {}))["notifications"]
            assert sorted(n["turnId"] for n in listed) == ["race", "same"]
            again = await c.call("session.endTurn", {"sessionId": sid, "turnId": "same", "status": "completed"})
            assert again.get("notification") is None
            assert len((await c.call("notifications.list", {}))["notifications"]) == 2


async def test_item14_the_newest_200_cap_keeps_the_newest_through_a_kill(tmp_path: Path) -> None:
    """§11.14 "the newest-200 cap survives restart": 205 completed turns leave the newest 200 (the 5 oldest
    gone), the same after SIGKILL + restart, and a turn ending after the restart still evicts exactly the
    oldest."""
    root = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(root, kind="agent") as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            for n in range(205):
                await c.call("session.startTurn", {"sessionId": sid, "turnId": f"t{n:03}"})
                await c.call("session.endTurn", {"sessionId": sid, "turnId": f"t{n:03}", "status": "completed"})
            page = await c.call("notifications.list", {"limit": 200})
            assert [n["turnId"] for n in page["notifications"]] == [f"t{n:03}" for n in range(204, 4, -1)]
            assert not page.get("nextCursor") and page["unreadCount"] == 200
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            listed = (await c.call("notifications.list", {"limit": 200}))["notifications"]
            assert [n["turnId"] for n in listed] == [f"t{n:03}" for n in range(204, 4, -1)]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t205"})
            await c.call("session.endTurn", {"sessionId": sid, "turnId": "t205", "status": "error"})
            page = await c.call("notifications.list", {"limit": 200})
            assert [n["turnId"] for n in page["notifications"]] == [f"t{n:03}" for n in range(205, 5, -1)]
            assert not page.get("nextCursor") and page["unreadCount"] == 200


# ------------------------------------------------------------------ steering: streaming reservations

async def test_steering_terminal_final_replaces_the_streaming_reservation_in_place_and_stays_settled(
        tmp_path: Path) -> None:
    """Active-turn steering: a streaming assistant is stored provisionally before the steering user row;
    "Further stream checkpoints remain valid while the indexed assistant has status: streaming"; a terminal
    assistant "updates exactly that transcript line and search text, retaining sequence, owning turn and
    every other row"; "Late partial snapshots and duplicate terminal snapshots cannot overwrite the settled
    result". Read back the same after SIGKILL and after the index is lost."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            await say(c, sid, "u1", "first ask", turnId="t1")
            reserved = await say(c, sid, "a1", "provisional wombat", role="assistant", turnId="t1",
                                 meta={"status": "streaming"})
            await say(c, sid, "s1", "steer: shorter please", meta={"steering": True})
            saved = await c.call("session.saveInflightMessage", {
                "sessionId": sid, "turnId": "t1",
                "message": msg("a1", "provisional wombat and more", role="assistant", turnId="t1",
                               meta={"status": "streaming"})})
            assert saved["saved"] is True
            final = await say(c, sid, "a1", "final koala answer", role="assistant",
                              meta={"status": "completed"})
            assert final["message"]["seq"] == reserved["message"]["seq"]
            assert final["message"].get("turnId") == "t1"
            late = await say(c, sid, "a1", "provisional wombat and more and", role="assistant", turnId="t1",
                             meta={"status": "streaming"})
            assert late.get("replayed") is True
            assert await code_of(c, "session.appendMessage", {"sessionId": sid, "message": msg(
                "a1", "another final", role="assistant", turnId="t1", meta={"status": "completed"})}) \
                == "IDEMPOTENCY_CONFLICT"
            dup = await say(c, sid, "a1", "final koala answer", role="assistant", meta={"status": "completed"})
            assert dup.get("replayed") is True
            await c.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed"})
            view = await _full(c, sid)
            assert [m["id"] for m in view["messages"]] == ["u1", "a1", "s1"]
            assert view["messages"][1]["blocks"] == [{"type": "text", "text": "final koala answer"}]
            assert view["messages"][2].get("steering") is True
            assert not view.get("inflight")
            assert await _hits(c, "koala") == [(sid, "a1")] and await _hits(c, "wombat") == []
            settled = _stable(view["messages"])
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            assert _stable((await _full(c, sid))["messages"]) == settled
            proc.kill9()
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (root / name).unlink(missing_ok=True)
        async with real_host(root, kind="agent") as (proc, c):
            assert _stable((await _full(c, sid))["messages"]) == settled
            assert await _hits(c, "koala") == [(sid, "a1")] and await _hits(c, "wombat") == []


async def test_steering_crash_promotes_the_latest_checkpoint_in_the_reserved_position(tmp_path: Path) -> None:
    """Active-turn steering: "The host stores the provisional row and an in-flight checkpoint, including an
    empty reservation so crash recovery can settle it ... Recovery promotes the latest checkpoint in that
    same position." An empty provisional row, a steering row after it, two checkpoints, SIGKILL: after the
    restart the reply sits before the steering row with the newest checkpoint's content, once; the turn is
    aborted; a final sent again after the restart replaces the promoted row (README §4)."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid = await _steered_reservation(c, "", blocks=[])
            for text in ("first chunk", "first chunk, second chunk"):
                r = await c.call("session.saveInflightMessage", {
                    "sessionId": sid, "turnId": "t1",
                    "message": msg("a1", text, role="assistant", turnId="t1", meta={"status": "streaming"})})
                assert r["saved"] is True
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            view = await _full(c, sid)
            assert [m["id"] for m in view["messages"]] == ["u1", "a1", "s1"]
            promoted = view["messages"][1]
            assert promoted["blocks"] == [{"type": "text", "text": "first chunk, second chunk"}]
            assert promoted.get("turnId") == "t1"
            assert promoted["meta"].get("status") != "streaming"
            assert not view.get("inflight")
            assert await _hits(c, "second chunk") == [(sid, "a1")]
            final = await say(c, sid, "a1", "the whole settled reply", role="assistant", turnId="t1",
                              meta={"status": "completed"})
            assert final["message"]["seq"] == promoted["seq"]
            view = await _full(c, sid)
            assert [m["id"] for m in view["messages"]] == ["u1", "a1", "s1"]
            assert view["messages"][1]["blocks"] == [{"type": "text", "text": "the whole settled reply"}]


async def test_steering_remapped_id_replay_is_a_no_op_across_restart_and_index_loss(tmp_path: Path) -> None:
    """Steering paragraph 2: "If messages.id already belongs to another session, the host remaps to
    {sessionId}:{id} before any JSONL write; a replay of the original id is a no-op against that remapped
    row" — after a SIGKILL and after the index is lost too: one row, one line, the other session intact."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            a = (await c.call("session.create", {}))["id"]
            b = (await c.call("session.create", {}))["id"]
            await say(c, a, "shared-1", "alpha owns it")
            first = await say(c, b, "shared-1", "beta collides")
            assert first.get("remappedFrom") == "shared-1"
            again = await say(c, b, "shared-1", "beta collides")
            assert again.get("replayed") is True
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            assert (await say(c, b, "shared-1", "beta collides")).get("replayed") is True
            proc.kill9()
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (root / name).unlink(missing_ok=True)
        async with real_host(root, kind="agent") as (proc, c):
            assert (await say(c, b, "shared-1", "beta collides")).get("replayed") is True
            await say(c, b, "next", "after")
            got_b = (await _full(c, b))["messages"]
            assert [m["blocks"][0]["text"] for m in got_b] == ["beta collides", "after"]
            got_a = (await _full(c, a))["messages"]
            assert [(m["id"], m["blocks"][0]["text"]) for m in got_a] == [("shared-1", "alpha owns it")]
            assert sorted(await _hits(c, "collides")) == [(b, got_b[0]["id"])]
        assert (root / "sessions" / f"{b}.jsonl").read_bytes().count(b"beta collides") == 1


# ------------------------------------------------------------- item 18: every approval state in one restart

_MD = "# Goal\n\nShip it   \r\n"


def _submit(sid: str, ws: Path, turn: str, call: str, kind: str) -> dict[str, Any]:
    return {"sessionId": sid, "turnId": turn, "toolCallId": call, "kind": kind, "markdown": _MD,
            "title": f"{kind} title", "question": "ok?", "workspaceRoot": str(ws)}


async def test_item18_one_restart_interrupts_a_pending_goal_a_queued_goal_and_a_running_plan(tmp_path: Path) -> None:
    """§11.18 "Full process restart marks pending/queued/running approval rows interrupted, aborts associated
    turns, performs no replay, keeps pending sessions in their contract mode, keeps already-approved
    interrupted sessions Agent, and rejects stale responses" — the goal kind as well as plan, all three
    states in one restart: the pending goal session stays goal, the queued goal and running plan sessions
    stay agent, every turn is aborted, nothing is pending, no execution can start or finish, every stale
    answer (approve, reject, exact retry aside) is CONFLICT, and the artifact files are untouched."""
    root = data_dir(tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, agent):
            async with open_client(proc.url, proc.token, client_id="ui", client_kind="ui") as ui:
                pend = (await agent.call("session.create", {"projectPath": str(ws), "mode": "goal"}))["id"]
                queued = (await agent.call("session.create", {"projectPath": str(ws), "mode": "goal"}))["id"]
                running = (await agent.call("session.create", {"projectPath": str(ws), "mode": "plan"}))["id"]
                for sid in (pend, queued, running):
                    await agent.call("session.startTurn", {"sessionId": sid, "turnId": f"{sid}-t1"})
                p_req = await agent.call("plans.submit", _submit(pend, ws, f"{pend}-t1", "c-p", "goal"))
                q_req = await agent.call("plans.submit", _submit(queued, ws, f"{queued}-t1", "c-q", "goal"))
                r_req = await agent.call("plans.submit", _submit(running, ws, f"{running}-t1", "c-r", "plan"))
                q_ok = await ui.call("plans.respond", {"requestId": q_req["requestId"], "action": "approve",
                                                       "targetPermissionMode": "auto", "submissionId": "ans-q"})
                r_ok = await ui.call("plans.respond", {"requestId": r_req["requestId"], "action": "approve"})
                await agent.call("session.endTurn", {"sessionId": running, "turnId": f"{running}-t1",
                                                     "status": "completed"})
                await agent.call("session.startTurn", {"sessionId": running, "turnId": f"{running}-t2"})
                await agent.call("plans.startExecution", {"sessionId": running, "turnId": f"{running}-t2",
                                                          "executionId": r_ok["approval"]["executionId"]})
                files = {p: p.read_bytes() for p in ws.rglob("*.md")}
                assert len(files) == 3
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, agent):
            async with open_client(proc.url, proc.token, client_id="ui", client_kind="ui") as ui:
                modes = {sid: (await agent.call("session.get", {"sessionId": sid}))["session"]
                         for sid in (pend, queued, running)}
                assert modes[pend]["mode"] == "goal"
                assert modes[queued]["mode"] == "agent" and modes[queued]["permissionMode"] == "auto"
                assert modes[running]["mode"] == "agent"
                expected = {pend: {f"{pend}-t1": "aborted"}, queued: {f"{queued}-t1": "aborted"},
                            running: {f"{running}-t1": "completed", f"{running}-t2": "aborted"}}
                for sid in (pend, queued, running):
                    turns = (await agent.call("session.listTurns", {"sessionId": sid}))["turns"]
                    assert {t["id"]: t["status"] for t in turns} == expected[sid]
                assert modes[pend]["state"] == "planning"  # goal mode, nothing awaiting approval any more
                assert modes[queued].get("state") is None and modes[running].get("state") is None
                assert (await ui.call("plans.pending", {}))["pending"] == []
                for req in (p_req, q_req, r_req):
                    for action in ("approve", "reject"):
                        assert await code_of(ui, "plans.respond", {"requestId": req["requestId"],
                                                                   "action": action}) == "CONFLICT"
                assert await ui.call("plans.respond", {"requestId": q_req["requestId"], "action": "approve",
                                                       "targetPermissionMode": "auto",
                                                       "submissionId": "ans-q"}) == q_ok
                await agent.call("session.startTurn", {"sessionId": queued, "turnId": "q-t2"})
                assert await code_of(agent, "plans.startExecution", {
                    "sessionId": queued, "turnId": "q-t2", "executionId": q_ok["approval"]["executionId"]}) \
                    == "CONFLICT"
                assert await code_of(agent, "plans.finishExecution", {
                    "sessionId": running, "turnId": f"{running}-t2", "outcome": "completed",
                    "executionId": r_ok["approval"]["executionId"]}) == "CONFLICT"
                assert (await agent.call("session.get", {"sessionId": pend}))["session"]["mode"] == "goal"
                assert {p: p.read_bytes() for p in ws.rglob("*.md")} == files


# ------------------------------------------------ item 20: import killed between the file and the row

async def test_item20_import_killed_between_file_and_row_then_a_keyless_retry_makes_one_session(
        tmp_path: Path) -> None:
    """§11.20 "(pluginId, source, externalId) idempotency" when the first attempt died after its transcript
    file was linked and before its rows committed, and the retry carries no receipt key (a plugin that lost
    its outbox): one session with the messages once, one listed session, and a third import is created:
    false with the same id — also after another SIGKILL."""
    root = data_dir(tmp_path)
    imported = {"sourceId": "chatlog", "externalId": "conv-7", "title": "Imported",
                "messages": [msg("u1", "capybara question"), msg("a1", "capybara answer", role="assistant")]}
    with trio.fail_after(90):
        async with real_host(root, kind="plugin", client_id="plug", plugin_id="alpha") as (proc, c):
            pass
        await call_killed_at(root, "import.after_link", "plugins.importSession", imported,
                             client_id="plug", client_kind="plugin", plugin_id="alpha")
        async with real_host(root, kind="plugin", client_id="plug", plugin_id="alpha") as (proc, c):
            first = await c.call("plugins.importSession", imported)
            sid = first["sessionId"]
            listed = (await c.call("plugins.listSessions", {}))["sessions"]
            assert [s["id"] for s in listed] == [sid]
            again = await c.call("plugins.importSession", imported)
            assert (again["sessionId"], again["created"]) == (sid, False)
            proc.kill9()
        async with real_host(root, kind="plugin", client_id="plug", plugin_id="alpha") as (proc, c):
            again = await c.call("plugins.importSession", imported)
            assert (again["sessionId"], again["created"]) == (sid, False)
            assert [s["id"] for s in (await c.call("plugins.listSessions", {}))["sessions"]] == [sid]
            texts = [m["blocks"][0]["text"] for m in (await _full(c, sid))["messages"]]
            assert texts == ["capybara question", "capybara answer"]
        async with real_host(root, kind="ui") as (proc, ui):
            listed = [s["id"] for s in (await ui.call("session.list", {}))["sessions"]]
            assert listed == [sid]


# ---------------------------------------------------------------- item 21: hop and ceiling edges

def _deliver(src: str, dst: str, key: str, **extra: Any) -> dict[str, Any]:
    return {"pluginId": "team", "sourceSessionId": src, "targetSessionId": dst, "kind": "task",
            "content": f"job {key}", "idempotencyKey": key, **extra}


async def _begun_delivery(c: HostClient) -> tuple[str, str, str]:
    """A delivery from a new session (auto) to another (ask) whose turn t1 began it: (source, target, delivery)."""
    src: str = (await c.call("session.create", {"permissionMode": "auto"}))["id"]
    dst: str = (await c.call("session.create", {"permissionMode": "ask"}))["id"]
    did: str = (await c.call("collab.deliver", _deliver(src, dst, "k1")))["delivery"]["id"]
    await c.call("session.startTurn", {"sessionId": dst, "turnId": "t1"})
    await c.call("collab.begin", {"sessionId": dst, "deliveryId": did, "turnId": "t1"})
    return src, dst, did


async def test_item21_hop_budget_edges_and_a_held_budget_across_a_kill(tmp_path: Path) -> None:
    """§11.21 "enforce ... hop limits" at the edges: a delivery sent with remainingHops 0 is accepted but
    its handling turn cannot forward; 16 (the maximum) forwards as 15; 17 is refused before any write. A
    queued delivery with one hop left is held across a SIGKILL with its budget: after the restart its turn
    forwards once (0) and the next hop is LIMIT_EXCEEDED."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            a, b, d, e, f = [(await c.call("session.create", {"title": n, "permissionMode": "ask"}))["id"]
                             for n in "abdef"]
            zero = (await c.call("collab.deliver", _deliver(a, b, "z", remainingHops=0)))["delivery"]
            assert zero["remainingHops"] == 0
            await c.call("session.startTurn", {"sessionId": b, "turnId": "b1"})
            await c.call("collab.begin", {"sessionId": b, "deliveryId": zero["id"], "turnId": "b1"})
            assert await code_of(c, "collab.deliver", _deliver(b, d, "fwd-z")) == "LIMIT_EXCEEDED"
            await c.call("collab.settle", {"sessionId": b, "deliveryId": zero["id"], "turnId": "b1",
                                           "status": "completed", "result": "done"})
            assert await code_of(c, "collab.deliver", _deliver(b, d, "fwd-z2")) == "LIMIT_EXCEEDED"
            await c.call("session.endTurn", {"sessionId": b, "turnId": "b1", "status": "completed"})
            top = (await c.call("collab.deliver", _deliver(a, d, "max", remainingHops=16)))["delivery"]
            assert top["remainingHops"] == 16
            assert await code_of(c, "collab.deliver", _deliver(a, d, "over", remainingHops=17)) == "INVALID_PARAMS"
            assert await code_of(c, "collab.deliver", _deliver(a, d, "neg", remainingHops=-1)) == "INVALID_PARAMS"
            await c.call("session.startTurn", {"sessionId": d, "turnId": "d1"})
            await c.call("collab.begin", {"sessionId": d, "deliveryId": top["id"], "turnId": "d1"})
            step = (await c.call("collab.deliver", _deliver(d, e, "step", remainingHops=16)))["delivery"]
            assert step["remainingHops"] == 15
            one = (await c.call("collab.deliver", _deliver(a, f, "one", remainingHops=1)))["delivery"]
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            held = await c.call("collab.get", {"deliveryId": one["id"]})
            assert (held["status"], held["remainingHops"]) == ("queued", 1)
            assert (await c.call("collab.get", {"deliveryId": top["id"]}))["status"] == "interrupted"
            assert (await c.call("collab.get", {"deliveryId": step["id"]}))["status"] == "queued"
            await c.call("session.queueAttach", {"sessionId": f, "controllerId": "ctl"})
            taken = (await c.call("session.queueTake", {"sessionId": f, "controllerId": "ctl"}))["entry"]
            assert taken["sessionMessageId"] == one["id"]
            await c.call("session.startTurn", {"sessionId": f, "turnId": "f1"})
            await c.call("collab.begin", {"sessionId": f, "deliveryId": one["id"], "turnId": "f1"})
            fwd = (await c.call("collab.deliver", _deliver(f, b, "fwd-after", remainingHops=9)))["delivery"]
            assert fwd["remainingHops"] == 0
            await c.call("session.startTurn", {"sessionId": b, "turnId": "b2"})
            await c.call("collab.begin", {"sessionId": b, "deliveryId": fwd["id"], "turnId": "b2"})
            assert await code_of(c, "collab.deliver", _deliver(b, d, "fwd-after-2")) == "LIMIT_EXCEEDED"


async def test_item21_permission_ceiling_edges_with_inherit_and_after_a_kill(tmp_path: Path) -> None:
    """§11.21 "enforce permission ceilings": an equal mode passes; a target one step above is
    PERMISSION_DENIED and writes nothing; an ``inherit`` sender counts as its effective mode (``ask`` with no
    app default), so an accept-edits target is refused. A target raised above the snapshotted ceiling after
    the delivery, then SIGKILL + restart: beginning it is still PERMISSION_DENIED and the delivery stays
    queued with no input row."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            mk = {m: (await c.call("session.create", {"title": m, "permissionMode": m}))["id"]
                  for m in ("inherit", "ask", "accept-edits", "auto")}
            peer = (await c.call("session.create", {"title": "peer", "permissionMode": "accept-edits"}))["id"]
            assert await code_of(c, "collab.deliver", _deliver(mk["ask"], mk["accept-edits"], "up")) \
                == "PERMISSION_DENIED"
            assert await code_of(c, "collab.deliver", _deliver(mk["inherit"], mk["accept-edits"], "up2")) \
                == "PERMISSION_DENIED"
            assert await code_of(c, "collab.deliver", _deliver(mk["accept-edits"], mk["auto"], "up3")) \
                == "PERMISSION_DENIED"
            same = (await c.call("collab.deliver", _deliver(mk["accept-edits"], peer, "eq")))
            assert same["delivery"]["permissionCeiling"] == "accept-edits"
            down = (await c.call("collab.deliver", _deliver(mk["auto"], mk["ask"], "down")))["delivery"]
            inherit_ok = await c.call("collab.deliver", _deliver(mk["ask"], mk["inherit"], "inh"))
            assert inherit_ok["delivery"]["permissionCeiling"] == "ask"
            listed = (await c.call("collab.list", {}))["deliveries"]
            assert sorted(d["id"] for d in listed) == sorted([same["delivery"]["id"], down["id"],
                                                              inherit_ok["delivery"]["id"]])
            await c.call("session.update", {"sessionId": mk["inherit"], "permissionMode": "auto"})
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            target = mk["inherit"]
            await c.call("session.startTurn", {"sessionId": target, "turnId": "t1"})
            assert await code_of(c, "collab.begin", {"sessionId": target, "turnId": "t1",
                                                     "deliveryId": inherit_ok["delivery"]["id"]}) \
                == "PERMISSION_DENIED"
            got = await c.call("collab.get", {"deliveryId": inherit_ok["delivery"]["id"]})
            assert got["status"] == "queued" and got.get("turnId") is None
            assert (await c.call("session.get", {"sessionId": target}))["messages"] == []


# ------------------------------------------------------------------ more crash edges (items 3, 7, 12)

async def test_steering_a_settled_final_is_never_overwritten_by_its_stale_checkpoint_after_a_kill(
        tmp_path: Path) -> None:
    """Steering: "Late partial snapshots and duplicate terminal snapshots cannot overwrite the settled
    result" — the checkpoint saved before the final replaced the reservation must not be promoted over the
    final when the host is killed while the turn still runs; an empty checkpoint is kept while the indexed
    row is streaming (README §6), a checkpoint after the final is dropped."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid = await _steered_reservation(c, "reserv")
            empty = {"id": "a1", "role": "assistant", "turnId": "t1", "blocks": [], "meta": {"status": "streaming"}}
            kept = await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1", "message": empty})
            assert kept["saved"] is True
            await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1", "message": msg(
                "a1", "stale partial", role="assistant", turnId="t1", meta={"status": "streaming"})})
            await say(c, sid, "a1", "settled final", role="assistant", turnId="t1", meta={"status": "completed"})
            late = await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1", "message": msg(
                "a1", "stale partial, later", role="assistant", turnId="t1", meta={"status": "streaming"})})
            assert late["saved"] is False
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            view = await _full(c, sid)
            assert [m["id"] for m in view["messages"]] == ["u1", "a1", "s1"]
            assert view["messages"][1]["blocks"] == [{"type": "text", "text": "settled final"}]
            assert await _hits(c, "stale") == []
            assert not view.get("inflight")


async def test_item7_a_delete_killed_midway_is_all_or_nothing_and_its_retry_finishes_it(tmp_path: Path) -> None:
    """§11.7 / §5 "session delete — remove both session files after row delete": a SIGKILL right after the
    delete is logged leaves no half-deleted session after the restart (either it reads back whole with its
    search rows, or nothing of it is left); the client's retry of the delete then leaves no file, no row
    and no search hit — and the session does not come back after yet another restart."""
    root = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(root, kind="ui", client_id="test") as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            other = (await c.call("session.create", {}))["id"]
            await say(c, sid, "u1", "pangolin words")
            await say(c, sid, "a1", "pangolin reply", role="assistant")
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            await say(c, other, "o1", "pangolin elsewhere")
            proc.kill9()
        await call_killed_at(root, "session_delete.after_log", "session.delete", {"sessionId": sid})
        sessions = root / "sessions"
        async with real_host(root, kind="ui", client_id="test") as (proc, c):
            listed = [s["id"] for s in (await c.call("session.list", {}))["sessions"]]
            files = sorted(p.name for p in sessions.iterdir() if p.name.startswith(sid))
            if sid in listed:
                assert [m["id"] for m in (await _full(c, sid))["messages"]] == ["u1", "a1"]
                assert f"{sid}.jsonl" in files
            else:
                assert files == []
                assert sorted(await _hits(c, "pangolin")) == [(other, "o1")]
            code = await code_of(c, "session.delete", {"sessionId": sid})
            assert code in (None, "SESSION_NOT_FOUND")
            assert sorted(p.name for p in sessions.iterdir() if p.name.startswith(sid)) == []
            assert await _hits(c, "pangolin") == [(other, "o1")]
            proc.kill9()
        async with real_host(root, kind="ui", client_id="test") as (proc, c):
            assert [s["id"] for s in (await c.call("session.list", {}))["sessions"]] == [other]
            assert await _hits(c, "pangolin") == [(other, "o1")]
            assert await code_of(c, "session.get", {"sessionId": sid}) == "SESSION_NOT_FOUND"


async def test_item12_thinking_stays_out_of_search_through_edits_rewrites_and_a_rebuild(tmp_path: Path) -> None:
    """§11.12 "Assistant thinking blocks round-trip independently from final answer text; the derived search
    text excludes thinking content" — after a replaceMessages that edits both the thinking and the answer,
    after a truncateFrom + new reply, after a revision switch and after the index is rebuilt from files:
    thinking words never match, answer words always do, and the blocks read back separately."""
    root = data_dir(tmp_path)

    def reply(mid: str, think: str, say_: str) -> dict[str, Any]:
        return msg(mid, "", role="assistant", blocks=[{"type": "thinking", "text": think, "signature": "s"},
                                                        {"type": "text", "text": say_}])

    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await say(c, sid, "u1", "question")
            await c.call("session.appendMessage", {"sessionId": sid, "message": reply("a1", "hidden narwhal",
                                                                                     "visible heron")})
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            current = (await _full(c, sid))["messages"]
            edited = [current[0], reply("a1", "hidden narwhal edited", "visible heron edited")]
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": edited})
            assert await _hits(c, "narwhal") == [] and await _hits(c, "heron edited") == [(sid, "a1")]
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            await c.call("session.appendMessage", {"sessionId": sid, "message": reply("a2", "secret walrus",
                                                                                     "plain egret")})
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 1})
            view = (await _full(c, sid))["messages"]
            assert view[1]["blocks"][0] == {"type": "thinking", "text": "hidden narwhal edited", "signature": "s"}
            assert await _hits(c, "narwhal") == [] and await _hits(c, "walrus") == []
            assert await _hits(c, "heron edited") == [(sid, "a1")]
            proc.kill9()
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (root / name).unlink(missing_ok=True)
        async with real_host(root, kind="agent") as (proc, c):
            assert await _hits(c, "narwhal") == [] and await _hits(c, "walrus") == []
            assert await _hits(c, "heron edited") == [(sid, "a1")]
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 2})
            assert await _hits(c, "walrus") == [] and await _hits(c, "plain egret") == [(sid, "a2")]
            view = (await _full(c, sid))["messages"]
            assert view[1]["blocks"] == [{"type": "thinking", "text": "secret walrus", "signature": "s"},
                                         {"type": "text", "text": "plain egret"}]


async def test_steering_a_remapped_streaming_reservation_is_replaced_by_its_final_and_recovered_in_place(
        tmp_path: Path) -> None:
    """Steering paragraph 2 where its two rules meet: the streaming reservation's id already belongs to
    another session, so it is stored as {sessionId}:{id}; the terminal final sent under the original id
    replaces that remapped row in place (not a replay, not a conflict), and in a second session a crash
    promotes the checkpoint into the remapped reservation's position; the other session is never touched."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            owner = (await c.call("session.create", {}))["id"]
            await say(c, owner, "dup-a", "owner keeps this", role="assistant")
            await say(c, owner, "dup-b", "owner keeps that", role="assistant")
            live = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": live, "turnId": "t1"})
            await say(c, live, "u1", "ask", turnId="t1")
            reserved = await say(c, live, "dup-a", "prov", role="assistant", turnId="t1",
                                 meta={"status": "streaming"})
            assert reserved.get("remappedFrom") == "dup-a"
            await say(c, live, "s1", "steer", meta={"steering": True})
            r = await c.call("session.saveInflightMessage", {"sessionId": live, "turnId": "t1", "message": msg(
                "dup-a", "prov more", role="assistant", turnId="t1", meta={"status": "streaming"})})
            assert r["saved"] is True
            final = await say(c, live, "dup-a", "final mongoose", role="assistant", turnId="t1",
                              meta={"status": "completed"})
            assert final["message"]["seq"] == reserved["message"]["seq"]
            assert final.get("replayed") is not True
            await c.call("session.endTurn", {"sessionId": live, "turnId": "t1", "status": "completed"})
            got = (await _full(c, live))["messages"]
            assert [m["blocks"][0]["text"] for m in got] == ["ask", "final mongoose", "steer"]
            assert not (await _full(c, live)).get("inflight")

            crashed = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": crashed, "turnId": "t2"})
            await say(c, crashed, "u2", "ask again", turnId="t2")
            await say(c, crashed, "dup-b", "", role="assistant", turnId="t2", blocks=[],
                      meta={"status": "streaming"})
            await say(c, crashed, "s2", "steer again", meta={"steering": True})
            await c.call("session.saveInflightMessage", {"sessionId": crashed, "turnId": "t2", "message": msg(
                "dup-b", "recovered jackal", role="assistant", turnId="t2", meta={"status": "streaming"})})
            proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            got = (await _full(c, crashed))["messages"]
            assert [m["blocks"][0]["text"] if m["blocks"] else "" for m in got] == [
                "ask again", "recovered jackal", "steer again"]
            assert [m["blocks"][0]["text"] for m in (await _full(c, owner))["messages"]] == [
                "owner keeps this", "owner keeps that"]
            assert [m["blocks"][0]["text"] for m in (await _full(c, live))["messages"]] == [
                "ask", "final mongoose", "steer"]
            assert await _hits(c, "jackal") == [(crashed, got[1]["id"])]


async def test_item3_a_whole_last_line_without_its_newline_reads_consistently(tmp_path: Path) -> None:
    """§11.3 / §2.1 "a torn trailing line is skipped on read": a kill can also leave a complete JSON record
    whose newline never reached the disk. Whatever the host decides for it, the read, the message count and
    search agree, the next append is a whole line of its own, and a second restart reads the same."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await say(c, sid, "m1", "first line")
            proc.kill9()
        transcript = root / "sessions" / f"{sid}.jsonl"
        created = json.loads(transcript.read_bytes().splitlines()[-1])["createdAt"]
        with transcript.open("ab") as fh:
            fh.write(json.dumps({"type": "message", "id": "m2", "role": "user", "createdAt": created,
                                 "blocks": [{"type": "text", "text": "almost iguana"}]},
                                separators=(",", ":")).encode())
        async with real_host(root, kind="agent") as (proc, c):
            view = await _full(c, sid)
            ids = [m["id"] for m in view["messages"]]
            assert ids in (["m1"], ["m1", "m2"])
            assert view["session"]["messageCount"] == len(ids)
            assert await _hits(c, "iguana") == ([(sid, "m2")] if "m2" in ids else [])
            await say(c, sid, "m3", "after the tear")
            after = _stable((await _full(c, sid))["messages"])
            assert [m["id"] for m in after] == [*ids, "m3"]
            proc.kill9()
        for line in transcript.read_bytes().splitlines():
            json.loads(line)
        async with real_host(root, kind="agent") as (proc, c):
            assert _stable((await _full(c, sid))["messages"]) == after


async def test_item13_a_legacy_revisions_file_reads_back_message_for_message_after_an_index_rebuild(
        tmp_path: Path) -> None:
    """§11.13 "a file written only by an older build still reads back message-for-message" (§2.1: revision
    "is the only line kind a legacy file contains"; a refresh is "last record for (rootUserId, revisionIndex)
    wins"): the revisions file is replaced by the full-copy lines an older build would have written (the
    live variant stored in full too, variant 1 refreshed once), the index is deleted, and after the restart
    both variants are listed and each switch restores its messages exactly; the file only grows."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            await say(c, sid, "u1", "q", turnId="t1")
            await say(c, sid, "a1", "old first answer", role="assistant", turnId="t1")
            await c.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed"})
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            await say(c, sid, "a2", "second answer", role="assistant")
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            live = (await _full(c, sid))["messages"]
            proc.kill9()
        revisions = root / "sessions" / f"{sid}.revisions.jsonl"
        stored = [json.loads(line) for line in revisions.read_bytes().splitlines()]
        [variant1] = [r for r in stored if r["type"] == "revision" and r["revisionIndex"] == 1]
        stale = dict(variant1, messages=[variant1["messages"][0],
                                         dict(variant1["messages"][1], blocks=[{"type": "text", "text": "stale"}])])
        own = [{k: v for k, v in m.items() if k != "seq"} for m in live]
        variant2 = {"type": "revision", "rootUserId": "u1", "revisionIndex": 2,
                    "createdAt": variant1["createdAt"], "messages": own, "turns": {"u1": "t1"}}
        legacy = b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in (stale, variant1, variant2))
        revisions.write_bytes(legacy)
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (root / name).unlink(missing_ok=True)
        async with real_host(root, kind="agent") as (proc, c):
            listed = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
            assert sorted((r["revisionIndex"], r["isActive"]) for r in listed) == [(1, False), (2, True)]
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 1})
            one = (await _full(c, sid))["messages"]
            assert [(m["id"], m["blocks"]) for m in one] == [(m["id"], m["blocks"]) for m in variant1["messages"]]
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 2})
            two = (await _full(c, sid))["messages"]
            assert [(m["id"], m["blocks"]) for m in two] == [(m["id"], m["blocks"]) for m in live]
            assert await _hits(c, "second answer") == [(sid, "a2")] and await _hits(c, "stale") == []
        assert revisions.read_bytes().startswith(legacy)


# ----------------------------------------------------------------- item 19: unattended Plan/Goal paths

async def test_item19_a_session_switched_to_goal_under_a_running_run_cannot_propose_and_nothing_auto_approves(
        tmp_path: Path) -> None:
    """§11.19 "A scheduled or unattended Plan or Goal run fails before provider/artifact/queue work with
    PLAN_REQUIRES_INTERACTIVE_SESSION; no background path auto-approves either kind": a run bound to an
    agent session, the session then switched to goal (or plan): plans.submit from that run is refused with
    that code and writes no .pi file; after the run ends a proposal is accepted, and neither the agent
    sidecar nor a plugin can answer it (PERMISSION_DENIED, still pending) — only a person can."""
    root = data_dir(tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    with trio.fail_after(90):
        async with real_host(root, kind="ui") as (proc, ui):
            async with open_client(proc.url, proc.token, client_id="agent", client_kind="agent") as agent, \
                    open_client(proc.url, proc.token, client_id="plug", client_kind="plugin",
                                plugin_id="helper") as plugin:
                for kind in ("goal", "plan"):
                    sid = (await agent.call("session.create", {"projectPath": str(ws)}))["id"]
                    task = await ui.call("tasks.create", {"title": kind, "prompt": "p", "workspacePath": str(ws)})
                    run = await agent.call("tasks.startRun", {"taskId": task["id"], "sessionId": sid})
                    assert run["status"] == "running"
                    await agent.call("session.startTurn", {"sessionId": sid, "turnId": f"{kind}-t0"})
                    await agent.call("session.endTurn", {"sessionId": sid, "turnId": f"{kind}-t0",
                                                         "status": "completed"})
                    switched = await error_of(ui, "session.update", {"sessionId": sid, "mode": kind})
                    if switched[0] is None:
                        assert await code_of(agent, "session.startTurn", {"sessionId": sid, "turnId": f"{kind}-t1"}) \
                            == "PLAN_REQUIRES_INTERACTIVE_SESSION"
                        assert await code_of(agent, "plans.submit", _submit(sid, ws, f"{kind}-t0", f"{kind}-c1",
                                                                            kind)) is not None
                        assert not (ws / ".pi" / kind).exists()
                        assert (await ui.call("plans.pending", {}))["pending"] == []
                    await agent.call("tasks.finishRun", {"runId": run["id"], "status": "completed"})
                    if switched[0] is not None:
                        await ui.call("session.update", {"sessionId": sid, "mode": kind})
                    await agent.call("session.startTurn", {"sessionId": sid, "turnId": f"{kind}-t2"})
                    req = await agent.call("plans.submit", _submit(sid, ws, f"{kind}-t2", f"{kind}-c2", kind))
                    for who in (agent, plugin):
                        assert await code_of(who, "plans.respond", {"requestId": req["requestId"],
                                                                    "action": "approve"}) == "PERMISSION_DENIED"
                    pending = (await ui.call("plans.pending", {"sessionId": sid}))["pending"]
                    assert [(p["requestId"], p["status"]) for p in pending] == [(req["requestId"], "pending")]
                    ok = await ui.call("plans.respond", {"requestId": req["requestId"], "action": "approve"})
                    assert ok["approval"]["status"] == "approved"


async def test_item14_an_end_turn_killed_before_its_commit_leaves_no_notification_and_its_retry_is_stale(
        tmp_path: Path) -> None:
    """§11.14 "Completed and failed turns atomically create one durable notification ... aborted turns
    create none" with a SIGKILL inside the completing endTurn, before its commit: after the restart the
    turn is aborted (§11.3), its unlanded checkpoint is promoted as interrupted, there is no notification,
    and the sidecar's retry of the completion is stale (CONFLICT) and creates none; a second restart
    changes nothing."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        crashing = start_host_process(root, env={"RT_CRASHPOINT": "session.endTurn.before_commit:1"})
        answered: Any = None
        try:
            async with open_client(crashing.url, crashing.token, client_id="test", client_kind="agent") as c:
                sid = (await c.call("session.create", {}))["id"]
                end = {"sessionId": sid, "turnId": "t1", "status": "completed"}
                await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
                await say(c, sid, "u1", "question", turnId="t1")
                await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1", "message": msg(
                    "a1", "an unlanded reply", role="assistant", turnId="t1")})
                try:
                    answered = await c.call("session.endTurn", end)
                except (ClientClosed, OSError):
                    pass
            await trio.to_thread.run_sync(crashing.reap)
        finally:
            crashing.kill9()
        assert answered is None and crashing.proc.returncode == -9
        for _ in range(2):
            async with real_host(root, kind="agent", client_id="test") as (proc, c):
                turns = (await c.call("session.listTurns", {"sessionId": sid}))["turns"]
                assert [(t["id"], t["status"]) for t in turns] == [("t1", "aborted")]
                view = await _full(c, sid)
                assert [m["id"] for m in view["messages"]] == ["u1", "a1"]
                assert view["messages"][1]["meta"].get("interrupted") is True
                assert (await c.call("notifications.list", {}))["notifications"] == []
                assert await code_of(c, "session.endTurn", end) == "CONFLICT"
                assert (await c.call("notifications.list", {}))["notifications"] == []


async def test_steering_into_a_delivery_turn_must_target_that_deliverys_session(tmp_path: Path) -> None:
    """Steering paragraph 2: "Steering into a claimed collaboration delivery turn is extra human input: it
    must target that delivery's session". A steering row naming the delivery's turn but sent to another
    session (here the delivery's source) is refused and writes nothing there; the same row sent to the
    delivery's session lands, as steering, in that turn."""
    root = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(root, kind="agent") as (proc, c):
            src, dst, did = await _begun_delivery(c)
            steer = msg("s1", "also check the tests", meta={"steering": True})
            assert await code_of(c, "session.appendMessage", {"sessionId": src, "turnId": "t1",
                                                              "message": steer}) == "INVALID_PARAMS"
            assert await code_of(c, "session.appendMessage", {"sessionId": src,
                                                              "message": {**steer, "turnId": "t1"}}) \
                == "INVALID_PARAMS"
            assert (await _full(c, src))["messages"] == []
            assert not (root / "sessions" / f"{src}.jsonl").read_bytes().count(b"also check")
            landed = await c.call("session.appendMessage", {"sessionId": dst, "turnId": "t1", "message": steer})
            assert landed["message"]["turnId"] == "t1"
            rows = (await _full(c, dst))["messages"]
            assert [(m["id"], m.get("steering")) for m in rows] == [(f"collab-{did}", None), ("s1", True)]


async def test_steering_racing_finals_and_checkpoints_settle_once_and_survive_a_kill(tmp_path: Path) -> None:
    """Steering paragraph 2 under concurrency: for each of several streaming reservations a checkpoint and
    two different terminal finals race from two connections. Exactly one final wins (the other is
    IDEMPOTENCY_CONFLICT), the row keeps its position, and after a SIGKILL with the turn still running no
    stale checkpoint is promoted over a settled final."""
    root = data_dir(tmp_path)
    settled: dict[str, str] = {}
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            async with open_client(proc.url, proc.token, client_id="second", client_kind="agent") as c2:
                sid = (await c.call("session.create", {}))["id"]
                await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
                await say(c, sid, "u1", "ask", turnId="t1")
                for n in range(6):
                    mid = f"a{n}"
                    await say(c, sid, mid, "", role="assistant", turnId="t1", blocks=[],
                              meta={"status": "streaming"})
                    await say(c, sid, f"s{n}", f"steer {n}", meta={"steering": True})
                    outcomes: dict[str, Any] = {}

                    async def final(client: HostClient, label: str, mid: str = mid,
                                    outcomes: dict[str, Any] = outcomes) -> None:
                        outcomes[label] = await code_of(client, "session.appendMessage", {
                            "sessionId": sid, "message": msg(mid, f"final {label}", role="assistant",
                                                             turnId="t1", meta={"status": "completed"})})

                    async def checkpoint(mid: str = mid) -> None:
                        await code_of(c2, "session.saveInflightMessage", {
                            "sessionId": sid, "turnId": "t1", "message": msg(
                                mid, "stale checkpoint", role="assistant", turnId="t1",
                                meta={"status": "streaming"})})

                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(checkpoint)
                        nursery.start_soon(final, c, "one")
                        nursery.start_soon(final, c2, "two")
                    winners = [label for label, code in outcomes.items() if code is None]
                    assert len(winners) == 1 and list(outcomes.values()).count("IDEMPOTENCY_CONFLICT") == 1, \
                        outcomes
                    settled[mid] = f"final {winners[0]}"
                view = await _full(c, sid)
                expected = ["u1"] + [x for n in range(6) for x in (f"a{n}", f"s{n}")]
                assert [m["id"] for m in view["messages"]] == expected
                proc.kill9()
        async with real_host(root, kind="agent") as (proc, c):
            view = await _full(c, sid)
            assert [m["id"] for m in view["messages"]] == expected
            for m in view["messages"]:
                if m["id"] in settled:
                    assert m["blocks"] == [{"type": "text", "text": settled[m["id"]]}], m
            assert await _hits(c, "stale checkpoint") == []


async def test_item3_a_torn_tail_in_the_revisions_file_never_glues_onto_the_next_archive(tmp_path: Path) -> None:
    """§2.1 "Readers skip unknown type lines and a torn trailing line ... a crash mid-append cannot poison
    the file", for sessions/<id>.revisions.jsonl (append-only, §11.13): a torn revision line left by a
    kill is skipped, the next archive is a whole line of its own, and every variant still switches after
    two more restarts."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await say(c, sid, "u1", "pick")
            await say(c, sid, "a1", "first variant", role="assistant")
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            proc.kill9()
        revisions = root / "sessions" / f"{sid}.revisions.jsonl"
        with revisions.open("ab") as fh:
            fh.write(b'{"type":"revision","rootUserId":"u1","revisionIndex":7,"messages":[{"type":"mess')
        async with real_host(root, kind="agent") as (proc, c):
            listed = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
            assert [r["revisionIndex"] for r in listed] == [1]
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            await say(c, sid, "a2", "second variant", role="assistant")
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            proc.kill9()
        records = [json.loads(line) for line in revisions.read_bytes().splitlines()]  # every line whole
        assert [(r["type"], r["revisionIndex"]) for r in records][-1] == ("revision_live", 2)
        assert 7 not in [r["revisionIndex"] for r in records]
        for _ in range(2):
            async with real_host(root, kind="agent") as (proc, c):
                listed = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
                assert sorted(r["revisionIndex"] for r in listed) == [1, 2]
                await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 1})
                assert [m["blocks"][0]["text"] for m in (await _full(c, sid))["messages"]] == ["pick",
                                                                                             "first variant"]
                await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 2})
                assert [m["blocks"][0]["text"] for m in (await _full(c, sid))["messages"]] == ["pick",
                                                                                             "second variant"]


async def test_item4_a_steering_final_killed_before_its_index_commit_reads_back_in_place(tmp_path: Path) -> None:
    """§11.4 meets the steering replacement: the terminal final that replaces a streaming reservation is
    durable in the file, then SIGKILL before the index knows it. After the restart the reply reads back
    with the final's content in the reservation's position (before the steering row), exactly once, and a
    retry of the same final is a replay; the next rewrite makes search find it."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid = await _steered_reservation(c, "prov")
            proc.kill9()
        final = {"sessionId": sid, "message": msg("a1", "final lynx words", role="assistant", turnId="t1",
                                                  meta={"status": "completed"})}
        await _append_killed_before_index_commit(root, final)
        async with real_host(root, kind="agent") as (proc, c):
            view = await _full(c, sid)
            assert [m["id"] for m in view["messages"]] == ["u1", "a1", "s1"]
            assert view["messages"][1]["blocks"] == [{"type": "text", "text": "final lynx words"}]
            assert view["session"]["messageCount"] == 3
            again = await c.call("session.appendMessage", final)
            assert again["message"]["seq"] == view["messages"][1]["seq"]
            assert [m["id"] for m in (await _full(c, sid))["messages"]] == ["u1", "a1", "s1"]
            kept = (await _full(c, sid))["messages"]
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": kept})
            assert await _hits(c, "lynx") == [(sid, "a1")] and await _hits(c, "prov") == []


async def test_steering_strips_a_client_supplied_session_message_in_either_spelling(tmp_path: Path) -> None:
    """Steering paragraph 2: steering into a claimed delivery turn "does not inherit the delivery origin,
    and has any client-supplied session_message stripped" — the seed's own spelling (``session_message``)
    as well as the wire's (``sessionMessage``): neither reaches the transcript line nor a read, before or
    after the index is rebuilt; the delivery's own input row keeps its provenance."""
    root = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(root, kind="agent") as (proc, c):
            src, dst, did = await _begun_delivery(c)
            prov = (await _full(c, dst))["messages"][0]["sessionMessage"]
            for n, key in enumerate(("session_message", "sessionMessage")):
                await c.call("session.appendMessage", {"sessionId": dst, "turnId": "t1", "message": msg(
                    f"s{n}", f"steer {n}", meta={"steering": True, key: prov})})
            rows = (await _full(c, dst))["messages"]
            proc.kill9()
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (root / name).unlink(missing_ok=True)
        async with real_host(root, kind="agent") as (proc, c):
            rebuilt = (await _full(c, dst))["messages"]
    for view in (rows, rebuilt):
        assert [m["id"] for m in view] == [f"collab-{did}", "s0", "s1"]
        assert view[0]["sessionMessage"] == prov
        for steer in view[1:]:
            assert steer["meta"] == {"steering": True} and steer.get("sessionMessage") is None
    lines = (root / "sessions" / f"{dst}.jsonl").read_bytes().splitlines()
    assert sum(b"session_message" in line or b"sessionMessage" in line for line in lines) == 1


async def test_item13_a_referenced_branch_dropped_by_a_rewrite_is_stored_in_full_and_restorable_after_db_loss(
        tmp_path: Path) -> None:
    """§11.13 "a branch that leaves the transcript is stored in full first": the live branch is archived as a
    reference, grows by one more exchange, then a replaceMessages drops its root turn (smart Stop / message
    delete). The revisions file then holds that branch in full (the reference alone would be stranded);
    after a SIGKILL and the index's loss the variant is still listed, and once its root is back switching
    to it restores every message of it, the late exchange too."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(root, kind="agent") as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await say(c, sid, "u0", "intro")
            await say(c, sid, "a0", "hello", role="assistant")
            await say(c, sid, "u1", "pick")
            await say(c, sid, "a1", "tapir answer", role="assistant")
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            await say(c, sid, "u2", "and then")
            await say(c, sid, "a2", "late tapir", role="assistant")
            before = _stable((await _full(c, sid))["messages"])
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": before[:2]})
            proc.kill9()
        revisions = root / "sessions" / f"{sid}.revisions.jsonl"
        stored = [json.loads(line) for line in revisions.read_bytes().splitlines()]
        full = [r for r in stored if r["type"] == "revision" and r["rootUserId"] == "u1"]
        assert full and [m["id"] for m in full[-1]["messages"]] == ["u1", "a1", "u2", "a2"]
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (root / name).unlink(missing_ok=True)
        async with real_host(root, kind="agent") as (proc, c):
            assert [m["id"] for m in (await _full(c, sid))["messages"]] == ["u0", "a0"]
            listed = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
            assert [(r["rootUserId"], r["revisionIndex"]) for r in listed] == [("u1", 1)]
            # the pager hangs off a live root: put the root back (an undo), then restore the branch
            bare_root = {k: v for k, v in before[2].items() if k != "meta"}  # its pager stamp went with it
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": [*before[:2], bare_root]})
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 1})
            back = (await _full(c, sid))["messages"]
            assert [m["id"] for m in back] == ["u0", "a0", "u1", "a1", "u2", "a2"]
            assert [m["blocks"] for m in back[2:]] == [m["blocks"] for m in before[2:]]
            assert sorted(await _hits(c, "tapir")) == [(sid, "a1"), (sid, "a2")]
