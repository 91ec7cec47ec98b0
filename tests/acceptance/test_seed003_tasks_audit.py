"""Seed 003 §4.11 scheduled_tasks + task_runs, §8 "task_runs: keep last 100 per task", §11 items 6 ("Scheduled
tasks CRUD + run history round-trip through host RPC only") and 19 (Plan/Goal never run unattended), audited
by an outsider against real ``pi-host serve`` processes over WebSocket.

Clauses older tests already hold, not repeated here: bad schedules, cadences, modes, permission and thinking
levels, a providerId without its modelId (test_seed003_tasks_outsider); weekday lists on an in-process host,
project/session SET NULL there, hourly = now + 1 h, Run now of plan/goal/chat tasks
(test_seed003_runs_outsider); keyed start/finish/delete retried after their commit, a scheduled Plan slot, a
fire killed mid-way, local time in a UTC+05:45 zone and a synthetic midnight DST change
(test_seed003_tasks_outsider); the boot prune of runs past 100 (test_seed003_retention_audit).

Added here: nextRunAt across summer-time changes with New York's, Berlin's and Lord Howe's offsets and shifts
(their own changes are months from any test run and ``serve`` runs on the real clock, so each host runs a POSIX
TZ rule with the zone's offsets whose change falls near now): the slot is the picked wall-clock time of its own
day, a time the spring-forward gap skips runs when the clock would have shown it had it not jumped, and a time
the fall-back repeats runs once, at its first occurrence (the answers protocol/README "Scheduled tasks on the
wire" gives); a host restarted in another zone (Europe/Berlin, then America/New_York) runs each task at its
wall time there; a deleted project and a deleted session across a restart; the cascade leaving no run row;
start/finish killed before the commit and retried keyed and plain; the history while runs are added (newest
first, the cap of 100 at every insert); the clear code of refused weekday lists; a Goal task's and a legacy
chat task's slot refused with PLAN_REQUIRES_INTERACTIVE_SESSION."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import trio

from tests.acceptance.outsiderkit import client, code_of, data_dir, error_of, killed_during, real_host, shared_host
from tests.hostkit import HostProcess, call_killed_at, start_host_process

MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    """One host for the probes that need no restart (each uses task ids of its own)."""
    yield from shared_host(tmp_path_factory, "tasks-audit")


def at_ms(rfc3339: str) -> int:
    return int(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)


# ------------------------------------------------------------------------------ §4.11 local time across DST


@dataclass(frozen=True)
class Zone:
    """A summer-time zone of one change near now: ``before`` and ``after`` are the UTC offsets (minutes east)
    in effect before and after the instant ``change`` (epoch ms)."""

    name: str
    before: int
    after: int
    change: int

    def offset_at(self, ms: int) -> int:
        return self.before if ms < self.change else self.after

    def wall(self, ms: int) -> datetime:
        """The local clock at ``ms`` (naive)."""
        return datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None) + timedelta(minutes=self.offset_at(ms))

    def instant(self, wall: datetime) -> int:
        """When the local clock shows ``wall``: its first occurrence where the fall-back repeats it; where the
        spring-forward gap skips it, when the clock would have shown it without the jump (the offset before)."""
        epoch = datetime(1970, 1, 1)
        as_before = int((wall - epoch).total_seconds() * 1000) - self.before * MINUTE
        as_after = int((wall - epoch).total_seconds() * 1000) - self.after * MINUTE
        valid = [ms for ms, off in ((as_before, self.before), (as_after, self.after)) if self.offset_at(ms) == off]
        return min(valid) if valid else as_before

    def next_slot(self, now_ms: int, hour: int, minute: int, weekdays: set[int]) -> int:
        """The first slot after ``now_ms``: ``hour:minute`` on the local clock of a day in ``weekdays``
        (0 = Sunday)."""
        today = self.wall(now_ms).date()
        for d in range(-1, 9):
            day = today + timedelta(days=d)
            at = self.instant(datetime(day.year, day.month, day.day, hour, minute))
            if day.isoweekday() % 7 in weekdays and at > now_ms:
                return at
        raise AssertionError("no slot within eight days")


def _posix_offset(minutes_east: int) -> str:
    west = -minutes_east
    sign = "-" if west < 0 else ""
    return f"{sign}{abs(west) // 60}:{abs(west) % 60:02d}"


def _rule(zone: Zone, std: str, dst: str, spring: bool) -> str:
    """The POSIX TZ string of ``zone``: the change at its local wall time (of the clock before it), the other
    change of the year 150 days away at 02:00."""
    before_wall = datetime.fromtimestamp(zone.change / 1000, UTC).replace(tzinfo=None) + timedelta(
        minutes=zone.before)
    other = before_wall.date() + timedelta(days=150 if spring else -150)

    def when(day: date, hh: int, mm: int) -> str:
        return f"{day.timetuple().tm_yday - 1}/{hh}:{mm:02d}"

    here = when(before_wall.date(), before_wall.hour, before_wall.minute)
    std_off, dst_off = (zone.before, zone.after) if spring else (zone.after, zone.before)
    start, end = (here, when(other, 2, 0)) if spring else (when(other, 2, 0), here)
    return f"<{std}>{_posix_offset(std_off)}<{dst}>{_posix_offset(dst_off)},{start},{end}"


ZONES = [
    # New York springs forward an hour (EST -5 → EDT -4), two hours from now
    pytest.param(("EST", "EDT", -300, -240, 2 * HOUR), id="new-york-spring"),
    # Berlin falls back an hour (CEST +2 → CET +1), twenty minutes ago: the host is in the repeated hour
    pytest.param(("CET", "CEST", 120, 60, -20 * MINUTE), id="berlin-fall-repeated-hour"),
    # Lord Howe springs forward half an hour (+10:30 → +11), two hours from now
    pytest.param(("+1030", "+11", 630, 660, 2 * HOUR), id="lord-howe-spring"),
]


@pytest.mark.parametrize("zone_spec", ZONES)
async def test_next_run_at_is_the_picked_wall_time_of_its_own_day_across_a_summer_time_change(
        tmp_path: Path, zone_spec: tuple[str, str, int, int, int]) -> None:
    """§4.11 "Daily/weekly schedules use the host local timezone", schedule {hour, minute}, weekdays overriding
    weekday, RFC 3339 nextRunAt. A host whose zone changes its offset near now: a daily slot on the wall time
    just passed is tomorrow's at that wall time (the new offset, not today's); a weekly task on several
    weekdays is due on the next of them at the picked wall time; a picked time inside a spring-forward gap
    runs when the clock would have shown it had it not jumped (02:30 on New York's night runs at 03:30; half
    an hour on at Lord Howe); a time the fall-back repeats runs once: at its first occurrence, never again at
    the second (a task edited in the repeated hour is next due tomorrow). The expected slots come from the
    offsets alone, not from the host's code."""
    std, dst, before, after, lead = zone_spec
    spring = after > before
    now0 = int(time.time() * 1000)
    change = (now0 + lead) // MINUTE * MINUTE
    zone = Zone(std, before, after, change)
    tz = _rule(zone, std, dst, spring)
    shift = abs(after - before)
    change_wall = zone.wall(change - 1) + timedelta(milliseconds=1)  # the wall time the change happens at
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        proc = start_host_process(data, env={"TZ": tz})
        try:
            async with client(proc) as c:
                now = int(time.time() * 1000)
                here = zone.wall(now)
                passed = here - timedelta(minutes=1)
                tomorrow = (here + timedelta(days=1)).date()
                wd = {d: (tomorrow + timedelta(days=d - 1)).isoweekday() % 7 for d in range(1, 5)}
                picks: dict[str, tuple[str, int, int, set[int]]] = {
                    "daily-passed": ("daily", passed.hour, passed.minute, set(range(7))),
                    "weekly-later-days": ("weekly", 9, 0, {wd[2], wd[4]}),
                    "weekly-tomorrow-first": ("weekly", passed.hour, passed.minute, {wd[3], wd[1]}),
                }
                if spring:
                    in_gap = change_wall + timedelta(minutes=shift // 2)
                    picks["daily-in-gap"] = ("daily", in_gap.hour, in_gap.minute, set(range(7)))
                    picks["weekly-in-gap"] = ("weekly", in_gap.hour, in_gap.minute,
                                              {in_gap.isoweekday() % 7, wd[3]})
                else:
                    # the repeated hour: its first pass ended when the change came; the clock now runs it again
                    again = here + timedelta(minutes=10)
                    gone = here - timedelta(minutes=10)
                    picks["daily-repeated-ahead"] = ("daily", again.hour, again.minute, set(range(7)))
                    picks["daily-repeated-passed"] = ("daily", gone.hour, gone.minute, set(range(7)))
                    picks["weekly-repeated-ahead"] = ("weekly", again.hour, again.minute,
                                                      {again.isoweekday() % 7, wd[2]})
                made: dict[str, dict[str, Any]] = {}
                for task_id, (cadence, hour, minute, days) in picks.items():
                    params: dict[str, Any] = {"taskId": task_id, "title": task_id, "prompt": "p", "cadence": cadence,
                                              "schedule": {"hour": hour, "minute": minute}}
                    if cadence == "weekly":
                        params["weekdays"] = sorted(days)
                    made[task_id] = await c.call("tasks.create", params)
                    made[task_id]["_called"] = int(time.time() * 1000)
                edited = await c.call("tasks.update", {"taskId": "daily-passed", "title": "edited"})
        finally:
            proc.kill9()
    assert edited["nextRunAt"] == made["daily-passed"]["nextRunAt"]
    for task_id, (_cadence, hour, minute, days) in picks.items():
        got = at_ms(made[task_id]["nextRunAt"])
        want = {zone.next_slot(t, hour, minute, days) for t in (now, made[task_id]["_called"])}
        assert got in want, (task_id, tz, made[task_id]["nextRunAt"], [zone.wall(w) for w in want])
        wall = zone.wall(got)
        if "gap" in task_id:
            assert got == change + shift // 2 * MINUTE and (wall.hour * 60 + wall.minute) == (
                hour * 60 + minute + shift) % (24 * 60), (task_id, wall)
        else:
            assert (wall.hour, wall.minute, wall.isoweekday() % 7 in days) == (hour, minute, True), (task_id, wall)
            assert got > change or not spring, (task_id, "a slot after the change", wall)
    if not spring:
        ahead = at_ms(made["daily-repeated-ahead"]["nextRunAt"])
        assert ahead > now + 20 * HOUR, "the repeated wall time ran once already, at its first occurrence"
        assert at_ms(made["daily-repeated-passed"]["nextRunAt"]) > now + 20 * HOUR


