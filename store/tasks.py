"""Scheduled tasks and their run history (seed 003 §4.11, §8, §11.6, §11.19).

``scheduled_tasks`` rows keep the durable fields as columns and everything
else (operating mode, schedule, weekdays, workspacePath, permissionMode,
providerId/modelId, thinkingLevel, nextRunAt) in ``config_json``; the wire
``mode`` is a normalized projection of ``config.mode`` (``chat`` → ``plan``,
absent → ``agent``). ``task_runs`` keeps at most :data:`RUNS_KEPT` runs per
task: every new run prunes in its own transaction (boot prunes too, see
``store/fence.retention``).

The store's task dict keeps ``nextRunAt`` as stored (epoch milliseconds, what
the scheduler compares); :func:`to_wire` is the §4.11 wire projection: RFC 3339
``nextRunAt`` and the config keys ``schedule``, ``weekdays``, ``workspacePath``,
``permissionMode``, ``providerId``/``modelId``, ``thinkingLevel`` and
``calendarConfigured`` at the top level. :func:`run_settings` is what a run
applies: a missing permission is Ask for an automatic run and inherit for Run
now; a missing thinking level is ``off`` for both.

Arming (§4.11): an hourly, daily or weekly task is armed only with a saved
``schedule`` object ("Absence of schedule leaves legacy tasks unarmed"; the
object is "required by Hourly intervals"). Hourly: ``nextRunAt = now + 1 h``,
ignoring the schedule's fields. A task without one has no ``nextRunAt`` (a
legacy row's stored integer stays in its config, unused) and never fires;
Run now needs no schedule.

Calendar provenance (§4.11 "Scheduled calendar provenance"):
``config.calendarConfigured`` records explicit calendar intent. A legacy
daily/weekly row with a saved schedule infers it; a legacy hourly row does not,
so converting it to daily/weekly needs ``calendarConfigured: true`` in the same
update. Known intent is written back on every update, so it survives cadence
changes and a reopen.

A run of a task, or in a session, whose mode is a contract mode (``plan`` or
``goal``) is refused with ``PLAN_REQUIRES_INTERACTIVE_SESSION`` before any row
is written: an unattended path can never show or auto-approve a proposal. The
run's session can still be switched to a contract mode while the run is
``running``; :func:`require_interactive` is the same refusal at the points
where Plan/Goal work would begin (``session.startTurn``, ``plans.submit``).

A task's mode changes only when a mode is named (``mode``, or ``config.mode``
in a replacement config): a replacement ``config`` without one keeps the
task's mode, so an edit never silently turns a Plan task into an unattended
Agent task.

Pure SQL on a connection the caller owns; no trio.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from store.errors import Conflict, InvalidInput, NotFound, PlanRequiresInteractiveSession, SessionNotFound
from store.indexing.group_commit import is_key_conflict
from store.jsonio import Readable, dumps_exact, loads_stored, readable, stored_value
from store.newest_kept import delete_past_newest
from store.rules import MAX_PATH_CHARS, MAX_REF_CHARS, not_ended_sql, path_problem, text_problem
from store.stamps import after_newest

__all__ = [
    "CADENCES",
    "CALENDAR_CADENCES",
    "CONTRACT_MODES",
    "PROJECTED_KEYS",
    "RUNS_KEPT",
    "calendar_intent",
    "create_task",
    "delete_task",
    "finish_run",
    "get_task",
    "has_schedule",
    "list_runs",
    "readable_tasks",
    "next_run_at",
    "normalize_config",
    "require_interactive",
    "rfc3339",
    "run_settings",
    "start_run",
    "to_wire",
    "update_task",
]

CADENCES = ("manual", "hourly", "daily", "weekly")
MODES = ("plan", "goal", "agent")
CONTRACT_MODES = ("plan", "goal")
RUN_STATUSES = ("completed", "aborted", "error")
RUNS_KEPT = 100
# A run "may be running" unless its stored status says it ended: a status outside its set (a damaged record)
# is not proof the run ended, and a second run of the task would send its prompt twice.
MAY_BE_RUNNING = not_ended_sql("status", RUN_STATUSES)
HOUR_MS = 3_600_000
_PERMISSION_MODES = ("inherit", "ask", "accept-edits", "auto")
_THINKING = ("off", "minimal", "low", "medium", "high", "xhigh", "max", "omit")
MAX_CONFIG_BYTES = 64 * 1024
CALENDAR_CADENCES = ("daily", "weekly")
SCHEDULED_CADENCES = ("hourly", *CALENDAR_CADENCES)
# config_json keys the wire projects to the top level of a task (and accepts there on input).
PROJECTED_KEYS = ("schedule", "weekdays", "workspacePath", "permissionMode", "providerId", "modelId",
                  "thinkingLevel", "calendarConfigured")
# The projected keys that are strings, with the bound of the same field at the top level of the params
# (protocol/models_tasks.py: WorkspacePath, ProviderRef); workspacePath is a path too (rules.path_problem).
_TEXT_KEYS = (("workspacePath", MAX_PATH_CHARS), ("providerId", MAX_REF_CHARS), ("modelId", MAX_REF_CHARS))
_TEXT_NAMES = frozenset(k for k, _ in _TEXT_KEYS)
Trigger = Literal["manual", "schedule"]


def _bad(message: str, field: str) -> InvalidInput:
    return InvalidInput(message, data={"field": field})


def normalize_mode(value: Any) -> str:
    if value is None:
        return "agent"
    if value == "chat":  # legacy value (seed §7): chat means plan
        return "plan"
    if value not in MODES:
        raise _bad(f"mode must be one of {', '.join(MODES)}", "config.mode")
    return str(value)


def normalize_config(config: Mapping[str, Any] | None, cadence: str, *,
                     stored: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Validate the known keys of ``config_json``; unknown keys are kept as sent.

    ``stored`` is the task's config before an update: a string key still holding the value stored there is
    not checked again, so a row an older build wrote (``workspacePath: ""``) still reads and updates, while
    a value newly written meets the rule of the same field at the top level of the params.
    """
    out = dict(config or {})
    out["mode"] = normalize_mode(out.get("mode"))
    schedule = out.get("schedule")
    if schedule is not None:
        if not isinstance(schedule, Mapping):
            raise _bad("schedule must be an object", "config.schedule")
        for key, lo, hi in (("hour", 0, 23), ("minute", 0, 59), ("weekday", 0, 6)):
            v = schedule.get(key)
            if v is not None and (type(v) is not int or not lo <= v <= hi):
                raise _bad(f"schedule.{key} must be an integer in {lo}..{hi}", f"config.schedule.{key}")
    weekdays = out.get("weekdays")
    if weekdays is not None:
        if (not isinstance(weekdays, list) or not 1 <= len(weekdays) <= 7
                or any(type(d) is not int or not 0 <= d <= 6 for d in weekdays)
                or len(set(weekdays)) != len(weekdays)):
            raise _bad("weekdays must be 1-7 unique integers in 0..6", "config.weekdays")
    if out.get("permissionMode") is not None and out["permissionMode"] not in _PERMISSION_MODES:
        raise _bad(f"permissionMode must be one of {', '.join(_PERMISSION_MODES)}", "config.permissionMode")
    if out.get("thinkingLevel") is not None and out["thinkingLevel"] not in _THINKING:
        raise _bad(f"thinkingLevel must be one of {', '.join(_THINKING)}", "config.thinkingLevel")
    if out.get("calendarConfigured") is not None and type(out["calendarConfigured"]) is not bool:
        raise _bad("calendarConfigured must be a boolean", "config.calendarConfigured")
    for key, max_chars in _TEXT_KEYS:
        value = out.get(key)
        if value is None or (stored is not None and key in stored and stored[key] == value):
            continue
        problem = text_problem(value, max_chars)
        if problem is None and key == "workspacePath":
            problem = path_problem(value)
        if problem is not None:
            raise _bad(f"{key} {problem}" if problem.startswith("must") else f"{key}: {problem}", f"config.{key}")
    if (out.get("providerId") is None) != (out.get("modelId") is None) or (
            any(stored is None or out.get(k) != stored.get(k) for k in ("providerId", "modelId"))
            and bool(out.get("providerId")) != bool(out.get("modelId"))):
        # Paired; when either is newly written a stored blank one counts as unset.
        raise _bad("providerId and modelId must be set together", "config.modelId")
    if cadence not in CADENCES:
        raise _bad(f"cadence must be one of {', '.join(CADENCES)}", "cadence")
    if len(dumps_exact(out)) > MAX_CONFIG_BYTES:
        raise _bad(f"config is larger than {MAX_CONFIG_BYTES} bytes", "config")
    return out


