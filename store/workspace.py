"""The visible workspace and tool roots (seed 003 §4.1 D093, §4.2, §4.5, §11.9, §11.10).

* ``kv(app, currentProjectId)`` is the visible workspace: ``workspace.open``
  upserts the project row by its canonical path and points it there;
  ``workspace.get`` reads it back (a pointer to a removed project reads as
  none). Nothing else is stored for the workspace: sidebar preferences are the
  renderer's.
* A session's tool root is its *own* ``project_id`` (the persisted project),
  never the visible workspace: :func:`resolve_for_session` resolves a path
  against it, lexically (``.``/``..`` folded, nothing on disk is touched).
"""

from __future__ import annotations

import posixpath
import sqlite3
from typing import Any, Final

from store.config.settings import get_value, set_value
from store.config.settings_rules import canonical_path
from store.errors import Conflict, InvalidInput
from store.indexing import index
from store.projects import get_project
from store.rules import DRIVE_RE, is_absolute_path

__all__ = ["CURRENT_KEY", "current_project", "fold_absolute", "open_workspace", "resolve_for_session", "resolve_under"]

CURRENT_KEY: Final = ("app", "currentProjectId")


def open_workspace(conn: sqlite3.Connection, path: str, name: str | None, now_ms: int) -> dict[str, Any]:
    """Upsert the project of ``path`` (touching ``last_opened_at``) and make it the current one."""
    canonical = canonical_path(path)
    if not canonical or "\x00" in canonical or not is_absolute_path(canonical):
        raise InvalidInput("path must be an absolute project path", data={"field": "path"})
    project_id = index.upsert_project(conn, canonical, now_ms)
    if name is not None:
        conn.execute("UPDATE projects SET name = ? WHERE id = ?", (name.strip(), project_id))
    set_value(conn, *CURRENT_KEY, project_id, now_ms)
    return get_project(conn, project_id)


def current_project(conn: sqlite3.Connection) -> dict[str, Any] | None:
    found = get_value(conn, *CURRENT_KEY, lenient=True)
    value = found[0] if found else None
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if type(value) is not int:
        return None
    row = conn.execute("SELECT 1 FROM projects WHERE id = ?", (value,)).fetchone()
    return get_project(conn, value) if row else None


def fold_absolute(path: str) -> str:
    """An absolute ``/``-separated path with ``.``/``..`` folded lexically. A Windows drive path folds below
    its drive: ``..`` stops at ``C:/`` as it stops at ``/`` (posixpath alone reads ``C:`` as a segment it can
    leave, so ``C:/w/..`` became the drive-relative ``C:`` and ``C:/w/../../x`` the relative ``x``)."""
    drive = path[:2] if DRIVE_RE.match(path) else ""
    folded = posixpath.normpath(path[len(drive):])
    if folded.startswith("//"):
        folded = "/" + folded.lstrip("/")
    return drive + folded


def resolve_under(root: str, path: str) -> tuple[str, bool]:
    """``path`` (relative: against ``root``) folded lexically, and whether it stays under ``root``."""
    p = path.replace("\\", "/")
    joined = p if is_absolute_path(p) else f"{root.rstrip('/')}/{p}"
    resolved = fold_absolute(joined)
    base = root.rstrip("/") or "/"
    inside = resolved == base or resolved.startswith(base if base.endswith("/") else base + "/")
    return resolved, inside


def resolve_for_session(conn: sqlite3.Connection, session_id: str, path: str | None) -> dict[str, Any]:
    """The session's persisted project root, and ``path`` resolved against it."""
    row = index.require_session(conn, session_id)
    root = row.get("projectPath")
    out: dict[str, Any] = {"sessionId": session_id}
    if row.get("projectId") is not None:
        out["projectId"] = row["projectId"]
    if root:
        out["root"] = root
    if path is None:
        return out
    if "\x00" in path:
        raise InvalidInput("path must not contain NUL", data={"field": "path"})
    if not root:
        if not is_absolute_path(path.replace("\\", "/")):
            raise Conflict(f"session {session_id} has no project root to resolve {path!r} against",
                           data={"sessionId": session_id, "reason": "no_project_root"})
        resolved = fold_absolute(path.replace("\\", "/"))
        out.update(path=resolved, insideRoot=False)
        return out
    resolved, inside = resolve_under(root, path)
    out.update(path=resolved, insideRoot=inside)
    return out