# ---------------------------------------------------------------------------------------- refused input


async def test_refused_weekday_lists_and_fields_name_what_was_wrong_and_change_nothing(shared: HostProcess) -> None:
    """§4.11 "Optional weekdays stores 1–7 unique integers in 0–6 ... Invalid or empty selections are rejected
    before mutation", "Errors get a stable string code": weekday 7, a duplicate, an empty list, a bool, a float,
    a string, eight days, at the top level and in config, with a valid change beside them; hour 24, minute 60,
    an unknown cadence and thinking level, a providerId without modelId. Each is INVALID_PARAMS whose data
    names the field, on create and update; the task reads byte for byte as before (updatedAt, nextRunAt too)."""
    with trio.fail_after(60):
        async with client(shared, client_id="refused") as c:
            base = {"title": "refused", "prompt": "p", "cadence": "weekly", "schedule": {"hour": 6, "minute": 15}}
            task = await c.call("tasks.create", {**base, "taskId": "refused", "weekdays": [1, 3]})
            listed = (await c.call("tasks.list", {}))["tasks"]
            weekday_lists: list[Any] = [[7], [2, 2], [], [True], [1.0], ["1"], "1,3", [0, 1, 2, 3, 4, 5, 6, 0], [None]]
            bad: list[tuple[dict[str, Any], str]] = [({"weekdays": w}, "weekdays") for w in weekday_lists]
            bad += [({"config": {"weekdays": w, "schedule": {"hour": 6, "minute": 15}}}, "weekdays")
                    for w in weekday_lists]
            bad += [({"schedule": {"hour": 24, "minute": 0}}, "hour"), ({"schedule": {"hour": 6, "minute": 60}},
                                                                        "minute"),
                    ({"cadence": "fortnightly"}, "cadence"), ({"thinkingLevel": "none"}, "thinkingLevel"),
                    ({"providerId": "prov"}, "modelId"), ({"schedule": {"hour": 6, "minute": 0, "weekday": 7}},
                                                          "weekday")]
            for extra, field in bad:
                for method, params in (("tasks.create", {**base, **extra, "title": "new"}),
                                       ("tasks.update", {"taskId": "refused", "title": "renamed", **extra})):
                    code, info = await error_of(c, method, params)
                    assert code == "INVALID_PARAMS", (method, extra, code)
                    assert field.lower() in json.dumps(info).lower(), (method, extra, info)
            assert await c.call("tasks.get", {"taskId": "refused"}) == task
            assert (await c.call("tasks.list", {}))["tasks"] == listed


