"""truncateFrom, replaceMessages and appendCompaction through the real gateway (seed 003 §2.1, §5)."""

from __future__ import annotations

import pytest
import trio

from runtime.client import RpcError
from store.jsonio import loads_line
from tests.hostkit import client_for, index_caught_up, inprocess_host, msg
from tests.revisions.helpers import (
    assert_index_matches_file,
    full,
    ids,
    query,
    revision_kinds,
    transcript_path,
    turn,
)


def cp(cid: str, through: str, **extra: object) -> dict:
    return {"id": cid, "summary": f"summary {cid}", "throughMessageId": through, "tokensBefore": 100, **extra}


async def test_truncate_unknown_message_cuts_nothing(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            before = transcript_path(tmp_path, sid).read_bytes()
            with pytest.raises(RpcError) as err:
                await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "zz", "mode": "regenerate"})
            assert err.value.data_code == "MESSAGE_NOT_FOUND"
            assert transcript_path(tmp_path, sid).read_bytes() == before


async def test_truncate_aborts_running_turn_and_drops_inflight(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            started = await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            assert started["status"] == "running"
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1", "message": msg("u2", "again")})
            inflight = tmp_path / "sessions" / f"{sid}.inflight.json"
            inflight.write_bytes(b'{"schema":1,"message":{"id":"x"}}')
            r = await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u2"})
            assert r["removed"] == 1 and r["session"]["messageCount"] == 2
            await index_caught_up(host)
            assert query(tmp_path, "SELECT status FROM turns WHERE id = 't1'") == [("aborted",)]
            assert not inflight.exists()
            assert ids(await full(c, sid)) == ["u1", "a1"]
            await index_caught_up(host)
            assert_index_matches_file(tmp_path, sid)
            # the next append after a rewrite continues the sequence
            a = await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u3", "next")})
            assert a["message"]["seq"] == 3
            await index_caught_up(host)
            assert_index_matches_file(tmp_path, sid)


async def test_rewrite_keeps_owning_turns(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1", "message": msg("u1", "q")})
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                   "message": msg("a1", "a", role="assistant")})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u2", "q2")})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u2"})
            await index_caught_up(host)
            rows = query(tmp_path, "SELECT id, turn_id FROM messages WHERE session_id = ? ORDER BY seq", sid)
            assert rows == [("u1", "t1"), ("a1", "t1")]


async def test_compaction_append_chain_and_rewrite_validity(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            await turn(c, sid, "u2", "a2")
            with pytest.raises(RpcError) as err:
                await c.call("session.appendCompaction", {"sessionId": sid, "compaction": cp("c0", "nope")})
            assert err.value.data_code == "MESSAGE_NOT_FOUND"
            before = transcript_path(tmp_path, sid).read_bytes()
            r = await c.call("session.appendCompaction", {"sessionId": sid, "compaction": cp(
                "c1", "a1", firstKeptMessageId="u1", retainedTail=[msg("u1", "q"), msg("x", "y", role="assistant")])})
            # appended after its boundary, messages untouched; a legacy tail → its latest user message
            after = transcript_path(tmp_path, sid).read_bytes()
            assert after.startswith(before)
            assert [m["id"] for m in r["compaction"]["retainedTail"]] == ["u1"]
            assert r["compaction"]["details"]["retainedTailMode"] == "active_turn"
            await c.call("session.appendCompaction", {"sessionId": sid, "compaction": cp(
                "c2", "a2", details={"retainedTailMode": "completed_turn", "generation": 7, "family": "f"})})
            got = await full(c, sid)
            assert [x["id"] for x in got["compactions"]] == ["c1", "c2"]  # oldest first
            assert got["compactions"][1]["details"]["generation"] == 7
            assert ids(got) == ["u1", "a1", "u2", "a2"]
            # a retry with the same content is a no-op; different content conflicts
            again = await c.call("session.appendCompaction", {"sessionId": sid, "compaction": cp(
                "c2", "a2", details={"retainedTailMode": "completed_turn", "generation": 7, "family": "f"})})
            assert again["compaction"]["id"] == "c2"
            with pytest.raises(RpcError) as err:
                await c.call("session.appendCompaction", {"sessionId": sid, "compaction": cp("c2", "a1")})
            assert err.value.data_code == "CONFLICT"
            # a rewrite keeps every checkpoint still valid and drops the one whose anchor vanished
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u2"})
            got = await full(c, sid)
            assert [x["id"] for x in got["compactions"]] == ["c1"]
            body = transcript_path(tmp_path, sid).read_text()
            assert '"id":"c2"' not in body and body.count('"type":"compaction"') == 1
            await index_caught_up(host)
            assert_index_matches_file(tmp_path, sid)
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            got = await full(c, sid)
            assert [x["id"] for x in got["compactions"]] == ["c1"]


async def test_compaction_rules_rejected(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            bad = [
                cp("c1", "a1", retainedTail=[msg("u1", "q")], details={"retainedTailMode": "completed_turn"}),
                cp("c1", "a1", retainedTail=[msg("a", "q", role="assistant")],
                   details={"retainedTailMode": "active_turn"}),
                cp("c1", "a1", details={"retainedTailMode": "sometimes"}),
                cp("c1", "a1", details={"fallback": "llm"}),
            ]
            for comp in bad:
                with pytest.raises(RpcError) as err:
                    await c.call("session.appendCompaction", {"sessionId": sid, "compaction": comp})
                assert err.value.data_code == "INVALID_PARAMS", comp
            assert '"compaction"' not in transcript_path(tmp_path, sid).read_text()


async def test_replace_messages_archives_dropped_live_branch(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "keep me"}))["id"]
            await turn(c, sid, "u1", "a1")
            await turn(c, sid, "u2", "a2", "needle")
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u2"})
            await c.call("session.appendCompaction", {"sessionId": sid, "compaction": cp("c1", "a1")})
            r = await c.call("session.replaceMessages", {"sessionId": sid, "messages": [
                msg("u1", "q u1 edited"), msg("a1", "a a1", role="assistant")]})
            assert r["session"]["messageCount"] == 2 and r["session"]["title"] == "keep me"
            # the root turn with a live reference was deleted: its branch is stored in full first
            assert revision_kinds(tmp_path, sid) == {("u2", 1): False}
            got = await full(c, sid)
            assert ids(got) == ["u1", "a1"] and got["messages"][0]["blocks"][0]["text"] == "q u1 edited"
            assert [x["id"] for x in got["compactions"]] == ["c1"]
            revs = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
            assert [(x["rootUserId"], x["isActive"]) for x in revs] == [("u2", False)]
            await index_caught_up(host)
            assert_index_matches_file(tmp_path, sid)
            with pytest.raises(RpcError) as err:
                await c.call("session.replaceMessages", {"sessionId": sid, "messages": [{"id": "x", "role": "bot",
                                                                                          "blocks": []}]})
            assert err.value.data_code == "INVALID_PARAMS"
            assert ids(await full(c, sid)) == ["u1", "a1"]
    # metadata survives a rebuild from the rewritten file (session_info carried forward)
    (tmp_path / "pi.sqlite").unlink()
    for extra in ("pi.sqlite-wal", "pi.sqlite-shm"):
        (tmp_path / extra).unlink(missing_ok=True)
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            got = await full(c, sid)
            assert got["session"]["title"] == "keep me" and ids(got) == ["u1", "a1"]


