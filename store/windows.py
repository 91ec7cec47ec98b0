"""Bounded window reads of one transcript (seed 003 §5): positions, spans, projection.

A window is served from the index's byte spans (``messages.line_offset`` /
``line_len``): one read snapshot for the rows and the compaction chain, then
one sequential read of exactly the window's lines, so opening the newest page
of a 50,000-message session costs what a 50-message one costs. The reply is
encoded in the same call, from the lines' own bytes (``store/window_reply.py``).
Everything here is synchronous and runs in a read-pool thread.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import index
from .jsonio import loads_line
from .reconcile import plan_reconcile
from .records import cap_content, wire_record
from .transcript import read_spans
from .window_reply import encode_window

__all__ = [
    "MAX_COALESCED_READ",
    "Window",
    "WindowRequest",
    "find_tool_call_line",
    "navigation_call_id",
    "navigation_parent",
    "read_cold",
    "read_spans_coalesced",
    "read_warm",
    "window_bounds",
]

MAX_COALESCED_READ = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class WindowRequest:
    """Which window (validated by the wire model: at most one anchor)."""

    before: int | None = None
    start: int | None = None
    limit: int | None = None
    """``None``: the whole transcript."""
    content_limit: int | None = None
    around: str | None = None


@dataclass
class Window:
    total: int = 0
    start: int = 0
    end: int = 0
    target_pos: int | None = None
    missing_target: bool = False
    row: dict[str, Any] | None = None
    plan_kind: str = ""
    file_len: int = 0
    epoch: str | None = None
    reply: bytes = b""
    """The encoded ``session.get`` result (``store/window_reply.py``)."""
    target: dict[str, Any] | None = None
    """The projected ``messageAround`` target."""


def read_spans_coalesced(path: Path, spans: Sequence[tuple[int, int]]) -> list[bytes]:
    """``read_spans``, but ranges that lie back to back in the file are read with one pread.

    Consecutive message lines of an append-only transcript are adjacent, so a
    window (or a whole-session load) is one sequential read of exactly its
    lines instead of one system call per line (seed 003 §11.2). A merged read
    is capped at :data:`MAX_COALESCED_READ` bytes.
    """
    merged: list[tuple[int, int]] = []
    for offset, length in spans:
        if merged:
            last_off, last_len = merged[-1]
            if last_off + last_len == offset and last_len + length <= MAX_COALESCED_READ:
                merged[-1] = (last_off, last_len + length)
                continue
        merged.append((offset, length))
    if len(merged) == len(spans):
        return read_spans(path, spans)
    out: list[bytes] = []
    pieces = iter(spans)
    for (_, total), blob in zip(merged, read_spans(path, merged), strict=True):
        view = memoryview(blob)
        pos = 0
        while pos < total:
            _, length = next(pieces)
            out.append(bytes(view[pos : pos + length]))
            pos += length
    return out


def window_bounds(total: int, req: WindowRequest, target_pos: int | None) -> tuple[int, int]:
    """Physical positions ``[start, end)`` of the window a request asks for (seed §5)."""
    limit = req.limit
    if target_pos is not None:
        lim = limit or 50
        start = max(0, target_pos - lim // 2)
        end = min(total, start + lim)
        return max(0, end - lim), end
    if req.start is not None:
        start = min(req.start, total)
        return start, total if limit is None else min(total, start + limit)
    end = total if req.before is None else max(0, min(req.before, total))
    return (0 if limit is None else max(0, end - limit)), end


def read_warm(conn: sqlite3.Connection, sid: str, path: Path, total: int, req: WindowRequest,
              session: Mapping[str, Any]) -> Window:
    """Target position, bounds, window rows, the compaction chain, and the encoded reply, in one snapshot.

    The bytes are read in the same call (not in a second worker-thread hop):
    the session actor is the transcript's only writer and awaits this call,
    so the offsets cannot move underneath it.
    """
    w = Window(total=total)
    if req.around is not None:
        w.target_pos = index.position_of(conn, sid, req.around)
        if w.target_pos is None:
            w.missing_target = True
            return w
    w.start, w.end = window_bounds(total, req, w.target_pos)
    rows = index.window_spans(conn, sid, w.start, w.end)
    compactions = index.compaction_rows(conn, sid)
    lines = read_spans_coalesced(path, [(c[2], c[3]) for c in compactions]) if compactions else []
    w.reply, w.target = encode_window(path, index.public_session(session), rows, lines, start=w.start, end=w.end,
                                      total=total, content_limit=req.content_limit, target_pos=w.target_pos)
    return w


def read_cold(conn: sqlite3.Connection, sid: str, path: Path, req: WindowRequest) -> Window:
    """First read of an actor: row + clean-file check + window, one snapshot.

    ``plan_kind != "clean"`` (or no row) means the caller must catch the index
    up with the file first; no window is read then.
    """
    conn.execute("BEGIN")
    try:
        row = index.session_row(conn, sid)
        if row is None:
            return Window()
        plan = plan_reconcile(path, row["_indexedLen"], row["_fileEpoch"])
        if plan.kind != "clean" or plan.file_len != row["_indexedLen"]:
            return Window(row=row, plan_kind=plan.kind)
        w = read_warm(conn, sid, path, int(row["messageCount"]), req, row)
        w.row, w.plan_kind, w.file_len, w.epoch = row, plan.kind, plan.file_len, plan.epoch
        return w
    finally:
        conn.execute("ROLLBACK")


def navigation_call_id(target: Mapping[str, Any] | None) -> str | None:
    """The ``parentToolCallId`` of a ``messageAround`` target (a subagent-attributed row), if any."""
    meta = (target or {}).get("meta") or {}
    call_id = meta.get("parentToolCallId") if isinstance(meta, Mapping) else None
    return call_id if isinstance(call_id, str) else None


def navigation_parent(path: Path, call_id: str, content_limit: int | None) -> dict[str, Any] | None:
    """The owning Task row of a nested target, capped like the window (``None`` if absent)."""
    found = find_tool_call_line(path, call_id)
    return None if found is None else cap_content(wire_record(found), content_limit)


def find_tool_call_line(path: Path, call_id: str) -> dict[str, Any] | None:
    """The newest message line holding a ``tool_call`` block with ``callId`` (navigation parent)."""
    needle = call_id.encode()
    found: dict[str, Any] | None = None
    with open(path, "rb") as fh:
        for line in fh:
            if needle not in line or not line.endswith(b"\n"):
                continue
            try:
                rec = loads_line(line)
            except ValueError:
                continue
            if rec.get("type") != "message":
                continue
            for block in rec.get("blocks") or ():
                if isinstance(block, dict) and block.get("type") == "tool_call" and block.get("callId") == call_id:
                    found = rec
    return found