# --------------------------------------------------------------------------- §4.11 foreign keys, §11.6


async def test_a_deleted_project_and_session_leave_the_task_and_run_and_a_deleted_task_leaves_no_run_row(
        tmp_path: Path) -> None:
    """§4.11 "project_id INTEGER REFERENCES projects(id) ON DELETE SET NULL", "session_id TEXT REFERENCES
    sessions(id) ON DELETE SET NULL -- the run's transcript", "task_id ... ON DELETE CASCADE", §11.6 through
    RPC. A project removed with its sessions while the task's run in one of them is still running: the task
    stays (no projectId, schedule and nextRunAt as they were), the run stays (no sessionId) and can still be
    finished; all of it reads the same after a SIGKILL and restart. Deleting the task leaves not one run row
    in the database, and a task made again under the same id starts with an empty history."""
    data, ws = data_dir(tmp_path), tmp_path / "ws"
    ws.mkdir()
    with trio.fail_after(90):
        async with real_host(data, kind="agent") as (_proc, c):
            sid = (await c.call("session.create", {"projectPath": str(ws), "title": "run transcript"}))["id"]
            pid = (await c.call("session.get", {"sessionId": sid}))["session"]["projectId"]
            task = await c.call("tasks.create", {"taskId": "fk", "title": "fk", "prompt": "p", "projectId": pid,
                                                 "cadence": "daily", "schedule": {"hour": 7, "minute": 40}})
            assert task["projectId"] == pid
            await c.call("tasks.startRun", {"taskId": "fk", "runId": "fk-done", "sessionId": sid})
            await c.call("tasks.finishRun", {"runId": "fk-done", "status": "completed"})
            await c.call("tasks.startRun", {"taskId": "fk", "runId": "fk-live", "sessionId": sid})
            await c.call("projects.remove", {"projectId": pid})
            assert await code_of(c, "session.get", {"sessionId": sid}) in ("SESSION_NOT_FOUND", "NOT_FOUND")
            kept = await c.call("tasks.get", {"taskId": "fk"})
            assert "projectId" not in kept or kept["projectId"] is None
            assert {k: v for k, v in kept.items() if k not in ("projectId", "updatedAt", "lastRunAt")} == {
                k: v for k, v in task.items() if k not in ("projectId", "updatedAt")}
            runs = (await c.call("tasks.runs", {"taskId": "fk"}))["runs"]
            assert [(r["id"], r["status"], r.get("sessionId")) for r in runs] == [
                ("fk-live", "running", None), ("fk-done", "completed", None)]
            done = await c.call("tasks.finishRun", {"runId": "fk-live", "status": "completed"})
            assert (done["status"], done.get("sessionId")) == ("completed", None)
            runs = (await c.call("tasks.runs", {"taskId": "fk"}))["runs"]
        async with real_host(data, kind="agent") as (_proc, c):
            assert (await c.call("tasks.runs", {"taskId": "fk"}))["runs"] == runs
            again = await c.call("tasks.get", {"taskId": "fk"})
            assert again.get("projectId") is None and again["nextRunAt"] == task["nextRunAt"]
            assert (await c.call("tasks.delete", {"taskId": "fk"}))["deleted"] is True
        conn = sqlite3.connect(data / "pi.sqlite")
        try:
            assert conn.execute("SELECT count(*) FROM task_runs").fetchone() == (0,)
            assert conn.execute("SELECT count(*) FROM scheduled_tasks").fetchone() == (0,)
        finally:
            conn.close()
        async with real_host(data, kind="agent") as (_proc, c):
            await c.call("tasks.create", {"taskId": "fk", "title": "fk again", "prompt": "p"})
            assert (await c.call("tasks.runs", {"taskId": "fk"}))["runs"] == []
            assert await code_of(c, "tasks.finishRun", {"runId": "fk-live", "status": "error"}) == "NOT_FOUND"


