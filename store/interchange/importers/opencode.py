"""opencode sessions, in either of opencode's storage layouts (``~/.local/share/opencode``).

* JSON files (opencode before its SQLite storage)::

      storage/session/<projectID>/<sessionID>.json   session info (id, title, directory, parentID, time)
      storage/message/<sessionID>/<messageID>.json   message info (role, time, modelID, tokens, ...)
      storage/part/<messageID>/<partID>.json         message parts (text, reasoning, tool, file, ...)

* SQLite ``opencode.db``: tables ``session`` (id, directory, title, parent_id,
  time_created, ...), ``message`` (id, session_id, time_created, data) and
  ``part`` (id, message_id, session_id, data), ``data`` holding the same JSON
  as the files without the ids. The database is opened read-only.

Message and part ids sort by creation time (opencode orders them by id). What
becomes what: a user message's ``text`` parts (``ignored`` ones dropped) and
``file`` parts (inline ``data:`` URLs stored as attachments, ``file://`` URLs
referenced by path) → a user message; an assistant message's ``reasoning``
(→ ``thinking``) and ``text`` parts up to a ``tool`` part → an assistant
message, each ``tool`` part → a ``tool`` message (``state.status``
``completed`` → ``ok`` with ``output``, ``error`` → ``error``; pending or
running → no result); an assistant message with ``summary: true`` (the reply
to a ``compaction`` part, ``auto`` in its details) → a compaction checkpoint (its reasoning as
``details.thinking``, its usage as ``details.usage`` / ``usageRaw``, counted
by ``usage.*`` like a reply's). Step, snapshot, patch and retry parts are
counted as skipped. A session spawned by a ``task`` tool (``parentID``)
imports as a session of its own, linked both ways: the parent's ``task`` record
has ``meta.childSessionId`` (the child's host id), the child's origin history
``spawnedBy`` (the parent's host id, the ``task`` call's id and
``subagent_type``), served as ``spawnedBy`` with the session.

Usage goes on the first record an assistant message produces (its text, or
its first tool call when it only called tools), once. A ``synthetic`` text
part (opencode's own words in a user message: "The following tool was
executed by the user", a file read for an ``@`` mention) keeps
``synthetic: true`` on its text block. A pending revert (``session.revert``:
opencode hides that message and every later one until the next prompt
deletes them, or ``unrevert`` brings them back) is followed: the hidden
messages are not imported (counted as ``offBranch``); a message imported
before the revert stays (an import never deletes).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import orjson

from store.interchange.importers.common import (
    Emitter,
    FileReport,
    ParseContext,
    Parsed,
    Refused,
    SessionMeta,
    SessionReport,
    Slot,
    SourceUnit,
    finalize,
    join_id,
    json_value_ok,
    message_record,
    parse_object,
    read_json_file,
    session_id_for,
    stamp,
    text_block,
    to_ms,
)
from store.interchange.importers.usage_shape import normalize_usage

SOURCE = "opencode"
SKIPPED_PARTS = frozenset({"step-start", "step-finish", "snapshot", "patch", "retry", "agent"})
_DATA_URL = re.compile(r"^data:([\w.+/-]{1,100});base64,", re.ASCII)
MAX_DOC_BYTES = 32 * 1024 * 1024


def discover(root: Path) -> Iterator[SourceUnit]:
    """Sessions of an opencode data folder (``opencode.db``, or the older ``storage/`` JSON layout),
    or of one database file. The XDG data home (``~/.local/share``, ``XDG_DATA_HOME``) is read as its
    ``opencode/`` folder."""
    if root.is_dir() and not _holds_sessions(root) and _holds_sessions(root / "opencode"):
        root = root / "opencode"
    seen: set[str] = set()
    db = root if root.is_file() else root / "opencode.db"
    if db.is_file():
        for sid in _db_sessions(db):
            seen.add(sid)
            yield SourceUnit(SOURCE, sid, (db,), (("layout", "sqlite"), ("db", str(db)), ("session", sid)))
    if root.is_file():
        return
    storage = root / "storage" if (root / "storage").is_dir() else root
    for info in sorted((storage / "session").glob("*/*.json")):
        doc = read_json_file(info, MAX_DOC_BYTES)
        raw = doc.get("id") if doc is not None else None
        sid = raw if isinstance(raw, str) and raw else info.stem
        if sid in seen:
            continue
        seen.add(sid)
        yield SourceUnit(SOURCE, sid, (info,), (("layout", "json"), ("storage", str(storage)), ("session", sid)))


def _holds_sessions(folder: Path) -> bool:
    return (folder / "opencode.db").is_file() or (folder / "storage" / "session").is_dir() or (
        folder / "session").is_dir()


def _connect(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)


def _db_sessions(db: Path) -> list[str]:
    try:
        conn = _connect(db)
    except sqlite3.Error:
        return []
    try:
        return [r[0] for r in conn.execute("SELECT id FROM session ORDER BY time_created, id")
                if isinstance(r[0], str)]
    except sqlite3.Error:
        return []
    finally:
        conn.close()


def fingerprint(unit: SourceUnit) -> str | None:
    """A digest of everything the session is made of, so an unchanged session is skipped unparsed.

    The database holds every session, so its file fingerprint changes with any of them: the digest
    covers this session's rows instead (the session row, each message's and part's id and data). The
    JSON layout's digest covers the name, size and mtime of the session's info, message and part
    files. None when the source cannot be read (then it is parsed, and refused there).
    """
    digest = hashlib.sha256()

    def add(*values: object) -> None:
        for value in values:
            data = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")
            digest.update(len(data).to_bytes(8, "big"))
            digest.update(data)

    add(*sorted((spawn_call(unit) or {}).items()))  # the parent's task call may name the child later

    if unit.loc("layout") == "sqlite":
        try:
            conn = _connect(Path(unit.loc("db")))
        except sqlite3.Error:
            return None
        try:
            add(*(conn.execute("SELECT * FROM session WHERE id = ?", (unit.external_id,)).fetchone() or ()))
            for row in conn.execute(
                    "SELECT m.id, m.time_created, m.data, p.id, p.data FROM message m LEFT JOIN part p "
                    "ON p.message_id = m.id WHERE m.session_id = ? ORDER BY m.time_created, m.id, p.id",
                    (unit.external_id,)):
                add(*row)
        except sqlite3.Error:
            return None
        finally:
            conn.close()
        return digest.hexdigest()
    storage = Path(unit.loc("storage"))
    try:
        paths = [unit.files[0]]
        for message in sorted((storage / "message" / unit.external_id).glob("*.json")):
            paths.append(message)
            paths.extend(sorted((storage / "part" / message.stem).glob("*.json")))
        for path in paths:
            st = path.stat()
            add(str(path), st.st_size, st.st_mtime_ns)
    except OSError:
        return None
    return digest.hexdigest()


def spawn_call(unit: SourceUnit) -> dict[str, str] | None:
    """The parent's ``task`` call that spawned this (child) session: ``toolCallId`` (its ``callID``) and
    ``agentName`` (its ``subagent_type``), found by the part whose ``state.metadata.sessionId`` is this
    session; None for a session the user started, or when the parent holds no such call."""
    try:
        if unit.loc("layout") == "sqlite":
            conn = _connect(Path(unit.loc("db")))
            try:
                row = conn.execute("SELECT parent_id FROM session WHERE id = ?", (unit.external_id,)).fetchone()
                if row is None or not isinstance(row[0], str) or not row[0]:
                    return None
                parts: Iterable[object] = [r[0] for r in conn.execute(
                    "SELECT data FROM part WHERE session_id = ? AND instr(data, ?) > 0 ORDER BY id",
                    (row[0], unit.external_id))]
            finally:
                conn.close()
        else:
            storage = Path(unit.loc("storage"))
            info = read_json_file(unit.files[0], MAX_DOC_BYTES)
            parent = info.get("parentID") if info is not None else None
            if not isinstance(parent, str) or not parent:
                return None
            parts = _json_parts(storage, parent)
        for data in parts:
            found = _spawning_part(data, unit.external_id)
            if found is not None:
                return found
    except (sqlite3.Error, OSError):
        return None
    return None


def _json_parts(storage: Path, session: str) -> Iterator[bytes]:
    """The part files of a session's messages (JSON layout), one at a time."""
    for message in sorted((storage / "message" / session).glob("*.json")):
        for path in sorted((storage / "part" / message.stem).glob("*.json")):
            if path.stat().st_size <= MAX_DOC_BYTES:
                yield path.read_bytes()


