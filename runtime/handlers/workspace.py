"""The visible workspace and a session's tool root (seed 003 §4.1 D093, §4.2, §11.9, §11.10).

``workspace.open`` runs in the DB writer: one transaction upserts the project
by its canonical path and sets ``kv(app, currentProjectId)``. ``workspace.get``
reads the pointer back (the host half of §11.9: resetting the renderer's
sidebar preferences loses nothing, the selected workspace comes from here).
``session.resolvePath`` gives the agent sidecar a session's own persisted
project root — never the visible workspace (§11.10) — and resolves a path
against it.
"""

from __future__ import annotations

from typing import Any

from protocol import models as m
from runtime.context import ReadContext, WriterContext
from store import workspace
from store.receipts import ReceiptKey

__all__ = ["get", "open_workspace", "resolve_path"]


def _result(project: dict[str, Any] | None) -> dict[str, Any]:
    return {"currentProjectId": project["id"], "project": project} if project else {}


def open_workspace(ctx: WriterContext, p: m.WorkspaceOpenParams, key: ReceiptKey | None) -> Any:
    project = workspace.open_workspace(ctx.conn, p.path, p.name, ctx.now)
    ctx.publish("settings.changed", {"ns": "app", "keys": [workspace.CURRENT_KEY[1]]})
    return _result(project)


def get(ctx: ReadContext, p: m.WorkspaceGetParams) -> Any:
    return _result(workspace.current_project(ctx.conn))


def resolve_path(ctx: ReadContext, p: m.SessionResolvePathParams) -> Any:
    return workspace.resolve_for_session(ctx.conn, p.session_id, p.path)
