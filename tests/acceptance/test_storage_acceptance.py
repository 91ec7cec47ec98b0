"""Issue 2 acceptance through the real gateway of an in-process host (seed 003 §11 items 2, 5, 7, 11;
torn tail, unknown line kind, duplicate ids, bounded window reads, id validation, index loss).

Hosts are restarted by leaving and re-entering ``inprocess_host`` on the same directory;
files are damaged only while no host runs.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

import actors.db_reader
import store.indexing.reconcile
import store.transcripts.transcript
import store.transcripts.windows
from runtime.client import HostClient, RpcError
from store.jsonio import dumps_line, loads_line
from store.search.search import search_messages
from store.transcripts.records import wire_record
from store.upgrade.schema import SCHEMA_VERSION
from tests.hostkit import client_for, index_caught_up, inprocess_host, msg


def _data(tmp_path: Path) -> Path:
    return tmp_path / "data"


def _tree_without_db(base: Path) -> list[Path]:
    """Every path under ``base`` (relative), the SQLite files aside."""
    return sorted(p.relative_to(base) for p in base.rglob("*") if "pi.sqlite" not in p.name)


def _transcript(root: Path, sid: str) -> Path:
    return root / "sessions" / f"{sid}.jsonl"


def _file_messages(path: Path) -> list[dict[str, Any]]:
    """Message records as a reader sees them: complete lines, dedupe keep-last at first position."""
    order: dict[str, int] = {}
    out: list[dict[str, Any]] = []
    for line in path.read_bytes().splitlines(keepends=True):
        if not line.endswith(b"\n"):
            continue
        try:
            rec = loads_line(line)
        except ValueError:
            continue
        if rec.get("type") != "message":
            continue
        rec = wire_record(rec)
        if rec["id"] in order:
            out[order[rec["id"]]] = rec
        else:
            order[rec["id"]] = len(out)
            out.append(rec)
    return out


def _strip_seq(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "seq"} for r in records]


def _db(root: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{root / 'pi.sqlite'}?mode=ro", uri=True)


def _index_ids(root: Path, sid: str) -> list[str]:
    conn = _db(root)
    try:
        return [r[0] for r in conn.execute("SELECT id FROM messages WHERE session_id = ? ORDER BY seq", (sid,))]
    finally:
        conn.close()


def _search_ids(root: Path, query: str) -> list[str]:
    conn = _db(root)
    try:
        return [r["messageId"] for r in search_messages(conn, query)["results"]]
    finally:
        conn.close()


async def _fill(c: HostClient, sid: str, n: int, *, prefix: str = "m", width: int = 60) -> None:
    """``n`` messages of equal line size, 200 appends per JSON-RPC batch."""
    for start in range(0, n, 200):
        calls = [("session.appendMessage",
                  {"sessionId": sid, "message": msg(f"{prefix}{i:05d}", f"{i:05d}".ljust(width, "x"))})
                 for i in range(start, min(n, start + 200))]
        results = await c.batch(calls)
        assert not [r for r in results if isinstance(r, RpcError)]


async def _full(c: HostClient, sid: str) -> dict[str, Any]:
    return await c.call("session.get", {"sessionId": sid, "full": True})


# ---------------------------------------------------------------------------- §11.2 and bounded reads


class _Reads:
    """Counts what a request reads from transcript files."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pread_bytes = 0
        self.pread_calls = 0
        self.span_calls: list[list[tuple[int, int]]] = []
        self.whole_file_scans = 0
        real_pread, real_spans = os.pread, store.transcripts.windows.read_spans
        real_scan, real_read = store.indexing.reconcile.scan_from, store.transcripts.transcript.read_transcript

        def pread(fd: int, n: int, offset: int) -> bytes:
            got = real_pread(fd, n, offset)
            self.pread_calls += 1
            self.pread_bytes += len(got)
            return got

        def spans(path: Any, spans: Any, **kw: Any) -> list[bytes]:
            self.span_calls.append(list(spans))
            return real_spans(path, spans, **kw)

        def scan(path: Any, start: int) -> Any:
            self.whole_file_scans += start == 0
            return real_scan(path, start)

        def read_all(path: Any) -> Any:
            self.whole_file_scans += 1
            return real_read(path)

        monkeypatch.setattr(os, "pread", pread)
        monkeypatch.setattr(store.transcripts.windows, "read_spans", spans)
        monkeypatch.setattr(store.indexing.reconcile, "scan_from", scan)
        monkeypatch.setattr(store.transcripts.transcript, "read_transcript", read_all)

    def reset(self) -> None:
        self.pread_bytes = self.pread_calls = self.whole_file_scans = 0
        self.span_calls.clear()


