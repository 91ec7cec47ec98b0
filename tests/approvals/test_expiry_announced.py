"""Pending user requests expire at their deadline and it is announced (``runtime/request_expiry.py``).

Before the expiry timer a request past its deadline was written ``expired`` only by a late answer
or the next boot, and nothing announced it: a UI waiting for ``approval.resolved`` (or a sidecar
blocked on its approval) never heard. Now the host's timer expires it at the deadline with the
late-answer transition and publishes the event a late answer publishes, exactly once.

Full hosts run on real time: trio's ``autojump_clock`` cannot drive one (the DB writer and the
read pool work in threads, so virtual time jumps while they run and every deadline fires early).
Where the exact instant matters the host gets a settable wall clock (``SetClock``) and the timer is
nudged with a :class:`Tick`, or the actor runs alone on virtual time over a real schema database.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actors.db_writer import DbOp
from actors.events import EventBus
from runtime.client import HostClient, RpcError
from runtime.handlers import approvals as approval_handlers
from runtime.handlers import plans as plan_handlers
from runtime.host import RunningHost
from runtime.kernel.actor import ActorCrashed
from runtime.request_expiry import DeadlineAdded, ExpiryConfig, ExpiryStatus, RequestExpiry, Tick, deadline_notifier
from store import approvals, plans
from tests.dbkit import rows
from tests.hostkit import client_for, inprocess_host
from tests.scheduler.hostclock import SetClock, host_at
from tests.scheduler.schedkit import BASE, HOUR, MINUTE, LoopDb, VirtualWall, open_db

RESOLVED = ("approval.resolved", "interaction.resolved", "plan.resolved")
MARKDOWN = "# Plan\n\n1. Do it\n"
EXPIRY = "request-expiry"


def request_id_of(topic: str, data: dict[str, Any]) -> str:
    return str(data["requestId"] if topic == "plan.resolved" else data["request"]["requestId"])


def announced(bus: EventBus) -> list[tuple[str, str, str]]:
    """Every ``*.resolved`` event the host published so far: (topic, request id, status), from the backlog."""
    sub = bus.subscribe(list(RESOLVED), cursor=0)
    try:
        out = []
        for _ in range(sub.queued()):
            event = sub.receive_nowait()
            status = event.data["status"] if event.topic == "plan.resolved" else event.data["request"]["status"]
            out.append((event.topic, request_id_of(event.topic, event.data), status))
        return out
    finally:
        sub.close()


async def turn(c: HostClient, sid: str, tid: str) -> None:
    await c.call("session.startTurn", {"sessionId": sid, "turnId": tid})


async def agent_session(c: HostClient, tid: str = "t1") -> str:
    sid = str((await c.call("session.create", {"title": "asks"}))["id"])
    await turn(c, sid, tid)
    return sid


async def plan_session(c: HostClient, ws: Path) -> str:
    return str((await c.call("session.create", {"title": "plan", "projectPath": str(ws), "mode": "plan"}))["id"])


async def ask(c: HostClient, sid: str, deadline: int, tid: str = "t1", tool: str = "Bash") -> str:
    got = await c.call("approvals.request", {"sessionId": sid, "turnId": tid, "tool": tool, "risk": "medium",
                                             "expiresAt": deadline})
    return str(got["request"]["requestId"])


async def question(c: HostClient, sid: str, deadline: int, tid: str = "t1") -> str:
    got = await c.call("interactions.request", {"sessionId": sid, "turnId": tid, "question": "Which branch?",
                                                "allowFreeText": True, "expiresAt": deadline})
    return str(got["request"]["requestId"])


async def propose(c: HostClient, sid: str, ws: Path, deadline: int, call_id: str = "call-plan") -> str:
    got = await c.call("plans.submit", {"sessionId": sid, "turnId": "tp", "toolCallId": call_id, "kind": "plan",
                                        "markdown": MARKDOWN, "title": "Plan", "question": "Proceed?",
                                        "workspaceRoot": str(ws), "expiresAt": deadline})
    return str(got["requestId"])


async def refused(call: Awaitable[Any]) -> RpcError:
    with pytest.raises(RpcError) as info:
        await call
    return info.value


def tick(host: RunningHost) -> None:
    """The timer's wake-up, now (a test host's wall clock does not move by itself)."""
    if EXPIRY in host.supervisor.children():
        host.supervisor.ref(EXPIRY).tell_nowait(Tick())


async def resolved_events(c: HostClient, count: int) -> dict[str, tuple[str, dict[str, Any]]]:
    """The next ``count`` ``*.resolved`` events this client hears, by request id."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    with trio.fail_after(10):
        async for event in c:
            if event.topic in RESOLVED:
                out[request_id_of(event.topic, event.data)] = (event.topic, event.data)
                if len(out) == count:
                    return out
    raise AssertionError("the connection closed before the events came")


