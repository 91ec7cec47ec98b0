"""Thread metadata (seed 000 §2.1): tags, folder, preset, archive flag, parent thread, origins.

    "ThreadMeta stores title, timestamps, leafId, optional folder and preset, tags, pin and
    archive flags, optional parentThreadId, usage statistics, and origins reached or approved
    by the Thread. The UI reads this table for the conversation list instead of scanning nodes."

Title, timestamps, pin and usage already live on ``sessions``; this module keeps
the rest in ``thread_meta`` (one row per session that has any) and projects it
onto session rows as ``thread``. The transcript is the source of truth: every
``session_info`` line the host writes carries the whole object under
``thread``, so a rebuilt index restores it (:func:`restore_from_info`).

Pure validation (:func:`normalize`, bounded by ``store.rules``) and SQL; no trio.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson

from store.errors import DamagedRecord, InvalidInput
from store.jsonio import loads_stored
from store.rules import (
    MAX_FOLDER_CHARS,
    MAX_ORIGIN_CHARS,
    MAX_PRESET_CHARS,
    MAX_TAG_CHARS,
    MAX_TAGS,
    MAX_THREAD_ORIGINS,
    SESSION_ID_RE,
)

ORIGIN_STATUSES = ("reached", "approved")
EMPTY: dict[str, Any] = {"tags": [], "folder": None, "preset": None, "archived": False, "parentThreadId": None,
                         "origins": []}
KEYS = tuple(EMPTY)

__all__ = ["EMPTY", "KEYS", "ORIGIN_STATUSES", "attach", "canonical_origin", "get", "is_empty", "merge",
           "normalize", "restore_from_info", "upsert"]

_URL_ORIGIN = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://([^/?#@\s]+)/?$")
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443, "ftp": 21}


def _bad(field: str, why: str) -> InvalidInput:
    return InvalidInput(f"thread.{field} {why}", data={"field": field})


def _text(value: Any, field: str, limit: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise _bad(field, "must be a string or null")
    out = value.strip()
    if len(out) > limit:
        raise _bad(field, f"is longer than {limit} characters")
    if any(ord(ch) < 0x20 for ch in out):
        raise _bad(field, "must not hold control characters")
    return out or None


def canonical_origin(origin: str) -> str:
    """A URL origin (``scheme://host[:port]``, a trailing ``/`` allowed) in its canonical form: scheme and
    host lowercase, the scheme's default port left out (RFC 6454), so ``HTTPS://A.COM:443/`` is
    ``https://a.com``. Any other text (a URL with a path, a label) is kept as given."""
    found = _URL_ORIGIN.fullmatch(origin)
    if found is None:
        return origin
    scheme = found.group(1).lower()
    try:
        parts = urlsplit(f"{scheme}://{found.group(2)}")
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is no number, a bad IPv6 literal
        return origin
    if not host:
        return origin
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}" if port is None or port == _DEFAULT_PORTS.get(scheme) else f"{scheme}://{host}:{port}"


def _one_per_origin(items: Iterable[tuple[str, str]]) -> list[dict[str, str]]:
    """``{origin, status}`` once per canonical origin, the last status winning, in the order of that last one."""
    by_origin: dict[str, str] = {}
    for origin, status in items:
        key = canonical_origin(origin)
        by_origin.pop(key, None)
        by_origin[key] = status
    return [{"origin": o, "status": s} for o, s in by_origin.items()]


