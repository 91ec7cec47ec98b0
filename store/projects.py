"""Projects: the logical index of places work happens (seed 003 §4.2, §5 "project delete").

A project row is an index entry only: removing it never touches the project
folder on disk. ``projects.remove`` deletes every owned session exactly like
``session.delete`` (one transaction per session, files after the row), then,
in one last transaction, the project row, its ``kv(projectMemory, <path>)``
entry and a ``kv(app, currentProjectId)`` that points at it.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import orjson

from store.errors import Conflict, NotFound

__all__ = ["get_project", "list_projects", "pin_project", "remove_project_row", "session_ids"]

MEMORY_NS = "projectMemory"


def _project(row: tuple[Any, ...]) -> dict[str, Any]:
    pid, path, name, pinned, created, opened, count = row
    return {"id": pid, "path": path, "name": name, "pinned": bool(pinned), "createdAt": created,
            "lastOpenedAt": opened, "sessionCount": count}


_SELECT = ("SELECT p.id, p.path, p.name, p.pinned, p.created_at, p.last_opened_at, "
           "(SELECT COUNT(*) FROM sessions s WHERE s.project_id = p.id AND s.deleted_at IS NULL) FROM projects p")


def list_projects(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Every project row (the Project archive index), most recently opened first."""
    return [_project(r) for r in conn.execute(_SELECT + " ORDER BY p.last_opened_at DESC, p.id DESC")]


def get_project(conn: sqlite3.Connection, project_id: int) -> dict[str, Any]:
    row = conn.execute(_SELECT + " WHERE p.id = ?", (project_id,)).fetchone()
    if row is None:
        raise NotFound(f"project {project_id} not found", data={"projectId": project_id})
    return _project(row)


def session_ids(conn: sqlite3.Connection, project_id: int) -> list[str]:
    """Every session the project owns, trashed plugin sessions included."""
    return [r[0] for r in conn.execute("SELECT id FROM sessions WHERE project_id = ? ORDER BY id", (project_id,))]


def remove_project_row(conn: sqlite3.Connection, project_id: int) -> dict[str, Any]:
    """Delete the row, its project memory and a current-project pointer to it (one transaction).

    Refuses (``CONFLICT``) while sessions still belong to it: the caller deletes
    those first, through their session actors.
    """
    project = get_project(conn, project_id)
    left = session_ids(conn, project_id)
    if left:
        raise Conflict(f"project {project_id} still owns {len(left)} session(s)",
                       data={"projectId": project_id, "sessions": left[:20]})
    conn.execute("DELETE FROM kv WHERE ns = ? AND key = ?", (MEMORY_NS, project["path"]))
    current = conn.execute("SELECT value_json FROM kv WHERE ns = 'app' AND key = 'currentProjectId'").fetchone()
    if current is not None:
        try:
            value = orjson.loads(current[0])
        except orjson.JSONDecodeError:
            value = None
        if value == project_id or value == str(project_id):
            conn.execute("DELETE FROM kv WHERE ns = 'app' AND key = 'currentProjectId'")
    conn.execute("DELETE FROM projects WHERE id = ?", (project_id,))
    return project


def pin_project(conn: sqlite3.Connection, project_id: int, pinned: bool) -> dict[str, Any]:
    get_project(conn, project_id)
    conn.execute("UPDATE projects SET pinned = ? WHERE id = ?", (1 if pinned else 0, project_id))
    return get_project(conn, project_id)