# ---------------------------------------------------------------------------
# a real host on real time


async def test_each_kind_expires_at_its_deadline_and_is_announced_without_any_answer(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "sidecar", kind="agent") as c:
            await c.subscribe(list(RESOLVED))
            a = await agent_session(c)
            p = await plan_session(c, ws)
            now = host.services.now_ms()
            deadlines = {await ask(c, a, now + 300): now + 300, await question(c, a, now + 400): now + 400,
                         await propose(c, p, ws, now + 500): now + 500}
            heard = await resolved_events(c, 3)
            assert host.services.now_ms() >= max(deadlines.values())  # announced at the deadline, not before
            assert set(heard) == set(deadlines)
            for rid, (topic, data) in heard.items():
                if topic == "plan.resolved":
                    assert data == {"requestId": rid, "sessionId": p, "status": "expired"}
                else:
                    request = data["request"]
                    assert (request["status"], request["resolvedAt"], request["sessionId"]) == \
                        ("expired", deadlines[rid], a)
            data_dir = tmp_path / "data"
            for table in ("approvals", "interactions", "plan_approvals"):
                assert [(s, r == e) for s, r, e in rows(data_dir, f"SELECT status, resolved_at, expires_at "
                                                                  f"FROM {table}")] == [("expired", True)]
            for method in ("approvals.pending", "interactions.pending", "plans.pending"):
                assert (await c.call(method, {}))["pending"] == []
            assert b"approval_decision" not in (data_dir / "sessions" / f"{a}.jsonl").read_bytes()  # nobody answered
            assert sorted(announced(host.bus)) == sorted(
                (topic, rid, "expired") for rid, (topic, _data) in heard.items())  # once each


