"""The ``kv`` table (seed 003 §4.1): namespaced configuration values, one JSON value per key.

What a namespace accepts is ``store/config/settings_rules.py`` (pure); this module
reads the rows a write needs and applies a :class:`~store.config.settings_rules.KvPlan`
in the caller's transaction.

Values are read with :func:`store.jsonio.loads_exact` and written with :func:`store.jsonio.dumps_exact`: an
integer beyond 64 bits a seed-era value holds (the guarded migration keeps it exact) stays exact, so a write
of one app field never rewrites another one rounded.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

import orjson

from store.config.settings_rules import APP_NS, APP_SETTINGS_KEY, DELETE, KvPlan, canonical_key
from store.errors import DamagedRecord, damaged_setting
from store.jsonio import dumps_exact, loads_exact

__all__ = [
    "app_blob",
    "apply_plan",
    "count_keys",
    "delete_namespace",
    "delete_value",
    "get_object",
    "get_value",
    "namespace_rows",
    "read_for_write",
    "set_value",
]


_DAMAGED: Any = object()
"""A stored value that no longer parses, as :func:`read_for_write` hands it to the plan."""


def get_value(conn: sqlite3.Connection, ns: str, key: str, *, lenient: bool = False,
              what: str | None = None) -> tuple[Any, int] | None:
    """(value, updated_at) of ``ns``/``key``, or None when unset.

    A stored value that no longer parses (the host writes JSON only) is ``DamagedRecord`` (CORRUPT_DATA, data
    ``ns``, ``key`` and ``repair``: ``pi-host doctor --repair`` sets it aside): never read as unset, so no write
    merges into an empty view of it. ``lenient`` is for the few readers whose own record a damaged value may stand
    in for as ``(None, updated_at)`` (a write of theirs replaces it whole): the saved provider order, the current
    project, a skill's rows, a delivery's carried answer, a group's existence, whether a config-sync configure
    landed. ``what`` names the record in the error's message (``store.errors.damaged_setting``)."""
    row = conn.execute("SELECT value_json, updated_at FROM kv WHERE ns = ? AND key = ?", (ns, key)).fetchone()
    if row is None:
        return None
    try:
        return loads_exact(row[0]), int(row[1])
    except orjson.JSONDecodeError as exc:
        if lenient:
            return None, int(row[1])
        raise damaged_setting(ns, key, str(exc), what) from None


def app_blob(conn: sqlite3.Connection) -> tuple[dict[str, Any], int] | None:
    """The app settings blob ``kv(app, settings)`` and its updated_at, None when unset; ``DamagedRecord`` when
    it no longer parses as an object (the host writes only objects): every app key lives in it, so no app
    setting reads or writes until it is repaired."""
    return get_object(conn, APP_NS, APP_SETTINGS_KEY)


def get_object(conn: sqlite3.Connection, ns: str, key: str,
               what: str | None = None) -> tuple[dict[str, Any], int] | None:
    """:func:`get_value` of a record the host writes only as a JSON object (the app blob, the config-sync
    settings, a skill's rows): ``DamagedRecord`` naming it (``what``: in the message) when it is not one."""
    found = get_value(conn, ns, key, what=what)
    if found is not None and not isinstance(found[0], dict):
        raise damaged_setting(ns, key, f"a JSON {type(found[0]).__name__}, not an object", what)
    return found


def set_value(conn: sqlite3.Connection, ns: str, key: str, value: Any, now_ms: int) -> None:
    conn.execute(
        "INSERT INTO kv(ns, key, value_json, updated_at) VALUES (?,?,?,?) ON CONFLICT(ns, key) "
        "DO UPDATE SET value_json = excluded.value_json, updated_at = excluded.updated_at",
        (ns, key, dumps_exact(value).decode(), now_ms),
    )


def delete_value(conn: sqlite3.Connection, ns: str, key: str) -> bool:
    return conn.execute("DELETE FROM kv WHERE ns = ? AND key = ?", (ns, key)).rowcount > 0


def delete_namespace(conn: sqlite3.Connection, ns: str) -> int:
    """Every key of ``ns`` in ONE statement (plugin uninstall, seed §11.8)."""
    return conn.execute("DELETE FROM kv WHERE ns = ?", (ns,)).rowcount


def count_keys(conn: sqlite3.Connection, ns: str) -> int:
    return int(conn.execute("SELECT COUNT(*) FROM kv WHERE ns = ?", (ns,)).fetchone()[0])


def namespace_rows(conn: sqlite3.Connection, ns: str,
                   limit: int) -> tuple[dict[str, tuple[Any, int]], list[str]]:
    """Up to ``limit`` keys of ``ns`` (key order): (key -> (value, updated_at), the keys whose stored value no
    longer parses: left out of the first, named in the second)."""
    out: dict[str, tuple[Any, int]] = {}
    damaged: list[str] = []
    for key, raw, updated in conn.execute(
            "SELECT key, value_json, updated_at FROM kv WHERE ns = ? ORDER BY key LIMIT ?", (ns, limit)).fetchall():
        try:
            out[key] = (loads_exact(raw), int(updated))
        except orjson.JSONDecodeError:
            damaged.append(str(key))
    return out, damaged


def read_for_write(conn: sqlite3.Connection, ns: str, keys: Iterable[str]) -> tuple[dict[str, Any], int]:
    """The stored values a write of ``keys`` to ``ns`` can touch, and the key count of ``ns``. For ``app`` the
    blob every key merges into: ``DamagedRecord`` when it is damaged (:func:`app_blob`), never an empty blob the
    write would replace it with. A damaged value of another namespace's key is read as present (its whole
    value is replaced or deleted by the write, nothing merged into it)."""
    if ns == APP_NS:
        found = app_blob(conn)
        return ({APP_SETTINGS_KEY: found[0]} if found is not None else {}), count_keys(conn, ns)
    current: dict[str, Any] = {}
    for key in sorted({canonical_key(ns, k) for k in keys}):
        try:
            found = get_value(conn, ns, key)
        except DamagedRecord:
            current[key] = _DAMAGED  # unequal to any value: the write changes it
            continue
        if found is not None:
            current[key] = found[0]
    return current, count_keys(conn, ns)


def apply_plan(conn: sqlite3.Connection, plan: KvPlan, now_ms: int) -> None:
    for key, value in plan.rows.items():
        if value is DELETE:
            delete_value(conn, plan.ns, key)
        else:
            set_value(conn, plan.ns, key, value, now_ms)