def normalize(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The canonical, bounded object (every key present). Raises INVALID_PARAMS, changing nothing.

    Tags are trimmed, empty ones and repeats (case-insensitive) dropped, order kept; origins
    are deduplicated by origin (the last status wins), a URL origin compared and stored in its
    canonical form (:func:`canonical_origin`).
    """
    out = dict(EMPTY)
    tags = raw.get("tags") or []
    if not isinstance(tags, list):
        raise _bad("tags", "must be a list")
    seen: set[str] = set()
    kept: list[str] = []
    for tag in tags:
        text = _text(tag, "tags", MAX_TAG_CHARS)
        if text is None or text.casefold() in seen:
            continue
        seen.add(text.casefold())
        kept.append(text)
    if len(kept) > MAX_TAGS:
        raise _bad("tags", f"holds more than {MAX_TAGS} tags")
    out["tags"] = kept
    out["folder"] = _text(raw.get("folder"), "folder", MAX_FOLDER_CHARS)
    out["preset"] = _text(raw.get("preset"), "preset", MAX_PRESET_CHARS)
    archived = raw.get("archived", False)
    if not isinstance(archived, bool):
        raise _bad("archived", "must be a boolean")
    out["archived"] = archived
    parent = raw.get("parentThreadId")
    if parent is not None and (not isinstance(parent, str) or not SESSION_ID_RE.fullmatch(parent)):
        raise _bad("parentThreadId", "must be a session id or null")
    out["parentThreadId"] = parent
    origins = raw.get("origins") or []
    if not isinstance(origins, list):
        raise _bad("origins", "must be a list")
    given: list[tuple[str, str]] = []
    for item in origins:
        if not isinstance(item, Mapping):
            raise _bad("origins", "entries must be objects {origin, status}")
        origin = _text(item.get("origin"), "origins", MAX_ORIGIN_CHARS)
        status = item.get("status")
        if origin is None or status not in ORIGIN_STATUSES:
            raise _bad("origins", f"entries need an origin and a status ({' or '.join(ORIGIN_STATUSES)})")
        given.append((origin, str(status)))
    out["origins"] = _one_per_origin(given)
    if len(out["origins"]) > MAX_THREAD_ORIGINS:
        raise _bad("origins", f"holds more than {MAX_THREAD_ORIGINS} origins")
    return out


def merge(current: Mapping[str, Any] | None, changes: Mapping[str, Any]) -> dict[str, Any]:
    """``current`` with the keys ``changes`` names replaced (a key set to None clears it), normalized."""
    base = dict(current or EMPTY)
    for key, value in changes.items():
        if key not in KEYS:
            raise _bad(key, "is not a thread metadata field")
        base[key] = EMPTY[key] if value is None and key in ("tags", "origins", "archived") else value
    return normalize(base)


def is_empty(meta: Mapping[str, Any]) -> bool:
    return all(meta.get(k) == v for k, v in EMPTY.items())


# ---------------------------------------------------------------------- rows


def upsert(conn: sqlite3.Connection, session_id: str, meta: Mapping[str, Any], *, now_ms: int) -> None:
    """Store a normalized object (an empty one removes the row)."""
    if is_empty(meta):
        conn.execute("DELETE FROM thread_meta WHERE session_id = ?", (session_id,))
        return
    conn.execute(
        "INSERT INTO thread_meta(session_id, tags_json, folder, preset, archived, parent_thread_id, origins_json, "
        "updated_at) VALUES (?,?,?,?,?,?,?,?) ON CONFLICT(session_id) DO UPDATE SET tags_json = excluded.tags_json, "
        "folder = excluded.folder, preset = excluded.preset, archived = excluded.archived, "
        "parent_thread_id = excluded.parent_thread_id, origins_json = excluded.origins_json, "
        "updated_at = excluded.updated_at",
        (session_id, orjson.dumps(meta["tags"]).decode(), meta["folder"], meta["preset"], int(meta["archived"]),
         meta["parentThreadId"], orjson.dumps(meta["origins"]).decode(), now_ms),
    )


def _stored_origins(raw: str, what: str) -> list[Any]:
    """A row's origins, one per canonical origin: a row written before origins were canonical may hold two
    spellings of one (it is rewritten canonical by the session's next metadata update)."""
    stored = loads_stored(raw, what)
    if not isinstance(stored, list) or not all(
            isinstance(i, dict) and isinstance(i.get("origin"), str) and isinstance(i.get("status"), str)
            for i in stored):
        return stored if isinstance(stored, list) else []
    return _one_per_origin((i["origin"], i["status"]) for i in stored)


def _from_row(session_id: str, row: tuple[Any, ...]) -> dict[str, Any]:
    """``DamagedRecord`` when a JSON column no longer parses (or its tags are not a list)."""
    tags, folder, preset, archived, parent, origins = row
    return {"tags": loads_stored(tags, f"session {session_id}'s thread tags_json", list), "folder": folder,
            "preset": preset, "archived": bool(archived), "parentThreadId": parent,
            "origins": _stored_origins(origins, f"session {session_id}'s thread origins_json")}


def get(conn: sqlite3.Connection, session_id: str) -> dict[str, Any] | None:
    row = conn.execute(
        "SELECT tags_json, folder, preset, archived, parent_thread_id, origins_json FROM thread_meta "
        "WHERE session_id = ?", (session_id,)).fetchone()
    return _from_row(session_id, row) if row else None


def attach(conn: sqlite3.Connection, rows: Iterable[dict[str, Any]]) -> list[str]:
    """Set ``thread`` on session rows that have metadata (in place); others get none. Unset
    optional fields are left out, as on the wire. Returns the ids of the sessions whose metadata record is
    damaged: they get no ``thread`` (``session.list`` names them), and the session itself still reads."""
    unreadable: list[str] = []
    by_id = {r["id"]: r for r in rows}
    for row in by_id.values():
        row.pop("thread", None)
    ids = list(by_id)
    for start in range(0, len(ids), 500):
        chunk = ids[start:start + 500]
        marks = ", ".join("?" for _ in chunk)
        for found in conn.execute(
            "SELECT session_id, tags_json, folder, preset, archived, parent_thread_id, origins_json "
            f"FROM thread_meta WHERE session_id IN ({marks})", chunk).fetchall():
            try:
                meta = _from_row(found[0], found[1:])
            except DamagedRecord:
                unreadable.append(found[0])
                continue
            by_id[found[0]]["thread"] = {k: v for k, v in meta.items() if v is not None}
    return unreadable


def restore_from_info(conn: sqlite3.Connection, session_id: str, info: Mapping[str, Any] | None, *,
                      now_ms: int) -> bool:
    """A rebuilt index takes the metadata the newest ``session_info`` line carries. True if a row was set."""
    raw = (info or {}).get("thread")
    if not isinstance(raw, Mapping):
        return False
    try:
        meta = normalize(raw)
    except InvalidInput:
        return False  # a damaged object is skipped, never half-applied
    try:
        current = get(conn, session_id)
    except DamagedRecord:  # the row no longer reads: the transcript's metadata replaces it
        upsert(conn, session_id, meta, now_ms=now_ms)
        return True
    if current == meta or (is_empty(meta) and current is None):
        return False
    upsert(conn, session_id, meta, now_ms=now_ms)
    return True
