"""Seed 003 §2.1's compaction-checkpoint read rules, read by an outsider and probed where the existing tests
hold them loosely: a checkpoint whose ``throughMessageId`` anchor is gone is dropped *per record*, on
``session.get`` (whole and windowed), ``session.context`` and ``session.fork``, the others kept oldest first,
across a restart too; a record an older layout wrote (no ``details.retainedTailMode``) is read back with its
latest user message only; ``details`` (generation, family and whatever else the compactor keeps) is opaque
and comes back as it was sent. Black-box against real ``pi-host serve`` processes.

What other modules already hold is not repeated: the append rules and their refusals, truncate dropping the
newest checkpoint (tests/revisions/test_rewrites_host.py), the message-scoped fork boundary
(tests/history/test_fork_host.py), the active checkpoint of ``session.context`` after a truncate
(tests/history/test_views_host.py)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import trio

from runtime.client import HostClient
from tests.acceptance.outsiderkit import code_of, data_dir, real_host, say
from tests.hostkit import REPO, msg

UPGRADES = REPO / "tests" / "fixtures" / "upgrades"


async def _full(c: HostClient, sid: str) -> dict[str, Any]:
    result: dict[str, Any] = await c.call("session.get", {"sessionId": sid, "full": True})
    return result


async def _checkpoints(c: HostClient, sid: str) -> list[str]:
    return [x["id"] for x in (await _full(c, sid))["compactions"]]


async def _summaries(c: HostClient, sid: str) -> list[str]:
    return [x["summary"] for x in (await _full(c, sid))["compactions"]]


async def _exchange(c: HostClient, sid: str, n: int) -> None:
    await say(c, sid, f"u{n}", f"question {n}")
    await say(c, sid, f"a{n}", f"answer {n}", role="assistant")


async def _checkpoint(c: HostClient, sid: str, cid: str, through: str, **extra: Any) -> dict[str, Any]:
    body = {"id": cid, "summary": f"summary {cid}", "throughMessageId": through, "tokensBefore": 10,
            "details": {"retainedTailMode": "completed_turn"}, **extra}
    result = await c.call("session.appendCompaction", {"sessionId": sid, "compaction": body})
    compaction: dict[str, Any] = result["compaction"]
    return compaction


async def _two_exchanges_checkpointed(c: HostClient) -> str:
    """A new session of u1 a1 (checkpoint c1 through a1), u2 a2 (c2 through a2); its id."""
    sid: str = (await c.call("session.create", {}))["id"]
    for n in (1, 2):
        await _exchange(c, sid, n)
        await _checkpoint(c, sid, f"c{n}", f"a{n}")
    return sid


def _anchored(view: dict[str, Any]) -> None:
    """Every checkpoint a read serves names a message the read serves."""
    ids = {m["id"] for m in view["messages"]}
    for cp in view["compactions"]:
        assert cp["throughMessageId"] in ids, cp


FIRST_EXCHANGE = ({"id": "u1", "role": "user", "blocks": [{"type": "text", "text": "question 1"}]},
                  {"id": "a1", "role": "assistant", "blocks": [{"type": "text", "text": "answer 1"}]})
"""The first of :func:`_two_exchanges`' messages, as a stored checkpoint's retained tail holds them."""


async def _two_exchanges(root: Path) -> str:
    """A new session holding two question/answer exchanges (``u1``/``a1``, ``u2``/``a2``), the host stopped."""
    async with real_host(root) as (_, c):
        sid: str = (await c.call("session.create", {}))["id"]
        await _exchange(c, sid, 1)
        await _exchange(c, sid, 2)
    return sid


async def test_a_rewrite_that_removes_a_middle_anchor_drops_that_checkpoint_only(tmp_path: Path) -> None:
    """c1 (a1), c2 (a2), c3 (a3); a rewrite leaves a2 out. Every read drops c2 and only c2: session.get
    whole and windowed keep c1, c3 oldest first, session.context applies c3, a whole fork copies c1 and c3,
    and all of it after a restart; the messages come back as they were stored."""
    root = data_dir(tmp_path)
    async with real_host(root) as (_, c):
        sid = (await c.call("session.create", {}))["id"]
        for n in (1, 2, 3):
            await _exchange(c, sid, n)
            await _checkpoint(c, sid, f"c{n}", f"a{n}")
        await say(c, sid, "u4", "question 4")
        assert await _checkpoints(c, sid) == ["c1", "c2", "c3"]
        kept = [m for m in (await _full(c, sid))["messages"] if m["id"] != "a2"]
        await c.call("session.replaceMessages", {"sessionId": sid, "messages": kept})
        before = await _full(c, sid)
        assert [m["id"] for m in before["messages"]] == ["u1", "a1", "u2", "u3", "a3", "u4"]
        assert [x["id"] for x in before["compactions"]] == ["c1", "c3"]
        window = await c.call("session.get", {"sessionId": sid, "messageLimit": 1})
        assert [x["id"] for x in window["compactions"]] == ["c1", "c3"]
        ctx = await c.call("session.context", {"sessionId": sid})
        assert ctx["compaction"]["id"] == "c3"
        assert [m["id"] for m in ctx["messages"]] == ["c3", "u4"]
        child = (await c.call("session.fork", {"sessionId": sid}))["id"]
        assert await _summaries(c, child) == ["summary c1", "summary c3"]
        _anchored(await _full(c, child))
    async with real_host(root) as (_, c):
        after = await _full(c, sid)
        assert after["messages"] == before["messages"]
        assert after["compactions"] == before["compactions"]
        assert await c.call("session.context", {"sessionId": sid}) == ctx  # reproduced after a restart
        assert await _summaries(c, child) == ["summary c1", "summary c3"]


async def test_records_without_their_anchor_in_the_file_are_dropped_per_record(tmp_path: Path) -> None:
    """Checkpoint lines whose anchor the transcript does not hold (written by another program, or left
    by a build that did not drop them) sit before, between and after valid ones. Each read drops exactly
    those: session.get keeps the valid ones oldest first, session.context applies the newest *valid*
    one, a fork (whole and message-scoped) copies none of the stale ones, and a later rewrite keeps
    serving only the valid ones."""
    root = data_dir(tmp_path)
    async with real_host(root) as (_, c):
        sid = (await c.call("session.create", {}))["id"]
        await _exchange(c, sid, 1)
        await _exchange(c, sid, 2)
    path = root / "sessions" / f"{sid}.jsonl"

    def line(cid: str, through: str) -> bytes:
        rec = {"type": "compaction", "id": cid, "summary": f"summary {cid}", "throughMessageId": through,
               "tokensBefore": 1, "retainedTail": [], "createdAt": "2026-12-01T00:00:00.000Z",
               "details": {"retainedTailMode": "completed_turn"}}
        return json.dumps(rec, separators=(",", ":")).encode() + b"\n"

    with path.open("ab") as f:
        f.write(line("g0", "ghost-0") + line("c1", "a1") + line("g1", "ghost-1") + line("c2", "a2")
                + line("g2", "ghost-2"))
    async with real_host(root) as (_, c):
        assert await _checkpoints(c, sid) == ["c1", "c2"]
        window = await c.call("session.get", {"sessionId": sid, "messageLimit": 1})
        assert [x["id"] for x in window["compactions"]] == ["c1", "c2"]
        ctx = await c.call("session.context", {"sessionId": sid})
        assert ctx["compaction"]["id"] == "c2" and [m["id"] for m in ctx["messages"]] == ["c2"]
        whole = (await c.call("session.fork", {"sessionId": sid}))["id"]
        assert await _summaries(c, whole) == ["summary c1", "summary c2"]
        part = (await c.call("session.fork", {"sessionId": sid, "throughMessageId": "u2"}))["id"]
        assert await _summaries(c, part) == ["summary c1"]
        for child in (whole, part):
            assert b"ghost" not in (root / "sessions" / f"{child}.jsonl").read_bytes()
        await say(c, sid, "u3", "question 3")
        await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u3"})
        assert await _checkpoints(c, sid) == ["c1", "c2"]
    async with real_host(root) as (_, c):
        assert await _checkpoints(c, sid) == ["c1", "c2"]
        assert (await c.call("session.context", {"sessionId": sid}))["compaction"]["id"] == "c2"


async def test_regenerate_and_switching_back_serve_only_anchored_checkpoints(tmp_path: Path) -> None:
    """A regenerate cuts a2 (and what came after it) out of the transcript: c2 (a2) and c3 (u3) go, c1
    stays and is the active one. A new reply and a switch back to the archived branch never serve a
    checkpoint whose anchor the live transcript lacks; the switch back restores c2 and c3 with their
    anchors, oldest first; c1 stays through all of it and a restart."""
    root = data_dir(tmp_path)
    async with real_host(root) as (_, c):
        sid = await _two_exchanges_checkpointed(c)
        await say(c, sid, "u3", "question 3")
        await _checkpoint(c, sid, "c3", "u3")
        await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u2"})
        await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a2", "mode": "regenerate"})
        view = await _full(c, sid)
        assert [m["id"] for m in view["messages"]] == ["u1", "a1", "u2"]
        assert [x["id"] for x in view["compactions"]] == ["c1"]
        assert (await c.call("session.context", {"sessionId": sid}))["compaction"]["id"] == "c1"
        await say(c, sid, "a2b", "answer 2, again", role="assistant")
        await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u2"})
        _anchored(await _full(c, sid))
        revisions = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
        first = min(r["revisionIndex"] for r in revisions if r["rootUserId"] == "u2")
        await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u2", "revisionIndex": first})
        back = await _full(c, sid)
        assert "a2" in [m["id"] for m in back["messages"]]
        _anchored(back)
        # the branch brings back the checkpoints anchored in it (docs/DESIGN.md: a revision line carries
        # them), in their order
        assert [x["id"] for x in back["compactions"]] == ["c1", "c2", "c3"]
        assert (await c.call("session.context", {"sessionId": sid}))["compaction"]["id"] == "c3"
    async with real_host(root) as (_, c):
        again = await _full(c, sid)
        assert again["compactions"] == back["compactions"]
        _anchored(again)


async def test_a_tombstoned_anchor_still_exists_so_its_checkpoint_stays(tmp_path: Path) -> None:
    """session.deleteMessage is a reversible tombstone: the message is still in the transcript (session.get
    serves it flagged ``deleted``), so its anchor still exists and the checkpoint stays valid on every read,
    on a fork and after a restart (protocol/README.md: the reads keep every message as stored; the export
    documents the same reading)."""
    root = data_dir(tmp_path)
    async with real_host(root) as (_, c):
        sid = await _two_exchanges_checkpointed(c)
        await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "a2"})
        view = await _full(c, sid)
        assert [(m["id"], bool(m.get("deleted"))) for m in view["messages"]][-1] == ("a2", True)
        assert [x["id"] for x in view["compactions"]] == ["c1", "c2"]
        assert (await c.call("session.context", {"sessionId": sid}))["compaction"]["id"] == "c2"
        child = (await c.call("session.fork", {"sessionId": sid}))["id"]
        assert await _summaries(c, child) == ["summary c1", "summary c2"]
    async with real_host(root) as (_, c):
        assert await _checkpoints(c, sid) == ["c1", "c2"]
        await say(c, sid, "u3", "question 3")
        await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u3"})  # a rewrite keeps it
        assert await _checkpoints(c, sid) == ["c1", "c2"]
        await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "a2"})
        assert await _checkpoints(c, sid) == ["c1", "c2"]


OPAQUE: dict[str, Any] = {
    "retainedTailMode": "completed_turn",
    "generation": 2**63 - 1,
    "family": "fam-\u00e9\u6f22\u5b57-\U0001f9ed",
    "zz": {"nested": [1, 2.5, -0.0, 1e300, None, True, {"": "", "a1": "a1", "esc": "tab\there \"q\" \\ \u2028"}],
           "empty": {}, "list": []},
    "aa": "\u0000 control and \ud7ff edge",
    "unknownFutureKey": {"z": 1, "a": 2, "m": [{"y": None}]},
}


async def test_details_round_trip_as_sent(tmp_path: Path) -> None:
    """details is opaque to the host beyond the keys it owns: unknown keys, nesting, key order, unicode
    (astral, escapes, U+2028, NUL), the largest signed 64-bit integer (the wire bound) and odd floats
    come back exactly as sent: from the append, from session.get before and after a restart and a
    rewrite, and in a fork, where the value that happens to equal a message id ("a1") is not remapped."""
    root = data_dir(tmp_path)
    async with real_host(root) as (_, c):
        sid = (await c.call("session.create", {}))["id"]
        await _exchange(c, sid, 1)
        appended = await _checkpoint(c, sid, "c1", "a1", details=OPAQUE)

        def same(got: dict[str, Any]) -> None:
            assert got == OPAQUE
            assert json.dumps(got) == json.dumps(OPAQUE)  # key order too, at every level

        same(appended["details"])
        same((await _full(c, sid))["compactions"][0]["details"])
        child = (await c.call("session.fork", {"sessionId": sid}))["id"]
        same((await _full(c, child))["compactions"][0]["details"])
        ctx = await c.call("session.context", {"sessionId": sid})
        same(ctx["compaction"]["details"])
    async with real_host(root) as (_, c):
        same((await _full(c, sid))["compactions"][0]["details"])
        await _exchange(c, sid, 2)
        await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u2"})
        same((await _full(c, sid))["compactions"][0]["details"])
        same((await _full(c, child))["compactions"][0]["details"])


async def test_fallback_checkpoint_round_trips_and_its_summary_stays_short(tmp_path: Path) -> None:
    """details.fallback = "retained_tail" with a short recovery summary and the latest user message is
    stored and read back (context too: the summary, then the tail); a long summary on a fallback
    checkpoint is refused and writes nothing."""
    root = data_dir(tmp_path)
    async with real_host(root) as (_, c):
        sid = (await c.call("session.create", {}))["id"]
        await _exchange(c, sid, 1)
        await say(c, sid, "u2", "question 2")
        before = (root / "sessions" / f"{sid}.jsonl").read_bytes()
        code = await code_of(c, "session.appendCompaction", {"sessionId": sid, "compaction": {
            "id": "cbad", "summary": "x" * 20_000, "throughMessageId": "a1", "tokensBefore": 1,
            "retainedTail": [msg("u2", "question 2")],
            "details": {"retainedTailMode": "active_turn", "fallback": "retained_tail"}}})
        assert code == "INVALID_PARAMS"
        assert (root / "sessions" / f"{sid}.jsonl").read_bytes() == before
        details = {"retainedTailMode": "active_turn", "fallback": "retained_tail", "generation": 3,
                   "family": "auto"}
        await c.call("session.appendCompaction", {"sessionId": sid, "compaction": {
            "id": "cf", "summary": "recovered: context was too large", "throughMessageId": "a1",
            "tokensBefore": 900_000, "retainedTail": [msg("u2", "question 2")], "details": details}})
    async with real_host(root) as (_, c):
        (cp,) = (await _full(c, sid))["compactions"]
        assert cp["details"] == details
        assert [m["id"] for m in cp["retainedTail"]] == ["u2"]
        ctx = await c.call("session.context", {"sessionId": sid})
        assert ctx["compaction"]["id"] == "cf"
        assert [m["id"] for m in ctx["messages"]][0] == "cf"
        assert "u2" in [m["id"] for m in ctx["messages"]]


def _older_build(tmp_path: Path) -> Path:
    """The data directory the newest recorded earlier build left (tests/fixtures/upgrades)."""
    tarball = sorted(UPGRADES.glob("*.tar.gz"))[-1]
    with tarfile.open(tarball) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "data"


async def test_a_legacy_record_in_an_older_builds_directory_reads_as_its_latest_user_message(
        tmp_path: Path) -> None:
    """An older build's data directory (a recorded fixture) with, beside its own checkpoint, one in the
    layout of seed 003 §2.1's example line: no details, a retainedTail of several messages. Booted on
    by this build it reads back with its latest user message only and retainedTailMode active_turn, on
    session.get (before and after a restart), in a fork and after a regenerate and a switch back carried
    it through the revisions file; its other keys and the older build's own checkpoint are untouched,
    oldest first; its message lines stay complete. A second legacy record whose tail holds no user
    message reads empty, a completed turn, keeping its other details (and is the active one)."""
    with trio.fail_after(10):
        root = await trio.to_thread.run_sync(_older_build, tmp_path)
    path = root / "sessions" / "up_gamma.jsonl"
    tail = [
        {"id": "gamma-u2", "role": "user", "blocks": [{"type": "text", "text": "gamma question 2"}]},
        {"id": "gamma-a2", "role": "assistant", "blocks": [{"type": "text", "text": "gamma answer 2"}]},
        {"id": "gamma-u3", "role": "user", "blocks": [{"type": "text", "text": "gamma question 3"}]},
        {"id": "gamma-a3", "role": "assistant", "blocks": [{"type": "text", "text": "gamma answer 3"}]},
    ]
    legacy = {"type": "compaction", "id": "gamma-legacy", "summary": "legacy summary",
              "firstKeptMessageId": "gamma-u2", "throughMessageId": "gamma-a3", "tokensBefore": 917000,
              "retainedTail": tail, "providerId": "p-legacy", "modelId": "m-legacy",
              "createdAt": "2026-12-04T16:51:21.000Z"}
    no_user = {"type": "compaction", "id": "gamma-legacy-2", "summary": "no user in its tail",
               "throughMessageId": "gamma-a3", "tokensBefore": 1, "retainedTail": [tail[3]],
               "details": {"generation": 2, "family": "f\u00e9"}}
    with path.open("ab") as f:
        for rec in (legacy, no_user):
            f.write(json.dumps(rec, separators=(",", ":")).encode() + b"\n")

    def normalized(cp: dict[str, Any]) -> None:
        assert [m["id"] for m in cp["retainedTail"]] == ["gamma-u3"]
        assert cp["retainedTail"][0]["blocks"] == tail[2]["blocks"]
        assert cp["details"]["retainedTailMode"] == "active_turn"
        assert (cp["summary"], cp["tokensBefore"], cp["providerId"], cp["modelId"]) == (
            "legacy summary", 917000, "p-legacy", "m-legacy")

    async with real_host(root) as (_, c):
        view = await _full(c, "up_gamma")
        assert [x["id"] for x in view["compactions"]] == ["gamma-c1", "gamma-legacy", "gamma-legacy-2"]
        normalized(view["compactions"][1])
        # a legacy tail with no user message reads empty, a completed turn; its other details stay
        assert view["compactions"][2]["retainedTail"] == []
        assert view["compactions"][2]["details"] == {"generation": 2, "family": "f\u00e9",
                                                      "retainedTailMode": "completed_turn"}
        assert [m["id"] for m in view["messages"]][-2:] == ["gamma-u3", "gamma-a3"]
        ctx = await c.call("session.context", {"sessionId": "up_gamma"})
        assert ctx["compaction"]["id"] == "gamma-legacy-2"
        assert [m["id"] for m in ctx["messages"]] == ["gamma-legacy-2"]
        await c.call("session.truncateFrom", {"sessionId": "up_gamma", "messageId": "gamma-a3",
                                              "mode": "regenerate"})  # drops the two legacy records
        assert await _checkpoints(c, "up_gamma") == ["gamma-c1"]
        await c.call("session.activateRevision", {"sessionId": "up_gamma", "rootUserId": "gamma-u3",
                                                  "revisionIndex": 1})
        view = await _full(c, "up_gamma")
        assert [x["id"] for x in view["compactions"]] == ["gamma-c1", "gamma-legacy", "gamma-legacy-2"]
        normalized(view["compactions"][1])
        child = (await c.call("session.fork", {"sessionId": "up_gamma"}))["id"]
        got = (await _full(c, child))["compactions"]
        assert [x["summary"] for x in got] == ["gamma summary so far", "legacy summary", "no user in its tail"]
        assert len(got[1]["retainedTail"]) == 1 and got[1]["details"]["retainedTailMode"] == "active_turn"
        assert got[1]["retainedTail"][0]["blocks"] == tail[2]["blocks"]
    async with real_host(root) as (_, c):
        view = await _full(c, "up_gamma")
        assert [x["id"] for x in view["compactions"]] == ["gamma-c1", "gamma-legacy", "gamma-legacy-2"]
        normalized(view["compactions"][1])
        assert view["compactions"][2]["retainedTail"] == []


async def test_a_record_without_an_anchor_is_served_by_no_read(tmp_path: Path) -> None:
    """A checkpoint line with no ``throughMessageId`` (or a null one, or a number) has no anchor that
    exists, so it is dropped like a record whose anchor is gone. session.context, a fork and a rewrite
    dropped it, while session.get (whole and windowed, from the index or the file) still served it: the
    reads disagreed on which checkpoints exist, and after a rewrite the one session.get had shown was gone
    from the file. A number ``5`` matched a message whose id is ``"5"`` in the index (SQLite stored it in
    a TEXT column as text) where every other read rejects it."""
    root = data_dir(tmp_path)
    async with real_host(root) as (_, c):
        sid = (await c.call("session.create", {}))["id"]
        await _exchange(c, sid, 1)
        await say(c, sid, "5", "a message whose id reads as a number")
        await _checkpoint(c, sid, "c1", "a1")
    path = root / "sessions" / f"{sid}.jsonl"
    with path.open("ab") as f:
        for cid, extra in (("n1", {}), ("n2", {"throughMessageId": None}), ("n3", {"throughMessageId": 5})):
            rec: dict[str, Any] = {
                "type": "compaction", "id": cid, "summary": f"summary {cid}", "tokensBefore": 1,
                "retainedTail": [], "createdAt": "2026-12-01T00:00:00.000Z",
                "details": {"retainedTailMode": "completed_turn"}, **extra}
            f.write(json.dumps(rec, separators=(",", ":")).encode() + b"\n")
    for rebuilt in (False, True):
        if rebuilt:  # the index rebuilt from the file alone
            for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
                (root / name).unlink(missing_ok=True)
        async with real_host(root) as (_, c):
            assert await _checkpoints(c, sid) == ["c1"]
            window = await c.call("session.get", {"sessionId": sid, "messageLimit": 1})
            assert [x["id"] for x in window["compactions"]] == ["c1"]
            assert (await c.call("session.context", {"sessionId": sid}))["compaction"]["id"] == "c1"
            child = (await c.call("session.fork", {"sessionId": sid}))["id"]
            assert await _summaries(c, child) == ["summary c1"]


async def test_a_stored_tail_is_read_within_the_bound_its_mode_names(tmp_path: Path) -> None:
    """"retainedTail holds at most the latest user message for an active turn; a completed-turn checkpoint
    has an empty tail. The details.retainedTailMode value preserves that boundary". The append refuses a
    tail over that bound, but a line already in the file (another program's, a damaged build's) was served
    as written: session.get showed a completed-turn checkpoint with a tail, and session.context replayed
    the whole tail, assistant reply included, after the summary. A reader holds the bound the mode names:
    a completed-turn tail reads empty, an active-turn tail reads as its latest user message."""
    root = data_dir(tmp_path)
    sid = await _two_exchanges(root)
    tail = [dict(m) for m in FIRST_EXCHANGE]
    path = root / "sessions" / f"{sid}.jsonl"
    with path.open("ab") as f:
        for cid, mode in (("done", "completed_turn"), ("active", "active_turn")):
            rec = {"type": "compaction", "id": cid, "summary": f"summary {cid}", "throughMessageId": "a2",
                   "tokensBefore": 1, "retainedTail": tail, "createdAt": "2026-12-01T00:00:00.000Z",
                   "details": {"retainedTailMode": mode, "generation": 4}}
            f.write(json.dumps(rec, separators=(",", ":")).encode() + b"\n")
    async with real_host(root) as (_, c):
        for view in (await _full(c, sid), await c.call("session.get", {"sessionId": sid, "messageLimit": 1})):
            done, active = view["compactions"]
            assert done["retainedTail"] == [] and done["details"] == {"retainedTailMode": "completed_turn",
                                                                        "generation": 4}
            assert [m["id"] for m in active["retainedTail"]] == ["u1"]
            assert active["details"] == {"retainedTailMode": "active_turn", "generation": 4}
        ctx = await c.call("session.context", {"sessionId": sid})
        assert ctx["compaction"]["id"] == "active"
        assert [m["id"] for m in ctx["messages"]] == ["active", "u1"]
        assert [m["id"] for m in ctx["compaction"]["retainedTail"]] == ["u1"]
        child = (await c.call("session.fork", {"sessionId": sid}))["id"]
        assert [len(x["retainedTail"]) for x in (await _full(c, child))["compactions"]] == [0, 1]


async def test_a_retained_message_over_the_limit_is_stored_marked_and_the_transcript_keeps_it_whole(
        tmp_path: Path) -> None:
    """"If the active message crossed the retention limit it is stored in marked, truncated form; the
    original message lines stay complete and authoritative": the checkpoint's copy is cut and marked
    (block ``truncated`` / ``fullLength``, ``meta.retainedTruncated``), the message line is whole, and both
    read back so after a restart, where session.context reproduces the summary and the retained copy."""
    text = "\u00e9" + "long prompt " * 7_000
    root = data_dir(tmp_path)
    async with real_host(root) as (_, c):
        sid = (await c.call("session.create", {}))["id"]
        await _exchange(c, sid, 1)
        await say(c, sid, "u2", text)
        stored = await _checkpoint(c, sid, "c1", "u2", retainedTail=[msg("u2", text)],
                                   details={"retainedTailMode": "active_turn", "generation": 1})
        ctx_before = await c.call("session.context", {"sessionId": sid})

    def marked(cp: dict[str, Any]) -> None:
        (kept,) = cp["retainedTail"]
        (block,) = kept["blocks"]
        assert kept["id"] == "u2" and kept["meta"]["retainedTruncated"] is True
        assert block["truncated"] is True and block["fullLength"] == len(text)
        assert text.startswith(block["text"]) and len(block["text"]) < len(text)

    marked(stored)
    async with real_host(root) as (_, c):
        view = await _full(c, sid)
        marked(view["compactions"][0])
        assert view["messages"][-1]["blocks"] == [{"type": "text", "text": text}]
        ctx = await c.call("session.context", {"sessionId": sid})
        assert ctx == ctx_before
        assert [m["id"] for m in ctx["messages"]] == ["c1", "u2"]
        assert text.startswith(ctx["messages"][1]["blocks"][0]["text"])
        assert len(ctx["messages"][1]["blocks"][0]["text"]) < len(text)


async def test_a_fork_writes_a_stored_over_bound_or_legacy_tail_as_the_reads_serve_it(tmp_path: Path) -> None:
    """Seed 003 §4.5's fork row copies a checkpoint into the child; §2.1 bounds its tail by its mode. A
    stored line over that bound (a completed turn with a tail, an active turn with an assistant reply in
    it) or a legacy one (no mode, several messages; one with no user message) was copied into the child's
    file as it stood: every read of the child bounded it again, but the child's own file held the
    over-bound records. The child's file holds each checkpoint as a read of the parent serves it: the same
    tail (its ids remapped) and the mode the read names."""
    root = data_dir(tmp_path)
    sid = await _two_exchanges(root)
    tail = [dict(m) for m in FIRST_EXCHANGE]
    records: dict[str, dict[str, Any]] = {
        "done": {"retainedTail": tail, "details": {"retainedTailMode": "completed_turn", "generation": 4}},
        "active": {"retainedTail": tail, "details": {"retainedTailMode": "active_turn", "generation": 4}},
        "legacy": {"retainedTail": tail},
        "legacy-no-user": {"retainedTail": tail[1:], "details": {"family": "f"}},
    }
    with (root / "sessions" / f"{sid}.jsonl").open("ab") as f:
        for cid, extra in records.items():
            rec = {"type": "compaction", "id": cid, "summary": f"summary {cid}", "throughMessageId": "a2",
                   "tokensBefore": 1, "createdAt": "2026-12-01T00:00:00.000Z", **extra}
            f.write(json.dumps(rec, separators=(",", ":")).encode() + b"\n")
    async with real_host(root) as (_, c):
        served = (await _full(c, sid))["compactions"]
        assert [len(x["retainedTail"]) for x in served] == [0, 1, 1, 0]
        child = (await c.call("session.fork", {"sessionId": sid}))["id"]
        from_child = (await _full(c, child))["compactions"]
    lines = [json.loads(raw) for raw in (root / "sessions" / f"{child}.jsonl").read_bytes().splitlines()]
    written = [rec for rec in lines if rec.get("type") == "compaction"]
    assert [x["summary"] for x in written] == [f"summary {cid}" for cid in records]
    for on_disk, parent_view, child_view in zip(written, served, from_child, strict=True):
        assert on_disk["details"] == parent_view["details"] == child_view["details"]
        assert len(on_disk["retainedTail"]) == len(parent_view["retainedTail"])
        assert on_disk["retainedTail"] == child_view["retainedTail"]
        for kept, shown in zip(on_disk["retainedTail"], parent_view["retainedTail"], strict=True):
            assert (kept["role"], kept["blocks"]) == (shown["role"], shown["blocks"]) == ("user", tail[0]["blocks"])
