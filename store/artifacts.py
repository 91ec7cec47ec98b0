"""Artifacts (seed 003 §4.10) and their ``tool_execute`` audit rows (§4.13). SQL only.

A successful Write/Edit tool result — a ``tool_call`` block named Write/Edit
(or any tool whose block, args or message meta declare ``fileEffects``) with
status ok/success and a path in ``args.path``/``args.file_path`` — upserts
``artifacts(session_id, path, op, turn_id, updated_at)`` and appends one
``audit_log`` row of kind ``tool_execute``. :func:`record_effects` is called
by ``store.indexing.index.index_messages`` so both land in the same transaction as the
result's index row.

Paths are stored **absolute and workspace-resolved** (seed 003 §4.10: ``path
-- absolute, workspace-resolved``) by the rule ``session.resolvePath`` uses
(:func:`store.workspace.resolve_under`): a relative path joins the session's
project root the line was written under (``store.transcripts.records.Root``: the
``session_info`` line before it that names one, so a rebuilt index lists a file
where the live index did after the session moved) and is folded lexically,
backslashes become ``/``. A relative path in
a session without a project root names no workspace file: it is audited, not
listed. The scratch exclusion is applied **after** resolution, so a relative
path that lands in the session's scratch directory (``../scratch/<sid>/x``)
is excluded like an absolute one (audited, not listed).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from store.errors import InvalidCursor
from store.fsutil import database_folder
from store.jsonio import Readable, readable, stored_value
from store.revisions import ArchivedLine, parse_revisions
from store.transcripts.records import Root, rfc3339_ms

TOOL_OPS: Mapping[str, str] = {"write": "write", "edit": "edit", "multiedit": "edit", "delete": "delete"}
OPS = ("write", "edit", "delete")
SUCCESS = frozenset({"ok", "success", "succeeded", "completed"})
PATH_KEYS = ("path", "file_path", "filePath")


@dataclass(frozen=True)
class ToolEffect:
    call_id: str | None
    tool: str
    effects: tuple[tuple[str, str], ...]  # (path, op)


def _declared(value: Any) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if not isinstance(value, list):
        return out
    for item in value:
        if isinstance(item, Mapping) and isinstance(item.get("path"), str) and item["path"]:
            op = item.get("op", "write")
            out.append((item["path"], op if op in OPS else "write"))
    return out


def tool_effects(record: Mapping[str, Any]) -> list[ToolEffect]:
    """File effects of the successful tool calls in a message record."""
    blocks = record.get("blocks")
    if not isinstance(blocks, list):
        return []
    raw_meta = record.get("meta")
    meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
    out: list[ToolEffect] = []
    for block in blocks:
        if not isinstance(block, Mapping) or block.get("type") != "tool_call":
            continue
        status = block.get("status")
        if not isinstance(status, str) or status.lower() not in SUCCESS or block.get("isError") is True:
            continue
        name = block.get("name") if isinstance(block.get("name"), str) else record.get("toolName")
        name = name if isinstance(name, str) else ""
        raw_args = block.get("args")
        args: Mapping[str, Any] = raw_args if isinstance(raw_args, Mapping) else {}
        effects = _declared(block.get("fileEffects")) or _declared(args.get("fileEffects"))
        if not effects and len(blocks) == 1:
            effects = _declared(meta.get("fileEffects"))
        op = TOOL_OPS.get(name.lower())
        if not effects and op is not None:
            path = next((args[k] for k in PATH_KEYS if isinstance(args.get(k), str) and args[k]), None)
            if path is not None:
                effects = [(path, op)]
        if effects:
            call_id = block.get("callId") if isinstance(block.get("callId"), str) else None
            out.append(ToolEffect(call_id, name, tuple(effects)))
    return out


def may_have_effects(record: Mapping[str, Any]) -> bool:
    """Cheap pre-check for the append hot path."""
    blocks = record.get("blocks")
    return isinstance(blocks, list) and any(
        isinstance(b, Mapping) and b.get("type") == "tool_call" for b in blocks
    )


def scratch_dir(conn: sqlite3.Connection, session_id: str) -> str | None:
    """``<data dir>/scratch/<session>``, derived from the index file's location (None in memory)."""
    folder = database_folder(conn)
    return None if folder is None else os.path.join(folder, "scratch", session_id)