def _json_object(data: str | bytes) -> dict[str, Any] | None:
    """A JSON column as a source line is read (:func:`parse_object`: a lone surrogate escape, which
    opencode's JavaScript writes for half of a split pair, reads as U+FFFD)."""
    return parse_object(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))


def _spawning_part(data: object, child: str) -> dict[str, str] | None:
    """``{toolCallId?, agentName?}`` of a ``task`` part whose ``state.metadata.sessionId`` is ``child``."""
    if not isinstance(data, (str, bytes)) or child.encode() not in (
            data.encode() if isinstance(data, str) else data):
        return None
    part = _json_object(data)
    if part is None:
        return None
    state = part.get("state")
    md = state.get("metadata") if isinstance(state, Mapping) else None
    if not isinstance(md, Mapping) or md.get("sessionId") != child:
        return None
    out: dict[str, str] = {}
    if isinstance(part.get("callID"), str) and part["callID"]:
        out["toolCallId"] = part["callID"]
    args = state.get("input") if isinstance(state, Mapping) else None
    agent = args.get("subagent_type") if isinstance(args, Mapping) else None
    if isinstance(agent, str) and agent:
        out["agentName"] = agent[:200]
    return out


def parse(unit: SourceUnit, ctx: ParseContext) -> Parsed:
    sid = unit.session_id
    meta = SessionMeta(SOURCE, unit.external_id, sid)
    report = SessionReport(SOURCE, unit.external_id, sid)
    report.content_fingerprint = fingerprint(unit) or ""  # before reading: a change while parsing re-reads
    file = FileReport(str(unit.files[0]))
    report.files.append(file)
    conv = _Converter(ctx, meta, report, file, sid)
    conv.spawn_call = spawn_call(unit)
    if unit.loc("layout") == "sqlite":
        source: Iterator[tuple[Mapping[str, Any], list[Mapping[str, Any]]]] = _db_messages(unit, conv)
    else:
        source = _json_messages(unit, conv)
    return Parsed(meta, report, finalize(conv.run(source), report, ctx.limits))


