"""Project groups (seed 003 §1): records, group memory and instructions, all DB-only (DB writer)."""

from __future__ import annotations

from typing import Any

from protocol import models as m
from runtime.context import ReadContext, WriterContext
from store import project_groups as groups
from store.ids import new_id
from store.receipts import ReceiptKey

__all__ = ["delete", "get", "list_groups", "save", "set_instructions", "set_memory"]

TOPIC = "settings.changed"


def list_groups(ctx: ReadContext, p: m.ProjectGroupsListParams) -> Any:
    return groups.list_groups(ctx.conn).result("groups")


def get(ctx: ReadContext, p: m.ProjectGroupsGetParams) -> Any:
    return groups.group_details(ctx.conn, p.group_id)


def save(ctx: WriterContext, p: m.ProjectGroupsSaveParams, key: ReceiptKey | None) -> Any:
    group = groups.save_group(ctx.conn, p.group_id, p.name, list(p.roots), p.primary_root,
                              new_id=new_id("g-"), now_ms=ctx.now)
    ctx.publish(TOPIC, {"ns": groups.GROUPS_NS, "keys": [group["id"]]})
    return {"group": group}


def delete(ctx: WriterContext, p: m.ProjectGroupsDeleteParams, key: ReceiptKey | None) -> Any:
    deleted = groups.delete_group(ctx.conn, p.group_id)
    if deleted:
        ctx.publish(TOPIC, {"ns": groups.GROUPS_NS, "keys": [p.group_id]})
    return {"groupId": p.group_id, "deleted": deleted}


def set_memory(ctx: WriterContext, p: m.ProjectGroupsSetMemoryParams, key: ReceiptKey | None) -> Any:
    memory = groups.set_memory(ctx.conn, p.group_id, p.memory, ctx.now)
    ctx.publish(TOPIC, {"ns": groups.MEMORY_NS, "keys": [p.group_id]})
    return {"groupId": p.group_id, "memory": memory}


def set_instructions(ctx: WriterContext, p: m.ProjectGroupsSetInstructionsParams, key: ReceiptKey | None) -> Any:
    text = groups.set_instructions(ctx.conn, p.group_id, p.instructions, ctx.now)
    ctx.publish(TOPIC, {"ns": groups.INSTRUCTIONS_NS, "keys": [p.group_id]})
    out: dict[str, Any] = {"groupId": p.group_id}
    if text is not None:
        out["instructions"] = text
    return out