async def test_a_late_answer_after_the_expiry_gets_the_conflict_it_always_got_and_no_second_event(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            await c.subscribe(list(RESOLVED))
            a = await agent_session(c)
            p = await plan_session(c, ws)
            now = host.services.now_ms()
            rid, qid = await ask(c, a, now + 200), await question(c, a, now + 200)
            pid = await propose(c, p, ws, now + 200)
            await resolved_events(c, 3)
            late = [
                await refused(ui.call("approvals.respond", {"sessionId": a, "requestId": rid,
                                                            "optionId": "allow_once"})),
                await refused(ui.call("interactions.respond", {"sessionId": a, "requestId": qid,
                                                               "answer": {"text": "main"}})),
                await refused(ui.call("plans.respond", {"requestId": pid, "action": "approve"})),
            ]
            assert [(e.data_code, e.data["status"]) for e in late] == [("CONFLICT", "expired")] * 3
            assert sorted(announced(host.bus)) == sorted([("approval.resolved", rid, "expired"),
                                                          ("interaction.resolved", qid, "expired"),
                                                          ("plan.resolved", pid, "expired")])
            session = (await ui.call("session.get", {"sessionId": p}))["session"]
            assert (session["mode"], session["state"]) == ("plan", "planning")  # expiry keeps the contract mode


# ---------------------------------------------------------------------------
# a real host on a wall clock the test sets


async def test_a_restart_settles_what_was_pending_and_the_new_host_expires_and_announces_its_own(
    tmp_path: Path,
) -> None:
    """Seed 003 §11.18: the boot fence settles every request pending before the restart (one past its
    deadline ``expired`` at it, any other ``interrupted``: never expired or announced later). A request
    of the new host is expired and announced by the new host's timer, which found nothing in memory."""
    ws, data = tmp_path / "ws", tmp_path / "data"
    ws.mkdir()
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with host_at(data, clock) as host, client_for(host, "sidecar", kind="agent") as c:
            a = await agent_session(c)
            gone = await ask(c, a, BASE + HOUR)  # passes while the host is down
            waiting = await ask(c, a, BASE + 3 * HOUR, tool="Edit")
            asked = await question(c, a, BASE + 3 * HOUR)
            proposed = await propose(c, await plan_session(c, ws), ws, BASE + 3 * HOUR)
        clock.ms = BASE + 2 * HOUR
        async with host_at(data, clock) as host, client_for(host, "sidecar", kind="agent") as c:
            await c.subscribe(list(RESOLVED))
            status = dict(rows(data, "SELECT request_id, status FROM approvals"))
            assert (status[gone], status[waiting]) == ("expired", "interrupted")
            assert rows(data, "SELECT resolved_at FROM approvals WHERE request_id = ?", gone) == [(BASE + HOUR,)]
            assert rows(data, "SELECT status FROM interactions") == [("interrupted",)]
            assert rows(data, "SELECT status FROM plan_approvals") == [("interrupted",)]
            assert (await host.supervisor.ref(EXPIRY).ask(ExpiryStatus()))["nextDeadline"] is None
            await turn(c, a, "t2")
            fresh = await ask(c, a, BASE + 2 * HOUR + 10 * MINUTE, tid="t2")
            clock.ms = BASE + 4 * HOUR  # past every deadline, old and new
            tick(host)
            heard = await resolved_events(c, 1)
            assert heard[fresh][1]["request"]["status"] == "expired"
            assert announced(host.bus) == [("approval.resolved", fresh, "expired")]
            assert dict(rows(data, "SELECT request_id, status FROM approvals"))[waiting] == "interrupted"
            assert rows(data, "SELECT request_id, status FROM interactions") == [(asked, "interrupted")]
            assert rows(data, "SELECT request_id, status FROM plan_approvals") == [(proposed, "interrupted")]


async def test_the_timer_restarted_after_a_crash_still_expires_and_announces(tmp_path: Path) -> None:
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with host_at(tmp_path, clock) as host, client_for(host, "sidecar", kind="agent") as c:
            await c.subscribe(list(RESOLVED))
            a = await agent_session(c)
            rid = await ask(c, a, BASE + HOUR)
            ref = host.supervisor.ref(EXPIRY)
            assert host.kill_actor(EXPIRY)
            status = None
            while status is None:  # an ask the killed incarnation took fails; the next one answers
                with contextlib.suppress(ActorCrashed):
                    status = await ref.ask(ExpiryStatus())
            assert ref.incarnation == 2 and status["nextDeadline"] == BASE + HOUR  # read from the DB on start
            clock.ms = BASE + HOUR
            tick(host)
            heard = await resolved_events(c, 1)
            assert heard[rid][1]["request"]["status"] == "expired"
            assert announced(host.bus) == [("approval.resolved", rid, "expired")]


@dataclass
class _Held:
    label: str
    go: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)
    taken: bool = False


class Gate:
    """Holds every op sent to the DB writer through the host's handle while closed, so a test
    chooses the order in which two racing transactions commit."""

    def __init__(self, ask: Callable[[DbOp], Awaitable[Any]]) -> None:
        self._ask = ask
        self.closed = True
        self.held: list[_Held] = []
        self._arrived = trio.Event()

    async def __call__(self, op: DbOp) -> Any:
        if not self.closed:
            return await self._ask(op)
        held = _Held(op.label)
        self.held.append(held)
        self._arrived.set()
        self._arrived = trio.Event()
        await held.go.wait()
        try:
            return await self._ask(op)
        finally:
            held.done.set()

    async def arrival(self, label: str) -> _Held:
        """The next held op with ``label`` (``requests.expire``: the timer's; ``""``: a session handler's)."""
        while True:
            for held in self.held:
                if held.label == label and not held.taken:
                    held.taken = True
                    return held
            await self._arrived.wait()

    async def commit(self, held: _Held) -> None:
        held.go.set()
        await held.done.wait()