# ----------------------------------------------------------------------------------- kills, §11.6 retries


def _run_rows(data: Path) -> list[tuple[str, str, str]]:
    conn = sqlite3.connect(data / "pi.sqlite")
    try:
        return [(r[0], r[1], r[2]) for r in conn.execute(
            "SELECT task_id, id, status FROM task_runs ORDER BY started_at, id")]
    finally:
        conn.close()


async def test_run_start_and_end_killed_before_their_commit_are_one_row_and_one_effect_on_retry(
        tmp_path: Path) -> None:
    """§11.6 run history through RPC with a SIGKILL inside the write, before its commit (the keyed write's
    receipt commits with the run: neither landed). A keyed tasks.startRun retried with the same key makes the
    run once and answers it again; an unkeyed start retried with the same runId makes it once (a second is
    CONFLICT); a finishRun killed before its commit leaves the run running until the boot fence, which aborts
    it: the retried finish is CONFLICT, not a second end, and completes nothing. A keyed finish killed after
    its commit answers on retry with the session it linked. Each task holds exactly the runs it was given."""
    data = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(data, kind="agent") as (_proc, c):
            for tid in ("k1", "k2", "k3"):
                await c.call("tasks.create", {"taskId": tid, "title": tid, "prompt": "p"})
            sid = (await c.call("session.create", {"title": "k3 transcript"}))["id"]
        keyed = {"taskId": "k1", "runId": "k1-r", "submissionId": "k1-start"}
        await call_killed_at(data, "index.before_commit", "tasks.startRun", keyed, client_id="outsider",
                             client_kind="agent")
        plain = {"taskId": "k2", "runId": "k2-r"}
        await call_killed_at(data, "index.before_commit", "tasks.startRun", plain, client_id="outsider",
                             client_kind="agent")
        assert _run_rows(data) == []
        async with real_host(data, kind="agent") as (_proc, c):
            first = await c.call("tasks.startRun", keyed)
            assert await c.call("tasks.startRun", keyed) == first
            assert (await c.call("tasks.startRun", plain))["status"] == "running"
            assert await code_of(c, "tasks.startRun", plain) == "CONFLICT"
            await c.call("tasks.finishRun", {"runId": "k2-r", "status": "completed"})
        finish = {"runId": "k1-r", "status": "completed", "submissionId": "k1-finish"}
        # k1-r was still running when that host was killed: the boot fence aborts it, so no finish lands
        await killed_during(data, "index.before_commit:2", [
            ("tasks.startRun", {"taskId": "k3", "runId": "k3-r", "sessionId": sid}),
            ("tasks.finishRun", {"runId": "k3-r", "status": "completed", "submissionId": "k3-finish"})],
            kind="agent")
        async with real_host(data, kind="agent") as (_proc, c):
            assert await code_of(c, "tasks.finishRun", finish) == "CONFLICT"
            assert await code_of(c, "tasks.finishRun", {"runId": "k3-r", "status": "completed",
                                                        "submissionId": "k3-finish"}) == "CONFLICT"
            [k3] = (await c.call("tasks.runs", {"taskId": "k3"}))["runs"]
            assert (k3["status"], k3.get("sessionId")) == ("aborted", sid)
            linked = {"runId": "k3-b", "status": "error", "errorCode": "E_TOOL", "sessionId": sid,
                      "submissionId": "k3b-finish"}
        await killed_during(data, "index.after_commit:2", [
            ("tasks.startRun", {"taskId": "k3", "runId": "k3-b"}), ("tasks.finishRun", linked)], kind="agent")
        async with real_host(data, kind="agent") as (_proc, c):
            answer = await c.call("tasks.finishRun", linked)
            assert (answer["status"], answer["errorCode"], answer["sessionId"]) == ("error", "E_TOOL", sid)
            assert await c.call("tasks.finishRun", linked) == answer
            assert await code_of(c, "tasks.finishRun", {k: v for k, v in linked.items() if k != "submissionId"}) \
                == "CONFLICT"
    assert _run_rows(data) == [("k1", "k1-r", "aborted"), ("k2", "k2-r", "completed"), ("k3", "k3-r", "aborted"),
                               ("k3", "k3-b", "error")]


