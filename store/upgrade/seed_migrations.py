"""Seed 003's own migration chain, walked in place (§7): 7 → 8 → 11 → 14 → 15 → 16 → 17 → 18 → 19.

Each function here is one step's body: it runs inside the transaction the
engine (``store.upgrade.migrations``) opened, never commits, and raises to roll the
step back. The engine takes the WAL checkpoint and the ``pi.sqlite.v<n>.bak``
backup before each of them and stamps ``user_version`` after.

The guarded v8/v9/v10 → v11 step does the nine things §7 lists:

1. every ``sessions.mode`` is validated, ``chat`` → ``plan``;
2. the app settings blob (``kv(app, settings)``) is parsed, top-level
   ``defaultMode: "chat"`` → ``"plan"``;
3. each scheduled task's ``config_json`` is parsed, top-level ``mode: "chat"``
   → ``"plan"``; nested extension modes are not touched;
4. ``plan_approvals`` is kept and gains its artifact and execution fields and
   indexes (rebuilt to §4.6a, every row copied);
5. everything else stays as it is;
6. every new mode value is one of plan | goal | agent;
7. ``defaultCommandShell`` must be a catalog id of the current platform;
8. ``plan_approvals.kind`` is added only when absent (a v8 file that already
   made the table from the current DDL keeps its rows' kinds);
9. the engine stamps 11 only after all of it succeeded.

A malformed settings blob or task ``config_json``, an invalid session or task
mode, an unknown or wrong-platform shell raise :class:`LegacyValueInvalid`
naming the row; :func:`plan_guarded` is pure with respect to the database
(reads only), so the engine also runs it before the chain's first write.
``planApprovalPermissionMode`` is removed from the settings blob; all other
settings are kept as they are (a blob that needs no change is not rewritten).
"""

from __future__ import annotations

import json
import re
import sqlite3
import sys
from dataclasses import dataclass, field
from typing import Any

import orjson

from store.errors import StoreError
from store.jsonio import loads_strict
from store.upgrade.schema_rebuild import parse_statement, rebuild_table, same_definition, schema_sql, table_columns
from store.upgrade.seed_schemas import (
    APP_SETTINGS_KEY,
    LEGACY_MODES,
    LEGACY_SETTINGS_REMOVED,
    MODES,
    PLAN_APPROVALS_INDEXES_V8,
    PLAN_APPROVALS_INDEXES_V11,
    PLAN_APPROVALS_V8,
    PLAN_APPROVALS_V11,
    PROVIDERS_OWNER,
    SESSIONS_DELETED_AT,
    SHELL_CATALOG,
    THINKING_LEVELS_V19,
    TURN_QUEUE_PRIORITY,
    TURN_QUEUE_SESSION_MESSAGE_ID,
    V14_ADDITIONS,
    V15_ADDITIONS,
    V16_ADDITIONS,
    V17_ADDITIONS,
)


class LegacyValueInvalid(StoreError):
    """A seed-era value the guarded step must not carry forward; names its row."""

    code = "MIGRATION_FAILED"


def current_platform() -> str:
    """``sys.platform`` in Node's ``process.platform`` spelling (the shell catalog's keys)."""
    if sys.platform.startswith("linux"):
        return "linux"
    return sys.platform


# --- small DDL helpers ----------------------------------------------------------


def _create_missing(conn: sqlite3.Connection, statements: tuple[str, ...]) -> None:
    """Run each CREATE whose object does not exist yet (a build may have made it early)."""
    existing = schema_sql(conn)
    for statement in statements:
        if parse_statement(statement).name not in existing:
            conn.execute(statement)


def _add_column(conn: sqlite3.Connection, table: str, column: str, alter: str) -> None:
    if column not in table_columns(conn, table):
        conn.execute(alter)


# --- v7 → v8 ------------------------------------------------------------------


def step_7_to_8(conn: sqlite3.Connection) -> None:
    """Create the first ``plan_approvals`` table (its legacy modes are mapped by the guarded step)."""
    _create_missing(conn, (PLAN_APPROVALS_V8, *PLAN_APPROVALS_INDEXES_V8))


# --- the guarded v8/v9/v10 → v11 step -------------------------------------------


@dataclass
class GuardedPlan:
    """The row changes of the guarded step, decided before anything is written."""

    session_modes: list[tuple[str, str, str]] = field(default_factory=list)  # (id, old, new)
    app_settings: str | None = None  # new value_json, None = unchanged
    task_configs: list[tuple[str, str]] = field(default_factory=list)  # (id, new config_json)
    removed_settings: list[str] = field(default_factory=list)


def _mode(value: object, where: str, what: str, data: dict[str, Any]) -> str:
    if isinstance(value, str):
        mapped = LEGACY_MODES.get(value, value)
        if mapped in MODES:
            return mapped
    allowed = ", ".join((*LEGACY_MODES, *MODES))
    raise LegacyValueInvalid(f"{where}: {what} {value!r} is not one of {allowed}", data=data)