def _line_bytes(root: Path, sid: str, ids: list[str]) -> int:
    conn = _db(root)
    try:
        q = f"SELECT sum(line_len) FROM messages WHERE session_id = ? AND id IN ({','.join('?' * len(ids))})"
        return int(conn.execute(q, (sid, *ids)).fetchone()[0])
    finally:
        conn.close()


async def test_window_read_touches_only_the_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Newest-50 window of a 5,000-message session reads exactly the window's lines, as for a 50-message one,
    also on the first request after a restart (cold actor, offsets from the index)."""
    root = _data(tmp_path)
    with trio.fail_after(90):
        async with inprocess_host(root) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "big", "title": "big"})
            await c.call("session.create", {"sessionId": "small", "title": "small"})
            await _fill(c, "big", 5000)
            await _fill(c, "small", 50, prefix="n")  # message ids are unique across sessions
        reads = _Reads(monkeypatch)
        measured: dict[str, tuple[int, int, list[str]]] = {}
        async with inprocess_host(root) as host, client_for(host) as c:
            for sid in ("small", "big"):
                for warm in (False, True):
                    reads.reset()
                    got = await c.call("session.get", {"sessionId": sid, "messageLimit": 50})
                    ids = [m["id"] for m in got["messages"]]
                    assert len(ids) == 50 and got["hasMoreBefore"] is (sid == "big")
                    assert reads.whole_file_scans == 0
                    measured[f"{sid}-{'warm' if warm else 'cold'}"] = (reads.pread_bytes, reads.pread_calls, ids)
    for key, (nbytes, preads, ids) in measured.items():
        sid = key.split("-")[0]
        assert nbytes == _line_bytes(root, sid, ids), key
        assert preads == 1, key  # the 50 lines are adjacent: one sequential read
    # Independent of the session's size: the same bytes for 50 and for 5,000 messages.
    assert measured["big-cold"][0] == measured["small-cold"][0] == measured["big-warm"][0], {
        k: v[:2] for k, v in measured.items()}


async def test_full_load_needs_no_message_content_sql(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """§11.2: a 5k-message load comes from the transcript file; the index's ``text`` is not read."""
    root = _data(tmp_path)
    with trio.fail_after(90):
        async with inprocess_host(root) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s5k"})
            await _fill(c, "s5k", 5000)
            before = await _full(c, "s5k")
        conn = sqlite3.connect(root / "pi.sqlite")
        with conn:
            assert conn.execute("UPDATE messages SET text = NULL WHERE session_id = 's5k'").rowcount == 5000
        conn.close()
        statements: list[str] = []
        real_open = actors.db_reader.open_reader

        def traced(path: Path, **kw: Any) -> sqlite3.Connection:
            conn = real_open(path, **kw)
            conn.set_trace_callback(statements.append)
            return conn

        monkeypatch.setattr(actors.db_reader, "open_reader", traced)
        reads = _Reads(monkeypatch)
        async with inprocess_host(root) as host, client_for(host) as c:
            await c.call("session.get", {"sessionId": "s5k", "messageLimit": 1})  # actor warm
            statements.clear()
            reads.reset()
            after = await _full(c, "s5k")
    assert after == before
    assert _strip_seq(after["messages"]) == _file_messages(_transcript(root, "s5k"))
    assert [m["blocks"][0]["text"][:5] for m in after["messages"]] == [f"{i:05d}" for i in range(5000)]
    assert statements and not [s for s in statements if "text" in s.lower()], statements
    # One sequential pass over the file: the message lines are back to back, read in one go.
    assert reads.whole_file_scans == 0
    assert reads.pread_calls == 1
    assert reads.pread_bytes == _line_bytes(root, "s5k", [m["id"] for m in after["messages"]])


# ---------------------------------------------------------------------------- ids


BAD_IDS = ["../x", "", "a" * 300, "a/b", "%2e%2e", "x\u0000y", "..", "a\\b", "/etc/passwd", "é", "a b", "a" * 65]