async def test_receipts_make_rewrites_idempotent(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            await turn(c, sid, "u2", "a2")
            p = {"sessionId": sid, "messageId": "u2", "submissionId": "s1"}
            first = await c.call("session.truncateFrom", p)
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u3", "later")})
            again = await c.call("session.truncateFrom", p)
            assert again == first
            assert ids(await full(c, sid)) == ["u1", "a1", "u3"]
            with pytest.raises(RpcError) as err:
                await c.call("session.truncateFrom", {**p, "messageId": "u1"})
            assert err.value.data_code == "IDEMPOTENCY_CONFLICT"


async def test_results_match_the_wire_models(tmp_path):
    from protocol.methods import METHODS

    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            calls = [
                ("session.appendCompaction", {"sessionId": sid, "compaction": cp("c1", "a1")}),
                ("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"}),
                ("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"}),
                ("session.appendMessage", {"sessionId": sid, "message": msg("a1b", "b", role="assistant")}),
                ("session.listRevisions", {"sessionId": sid}),
                ("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 1}),
                ("session.replaceMessages", {"sessionId": sid, "messages": [msg("u1", "q")]}),
            ]
            for method, params in calls:
                result = await c.call(method, params)
                if method.startswith("session.appendMessage"):
                    continue  # not this feature's method
                METHODS[method].result_model.model_validate(result)