LEGACY_JSON_MAX_DEPTH = 254
"""How deeply nested a seed-era settings blob or task ``config_json`` may be. Seed §7 refuses a *malformed* value
only: the seed's writer (serde_json) nests up to 128 containers; 254 is what orjson encodes (the strict reader's
duplicate-key check and the rewrite use it). The wire's limit (64, :func:`store.jsonio.loads_strict`'s default)
is for what clients send, not for what the seed stored."""

LEGACY_JSON_MAX_INT_DIGITS = 309
"""The longest integer literal a seed-era value may hold: the longest the host's settings reader (orjson) parses
at all. Longer ones are refused (a reader could not parse the migrated value)."""


def _json_object(text: object, where: str, what: str, data: dict[str, Any]) -> dict[str, Any]:
    try:
        value = loads_strict(text if isinstance(text, str | bytes) else "", max_depth=LEGACY_JSON_MAX_DEPTH,
                             max_int_digits=LEGACY_JSON_MAX_INT_DIGITS)
    except StoreError as exc:
        raise LegacyValueInvalid(f"{where}: {what} is not valid JSON ({exc})", data=data) from None
    if not isinstance(value, dict):
        raise LegacyValueInvalid(f"{where}: {what} must be a JSON object, found {type(value).__name__}", data=data)
    return value


def _check_shell(value: object, platform: str, where: str, data: dict[str, Any]) -> None:
    known = SHELL_CATALOG.get(platform, ())
    if isinstance(value, str) and value in known:
        return
    if isinstance(value, str):
        others = sorted(p for p, ids in SHELL_CATALOG.items() if value in ids)
        if others:
            raise LegacyValueInvalid(
                f"{where}: defaultCommandShell {value!r} is a shell of {', '.join(others)}, not of {platform} "
                f"(known here: {', '.join(known) or 'none'})", data=data)
    raise LegacyValueInvalid(
        f"{where}: defaultCommandShell {value!r} is not a known shell id for {platform} "
        f"(known: {', '.join(known) or 'none'})", data=data)


def _dumps(value: dict[str, Any]) -> str:
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        # an integer beyond 64 bits (well-formed JSON, kept exact by the strict reader): the stdlib
        # encoder writes it as it was
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def plan_guarded(conn: sqlite3.Connection, platform: str) -> GuardedPlan:
    """Validate and map every value the guarded step touches; reads only.

    Raises :class:`LegacyValueInvalid` for the first bad row (in a stable
    order: sessions by id, the settings blob, tasks by id).
    """
    plan = GuardedPlan()
    for sid, mode in conn.execute("SELECT id, mode FROM sessions ORDER BY id"):
        data = {"table": "sessions", "id": sid}
        new = _mode(mode, f"sessions row id={sid!r}", "mode", data)
        if new != mode:
            plan.session_modes.append((sid, mode, new))
    ns, key = APP_SETTINGS_KEY
    row = conn.execute("SELECT value_json FROM kv WHERE ns = ? AND key = ?", (ns, key)).fetchone()
    if row is not None:
        where = f"kv row (ns={ns!r}, key={key!r})"
        data = {"table": "kv", "ns": ns, "key": key}
        settings = _json_object(row[0], where, "the app settings value", data)
        changed = False
        if "defaultMode" in settings:
            new_default = _mode(settings["defaultMode"], where, "defaultMode", data)
            if new_default != settings["defaultMode"]:
                settings["defaultMode"] = new_default
                changed = True
        if "defaultCommandShell" in settings:
            _check_shell(settings["defaultCommandShell"], platform, where, data)
        for legacy in LEGACY_SETTINGS_REMOVED:
            if legacy in settings:
                del settings[legacy]
                plan.removed_settings.append(legacy)
                changed = True
        if changed:
            plan.app_settings = _dumps(settings)
    for tid, config in conn.execute("SELECT id, config_json FROM scheduled_tasks ORDER BY id"):
        where = f"scheduled_tasks row id={tid!r}"
        data = {"table": "scheduled_tasks", "id": tid}
        parsed = _json_object(config, where, "config_json", data)
        if "mode" in parsed:
            new_mode = _mode(parsed["mode"], where, "config_json mode", data)
            if new_mode != parsed["mode"]:
                parsed["mode"] = new_mode
                plan.task_configs.append((tid, _dumps(parsed)))
    return plan


def _plan_approvals_to_v11(conn: sqlite3.Connection) -> None:
    found = schema_sql(conn).get("plan_approvals")
    if found is None:
        conn.execute(PLAN_APPROVALS_V11)
    elif not same_definition(found[1], PLAN_APPROVALS_V11):
        # Columns it lacks take their DEFAULT: kind 'plan' (every pre-kind row is a
        # Plan contract), title/question '', version 1, the rest NULL. A table that
        # already has kind (made from the current DDL) keeps each row's value.
        rebuild_table(conn, "plan_approvals", PLAN_APPROVALS_V11)
    _create_missing(conn, PLAN_APPROVALS_INDEXES_V11)


