"""``skills.*`` and ``memories.list`` (seed 000 §2 ``skills, memories``; storage: ``store/skills.py``).

Writes run in the DB writer's transaction with their receipt, like every
``settings.*`` write, and publish ``settings.changed {ns: "skills", keys}``
after the commit (names only, never a source). A bad value is refused before
anything is written.
"""

from __future__ import annotations

from typing import Any

from protocol import models as m
from runtime.context import ReadContext, WriterContext
from store import skills
from store.errors import NotFound
from store.receipts import ReceiptKey

__all__ = ["delete", "get", "list_memories", "list_skills", "put"]

TOPIC = "settings.changed"


def list_skills(ctx: ReadContext, p: m.SkillsListParams) -> Any:
    return skills.list_skills(ctx.conn).result("skills")


def get(ctx: ReadContext, p: m.SkillsGetParams) -> Any:
    skill = skills.get_skill(ctx.conn, p.name, checked=True)
    if skill is None:
        raise NotFound(f"skill {p.name!r} is not stored", data={"name": p.name})
    return {"skill": skill}


def put(ctx: WriterContext, p: m.SkillsPutParams, key: ReceiptKey | None) -> Any:
    skill, changed = skills.put_skill(ctx.conn, name=p.name, version=p.version, source=p.source,
                                      description=p.description, origin=p.origin, now_ms=ctx.now)
    if changed:
        ctx.publish(TOPIC, {"ns": skills.SKILLS_NS, "keys": [p.name]})
    return {"skill": {k: v for k, v in skill.items() if k != "source"}, "changed": changed}


def delete(ctx: WriterContext, p: m.SkillsDeleteParams, key: ReceiptKey | None) -> Any:
    deleted = skills.delete_skill(ctx.conn, p.name, now_ms=ctx.now)
    if deleted:
        ctx.publish(TOPIC, {"ns": skills.SKILLS_NS, "keys": [p.name]})
    return {"name": p.name, "deleted": deleted}


def list_memories(ctx: ReadContext, p: m.MemoriesListParams) -> Any:
    page = skills.list_memories(ctx.conn, p.scope, after=p.after, limit=p.limit + 1)
    shown = page[:p.limit]
    out: dict[str, Any] = {"memories": [summary for _, summary in shown if summary is not None]}
    damaged = [key for key, summary in shown if summary is None]
    if damaged:
        out["unreadable"] = damaged
    if len(page) > p.limit:
        out["nextAfter"] = shown[-1][0]
    return out
