"""What an import's counts mean (protocol/README.md, ``import.sessions``), held against what a real host serves
afterwards: ``toolCalls`` / ``toolResults`` say what the session holds, as ``messages`` does, and ``newRecords``
counts the messages and checkpoints an import added, not the tombstone lines it writes with them.

The sources are files the real tools wrote (``tests/fixtures/recorded``) and a real export of this host, each
damaged in one line: the arguments of one tool call nested past what a transcript line can hold, so the writer
leaves that call out (``skippedBlocks``).

Reproduces: the left-out call was still counted in ``toolCalls`` and ``toolResults`` (2 and 2 for a session that
holds 1 and 1); the first import of a pi-host export whose deleted prompt keys archived branches reported
``newRecords`` one over ``newMessages`` for the prompt's tombstone line (a re-import that adds such a prompt did
not count it: the two disagreed)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient
from tests.hostkit import client_for, inprocess_host, msg

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"
CLAUDE = RECORDED / "claude-code" / "2.1.332" / "projects" / "-tmp-record-claude-code-knbzrbze-work" \
    / "f4c39419-9a33-4bec-8654-af21bffc852d.jsonl"  # tool-ok: two calls, both answered
CODEX = RECORDED / "codex" / "0.171.0" / "sessions" / "2026" / "12" / "02" \
    / "rollout-2026-12-02T03-13-50-01a234be-84ec-7102-83cb-5ce2b664ebd3.jsonl"  # tool-ok
PI = RECORDED / "pi" / "0.73.1" / "sessions" / "--tmp-record-pi-kqimgc23-project--" \
    / "2026-12-02T02-55-40-021Z_01a234ad-dfe8-7038-b380-b3ff8f231306.jsonl"  # basics: a bash call, a failed read
OPENCODE = RECORDED / "opencode" / "1.18.33" / "opencode.db"
OPENCODE_PART = "prt_234aed282001DCfWzb1ZB6KiRt"  # the basics session's bash call


def deep(value: Any, levels: int = 300) -> Any:
    """``value`` nested ``levels`` deep: a transcript line holds 254 levels, a source line is read to 1024."""
    for _ in range(levels):
        value = {"a": value}
    return value


def damage_line(src: Path, dest: Path, damage: Any) -> None:
    """``src`` copied to ``dest`` with the first line ``damage(record)`` changes (it returns True) rewritten."""
    out, done = [], False
    for line in src.read_bytes().splitlines(keepends=True):
        rec = json.loads(line) if line.strip() else None
        if not done and isinstance(rec, dict) and damage(rec):
            line, done = json.dumps(rec).encode() + b"\n", True
        out.append(line)
    assert done, f"no line of {src} holds what the damage needs"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(b"".join(out))


def _claude_call(rec: dict[str, Any]) -> bool:
    for block in (rec.get("message") or {}).get("content") or ():
        if isinstance(block, dict) and block.get("type") == "tool_use":
            block["input"] = deep(block["input"])
            return True
    return False


def _codex_call(rec: dict[str, Any]) -> bool:
    payload = rec.get("payload") or {}
    if payload.get("type") != "function_call":
        return False
    payload["arguments"] = json.dumps(deep(json.loads(payload["arguments"])))
    return True


def _pi_call(rec: dict[str, Any]) -> bool:
    for block in (rec.get("message") or {}).get("content") or ():
        if isinstance(block, dict) and block.get("type") == "toolCall":
            block["arguments"] = deep(block["arguments"])
            return True
    return False


def _host_call(rec: dict[str, Any]) -> bool:
    for block in rec.get("blocks") or () if rec.get("type") == "message" else ():
        if block.get("type") == "tool_call":
            block["args"] = deep(block["args"])
            return True
    return False


def damaged_source(source: str, tmp: Path) -> Path:
    """The import root: the recorded file laid out as its tool keeps it, one tool call nested too deep."""
    root = tmp / "src"
    if source == "claude-code":
        damage_line(CLAUDE, root / CLAUDE.parent.name / CLAUDE.name, _claude_call)
    elif source == "codex":
        damage_line(CODEX, root / "2026" / "12" / "02" / CODEX.name, _codex_call)
    elif source == "pi":
        damage_line(PI, root / PI.parent.name / PI.name, _pi_call)
    else:
        root.mkdir()
        shutil.copy(OPENCODE, root / "opencode.db")
        with sqlite3.connect(root / "opencode.db") as db:
            (data,) = db.execute("SELECT data FROM part WHERE id = ?", (OPENCODE_PART,)).fetchone()
            part = json.loads(data)
            part["state"]["input"] = deep(part["state"]["input"])
            db.execute("UPDATE part SET data = ? WHERE id = ?", (json.dumps(part), OPENCODE_PART))
        db.close()
        return root / "opencode.db"
    return root


async def held(c: HostClient, sid: str) -> tuple[int, int, int]:
    """(messages, tool calls, those with their result) session.get serves for ``sid``; a result the source
    holds without its call (``meta.orphanResult``) is neither a call nor a result (it is ``orphanResults``)."""
    got = await c.call("session.get", {"sessionId": sid, "full": True})
    calls = results = 0
    for m in got["messages"]:
        if (m.get("meta") or {}).get("orphanResult"):
            continue
        for block in m["blocks"]:
            if block["type"] == "tool_call":
                calls += 1
                results += "result" in block
    return len(got["messages"]), calls, results


def assert_counts_are_held(rep: dict[str, Any], served: tuple[int, int, int]) -> None:
    messages, calls, results = served
    assert (sum(rep["messages"].values()), rep["toolCalls"], rep["toolResults"]) == (messages, calls, results), rep


@pytest.mark.parametrize("source", ["claude-code", "codex", "pi", "opencode"])
async def test_a_tool_call_left_out_is_not_in_the_tool_counts(tmp_path: Path, source: str) -> None:
    root = damaged_source(source, tmp_path)
    with trio.fail_after(120):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "importer", "ui") as c:
            dry = await c.call("import.sessions", {"source": source, "root": str(root), "dryRun": True})
            result = await c.call("import.sessions", {"source": source, "root": str(root)})
            assert result["counts"]["new"] == result["total"] > 0 and not result["counts"]["refused"], result
            skipped = [r for r in result["sessions"] if r["skippedBlocks"]]
            assert [r["skippedBlocks"] for r in skipped] == [{"message(cannot be written)": 1}]
            assert skipped[0]["toolCalls"] >= 1  # the session holds another call: the count is not just zeroed
            for rep in result["sessions"]:
                assert_counts_are_held(rep, await held(c, rep["sessionId"]))
            # a dry run counts what the import then wrote
            assert {r["externalId"]: (r["toolCalls"], r["toolResults"]) for r in dry["sessions"]} \
                == {r["externalId"]: (r["toolCalls"], r["toolResults"]) for r in result["sessions"]}


async def test_a_call_whose_line_cannot_be_read_leaves_its_result_an_orphan_counted_apart(tmp_path: Path) -> None:
    """The recorded Claude Code session with its first ``tool_use`` line cut in half (not JSON, skipped and
    counted in ``badLines``): its result comes in as an orphan (``orphanResults``), in neither tool count."""
    root = tmp_path / "src"
    dest = root / CLAUDE.parent.name / CLAUDE.name
    dest.parent.mkdir(parents=True)
    raw = CLAUDE.read_bytes().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(raw) if b'"type":"tool_use"' in line)
    raw[cut] = raw[cut][:len(raw[cut]) // 2] + b"\n"
    dest.write_bytes(b"".join(raw))
    with trio.fail_after(120):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "importer", "ui") as c:
            [rep] = (await c.call("import.sessions", {"source": "claude-code", "root": str(root)}))["sessions"]
            assert rep["status"] == "new" and rep["files"][0]["badLines"] == 1, rep
            assert (rep["toolCalls"], rep["toolResults"], rep["orphanResults"]) == (1, 1, 1)
            assert_counts_are_held(rep, await held(c, rep["sessionId"]))


async def export_of(c: HostClient, sid: str, out: Path) -> Path:
    await c.call("session.export", {"sessionId": sid, "format": "jsonl", "outPath": str(out)})
    return out


async def test_a_tool_call_left_out_of_a_pi_host_export_is_not_in_the_tool_counts(tmp_path: Path) -> None:
    """The same for this host's own export: a session with two answered calls, one of them nested too deep
    in the export."""
    call = {"type": "tool_call", "callId": "c1", "name": "bash", "args": {"command": "ls"}, "result": "a b",
            "status": "ok"}
    with trio.fail_after(120):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "importer", "ui") as c:
            sid = str((await c.call("session.create", {}))["id"])
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u0", "list it")})
            for n in (1, 2):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                    f"t{n}", "", role="tool", blocks=[{**call, "callId": f"c{n}"}])})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a0", "done", role="assistant")})
            export = await export_of(c, sid, tmp_path / "export.jsonl")
            damage_line(export, tmp_path / "src" / "export.jsonl", _host_call)
            result = await c.call("import.sessions", {"source": "pi-host", "root": str(tmp_path / "src")})
            [rep] = result["sessions"]
            assert rep["status"] == "new" and rep["skippedBlocks"] == {"message(cannot be written)": 1}, rep
            assert (rep["toolCalls"], rep["toolResults"]) == (1, 1)
            assert_counts_are_held(rep, await held(c, rep["sessionId"]))


async def test_new_records_count_messages_and_checkpoints_not_tombstones(tmp_path: Path) -> None:
    """A pi-host export whose deleted prompt keys archived reply branches carries it content-free, and the import
    writes it with a tombstone line: ``newRecords`` counts the prompt once (a message), as ``newMessages`` does;
    a re-import of a copy missing its end (then the whole export) adds the rest and counts it the same way."""
    with trio.fail_after(120):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "importer", "ui") as c:
            sid = str((await c.call("session.create", {}))["id"])
            for mid, text, role in (("u0", "intro", "user"), ("a0", "hello", "assistant"),
                                    ("u1", "the prompt", "user"), ("a1", "reply one", "assistant")):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(mid, text, role=role)})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a2", "reply two",
                                                                                    role="assistant")})
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "u1"})
            export = await export_of(c, sid, tmp_path / "export.jsonl")
            lines = [json.loads(line) for line in export.read_bytes().splitlines()]
            body = [r for r in lines if r["type"] == "message"]
            assert [r["id"] for r in body] == ["u0", "a0", "u1", "a2"] and body[2].get("deleted") is True

            result = await c.call("import.sessions", {"source": "pi-host", "root": str(export)})
            [rep] = result["sessions"]
            copy = rep["sessionId"]
            page = await c.call("session.get", {"sessionId": copy})
            assert [(m["id"], bool(m.get("deleted"))) for m in page["messages"]] \
                == [(f"{copy}:u0", False), (f"{copy}:a0", False), (f"{copy}:u1", True), (f"{copy}:a2", False)]
            assert (rep["status"], rep["newMessages"], rep["newRecords"]) == ("new", 4, 4), rep
            assert result["newMessages"] == 4

    # the same prompt reached by a re-import (on another host): a first copy holds the export up to before it
    head = tmp_path / "grown" / "export.jsonl"
    head.parent.mkdir()
    raw = export.read_bytes().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(raw) if b'"id":"u1"' in line)
    head.write_bytes(b"".join(raw[:cut]))
    with trio.fail_after(120):
        async with inprocess_host(tmp_path / "other") as host, client_for(host, "importer", "ui") as c:
            first = (await c.call("import.sessions", {"source": "pi-host", "root": str(head)}))["sessions"][0]
            assert (first["status"], first["newMessages"], first["newRecords"]) == ("new", 2, 2), first
            head.write_bytes(export.read_bytes())
            grown = (await c.call("import.sessions", {"source": "pi-host", "root": str(head)}))["sessions"][0]
            assert (grown["status"], grown["newMessages"], grown["newRecords"]) == ("updated", 2, 2), grown
            page = await c.call("session.get", {"sessionId": grown["sessionId"]})
            assert [bool(m.get("deleted")) for m in page["messages"]] == [False, False, True, False]


def _attachment_blocks(value: Any) -> int:
    """Attachment blocks in a message's blocks, those in a tool call's result included."""
    n = 0
    for block in value if isinstance(value, list) else ():
        if isinstance(block, dict) and block.get("type") == "attachment":
            n += 1
        elif isinstance(block, dict) and block.get("type") == "tool_call":
            n += _attachment_blocks(block.get("result"))
    return n


async def test_a_pi_host_export_counts_the_attachments_and_unpaired_calls_the_session_holds(tmp_path: Path) -> None:
    """A real export of this host: a prompt with an image, a call answered, a call never answered. Its lines are
    then written as a transcript that went on holds them (a call's line before its result's, an unanswered call's
    line twice: ``store.interchange.import_write`` reads the last line of an id as the message).

    Reproduces: ``attachments`` counted the attachments an importer read inline (0 for an export, whose blobs come
    with it, though the session holds one); ``unpairedToolCalls`` counted every line of a call without its result
    (3: the answered call's earlier line and the unanswered call's two lines, for a session holding 1)."""
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    call = {"type": "tool_call", "callId": "c1", "name": "bash", "args": {"command": "ls"}}
    with trio.fail_after(120):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "importer", "ui") as c:
            sid = str((await c.call("session.create", {}))["id"])
            put = await c.call("attachments.put", {"name": "dot.png", "mimeType": "image/png", "dataBase64": png})
            image = {"type": "attachment", "kind": "image", "name": "dot.png", "ref": put["ref"],
                     "mimeType": "image/png", "size": put["size"]}
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                "u0", "", blocks=[{"type": "text", "text": "what is this?"}, image])})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                "t1", "", role="tool", blocks=[{**call, "result": "a b", "status": "ok"}])})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                "t2", "", role="tool", blocks=[{**call, "callId": "c2"}])})
            export = await export_of(c, sid, tmp_path / "export.jsonl")
            lines = export.read_bytes().splitlines(keepends=True)
            out = []
            for line in lines:
                rec = json.loads(line)
                if rec.get("type") == "message" and rec.get("id") == "t1":  # its call written before its result
                    first = {**rec, "blocks": [{k: v for k, v in rec["blocks"][0].items()
                                                if k not in ("result", "status")}]}
                    out.append(json.dumps(first).encode() + b"\n")
                out.append(line)
                if rec.get("type") == "message" and rec.get("id") == "t2":  # written again as it was
                    out.append(line)
            src = tmp_path / "src" / export.name
            src.parent.mkdir()
            src.write_bytes(b"".join(out))
            for name in (p.name for p in export.parent.iterdir() if p.is_dir() and p.name.startswith("export")):
                shutil.copytree(export.parent / name, src.parent / name)
            result = await c.call("import.sessions", {"source": "pi-host", "root": str(src.parent)})
            [rep] = result["sessions"]
            assert rep["status"] == "new", rep
            got = await c.call("session.get", {"sessionId": rep["sessionId"], "full": True})
            held_attachments = sum(_attachment_blocks(m["blocks"]) for m in got["messages"])
            unanswered = sum(1 for m in got["messages"] for b in m["blocks"]
                             if b["type"] == "tool_call" and "result" not in b)
            assert (held_attachments, unanswered) == (1, 1)
            assert (rep["attachments"], rep["unpairedToolCalls"]) == (1, 1), rep