def guarded_step(conn: sqlite3.Connection, platform: str) -> GuardedPlan:
    """The v8/v9/v10 → v11 body (see the module docstring)."""
    plan = plan_guarded(conn, platform)
    for sid, _old, new in plan.session_modes:
        conn.execute("UPDATE sessions SET mode = ? WHERE id = ?", (new, sid))
    if plan.app_settings is not None:
        conn.execute("UPDATE kv SET value_json = ? WHERE ns = ? AND key = ?", (plan.app_settings, *APP_SETTINGS_KEY))
    for tid, config in plan.task_configs:
        conn.execute("UPDATE scheduled_tasks SET config_json = ? WHERE id = ?", (config, tid))
    _plan_approvals_to_v11(conn)
    bad = conn.execute(
        f"SELECT id, mode FROM sessions WHERE mode NOT IN ({', '.join('?' for _ in MODES)}) LIMIT 1", MODES
    ).fetchone()
    if bad is not None:  # item 6, after the writes (a concurrent writer cannot exist, but check anyway)
        raise LegacyValueInvalid(f"sessions row id={bad[0]!r}: mode {bad[1]!r} after migration",
                                 data={"table": "sessions", "id": bad[0]})
    return plan


# --- the additive steps ----------------------------------------------------------


def step_11_to_14(conn: sqlite3.Connection) -> None:
    _add_column(conn, "sessions", "deleted_at", SESSIONS_DELETED_AT)
    _create_missing(conn, V14_ADDITIONS)


def step_14_to_15(conn: sqlite3.Connection) -> None:
    _create_missing(conn, V15_ADDITIONS)


def step_15_to_16(conn: sqlite3.Connection) -> None:
    _add_column(conn, "turn_queue", "session_message_id", TURN_QUEUE_SESSION_MESSAGE_ID)
    _create_missing(conn, V16_ADDITIONS)


def step_16_to_17(conn: sqlite3.Connection) -> None:
    _add_column(conn, "providers", "owner_plugin_id", PROVIDERS_OWNER)
    _create_missing(conn, V17_ADDITIONS)


def step_17_to_18(conn: sqlite3.Connection) -> None:
    """§4.6b / ADR 0265: ``turn_queue.priority`` (NULL: not promoted), unless the file already has it."""
    _add_column(conn, "turn_queue", "priority", TURN_QUEUE_PRIORITY)


_THINKING_CHECK = re.compile(r"(CHECK\s*\(\s*\"?thinking_level\"?\s+IN\s*\()([^)]*)(\))", re.IGNORECASE)


def sessions_sql_with_omit(create_sql: str) -> str | None:
    """``sessions``' CREATE statement with ``'omit'`` added to its thinking-level CHECK; None: nothing to add.

    Raises :class:`LegacyValueInvalid` when the statement has no thinking-level
    CHECK this step knows how to widen (the pre-migration schema stays).
    """
    found = _THINKING_CHECK.search(create_sql)
    if found is None:
        if "thinking_level" in create_sql and "CHECK" not in create_sql.upper():
            return None  # no CHECK at all: 'omit' is already storable
        raise LegacyValueInvalid("sessions: no thinking_level CHECK list to add 'omit' to",
                                 data={"table": "sessions"})
    values = re.findall(r"'([^']*)'", found.group(2))
    if "omit" in values:
        return None
    listed = found.group(2).rstrip()
    return create_sql[: found.start(2)] + listed + ", 'omit'" + create_sql[found.end(2) :]


def step_18_to_19(conn: sqlite3.Connection) -> None:
    """§4.5 / ADR 0295: ``omit`` becomes a storable thinking level.

    SQLite cannot widen a CHECK in place, so a ``sessions`` table whose list
    lacks ``omit`` is rebuilt with the same statement plus ``'omit'`` (every
    row and column copied, its indexes recreated); a file that already allows
    it is left as it is. Every stored level must be one v19 knows.
    """
    found = schema_sql(conn).get("sessions")
    if found is None or found[1] is None:
        raise LegacyValueInvalid("sessions: table missing", data={"table": "sessions"})
    widened = sessions_sql_with_omit(found[1])
    if widened is not None:
        indexes = [sql for (sql,) in conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'sessions' AND sql IS NOT NULL "
            "ORDER BY name")]
        rebuild_table(conn, "sessions", widened)
        for statement in indexes:
            conn.execute(statement)
    marks = ", ".join("?" for _ in THINKING_LEVELS_V19)
    bad = conn.execute(f"SELECT id, thinking_level FROM sessions WHERE thinking_level NOT IN ({marks}) "
                       "ORDER BY id LIMIT 1", THINKING_LEVELS_V19).fetchone()
    if bad is not None:
        raise LegacyValueInvalid(f"sessions row id={bad[0]!r}: thinking_level {bad[1]!r} is not one of "
                                 f"{', '.join(THINKING_LEVELS_V19)}", data={"table": "sessions", "id": bad[0]})