@asynccontextmanager
async def gated(host: RunningHost, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gate]:
    db = host.services.db  # the one handle the session actors and the timer write through
    gate = Gate(db._ask)
    monkeypatch.setattr(db, "_ask", gate)
    try:
        yield gate
    finally:
        gate.closed = False
        for held in gate.held:
            held.go.set()


@pytest.mark.parametrize("first", ["timer", "answer"])
@pytest.mark.parametrize("kind", ["approval", "plan"])
async def test_a_late_answer_racing_the_timer_at_the_deadline_resolves_once(
    tmp_path: Path, kind: str, first: str,
) -> None:
    """The timer's expiry runs in the session's actor, so it and a late answer are ordered there: whichever
    runs first applies the expiry transition and announces it, the other changes nothing and announces
    nothing; the answer is refused either way."""
    ws, data = tmp_path / "ws", tmp_path / "data"
    ws.mkdir()
    clock = SetClock(BASE)
    deadline = BASE + HOUR
    with trio.fail_after(60):
        async with host_at(data, clock) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            if kind == "approval":
                sid = await agent_session(c)
                rid = await ask(c, sid, deadline)
                params: dict[str, Any] = {"sessionId": sid, "requestId": rid, "optionId": "allow_once"}
                method, topic, table = "approvals.respond", "approval.resolved", "approvals"
            else:
                rid = await propose(c, await plan_session(c, ws), ws, deadline)
                params = {"requestId": rid, "action": "approve"}
                method, topic, table = "plans.respond", "plan.resolved", "plan_approvals"
            clock.ms = deadline
            if first == "timer":
                tick(host)  # queued in the session's actor ahead of the answer, or run before it
            err = await refused(ui.call(method, params))
            tick(host)
            assert (err.data_code, err.data["status"]) == ("CONFLICT", "expired")
            with trio.fail_after(10):
                while rows(data, f"SELECT status FROM {table}") != [("expired",)]:  # noqa: ASYNC110 - in the db
                    await trio.sleep(0.01)
            await trio.sleep(0.05)
            assert announced(host.bus) == [(topic, rid, "expired")]


