"""SQL operations on the derived index (sessions, messages, compactions, receipts).

Every function takes a ``sqlite3.Connection`` and runs inside the caller's
transaction (the DB writer wraps each request in a SAVEPOINT). Nothing here
opens files: callers pass parsed transcript records with their byte spans.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, TypeVar

from store import artifacts, attachments, receipts, thread_meta
from store.errors import Conflict, CorruptData, LimitExceeded, SessionNotFound
from store.ids import remapped_message_id
from store.indexing.sql_lists import in_chunks
from store.interchange import origin_history
from store.revisions import SYNC_MARK_NS
from store.rules import TURN_INDEX_LOST, canonical_project_path
from store.session_state import with_projection
from store.transcripts.records import (
    Root,
    blocks_of,
    extract_text,
    rfc3339_ms,
    rfc3339_to_ms,
    searchable,
    tool_info,
)
from store.transcripts.window_reply import describe_line
from store.upgrade.schema import MAX_SEQ, message_mid

T = TypeVar("T")

TOOL_OUTPUT_MAX_CHARS = 65_536
"""A tool row's output is searchable (``scope: "tools"``) up to this many characters."""
_TOOL_OUTPUT_MAX_DEPTH = 8


def tool_output_text(record: Mapping[str, Any]) -> str | None:
    """The searchable output of a tool row (schema v28 ``tool_output``), or None: :func:`tool_output_raw`
    with a NUL stored as U+FFFD (:func:`store.transcripts.records.searchable`, which keeps the length)."""
    raw = tool_output_raw(record)
    return None if raw is None else searchable(raw)


def tool_output_raw(record: Mapping[str, Any]) -> str | None:
    """The output of a tool row as the record holds it (a NUL kept), or None.

    Every string of its blocks' results, in order: a ``tool_call`` block's
    ``result`` (a string, or the strings inside a list/object of content
    parts, e.g. ``[{"type": "text", "text": ...}]``) and ``error``, a
    ``tool_result`` block's ``content``, text blocks; then ``meta.error``.
    Arguments are not output. Cut at ``TOOL_OUTPUT_MAX_CHARS``.
    """
    if record.get("role") != "tool":
        return None
    parts: list[str] = []
    size = 0

    def take(value: Any, depth: int = 0) -> None:
        nonlocal size
        if size >= TOOL_OUTPUT_MAX_CHARS or depth > _TOOL_OUTPUT_MAX_DEPTH:
            return
        if isinstance(value, str):
            if value:
                parts.append(value)
                size += len(value) + 1
        elif isinstance(value, Mapping):
            for key, item in value.items():
                if key not in ("type", "mimeType", "data", "id", "callId"):
                    take(item, depth + 1)
        elif isinstance(value, list):
            for item in value:
                take(item, depth + 1)

    for block in blocks_of(record):
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "tool_call":
            take(block.get("result"))
            take(block.get("error"))
        elif kind == "tool_result":
            take(block.get("content"))
            take(block.get("error"))
        elif kind == "text":
            take(block.get("text"))
    meta = record.get("meta")
    if isinstance(meta, Mapping):
        take(meta.get("error"))
    if not parts:
        return None
    return "\n".join(parts)[:TOOL_OUTPUT_MAX_CHARS]


def set_tool_output(conn: sqlite3.Connection, message_id: str, record: Mapping[str, Any]) -> None:
    """Keep the ``tool_output`` row of the indexed message ``message_id`` in step with ``record``."""
    output = tool_output_text(record)
    if output is None:
        conn.execute("DELETE FROM tool_output WHERE mid = (SELECT mid FROM messages WHERE id = ?)", (message_id,))
        return
    conn.execute(
        "INSERT INTO tool_output(mid, text) SELECT mid, ? FROM messages WHERE id = ? "
        "ON CONFLICT(mid) DO UPDATE SET text = excluded.text WHERE text IS NOT excluded.text",
        (output, message_id),
    )


_MESSAGE_COLUMNS = (
    "mid, id, session_id, turn_id, seq, role, tool_name, is_error, text, created_at, "
    "line_offset, line_len, wire_cut, line_crc"
)
ROWS_PER_STATEMENT = 256
"""New message rows go in by multi-row INSERTs of up to this many rows (see :func:`insert_message_rows`)."""


def insert_message_rows(conn: sqlite3.Connection, rows: Sequence[Sequence[Any]]) -> None:
    """Insert ``messages`` rows (``_MESSAGE_COLUMNS`` order) in as few statements as possible.

    Why not one statement per row: FTS5 (the linked SQLite 3.40) writes the
    terms it holds in memory out as a new index segment at every statement
    savepoint, and an INSERT into ``messages`` (triggers, constraints) opens
    one; row by row, every message became a segment of its own that the
    automerge then folds again. One statement per batch writes one segment:
    measured on 20,000 ~1 KB messages in transactions of 64, the trigram
    index's CPU per message fell from ~550 to ~330 µs
    (``scripts/bench_index_variants.py``). Same rows, same triggers.
    """
    width = _MESSAGE_COLUMNS.count(",") + 1
    for i in range(0, len(rows), ROWS_PER_STATEMENT):
        chunk = rows[i : i + ROWS_PER_STATEMENT]
        values = ",".join(["(" + ",".join("?" * width) + ")"] * len(chunk))
        conn.execute(f"INSERT INTO messages({_MESSAGE_COLUMNS}) VALUES {values}", [v for r in chunk for v in r])


@dataclass
class PendingRows:
    """New ``messages`` and ``tool_output`` rows held back to go in together (:func:`index_messages`
    with ``pending``): one multi-row INSERT per table for several index ops, so FTS5 writes one
    search-index segment for them all (it writes one per statement)."""

    messages: list[tuple[Any, ...]] = field(default_factory=list)
    outputs: list[tuple[int, str]] = field(default_factory=list)

    def flush(self, conn: sqlite3.Connection) -> None:
        insert_message_rows(conn, self.messages)
        insert_tool_outputs(conn, self.outputs)
        self.messages.clear()
        self.outputs.clear()