def _json_messages(unit: SourceUnit, conv: _Converter) -> Iterator[tuple[Mapping[str, Any], list[Mapping[str, Any]]]]:
    storage = Path(unit.loc("storage"))
    info = conv.read_doc(unit.files[0])
    if info is None:
        raise Refused("NOT_A_SESSION_FILE", f"{unit.files[0]} is not an opencode session")
    conv.session(info)
    for path in sorted((storage / "message" / unit.external_id).glob("*.json")):
        message = conv.read_doc(path)
        if message is None:
            continue
        raw = message.get("id")
        mid = raw if isinstance(raw, str) and raw else path.stem
        parts: list[Mapping[str, Any]] = [
            p for p in (conv.read_doc(q) for q in sorted((storage / "part" / mid).glob("*.json"))) if p is not None]
        yield message, parts


def _db_messages(unit: SourceUnit, conv: _Converter) -> Iterator[tuple[Mapping[str, Any], list[Mapping[str, Any]]]]:
    try:
        conn = _connect(Path(unit.loc("db")))
    except sqlite3.Error as exc:
        raise Refused("READ_ERROR", f"cannot open {unit.loc('db')}: {exc}") from None
    try:
        cur = conn.execute("SELECT * FROM session WHERE id = ?", (unit.external_id,))
        row = cur.fetchone()
        if row is None:
            raise Refused("NOT_FOUND", f"session {unit.external_id} is not in {unit.loc('db')}")
        names = [d[0] for d in cur.description]
        info = dict(zip(names, row, strict=True))
        conv.session({"id": info.get("id"), "title": info.get("title"), "directory": info.get("directory"),
                      "parentID": info.get("parent_id"), "version": info.get("version"),
                      "time": {"created": info.get("time_created"), "updated": info.get("time_updated")},
                      "revert": conv.load_optional(info.get("revert"))})
        rows = conn.execute(
            "SELECT m.id, m.data, p.id, p.data FROM message m LEFT JOIN part p ON p.message_id = m.id "
            "WHERE m.session_id = ? ORDER BY m.time_created, m.id, p.id", (unit.external_id,))
        current: dict[str, Any] | None = None
        parts: list[Mapping[str, Any]] = []
        for mid, mdata, pid, pdata in rows:
            if current is None or current.get("id") != mid:
                if current is not None:
                    yield current, parts
                current = {**(conv.load(mdata) or {}), "id": mid}
                parts = []
            if pid is not None:
                part = conv.load(pdata)
                if part is not None:
                    parts.append({**part, "id": pid})
        if current is not None:
            yield current, parts
    except sqlite3.Error as exc:
        raise Refused("READ_ERROR", f"cannot read {unit.loc('db')}: {exc}") from None
    finally:
        conn.close()


