"""Projects: the logical index of places work happens (seed 003 §4.2, §5 "project delete").

A project row is an index entry only: removing it never touches the project
folder on disk. ``projects.remove`` deletes every owned session exactly like
``session.delete`` (one transaction per session, files after the row), then,
in one last transaction, the project row, its ``kv(projectMemory, <path>)``
entry and a ``kv(app, currentProjectId)`` that points at it.

Those are many durable steps, so the removal is recorded before its first
session goes: the *removal intent* ``sessions/project-<id>.removing``
(:class:`RemovalIntent`, written whole and fsynced like a delete marker)
names the project's incarnation (id, path, creation time), every session the
removal deletes and the receipt record of each keyed call that took part. A
call cut short (a crash, an error) leaves it behind; the next call for that
project (its retry) finds it, deletes what is left and answers from it, and
the last transaction stores the receipt of every call it names with that one
answer (:func:`store_removal_receipts`). The intent is removed after that
transaction; one left by a crash right after it names a project incarnation
that no longer exists and is ignored (and replaced by the next removal of
that id).

Project ids (``projectId`` on the wire: an integer ≥ 1) come from this
database: :func:`store.indexing.index.upsert_project` issues one above the
highest id the database ever issued (``kv(projectIds, issued)``), so the id of
a removed project never names another one. A database rebuilt from the files
(lost or corrupt: boot) numbers its projects again; it first raises that mark
to :func:`id_floor_after_loss`, so an id a client kept from the lost database
answers ``NOT_FOUND`` rather than naming another project.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from store import receipts
from store.errors import Conflict, NotFound
from store.faults import NO_FAULTS, Faults
from store.fsutil import atomic_write, remove_file_durable
from store.safe_open import read_json_file

__all__ = [
    "RemovalIntent",
    "drop_removal_intent",
    "get_project",
    "id_floor_after_loss",
    "list_projects",
    "pin_project",
    "read_removal_intent",
    "removal_answer",
    "removal_intent_path",
    "remove_project_row",
    "session_ids",
    "store_removal_receipts",
    "sweep_removal_intents",
    "write_removal_intent",
]

MEMORY_NS = "projectMemory"
REMOVAL_INTENT_SUFFIX = ".removing"
_MAX_INTENT_BYTES = 1 << 26  # ~900k session ids


def _project(row: tuple[Any, ...]) -> dict[str, Any]:
    pid, path, name, pinned, created, opened, count, trashed = row
    return {"id": pid, "path": path, "name": name, "pinned": bool(pinned), "createdAt": created,
            "lastOpenedAt": opened, "sessionCount": count, "trashedSessionCount": trashed}


# sessionCount: the project's sessions session.list shows; trashedSessionCount: its sessions in the trash
# (projects.remove deletes both)
_SELECT = ("SELECT p.id, p.path, p.name, p.pinned, p.created_at, p.last_opened_at, "
           "(SELECT COUNT(*) FROM sessions s WHERE s.project_id = p.id AND s.deleted_at IS NULL), "
           "(SELECT COUNT(*) FROM sessions s WHERE s.project_id = p.id AND s.deleted_at IS NOT NULL) FROM projects p")


def id_floor_after_loss(evidence: Sequence[Path], *, now_ms: int) -> int:
    """The project id mark of a database rebuilt from the files: no earlier database can have reached it.

    The clock in microseconds (never earlier than the newest modification time of ``evidence``, the
    data directory's folders, in case the clock went back): a database issues ids one by one, one per
    project it creates (the rebuild's own included: each takes a transcript read), never a million a
    second, so an earlier database, created at an earlier microsecond ``t0`` and starting at ``t0`` at
    most, stays below now. About 1.8e15 in 2026, 2**53 (a JSON number's exact integers) in 2255."""
    stamp = max(time.time_ns() // 1000, now_ms * 1000)
    for path in evidence:
        try:
            stamp = max(stamp, os.stat(path).st_mtime_ns // 1000 + 1)
        except OSError:
            continue
    return stamp


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


def remove_project_row(conn: sqlite3.Connection, project_id: int) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Delete the row, its project memory and a current-project pointer to it (one transaction): the
    project, and the kv keys that went with it by namespace (what ``settings.changed`` announces).

    Refuses (``CONFLICT``) while sessions still belong to it: the caller deletes
    those first, through their session actors.
    """
    project = get_project(conn, project_id)
    left = session_ids(conn, project_id)
    if left:
        raise Conflict(f"project {project_id} still owns {len(left)} session(s)",
                       data={"projectId": project_id, "sessions": left[:20]})
    cleared: dict[str, list[str]] = {}
    if conn.execute("DELETE FROM kv WHERE ns = ? AND key = ?", (MEMORY_NS, project["path"])).rowcount:
        cleared[MEMORY_NS] = [project["path"]]
    current = conn.execute("SELECT value_json FROM kv WHERE ns = 'app' AND key = 'currentProjectId'").fetchone()
    if current is not None:
        try:
            value = orjson.loads(current[0])
        except orjson.JSONDecodeError:
            value = None
        if value == project_id or value == str(project_id):
            conn.execute("DELETE FROM kv WHERE ns = 'app' AND key = 'currentProjectId'")
            cleared["app"] = ["currentProjectId"]
    conn.execute("DELETE FROM projects WHERE id = ?", (project_id,))
    return project, cleared


def pin_project(conn: sqlite3.Connection, project_id: int, pinned: bool) -> dict[str, Any]:
    get_project(conn, project_id)
    conn.execute("UPDATE projects SET pinned = ? WHERE id = ?", (1 if pinned else 0, project_id))
    return get_project(conn, project_id)


# -- the removal intent (``projects.remove``): what the removal deletes, durable before it starts


@dataclass(frozen=True, slots=True)
class RemovalIntent:
    """A ``projects.remove`` in progress: the project's incarnation, the sessions it deletes (sorted)
    and the receipt record of every keyed call that took part in it."""

    project_id: int
    path: str
    created_at: int
    sessions: tuple[str, ...] = ()
    receipt_records: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def begin(cls, project: Mapping[str, Any]) -> RemovalIntent:
        return cls(int(project["id"]), str(project["path"]), int(project["createdAt"]))

    def of(self, project: Mapping[str, Any]) -> bool:
        """Whether it is this project row's (not an earlier row that had the same id)."""
        return (self.project_id, self.path, self.created_at) == (project["id"], project["path"],
                                                                 project["createdAt"])

    def with_sessions(self, ids: Sequence[str]) -> RemovalIntent:
        return replace(self, sessions=tuple(sorted({*self.sessions, *ids})))

    def without_session(self, sid: str) -> RemovalIntent:
        return replace(self, sessions=tuple(s for s in self.sessions if s != sid))

    def with_receipt(self, record: Mapping[str, Any] | None) -> RemovalIntent:
        if record is None or any(_same_key(r, record) for r in self.receipt_records):
            return self
        return replace(self, receipt_records=(*self.receipt_records, dict(record)))


def _same_key(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return (a.get("clientId"), a.get("submissionId")) == (b.get("clientId"), b.get("submissionId"))


def removal_intent_path(sessions_dir: Path, project_id: int) -> Path:
    return sessions_dir / f"project-{int(project_id)}{REMOVAL_INTENT_SUFFIX}"


def write_removal_intent(path: Path, intent: RemovalIntent, *, faults: Faults = NO_FAULTS) -> None:
    """Replace the intent whole (temp, fsync, rename, directory fsync)."""
    body = {"type": "project_remove", "projectId": intent.project_id, "path": intent.path,
            "createdAt": intent.created_at, "sessions": list(intent.sessions), "receipts": list(intent.receipt_records)}
    atomic_write(path, orjson.dumps(body) + b"\n", faults=faults, point_prefix="projects.remove.intent")


def read_removal_intent(path: Path) -> RemovalIntent | None:
    """The intent at ``path``; ``None`` when there is none (or it is not one: it is then replaced)."""
    return _intent_of(read_json_file(path, _MAX_INTENT_BYTES))


def _intent_of(body: Any) -> RemovalIntent | None:
    if not isinstance(body, dict) or body.get("type") != "project_remove":
        return None
    pid, path, created = body.get("projectId"), body.get("path"), body.get("createdAt")
    sessions, records = body.get("sessions"), body.get("receipts")
    if not (type(pid) is int and isinstance(path, str) and type(created) is int
            and isinstance(sessions, list) and all(isinstance(s, str) for s in sessions)
            and isinstance(records, list)):
        return None
    kept = tuple(r for r in records if receipts.key_of_record(r) is not None)
    return RemovalIntent(pid, path, created, tuple(sorted(set(sessions))), kept)


def drop_removal_intent(path: Path) -> None:
    remove_file_durable(path)


def removal_answer(project: Mapping[str, Any], intent: RemovalIntent | None) -> dict[str, Any]:
    """The answer of the removal: every session it deleted, as its intent names them."""
    return {"projectId": project["id"], "path": project["path"],
            "deletedSessions": list(intent.sessions) if intent is not None else []}


def store_removal_receipts(conn: sqlite3.Connection, intent: RemovalIntent, answer: Any, *,
                           now_ms: int) -> None:
    """In the removal's last transaction: the receipt of every keyed call the intent names, with the
    one answer (a call cut short and finished by another one gets that answer on its retry)."""
    for record in intent.receipt_records:
        key = receipts.key_of_record(record)
        if key is not None:
            receipts.store(conn, key, answer, session_id=None, now_ms=now_ms)


def sweep_removal_intents(conn: sqlite3.Connection, sessions_dir: Path) -> int:
    """Boot: remove every removal intent whose project incarnation no longer exists (its removal
    committed and the host died before the intent went). One whose project is still there stays for
    the removal's retry. Returns how many went."""
    swept = 0
    for name in os.listdir(sessions_dir):
        if not (name.startswith("project-") and name.endswith(REMOVAL_INTENT_SUFFIX)):
            continue
        path = sessions_dir / name
        intent = read_removal_intent(path)
        if intent is not None:
            try:
                if intent.of(get_project(conn, intent.project_id)):
                    continue
            except NotFound:
                pass
        drop_removal_intent(path)
        swept += 1
    return swept