def has_schedule(cadence: str, config: Mapping[str, Any]) -> bool:
    """§4.11: only a task with a scheduled cadence AND a saved ``schedule`` object can be armed.

    "Absence of schedule leaves legacy tasks unarmed", whatever the cadence: the
    schedule object is "required by Hourly intervals" too (an hourly task ignores
    its fields, but without one it never fires). Run now needs no schedule.
    """
    return cadence in SCHEDULED_CADENCES and isinstance(config.get("schedule"), Mapping)


def _field(value: Any, low: int, high: int) -> int | None:
    """An integer calendar field within ``low..high`` (``None``: anything else, a bool or float too)."""
    return value if type(value) is int and low <= value <= high else None


def _calendar_fields(cadence: str, config: Mapping[str, Any]) -> tuple[int, int, set[int]] | None:
    """(hour, minute, weekdays 0..6) of a daily/weekly task's saved schedule; ``None`` when a field is out of
    range or not an integer (the wire refuses such fields; a row written elsewhere may still hold them)."""
    schedule = config["schedule"]
    hour, minute = _field(schedule.get("hour", 0), 0, 23), _field(schedule.get("minute", 0), 0, 59)
    if hour is None or minute is None:
        return None
    if cadence == "daily":
        return hour, minute, set(range(7))
    wd = config.get("weekdays")
    days = [_field(d, 0, 6) for d in wd] if isinstance(wd, list) else [_field(schedule.get("weekday", 0), 0, 6)]
    if not days or None in days:
        return None
    return hour, minute, {d for d in days if d is not None}