def _inside(path: str, directory: str | None) -> bool:
    if directory is None:
        return False
    norm = os.path.normpath(path)
    return norm == directory or norm.startswith(directory + os.sep)


def session_root(conn: sqlite3.Connection, session_id: str) -> str | None:
    """The session's project root (``session.resolvePath``'s ``root``), if it has one."""
    row = conn.execute("SELECT p.path FROM sessions s JOIN projects p ON p.id = s.project_id WHERE s.id = ?",
                       (session_id,)).fetchone()
    return str(row[0]) if row is not None and row[0] else None


def _absolute(path: str) -> bool:
    """An absolute path as :func:`resolve_path` gives them (``/…`` or ``X:/…``)."""
    return path.startswith("/") or (len(path) > 2 and path[1] == ":" and path[2] == "/" and path[0].isalpha())


def resolve_path(root: str | None, path: str) -> str | None:
    """``path`` absolute and workspace-resolved against ``root`` (None: it names no workspace file)."""
    # imported here: store.workspace imports the index, which imports this module
    from store.workspace import resolve_under

    if "\x00" in path:
        return None
    if root:
        resolved, _inside_root = resolve_under(root, path)
        return resolved
    p = path.replace("\\", "/")
    if not _absolute(p):
        return None
    resolved, _ = resolve_under("/", p)
    return resolved


_UPSERT_NEWEST: Final = (
    "INSERT INTO artifacts(session_id, path, op, turn_id, updated_at) VALUES (?,?,?,?,?) "
    "ON CONFLICT(session_id, path) DO UPDATE SET op = excluded.op, "
    "turn_id = excluded.turn_id, updated_at = excluded.updated_at "
    "WHERE excluded.updated_at >= artifacts.updated_at"
)
"""A dated line's row: it moves the path's row when it is not older than it."""
_INSERT_UNDATED: Final = (
    "INSERT INTO artifacts(session_id, path, op, turn_id, updated_at) VALUES (?,?,?,?,?) "
    "ON CONFLICT(session_id, path) DO NOTHING"
)
"""An undated line's row: made when the path has none, dated when it is recorded; never moves a row."""


def record_effects(
    conn: sqlite3.Connection,
    session_id: str,
    record: Mapping[str, Any],
    turn_id: str | None,
    now_ms: int,
    *,
    audit: bool = True,
    scratch: str | None = None,
    written_under: Root | None = None,
) -> int:
    """Upsert artifacts (+ one audit row per tool call, unless ``audit=False``: index rebuilds, imports).
    Returns artifacts written.

    A row is dated by its line's ``createdAt``, and a line moves a row only when it is not older than the row: a
    path's row is its newest Write/Edit (the last written of one time), a function of the session's lines, so an
    index rebuilt from the files lists what the live index listed,
    whatever order it reads them in (the live transcript, archived branches, a rewritten header's rows). A line
    with no ``createdAt`` (some imported or older history) is dated ``now_ms``: it moves the row when it is the
    live tool call's success (``audit``), and otherwise (an index rebuild, a reindex, a migration's) only makes
    a row the path lacks, which would otherwise be dated at the boot.
    ``written_under``: the root the line stands under in its transcript (``store.transcripts.records.Root``,
    the rule the live index and a rebuild share); None: the session's root as the index holds it now.
    """
    found = tool_effects(record)
    if not found:
        return 0
    scratch = scratch if scratch is not None else scratch_dir(conn, session_id)
    scratch = os.path.normpath(scratch) if scratch else None
    root = written_under.path if written_under is not None else session_root(conn, session_id)
    dated = rfc3339_ms(record.get("createdAt"))
    at = now_ms if dated is None else dated
    upsert = _UPSERT_NEWEST if dated is not None or audit else _INSERT_UNDATED
    written = 0
    for effect in found:
        resolved = [(p, resolve_path(root, p), op) for p, op in effect.effects]
        kept = [(r, op) for _, r, op in resolved if r is not None and not _inside(r, scratch)]
        for path, op in kept:
            conn.execute(upsert, (session_id, path, op, turn_id, at))
            written += 1
        if audit:
            payload = {"tool": effect.tool, "callId": effect.call_id, "messageId": record.get("id"),
                       "turnId": turn_id, "effects": [_audited(p, r, op, (r, op) in kept) for p, r, op in resolved]}
            conn.execute(
                "INSERT INTO audit_log(ts, kind, session_id, payload_json) VALUES (?, 'tool_execute', ?, ?)",
                (now_ms, session_id, orjson.dumps(payload).decode()),
            )
    return written


