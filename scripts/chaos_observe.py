"""Gather an :class:`~scripts.chaos_checker.Observation` of a running host.

Over the wire: ``session.get`` (``full: true``), ``session.queueList``,
``settings.get`` and ``search.query`` per token. Underneath, read-only: the
index rows and turn / notification rows from SQLite (``mode=ro``), every
transcript through the store's reader, and ``PRAGMA integrity_check``. Call it
while the workload is paused, so the three views describe the same state.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from runtime.client import HostClient, RpcError
from scripts.chaos_checker import ABSENT, TOKEN_RE, Observation, ObservedMessage, ObservedSession
from scripts.chaos_workload import SETTINGS_NS, Worker
from store.errors import StoreError
from store.indexing.database import open_reader
from store.inflight import SUFFIX, read_checkpoint
from store.search.search import search_messages
from store.transcripts.transcript import read_transcript


@dataclass
class ObserveNotes:
    search_via: str = "search.query"
    searched: int = 0
    checked_tokens: set[str] = field(default_factory=set)


def scan_checkpoints(sessions_dir: Path) -> dict[str, str]:
    """message id → session id of every in-flight checkpoint file on disk (before a boot)."""
    found: dict[str, str] = {}
    if not sessions_dir.is_dir():
        return found
    for path in sorted(sessions_dir.glob(f"*{SUFFIX}")):
        try:
            cp = read_checkpoint(path)
        except (StoreError, OSError):
            continue
        if cp is not None:
            found[cp.message_id] = cp.session_id
    return found


def _text(message: dict[str, Any]) -> str:
    return "".join(b.get("text", "") for b in message.get("blocks") or () if isinstance(b, dict)
                   and b.get("type") == "text" and isinstance(b.get("text"), str))


def _db_view(db_path: Path, sids: Sequence[str]) -> dict[str, Any]:
    conn = open_reader(db_path)
    try:
        conn.execute("BEGIN")  # one snapshot for every read below
        rows: dict[str, list[tuple[str, int]]] = {}
        for sid in sids:
            rows[sid] = [(r[0], int(r[1])) for r in conn.execute(
                "SELECT id, seq FROM messages WHERE session_id = ? ORDER BY seq", (sid,))]
        turns = {r[0]: (r[1], r[2]) for r in conn.execute("SELECT id, session_id, status FROM turns")}
        deliveries = {r[0]: {"source": r[1], "target": r[2], "kind": r[3], "key": r[4], "status": r[5],
                             "turnId": r[6], "replyTo": r[7], "notify": bool(r[8])} for r in conn.execute(
            "SELECT id, source_session_id, target_session_id, kind, idempotency_key, status, turn_id, "
            "reply_to_message_id, notify_on_completion FROM session_collaboration_messages")}
        admissions: dict[str, int] = {}
        for smid, count in conn.execute("SELECT session_message_id, COUNT(*) FROM turn_queue "
                                        "WHERE session_message_id IS NOT NULL GROUP BY session_message_id"):
            admissions[str(smid)] = int(count)
        approvals = {r[0]: {"sid": r[1], "requestId": r[2], "status": r[3]} for r in conn.execute(
            "SELECT tool_call_id, session_id, request_id, status FROM approvals WHERE tool_call_id IS NOT NULL")}
        notes: dict[str, int] = {}
        for turn_id, count in conn.execute("SELECT turn_id, COUNT(*) FROM notifications GROUP BY turn_id"):
            notes[str(turn_id)] = int(count)
        conn.execute("COMMIT")
        integrity = "; ".join(str(r[0]) for r in conn.execute("PRAGMA integrity_check"))
        return {"rows": rows, "turns": turns, "notifications": notes, "integrity": integrity,
                "deliveries": deliveries, "admissions": admissions, "approvals": approvals}
    finally:
        conn.close()


def _search_direct(db_path: Path, tokens: Sequence[str]) -> dict[str, list[tuple[str, str]]]:
    conn = open_reader(db_path)
    try:
        out: dict[str, list[tuple[str, str]]] = {}
        for token in tokens:
            res = search_messages(conn, token, limit=50)
            out[token] = [(r["sessionId"], r["messageId"]) for r in res["results"]]
        return out
    finally:
        conn.close()


@dataclass
class _File:
    ids: list[str]
    bad_lines: int
    decisions: dict[str, str]
    """The visible approval decisions: request id → status."""
    messages: list[ObservedMessage]
    """As ``session.get`` would show them (for a session whose ``session.get`` met a damaged record)."""
    title: str | None


def _files(sessions_dir: Path, sids: Sequence[str]) -> dict[str, _File]:
    out: dict[str, _File] = {}
    for sid in sids:
        path = sessions_dir / f"{sid}.jsonl"
        if not path.exists():
            out[sid] = _File([], 0, {}, [], None)
            continue
        t = read_transcript(path)
        shown = {str(d["id"]): str(d.get("status")) for _, d in t.decisions}
        msgs = [ObservedMessage(m.id, str(m.record.get("role")), _text(m.record), pos)
                for pos, m in enumerate(t.messages, start=1)]
        title = str((t.session_info or {}).get("title") or "")  # what a rebuilt index reads back
        out[sid] = _File([m.id for m in t.messages], t.bad_lines, shown, msgs, title)
    return out


def damaged_record(exc: RpcError) -> bool:
    """A read answered CORRUPT_DATA for one damaged record (a JSON column that does not parse: the host keeps
    serving that index, RELIABILITY.md row 7), not for the whole index (``index_corrupt``: the host restarts)."""
    return exc.data_code == "CORRUPT_DATA" and exc.data.get("reason") != "index_corrupt"


async def observe(
    client: HostClient,
    workers: Sequence[Worker],
    data_dir: Path,
    *,
    after_restart: bool,
    leftover: dict[str, str],
    notes: ObserveNotes,
    rng: random.Random,
    search_sample: int | None = 40,
) -> Observation:
    """``search_sample=None`` searches every token; otherwise new tokens plus that many old ones."""
    sids = [w.sid for w in workers]
    sessions: dict[str, ObservedSession] = {}
    gets: dict[str, Any] = {}
    unreadable: dict[str, str] = {}
    """session id → what its ``session.get`` answered: CORRUPT_DATA of a damaged record it shows (an approval
    decision's options): its messages are then observed in its transcript."""
    queues: dict[str, list[str]] = {}
    for sid in sids:
        try:
            gets[sid] = await client.call("session.get", {"sessionId": sid, "full": True})
        except RpcError as exc:
            if exc.data_code == "SESSION_NOT_FOUND":
                continue
            if not damaged_record(exc):
                raise
            gets[sid], unreadable[sid] = None, exc.message
        q = await client.call("session.queueList", {"sessionId": sid})
        queues[sid] = [e.get("idempotencyKey") or e["id"] for e in q["entries"] if not e.get("sessionMessageId")]
    settings: dict[str, Any] = {}
    for w in workers:
        key = f"{w.sid}.k"
        got = await client.call("settings.get", {"ns": SETTINGS_NS, "key": key})
        settings[key] = ABSENT if got.get("updatedAt") is None else got.get("value")
    db = await trio.to_thread.run_sync(_db_view, data_dir / "pi.sqlite", list(gets))
    files = await trio.to_thread.run_sync(_files, data_dir / "sessions", list(gets))
    left = [sid for sid in sids if (data_dir / "sessions" / f"{sid}{SUFFIX}").exists()] if after_restart else []
    all_tokens: list[str] = []
    decisions: dict[str, str] = {}
    for sid, got in gets.items():
        file = files[sid]
        if got is None:
            msgs, title = file.messages, file.title
        else:
            msgs = [ObservedMessage(m["id"], m["role"], _text(m), m.get("seq")) for m in got["messages"]]
            title = got["session"].get("title")
        for m in msgs:
            all_tokens += TOKEN_RE.findall(m.text)
        decisions.update(file.decisions)
        sessions[sid] = ObservedSession(messages=msgs, file_ids=file.ids, index_rows=db["rows"].get(sid, []),
                                        title=title, queue_keys=queues.get(sid, []), bad_lines=file.bad_lines,
                                        unreadable=unreadable.get(sid))
    tokens = sorted(set(all_tokens))
    if search_sample is not None:
        new = [t for t in tokens if t not in notes.checked_tokens]
        old = [t for t in tokens if t in notes.checked_tokens]
        tokens = new + rng.sample(old, min(search_sample, len(old)))
    search = await _search(client, data_dir, tokens, notes)
    notes.checked_tokens.update(tokens)
    titles, lives = await _lifecycles(client, workers)
    return Observation(sessions=sessions, turns=db["turns"], notifications=db["notifications"], settings=settings,
                       search=search, integrity=db["integrity"], leftover_checkpoints=dict(leftover),
                       inflight_left=left, after_restart=after_restart, titles=titles, lives=lives,
                       deliveries=db["deliveries"], admissions=db["admissions"], approvals=db["approvals"],
                       decisions=decisions)


async def _lifecycles(client: HostClient, workers: Sequence[Worker]) -> tuple[dict[str, int], dict[str, list[str]]]:
    """Every session's title (all pages of ``session.list``), and the messages of lifecycle sessions."""
    titles: dict[str, int] = {}
    by_title: dict[str, str] = {}
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 500}
        if cursor:
            params["cursor"] = cursor
        page = await client.call("session.list", params)
        for s in page["sessions"]:
            title = s.get("title") or ""
            titles[title] = titles.get(title, 0) + 1
            by_title[title] = s["id"]
        cursor = page.get("nextCursor")
        if not cursor:
            break
    lives: dict[str, list[str]] = {}
    for w in workers:
        for key in w.lives:
            if titles.get(key) == 1:
                got = await client.call("session.get", {"sessionId": by_title[key], "full": True})
                lives[key] = [m["id"] for m in got["messages"]]
    return titles, lives