def insert_tool_outputs(conn: sqlite3.Connection, rows: Sequence[tuple[int, str]]) -> None:
    """New ``tool_output`` rows ``(mid, text)``, in multi-row INSERTs like :func:`insert_message_rows`."""
    for i in range(0, len(rows), ROWS_PER_STATEMENT):
        chunk = rows[i : i + ROWS_PER_STATEMENT]
        conn.execute("INSERT INTO tool_output(mid, text) VALUES " + ",".join(["(?,?)"] * len(chunk)),
                     [v for r in chunk for v in r])


SESSION_COLUMNS = (
    "id, title, project_id, provider_id, model_id, mode, thinking_level, permission_mode, "
    "source, deleted_at, pinned, last_seq, created_at, updated_at, indexed_len, file_epoch"
)


@dataclass(frozen=True)
class IndexRecord:
    """A transcript message line to index: its record and the byte span of the line."""

    record: Mapping[str, Any]
    offset: int
    length: int
    seq: int | None = None
    """The seq its session actor acknowledged for a new id (checked: never silently renumbered)."""
    line: bytes | None = None
    """The line's bytes, when the caller has them: the row then keeps what a window reply needs to
    send them as they are (``messages.wire_cut``/``line_crc``, ``store/transcripts/window_reply.py``)."""
    root: Root | None = None
    """The project root the line stands under in its transcript (``store.transcripts.records.Root``): what
    its relative Write/Edit paths resolve against. None: no line before it names one (the session's root)."""

    def wire(self) -> tuple[int | None, int | None]:
        return describe_line(self.line, self.record) if self.line is not None else (None, None)

    def with_seq(self, seq: int | None) -> IndexRecord:
        """This record with ``seq`` (what ``dataclasses.replace`` gives, without its per-call field walk:
        the DB writer calls it for every message it indexes)."""
        return IndexRecord(self.record, self.offset, self.length, seq, self.line, self.root)


@dataclass(frozen=True)
class CompactionRecord:
    record: Mapping[str, Any]
    offset: int
    length: int


# ---------------------------------------------------------------------------
# sessions


def session_row(conn: sqlite3.Connection, session_id: str, now_ms: int | None = None) -> dict[str, Any] | None:
    cur = conn.execute(
        f"SELECT {SESSION_COLUMNS}, (SELECT path FROM projects p WHERE p.id = s.project_id) "
        "FROM sessions s WHERE id = ?",
        (session_id,),
    )
    row = cur.fetchone()
    if not row:
        return None
    out = _session_dict(row)
    with_projection(conn, [out], now_ms)
    thread_meta.attach(conn, [out])
    origin_history.attach(conn, [out])
    return out


@dataclass(frozen=True, slots=True)
class Present:
    """Which kinds of a session's optional rows exist, as one read snapshot has them
    (:func:`session_row_present`). A read in that same snapshot skips the statements that could only find
    nothing (most sessions have no plan approval, metadata, compaction or evicted attachment; a new one no
    turn): each is a statement less on every ``session.get`` served without the session actor."""

    plans: bool = True
    """A ``plan_approvals`` row (its projected state)."""
    turns: bool = True
    """A ``turns`` row (the latest turn, the turns a newest window asks decisions for)."""
    thread: bool = True
    """A ``thread_meta`` row."""
    compactions: bool = True
    """A ``compactions`` row."""
    evicted: bool = True
    """An ``attachment_refs`` row whose blob was evicted."""


EVERY_KIND: Final = Present()
"""Nothing known to be absent: every statement runs (a row read outside the snapshot, e.g. the actor's)."""

_HAS_EVICTED_REFS_SQL: Final = (
    "EXISTS (SELECT 1 FROM attachment_refs r WHERE r.session_id = s.id AND r.evicted_at IS NOT NULL)")


def has_evicted_refs(conn: sqlite3.Connection, session_id: str) -> bool:
    """:attr:`Present.evicted` alone: the session has a reference whose blob was evicted."""
    row = conn.execute(f"SELECT {_HAS_EVICTED_REFS_SQL} FROM sessions s WHERE id = ?", (session_id,)).fetchone()
    return bool(row and row[0])


_SESSION_PRESENT_SQL: Final = (
    f"SELECT {SESSION_COLUMNS}, (SELECT path FROM projects p WHERE p.id = s.project_id), "
    "EXISTS (SELECT 1 FROM plan_approvals a WHERE a.session_id = s.id), "
    "EXISTS (SELECT 1 FROM turns t WHERE t.session_id = s.id), "
    "EXISTS (SELECT 1 FROM thread_meta m WHERE m.session_id = s.id), "
    "EXISTS (SELECT 1 FROM compactions c WHERE c.session_id = s.id), "
    f"{_HAS_EVICTED_REFS_SQL} "
    "FROM sessions s WHERE id = ?"
)
_PRESENT_COLUMNS: Final = 5


def session_row_present(conn: sqlite3.Connection, session_id: str,
                        now_ms: int | None = None) -> tuple[dict[str, Any] | None, Present]:
    """:func:`session_row` (the same dict), and which optional rows of the session exist, from one
    statement: the derived fields read only the tables that hold a row of it. Exact within the caller's
    read snapshot (``windows.read_cold``), where a later read can rely on the flags."""
    row = conn.execute(_SESSION_PRESENT_SQL, (session_id,)).fetchone()
    if not row:
        return None, EVERY_KIND
    out = _session_dict(row[:-_PRESENT_COLUMNS])
    present = Present(*(bool(v) for v in row[-_PRESENT_COLUMNS:]))
    with_projection(conn, [out], now_ms, plans=present.plans, turns=present.turns)
    if present.thread:
        thread_meta.attach(conn, [out])
    origin_history.attach(conn, [out])
    return out, present


def require_session(conn: sqlite3.Connection, session_id: str, now_ms: int | None = None) -> dict[str, Any]:
    row = session_row(conn, session_id, now_ms)
    if row is None:
        raise SessionNotFound(f"session {session_id} not found", data={"sessionId": session_id})
    return row