def record_archived(conn: sqlite3.Connection, session_id: str, lines: Iterable[ArchivedLine], now_ms: int) -> int:
    """The artifacts of Write/Edit lines that archived branches hold (``store.revisions.RevisionFile.tool_lines``:
    a regenerate, an edit or a branch switch took them out of the transcript, the live index had listed them
    when they were written and kept them): restored as a rebuild restores a live line's (no audit rows, each
    against the root its line stood under, else the session's), so the list answers as the live host did.
    Returns artifacts written."""
    scratch = scratch_dir(conn, session_id)
    written = 0
    for line in lines:
        if may_have_effects(line.record):
            written += record_effects(conn, session_id, line.record, line.turn_id, now_ms, audit=False,
                                      scratch=scratch, written_under=line.root)
    return written


def record_archived_lines(conn: sqlite3.Connection, session_id: str, lines: Sequence[bytes], now_ms: int) -> int:
    """:func:`record_archived` for revisions lines a caller is about to append or has just written whole (an
    import's archived branches and carried rows, an Assistant Edit child's original tail): the copy lists the
    files they produced from its first commit, as an index rebuilt from its files does."""
    if not lines:
        return 0
    parsed = parse_revisions(b"".join(lines), tool_lines=True)
    written = record_archived(conn, session_id, parsed.tool_lines, now_ms)
    return written + restore_carried(conn, session_id, parsed.artifacts.values())


Carried = tuple[str, str | None, int]
"""An artifact row's ``(op, turnId, updatedAt)``."""


def given_back(lines: Iterable[tuple[Mapping[str, Any], Root | None]], session_root: str | None) -> dict[str, Carried]:
    """Path → the row a rebuild makes of these transcript lines (each with the root it stands under, None: the
    session's ``session_root``), by :func:`record_effects`'s rule: a path's newest dated line, the later of one
    time, its turn the line's ``turnId``. A line with no ``createdAt`` gives no row back (a rebuild dates it
    when it runs, not as the live index did); neither does a path the scratch exclusion drops (no row has it)."""
    out: dict[str, Carried] = {}
    for record, root in lines:
        if not may_have_effects(record):
            continue
        at = rfc3339_ms(record.get("createdAt"))
        if at is None:
            continue
        turn = record.get("turnId") if isinstance(record.get("turnId"), str) else None
        under = root.path if root is not None else session_root
        for effect in tool_effects(record):
            for path, op in effect.effects:
                resolved = resolve_path(under, path)
                held = out.get(resolved) if resolved is not None else None
                if resolved is not None and (held is None or at >= held[2]):
                    out[resolved] = (op, turn, at)
    return out


