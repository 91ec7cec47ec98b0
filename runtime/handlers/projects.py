"""Projects (seed 003 §4.2): the archive index, and removing a project with its sessions.

``projects.remove`` deletes each owned session exactly as ``session.delete``
does, through that session's actor (marker, rows, files), then the project
row and its project memory in a last transaction with the receipt. The
project's folder on disk is never touched.
"""

from __future__ import annotations

from typing import Any

from actors.session import SessionOp
from protocol import models as m
from runtime.context import HostContext, ReadContext, WriterContext
from store import projects
from store.errors import Conflict, SessionNotFound
from store.receipts import ReceiptKey

from .sessions import delete as delete_session

__all__ = ["list_projects", "pin", "remove"]

_DELETE = SessionOp(delete_session, mutating=True)


def list_projects(ctx: ReadContext, p: m.ProjectsListParams) -> Any:
    return {"projects": projects.list_projects(ctx.conn)}


def pin(ctx: WriterContext, p: m.ProjectsPinParams, key: ReceiptKey | None) -> Any:
    return {"project": projects.pin_project(ctx.conn, p.project_id, p.pinned)}


async def remove(ctx: HostContext, p: m.ProjectsRemoveParams, key: ReceiptKey | None) -> Any:
    project_id = p.project_id
    await ctx.read(projects.get_project, project_id)
    deleted: list[str] = []
    for _attempt in range(3):  # a session created meanwhile is deleted on the next pass
        for sid in await ctx.read(projects.session_ids, project_id):
            try:
                await ctx.session_call(sid, _DELETE, m.SessionDeleteParams(session_id=sid))
                deleted.append(sid)
            except SessionNotFound:
                pass

        def effect(conn: Any) -> Any:
            project = projects.remove_project_row(conn, project_id)
            return {"projectId": project_id, "path": project["path"], "deletedSessions": sorted(deleted)}

        try:
            return await ctx.commit(effect)
        except Conflict as exc:
            if "sessions" not in exc.data:
                raise
    raise Conflict(f"project {project_id} keeps gaining sessions; try again", data={"projectId": project_id})