# ----------------------------------------------------------------------------------- §4.11/§8 the history


async def test_the_history_lists_newest_first_while_runs_are_added_and_holds_the_newest_100_at_every_insert(
        shared: HostProcess) -> None:
    """§4.11 idx_task_runs (task_id, started_at DESC), §8 "task_runs: keep last 100 per task", protocol/README
    tasks.runs "newest first (last 100 kept)". Runs started and ended back to back (many in one millisecond):
    a short page read between inserts is always the newest runs in start order, every run once; past 100 runs
    each insert drops exactly the oldest, never the run just started; another task's history is untouched."""
    with trio.fail_after(120):
        async with client(shared, kind="agent", client_id="history") as c:
            await c.call("tasks.create", {"taskId": "hist", "title": "hist", "prompt": "p"})
            await c.call("tasks.create", {"taskId": "hist-other", "title": "other", "prompt": "p"})
            await c.call("tasks.startRun", {"taskId": "hist-other", "runId": "o-1"})
            other = (await c.call("tasks.runs", {"taskId": "hist-other"}))["runs"]
            made: list[str] = []
            for i in range(112):
                run_id = f"h{i:03d}"
                await c.call("tasks.startRun", {"taskId": "hist", "runId": run_id})
                made.append(run_id)
                if i % 9 == 0:
                    page = (await c.call("tasks.runs", {"taskId": "hist", "limit": 5}))["runs"]
                    assert [r["id"] for r in page] == made[::-1][:5]
                    assert page[0]["status"] == "running"
                await c.call("tasks.finishRun", {"runId": run_id, "status": ("completed", "error", "aborted")[i % 3]})
                if i >= 99:
                    full = (await c.call("tasks.runs", {"taskId": "hist", "limit": 100}))["runs"]
                    assert [r["id"] for r in full] == made[::-1][:100], i
                    starts = [r["startedAt"] for r in full]
                    assert starts == sorted(starts, reverse=True) and len(set(starts)) == 100
            assert (await c.call("tasks.runs", {"taskId": "hist-other"}))["runs"] == other
            assert (await c.call("tasks.get", {"taskId": "hist"}))["lastRunAt"] == full[0]["startedAt"]