def rows_to_carry(conn: sqlite3.Connection, session_id: str, lines: Sequence[tuple[Mapping[str, Any], Root | None]],
                  carried: Mapping[str, Carried]) -> list[dict[str, Any]]:
    """The session's artifact rows that neither ``lines`` (a rewritten transcript's messages, with their roots)
    nor the rows the revisions file already carries (``carried``: ``store.revisions.RevisionFile.artifacts``,
    as :func:`carried_of` gives them) give back as the index holds them, oldest first: what a rewrite appends to
    the revisions file (``store.revisions.ARTIFACT`` lines) before the transcript loses the lines, so an index
    rebuilt from the files lists every row the live one does (seed 003 §4.10: a row goes only with its session).
    Each row is carried once, when the last line that gave it back leaves (or when the row moved since): a
    later rewrite finds it carried. A row an archived branch's line gives back is carried too (the revisions
    file is not read again for it: one line, once)."""
    rebuilt = given_back(lines, session_root(conn, session_id))
    out: list[dict[str, Any]] = []
    for path, op, turn, at in conn.execute("SELECT path, op, turn_id, updated_at FROM artifacts "
                                           "WHERE session_id = ? ORDER BY updated_at, path", (session_id,)):
        held: Carried = (op, turn, at)
        kept = carried.get(path)
        if kept == held:
            continue
        if rebuilt.get(path) == held and (kept is None or kept[2] < at):  # a carried row of one time would win
            continue
        out.append({"path": path, "op": op, "turnId": turn, "updatedAt": at})
    return out


def session_rows(conn: sqlite3.Connection, session_id: str) -> list[dict[str, Any]]:
    """Every artifact row of the session (``{"path", "op", "turnId", "updatedAt"}``), oldest first (ties by
    path): what a JSONL export carries (``store.interchange.export``)."""
    return [{"path": path, "op": op, "turnId": turn, "updatedAt": at} for path, op, turn, at in conn.execute(
        "SELECT path, op, turn_id, updated_at FROM artifacts WHERE session_id = ? ORDER BY updated_at, path",
        (session_id,))]


def carried_of(rows: Mapping[str, Mapping[str, Any]]) -> dict[str, Carried]:
    """``store.revisions.RevisionFile.artifacts`` as :func:`rows_to_carry` compares them."""
    out: dict[str, Carried] = {}
    for path, row in rows.items():
        turn, at = row.get("turnId"), row.get("updatedAt")
        if isinstance(row.get("op"), str) and (turn is None or isinstance(turn, str)) and isinstance(at, int):
            out[path] = (row["op"], turn, at)
    return out


def restore_carried(conn: sqlite3.Connection, session_id: str, entries: Iterable[Mapping[str, Any]]) -> int:
    """Carried rows, as they were: the revisions file's ``artifact`` lines (:func:`rows_to_carry`, an export's
    that an import wrote there), or an older host's rewritten header's (``store.transcripts.transcript
    .HEADER_ARTIFACTS``). A missing one comes back, an older one moves (as a rebuilt line's does,
    :func:`record_effects`; after the lines, so of one time the carried row, the live index's, wins). An entry
    that is not such a row is skipped. Returns rows written."""
    written = 0
    for entry in entries:
        path, op, turn, at = entry.get("path"), entry.get("op"), entry.get("turnId"), entry.get("updatedAt")
        if (not isinstance(path, str) or not _absolute(path) or "\x00" in path or op not in OPS
                or not (turn is None or isinstance(turn, str))
                or not isinstance(at, int) or isinstance(at, bool) or at < 0):
            continue
        conn.execute(
            "INSERT INTO artifacts(session_id, path, op, turn_id, updated_at) VALUES (?,?,?,?,?) "
            "ON CONFLICT(session_id, path) DO UPDATE SET op = excluded.op, "
            "turn_id = excluded.turn_id, updated_at = excluded.updated_at "
            "WHERE excluded.updated_at >= artifacts.updated_at",
            (session_id, path, op, turn, at),
        )
        written += 1
    return written