async def _search(client: HostClient, data_dir: Path, tokens: Sequence[str],
                  notes: ObserveNotes) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    if notes.search_via == "search.query":
        for token in tokens:
            try:
                res = await client.call("search.query", {"query": token, "limit": 50})
            except RpcError as exc:
                if exc.data_code not in ("METHOD_NOT_FOUND",) and exc.code != -32601:
                    raise
                notes.search_via = "store.search.search (search.query is not registered)"
                break
            out[token] = [(r["sessionId"], r["messageId"]) for r in res["results"]]
    rest = [t for t in tokens if t not in out]
    if rest:
        out.update(await trio.to_thread.run_sync(_search_direct, data_dir / "pi.sqlite", rest))
    notes.searched += len(tokens)
    return out


def sync_queues(workers: Sequence[Worker], obs: Observation, entry_ids: dict[str, dict[str, str]]) -> None:
    """After a verified observation, the workers' queue model follows what the host holds."""
    for w in workers:
        w.queue = dict(entry_ids.get(w.sid, {}))


async def queue_entry_ids(client: HostClient, sids: Sequence[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for sid in sids:
        try:
            q = await client.call("session.queueList", {"sessionId": sid})
        except RpcError:
            continue
        out[sid] = {e["idempotencyKey"]: e["id"] for e in q["entries"]
                    if e.get("idempotencyKey") and not e.get("sessionMessageId")}  # not collab admissions
    return out


__all__ = ["ObserveNotes", "damaged_record", "observe", "queue_entry_ids", "scan_checkpoints", "sync_queues"]
