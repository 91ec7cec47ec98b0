"""Generated conversations rendered in each tool's on-disk format, with the messages an import must produce.

A conversation is a list of events (a user prompt, an assistant response of
thinking/text blocks followed by tool calls with their results, a compaction).
Each renderer writes it the way that tool does and returns the *intended*
host messages as projections: ``(role, ((kind, ...), ...))`` per message and
``(summary, index of the through message)`` per checkpoint.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from store.jsonio import now_rfc3339

BASE_MS = 1_780_000_000_000
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="<#["),
               min_size=1, max_size=40)


@dataclass(frozen=True)
class User:
    text: str


@dataclass(frozen=True)
class Tool:
    name: str
    args: dict[str, Any]
    result: str
    error: bool


@dataclass(frozen=True)
class Response:
    blocks: tuple[tuple[str, str], ...]
    """("text" | "thinking", text) in order."""
    tools: tuple[Tool, ...]


@dataclass(frozen=True)
class Compact:
    summary: str


Event = User | Response | Compact

tools = st.builds(Tool, st.sampled_from(["Bash", "Read", "grep"]),
                  st.dictionaries(st.sampled_from(["path", "command", "n"]), st.one_of(TEXT, st.integers(0, 99)),
                                  max_size=2),
                  TEXT, st.booleans())
responses = st.builds(Response, st.lists(st.tuples(st.sampled_from(["text", "thinking"]), TEXT), max_size=3)
                      .map(tuple), st.lists(tools, max_size=3).map(tuple)).filter(lambda r: r.blocks or r.tools)
events = st.one_of(st.builds(User, TEXT), responses, st.builds(Compact, TEXT))


@st.composite
def conversations(draw: st.DrawFn) -> list[Event]:
    out: list[Event] = [User(draw(TEXT))]
    out.extend(draw(st.lists(events, max_size=8)))
    return out


Proj = tuple[str, tuple[tuple[Any, ...], ...]]


def project_message(record: dict[str, Any]) -> Proj:
    blocks: list[tuple[Any, ...]] = []
    for b in record["blocks"]:
        if b["type"] in ("text", "thinking"):
            blocks.append((b["type"], b["text"]))
        elif b["type"] == "tool_call":
            blocks.append(("tool_call", b["name"], json.dumps(b.get("args"), sort_keys=True), b.get("result"),
                           b.get("status")))
        else:
            blocks.append((b["type"],))
    return record["role"], tuple(blocks)


def expected(conv: list[Event]) -> tuple[list[Proj], list[tuple[str, int]]]:
    """What the host must hold for ``conv`` (the same for every format)."""
    msgs: list[Proj] = []
    comps: list[tuple[str, int]] = []
    for ev in conv:
        if isinstance(ev, User):
            msgs.append(("user", (("text", ev.text),)))
        elif isinstance(ev, Response):
            if ev.blocks:
                msgs.append(("assistant", tuple((k, t) for k, t in ev.blocks)))
            for tool in ev.tools:
                msgs.append(("tool", (("tool_call", tool.name, json.dumps(tool.args, sort_keys=True), tool.result,
                                       "error" if tool.error else "ok"),)))
        elif msgs:
            comps.append((ev.summary, len(msgs) - 1))
    return msgs, comps


def _ts(i: int) -> str:
    return now_rfc3339(BASE_MS + i * 1000)


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"


# --------------------------------------------------------------------------- Claude Code


def claude_code_lines(conv: list[Event], session: str = "gen-cc-session") -> list[bytes]:
    lines: list[bytes] = []
    n = 0
    parent: str | None = None

    def emit(obj: dict[str, Any]) -> None:
        nonlocal n, parent
        uuid = f"u{n:06d}"
        base = {"parentUuid": parent, "isSidechain": False, "userType": "external", "cwd": "/gen/project",
                "sessionId": session, "version": "2.1.0", "uuid": uuid, "timestamp": _ts(n)}
        lines.append(_line({**base, **obj}))
        parent = uuid
        n += 1

    msgs = 0
    for r, ev in enumerate(conv):
        if isinstance(ev, User):
            emit({"type": "user", "message": {"role": "user", "content": ev.text}})
            msgs += 1
        elif isinstance(ev, Response):
            api = f"msg_{r:04d}"
            for kind, text in ev.blocks:
                block = {"type": "text", "text": text} if kind == "text" else {
                    "type": "thinking", "thinking": text, "signature": f"sig-{r}"}
                emit({"type": "assistant", "message": {"id": api, "role": "assistant", "model": "claude-gen",
                                                       "content": [block]}})
            for i, tool in enumerate(ev.tools):
                emit({"type": "assistant", "message": {"id": api, "role": "assistant", "model": "claude-gen",
                                                       "content": [{"type": "tool_use", "id": f"toolu_{r}_{i}",
                                                                    "name": tool.name, "input": tool.args}]}})
            for i, tool in enumerate(ev.tools):
                emit({"type": "user", "message": {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": f"toolu_{r}_{i}", "content": tool.result,
                     "is_error": tool.error}]}})
            msgs += bool(ev.blocks) + len(ev.tools)
        elif msgs:
            emit({"type": "system", "subtype": "compact_boundary", "content": "Conversation compacted",
                  "compactMetadata": {"trigger": "manual", "preTokens": 100 + r}})
            emit({"type": "user", "isCompactSummary": True, "message": {"role": "user", "content": ev.summary}})
    return lines


# --------------------------------------------------------------------------- Codex


def codex_lines(conv: list[Event], session: str = "01900000-0000-7000-8000-00000000c0de") -> list[bytes]:
    lines = [_line({"timestamp": _ts(0), "type": "session_meta",
                    "payload": {"id": session, "timestamp": _ts(0), "cwd": "/gen/project", "cli_version": "0.99.0",
                                "originator": "codex_cli_rs", "model_provider": "openai"}})]
    n = 1

    def emit(kind: str, payload: dict[str, Any]) -> None:
        nonlocal n
        lines.append(_line({"timestamp": _ts(n), "type": kind, "payload": payload}))
        n += 1

    msgs = 0
    for r, ev in enumerate(conv):
        if isinstance(ev, User):
            emit("turn_context", {"cwd": "/gen/project", "model": "gpt-gen"})
            emit("response_item", {"type": "message", "role": "user",
                                   "content": [{"type": "input_text", "text": ev.text}]})
            emit("event_msg", {"type": "user_message", "message": ev.text})
            msgs += 1
        elif isinstance(ev, Response):
            emit("turn_context", {"cwd": "/gen/project", "model": "gpt-gen"})
            for kind, text in ev.blocks:
                if kind == "thinking":
                    emit("response_item", {"type": "reasoning", "summary": [{"type": "summary_text", "text": text}],
                                           "content": None, "encrypted_content": f"enc-{r}"})
                else:
                    emit("response_item", {"type": "message", "role": "assistant",
                                           "content": [{"type": "output_text", "text": text}]})
            for i, tool in enumerate(ev.tools):
                emit("response_item", {"type": "function_call", "name": tool.name,
                                       "arguments": json.dumps(tool.args), "call_id": f"call_{r}_{i}"})
            emit("event_msg", {"type": "token_count", "info": {"last_token_usage": {"input_tokens": r}}})
            for i, tool in enumerate(ev.tools):
                output = json.dumps({"output": tool.result, "metadata": {"exit_code": 1}}) if tool.error \
                    else tool.result
                emit("response_item", {"type": "function_call_output", "call_id": f"call_{r}_{i}",
                                       "output": output})
            msgs += bool(ev.blocks) + len(ev.tools)
        elif msgs:
            emit("compacted", {"message": ev.summary, "replacement_history": []})
    return lines


# --------------------------------------------------------------------------- pi


def pi_lines(conv: list[Event], session: str = "01900000-0000-7000-8000-0000000000p1", version: int = 3,
             detour_after: int | None = None) -> list[bytes]:
    """pi's format; ``detour_after=k`` (v2+) adds an abandoned branch after event ``k`` (two entries that
    the continuing conversation does not descend from: pi's /tree navigation leaves such branches)."""
    header: dict[str, Any] = {"type": "session", "id": session, "timestamp": _ts(0), "cwd": "/gen/project"}
    if version > 1:
        header = {"type": "session", "version": version, **{k: v for k, v in header.items() if k != "type"}}
    lines = [_line(header)]
    n = 1
    parent: str | None = None

    def emit(obj: dict[str, Any]) -> None:
        nonlocal n, parent
        entry: dict[str, Any] = {"type": obj.pop("type")}
        if version > 1:
            entry["id"] = f"e{n:07x}"
            entry["parentId"] = parent
            parent = entry["id"]
        entry["timestamp"] = _ts(n)
        entry.update(obj)
        lines.append(_line(entry))
        n += 1

    emit({"type": "model_change", "provider": "gen", "modelId": "gen-model"})
    msgs = 0
    for r, ev in enumerate(conv):
        if r == detour_after and version > 1:
            resume = parent
            emit({"type": "message", "message": {"role": "user", "content": [{"type": "text", "text": "abandoned"}]}})
            emit({"type": "message", "message": {"role": "assistant", "content": [{"type": "text", "text": "gone"}]}})
            parent = resume
        if isinstance(ev, User):
            emit({"type": "message", "message": {"role": "user", "content": [{"type": "text", "text": ev.text}],
                                                 "timestamp": BASE_MS + n * 1000}})
            msgs += 1
        elif isinstance(ev, Response):
            content: list[dict[str, Any]] = [
                {"type": "text", "text": t} if k == "text" else {"type": "thinking", "thinking": t,
                                                                 "thinkingSignature": f"sig{r}"}
                for k, t in ev.blocks]
            content += [{"type": "toolCall", "id": f"call_{r}_{i}", "name": tool.name, "arguments": tool.args}
                        for i, tool in enumerate(ev.tools)]
            emit({"type": "message", "message": {"role": "assistant", "content": content, "provider": "gen",
                                                 "model": "gen-model", "stopReason": "stop"}})
            for i, tool in enumerate(ev.tools):
                emit({"type": "message", "message": {"role": "toolResult", "toolCallId": f"call_{r}_{i}",
                                                     "toolName": tool.name, "isError": tool.error,
                                                     "content": [{"type": "text", "text": tool.result}]}})
            msgs += bool(ev.blocks) + len(ev.tools)
        elif msgs:
            emit({"type": "compaction", "summary": ev.summary, "firstKeptEntryId": "e0000001", "tokensBefore": 7})
    return lines


