"""Project groups (seed 003 §1): one JSON record per group in ``kv(projectGroups, <groupId>)``.

A record::

    {"id": "g-3f9a…", "name": "Parser", "roots": ["/src/parser", "/src/lexer"],
     "primaryRoot": "/src/parser", "detachedPaths": ["/src/old"], "createdAt": …, "updatedAt": …}

* ``roots`` are canonical project paths, ordered, unique, at most 64; a root
  belongs to one group at most; ``primaryRoot`` is one of them (default: the
  first).
* A root removed by a later save moves to ``detachedPaths`` (re-adding it takes
  it out again), so its old path project is not projected as a standalone
  legacy group again; sessions and files are never deleted.
* Group memory is ``kv(projectGroupMemory, <id>)`` (memory rules of
  ``store/project_memory.py``), group instructions
  ``kv(projectGroupInstructions, <id>)`` (text, at most 32 KiB; blank stores no key).
* Path projects no group claims (as a root or a detached path) are projected at
  read time as legacy single-root groups with id ``project:<projectId>``
  (read-only: save a group with that root to replace the projection).
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any, Final

import orjson

from store.config.settings import delete_value, get_value, namespace_rows, set_value
from store.config.settings_rules import canonical_path
from store.errors import Conflict, InvalidInput, NotFound, PayloadTooLarge, damaged_setting
from store.jsonio import Readable, readable
from store.project_memory import EMPTY, memory_view, normalize_memory
from store.rules import MAX_GROUP_ROOTS, MAX_MEMORY_BYTES, MAX_PATH_CHARS

__all__ = [
    "GROUPS_NS",
    "INSTRUCTIONS_NS",
    "MEMORY_NS",
    "delete_group",
    "get_group",
    "group_details",
    "list_groups",
    "save_group",
    "set_instructions",
    "set_memory",
    "stored_group",
    "stored_instructions",
]

GROUPS_NS: Final = "projectGroups"
MEMORY_NS: Final = "projectGroupMemory"
INSTRUCTIONS_NS: Final = "projectGroupInstructions"
LEGACY_PREFIX: Final = "project:"
MAX_DETACHED: Final = 256
MAX_GROUPS: Final = 1000
_GROUP_ID = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


def _stored(conn: sqlite3.Connection) -> dict[str, dict[str, Any]]:
    return {k: v for k, (v, _) in namespace_rows(conn, GROUPS_NS, MAX_GROUPS)[0].items() if isinstance(v, dict)}


def _group(row: tuple[str, str]) -> dict[str, Any]:
    """A stored group; ``DamagedRecord`` (CORRUPT_DATA, data ``ns``, ``key``, ``repair``:
    ``store.errors.damaged_setting``) when its record no longer parses as an object (a record written by the app
    before this host may lack fields this host writes: it is not damaged for that)."""
    key, raw = row
    try:
        group = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise damaged_setting(GROUPS_NS, key, str(exc), f"project group {key}") from None
    if not isinstance(group, dict):
        raise damaged_setting(GROUPS_NS, key, f"a JSON {type(group).__name__}, not an object",
                              f"project group {key}")
    return group


def stored_group(conn: sqlite3.Connection, group_id: str) -> dict[str, Any] | None:
    """The stored record of ``group_id`` (no legacy projection), None when there is none; ``DamagedRecord`` as
    :func:`get_group` refuses it (``pi-host doctor`` reads every ``kv(projectGroups)`` row with this)."""
    found = conn.execute("SELECT key, value_json FROM kv WHERE ns = ? AND key = ?", (GROUPS_NS, group_id)).fetchone()
    return _group(found) if found is not None else None


def stored_instructions(conn: sqlite3.Connection, group_id: str) -> str | None:
    """The group's instructions, None when unset; ``DamagedRecord`` (CORRUPT_DATA, data ``ns``, ``key``,
    ``repair`` and ``groupId``) when they are not JSON text."""
    found = get_value(conn, INSTRUCTIONS_NS, group_id)
    if found is None or isinstance(found[0], str):
        return None if found is None else str(found[0])
    exc = damaged_setting(INSTRUCTIONS_NS, group_id, f"a JSON {type(found[0]).__name__}, not text",
                          f"instructions of project group {group_id}")
    exc.data["groupId"] = group_id
    raise exc


def list_groups(conn: sqlite3.Connection) -> Readable[dict[str, Any]]:
    """Stored groups by name, then the legacy single-root projections of unclaimed path projects. A stored group
    whose record is damaged is named in ``unreadable`` (group ids), not listed; the roots it claimed are not
    known, so their path projects are projected as legacy groups."""
    stored = readable(conn.execute("SELECT key, value_json FROM kv WHERE ns = ? ORDER BY key LIMIT ?",
                                   (GROUPS_NS, MAX_GROUPS)).fetchall(), _group, lambda r: str(r[0]))
    groups = sorted(stored.items, key=lambda g: (str(g.get("name", "")).lower(), str(g.get("id"))))
    claimed = {p for g in groups for p in (*g.get("roots", []), *g.get("detachedPaths", []))}
    legacy = [
        {"id": f"{LEGACY_PREFIX}{pid}", "name": name, "roots": [path], "primaryRoot": path, "legacy": True,
         "createdAt": created, "updatedAt": opened}
        for pid, path, name, created, opened in conn.execute(
            "SELECT id, path, name, created_at, last_opened_at FROM projects ORDER BY last_opened_at DESC, id DESC")
        if path not in claimed
    ]
    return Readable([*groups, *legacy], stored.unreadable)


def get_group(conn: sqlite3.Connection, group_id: str) -> dict[str, Any]:
    """The group; ``DamagedRecord`` (CORRUPT_DATA) when its stored record is damaged."""
    if group_id.startswith(LEGACY_PREFIX):
        for group in list_groups(conn).items:
            if group["id"] == group_id:
                return group
    else:
        found = stored_group(conn, group_id)
        if found is not None:
            return found
    raise NotFound(f"project group {group_id!r} not found", data={"groupId": group_id})


def _roots(roots: list[str]) -> list[str]:
    out: list[str] = []
    for i, raw in enumerate(roots):
        path = canonical_path(raw)
        if not path or len(path) > MAX_PATH_CHARS or "\x00" in path:
            raise InvalidInput(f"roots.{i}: must be a project path", data={"field": f"roots.{i}"})
        if path in out:
            raise InvalidInput(f"roots.{i}: {path} is listed twice", data={"field": f"roots.{i}"})
        out.append(path)
    if not 1 <= len(out) <= MAX_GROUP_ROOTS:
        raise InvalidInput(f"a group has 1-{MAX_GROUP_ROOTS} roots", data={"field": "roots"})
    return out


def save_group(conn: sqlite3.Connection, group_id: str | None, name: str, roots: list[str],
               primary_root: str | None, *, new_id: str, now_ms: int) -> dict[str, Any]:
    """Create (``group_id`` None) or replace a group's name, roots and primary root."""
    name = name.strip()
    if not 1 <= len(name) <= 200:
        raise InvalidInput("name must be 1-200 characters", data={"field": "name"})
    ordered = _roots(roots)
    primary = canonical_path(primary_root) if primary_root is not None else ordered[0]
    if primary not in ordered:
        raise InvalidInput("primaryRoot must be one of the roots", data={"field": "primaryRoot"})
    stored = _stored(conn)
    if group_id is None:
        if len(stored) >= MAX_GROUPS:
            raise InvalidInput(f"at most {MAX_GROUPS} project groups", data={"field": "groupId"})
        gid, old = new_id, None
    else:
        if group_id.startswith(LEGACY_PREFIX) or not _GROUP_ID.fullmatch(group_id):
            raise InvalidInput("groupId must name a stored group (legacy projections are read-only)",
                               data={"field": "groupId"})
        if group_id not in stored:
            raise NotFound(f"project group {group_id!r} not found", data={"groupId": group_id})
        gid, old = group_id, stored[group_id]
    for other in stored.values():
        if other.get("id") == gid:
            continue
        taken = set(other.get("roots", [])) & set(ordered)
        if taken:
            path = sorted(taken)[0]
            raise Conflict(f"{path} already belongs to project group {other.get('id')}",
                           data={"groupId": other.get("id"), "path": path})
    detached = [p for p in (old or {}).get("detachedPaths", []) if p not in ordered]
    detached += [p for p in (old or {}).get("roots", []) if p not in ordered and p not in detached]
    record: dict[str, Any] = {"id": gid, "name": name, "roots": ordered, "primaryRoot": primary,
                              "createdAt": (old or {}).get("createdAt", now_ms), "updatedAt": now_ms}
    if detached:
        record["detachedPaths"] = detached[-MAX_DETACHED:]
    set_value(conn, GROUPS_NS, gid, record, now_ms)
    return record