def next_run_at(cadence: str, config: Mapping[str, Any], now_ms: int, tz: Any = None) -> int | None:
    """Next due time: hourly = now + 1 h (ignoring the schedule's fields); daily/weekly at the schedule's
    hour:minute in local time. ``None`` (unarmed): manual, or no saved schedule (:func:`has_schedule`)."""
    if not has_schedule(cadence, config):
        return None
    if cadence == "hourly":
        return now_ms + HOUR_MS
    slot = _calendar_fields(cadence, config)
    if slot is None:
        return None  # fields no slot comes out of (another version's or a hand-edited row): unarmed
    hour, minute, days = slot
    # The host's local time is naive: ``timestamp()`` then applies the offset of each candidate's own day
    # (a summer-time change before the slot moves it with the local clock). An aware ``astimezone()`` value
    # would carry today's fixed offset to every later day.
    now = datetime.fromtimestamp(now_ms / 1000, tz=tz)
    for offset in range(8):
        day = (now + timedelta(days=offset)).replace(hour=hour, minute=minute, second=0, microsecond=0)
        at = int(day.timestamp() * 1000)
        # weekday numbering 0..6 = Sunday..Saturday (JS getDay, as the desktop app stores it)
        if (day.isoweekday() % 7) in days and at > now_ms:
            return at
    return None  # pragma: no cover - 8 days always contain a matching day