async def test_legacy_compaction_line_is_normalized_on_read(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
    legacy = (b'{"type":"compaction","id":"old","summary":"s","throughMessageId":"a1","tokensBefore":1,'
              b'"retainedTail":[{"id":"u1","role":"user","blocks":[]},{"id":"a1","role":"assistant","blocks":[]}]}\n')
    async with await trio.open_file(transcript_path(tmp_path, sid), "ab") as fh:
        await fh.write(legacy)
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            got = await full(c, sid)
            (comp,) = got["compactions"]
            assert [m["id"] for m in comp["retainedTail"]] == ["u1"]
            assert comp["details"]["retainedTailMode"] == "active_turn"


async def test_failure_between_rewrite_and_reindex_heals_on_next_request(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            await turn(c, sid, "u2", "a2")
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u2"})
            host.faults.add("rewrite.before_reindex", nth=1, action="raise")
            with pytest.raises(RpcError):
                await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a2", "mode": "regenerate"})
            got = await full(c, sid)
            assert ids(got) == ["u1", "a1", "u2"]
            await index_caught_up(host)
            assert_index_matches_file(tmp_path, sid)
            revs = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
            assert [(x["revisionIndex"], x["isActive"]) for x in revs] == [(1, False)]
            a = await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a2b", "x", role="assistant")})
            assert a["message"]["seq"] == 4
            r = await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u2"})
            assert r["revision"]["revisionIndex"] == 2


async def test_a_rewrite_keeps_the_lines_it_cannot_carry_beside_the_transcript(tmp_path):
    """A line readers skip (damaged bytes, or a kind this version does not know: a newer version's) was
    dropped by the next full rewrite, its bytes gone. The rewrite copies such lines into
    <sid>.jsonl.dropped-<ms> first (durable), and `pi-host doctor` lists that file."""
    from runtime.datadir import DataDir
    from store.doctor.doctor_report import DoctorReport
    from store.doctor.doctor_sessions import check_surroundings

    future = b'{"type":"future_kind","id":"f1","payload":{"x":1}}\n'
    damaged = b'{"type":"message","id":"bad",\n'
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            for mid in ("u1", "a1", "u2"):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(mid, mid)})
            path = tmp_path / "sessions" / f"{sid}.jsonl"
            ext = b'{"type":"message","id":"ext","role":"user","blocks":[{"type":"text","text":"ext"}]}\n'
            with path.open("ab") as f:  # another program (or a newer version) wrote these
                f.write(future + damaged + ext)
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u3", "u3")})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u2"})
            assert future not in path.read_bytes() and damaged not in path.read_bytes()
            [aside] = list((tmp_path / "sessions").glob(f"{sid}.jsonl.dropped-*"))
            assert aside.read_bytes() == future + damaged
            page = await c.call("session.get", {"sessionId": sid, "full": True})
            assert [m["id"] for m in page["messages"]] == ["u1", "a1"]
            await index_caught_up(host)
    report = DoctorReport(str(tmp_path), repair=False)
    check_surroundings(None, DataDir(tmp_path), report, repair=False, now_ms=0)
    assert any(f.check == "quarantine.dropped_lines" for f in report.findings)


async def test_a_rewrite_carries_a_newer_versions_lines_after_the_message_they_followed(tmp_path):
    """Seed 003 §9: a new transcript line kind needs no migration (readers skip it). A rewrite by this
    version writes such a line again, byte for byte, after the message it followed while that message
    survives (in place through a truncate, with its message through a reorder and a branch switch), so
    a newer version finds its lines after a round trip through this one; only the lines of messages the
    rewrite removes go beside the transcript."""
    head = b'{"type":"future_head","id":"h1","big":123456789012345678901234567890}\n'
    after_a1 = b'{"type":"future_kind","id":"f1","payload":{"x":1.0,"y":"\\u00e9"}}\n'
    after_a2 = b'{"type":"future_kind","id":"f2"}\n'
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            path = tmp_path / "sessions" / f"{sid}.jsonl"
            with path.open("ab") as f:
                f.write(head)
            await turn(c, sid, "u1", "a1")
            with path.open("ab") as f:
                f.write(after_a1)
            await turn(c, sid, "u2", "a2")
            with path.open("ab") as f:
                f.write(after_a2)
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u3", "u3")})

            def kinds() -> list[str]:
                recs = [loads_line(x) for x in path.read_bytes().splitlines(keepends=True)[1:]]
                return [str(r["id"]) for r in recs if r["type"] != "session_info"]

            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u3"})
            data = path.read_bytes()
            assert head in data and after_a1 in data and after_a2 in data  # byte for byte
            assert kinds() == ["h1", "u1", "a1", "f1", "u2", "a2", "f2"]
            assert not list((tmp_path / "sessions").glob(f"{sid}.jsonl.dropped-*"))
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a2", "mode": "regenerate"})
            assert kinds() == ["h1", "u1", "a1", "f1", "u2"]  # f2 left with its message, kept aside
            [aside] = list((tmp_path / "sessions").glob(f"{sid}.jsonl.dropped-*"))
            assert aside.read_bytes() == after_a2
            read = (await c.call("session.get", {"sessionId": sid, "full": True}))["messages"]
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": [read[2], read[0], read[1]]})
            assert kinds() == ["h1", "u2", "u1", "a1", "f1"]
            await index_caught_up(host)
            assert_index_matches_file(tmp_path, sid)
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            got = await c.call("session.get", {"sessionId": sid, "full": True})
            assert [m["id"] for m in got["messages"]] == ["u2", "u1", "a1"]
            await index_caught_up(host)
            assert_index_matches_file(tmp_path, sid)


async def test_replace_keeping_a_saved_root_without_its_stamp_archives_the_reference(tmp_path):
    """A replaceMessages that keeps a saved root but sends it without its pager meta takes the branch out
    of the live variant its ``revision_live`` reference names: the branch is archived in full first, so
    the reference is never stranded (activating it later restores it, never CORRUPT_DATA)."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await turn(c, sid, "u1", "a1")
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": [
                msg("u1", "q u1 "), msg("a2", "another reply", role="assistant")]})
            assert revision_kinds(tmp_path, sid) == {("u1", 1): False}
            r = await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 1})
            assert {(x["revisionIndex"], x["isActive"]) for x in r["revisions"]} == {(1, True), (2, False)}
            assert ids(await full(c, sid)) == ["u1", "a1"]
            await index_caught_up(host)
            assert_index_matches_file(tmp_path, sid)