def delete_group(conn: sqlite3.Connection, group_id: str) -> bool:
    """The record, its memory and its instructions; sessions, projects and files stay."""
    existed = delete_value(conn, GROUPS_NS, group_id)
    delete_value(conn, MEMORY_NS, group_id)
    delete_value(conn, INSTRUCTIONS_NS, group_id)
    return existed


def _require_stored(conn: sqlite3.Connection, group_id: str) -> None:
    if get_value(conn, GROUPS_NS, group_id, lenient=True) is None:
        raise NotFound(f"project group {group_id!r} not found (memory belongs to stored groups)",
                       data={"groupId": group_id})


def set_memory(conn: sqlite3.Connection, group_id: str, memory: Any, now_ms: int) -> dict[str, Any]:
    _require_stored(conn, group_id)
    value = normalize_memory(memory, now_ms)
    if value is EMPTY:
        delete_value(conn, MEMORY_NS, group_id)
        return memory_view(None)
    set_value(conn, MEMORY_NS, group_id, value, now_ms)
    return memory_view(value)


def set_instructions(conn: sqlite3.Connection, group_id: str, text: str, now_ms: int) -> str | None:
    _require_stored(conn, group_id)
    text = text.strip()
    size = len(text.encode("utf-8"))
    if size > MAX_MEMORY_BYTES:
        raise PayloadTooLarge(f"instructions are {size} bytes, at most {MAX_MEMORY_BYTES}",
                              data={"field": "instructions", "limit": MAX_MEMORY_BYTES})
    if not text:
        delete_value(conn, INSTRUCTIONS_NS, group_id)
        return None
    set_value(conn, INSTRUCTIONS_NS, group_id, text, now_ms)
    return text


def group_details(conn: sqlite3.Connection, group_id: str) -> dict[str, Any]:
    group = get_group(conn, group_id)
    out: dict[str, Any] = {"group": group}
    # a path project: its path-scoped memory
    where = ("projectMemory", str(group["primaryRoot"])) if group.get("legacy") else (MEMORY_NS, group_id)
    found = get_value(conn, *where)
    out["memory"] = memory_view(found[0] if found else None, f"memory of project group {group_id}", kv=where)
    instructions = None if group.get("legacy") else stored_instructions(conn, group_id)
    if instructions is not None:
        out["instructions"] = instructions
    return out