def _session_dict(row: Sequence[Any]) -> dict[str, Any]:
    (sid, title, project_id, provider_id, model_id, mode, thinking, permission, source,
     deleted_at, pinned, last_seq, created_at, updated_at, indexed_len, file_epoch, project_path) = row
    return {
        "id": sid,
        "title": title,
        "projectId": project_id,
        "projectPath": project_path,
        "providerId": provider_id,
        "modelId": model_id,
        "mode": mode,
        "thinkingLevel": thinking,
        "permissionMode": permission,
        "source": source,
        "deletedAt": deleted_at,
        "pinned": bool(pinned),
        "messageCount": last_seq,
        "createdAt": created_at,
        "updatedAt": updated_at,
        "_indexedLen": indexed_len,
        "_fileEpoch": file_epoch,
    }


def public_session(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not k.startswith("_")}


def dry_run(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """``fn(conn)`` under a savepoint rolled back: its value, none of its rows (the caller's transaction,
    and what it did before, stay as they were). A keyed create or fork asks what its commit will answer
    before it writes the file that carries the answer (``store.receipts.file_record``)."""
    conn.execute("SAVEPOINT dry_run")
    try:
        value = fn(conn)
    except BaseException:
        # never masks the error: the caller's own savepoint (the DB writer's op) rolls back what is left
        with contextlib.suppress(sqlite3.Error):
            _undo_dry_run(conn)
        raise
    _undo_dry_run(conn)
    return value


def _undo_dry_run(conn: sqlite3.Connection) -> None:
    conn.execute("ROLLBACK TO dry_run")
    conn.execute("RELEASE dry_run")


def normalize_project_path(path: str) -> str:
    """:func:`store.rules.canonical_project_path` (the one rule)."""
    return canonical_project_path(path)


PROJECT_IDS_KV: Final = ("projectIds", "issued")
"""``kv`` row: the highest project id this database issued (host-owned: ``store/config/settings_rules.py``)."""


def issued_project_id(conn: sqlite3.Connection) -> int:
    """The highest project id ever issued here: a removed project's id is never issued again."""
    row = conn.execute("SELECT value_json FROM kv WHERE ns = ? AND key = ?", PROJECT_IDS_KV).fetchone()
    try:
        issued = int(row[0]) if row is not None else 0
    except ValueError:
        issued = 0
    top = conn.execute("SELECT MAX(id) FROM projects").fetchone()[0]
    return max(issued, int(top or 0))


def raise_project_id_floor(conn: sqlite3.Connection, floor: int, now_ms: int) -> int:
    """Issue every project id from now on above ``floor`` (a database rebuilt from the files: the ids
    of the lost one must name nothing, ``runtime/boot.py``). Returns the new high-water mark."""
    issued = max(issued_project_id(conn), int(floor))
    conn.execute("INSERT INTO kv(ns, key, value_json, updated_at) VALUES (?, ?, ?, ?) "
                 "ON CONFLICT(ns, key) DO UPDATE SET value_json = excluded.value_json, "
                 "updated_at = excluded.updated_at", (*PROJECT_IDS_KV, str(issued), now_ms))
    return issued


PROJECT_RESERVED_NS: Final = "projectIdReserved"
"""kv namespace: the id issued to a project path that has no row yet (key: the canonical path), by
:func:`reserve_project_id`; the row made for that path takes it."""


def _reserved_project_id(conn: sqlite3.Connection, norm: str) -> int | None:
    row = conn.execute("SELECT value_json FROM kv WHERE ns = ? AND key = ?", (PROJECT_RESERVED_NS, norm)).fetchone()
    try:
        return int(row[0]) if row is not None else None
    except ValueError:
        return None


def reserve_project_id(conn: sqlite3.Connection, path: str, now_ms: int) -> None:
    """Issue the id the project at ``path`` will have, without its row, when it has neither a row nor an id
    reserved. A keyed call's dry run commits this before it computes the answer its file carries (a project
    made in between then takes another id, and this path's row takes this one); a call that fails after it
    leaves no project behind, only an id that names nothing."""
    norm = normalize_project_path(path)
    if conn.execute("SELECT 1 FROM projects WHERE path = ?", (norm,)).fetchone() is not None:
        return
    if _reserved_project_id(conn, norm) is not None:
        return
    project_id = raise_project_id_floor(conn, issued_project_id(conn) + 1, now_ms)
    conn.execute("INSERT OR REPLACE INTO kv(ns, key, value_json, updated_at) VALUES (?, ?, ?, ?)",
                 (PROJECT_RESERVED_NS, norm, str(project_id), now_ms))


def upsert_project(conn: sqlite3.Connection, path: str, now_ms: int) -> int:
    """The id of the project at ``path`` (canonical), its row inserted if there is none. A new row's id is
    the one reserved for its path (:func:`reserve_project_id`) if it is free, else one above every id this
    database issued (not ``MAX(id) + 1``: the id of a removed project never names another one)."""
    norm = normalize_project_path(path)
    row = conn.execute("SELECT id FROM projects WHERE path = ?", (norm,)).fetchone()
    if row is not None:
        conn.execute("UPDATE projects SET last_opened_at = ? WHERE id = ?", (now_ms, row[0]))
        return int(row[0])
    name = norm.rsplit("/", 1)[-1] or norm
    reserved = _reserved_project_id(conn, norm)
    if reserved is not None:
        conn.execute("DELETE FROM kv WHERE ns = ? AND key = ?", (PROJECT_RESERVED_NS, norm))
    if reserved is not None and conn.execute("SELECT 1 FROM projects WHERE id = ?", (reserved,)).fetchone() is None:
        project_id = reserved
    else:
        project_id = raise_project_id_floor(conn, issued_project_id(conn) + 1, now_ms)
    conn.execute("INSERT INTO projects(id, path, name, created_at, last_opened_at) VALUES (?, ?, ?, ?, ?)",
                 (project_id, norm, name, now_ms, now_ms))
    return project_id


SESSION_SETTINGS = {
    "providerId": "provider_id",
    "modelId": "model_id",
    "mode": "mode",
    "thinkingLevel": "thinking_level",
    "permissionMode": "permission_mode",
}


def insert_session(
    conn: sqlite3.Connection,
    session_id: str,
    *,
    now_ms: int,
    created_at_ms: int | None = None,
    title: str = "",
    project_path: str | None = None,
    settings: Mapping[str, Any] | None = None,
    file_epoch: str | None = None,
    indexed_len: int = 0,
    source: str | None = None,
) -> dict[str, Any]:
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone():
        raise Conflict(f"session {session_id} already exists", data={"sessionId": session_id})
    project_id = upsert_project(conn, project_path, now_ms) if project_path else None
    cols = ["id", "title", "project_id", "created_at", "updated_at", "file_epoch", "indexed_len", "source"]
    vals: list[Any] = [session_id, title, project_id, created_at_ms or now_ms, created_at_ms or now_ms,
                       file_epoch, indexed_len, source]
    for key, col in SESSION_SETTINGS.items():
        if settings and settings.get(key) is not None:
            cols.append(col)
            vals.append(settings[key])
    conn.execute(
        f"INSERT INTO sessions({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})", vals
    )
    # known from now on (created again after a delete: live again; store/orphans.py)
    conn.execute("INSERT OR REPLACE INTO known_sessions(id, created_at) VALUES (?, ?)",
                 (session_id, created_at_ms or now_ms))
    return require_session(conn, session_id)


def update_session_settings(
    conn: sqlite3.Connection, session_id: str, settings: Mapping[str, Any], *, now_ms: int
) -> dict[str, Any]:
    require_session(conn, session_id)
    sets: list[str] = []
    vals: list[Any] = []
    for key, col in SESSION_SETTINGS.items():
        if key in settings:
            sets.append(f"{col} = ?")
            vals.append(settings[key])
    if "projectPath" in settings:
        path = settings["projectPath"]
        sets.append("project_id = ?")
        vals.append(upsert_project(conn, path, now_ms) if path else None)
    if "title" in settings:
        sets.append("title = ?")
        vals.append(settings["title"])
    if sets:
        conn.execute(f"UPDATE sessions SET {', '.join(sets)} WHERE id = ?", (*vals, session_id))
    return require_session(conn, session_id)


def rename_session(conn: sqlite3.Connection, session_id: str, title: str) -> dict[str, Any]:
    """Rename without touching ``updated_at`` (seed §4.5)."""
    require_session(conn, session_id)
    conn.execute("UPDATE sessions SET title = ? WHERE id = ?", (title, session_id))
    return require_session(conn, session_id)


def delete_session_rows(conn: sqlite3.Connection, session_id: str, *, now_ms: int) -> bool:
    """Delete the row (its index rows cascade) and record the id as deleted: a late append to it is
    ``SESSION_NOT_FOUND``, never an orphan to restore (``store/orphans.py``)."""
    cur = conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
    conn.execute("DELETE FROM kv WHERE ns = ? AND key = ?", (SYNC_MARK_NS, session_id))  # its branch rows' sync mark
    conn.execute("INSERT INTO known_sessions(id, created_at, deleted_at) VALUES (?, ?, ?) "
                 "ON CONFLICT(id) DO UPDATE SET deleted_at = excluded.deleted_at", (session_id, now_ms, now_ms))
    return cur.rowcount > 0


def list_sessions(
    conn: sqlite3.Connection, *, limit: int, cursor: tuple[int, str] | None, project_id: int | None = None,
    owner_plugin: str | None = None, now_ms: int | None = None,
) -> tuple[list[dict[str, Any]], tuple[int, str] | None, list[str]]:
    """Sessions not in the trash, newest ``updated_at`` first; ``owner_plugin``: only that plugin's imports.
    (sessions, next cursor, ids of the sessions listed without ``thread``: their metadata record is damaged)."""
    where = ["s.deleted_at IS NULL"]
    args: list[Any] = []
    if owner_plugin is not None:
        where.append("EXISTS (SELECT 1 FROM session_import_origins o WHERE o.session_id = s.id AND o.plugin_id = ?)")
        args.append(owner_plugin)
    if project_id is not None:
        where.append("s.project_id = ?")
        args.append(project_id)
    if cursor is not None:
        where.append("(s.updated_at < ? OR (s.updated_at = ? AND s.id < ?))")
        args.extend([cursor[0], cursor[0], cursor[1]])
    sql = (
        f"SELECT {', '.join('s.' + c.strip() for c in SESSION_COLUMNS.split(','))}, "
        "(SELECT path FROM projects p WHERE p.id = s.project_id) FROM sessions s "
        f"WHERE {' AND '.join(where)} ORDER BY s.updated_at DESC, s.id DESC LIMIT ?"
    )
    rows = conn.execute(sql, (*args, limit + 1)).fetchall()
    more = len(rows) > limit
    rows = rows[:limit]
    items = [_session_dict(r) for r in rows]
    with_projection(conn, items, now_ms)
    unreadable_threads = thread_meta.attach(conn, items)
    origin_history.attach(conn, items)
    next_cursor = (items[-1]["updatedAt"], items[-1]["id"]) if more and items else None
    return items, next_cursor, unreadable_threads


# ---------------------------------------------------------------------------
# messages


def lookup_ids(conn: sqlite3.Connection, ids: Iterable[str]) -> dict[str, tuple[str, int, int, int]]:
    """``id -> (session_id, seq, line_offset, line_len)`` for the ids the index holds."""
    out: dict[str, tuple[str, int, int, int]] = {}
    id_list = list(dict.fromkeys(ids))
    for marks, chunk in in_chunks(id_list):
        for row in conn.execute(
            f"SELECT id, session_id, seq, line_offset, line_len FROM messages WHERE id IN ({marks})", chunk
        ):
            out[row[0]] = (row[1], row[2], row[3], row[4])
    return out


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _role_column(record: Mapping[str, Any]) -> str:
    """The row's ``role`` (TEXT NOT NULL): a line whose role is missing or not a string (a line damaged or
    written behind the host's back; the host writes one of ``ROLES``) gets ``""``, never a value SQLite
    refuses to bind or to store."""
    role = record.get("role")
    return role if isinstance(role, str) else ""


def _turn_ref(conn: sqlite3.Connection, session_id: str, turn_id: Any) -> str | None:
    """The row's turn: the record's ``turnId`` when it names a turn of this session (a turn of
    another session is never linked: usage, decisions and turn listings follow this column)."""
    if not isinstance(turn_id, str):
        return None
    row = conn.execute("SELECT id FROM turns WHERE id = ? AND session_id = ?", (turn_id, session_id)).fetchone()
    return row[0] if row else None


def message_ref(session_id: str, seq: int, record: Mapping[str, Any], turn_id: str | None, *,
                created_ms: int | None = None) -> dict[str, Any]:
    """A MessageRef; ``created_ms``: the record's ``createdAt`` as its caller already parsed it (0 if none)."""
    return {
        "id": record["id"],
        "sessionId": session_id,
        "seq": seq,
        "turnId": turn_id,
        "role": record.get("role"),
        "createdAt": rfc3339_to_ms(record.get("createdAt"), 0) if created_ms is None else created_ms,
    }


def message_refs(conn: sqlite3.Connection, ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """MessageRefs for ids already in the index (idempotent replays)."""
    out: dict[str, dict[str, Any]] = {}
    id_list = list(dict.fromkeys(ids))
    for marks, chunk in in_chunks(id_list):
        for mid, sid, seq, turn, role, created in conn.execute(
            f"SELECT id, session_id, seq, turn_id, role, created_at FROM messages WHERE id IN ({marks})", chunk
        ):
            out[mid] = {"id": mid, "sessionId": sid, "seq": seq, "turnId": turn, "role": role, "createdAt": created}
    return out


def index_messages(
    conn: sqlite3.Connection,
    session_id: str,
    items: Sequence[IndexRecord],
    *,
    indexed_len: int | None,
    file_epoch: str | None,
    now_ms: int,
    touch: bool = True,
    audit_effects: bool = True,
    pending: PendingRows | None = None,
) -> list[dict[str, Any]]:
    """Index appended message lines (in file order).

    ``indexed_len`` (with ``file_epoch``) moves the session's index mark there
    (whole-file callers: reconcile, import); ``None`` leaves it alone (the
    session actor's line primitive moves it by compare-and-set,
    ``store.indexing.appends.index_written``).

    A line whose id the session already holds replaces that row's content and
    span in place (same seq, same turn). New ids get the next seqs after
    ``last_seq`` (read once, written once per call). Receipts carried in ``meta.receipt`` are
    recorded in the same transaction. Returns one MessageRef per item.
    ``audit_effects=False`` records Write/Edit artifacts without ``tool_execute``
    audit rows (imported history: this host executed nothing).
    ``pending``: new rows wait there for its owner's :meth:`PendingRows.flush` (one INSERT for
    several sessions' rows); until then no statement sees them, so the owner rolls everything
    back if anything fails (a duplicate id then fails the flush, never passes silently).
    """
    refs: list[dict[str, Any]] = []
    existing = lookup_ids(conn, (it.record["id"] for it in items))
    # new rows go in together, before any row is read; with ``pending``, when its owner flushes them
    rows = pending if pending is not None else PendingRows()
    # the session's ``last_seq``: read at its first new id, counted here, written back once after the loop
    # (one statement for the op, not one per message); ``ordinal`` makes each new row's ``mid``
    counted: tuple[int, int] | None = None  # (last_seq as read, ordinal)
    seq_now = 0
    turns: dict[str, str | None] = {}  # turnId -> the row's turn (the turns table does not change in here)
    for item in items:
        rec = item.record
        mid = rec["id"]
        text = extract_text(rec)
        tool_name, is_error = tool_info(rec)
        stamped = rfc3339_ms(rec.get("createdAt"))
        created = now_ms if stamped is None else stamped
        prior = existing.get(mid)
        if prior is not None and prior[0] != session_id:
            # Two sessions appended the same new id at the same moment (both checked
            # before either committed). The line keeps its id; the index row takes the
            # D444 spelling, so the index can always catch up with the file.
            mid = remapped_message_id(session_id, mid)
            rec = {**rec, "id": mid}
            prior = existing.get(mid) or lookup_ids(conn, [mid]).get(mid)
        wire_cut, line_crc = item.wire()
        if prior is not None:
            _, seq, _, _ = prior
            rows.flush(conn)  # the row may be one of this batch's
            # the newest line is the message, as a read shows it and a rebuilt index reads it: its role
            # and time too (a session actor refuses a role change: only a line written behind the host's
            # back has one), at the first line's seq and turn
            turn, old_role = conn.execute("SELECT turn_id, role FROM messages WHERE id = ?", (mid,)).fetchone()
            conn.execute(
                "UPDATE messages SET role = ?, text = ?, tool_name = ?, is_error = ?, created_at = ?, "
                "line_offset = ?, line_len = ?, wire_cut = ?, line_crc = ? WHERE id = ?",
                (_role_column(rec), text, tool_name, int(is_error), created, item.offset, item.length, wire_cut,
                 line_crc, mid),
            )
            if rec.get("role") == "tool" or old_role == "tool":
                set_tool_output(conn, mid, rec)
        else:
            if counted is None:
                counted = _seq_and_ordinal(conn, session_id)
                seq_now = counted[0]
            seq_now += 1
            seq = seq_now
            if (item.seq is not None and item.seq != seq) or seq > MAX_SEQ:
                _set_last_seq(conn, session_id, seq)  # the refused row counted, as a statement per row left it
                if item.seq is not None and item.seq != seq:
                    raise CorruptData(
                        f"session {session_id}: line {item.offset} was acknowledged as seq {item.seq} but the "
                        f"index would give it {seq}; the index is behind its transcript",
                        data={"sessionId": session_id, "seq": item.seq, "indexSeq": seq})
                _check_seq(session_id, seq)
            turn_id = rec.get("turnId")
            if isinstance(turn_id, str):
                if turn_id not in turns:
                    turns[turn_id] = _turn_ref(conn, session_id, turn_id)
                turn = turns[turn_id]
            else:
                turn = None
            row_mid = message_mid(counted[1], seq)
            rows.messages.append((row_mid, mid, session_id, turn, seq, _role_column(rec), tool_name, int(is_error),
                                  text, created, item.offset, item.length, wire_cut, line_crc))
            existing[mid] = (session_id, seq, item.offset, item.length)
            if (output := tool_output_text(rec)) is not None:
                rows.outputs.append((row_mid, output))
        ref = message_ref(session_id, seq, rec, turn, created_ms=0 if stamped is None else stamped)
        if artifacts.may_have_effects(rec):
            # Write/Edit results: artifacts + tool_execute audit in this same transaction (seed §4.10).
            artifacts.record_effects(conn, session_id, rec, turn or _str_or_none(rec.get("turnId")), now_ms,
                                     audit=audit_effects, written_under=item.root)
        # seed 000 §2.3, under the id the line carries (what the GC's scan derives, even when D444-remapped)
        attachments.record_block_refs(conn, session_id, item.record["id"], rec, now_ms)
        store_append_receipt(conn, session_id, rec, ref, now_ms)
        refs.append(ref)
    if counted is not None:
        _set_last_seq(conn, session_id, seq_now)
    if pending is None:
        rows.flush(conn)
    if touch and items:
        touch_session(conn, session_id, now_ms)
    if indexed_len is not None:
        set_index_mark(conn, session_id, indexed_len, file_epoch)
    return refs


def index_compactions(
    conn: sqlite3.Connection, session_id: str, items: Sequence[CompactionRecord], now_ms: int
) -> None:
    for item in items:
        rec = item.record
        conn.execute(
            "INSERT OR REPLACE INTO compactions(session_id, id, through_message_id, first_kept_message_id, "
            "line_offset, line_len, created_at) VALUES (?,?,?,?,?,?,?)",
            (session_id, str(rec.get("id")), _text_or_none(rec.get("throughMessageId")),
             _text_or_none(rec.get("firstKeptMessageId")), item.offset, item.length,
             rfc3339_to_ms(rec.get("createdAt"), now_ms)),
        )


def _text_or_none(value: object) -> str | None:
    """A message id as a checkpoint line names it: only a string names one. A number stored in a TEXT
    column becomes text and would match a message whose id spells it (:func:`store.compaction.still_valid`
    rejects it on every other read)."""
    return value if isinstance(value, str) else None


def set_deleted(conn: sqlite3.Connection, session_id: str, message_id: str, deleted: bool) -> int:
    """A tombstone's state on the index (the messages it changed). A tombstone may name a compaction
    checkpoint (an import hid the branch it is on): its rows go, so no read serves it; the line
    stays, and the import that shows it again writes it again."""
    cur = None
    for candidate in client_spellings(session_id, message_id):  # a line's id, or its D444 spelling (tombstones.py)
        cur = conn.execute(
            "UPDATE messages SET deleted = ? WHERE session_id = ? AND id = ?", (int(deleted), session_id, candidate)
        )
        if cur.rowcount:
            break
    assert cur is not None
    if deleted and cur.rowcount == 0:
        conn.execute("DELETE FROM compactions WHERE session_id = ? AND id = ?", (session_id, message_id))
    return cur.rowcount


def index_mark(conn: sqlite3.Connection, session_id: str) -> tuple[int, str | None] | None:
    """The session's index mark ``(indexed_len, file_epoch)``: bytes of the transcript its rows cover."""
    row = conn.execute("SELECT indexed_len, file_epoch FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return None if row is None else (int(row[0] or 0), row[1])


def set_index_mark(
    conn: sqlite3.Connection, session_id: str, indexed_len: int, file_epoch: str | None,
    *, expected: tuple[int, str | None] | None = None,
) -> bool:
    """The one statement that moves a session's index mark (ARCHITECTURE.md "Read barriers").

    With ``expected`` it is a compare-and-set: the mark moves only from exactly
    ``expected`` (the length and epoch the writer believed indexed before its
    lines), and the return value says whether it did. Without it (whole-file
    owners: boot reconcile, import, a rewrite's reindex) it is set outright.
    """
    if expected is None:
        cur = conn.execute("UPDATE sessions SET indexed_len = ?, file_epoch = ? WHERE id = ?",
                           (indexed_len, file_epoch, session_id))
    else:
        cur = conn.execute(
            "UPDATE sessions SET indexed_len = ?, file_epoch = ? WHERE id = ? AND indexed_len = ? AND file_epoch IS ?",
            (indexed_len, file_epoch, session_id, expected[0], expected[1]))
    return cur.rowcount == 1


def has_message_line(conn: sqlite3.Connection, session_id: str, offset: int, length: int) -> bool:
    """Whether a message row of the session points at the line ``[offset, offset + length)``."""
    row = conn.execute("SELECT 1 FROM messages WHERE session_id = ? AND line_offset = ? AND line_len = ? LIMIT 1",
                       (session_id, offset, length)).fetchone()
    return row is not None


def has_messages(conn: sqlite3.Connection, session_id: str) -> bool:
    return conn.execute("SELECT 1 FROM messages WHERE session_id = ? LIMIT 1", (session_id,)).fetchone() is not None


def _session_ordinal(conn: sqlite3.Connection, session_id: str) -> int:
    row = conn.execute("SELECT ordinal FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None or row[0] is None:
        raise SessionNotFound(f"session {session_id} not found", data={"sessionId": session_id})
    return int(row[0])


def _seq_and_ordinal(conn: sqlite3.Connection, session_id: str) -> tuple[int, int]:
    """The session's ``(last_seq, ordinal)``: the seq its newest message took and its ``mid`` prefix."""
    row = conn.execute("SELECT last_seq, ordinal FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        raise SessionNotFound(f"session {session_id} not found", data={"sessionId": session_id})
    return int(row[0]), int(row[1])


def _set_last_seq(conn: sqlite3.Connection, session_id: str, seq: int) -> None:
    conn.execute("UPDATE sessions SET last_seq = ? WHERE id = ?", (seq, session_id))


def _check_seq(session_id: str, seq: int) -> None:
    """A session holds at most MAX_SEQ messages (``mid`` keeps seq in 24 bits)."""
    if seq > MAX_SEQ:
        raise LimitExceeded(
            f"session {session_id} cannot hold more than {MAX_SEQ} messages",
            data={"sessionId": session_id, "max": MAX_SEQ},
        )


def clear_session_index(conn: sqlite3.Connection, session_id: str) -> None:
    conn.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
    conn.execute("DELETE FROM compactions WHERE session_id = ?", (session_id,))
    conn.execute("UPDATE sessions SET last_seq = 0 WHERE id = ?", (session_id,))
    set_index_mark(conn, session_id, 0, None)  # the caller sets the mark of what it indexes next


def reindex_session(
    conn: sqlite3.Connection,
    session_id: str,
    messages: Sequence[IndexRecord],
    compactions: Sequence[CompactionRecord],
    deleted_ids: Iterable[str],
    *,
    indexed_len: int,
    file_epoch: str | None,
    now_ms: int,
    turn_overrides: Mapping[str, str] | None = None,
) -> None:
    """Replace every index row of a session with rows for ``messages`` (a rewrite or rebuild).

    Each surviving message keeps its owning turn: the turn recorded in the old
    row wins over the line's ``turnId`` (``turn_overrides`` first of all). A
    line without ``createdAt`` (older writers left it off tool lines) keeps
    the old row's time instead of taking "now".
    """
    old_turns: dict[str, str] = {}
    old_created: dict[str, int] = {}
    old_crcs: dict[str, int] = {}
    for mid, turn_id, created, crc in conn.execute(
        "SELECT id, turn_id, created_at, line_crc FROM messages WHERE session_id = ?", (session_id,)
    ):
        if turn_id is not None:
            old_turns[mid] = turn_id
        old_created[mid] = created
        if crc is not None:
            old_crcs[mid] = crc
    if turn_overrides:
        old_turns.update(turn_overrides)
    ordinal = _session_ordinal(conn, session_id)
    _check_seq(session_id, len(messages))
    clear_session_index(conn, session_id)
    # Ids another session already holds (a race between two first appends, or files
    # copied by hand) are indexed under the D444 spelling instead of failing the rebuild.
    taken = {mid for mid, (owner, *_rest) in lookup_ids(conn, (it.record["id"] for it in messages)).items()
             if owner != session_id}
    line_ids = [it.record["id"] for it in messages]  # as the lines carry them (the GC's scan derives these)
    if taken:
        messages = [replace(it, record={**it.record, "id": remapped_message_id(session_id, it.record["id"])})
                    if it.record["id"] in taken else it for it in messages]
        deleted_ids = [remapped_message_id(session_id, mid) if mid in taken else mid for mid in deleted_ids]
    rows = []
    for seq, item in enumerate(messages, start=1):
        rec = item.record
        tool_name, is_error = tool_info(rec)
        turn = _turn_ref(conn, session_id, old_turns.get(rec["id"]) or rec.get("turnId"))
        rows.append(
            (message_mid(ordinal, seq), rec["id"], session_id, turn, seq, _role_column(rec), tool_name, int(is_error),
             extract_text(rec), rfc3339_to_ms(rec.get("createdAt"), old_created.get(rec["id"], now_ms)),
             item.offset, item.length, *item.wire())
        )
    insert_message_rows(conn, rows)
    insert_tool_outputs(conn, [(row[0], output) for item, row in zip(messages, rows, strict=True)
                               if (output := tool_output_text(item.record)) is not None])
    for item, row in zip(messages, rows, strict=True):
        if old_crcs.get(item.record["id"], -1) == row[-1]:
            # The very line was indexed already, its effects with it (same transaction) against the root
            # the session had then: resolving it again against today's root would list a file no tool wrote.
            continue
        if artifacts.may_have_effects(item.record):
            # A rebuild restores missing artifact rows only (no audit rows, nothing overwritten), each against
            # the root its line stands under (a session_info line before it), as the live index resolved it.
            artifacts.record_effects(conn, session_id, item.record, row[3] or _str_or_none(item.record.get("turnId")),
                                     now_ms, audit=False, written_under=item.root)
    for item, row, line_id in zip(messages, rows, line_ids, strict=True):
        attachments.record_block_refs(conn, session_id, line_id, item.record, now_ms)
        store_append_receipt(conn, session_id, item.record, message_ref(session_id, row[4], item.record, row[3]),
                             now_ms)
    index_compactions(conn, session_id, compactions, now_ms)
    for mid in deleted_ids:
        set_deleted(conn, session_id, mid, True)
    set_message_count(conn, session_id, len(messages))
    set_index_mark(conn, session_id, indexed_len, file_epoch)


def set_message_count(conn: sqlite3.Connection, session_id: str, count: int) -> None:
    """The session's message count (``last_seq``) after a whole reindex: its file's messages."""
    conn.execute("UPDATE sessions SET last_seq = ? WHERE id = ?", (count, session_id))


def window_rows(
    conn: sqlite3.Connection, session_id: str, start: int, end: int
) -> list[tuple[int, str, int, int, int, str | None]]:
    """Rows for positions ``[start, end)`` (seq = position + 1): seq, id, offset, len, deleted, turn."""
    return conn.execute(
        "SELECT seq, id, line_offset, line_len, deleted, turn_id FROM messages "
        "WHERE session_id = ? AND seq > ? AND seq <= ? ORDER BY seq",
        (session_id, start, end),
    ).fetchall()


def window_spans(conn: sqlite3.Connection, session_id: str, start: int,
                 end: int) -> list[tuple[int, int, int, int, str | None, int | None, int | None]]:
    """What a window reply needs of positions ``[start, end)``: seq, offset, len, deleted, turn,
    wire cut, line CRC (``store/transcripts/window_reply.py``)."""
    return conn.execute(
        "SELECT seq, line_offset, line_len, deleted, turn_id, wire_cut, line_crc FROM messages "
        "WHERE session_id = ? AND seq > ? AND seq <= ? ORDER BY seq",
        (session_id, start, end),
    ).fetchall()


def iter_window_spans(
    conn: sqlite3.Connection, session_id: str, start: int, end: int, *, newest_first: bool
) -> Iterator[tuple[int, int, int, int, str | None, int | None, int | None]]:
    """The rows of ``window_spans``, lazily, oldest or newest first (a byte-bounded page stops early)."""
    order = "DESC" if newest_first else "ASC"
    cursor = conn.execute(
        "SELECT seq, line_offset, line_len, deleted, turn_id, wire_cut, line_crc FROM messages "
        f"WHERE session_id = ? AND seq > ? AND seq <= ? ORDER BY seq {order}",
        (session_id, start, end),
    )
    while batch := cursor.fetchmany(512):
        yield from batch


def client_spellings(session_id: str, message_id: str) -> tuple[str, str]:
    """The ids a client's message id may be stored under in its session: as chosen, or D444-remapped."""
    return message_id, remapped_message_id(session_id, message_id)


def line_spellings(session_id: str, message_id: str) -> tuple[str, ...]:
    """The ids the transcript line of a client's message id may carry: as chosen, its D444 spelling,
    or, for a D444 spelling (what search and the index answer), the id a line kept when only its
    index row was remapped (two sessions wrote one id at once; a transcript copied by hand)."""
    prefix = f"{session_id}:"
    if message_id.startswith(prefix) and len(message_id) > len(prefix):
        return message_id, prefix + message_id, message_id[len(prefix):]
    return message_id, prefix + message_id


def find_line_id(session_id: str, message_id: str, ids: Sequence[str]) -> str | None:
    """The first of :func:`line_spellings` that ``ids`` (a transcript's message ids) holds."""
    present = set(ids)
    return next((c for c in line_spellings(session_id, message_id) if c in present), None)


def resolve_id(conn: sqlite3.Connection, session_id: str, message_id: str) -> str | None:
    """The stored id of the client's ``message_id`` in ``session_id`` (its own spelling first), or None."""
    for candidate in client_spellings(session_id, message_id):
        row = conn.execute("SELECT 1 FROM messages WHERE session_id = ? AND id = ?", (session_id, candidate)).fetchone()
        if row is not None:
            return candidate
    return None


def position_of(conn: sqlite3.Connection, session_id: str, message_id: str) -> int | None:
    """0-based position of the client's ``message_id`` in the session (D444 spelling resolved)."""
    for candidate in client_spellings(session_id, message_id):
        row = conn.execute(
            "SELECT seq FROM messages WHERE session_id = ? AND id = ?", (session_id, candidate)
        ).fetchone()
        if row is not None:
            return int(row[0]) - 1
    return None


def compaction_rows(conn: sqlite3.Connection, session_id: str) -> list[tuple[str, str | None, int, int]]:
    """Compactions whose ``throughMessageId`` anchor still exists, oldest first: one per id, its newest
    line at its first line's place (the reader rule; an import writes a checkpoint's line again when it
    shows it again). A line without an anchor has none that exists: dropped, as every other read
    (:func:`store.compaction.still_valid`) drops it."""
    return conn.execute(
        "SELECT c.id, c.through_message_id, c.line_offset, c.line_len FROM compactions c "
        "JOIN (SELECT id, MIN(line_offset) AS first, MAX(line_offset) AS last FROM compactions "
        "WHERE session_id = ? GROUP BY id) g ON g.id = c.id AND g.last = c.line_offset "
        "WHERE c.session_id = ? AND EXISTS "
        "(SELECT 1 FROM messages m WHERE m.session_id = c.session_id AND m.id = c.through_message_id) "
        "ORDER BY g.first",
        (session_id, session_id),
    ).fetchall()


def append_response(ref: Mapping[str, Any], receipt: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``session.appendMessage`` result for a written line (``remappedFrom`` from its receipt)."""
    out: dict[str, Any] = {"message": dict(ref), "replayed": False}
    extra = receipt.get("extra") if receipt is not None else None
    if isinstance(extra, Mapping) and isinstance(extra.get("remappedFrom"), str):
        out["remappedFrom"] = extra["remappedFrom"]
    return out


def store_append_receipt(
    conn: sqlite3.Connection, session_id: str, rec: Mapping[str, Any], ref: Mapping[str, Any], now_ms: int
) -> None:
    """The receipt a message line carries in ``meta.receipt`` (if any), as a row (never overwritten)."""
    meta = rec.get("meta")
    carried = meta.get("receipt") if isinstance(meta, Mapping) else None
    key = receipts.key_of_record(carried, default_method="session.appendMessage")
    if key is None or not isinstance(carried, Mapping):
        return
    if key.method == "session.recoverInflight":  # a promoted line: the answer its recovery gave, carried
        extra = carried.get("extra")
        said = extra.get("response") if isinstance(extra, Mapping) else None
        turn = said.get("turn") if isinstance(said, Mapping) and said.get("action") == "promoted" else None
        # only once the database that held its turn is gone: with the turn's row here, the line may be all of
        # the promotion that landed (its commit failed or never came): the retry finishes it and answers then.
        # A row the rebuild restored from the lines (``TURN_INDEX_LOST``) is the database gone.
        if isinstance(said, Mapping) and isinstance(turn, Mapping) and conn.execute(
                "SELECT 1 FROM turns WHERE id = ? AND session_id = ? AND error_code IS NOT ?",
                (turn.get("id"), session_id, TURN_INDEX_LOST)).fetchone() is None:
            receipts.store(conn, key, dict(said), session_id=session_id, now_ms=now_ms)
        return
    receipts.store(conn, key, append_response(ref, carried), session_id=session_id, now_ms=now_ms)


def compaction_span(conn: sqlite3.Connection, session_id: str, compaction_id: str) -> tuple[int, int] | None:
    """Byte span of the newest line holding compaction ``compaction_id`` of the session."""
    row = conn.execute(
        "SELECT line_offset, line_len FROM compactions WHERE session_id = ? AND id = ? ORDER BY line_offset DESC",
        (session_id, compaction_id),
    ).fetchone()
    return (int(row[0]), int(row[1])) if row else None


def set_project_id(conn: sqlite3.Connection, session_id: str, project_id: int | None) -> None:
    conn.execute("UPDATE sessions SET project_id = ? WHERE id = ?", (project_id, session_id))


def touch_session(conn: sqlite3.Connection, session_id: str, now_ms: int) -> None:
    """``updated_at`` moves forward to ``now_ms`` (never back)."""
    conn.execute("UPDATE sessions SET updated_at = MAX(updated_at, ?) WHERE id = ?", (now_ms, session_id))


def index_marks(conn: sqlite3.Connection) -> dict[str, tuple[int, str | None]]:
    """Every session's high-water mark: ``id -> (indexed_len, file_epoch)``."""
    return {r[0]: (int(r[1] or 0), r[2]) for r in conn.execute("SELECT id, indexed_len, file_epoch FROM sessions")}


def session_ids(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT id FROM sessions")}
