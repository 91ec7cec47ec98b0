"""``settings.get`` / ``getAll`` / ``set`` / ``update`` / ``delete``: the ``kv`` table (seed 003 §4.1).

Every write runs in the DB writer's transaction: the rows it needs are read,
``store/settings_rules.plan_write`` decides (a bad value is ``INVALID_PARAMS``
naming the field, and nothing is written), the plan is applied, and
``settings.changed {ns, keys}`` is published after the commit — key names
only, never values. A plugin connection reaches only its own ``plugin:<id>``
namespace (``plugins.require_owner``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from protocol import models as m
from runtime.context import ReadContext, WriterContext
from store.config import settings
from store.config.settings_rules import (
    APP_NS,
    APP_SETTINGS_KEY,
    DELETE,
    HOST_OWNED_APP_KEYS,
    app_view,
    canonical_key,
    check_key,
    plan_write,
    plugin_of,
    rules_for,
)
from store.errors import DamagedRecord, InvalidInput
from store.project_memory import memory_view
from store.receipts import ReceiptKey
from store.upgrade.seed_migrations import current_platform

from .plugins import require_owner

__all__ = ["delete", "get", "get_all", "set_value", "update"]

TOPIC = "settings.changed"


def require_namespace(caller: Any, ns: str) -> None:
    """A plugin connection may use only its own ``plugin:<id>`` namespace."""
    if caller.plugin_id is not None:
        require_owner(caller, plugin_of(ns), what=f"namespace {ns}")


def get(ctx: ReadContext, p: m.SettingsGetParams) -> Any:
    require_namespace(ctx.caller, p.ns)
    ns = p.ns
    check_key(ns, p.key)
    if ns == APP_NS and p.key not in HOST_OWNED_APP_KEYS.keys() - {APP_SETTINGS_KEY}:
        found, damaged = _app_blob(ctx)
        view = app_view(found[0] if found else None, current_platform())
        if p.key != APP_SETTINGS_KEY and p.key not in view:
            return _got(ns, p.key, _UNSET, found[1] if found else None, damaged)
        value = view if p.key == APP_SETTINGS_KEY else view[p.key]
        return _got(ns, p.key, value, found[1] if found else None, damaged)
    found = settings.get_value(ctx.conn, ns, canonical_key(ns, p.key))
    if found is None:
        return _got(ns, p.key, _UNSET, None)
    value, updated = found
    if ns == "projectMemory":
        stored_key = canonical_key(ns, p.key)
        value = memory_view(value, f"setting {ns}/{stored_key}", kv=(ns, stored_key))
    return _got(ns, p.key, value, updated)


_UNSET: Any = object()
"""A key that is not set: ``value`` is left out (README SettingsGetResult), so it differs from a stored null."""


def _got(ns: str, key: str, value: Any, updated: int | None, damaged: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"ns": ns, "key": key}
    if value is not _UNSET:
        out["value"] = value
    if updated is not None:
        out["updatedAt"] = updated
    if damaged:
        out["unreadable"] = [APP_SETTINGS_KEY]
    return out


def _app_blob(ctx: ReadContext) -> tuple[tuple[Any, int] | None, bool]:
    """The stored app blob for a read, and whether it is damaged. A damaged blob reads as unset, its fields
    their defaults (seed 003 §7: "host settings reads normalize a missing, malformed, or out-of-range value"),
    and the answer names it in ``unreadable``; a write of app settings stays CORRUPT_DATA (its bytes are kept
    until ``pi-host doctor --repair`` sets them aside), so nothing is ever merged into the defaults shown."""
    try:
        return settings.app_blob(ctx.conn), False
    except DamagedRecord:
        return None, True


def get_all(ctx: ReadContext, p: m.SettingsGetAllParams) -> Any:
    require_namespace(ctx.caller, p.ns)
    rules = rules_for(p.ns)
    if not rules.listable:
        raise InvalidInput(f"namespace {p.ns} is read one key at a time (settings.get)", data={"field": "ns"})
    if p.ns == APP_NS:
        found, blob_damaged = _app_blob(ctx)
        out: dict[str, Any] = {"ns": APP_NS, "values": app_view(found[0] if found else None, current_platform())}
        if found is not None:
            out["updatedAt"] = found[1]
        if blob_damaged:
            out["unreadable"] = [APP_SETTINGS_KEY]
        return out
    rows, damaged = settings.namespace_rows(ctx.conn, p.ns, rules.max_keys)
    out = {"ns": p.ns, "values": {k: v for k, (v, _) in rows.items()}}
    if rows:
        out["updatedAt"] = max(u for _, u in rows.values())
    if damaged:
        out["unreadable"] = damaged
    return out


def _write(ctx: WriterContext, ns: str, changes: Mapping[str, Any]) -> Any:
    require_namespace(ctx.caller, ns)
    current, count = settings.read_for_write(ctx.conn, ns, changes)
    plan = plan_write(ns, current, changes, existing_keys=count, now_ms=ctx.now, platform=current_platform())
    settings.apply_plan(ctx.conn, plan, ctx.now)
    if plan.changed:
        ctx.publish(TOPIC, {"ns": ns, "keys": plan.changed})
    return plan


def set_value(ctx: WriterContext, p: m.SettingsSetParams, key: ReceiptKey | None) -> Any:
    plan = _write(ctx, p.ns, {p.key: p.value})
    out: dict[str, Any] = {"ns": p.ns, "key": p.key, "changed": plan.changed, "updatedAt": ctx.now}
    value = plan.values.get(p.key)
    if value is not None:
        out["value"] = value
    return out


def update(ctx: WriterContext, p: m.SettingsUpdateParams, key: ReceiptKey | None) -> Any:
    plan = _write(ctx, p.ns, p.values)
    return {"ns": p.ns, "values": plan.values, "changed": plan.changed, "updatedAt": ctx.now}


def delete(ctx: WriterContext, p: m.SettingsDeleteParams, key: ReceiptKey | None) -> Any:
    plan = _write(ctx, p.ns, {p.key: DELETE})
    return {"ns": p.ns, "key": p.key, "deleted": bool(plan.changed), "changed": plan.changed}