def calendar_intent(cadence: str, config: Mapping[str, Any]) -> bool | None:
    """The task's calendar intent: explicit ``calendarConfigured``, else inferred, else unknown (None).

    Legacy daily/weekly rows with a saved schedule infer intent; hourly rows never do.
    """
    explicit = config.get("calendarConfigured")
    if isinstance(explicit, bool):
        return explicit
    if cadence in CALENDAR_CADENCES and isinstance(config.get("schedule"), Mapping):
        return True
    return None


def rfc3339(ms: int) -> str:
    """Epoch milliseconds as an RFC 3339 UTC timestamp (``2026-07-27T08:30:00.000Z``)."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _text_values(config: Mapping[str, Any]) -> dict[str, str]:
    """The set string keys: a blank one (an older build stored ``""``) reads as unset, like a missing one
    (§4.11: missing model fields keep the app default at run time), and providerId/modelId only as a pair."""
    out = {k: v for k, v in ((k, config.get(k)) for k, _ in _TEXT_KEYS) if isinstance(v, str) and v}
    if "providerId" not in out or "modelId" not in out:
        out.pop("providerId", None)
        out.pop("modelId", None)
    return out


def to_wire(task: Mapping[str, Any]) -> dict[str, Any]:
    """The §4.11 wire task: RFC 3339 ``nextRunAt`` and the projected config keys at the top level.

    ``config`` stays on the wire as stored (older clients read it) without its
    internal integer ``nextRunAt``; a blank workspacePath, providerId or modelId is not projected.
    """
    config = {k: v for k, v in task["config"].items() if k != "nextRunAt"}
    out = {k: v for k, v in task.items() if k not in ("config", "nextRunAt")}
    out["config"] = config
    if isinstance(task.get("nextRunAt"), int):
        out["nextRunAt"] = rfc3339(task["nextRunAt"])
    text = _text_values(config)
    for key in PROJECTED_KEYS:
        if key in text:
            out[key] = text[key]
        elif key != "calendarConfigured" and key not in _TEXT_NAMES and config.get(key) is not None:
            out[key] = config[key]
    out["calendarConfigured"] = calendar_intent(task["cadence"], config) is True
    return out


def run_settings(task: Mapping[str, Any], *, trigger: Trigger) -> dict[str, Any]:
    """What a run of ``task`` applies (§4.11).

    A missing permission keeps the legacy behaviour: ``ask`` for an automatic
    (scheduled) run, ``inherit`` for Run now. A missing or cleared thinking
    level is ``off`` for both. Missing (or blank) model fields stay absent
    (the app default is resolved at run time).
    """
    config = task["config"]
    permission = config.get("permissionMode") or ("ask" if trigger == "schedule" else "inherit")
    out: dict[str, Any] = {"trigger": trigger, "mode": task["mode"], "permissionMode": permission,
                           "thinkingLevel": config.get("thinkingLevel") or "off"}
    out.update(_text_values(config))
    return out


_TASK_COLS = "id, title, prompt, cadence, enabled, project_id, config_json, last_run_at, created_at, updated_at"


def _task(row: tuple[Any, ...]) -> dict[str, Any]:
    tid, title, prompt, cadence, enabled, project_id, config_json, last_run, created, updated = row
    config = loads_stored(config_json, f"task {tid}'s config_json", dict, exact=True)
    out: dict[str, Any] = {"id": tid, "title": title, "prompt": prompt, "cadence": cadence,
                           "enabled": bool(enabled), "mode": normalize_mode(config.get("mode")),
                           "config": config, "createdAt": created, "updatedAt": updated}
    if project_id is not None:
        out["projectId"] = project_id
    if last_run is not None:
        out["lastRunAt"] = last_run
    if isinstance(config.get("nextRunAt"), int) and has_schedule(cadence, config):
        # a legacy row's stored slot without a schedule is kept as stored but arms nothing (§4.11)
        out["nextRunAt"] = config["nextRunAt"]
    return out


def get_task(conn: sqlite3.Connection, task_id: str) -> dict[str, Any]:
    row = conn.execute(f"SELECT {_TASK_COLS} FROM scheduled_tasks WHERE id = ?", (task_id,)).fetchone()
    if row is None:
        raise NotFound(f"task {task_id} not found", data={"taskId": task_id})
    return _task(row)


def readable_tasks(conn: sqlite3.Connection) -> Readable[dict[str, Any]]:
    """Every task, oldest first (``tasks.list``, the scheduler); one whose record is damaged is named in
    ``unreadable`` (task ids) instead."""
    # every row read before any is decoded: a damaged one raising mid-iteration would leave the statement
    # active (held by the traceback), its read snapshot open on this connection
    rows = conn.execute(f"SELECT {_TASK_COLS} FROM scheduled_tasks ORDER BY created_at, id").fetchall()
    return readable(rows, _task, lambda r: str(r[0]))


def _check_project(conn: sqlite3.Connection, project_id: int | None) -> None:
    if project_id is not None and conn.execute("SELECT 1 FROM projects WHERE id = ?", (project_id,)).fetchone() is None:
        raise NotFound(f"project {project_id} not found", data={"projectId": project_id})


def task_created_at(conn: sqlite3.Connection, now_ms: int) -> int:
    """A new task's ``created_at``: ``now_ms``, but always after every task so far.

    ``tasks.list`` is "oldest first", ordered by ``(created_at, id)``, and generated task ids are random:
    tasks created in one millisecond (a batch) would list by id, and a task created on a clock stepped back
    would list before the older ones."""
    return after_newest(conn, "SELECT MAX(created_at) FROM scheduled_tasks", (), now_ms)


def create_task(conn: sqlite3.Connection, *, task_id: str, title: str, prompt: str, cadence: str = "manual",
                enabled: bool = True, project_id: int | None = None, config: Mapping[str, Any] | None = None,
                now_ms: int) -> dict[str, Any]:
    cfg = normalize_config(config, cadence)
    cfg.pop("nextRunAt", None)  # host-computed; an old client's integer (or any value) is ignored
    intent = calendar_intent(cadence, cfg)
    if intent is not None:
        cfg["calendarConfigured"] = intent
    nxt = next_run_at(cadence, cfg, now_ms)
    if nxt is not None:
        cfg["nextRunAt"] = nxt
    _check_project(conn, project_id)
    created = task_created_at(conn, now_ms)
    try:
        conn.execute(
            f"INSERT INTO scheduled_tasks({_TASK_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, ?)",
            (task_id, title, prompt, cadence, int(enabled), project_id, dumps_exact(cfg).decode(), created,
             created))
    except sqlite3.IntegrityError as exc:
        if not is_key_conflict(exc):
            raise  # NOT NULL / CHECK: a value the host wrote, never "already exists" (store.indexing.group_commit)
        raise Conflict(f"task {task_id} already exists", data={"taskId": task_id}) from None
    return get_task(conn, task_id)


def update_task(conn: sqlite3.Connection, task_id: str, patch: Mapping[str, Any], *, now_ms: int) -> dict[str, Any]:
    """Apply the given fields; recomputes ``nextRunAt`` when the schedule changed.

    ``config`` replaces the whole object; ``configKeys`` then sets single keys
    (``None`` removes one). A replacement config that names no mode keeps the
    task's mode; ``mode`` (or ``config.mode``) changes it. Known calendar intent
    is carried over unless the patch sets ``calendarConfigured``; converting an
    hourly task to daily or weekly needs that intent to be ``true`` (refused
    otherwise, nothing written).
    """
    cur = get_task(conn, task_id)
    cadence = patch.get("cadence", cur["cadence"])
    config = dict(patch["config"]) if "config" in patch else dict(cur["config"])
    if config.get("mode") is None:
        # An absent mode normalizes to agent: a config rewritten without it (a client that edits
        # other settings) would silently turn a Plan/Goal task into one that runs unattended.
        config["mode"] = cur["mode"]
    keys: Mapping[str, Any] = patch.get("configKeys") or {}
    for key, value in keys.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    if "mode" in patch:
        config["mode"] = patch["mode"]
    cfg = normalize_config(config, cadence, stored=cur["config"])
    old_cfg = dict(cur["config"])
    explicit = "calendarConfigured" in keys or "calendarConfigured" in patch.get("config", {})
    old_intent = calendar_intent(cur["cadence"], old_cfg)
    if not explicit and old_intent is not None:
        cfg["calendarConfigured"] = old_intent  # known intent survives cadence changes and config rewrites
    # An hourly task's schedule is an interval's fields, never inferred as calendar intent: explicit only.
    if cur["cadence"] == "hourly" and cadence in CALENDAR_CADENCES and cfg.get("calendarConfigured") is not True:
        raise InvalidInput(
            f"task {task_id} is hourly; converting it to {cadence} needs explicit calendar confirmation "
            "(send calendarConfigured: true with the schedule it should use)",
            data={"field": "calendarConfigured", "taskId": task_id, "reason": "CALENDAR_CONFIRMATION_REQUIRED"})
    intent = calendar_intent(cadence, cfg)
    if intent is not None:
        cfg["calendarConfigured"] = intent
    kept = old_cfg.get("nextRunAt")
    cfg.pop("nextRunAt", None)
    enabled = bool(patch.get("enabled", cur["enabled"]))
    schedule_keys = ("schedule", "weekdays")
    rescheduled = (cadence != cur["cadence"] or enabled != bool(cur["enabled"])
                   or any(cfg.get(k) != old_cfg.get(k) for k in schedule_keys))
    # Renaming or editing the prompt keeps the armed slot; a schedule change recomputes it. A legacy
    # row's slot without a schedule is not kept: it armed nothing (§4.11).
    keep = not rescheduled and isinstance(kept, int) and has_schedule(cadence, cfg)
    nxt = kept if keep else next_run_at(cadence, cfg, now_ms)
    if nxt is not None:
        cfg["nextRunAt"] = nxt
    project_id = patch["projectId"] if "projectId" in patch else cur.get("projectId")
    _check_project(conn, project_id)
    conn.execute(
        "UPDATE scheduled_tasks SET title = ?, prompt = ?, cadence = ?, enabled = ?, project_id = ?, "
        "config_json = ?, updated_at = ? WHERE id = ?",
        (patch.get("title", cur["title"]), patch.get("prompt", cur["prompt"]), cadence,
         int(patch.get("enabled", cur["enabled"])), project_id, dumps_exact(cfg).decode(), now_ms, task_id))
    return get_task(conn, task_id)


def delete_task(conn: sqlite3.Connection, task_id: str) -> bool:
    """Delete the task and (cascade) its run history."""
    if conn.execute("DELETE FROM scheduled_tasks WHERE id = ?", (task_id,)).rowcount == 0:
        raise NotFound(f"task {task_id} not found", data={"taskId": task_id})
    return True


# -- runs --------------------------------------------------------------------

_RUN_COLS = "id, task_id, session_id, status, error_code, started_at, ended_at"


def _run(row: tuple[Any, ...]) -> dict[str, Any]:
    rid, tid, sid, status, err, started, ended = row
    out: dict[str, Any] = {"id": rid, "taskId": tid, "startedAt": started,
                           "status": stored_value(status, ("running", *RUN_STATUSES), f"task run {rid}'s status")}
    for key, value in (("sessionId", sid), ("errorCode", err), ("endedAt", ended)):
        if value is not None:
            out[key] = value
    return out


def get_run(conn: sqlite3.Connection, run_id: str) -> dict[str, Any]:
    row = conn.execute(f"SELECT {_RUN_COLS} FROM task_runs WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        raise NotFound(f"task run {run_id} not found", data={"runId": run_id})
    return _run(row)


def list_runs(conn: sqlite3.Connection, task_id: str, *, limit: int = RUNS_KEPT) -> Readable[dict[str, Any]]:
    """The task's runs, newest first; a run whose record is damaged is named in ``unreadable`` (run ids). A
    task whose own record is damaged still has its runs (they are records of their own): only a missing task
    is ``NOT_FOUND``."""
    if conn.execute("SELECT 1 FROM scheduled_tasks WHERE id = ?", (task_id,)).fetchone() is None:
        raise NotFound(f"task {task_id} not found", data={"taskId": task_id})
    rows = conn.execute(
        f"SELECT {_RUN_COLS} FROM task_runs WHERE task_id = ? ORDER BY started_at DESC, id DESC LIMIT ?",
        (task_id, limit)).fetchall()
    return readable(rows, _run, lambda r: str(r[0]))


def check_runnable(conn: sqlite3.Connection, task: Mapping[str, Any], session_id: str | None) -> None:
    """§11.19: a Plan/Goal task or session cannot run unattended (nothing written)."""
    if task["mode"] in CONTRACT_MODES:
        raise PlanRequiresInteractiveSession(
            f"task {task['id']} is in {task['mode']} mode: a {task['mode']} needs an interactive session "
            "to show and approve its proposal; switch the task to agent mode first",
            data={"taskId": task["id"], "mode": task["mode"]})
    if session_id is not None:
        row = conn.execute("SELECT mode FROM sessions WHERE id = ?", (session_id,)).fetchone()
        if row is None:
            raise SessionNotFound(f"session {session_id} not found", data={"sessionId": session_id})
        if row[0] in CONTRACT_MODES:
            raise PlanRequiresInteractiveSession(
                f"session {session_id} is in {row[0]} mode; switch it to agent mode before an unattended run",
                data={"sessionId": session_id, "mode": row[0]})


def require_interactive(conn: sqlite3.Connection, session_id: str, mode: str | None, *, work: str) -> None:
    """§4.11: no Plan/Goal ``work`` in a session a ``running`` task run is bound to (nothing written), nor one
    whose stored status is damaged (it may be running: ``data.damaged``).

    :func:`check_runnable` refuses a run whose session is already in a contract
    mode; this covers a session switched to one while its run is running, at the
    point where the contract work (a turn, a proposal) would start.
    """
    if mode not in CONTRACT_MODES:
        return  # agent work in a run's session is the run itself; no lookup on the common path
    # A run whose stored status is damaged may be running (MAY_BE_RUNNING): refused too, named as damaged.
    row = conn.execute(
        f"SELECT id, task_id, status FROM task_runs WHERE session_id = ? AND {MAY_BE_RUNNING} "
        "ORDER BY status = 'running' DESC, started_at DESC, id DESC LIMIT 1", (session_id,)).fetchone()
    if row is None:
        return
    damaged = row[2] != "running"
    state = f"may be running (its stored status {row[2]!r} is damaged)" if damaged else "is running"
    raise PlanRequiresInteractiveSession(
        f"session {session_id} is in {mode} mode while task run {row[0]} (task {row[1]}) {state} in it: "
        f"an unattended run cannot {work}; end the run (tasks.finishRun) or switch the session to agent mode",
        data={"sessionId": session_id, "mode": mode, "runId": row[0], "taskId": row[1],
              **({"damaged": True} if damaged else {})})


def start_run(conn: sqlite3.Connection, *, task_id: str, run_id: str, session_id: str | None,
              now_ms: int) -> dict[str, Any]:
    task = get_task(conn, task_id)
    check_runnable(conn, task, session_id)
    live = conn.execute(f"SELECT id, status FROM task_runs WHERE task_id = ? AND {MAY_BE_RUNNING} "
                        "ORDER BY status = 'running' DESC LIMIT 1", (task_id,)).fetchone()
    if live is not None and live[1] == "running":
        raise Conflict(f"task {task_id} already has a running run", data={"taskId": task_id, "runId": live[0]})
    if live is not None:
        raise Conflict(
            f"task {task_id} may still be running: run {live[0]}'s stored status {live[1]!r} is damaged (not one "
            f"of running, {', '.join(RUN_STATUSES)}); end it (tasks.finishRun {live[0]}), or a restart aborts it",
            data={"taskId": task_id, "runId": live[0], "damaged": True})
    started = run_started_at(conn, task_id, now_ms)
    try:
        conn.execute(f"INSERT INTO task_runs({_RUN_COLS}) VALUES (?, ?, ?, 'running', NULL, ?, NULL)",
                     (run_id, task_id, session_id, started))
    except sqlite3.IntegrityError as exc:
        if not is_key_conflict(exc):
            raise  # NOT NULL / CHECK: a value the host wrote, never "already exists" (store.indexing.group_commit)
        raise Conflict(f"task run {run_id} already exists", data={"runId": run_id}) from None
    config = dict(task["config"])
    nxt = next_run_at(task["cadence"], config, now_ms)
    if nxt is not None:
        config["nextRunAt"] = nxt
    conn.execute("UPDATE scheduled_tasks SET last_run_at = ?, config_json = ? WHERE id = ?",
                 (started, dumps_exact(config).decode(), task_id))
    prune_runs(conn, task_id)
    return get_run(conn, run_id)


def run_started_at(conn: sqlite3.Connection, task_id: str, now_ms: int) -> int:
    """A new run's ``started_at``: ``now_ms``, but always after every run of the task so far.

    ``tasks.runs`` and the last-100 cap order a task's runs by ``(started_at DESC, id DESC)`` and run
    ids are random: on a clock stepped back the run just started would be listed under older runs,
    or pruned in the very transaction that starts it (its ``tasks.finishRun`` then ``NOT_FOUND``)."""
    return after_newest(conn, "SELECT MAX(started_at) FROM task_runs WHERE task_id = ?", (task_id,), now_ms)


def prune_runs(conn: sqlite3.Connection, task_id: str, keep: int = RUNS_KEPT) -> int:
    """Keep the task's newest ``keep`` runs by ``(started_at, id)`` (:func:`store.newest_kept.delete_past_newest`:
    a run a damaged ``idx_task_runs`` hides from the newest-first list is never deleted for it)."""
    return delete_past_newest(conn, "task_runs", keep=keep, stamp="started_at", tiebreak="id",
                              where="task_id = ?", params=(task_id,))


def finish_run(conn: sqlite3.Connection, *, run_id: str, status: str, error_code: str | None,
               now_ms: int, session_id: str | None = None) -> dict[str, Any]:
    if status not in RUN_STATUSES:
        raise _bad(f"status must be one of {', '.join(RUN_STATUSES)}", "status")
    found = conn.execute("SELECT status FROM task_runs WHERE id = ?", (run_id,)).fetchone()
    if found is None:
        raise NotFound(f"task run {run_id} not found", data={"runId": run_id})
    if found[0] in RUN_STATUSES:
        raise Conflict(f"task run {run_id} already ended ({found[0]})", data={"runId": run_id, "status": found[0]})
    # running, or a damaged status (start_run counts it as may be running): ending it records the end the
    # caller reports, and the task can run again
    if session_id is not None:
        if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
            raise SessionNotFound(f"session {session_id} not found", data={"sessionId": session_id})
        conn.execute("UPDATE task_runs SET session_id = ? WHERE id = ?", (session_id, run_id))
    conn.execute("UPDATE task_runs SET status = ?, error_code = ?, ended_at = MAX(started_at, ?) WHERE id = ?",
                 (status, error_code, now_ms, run_id))  # never before its start (a clock stepped back)
    return get_run(conn, run_id)