# --------------------------------------------------------------------------- opencode


def opencode_docs(conv: list[Event], session: str = "ses_gen0001") -> tuple[dict[str, Any], list[tuple[dict, list]]]:
    info = {"id": session, "title": "generated", "directory": "/gen/project", "projectID": "proj1",
            "version": "1.0.0", "time": {"created": BASE_MS, "updated": BASE_MS}}
    out: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    n = 0

    def ids(prefix: str) -> str:
        nonlocal n
        n += 1
        return f"{prefix}_{n:012d}"

    last_user = ""
    msgs = 0
    for ev in conv:
        if isinstance(ev, User):
            mid = ids("msg")
            last_user = mid
            out.append(({"id": mid, "sessionID": session, "role": "user", "time": {"created": BASE_MS + n}},
                        [{"id": ids("prt"), "type": "text", "text": ev.text}]))
            msgs += 1
        elif isinstance(ev, Response):
            mid = ids("msg")
            parts: list[dict[str, Any]] = [{"id": ids("prt"), "type": "step-start"}]
            for kind, text in ev.blocks:
                parts.append({"id": ids("prt"), "type": "text" if kind == "text" else "reasoning", "text": text,
                              "time": {"start": BASE_MS + n}})
            for i, tool in enumerate(ev.tools):
                state: dict[str, Any] = {"input": tool.args, "time": {"start": BASE_MS + n, "end": BASE_MS + n + 5}}
                state.update({"status": "error", "error": tool.result} if tool.error else
                             {"status": "completed", "output": tool.result, "title": tool.name, "metadata": {}})
                parts.append({"id": ids("prt"), "type": "tool", "callID": f"call_{i}_{n}", "tool": tool.name,
                              "state": state})
            parts.append({"id": ids("prt"), "type": "step-finish", "reason": "stop", "cost": 0,
                          "tokens": {"input": 1, "output": 1, "reasoning": 0, "cache": {"read": 0, "write": 0}}})
            out.append(({"id": mid, "sessionID": session, "role": "assistant", "parentID": last_user,
                         "modelID": "gen-model", "providerID": "gen", "time": {"created": BASE_MS + n},
                         "path": {"cwd": "/gen/project", "root": "/gen/project"}, "cost": 0,
                         "tokens": {"input": 1, "output": 1, "reasoning": 0, "cache": {"read": 0, "write": 0}}},
                        parts))
            msgs += bool(ev.blocks) + len(ev.tools)
        elif msgs:
            req = ids("msg")
            out.append(({"id": req, "sessionID": session, "role": "user", "time": {"created": BASE_MS + n}},
                        [{"id": ids("prt"), "type": "compaction", "auto": False}]))
            mid = ids("msg")
            out.append(({"id": mid, "sessionID": session, "role": "assistant", "summary": True, "parentID": req,
                         "modelID": "gen-model", "providerID": "gen", "time": {"created": BASE_MS + n}},
                        [{"id": ids("prt"), "type": "text", "text": ev.summary}]))
    return info, out