class _Converter:
    def __init__(self, ctx: ParseContext, meta: SessionMeta, report: SessionReport, file: FileReport,
                 sid: str) -> None:
        self.ctx, self.meta, self.report, self.file, self.sid = ctx, meta, report, file, sid
        self.emitter = Emitter(ctx.limits, report)
        self.compaction_through: str | None = None
        self.compaction_pending = False
        self.compaction_auto = False
        """The ``compaction`` part's ``auto``: opencode compacted by itself (context full), not on request."""
        self.revert_at: str | None = None
        """``session.revert.messageID``: opencode hides this message and every later one (a pending revert)."""
        self.reverted = False
        self.usage_placed = False
        """Whether the current assistant message's usage went on a record already (once per message)."""
        self.spawn_call: dict[str, str] | None = None
        """A child session's spawning ``task`` call in its parent (``toolCallId``, ``agentName``)."""

    # ------------------------------------------------------------------ reading
    def read_doc(self, path: Path) -> dict[str, Any] | None:
        self.file.lines += 1
        try:
            doc = read_json_file(path, self.ctx.limits.max_line_bytes)
        except OSError:
            doc = None
        if doc is None:
            self.file.bad_lines += 1
        return doc

    def load(self, data: object) -> dict[str, Any] | None:
        self.file.lines += 1
        if isinstance(data, (bytes, str)) and len(data) <= self.ctx.limits.max_line_bytes:
            value = _json_object(data)
            if value is not None:
                return value
        self.file.bad_lines += 1
        return None

    def load_optional(self, data: object) -> dict[str, Any] | None:
        """A JSON column that may be NULL (``session.revert``); not counted as a line."""
        if not isinstance(data, (bytes, str)) or len(data) > self.ctx.limits.max_line_bytes:
            return None
        return _json_object(data)

    def session(self, info: Mapping[str, Any]) -> None:
        revert = info.get("revert")
        if isinstance(revert, Mapping) and isinstance(revert.get("messageID"), str) and revert["messageID"]:
            self.revert_at = revert["messageID"]
        self.meta.offer_title(info.get("title"), 0)
        if isinstance(info.get("directory"), str) and info["directory"]:
            self.meta.cwd = info["directory"]
        time = info.get("time")
        if isinstance(time, Mapping):
            self.meta.saw_time(to_ms(time.get("created")))
            self.meta.saw_time(to_ms(time.get("updated")))
        if isinstance(info.get("parentID"), str) and info["parentID"]:
            self.meta.history["parentSessionId"] = info["parentID"]
            link = {"sessionId": session_id_for(SOURCE, info["parentID"])}
            link.update(self.spawn_call or {})
            self.meta.history["spawnedBy"] = link
        version = info.get("version")
        self.meta.label = f"opencode {version}"[:80] if isinstance(version, str) else "opencode"

    # ------------------------------------------------------------------ messages
    def run(self, messages: Iterable[tuple[Mapping[str, Any], list[Mapping[str, Any]]]]) -> Iterator[Slot]:
        for message, parts in messages:
            self.file.record_types[f"message/{message.get('role')}"] += 1
            for part in parts:
                self.file.record_types[f"part/{part.get('type')}"] += 1
            self.reverted = self.reverted or (self.revert_at is not None and message.get("id") == self.revert_at)
            if self.reverted:
                self.report.off_branch += 1
                continue
            self.message(message, parts)
            yield from self.emitter.ready()
        yield from self.emitter.finish()

    def message(self, message: Mapping[str, Any], parts: list[Mapping[str, Any]]) -> None:
        mid = message.get("id")
        if not isinstance(mid, str) or not mid:
            self.file.unknown["message(no id)"] += 1
            return
        time = message.get("time")
        ts = to_ms(time.get("created")) if isinstance(time, Mapping) else None
        self.meta.saw_time(ts)
        role = message.get("role")
        if role == "user":
            self.user(mid, ts, parts)
        elif role == "assistant":
            if message.get("summary") is True:
                self.summary(message, mid, ts, parts)
            else:
                self.assistant(message, mid, ts, parts)
        else:
            self.file.unknown[f"message/{role}"] += 1

    def user(self, mid: str, ts: int | None, parts: list[Mapping[str, Any]]) -> None:
        msg_id = join_id(self.sid, mid)
        blocks: list[dict[str, Any]] = []
        for part in parts:
            kind = part.get("type")
            if kind == "text" and isinstance(part.get("text"), str):
                if part.get("ignored") is not True:
                    block = text_block(part["text"])
                    if part.get("synthetic") is True:
                        block["synthetic"] = True  # opencode's own words (a shell run, a file read), not the user's
                    blocks.append(block)
            elif kind == "file":
                att = self.file_part(part, msg_id)
                if att is not None:
                    blocks.append(att)
            elif kind == "compaction":
                self.compaction_pending = True
                self.compaction_through = self.emitter.last_message_id
                self.compaction_auto = part.get("auto") is True
            elif kind == "subtask" and isinstance(part.get("prompt"), str):
                blocks.append(text_block(part["prompt"]))
            elif kind in SKIPPED_PARTS:
                self.file.skipped[f"part/{kind}"] += 1
            else:
                self.file.unknown[f"part/{kind}"] += 1
        if blocks:
            first = next((b["text"] for b in blocks if b.get("type") == "text" and not b.get("synthetic")), "")
            self.meta.offer_title(first, 5)
            self.emitter.push(message_record(msg_id, "user", ts, blocks))

    def file_part(self, part: Mapping[str, Any], msg_id: str) -> dict[str, Any] | None:
        url = part.get("url")
        raw_mime, raw_name = part.get("mime"), part.get("filename")
        mime = raw_mime if isinstance(raw_mime, str) and raw_mime else "application/octet-stream"
        name = raw_name if isinstance(raw_name, str) and raw_name else "file"
        kind = "image" if mime.startswith("image/") else "file"
        if not isinstance(url, str):
            self.report.skipped_blocks["file(no url)"] += 1
            return None
        if (match := _DATA_URL.match(url)) is not None:
            payload = url[match.end():]
            if len(payload) * 3 // 4 > self.ctx.limits.max_image_bytes:
                self.report.skipped_blocks["file(too large)"] += 1
                return None
            try:
                data = base64.b64decode(payload, validate=True)
            except (binascii.Error, ValueError):
                self.report.skipped_blocks["file(bad base64)"] += 1
                return None
            blob = self.ctx.blobs.add(data, match.group(1), msg_id)
            return {"type": "attachment", "kind": kind, "name": name, "ref": blob.ref, "mimeType": blob.mime_type,
                    "size": blob.size}
        parsed = urlparse(url)
        if parsed.scheme == "file" and parsed.path.startswith("/"):
            return {"type": "attachment", "kind": kind, "name": name, "ref": unquote(parsed.path), "mimeType": mime}
        self.report.skipped_blocks[f"file({parsed.scheme or 'relative'})"] += 1
        return None

    def assistant(self, message: Mapping[str, Any], mid: str, ts: int | None, parts: list[Mapping[str, Any]]) -> None:
        meta: dict[str, Any] = {}
        for src, dst in (("modelID", "modelId"), ("providerID", "providerId"), ("tokens", "usage"), ("cost", "cost"),
                         ("finish", "stopReason"), ("agent", "agent")):
            value = message.get(src)
            if value is not None and json_value_ok(value):
                meta[dst] = value
        error = message.get("error")
        if isinstance(error, Mapping):
            meta["error"] = dict(error)
        if isinstance(message.get("modelID"), str):
            models = self.meta.history.setdefault("modelIds", [])
            if message["modelID"] not in models and len(models) < 20:
                models.append(message["modelID"])
        path = message.get("path")
        if self.meta.cwd is None and isinstance(path, Mapping) and isinstance(path.get("cwd"), str):
            self.meta.cwd = path["cwd"]
        group: Slot | None = None
        emitted = False
        self.usage_placed = False
        for part in parts:
            kind = part.get("type")
            block: dict[str, Any] | None = None
            if kind == "text" and isinstance(part.get("text"), str):
                if part.get("ignored") is not True:
                    block = text_block(part["text"])
            elif kind == "reasoning" and isinstance(part.get("text"), str):
                block = {"type": "thinking", "text": part["text"]}
                md = part.get("metadata")
                if isinstance(md, Mapping) and md and json_value_ok(md) and len(orjson.dumps(md)) <= \
                        self.ctx.limits.max_replay_chars:
                    block["replay"] = dict(md)
            elif kind == "tool":
                group = None
                self.tool(part, ts, meta)
                emitted = True
                continue
            elif kind in SKIPPED_PARTS:
                self.file.skipped[f"part/{kind}"] += 1
                continue
            else:
                self.file.unknown[f"part/{kind}"] += 1
                continue
            if block is None:
                continue
            if group is None:
                gid = join_id(self.sid, mid if not emitted else part.get("id") or f"{mid}.{len(self.emitter)}")
                group = self.emitter.push(message_record(gid, "assistant", ts, [], meta=self.take_meta(meta)))
                emitted = True
            group.record["blocks"].append(block)
        if not emitted and "error" in meta:
            self.emitter.push(message_record(join_id(self.sid, mid), "assistant", ts, [], meta=self.take_meta(meta)))

    def take_meta(self, meta: Mapping[str, Any]) -> dict[str, Any]:
        """The message's meta for the next record it produces: usage and cost on the first one only, so
        ``usage.*`` counts each response once (a reply that starts with a tool call keeps it on that call)."""
        if self.usage_placed:
            return {k: v for k, v in meta.items() if k not in ("usage", "cost")}
        self.usage_placed = True
        return dict(meta)

    def tool(self, part: Mapping[str, Any], ts: int | None, meta: Mapping[str, Any]) -> None:
        pid = part.get("id")
        call_id = part.get("callID") if isinstance(part.get("callID"), str) and part.get("callID") else pid
        name = part.get("tool") if isinstance(part.get("tool"), str) and part.get("tool") else "unknown"
        state = part.get("state")
        state = state if isinstance(state, Mapping) else {}
        args = state.get("input") if json_value_ok(state.get("input")) else None
        block: dict[str, Any] = {"type": "tool_call", "callId": str(call_id), "name": name, "args": args}
        if isinstance(state.get("title"), str) and state["title"]:
            block["title"] = state["title"]  # what opencode shows for the call ("a subagent fixture", a path)
        status = state.get("status")
        times = state.get("time")
        times = times if isinstance(times, Mapping) else {}
        start, end = to_ms(times.get("start")), to_ms(times.get("end"))
        if status in ("completed", "error"):
            if status == "completed":
                output = state.get("output")
                block["result"] = output if isinstance(output, str) else (output if json_value_ok(output) else None)
                block["status"] = "ok"
            else:
                block["result"] = state.get("error") if isinstance(state.get("error"), str) else ""
                block["status"] = "error"
            if end is not None:
                block["completedAt"] = stamp(end)
                if start is not None and end >= start:
                    block["durationMs"] = end - start
        else:
            self.report.unpaired_tool_calls += 1
        md = state.get("metadata")
        child = md.get("sessionId") if isinstance(md, Mapping) else None
        record_meta: dict[str, Any] = self.take_meta(meta) if not self.usage_placed and "usage" in meta else {}
        if isinstance(child, str) and child:
            record_meta["childSessionExternalId"] = child
            record_meta["childSessionId"] = session_id_for(SOURCE, child)
        self.emitter.push(message_record(join_id(self.sid, pid if isinstance(pid, str) and pid else call_id), "tool",
                                         start or ts, [block], tool_name=name, meta=record_meta))

    def summary(self, message: Mapping[str, Any], mid: str, ts: int | None, parts: list[Mapping[str, Any]]) -> None:
        text = "\n".join(p["text"] for p in parts if p.get("type") == "text" and isinstance(p.get("text"), str))
        thinking = "\n".join(p["text"] for p in parts
                             if p.get("type") == "reasoning" and isinstance(p.get("text"), str))
        through = self.compaction_through if self.compaction_pending else self.emitter.last_message_id
        self.compaction_pending = False
        if through is None:
            self.report.compactions_dropped += 1
            return
        details: dict[str, Any] = {"retainedTailMode": "completed_turn", "importedFrom": SOURCE,
                                   "auto": self.compaction_auto}
        self.compaction_auto = False
        if thinking:
            details["thinking"] = thinking
        # the summarizing response's usage (opencode counts it in the session's totals): normalised like a
        # message's, with the raw report beside it; the import records a turn row for it
        tokens = message.get("tokens")
        if isinstance(tokens, Mapping) and json_value_ok(tokens):
            usage = normalize_usage(SOURCE, tokens, cost=message.get("cost"))
            details.update({"usage": usage, "usageRaw": dict(tokens)})
            for src, dst in (("modelID", "modelId"), ("providerID", "providerId")):
                if isinstance(message.get(src), str):
                    details[dst] = message[src]
        self.emitter.push({"type": "compaction", "id": join_id(self.sid, "compaction", mid), "summary": text,
                           "throughMessageId": through, "tokensBefore": 0, "retainedTail": [], "createdAt": stamp(ts),
                           "details": details})


__all__ = ["SOURCE", "discover", "fingerprint", "parse"]
