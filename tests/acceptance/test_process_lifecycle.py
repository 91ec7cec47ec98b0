"""Issues 2 and 3 acceptance against real ``pi-host serve`` processes that are stopped,
killed and restarted: §11.1 byte-identical restart, clean shutdown on SIGINT/SIGTERM,
one host per data directory, kill -9 between file append and index commit (§11.4),
and a lost ``-wal`` (RELIABILITY row 8).
"""

from __future__ import annotations

import hashlib
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import ClientClosed, RpcError, open_client
from store.jsonio import loads_line
from store.search.search import search_messages
from store.transcripts.records import wire_record
from tests.hostkit import REPO, HostProcess, msg, start_host_process


def _stop(proc: HostProcess, sig: int = signal.SIGTERM) -> tuple[int, str]:
    if proc.proc.poll() is None:
        proc.proc.send_signal(sig)
    _out, err = proc.proc.communicate(timeout=60)
    return proc.proc.returncode, err.decode()


def _kill9(proc: HostProcess) -> None:
    proc.kill9()
    proc.proc.communicate(timeout=30)


def _client(proc: HostProcess, client_id: str = "life") -> Any:
    return open_client(proc.url, proc.token, client_id=client_id, client_kind="test")


def _rich_messages(n: int) -> list[dict[str, Any]]:
    """Every kind of content the transcript must keep exactly."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        kind = i % 5
        if kind == 0:
            m = {"id": f"u{i}", "role": "user",
                 "blocks": [{"type": "text", "text": f"héllo {i} 🌍 日本語 עברית e\u0301 \u0000 \\ \" \n tab\t"}]}
        elif kind == 1:
            m = {"id": f"a{i}", "role": "assistant",
                 "blocks": [{"type": "thinking", "text": f"secret reasoning {i}", "signature": "sig=="},
                            {"type": "text", "text": f"answer {i}"}],
                 "meta": {"usage": {"inputTokens": 1200 + i, "outputTokens": 33, "cacheRead": 0,
                                    "costUsd": 0.0125}, "model": "m-1", "stopReason": "end"}}
        elif kind == 2:
            m = {"id": f"t{i}", "role": "assistant",
                 "blocks": [{"type": "tool_call", "callId": f"call-{i}", "name": "edit",
                             "args": {"path": "/tmp/x.py", "opts": {"deep": [1, {"x": None, "y": [True, 2.5]}],
                                                                     "empty": {}, "big": 2**53 + 1}},
                             "status": "ok",
                             "result": {"stdout": "done\n", "exit": 0, "lines": ["a", "b", {"c": [[]]}]},
                             "durationMs": 17}]}
        elif kind == 3:
            m = {"id": f"r{i}", "role": "tool", "toolName": "bash",
                 "blocks": [{"type": "future_block_kind", "payload": {"a": [1, 2, 3], "nested": {"z": "ζ"}},
                             "weird": True},
                            {"type": "text", "text": "tool output"}]}
        else:
            m = {"id": f"f{i}", "role": "user",
                 "blocks": [{"type": "attachment", "kind": "image", "name": "diagram.png",
                             "ref": "attachments/" + "ab" * 32, "mimeType": "image/png", "size": 4096},
                            {"type": "text", "text": f"see attached {i}"}]}
        out.append(m)
    return out


def _file_records(path: Path) -> list[dict[str, Any]]:
    """Message lines of a transcript as a reader sees them: dedupe keep-last, first position."""
    order: dict[str, int] = {}
    out: list[dict[str, Any]] = []
    for line in path.read_bytes().splitlines(keepends=True):
        if not line.endswith(b"\n"):
            continue
        rec = loads_line(line)
        if rec.get("type") != "message":
            continue
        rec = wire_record(rec)
        if rec["id"] in order:
            out[order[rec["id"]]] = rec
        else:
            order[rec["id"]] = len(out)
            out.append(rec)
    return out


def _without_seq(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "seq"} for r in records]


WINDOWS: list[dict[str, Any]] = [
    {},
    {"messageLimit": 10},
    {"messageLimit": 7, "messageBefore": 25},
    {"messageLimit": 6, "messageEnd": 3},
    {"messageAround": "t12", "messageLimit": 5},
    {"messageLimit": 8, "contentLimit": 4},
    {"full": True},
]


async def _windows(proc: HostProcess, sid: str) -> list[Any]:
    async with _client(proc) as c:
        return [await c.call("session.get", {"sessionId": sid, **w}) for w in WINDOWS]


async def test_restart_returns_the_same_bytes(tmp_path: Path) -> None:
    """§11.1: create → append ×N → windows → SIGTERM → restart → identical windows, equal to the file."""
    data = tmp_path / "data"
    sent = _rich_messages(40)
    with trio.fail_after(90):
        proc = start_host_process(data)
        try:
            async with _client(proc) as c:
                s = await c.call("session.create", {"title": "round trip ✓", "thinkingLevel": "high"})
                sid = s["id"]
                other = (await c.call("session.create", {"title": "appended in turn"}))["id"]
                for i, m in enumerate(sent):
                    r = await c.call("session.appendMessage",
                                     {"sessionId": sid, "message": m, "submissionId": f"sub-{i}"})
                    assert r["message"]["seq"] == i + 1
                    if i % 4 == 0 or i == len(sent) - 1:  # another session's, in the same index batches
                        await c.call("session.appendMessage", {"sessionId": other, "message": msg(f"o{i}", "x")})
                listed = {x["id"]: x for x in (await c.call("session.list", {}))["sessions"]}
            before = await _windows(proc, sid)
        finally:
            code, err = _stop(proc)
        assert code == 0, err
        assert (data / "clean-shutdown").exists()
        transcript = data / "sessions" / f"{sid}.jsonl"
        digest = hashlib.sha256(transcript.read_bytes()).hexdigest()

        proc = start_host_process(data)
        try:
            after = await _windows(proc, sid)
            async with _client(proc) as c:
                status = await c.call("host.status", {})
        finally:
            code, err = _stop(proc)
        assert code == 0, err

    assert after == before
    # one session summary: session.list (the index) and session.get (the session's actor) agree
    assert {k: listed[sid][k] for k in ("updatedAt", "messageCount")} == {
        k: before[0]["session"][k] for k in ("updatedAt", "messageCount")}
    assert status["boot"]["cleanShutdown"] is True
    assert hashlib.sha256(transcript.read_bytes()).hexdigest() == digest, "a restart changed the transcript"
    full = before[-1]
    assert full["totalMessages"] == 40 and [m["seq"] for m in full["messages"]] == list(range(1, 41))
    # What the client sent comes back exactly (plus the host-filled createdAt).
    for got, want in zip(full["messages"], sent, strict=True):
        assert {k: v for k, v in got.items() if k not in ("seq", "createdAt", "type")} == want
    # session.get full == the transcript file's message lines.
    assert _without_seq(full["messages"]) == _file_records(transcript)
    # The windows are slices of the same records; the content cap touched only the projection.
    by_id = {m["id"]: m for m in full["messages"]}
    for spec, window in zip(WINDOWS, before, strict=True):
        if spec.get("contentLimit"):
            assert all(len(b.get("text", "")) <= 4 for m in window["messages"] for b in m["blocks"]
                       if b["type"] == "text")
            continue
        assert all(by_id[m["id"]] == m for m in window["messages"])
    assert before[2]["messageStart"] == 18 and before[2]["messageEnd"] == 25
    assert before[3]["messageStart"] == 3 and before[3]["messageEnd"] == 9
    assert before[0]["session"]["thinkingLevel"] == "high"


def _serve_cmd(data: Path) -> list[str]:
    return [sys.executable, "-m", "runtime.cli", "--data-dir", str(data), "serve", "--port", "0", "--quiet"]


async def test_one_host_per_data_dir_and_clean_sigint(tmp_path: Path) -> None:
    """RELIABILITY row 18 and issue 3 §5: a second host is refused; SIGINT exits 0 and frees the lock."""
    data = tmp_path / "data"
    with trio.fail_after(90):
        first = start_host_process(data)
        try:
            second = await trio.to_thread.run_sync(
                lambda: subprocess.run(_serve_cmd(data), cwd=REPO, capture_output=True, text=True, timeout=60)
            )
            assert second.returncode != 0
            assert str(data) in second.stderr, second.stderr
            assert first.proc.poll() is None, "the first host died when a second one started"
            async with _client(first) as c:
                await c.call("session.create", {"sessionId": "kept", "title": "survives"})
        finally:
            code, err = _stop(first, signal.SIGINT)
        assert code == 0, err
        assert (data / "clean-shutdown").exists()
        assert not (data / "host.json").exists()
        # The lock was released: a new host starts on the same directory and sees the data.
        again = start_host_process(data)
        try:
            async with _client(again) as c:
                listed = await c.call("session.list", {})
                status = await c.call("host.status", {})
        finally:
            code, err = _stop(again)
        assert code == 0, err
    assert [s["id"] for s in listed["sessions"]] == ["kept"]
    assert status["boot"]["cleanShutdown"] is True


def _index_rows(data: Path, sid: str) -> list[tuple[str, int]]:
    conn = sqlite3.connect(f"file:{data / 'pi.sqlite'}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT id, seq FROM messages WHERE session_id = ? ORDER BY seq", (sid,)).fetchall()
    finally:
        conn.close()


async def _search(c: Any, data: Path, query: str) -> list[str]:
    """Message ids ``search.query`` finds (falls back to the store's search if the method is not there yet)."""
    try:
        res = await c.call("search.query", {"query": query})
        return [r["messageId"] for r in res["results"]]
    except RpcError as exc:
        if exc.data_code != "METHOD_NOT_FOUND":
            raise
    conn = sqlite3.connect(f"file:{data / 'pi.sqlite'}?mode=ro", uri=True)
    try:
        return [r["messageId"] for r in search_messages(conn, query)["results"]]
    finally:
        conn.close()


async def test_kill9_between_file_append_and_index_commit(tmp_path: Path) -> None:
    """§11.4 stronger / RELIABILITY row 2: the message renders after restart and search finds it.

    Appends are acknowledged once their line is durable and their index rows commit after
    (ARCHITECTURE.md "Read barriers"), so the kill lands while the last acknowledged messages
    have no index rows yet: they all render after the restart and search finds them."""
    data = tmp_path / "data"
    with trio.fail_after(90):
        proc = start_host_process(data, env={"RT_CRASHPOINT": "index.before_commit:6:kill"})
        acked: list[str] = []
        attempted: str | None = None
        try:
            async with _client(proc) as c:
                s = await c.call("session.create", {"title": "crash between"})
                sid = s["id"]
                with pytest.raises(ClientClosed):
                    # until the 6th index commit kills it: how many appends one commit covers depends
                    # on the index hold (batches grow while no reader waits)
                    for i in range(2000):
                        attempted = f"m{i}"
                        await c.call("session.appendMessage", {
                            "sessionId": sid, "submissionId": f"sub-{i}",
                            "message": {"id": attempted, "role": "user",
                                        "blocks": [{"type": "text", "text": f"zebracorn{i:03d} payload"}]}})
                        acked.append(attempted)
        finally:
            code = proc.proc.wait(timeout=30)
            proc.proc.communicate()
        assert code == -signal.SIGKILL
        assert attempted is not None and attempted not in acked
        # Every acknowledged line is in the file (fsynced before its answer); the attempted one may be.
        in_file = [r["id"] for r in _file_records(data / "sessions" / f"{sid}.jsonl")]
        assert in_file[:len(acked)] == acked and in_file[len(acked):] in ([], [attempted])

        proc = start_host_process(data)
        try:
            async with _client(proc) as c:
                got = await c.call("session.get", {"sessionId": sid, "full": True})
                found = await _search(c, data, f"zebracorn{int(acked[-1][1:]):03d}")
                # every acknowledged message, the ones the lost commits covered among them, once each
                every = {mid: await _search(c, data, f"zebracorn{int(mid[1:]):03d}") for mid in acked}
                # The client's retry after the crash returns the stored answer, once.
                retry = await c.call("session.appendMessage", {
                    "sessionId": sid, "submissionId": f"sub-{int(attempted[1:])}",
                    "message": {"id": attempted, "role": "user",
                                "blocks": [{"type": "text",
                                            "text": f"zebracorn{int(attempted[1:]):03d} payload"}]}})
                status = await c.call("host.status", {})
                again = await c.call("session.get", {"sessionId": sid, "full": True})
            rows = _index_rows(data, sid)
        finally:
            code, err = _stop(proc)
        assert code == 0, err
    ids = [m["id"] for m in got["messages"]]
    assert ids == in_file
    assert found == [acked[-1]]  # acknowledged before its index commit: found after the restart
    assert every == {mid: [mid] for mid in acked}, every
    final = [m["id"] for m in again["messages"]]
    assert final == [*acked, attempted]  # the retry wrote it once (or found it written)
    assert retry["message"]["id"] == attempted and retry["message"]["seq"] == len(final)
    assert rows == [(mid, i + 1) for i, mid in enumerate(final)]
    assert status["boot"]["cleanShutdown"] is False
    assert status["boot"]["indexRowsAdded"] >= 1


async def test_lost_wal_is_reconciled_from_transcripts(tmp_path: Path) -> None:
    """RELIABILITY row 8: kill -9, delete ``-wal``/``-shm`` (committed transactions lost) → index == transcripts."""
    data = tmp_path / "data"
    with trio.fail_after(90):
        proc = start_host_process(data)
        try:
            async with _client(proc) as c:
                sids = []
                for k in range(3):
                    s = await c.call("session.create", {"title": f"wal {k}"})
                    sids.append(s["id"])
                    for i in range(5):
                        await c.call("session.appendMessage", {
                            "sessionId": s["id"],
                            "message": {"id": f"s{k}m{i}", "role": "user",
                                        "blocks": [{"type": "text", "text": f"walrus {k} {i}"}]}})
                await c.call("session.rename", {"sessionId": sids[0], "title": "renamed before crash"})
                await c.call("session.update", {"sessionId": sids[1], "thinkingLevel": "medium"})
                before = {sid: await c.call("session.get", {"sessionId": sid, "full": True}) for sid in sids}
        finally:
            _kill9(proc)
        wal = data / "pi.sqlite-wal"
        assert wal.exists() and wal.stat().st_size > 0
        wal.unlink()
        (data / "pi.sqlite-shm").unlink(missing_ok=True)

        proc = start_host_process(data)
        try:
            async with _client(proc) as c:
                after = {sid: await c.call("session.get", {"sessionId": sid, "full": True}) for sid in sids}
                listed = await c.call("session.list", {})
        finally:
            code, err = _stop(proc)
        assert code == 0, err
    for sid in sids:
        assert after[sid]["messages"] == before[sid]["messages"]
        assert _without_seq(after[sid]["messages"]) == _file_records(data / "sessions" / f"{sid}.jsonl")
        assert [r[0] for r in _index_rows(data, sid)] == [m["id"] for m in before[sid]["messages"]]
        for key in ("title", "thinkingLevel", "messageCount"):
            assert after[sid]["session"][key] == before[sid]["session"][key], key
    assert {s["id"] for s in listed["sessions"]} == set(sids)
    assert after[sids[0]]["session"]["title"] == "renamed before crash"
    assert after[sids[1]]["session"]["thinkingLevel"] == "medium"