def _audited(sent: str, resolved: str | None, op: str, artifact: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"path": resolved if resolved is not None else sent, "op": op, "artifact": artifact}
    if resolved != sent:
        out["requested"] = sent
    return out


# A cursor's key names the last item's path. A path too long for a cursor (a cursor param is at most 512
# characters) is named by a prefix and a digest instead, after a NUL (which no path holds), and found again
# through the (session_id, path) key when the next page is asked for.
_CURSOR_PATH_MAX = 200  # characters of the path as the cursor's JSON spells it (ensure_ascii)
_CURSOR_PREFIX_MAX = 150
_CURSOR_DIGEST = 32


def _digest(path: str) -> str:
    return hashlib.sha256(path.encode("utf-8", "surrogatepass")).hexdigest()[:_CURSOR_DIGEST]


def _spelled(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=True)) - 2


def cursor_path(path: str) -> str:
    """The path as a cursor holds it: itself, or (too long) NUL + digest + a prefix."""
    if _spelled(path) <= _CURSOR_PATH_MAX:
        return path
    prefix = ""
    for ch in path:
        if _spelled(prefix + ch) > _CURSOR_PREFIX_MAX:
            break
        prefix += ch
    return "\x00" + _digest(path) + prefix


def _cursor_path_back(conn: sqlite3.Connection, session_id: str, held: str) -> str:
    """The path a cursor's key names (see :func:`cursor_path`); ``INVALID_CURSOR`` if no row has it any more."""
    if not held.startswith("\x00"):
        return held
    digest, prefix = held[1:1 + _CURSOR_DIGEST], held[1 + _CURSOR_DIGEST:]
    for (path,) in conn.execute("SELECT path FROM artifacts WHERE session_id = ? AND path >= ? ORDER BY path",
                                (session_id, prefix)):
        if not path.startswith(prefix):
            break
        if _digest(path) == digest:
            return str(path)
    raise InvalidCursor("the file this cursor ended on is no longer listed; start again without a cursor",
                        data={"field": "cursor"})


def _artifact(row: Sequence[Any]) -> dict[str, Any]:
    """A listed row; ``DamagedRecord`` when its op is outside :data:`OPS` (the host writes no other)."""
    sid, path, op, turn_id, updated = row
    return {"sessionId": sid, "path": path, "op": stored_value(op, OPS, f"artifact {path}'s op"), "turnId": turn_id,
            "updatedAt": updated}


def list_artifacts(
    conn: sqlite3.Connection, *, session_id: str | None, limit: int, cursor: Sequence[Any] | None
) -> tuple[Readable[dict[str, Any]], list[Any] | None]:
    """Newest ``updated_at`` first (ties by session, path); per session or global. The next cursor's key is
    ``[updatedAt, sessionId, cursor_path(path)]`` of the page's last row. A row whose record is damaged (its op
    outside its set) is named in ``unreadable`` (its path), not listed; the cursor moves past it."""
    where: list[str] = []
    args: list[Any] = []
    if session_id is not None:
        where.append("session_id = ?")
        args.append(session_id)
    if cursor is not None:
        ts, sid, held = cursor
        path = _cursor_path_back(conn, sid, held)
        where.append("(updated_at < ? OR (updated_at = ? AND (session_id < ? OR (session_id = ? AND path < ?))))")
        args += [ts, ts, sid, sid, path]
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    rows = conn.execute(
        f"SELECT session_id, path, op, turn_id, updated_at FROM artifacts {clause} "
        "ORDER BY updated_at DESC, session_id DESC, path DESC LIMIT ?",
        (*args, limit + 1),
    ).fetchall()
    more = len(rows) > limit
    rows = rows[:limit]
    nxt = [rows[-1][4], rows[-1][0], cursor_path(rows[-1][1])] if more and rows else None
    return readable(rows, _artifact, lambda r: str(r[1])), nxt