async def test_invalid_session_ids_refused_before_any_path(tmp_path: Path) -> None:
    root = _data(tmp_path)
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host) as c:
            sentinels = {root / "x.jsonl": b"inside root\n", tmp_path / "x.jsonl": b"outside root\n",
                         root / "sessions" / "..": None}
            for path, body in sentinels.items():
                if body is not None:
                    path.write_bytes(body)
            listing = await trio.to_thread.run_sync(_tree_without_db, tmp_path)
            for bad in BAD_IDS:
                calls = [
                    ("session.create", {"sessionId": bad}),
                    ("session.get", {"sessionId": bad}),
                    ("session.appendMessage", {"sessionId": bad, "message": msg("m1", "hi")}),
                    ("session.rename", {"sessionId": bad, "title": "t"}),
                    ("session.update", {"sessionId": bad, "thinkingLevel": "high"}),
                    ("session.delete", {"sessionId": bad}),
                ]
                for method, params in calls:
                    with pytest.raises(RpcError) as err:
                        await c.call(method, params)
                    assert err.value.data_code in ("INVALID_ID", "INVALID_PARAMS"), (bad, method, err.value)
            assert (await c.call("session.list", {}))["sessions"] == []
            after = await trio.to_thread.run_sync(_tree_without_db, tmp_path)
    assert after == listing
    assert (root / "x.jsonl").read_bytes() == b"inside root\n"
    assert (tmp_path / "x.jsonl").read_bytes() == b"outside root\n"
    assert os.listdir(root / "sessions") == []


# ---------------------------------------------------------------------------- §11.7 delete


async def test_delete_removes_index_entries_and_every_session_file(tmp_path: Path) -> None:
    root = _data(tmp_path)
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "doomed"}))["id"]
            keep = (await c.call("session.create", {"title": "kept"}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                   "message": msg("u1", "platypus question")})
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1",
                                                   "message": msg("a1", "platypus answer", role="assistant")})
            await c.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed"})
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t2"})
            await c.call("session.saveInflightMessage", {
                "sessionId": sid, "turnId": "t2",
                "message": {"id": "a2", "role": "assistant", "blocks": [{"type": "text", "text": "platypus…"}],
                            "meta": {"status": "streaming"}}})
            await c.call("session.appendMessage", {"sessionId": keep, "message": msg("k1", "platypus kept")})
            files = [_transcript(root, sid), root / "sessions" / f"{sid}.revisions.jsonl",
                     root / "sessions" / f"{sid}.inflight.json"]
            assert all(p.exists() for p in files), [p for p in files if not p.exists()]
            await index_caught_up(host)  # the raw database read below does not pass a read barrier
            assert sorted(_search_ids(root, "platypus")) == ["a1", "k1", "u1"]
            await c.call("session.delete", {"sessionId": sid})
            assert not [p for p in files if p.exists()]
            # every file of the session is gone; its id is in the deleted-sessions log (it outlives the database)
            assert {p.name for p in (root / "sessions").iterdir()} == {"deleted-sessions.log", f"{keep}.jsonl"}
            assert _search_ids(root, "platypus") == ["k1"]
            conn = _db(root)
            try:
                counts = {t: conn.execute(f"SELECT count(*) FROM {t} WHERE session_id = ?", (sid,)).fetchone()[0]
                          for t in ("messages", "turns", "message_revisions", "compactions")}
                fts = conn.execute("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'platypus'").fetchone()
                sessions = conn.execute("SELECT count(*) FROM sessions WHERE id = ?", (sid,)).fetchone()[0]
            finally:
                conn.close()
            assert counts == dict.fromkeys(counts, 0) and sessions == 0
            assert fts[0] == 1
        # Nothing comes back at the next boot.
        async with inprocess_host(root) as host, client_for(host) as c:
            assert [s["id"] for s in (await c.call("session.list", {}))["sessions"]] == [keep]


# ---------------------------------------------------------------------------- §11.11 settings


async def test_thinking_level_survives_restart_and_index_rebuild(tmp_path: Path) -> None:
    root = _data(tmp_path)
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "think"}))["id"]
            await c.call("session.update", {"sessionId": sid, "thinkingLevel": "high", "mode": "plan"})
            await c.call("session.rename", {"sessionId": sid, "title": "deep thought"})
        async with inprocess_host(root) as host, client_for(host) as c:
            after_restart = (await c.call("session.get", {"sessionId": sid}))["session"]
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (root / name).unlink(missing_ok=True)
        async with inprocess_host(root) as host, client_for(host) as c:
            after_rebuild = (await c.call("session.get", {"sessionId": sid}))["session"]
    for s in (after_restart, after_rebuild):
        assert (s["thinkingLevel"], s["mode"], s["title"]) == ("high", "plan", "deep thought")