# ------------------------------------------------------------------------------- §4.11 modes, §11.19


def _move_slots(data: Path, task_ids: list[str], to_ms: int) -> None:
    """Offline, with the host down: the tasks' stored slots (config_json nextRunAt) moved to ``to_ms``."""
    conn = sqlite3.connect(data / "pi.sqlite")
    try:
        for task_id in task_ids:
            (raw,) = conn.execute("SELECT config_json FROM scheduled_tasks WHERE id = ?", (task_id,)).fetchone()
            conn.execute("UPDATE scheduled_tasks SET config_json = ? WHERE id = ?",
                         (json.dumps({**json.loads(raw), "nextRunAt": to_ms}), task_id))
        conn.commit()
    finally:
        conn.close()


async def test_goal_and_legacy_chat_slots_are_refused_unattended_and_modes_are_normalized(tmp_path: Path) -> None:
    """§4.11 "config_json.mode ... legacy chat values to plan; new scheduled tasks default to agent, and
    create/update/import normalize the same values", "A scheduled or unattended run whose mode is a contract
    mode (Plan or Goal) is explicitly rejected ... with PLAN_REQUIRES_INTERACTIVE_SESSION — one shared code
    for both kinds", §11.19. A task made without a mode is agent; ``chat`` sent as mode or inside config is
    plan on create and update (config.mode too). Due at boot: the goal task's and the chat task's slots are
    each one error run with that code, no task.due, no .pi/goal or .pi/plan file, no pending proposal; the
    agent task fires once; switched to agent, the goal task's next Run now runs."""
    data, ws = data_dir(tmp_path), tmp_path / "ws"
    ws.mkdir()
    daily = {"prompt": "p", "cadence": "daily", "schedule": {"hour": 5, "minute": 5}, "workspacePath": str(ws)}
    with trio.fail_after(90):
        async with real_host(data, kind="agent") as (_proc, c):
            plain = await c.call("tasks.create", {"taskId": "m-agent", "title": "agent", **daily})
            assert (plain["mode"], plain["config"]["mode"]) == ("agent", "agent")
            goal = await c.call("tasks.create", {"taskId": "m-goal", "title": "goal", "mode": "goal", **daily})
            assert goal["mode"] == "goal"
            chat = await c.call("tasks.create", {"taskId": "m-chat", "title": "chat", **daily,
                                                 "config": {"mode": "chat"}})
            assert (chat["mode"], chat["config"]["mode"]) == ("plan", "plan")
            flipped = await c.call("tasks.update", {"taskId": "m-agent", "mode": "chat"})
            assert (flipped["mode"], flipped["config"]["mode"]) == ("plan", "plan")
            back = await c.call("tasks.update", {"taskId": "m-agent", "mode": "agent"})
            assert back["mode"] == "agent"
        _move_slots(data, ["m-agent", "m-goal", "m-chat"], int(time.time() * 1000) - 5 * MINUTE)
        async with real_host(data, kind="agent") as (_proc, c):
            await c.subscribe(["task.due"], cursor=0)
            event = await c.next_event()
            assert event.data["taskId"] == "m-agent"
            for task_id in ("m-goal", "m-chat"):
                [refused] = (await c.call("tasks.runs", {"taskId": task_id}))["runs"]
                assert (refused["status"], refused["errorCode"]) == ("error", "PLAN_REQUIRES_INTERACTIVE_SESSION")
                assert await code_of(c, "tasks.startRun", {"taskId": task_id}) == "PLAN_REQUIRES_INTERACTIVE_SESSION"
            assert [r["status"] for r in (await c.call("tasks.runs", {"taskId": "m-agent"}))["runs"]] == ["running"]
            assert not (ws / ".pi").exists()
            assert (await c.call("plans.pending", {}))["pending"] == []
            await c.call("tasks.update", {"taskId": "m-goal", "mode": "agent"})
            assert (await c.call("tasks.startRun", {"taskId": "m-goal"}))["status"] == "running"
            with trio.move_on_after(0.3):
                extra = await c.next_event()
                raise AssertionError(f"another task.due: {extra}")