def write_opencode_json(root: Path, info: dict[str, Any], messages: list[tuple[dict, list]]) -> Path:
    storage = root / "storage"
    (storage / "session" / info["projectID"]).mkdir(parents=True, exist_ok=True)
    (storage / "session" / info["projectID"] / f"{info['id']}.json").write_text(json.dumps(info))
    for msg, parts in messages:
        (storage / "message" / info["id"]).mkdir(parents=True, exist_ok=True)
        (storage / "message" / info["id"] / f"{msg['id']}.json").write_text(json.dumps(msg))
        (storage / "part" / msg["id"]).mkdir(parents=True, exist_ok=True)
        for part in parts:
            doc = {**part, "sessionID": info["id"], "messageID": msg["id"]}
            (storage / "part" / msg["id"] / f"{part['id']}.json").write_text(json.dumps(doc))
    return root


OPENCODE_DDL = """
CREATE TABLE session (id TEXT PRIMARY KEY, project_id TEXT, parent_id TEXT, slug TEXT, directory TEXT, title TEXT,
  version TEXT, time_created INTEGER, time_updated INTEGER);
CREATE TABLE message (id TEXT PRIMARY KEY, session_id TEXT NOT NULL, time_created INTEGER, time_updated INTEGER,
  data TEXT NOT NULL);
CREATE TABLE part (id TEXT PRIMARY KEY, message_id TEXT NOT NULL, session_id TEXT NOT NULL, time_created INTEGER,
  time_updated INTEGER, data TEXT NOT NULL);
"""


def write_opencode_db(path: Path, info: dict[str, Any], messages: list[tuple[dict, list]]) -> Path:
    conn = sqlite3.connect(path)
    try:
        if not conn.execute("SELECT name FROM sqlite_master WHERE name = 'session'").fetchone():
            conn.executescript(OPENCODE_DDL)
        conn.execute("INSERT OR REPLACE INTO session VALUES (?,?,?,?,?,?,?,?,?)",
                     (info["id"], info["projectID"], None, "gen", info["directory"], info["title"], info["version"],
                      info["time"]["created"], info["time"]["updated"]))
        for msg, parts in messages:
            data = {k: v for k, v in msg.items() if k not in ("id", "sessionID")}
            conn.execute("INSERT OR REPLACE INTO message VALUES (?,?,?,?,?)",
                         (msg["id"], info["id"], msg["time"]["created"], msg["time"]["created"], json.dumps(data)))
            for part in parts:
                pdata = {k: v for k, v in part.items() if k != "id"}
                conn.execute("INSERT OR REPLACE INTO part VALUES (?,?,?,?,?,?)",
                             (part["id"], msg["id"], info["id"], 0, 0, json.dumps(pdata)))
        conn.commit()
    finally:
        conn.close()
    return path