# ---------------------------------------------------------------------------- §2.1 example lines

SEED_LINES = [  # seed 003 §2.1's message lines, its elisions filled in
    '{"type":"message","id":"m1","role":"user","createdAt":"2026-07-26T09:00:00.000Z",'
    '"blocks":[{"type":"text","text":"hi"}]}',
    '{"type":"message","id":"m2","role":"tool","toolName":"Write",'
    '"blocks":[{"type":"tool_call","callId":"c1","args":{},"result":{},"status":"success"}]}',
    '{"type":"message","id":"m3","role":"assistant","createdAt":"2026-07-26T09:00:02.000Z",'
    '"blocks":[{"type":"thinking","text":"t"},{"type":"text","text":"a"}],"meta":{"usage":{},"modelId":"x"}}',
]


async def test_the_seeds_example_lines_append_as_written_and_read_back(tmp_path: Path) -> None:
    """Each §2.1 message line, sent as it is (its ``type`` too; the tool line names its tool only in
    ``toolName``), is stored and read back as sent, plus its seq and the createdAt the host stamps; the
    same after the index is rebuilt from the file."""
    root = _data(tmp_path)
    sent = [loads_line(line.encode()) for line in SEED_LINES]
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "seed lines"}))["id"]
            for m in sent:
                await c.call("session.appendMessage", {"sessionId": sid, "message": m})
            got = (await c.call("session.get", {"sessionId": sid, "full": True}))["messages"]
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (root / name).unlink(missing_ok=True)
        async with inprocess_host(root) as host, client_for(host) as c:
            rebuilt = (await c.call("session.get", {"sessionId": sid, "full": True}))["messages"]
    assert rebuilt == got
    assert [m["seq"] for m in got] == [1, 2, 3]
    for have, want in zip(got, sent, strict=True):
        assert {k: v for k, v in have.items() if k != "seq"} == {"createdAt": have["createdAt"], **want}
    assert got[0]["createdAt"] == sent[0]["createdAt"] and "createdAt" not in sent[1]
    assert _file_messages(_transcript(root, sid)) == [{k: v for k, v in m.items() if k != "seq"} for m in got]


# ---------------------------------------------------------------------------- torn tail, unknown kinds, dupes


@pytest.mark.parametrize("tail", [b'{"type":"message","id":"torn","role":"user","blo', b"\x00" * 18,
                                  b'{"type":"message"}garbage'], ids=["half-line", "nul-run", "junk"])
async def test_torn_trailing_line(tmp_path: Path, tail: bytes) -> None:
    root = _data(tmp_path)
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1"})
            for i in range(3):
                await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(f"m{i}", f"text {i}")})
        path = _transcript(root, "s1")
        good = path.read_bytes()
        async with await trio.open_file(path, "ab") as fh:
            await fh.write(tail)
        async with inprocess_host(root) as host, client_for(host) as c:
            assert host.boot.report["tornTails"] == 1
            assert host.boot.report["damagedTranscripts"] == [
                {"sessionId": "s1", "badLines": 0, "badLineOffsets": [], "tornTailBytes": len(tail)}]
            got = await _full(c, "s1")
            assert [m["id"] for m in got["messages"]] == ["m0", "m1", "m2"]
            r = await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m3", "after repair")})
            assert r["message"]["seq"] == 4
            got = await _full(c, "s1")
        data = path.read_bytes()
        assert data.startswith(good) and data.endswith(b"\n")
        assert all(loads_line(line) for line in data.splitlines(keepends=True))  # no glued line
        quarantined = [p for p in (root / "sessions").iterdir() if p.name.startswith("s1.jsonl.torn-")]
        assert [p.read_bytes() for p in quarantined] == [tail]
        async with inprocess_host(root) as host, client_for(host) as c:
            again = await _full(c, "s1")
    assert [m["id"] for m in got["messages"]] == ["m0", "m1", "m2", "m3"]
    assert again["messages"] == got["messages"]
    assert _index_ids(root, "s1") == ["m0", "m1", "m2", "m3"]