def _zone_slot(zone: str, after_ms: int, hour: int, minute: int, weekdays: set[int]) -> int:
    """The first ``hour:minute`` of the named zone on a day in ``weekdays`` (0 = Sunday) after ``after_ms``."""
    tz = ZoneInfo(zone)
    today = datetime.fromtimestamp(after_ms / 1000, tz).date()
    for d in range(9):
        day = today + timedelta(days=d)
        at = int(datetime(day.year, day.month, day.day, hour, minute, tzinfo=tz).timestamp() * 1000)
        if day.isoweekday() % 7 in weekdays and at > after_ms:
            return at
    raise AssertionError("no slot within eight days")


async def test_a_host_restarted_in_another_zone_runs_each_task_at_its_wall_time_there(tmp_path: Path) -> None:
    """§4.11 "Daily/weekly schedules use the host local timezone": the schedule is a wall-clock time, the zone
    is wherever the host runs. Tasks saved by a host in Europe/Berlin (daily and weekly on several weekdays,
    09:30), the host then restarted in America/New_York (a laptop that travelled): each task is next due at
    09:30 New York time, not at 03:30 (Berlin's 09:30 carried over); a slot that passed while the host was
    down still fires once, then its next is New York's 09:30; a further restart in the same zone moves
    nothing and fires nothing."""
    data = data_dir(tmp_path)
    every, some = set(range(7)), {1, 3, 5}
    with trio.fail_after(90):
        proc = start_host_process(data, env={"TZ": "Europe/Berlin"})
        try:
            async with client(proc) as c:
                for task_id, cadence, days in (("trip-d", "daily", every), ("trip-w", "weekly", some),
                                               ("trip-missed", "daily", every)):
                    params: dict[str, Any] = {"taskId": task_id, "title": task_id, "prompt": "p", "cadence": cadence,
                                              "schedule": {"hour": 9, "minute": 30}}
                    if cadence == "weekly":
                        params["weekdays"] = sorted(days)
                    made = await c.call("tasks.create", params)
                    assert at_ms(made["nextRunAt"]) in {_zone_slot("Europe/Berlin", t, 9, 30, days) for t in (
                        made["createdAt"] - 1, int(time.time() * 1000))}, made["nextRunAt"]
        finally:
            proc.kill9()
        _move_slots(data, ["trip-missed"], int(time.time() * 1000) - HOUR)
        booted = int(time.time() * 1000)
        proc = start_host_process(data, env={"TZ": "America/New_York"})
        try:
            async with client(proc, kind="agent") as c:
                await c.subscribe(["task.due"], cursor=0)
                event = await c.next_event()
                assert event.data["taskId"] == "trip-missed"
                answered = int(time.time() * 1000)
                moved = {t["id"]: t for t in (await c.call("tasks.list", {}))["tasks"]}
                for task_id, days in (("trip-d", every), ("trip-w", some), ("trip-missed", every)):
                    got = at_ms(moved[task_id]["nextRunAt"])
                    want = {_zone_slot("America/New_York", t, 9, 30, days) for t in (booted, answered)}
                    assert got in want, (task_id, moved[task_id]["nextRunAt"],
                                         datetime.fromtimestamp(got / 1000, ZoneInfo("America/New_York")))
                assert len((await c.call("tasks.runs", {"taskId": "trip-missed"}))["runs"]) == 1
        finally:
            proc.kill9()
        proc = start_host_process(data, env={"TZ": "America/New_York"})
        try:
            async with client(proc, kind="agent") as c:
                assert {t["id"]: t["nextRunAt"] for t in (await c.call("tasks.list", {}))["tasks"]} == {
                    k: v["nextRunAt"] for k, v in moved.items()}
                for task_id in ("trip-d", "trip-w"):
                    assert (await c.call("tasks.runs", {"taskId": task_id}))["runs"] == [], task_id
        finally:
            proc.kill9()
