"""The ``kv`` table (seed 003 §4.1): namespaced configuration values, one JSON value per key."""

from __future__ import annotations

import sqlite3
from typing import Any

import orjson

__all__ = ["get_value", "set_value"]


def get_value(conn: sqlite3.Connection, ns: str, key: str) -> tuple[Any, int] | None:
    """(value, updated_at) of ``ns``/``key``, or None when unset."""
    row = conn.execute("SELECT value_json, updated_at FROM kv WHERE ns = ? AND key = ?", (ns, key)).fetchone()
    if row is None:
        return None
    return orjson.loads(row[0]), int(row[1])


def set_value(conn: sqlite3.Connection, ns: str, key: str, value: Any, now_ms: int) -> None:
    conn.execute(
        "INSERT INTO kv(ns, key, value_json, updated_at) VALUES (?,?,?,?) ON CONFLICT(ns, key) "
        "DO UPDATE SET value_json = excluded.value_json, updated_at = excluded.updated_at",
        (ns, key, orjson.dumps(value).decode(), now_ms),
    )