async def test_unknown_line_kinds_skipped_and_duplicate_ids_keep_last(tmp_path: Path) -> None:
    root = _data(tmp_path)
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1"})
            for i in range(3):
                await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(f"m{i}", f"text {i}")})
        path = _transcript(root, "s1")
        created = loads_line(path.read_bytes().splitlines(keepends=True)[-1])["createdAt"]
        extra = [
            dumps_line({"type": "martian_from_the_future", "id": "x1", "payload": {"m1": "not a message"}}),
            b'{"type":"message","id":"m9",oops not json}\n',  # a bad line mid-file: skipped and reported
            dumps_line({"type": "message", "id": "m1", "role": "user", "createdAt": created,
                        "blocks": [{"type": "text", "text": "m1 rewritten later, kept"}]}),
            dumps_line({"type": "message", "id": "m3", "role": "user", "createdAt": created,
                        "blocks": [{"type": "text", "text": "text 3"}]}),
            dumps_line({"type": "zzz"}),
        ]
        async with await trio.open_file(path, "ab") as fh:
            await fh.write(b"".join(extra))
        async with inprocess_host(root) as host, client_for(host) as c:
            counts = {k: host.boot.report["reconcile"][k] for k in ("badLines", "unknownLines", "tornTails")}
            damaged = host.boot.report["damagedTranscripts"]
            got = await _full(c, "s1")
            found = _search_ids(root, "rewritten later")
            stale = _search_ids(root, "text 1")
            on_file = _file_messages(path)
            r = await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m4", "next")})
            await index_caught_up(host)  # before the raw database read below
    assert counts == {"badLines": 1, "unknownLines": 2, "tornTails": 0}
    assert [(d["sessionId"], d["badLines"]) for d in damaged] == [("s1", 1)]
    assert [m["id"] for m in got["messages"]] == ["m0", "m1", "m2", "m3"]
    assert got["messages"][1]["blocks"][0]["text"] == "m1 rewritten later, kept"
    assert _strip_seq(got["messages"]) == on_file
    assert found == ["m1"] and stale == []
    assert r["message"]["seq"] == 5
    assert _index_ids(root, "s1") == ["m0", "m1", "m2", "m3", "m4"]


# ---------------------------------------------------------------------------- index loss and corruption


async def _populate(root: Path) -> dict[str, Any]:
    async with inprocess_host(root) as host, client_for(host) as c:
        sids = []
        for k in range(3):
            s = await c.call("session.create", {"title": f"session {k}", "projectPath": f"/work/p{k}"})
            sids.append(s["id"])
            for i in range(4):
                await c.call("session.appendMessage", {
                    "sessionId": s["id"],
                    "message": {"id": f"s{k}m{i}", "role": "user" if i % 2 == 0 else "assistant",
                                "blocks": [{"type": "text", "text": f"quokka {k}.{i} 日本語テキスト"}]}})
        await c.call("session.rename", {"sessionId": sids[1], "title": "renamed ✓"})
        await c.call("session.update", {"sessionId": sids[2], "thinkingLevel": "low"})
        return {
            "list": await c.call("session.list", {}),
            "full": {sid: await _full(c, sid) for sid in sids},
            "search": sorted(_search_ids(root, "quokka")),
            "cjk": sorted(_search_ids(root, "本語テ")),
        }


