"""The ``kv`` table (seed 003 §4.1): namespaced configuration values, one JSON value per key.

What a namespace accepts is ``store/config/settings_rules.py`` (pure); this module
reads the rows a write needs and applies a :class:`~store.config.settings_rules.KvPlan`
in the caller's transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

import orjson

from store.config.settings_rules import APP_NS, APP_SETTINGS_KEY, DELETE, KvPlan, canonical_key

__all__ = [
    "apply_plan",
    "count_keys",
    "delete_namespace",
    "delete_value",
    "get_value",
    "namespace_rows",
    "read_for_write",
    "set_value",
]


def get_value(conn: sqlite3.Connection, ns: str, key: str) -> tuple[Any, int] | None:
    """(value, updated_at) of ``ns``/``key``, or None when unset."""
    row = conn.execute("SELECT value_json, updated_at FROM kv WHERE ns = ? AND key = ?", (ns, key)).fetchone()
    if row is None:
        return None
    try:
        return orjson.loads(row[0]), int(row[1])
    except orjson.JSONDecodeError:
        return None, int(row[1])  # a hand-edited row: readers normalize it


def set_value(conn: sqlite3.Connection, ns: str, key: str, value: Any, now_ms: int) -> None:
    conn.execute(
        "INSERT INTO kv(ns, key, value_json, updated_at) VALUES (?,?,?,?) ON CONFLICT(ns, key) "
        "DO UPDATE SET value_json = excluded.value_json, updated_at = excluded.updated_at",
        (ns, key, orjson.dumps(value).decode(), now_ms),
    )


def delete_value(conn: sqlite3.Connection, ns: str, key: str) -> bool:
    return conn.execute("DELETE FROM kv WHERE ns = ? AND key = ?", (ns, key)).rowcount > 0


def delete_namespace(conn: sqlite3.Connection, ns: str) -> int:
    """Every key of ``ns`` in ONE statement (plugin uninstall, seed §11.8)."""
    return conn.execute("DELETE FROM kv WHERE ns = ?", (ns,)).rowcount


def count_keys(conn: sqlite3.Connection, ns: str) -> int:
    return int(conn.execute("SELECT COUNT(*) FROM kv WHERE ns = ?", (ns,)).fetchone()[0])


def namespace_rows(conn: sqlite3.Connection, ns: str, limit: int) -> dict[str, tuple[Any, int]]:
    """Up to ``limit`` keys of ``ns`` (key order): key -> (value, updated_at)."""
    out: dict[str, tuple[Any, int]] = {}
    for key, raw, updated in conn.execute(
            "SELECT key, value_json, updated_at FROM kv WHERE ns = ? ORDER BY key LIMIT ?", (ns, limit)):
        try:
            out[key] = (orjson.loads(raw), int(updated))
        except orjson.JSONDecodeError:
            out[key] = (None, int(updated))
    return out


def read_for_write(conn: sqlite3.Connection, ns: str, keys: Iterable[str]) -> tuple[dict[str, Any], int]:
    """The stored values a write of ``keys`` to ``ns`` can touch, and the key count of ``ns``."""
    wanted = [APP_SETTINGS_KEY] if ns == APP_NS else sorted({canonical_key(ns, k) for k in keys})
    current: dict[str, Any] = {}
    for key in wanted:
        found = get_value(conn, ns, key)
        if found is not None:
            current[key] = found[0]
    return current, count_keys(conn, ns)


def apply_plan(conn: sqlite3.Connection, plan: KvPlan, now_ms: int) -> None:
    for key, value in plan.rows.items():
        if value is DELETE:
            delete_value(conn, plan.ns, key)
        else:
            set_value(conn, plan.ns, key, value, now_ms)