async def test_an_answer_given_in_time_is_never_expired_under_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found in review of the first version (the timer wrote through the DB writer directly): an answer
    accepted before the deadline wrote its decision line, the deadline passed before its commit, the timer
    expired the row in between, and the answer was refused while the transcript said ``allowed``. The
    timer now runs in the session's actor: it waits behind the answer, finds the row allowed and changes
    nothing."""
    clock = SetClock(BASE)
    deadline = BASE + HOUR
    with trio.fail_after(60):
        async with host_at(tmp_path, clock) as host, client_for(host, "sidecar", kind="agent") as c, \
                client_for(host, "ui", kind="ui") as ui:
            sid = await agent_session(c)
            rid = await ask(c, sid, deadline)
            clock.ms = deadline - 1
            outcome: list[Any] = []

            async def answer() -> None:
                outcome.append(await ui.call("approvals.respond", {"sessionId": sid, "requestId": rid,
                                                                   "optionId": "allow_once"}))

            async with gated(host, monkeypatch) as gate, trio.open_nursery() as nursery:
                nursery.start_soon(answer)
                commit = await gate.arrival("")  # its decision line is durable; its commit is held here
                clock.ms = deadline + 1
                tick(host)
                await trio.sleep(0.2)
                assert [h for h in gate.held if not h.taken] == []  # the timer waits behind the answer
                await gate.commit(commit)
                gate.closed = False
                for held in gate.held:
                    held.go.set()
            [got] = outcome
            assert got["request"]["status"] == "allowed"
            tick(host)
            await trio.sleep(0.1)
            assert rows(tmp_path, "SELECT status FROM approvals") == [("allowed",)]
            assert announced(host.bus) == [("approval.resolved", rid, "allowed")]


# ---------------------------------------------------------------------------
# the actor alone, on virtual time, over a real schema database


def _session(db: LoopDb, sid: str, mode: str = "agent") -> None:
    db.tx(lambda conn: conn.execute("INSERT INTO sessions(id, title, mode, created_at, updated_at) "
                                    "VALUES (?,?,?,?,?)", (sid, sid, mode, BASE, BASE)))


def _approval(db: LoopDb, rid: str, sid: str, deadline: int) -> None:
    db.tx(lambda conn: approvals.insert_approval(
        conn, request_id=rid, session_id=sid, turn_id="t1", tool_call_id=None, tool="Bash", args_summary="",
        risk="low", options=approvals.default_options(False), requested_by="sidecar", expires_at=deadline,
        now_ms=BASE))


def _interaction(db: LoopDb, rid: str, sid: str, deadline: int) -> None:
    db.tx(lambda conn: approvals.insert_interaction(
        conn, request_id=rid, session_id=sid, turn_id="t1", tool_call_id=None, question="?", choices=[],
        multiple=False, allow_free_text=True, requested_by="sidecar", expires_at=deadline, now_ms=BASE))


def _plan(db: LoopDb, rid: str, sid: str, deadline: int) -> None:
    artifact = plans.Artifact(f".pi/plan/{rid}.md", "0" * 64, 1)
    db.tx(lambda conn: plans.insert_pending(
        conn, request_id=rid, session_id=sid, turn_id="t1", tool_call_id=f"call-{rid}", kind="plan", markdown="x",
        title="t", question="q", artifact=artifact, expires_at=deadline, now_ms=BASE))


def _statuses(db: LoopDb) -> dict[str, str]:
    out: dict[str, str] = {}
    for table in ("approvals", "interactions", "plan_approvals"):
        out.update(db.conn.execute(f"SELECT request_id, status FROM {table}").fetchall())
    return out


@asynccontextmanager
async def running(db: LoopDb, wall: VirtualWall, config: ExpiryConfig) -> AsyncIterator[tuple[RequestExpiry, EventBus]]:
    bus = EventBus()
    actor = RequestExpiry(db=db, reads=db, bus=bus, now_ms=wall, config=config)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        try:
            yield actor, bus
        finally:
            actor.stop()


async def test_the_timer_sleeps_until_the_earliest_deadline_and_a_new_earlier_one_wakes_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock,
) -> None:
    wall = VirtualWall(BASE)
    with open_db(tmp_path / "pi.sqlite") as db:
        _session(db, "s1")
        _session(db, "s2", mode="plan")
        _approval(db, "apr_late", "s1", BASE + 50 * MINUTE)
        async with running(db, wall, ExpiryConfig(max_sleep=HOUR / 1000)) as (actor, bus):
            assert (await actor.ask(ExpiryStatus()))["nextDeadline"] == BASE + 50 * MINUTE
            _interaction(db, "ask_soon", "s1", BASE + 10 * MINUTE)  # created while it sleeps, and told
            _plan(db, "plan_mid", "s2", BASE + 20 * MINUTE)
            notify = deadline_notifier(actor.tell_nowait)
            notify(BASE + 10 * MINUTE)
            notify(BASE + 20 * MINUTE)
            await wall.sleep_until(BASE + 10 * MINUTE - 1)
            await trio.testing.wait_all_tasks_blocked()
            assert set(_statuses(db).values()) == {"pending"} and announced(bus) == []
            for at, rid, topic in ((BASE + 10 * MINUTE, "ask_soon", "interaction.resolved"),
                                   (BASE + 20 * MINUTE, "plan_mid", "plan.resolved"),
                                   (BASE + 50 * MINUTE, "apr_late", "approval.resolved")):
                await wall.sleep_until(at)
                await trio.testing.wait_all_tasks_blocked()
                assert _statuses(db)[rid] == "expired" and announced(bus)[-1] == (topic, rid, "expired")
            assert len(announced(bus)) == 3
            assert db.conn.execute("SELECT resolved_at FROM interactions").fetchall() == [(BASE + 10 * MINUTE,)]
            assert (await actor.ask(ExpiryStatus())) == {"nextDeadline": None, "expired": 3, "failures": 0}


async def test_work_per_wake_up_is_bounded_and_every_lapsed_request_is_announced_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock,
) -> None:
    wall = VirtualWall(BASE)
    with open_db(tmp_path / "pi.sqlite") as db:
        _session(db, "s1")
        for i in range(5):
            _approval(db, f"apr_{i}", "s1", BASE + MINUTE)
        for i in range(2):
            _session(db, f"p{i}", mode="plan")
            _plan(db, f"plan_{i}", f"p{i}", BASE + MINUTE)
        async with running(db, wall, ExpiryConfig(batch_limit=2)) as (actor, bus):
            await wall.sleep_until(BASE + 2 * MINUTE)
            await trio.testing.wait_all_tasks_blocked()
            assert db.writes == 4  # seven requests, at most two per transaction
            assert sorted(rid for _topic, rid, _status in announced(bus)) == sorted(_statuses(db))
            assert set(_statuses(db).values()) == {"expired"}
            actor.tell_nowait(DeadlineAdded(BASE))  # a stale tell: nothing left, nothing written or announced
            await trio.testing.wait_all_tasks_blocked()
            assert (db.writes, len(announced(bus))) == (4, 7)


def test_the_late_answer_path_and_the_timer_share_one_transition(tmp_path: Path) -> None:
    """Applied twice, the second changes nothing and returns nothing to announce."""
    with open_db(tmp_path / "pi.sqlite") as db:
        conn = db.conn
        _session(db, "s1")
        _session(db, "s2", mode="plan")
        _approval(db, "apr_1", "s1", BASE)
        _plan(db, "plan_1", "s2", BASE)
        assert approval_handlers.expire_lapsed(conn, "approval", "apr_1", BASE - 1) is None  # not due yet
        first = approval_handlers.expire_lapsed(conn, "approval", "apr_1", BASE + 5)
        assert first is not None and (first["request"]["status"], first["request"]["resolvedAt"]) == ("expired", BASE)
        assert approval_handlers.expire_lapsed(conn, "approval", "apr_1", BASE + 6) is None
        assert plan_handlers.expire_lapsed(conn, "s2", BASE) == [
            {"requestId": "plan_1", "sessionId": "s2", "status": "expired"}]
        assert plan_handlers.expire_lapsed(conn, "s2", BASE + 1) == []
        assert _statuses(db) == {"apr_1": "expired", "plan_1": "expired"}


def _damage_status(db: LoopDb, table: str, rid: str, status: str) -> None:
    """A status outside its set (the host never writes one; SQLite checks a CHECK on writes only): the row leaves
    the partial index of pending rows, and has no resolution time, so it was never settled."""
    db.conn.execute("PRAGMA ignore_check_constraints = ON")
    try:
        db.tx(lambda conn: conn.execute(f"UPDATE {table} SET status = ? WHERE request_id = ?", (status, rid)))
    finally:
        db.conn.execute("PRAGMA ignore_check_constraints = OFF")


async def test_a_request_whose_status_is_damaged_expires_at_its_deadline_and_is_announced(
    tmp_path: Path, autojump_clock: trio.testing.MockClock,
) -> None:
    """Before, the timer read deadlines and lapsed requests through the pending rows' partial index only: a request
    whose status is damaged was never expired or announced (the sidecar waiting on it heard nothing until its turn
    ended or the host restarted). Now the timer's wake-ups look for such requests too: one damaged before the timer
    starts (its first read), one damaged while it sleeps (the read after the previous expiry)."""
    wall = VirtualWall(BASE)
    with open_db(tmp_path / "pi.sqlite") as db:
        _session(db, "s1")
        _approval(db, "apr_bad", "s1", BASE + 10 * MINUTE)
        _interaction(db, "ask_bad", "s1", BASE + 20 * MINUTE)
        _approval(db, "apr_ok", "s1", BASE + 30 * MINUTE)
        _damage_status(db, "approvals", "apr_bad", "pendinf")
        async with running(db, wall, ExpiryConfig(max_sleep=HOUR / 1000)) as (actor, bus):
            assert (await actor.ask(ExpiryStatus()))["nextDeadline"] == BASE + 10 * MINUTE
            _damage_status(db, "interactions", "ask_bad", "answerd")
            await wall.sleep_until(BASE + 10 * MINUTE - 1)
            await trio.testing.wait_all_tasks_blocked()
            assert announced(bus) == []
            for at, rid, topic in ((BASE + 10 * MINUTE, "apr_bad", "approval.resolved"),
                                   (BASE + 20 * MINUTE, "ask_bad", "interaction.resolved"),
                                   (BASE + 30 * MINUTE, "apr_ok", "approval.resolved")):
                await wall.sleep_until(at)
                await trio.testing.wait_all_tasks_blocked()
                assert _statuses(db)[rid] == "expired" and announced(bus)[-1] == (topic, rid, "expired")
            assert len(announced(bus)) == 3
            assert db.conn.execute("SELECT resolved_at FROM approvals WHERE request_id = 'apr_bad'").fetchall() == [
                (BASE + 10 * MINUTE,)]
            assert (await actor.ask(ExpiryStatus())) == {"nextDeadline": None, "expired": 3, "failures": 0}


async def test_a_plan_approval_whose_status_is_damaged_expires_at_its_deadline_and_is_announced(
    tmp_path: Path, autojump_clock: trio.testing.MockClock,
) -> None:
    """Before, plan approvals were read as pending by ``status = 'pending'`` only: one whose status is damaged (never
    settled, unanswerable: CORRUPT_DATA) was never expired or announced, and stayed so forever. Now the timer's
    wake-ups look for it too, as for an approval: one damaged before the timer starts, one while it sleeps."""
    wall = VirtualWall(BASE)
    with open_db(tmp_path / "pi.sqlite") as db:
        for sid in ("s1", "s2", "s3"):
            _session(db, sid, mode="plan")
        _plan(db, "plan_bad", "s1", BASE + 10 * MINUTE)
        _plan(db, "plan_bad2", "s2", BASE + 20 * MINUTE)
        _plan(db, "plan_ok", "s3", BASE + 30 * MINUTE)
        _damage_status(db, "plan_approvals", "plan_bad", "pendinf")
        async with running(db, wall, ExpiryConfig(max_sleep=HOUR / 1000)) as (actor, bus):
            assert (await actor.ask(ExpiryStatus()))["nextDeadline"] == BASE + 10 * MINUTE
            _damage_status(db, "plan_approvals", "plan_bad2", "aproved")
            await wall.sleep_until(BASE + 10 * MINUTE - 1)
            await trio.testing.wait_all_tasks_blocked()
            assert announced(bus) == []
            for at, rid in ((BASE + 10 * MINUTE, "plan_bad"), (BASE + 20 * MINUTE, "plan_bad2"),
                            (BASE + 30 * MINUTE, "plan_ok")):
                await wall.sleep_until(at)
                await trio.testing.wait_all_tasks_blocked()
                assert _statuses(db)[rid] == "expired" and announced(bus)[-1] == ("plan.resolved", rid, "expired")
            assert len(announced(bus)) == 3
            assert db.conn.execute("SELECT resolved_at, error_code FROM plan_approvals "
                                   "WHERE request_id = 'plan_bad'").fetchall() == [(BASE + 10 * MINUTE, "EXPIRED")]
            assert (await actor.ask(ExpiryStatus())) == {"nextDeadline": None, "expired": 3, "failures": 0}