async def _observe(root: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    async with inprocess_host(root) as host, client_for(host) as c:
        listed = await c.call("session.list", {})
        seen = {
            "list": listed,
            "full": {s["id"]: await _full(c, s["id"]) for s in listed["sessions"]},
            "search": sorted(_search_ids(root, "quokka")),
            "cjk": sorted(_search_ids(root, "本語テ")),
        }
        return seen, host.boot.report


def _comparable(view: dict[str, Any]) -> dict[str, Any]:
    """Everything a rebuild must restore (projectId is a fresh surrogate key, updatedAt a boot time)."""
    def session(s: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in s.items() if k not in ("projectId", "updatedAt", "createdAt")}

    return {
        "list": sorted((session(s) for s in view["list"]["sessions"]), key=lambda s: s["id"]),
        "messages": {sid: g["messages"] for sid, g in view["full"].items()},
        "search": view["search"],
        "cjk": view["cjk"],
    }


async def test_corrupt_index_is_quarantined_and_rebuilt(tmp_path: Path) -> None:
    """RELIABILITY row 7: header overwritten → boot quarantines it and rebuilds every session from files."""
    root = _data(tmp_path)
    with trio.fail_after(90):
        before = await _populate(root)
        async with await trio.open_file(root / "pi.sqlite", "r+b") as fh:
            await fh.write(b"this is not an SQLite database header at all!!" * 4)
        after, report = await _observe(root)
    assert report["dbRebuilt"] is True and report["database"]["corruption"]
    assert [Path(p).parent for p in report["database"]["quarantined"]] == [root / "quarantine"] * len(
        report["database"]["quarantined"])
    assert any(p.name.startswith("pi.sqlite.corrupt-") for p in (root / "quarantine").iterdir())
    assert len(before["search"]) == 12 and len(before["cjk"]) == 12
    assert _comparable(after) == _comparable(before)


@pytest.mark.parametrize("lost", [("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"), ("pi.sqlite-shm",)],
                         ids=["all-index-files", "shm-only"])
async def test_deleted_index_rebuilds_equal_to_transcripts(tmp_path: Path, lost: tuple[str, ...]) -> None:
    """RELIABILITY row 8 (the ``-wal`` case runs on a killed subprocess in test_process_lifecycle)."""
    root = _data(tmp_path)
    with trio.fail_after(90):
        before = await _populate(root)
        digests = {p.name: p.read_bytes() for p in (root / "sessions").iterdir()}
        for name in lost:
            (root / name).unlink(missing_ok=True)
        after, _report = await _observe(root)
    assert _comparable(after) == _comparable(before)
    assert {p.name: p.read_bytes() for p in (root / "sessions").iterdir()} == digests, "a transcript was touched"
    for sid, got in after["full"].items():
        assert _strip_seq(got["messages"]) == _file_messages(_transcript(root, sid))


# ---------------------------------------------------------------------------- §11.5 migration


async def test_pre_v7_database_archived_then_plain_open(tmp_path: Path) -> None:
    root = _data(tmp_path)
    with trio.fail_after(90):
        before = await _populate(root)
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (root / name).unlink(missing_ok=True)
        old = sqlite3.connect(root / "pi.sqlite")
        old.executescript("CREATE TABLE sessions(id TEXT PRIMARY KEY, title TEXT);"
                          "INSERT INTO sessions VALUES ('legacy', 'from v6');"
                          "PRAGMA user_version = 6;")
        old.close()
        after, report = await _observe(root)
        plain_view, plain = await _observe(root)
    bak = root / "pi.sqlite.v6.bak"
    assert bak.exists()
    conn = sqlite3.connect(f"file:{bak}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 6
        assert conn.execute("SELECT id, title FROM sessions").fetchall() == [("legacy", "from v6")]
    finally:
        conn.close()
    assert report["database"]["archivedVersion"] == 6 and report["database"]["archivedTo"] == str(bak)
    assert report["dbRebuilt"] is True
    conn = _db(root)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        conn.close()
    # The transcripts were re-indexed into the fresh file; the next boot is a plain open.
    assert _comparable(after) == _comparable(before)
    db_report = plain["database"]
    assert (db_report["createdFresh"], db_report["rebuilt"], db_report["archivedTo"], db_report["migratedFrom"],
            db_report["backups"], db_report["quarantined"]) == (False, False, None, None, [], [])
    assert plain["reconcile"]["full"] == 0 and plain["indexRowsAdded"] == 0
    assert sorted(p.name for p in root.iterdir() if ".bak" in p.name) == ["pi.sqlite.v6.bak"]
    assert _comparable(plain_view) == _comparable(before)


def test_coalesced_span_reads_match_single_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The window reader's merge of adjacent spans returns exactly what one read per span returns."""
    path = tmp_path / "t.jsonl"
    lines = [f'{{"n":{i},"pad":"{"p" * (i % 7)}"}}\n'.encode() for i in range(40)]
    path.write_bytes(b"".join(lines))
    offsets = [sum(len(x) for x in lines[:i]) for i in range(len(lines))]
    spans = [(offsets[i], len(lines[i])) for i in [0, 1, 2, 5, 6, 30, 3, 4, 39, 38, 7, 8, 9]]
    expected = store.transcripts.transcript.read_spans(path, spans)
    assert store.transcripts.windows.read_spans_coalesced(path, spans) == expected
    assert store.transcripts.windows.read_spans_coalesced(path, []) == []
    monkeypatch.setattr(store.transcripts.windows, "MAX_COALESCED_READ", 60)
    spans = [(offsets[i], len(lines[i])) for i in range(20)]
    assert store.transcripts.windows.read_spans_coalesced(path, spans) == [bytes(x) for x in lines[:20]]
