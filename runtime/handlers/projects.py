"""Projects (seed 003 §4.2): the archive index, and removing a project with its sessions.

``projects.remove`` first records what it is about to delete, durably: the
removal intent (``store/projects.py``: the project's incarnation, its session
ids and this call's receipt record). Then it deletes each owned session
exactly as ``session.delete`` does, through that session's actor (marker,
rows, files), then the project row and its project memory in a last
transaction with the receipt (of every keyed call the intent names), announces
the kv keys that went with it (``settings.changed``: the project memory, and
``currentProjectId`` when it named the project), and removes the intent. A
retry after a crash at any step finds the intent, deletes what is left and
answers from it: every session of the removal, whichever attempt deleted it.
The project's folder on disk is never touched.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from actors.session import SessionOp
from protocol import models as m
from runtime.context import HostContext, ReadContext, WriterContext
from store import projects
from store.errors import Conflict, SessionNotFound, StoreError
from store.projects import RemovalIntent
from store.receipts import ReceiptKey, file_record

from .sessions import delete as delete_session

__all__ = ["list_projects", "pin", "remove"]

log = logging.getLogger("pi_host")

_DELETE = SessionOp(delete_session, mutating=True, name="session.delete")  # as session.delete does it


def list_projects(ctx: ReadContext, p: m.ProjectsListParams) -> Any:
    return {"projects": projects.list_projects(ctx.conn)}


def pin(ctx: WriterContext, p: m.ProjectsPinParams, key: ReceiptKey | None) -> Any:
    return {"project": projects.pin_project(ctx.conn, p.project_id, p.pinned)}


async def remove(ctx: HostContext, p: m.ProjectsRemoveParams, key: ReceiptKey | None) -> Any:
    project_id = p.project_id
    project = await ctx.read(projects.get_project, project_id)
    path = projects.removal_intent_path(ctx.services.data_dir.sessions_dir, project_id)
    intent = await _pending_intent(ctx, path, project)
    record = file_record(key) if key is not None else None
    for _attempt in range(3):  # a session created meanwhile is deleted on the next pass
        ids = await ctx.read(projects.session_ids, project_id)
        if ids or intent is not None:
            base = intent if intent is not None else RemovalIntent.begin(project)
            intent = await _record(ctx, path, intent, base.with_sessions(ids).with_receipt(record))
        for sid in ids:
            intent = await _delete_one(ctx, path, intent, sid)
        cleared: dict[str, list[str]] = {}
        try:
            answer = await ctx.commit(_last_step(ctx, project_id, intent, cleared))
        except Conflict as exc:
            if "sessions" not in exc.data:
                raise
            continue
        for ns, keys in cleared.items():  # the project memory and the workspace pointer that went with it
            ctx.publish("settings.changed", {"ns": ns, "keys": keys})
        if intent is not None:
            await _drop(ctx, path)
        return answer
    raise Conflict(f"project {project_id} keeps gaining sessions; try again", data={"projectId": project_id})


async def _pending_intent(ctx: HostContext, path: Path, project: Mapping[str, Any]) -> RemovalIntent | None:
    """The intent an earlier call on this project row left (cut short); one of an earlier row that had
    this id (its removal committed) is none."""
    found = await ctx.in_thread(projects.read_removal_intent, path)
    return found if found is not None and found.of(project) else None


async def _record(ctx: HostContext, path: Path, old: RemovalIntent | None, new: RemovalIntent) -> RemovalIntent:
    """Make ``new`` durable unless it is what the file already says."""
    if new != old:
        await ctx.in_thread(lambda: projects.write_removal_intent(path, new, faults=ctx.services.faults))
    return new


async def _delete_one(ctx: HostContext, path: Path, intent: RemovalIntent | None, sid: str) -> RemovalIntent | None:
    """Delete ``sid`` as ``session.delete`` does; one that is already gone (not by this removal) leaves
    the intent, so it is not in the answer."""
    try:
        await ctx.session_call(sid, _DELETE, m.SessionDeleteParams(session_id=sid))
    except SessionNotFound:
        if intent is not None:
            return await _record(ctx, path, intent, intent.without_session(sid))
    return intent


def _last_step(ctx: HostContext, project_id: int, intent: RemovalIntent | None,
               cleared: dict[str, list[str]]) -> Any:
    """The last transaction; ``cleared`` receives the kv keys it deleted, by namespace."""
    now = ctx.now()

    def effect(conn: Any) -> Any:
        removed, gone = projects.remove_project_row(conn, project_id)
        answer = projects.removal_answer(removed, intent)
        if intent is not None:
            projects.store_removal_receipts(conn, intent, answer, now_ms=now)
        cleared.clear()
        cleared.update(gone)
        return answer

    return effect


async def _drop(ctx: HostContext, path: Path) -> None:
    """The removal committed: its intent goes. Left behind, it names a row that no longer exists and is
    ignored, so a failure here does not fail the committed call."""
    try:
        await ctx.in_thread(projects.drop_removal_intent, path)
    except StoreError as exc:
        log.warning("a finished project removal left its intent %s: %s", path, exc)
