"""Model-based test: turns, the durable turn queue, approvals and steering across restarts and keyed retries.

A hypothesis ``RuleBasedStateMachine`` plays a UI and the agent sidecar against one real ``pi-host serve``
process (forked by tests/hostkit.py, so a hard restart is a real SIGKILL) and checks the host against a
small model of seed 003 §4.6 (turns), §4.6b (turn_queue), §9 boot maintenance (running turns aborted,
pending approvals interrupted, no replay), the active-turn steering reservations, seed 000's
approvals/interactions, and protocol/README.md §10/§11 (leases, "one turn at a time", "exactly one answer
wins", "a prompt the person queued is either in the queue or in the transcript").

Unlike tests/queue/test_queue_statemachine.py (store/queue.py alone, no turns, no host) every rule here
goes through the gateway, and the rules interleave the queue with turns, approvals, steering, restarts and
``retry_last``: the last keyed write resent with the same clientId + submissionId must give the same answer
and no second effect.

Invariants after every step: ``session.queueList`` (order, ids, positions, priorities, ``held``),
``session.listTurns`` statuses, ``approvals.pending`` (none pending for an ended turn), ``session.get``
``decisions`` (every resolved request once, with its status) and the transcript (every acknowledged
prompt and steering row exactly once).

``PIHOST_SOAK=1`` runs more and longer examples.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import trio
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from protocol.models_queue import QueueState
from runtime.client import HostClient, RpcError, open_client
from tests.hostkit import HostProcess, start_host_process
from tests.loopthread import LoopThread

SOAK = os.environ.get("PIHOST_SOAK") == "1"
SID = "turnprop"
CTL = "ctl-1"
UI_ID = "ui-1"
AGENT_ID = "agent-1"
MAX_ENTRIES = 8


class ProcHost(LoopThread):
    """A real host process and two connections (a UI and the agent sidecar), driven from a trio loop in a
    background thread so the synchronous state machine can call it."""

    tolerate_errors_after_stop = True  # the connections die with a SIGKILLed host

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc: HostProcess | None = None
        self.clients: dict[str, HostClient] = {}
        super().__init__("turnprop-host")
        self.start()

    @asynccontextmanager
    async def _opened(self) -> AsyncIterator[None]:
        assert self.proc is not None
        proc = self.proc
        try:
            async with open_client(proc.url, proc.token, client_id=UI_ID, client_kind="ui") as ui, \
                    open_client(proc.url, proc.token, client_id=AGENT_ID, client_kind="agent") as agent:
                self.clients = {"ui": ui, "agent": agent}
                yield
        finally:
            self.clients = {}

    def start(self) -> None:
        self.proc = start_host_process(self.root)
        self.connect()

    def _close_pipes(self) -> None:
        assert self.proc is not None
        for pipe in (self.proc.proc.stdout, self.proc.proc.stderr):
            if pipe is not None:
                pipe.close()

    def restart(self, *, hard: bool) -> None:
        assert self.proc is not None
        if hard:
            self.proc.kill9()  # while both clients are still connected
            self.disconnect()
        else:
            self.disconnect()
            self.proc.terminate()
        self._close_pipes()
        self.start()

    def call(self, who: str, method: str, params: dict[str, Any]) -> Any:
        async def go() -> Any:
            with trio.fail_after(30):
                return await self.clients[who].call(method, params)

        return self.run(go)

    def close(self) -> None:
        if self.proc is not None:
            if self.clients:
                self.disconnect()
            self.proc.terminate()
            self._close_pipes()
        self.shutdown()


def note(what: str) -> None:
    """A hypothesis event (``--hypothesis-show-statistics``), also when a fixed sequence runs the rules."""
    try:
        event(what)
    except InvalidArgument:
        pass


# ---------------------------------------------------------------------------------------------- the model
@dataclass
class Entry:
    id: str
    key: str | None
    content: str
    position: int
    priority: int | None = None
    first: bool = False  # a lease offered again: listed first


@dataclass
class Turn:
    id: str
    status: str
    entry: Entry | None = None  # the queue entry it began with
    landed: bool = False  # its prompt (or any user row of it) is in the transcript
    started: int = 0  # model step it started at


@dataclass
class Approval:
    """A permission request (``kind`` approval) or a question (``kind`` interaction)."""
    id: str
    turn: str
    status: str  # pending | allowed | denied (approval) | answered (interaction) | expired | cancelled | interrupted
    kind: str = "approval"
    params: dict[str, Any] = field(default_factory=dict)  # what the sidecar asked with


@dataclass
class Reply:
    """An assistant row reserved while it streams (meta.status streaming), then settled in place."""
    id: str
    turn: str
    status: str = "streaming"  # streaming | completed | aborted
    texts: set[str] = field(default_factory=lambda: {"partial"})  # what its text may be
    checkpoint: str | None = None  # the newest in-flight checkpoint saved for it
    settled_any: bool = False  # its turn ended: it may be settled already (at the latest by the next boot)


@dataclass
class Keyed:
    who: str
    method: str
    params: dict[str, Any]
    result: Any


@dataclass
class Model:
    entries: list[Entry] = field(default_factory=list)
    lease: Entry | None = None  # taken, no turn began with it yet
    held: bool = False
    turns: dict[str, Turn] = field(default_factory=dict)
    running: Turn | None = None
    approvals: dict[str, Approval] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)  # acknowledged rows in transcript order, each once
    replies: dict[str, Reply] = field(default_factory=dict)
    keys: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (its latest entry id, content)
    high: int = 0
    last_message: int = -1  # model step of the newest transcript row

    def order(self) -> list[Entry]:
        first = [e for e in self.entries if e.first]
        promoted = sorted((e for e in self.entries if not e.first and e.priority is not None),
                          key=lambda e: e.priority or 0)
        rest = sorted((e for e in self.entries if not e.first and e.priority is None), key=lambda e: e.position)
        return first + promoted + rest

    def waiting(self) -> int:
        """What counts against the 8-entry limit: the listed entries and the handed-out one whose turn has
        not run (a restart, an attach or its turn's abort lists it again)."""
        running = self.running is not None and self.running.entry is not None and not self.running.landed
        return len(self.entries) + (self.lease is not None) + running

    def handed_out(self) -> list[Entry]:
        """The entries taken and not settled yet: their rows (and places) are kept."""
        out = [self.lease] if self.lease is not None else []
        if self.running is not None and self.running.entry is not None:
            out.append(self.running.entry)
        return out

    def release_key(self, entry: Entry) -> None:
        """An entry left the queue (taken and ran, or removed). Its key is not released: the host remembers
        the keys of the last entries that left, so a late retry of a delivered push is a replay (of the
        entry that left), never the prompt queued twice (store/queue.py ``CONSUMED_KEYS_KEPT``)."""

    def reoffer_lease(self) -> None:
        """After a restart or an attach: what was taken and no turn began with is listed again, first."""
        if self.lease is not None:
            self.lease.first = True
            self.entries.append(self.lease)
            self.lease = None


KEYS = st.sampled_from(["k1", "k2", "k3", None])
CONTENTS = st.sampled_from(["a", "b"])


class TurnsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._dir = tempfile.TemporaryDirectory()
        self.root = Path(self._dir.name)
        self.host = ProcHost(self.root)
        self.m = Model()
        self.n = 0
        self.last: Keyed | None = None
        self.requeued: list[Entry] = []  # re-admitted under a new id the host picks: adopt from queueList

    def teardown(self) -> None:
        try:
            self.host.close()
        finally:
            self._dir.cleanup()

    # ------------------------------------------------------------------ plumbing
    def fresh(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def keyed(self, who: str, method: str, params: dict[str, Any]) -> Any:
        """A mutating call with a fresh submissionId; remembered for ``retry_last`` when it succeeds."""
        note(f"call {method}")
        params = {**params, "submissionId": self.fresh("sub-")}
        result = self.host.call(who, method, params)
        self.last = Keyed(who, method, params, result)
        return result

    def keyed_error(self, who: str, method: str, params: dict[str, Any]) -> RpcError:
        try:
            self.keyed(who, method, params)
        except RpcError as err:
            return err
        raise AssertionError(f"{method} {params} should have failed")

    def queue_state(self) -> dict[str, Any]:
        state = self.host.call("ui", "session.queueList", {"sessionId": SID})
        QueueState.model_validate(state)  # the documented shape (at most 8 entries)
        return dict(state)

    def adopt_requeued(self) -> None:
        if not self.requeued:
            return
        known = {e.id for e in self.m.entries}
        listed = self.queue_state()["entries"]
        for entry in self.requeued:
            match = [e for e in listed if e["id"] not in known and e["content"] == entry.content
                     and e.get("idempotencyKey") == entry.key and e["position"] == entry.position]
            assert len(match) == 1, f"an aborted prompt waits again under a new id: {entry} in {listed}"
            old = entry.id
            entry.id = match[0]["id"]
            known.add(entry.id)
            if entry.key is not None:
                self.m.keys[entry.key] = (entry.id, entry.content)
            assert entry.id != old
            note("an aborted queue turn's prompt waits again")
            self.m.entries.append(entry)
        self.requeued = []

    def settle_queue_turn(self, turn: Turn) -> None:
        """The queue entry a turn began with, once the turn ended: consumed if it ran, else it waits again
        under a new entry id (same content, key and place)."""
        entry = turn.entry
        if entry is None:
            return
        turn.entry = None
        note(f"queue turn ended {turn.status}, landed={turn.landed}")
        if turn.landed or turn.status in ("completed", "error"):
            self.m.release_key(entry)
        else:
            entry.first = False
            self.requeued.append(entry)

    def end_running(self, status: str, approval_status: str) -> None:
        turn = self.m.running
        assert turn is not None
        turn.status = status
        self.m.running = None
        for a in self.m.approvals.values():
            if a.turn == turn.id and a.status == "pending":
                a.status = approval_status
        self.settle_queue_turn(turn)
        reply = self.m.replies.get(f"r-{turn.id}")
        if reply is not None and reply.status == "streaming":
            reply.settled_any = True
            if reply.checkpoint is not None:
                reply.texts.add(reply.checkpoint)

    # ------------------------------------------------------------------ setup
    @initialize()
    def create(self) -> None:
        self.host.call("ui", "session.create", {"sessionId": SID, "title": "turns"})
        state = self.host.call("agent", "session.queueAttach", {"sessionId": SID, "controllerId": CTL})
        assert state["held"] is False

    # ------------------------------------------------------------------ the UI's queue
    @rule(key=KEYS, content=CONTENTS)
    def push(self, key: str | None, content: str) -> None:
        m = self.m
        params: dict[str, Any] = {"sessionId": SID, "principal": "user", "content": content,
                                  "permissionMode": "ask"}
        if key is not None:
            params["idempotencyKey"] = key
        replay = key is not None and key in m.keys
        if replay and m.keys[key][1] != content:  # type: ignore[index]
            err = self.keyed_error("ui", "session.queuePush", params)
            assert err.data_code == "IDEMPOTENCY_CONFLICT", err
            return
        if not replay and m.waiting() >= MAX_ENTRIES:
            err = self.keyed_error("ui", "session.queuePush", params)
            assert err.data_code == "LIMIT_EXCEEDED", err
            return
        try:
            out = self.keyed("ui", "session.queuePush", params)
        except RpcError as err:
            raise AssertionError(f"push refused: {err.data_code} {err} (model: {m.waiting()} waiting, "
                                 f"lease {m.lease}, replay {replay})") from err
        assert out["replayed"] is replay
        if replay:
            assert out["entry"]["id"] == m.keys[key][0]  # type: ignore[index]
            return
        m.high += 1
        assert out["entry"]["position"] == m.high
        entry = Entry(out["entry"]["id"], key, content, m.high)
        m.entries.append(entry)
        if key is not None:
            m.keys[key] = (entry.id, content)

    @precondition(lambda self: bool(self.m.entries))
    @rule(i=st.integers(0, 7))
    def remove(self, i: int) -> None:
        entry = self.m.entries[i % len(self.m.entries)]
        self.keyed("ui", "session.queueRemove", {"sessionId": SID, "entryId": entry.id})
        self.m.entries.remove(entry)
        self.m.release_key(entry)

    @precondition(lambda self: bool(self.m.entries))
    @rule(i=st.integers(0, 7))
    def prioritize(self, i: int) -> None:
        entry = self.m.entries[i % len(self.m.entries)]
        self.keyed("ui", "session.queuePrioritize", {"sessionId": SID, "entryId": entry.id})
        if entry.priority is None:
            # MAX(priority) + 1 inside the session: over its rows, the handed-out ones too
            rows = [*self.m.entries, *self.m.handed_out()]
            entry.priority = max((e.priority for e in rows if e.priority is not None), default=0) + 1

    @precondition(lambda self: bool(self.m.entries))
    @rule(i=st.integers(0, 7), direction=st.sampled_from(["up", "down"]))
    def reorder(self, i: int, direction: str) -> None:
        entry = self.m.entries[i % len(self.m.entries)]
        # an entry offered again is listed first whatever its position: not moved, and nobody's neighbour
        line = sorted((e for e in self.m.entries if e.priority is None and not e.first), key=lambda e: e.position)
        ok = entry.priority is None and not entry.first
        j = 0
        if ok:
            k = line.index(entry)
            j = k - 1 if direction == "up" else k + 1
            ok = 0 <= j < len(line)
        params = {"sessionId": SID, "entryId": entry.id, "direction": direction}
        if not ok:
            err = self.keyed_error("ui", "session.queueReorder", params)
            assert err.data_code == "CONFLICT", err
            return
        self.keyed("ui", "session.queueReorder", params)
        other = line[j]
        entry.position, other.position = other.position, entry.position

    # ------------------------------------------------------------------ the sidecar
    @rule()
    def attach(self) -> None:
        state = self.keyed("agent", "session.queueAttach", {"sessionId": SID, "controllerId": CTL})
        self.m.held = False
        self.m.reoffer_lease()
        assert state["held"] is False

    @rule()
    def take(self) -> None:
        m = self.m
        out = self.keyed("agent", "session.queueTake", {"sessionId": SID, "controllerId": CTL})
        if m.held:
            assert out == {"entry": None, "reason": "held"}, out
            return
        if m.running is not None:
            assert out["entry"] is None and out["reason"] == "turnRunning", out
            return
        if m.lease is not None:  # no turn began with it: the controller moved on
            note("a take consumed an unstarted lease")
            m.release_key(m.lease)
            m.lease = None
        order = m.order()
        if not order:
            assert out["entry"] is None and out["reason"] == "empty", out
            return
        assert out["entry"] is not None and out["entry"]["id"] == order[0].id, (out, order)
        m.entries.remove(order[0])
        order[0].first = False
        m.lease = order[0]

    @precondition(lambda self: self.m.running is None)
    @rule(ui=st.booleans())
    def start_turn(self, ui: bool = False) -> None:
        """The sidecar starts a turn (it carries what the sidecar took); or the UI starts one of its own,
        which leaves the entry the sidecar took alone."""
        m = self.m
        tid = self.fresh("t")
        turn = self.keyed("ui" if ui else "agent", "session.startTurn", {"sessionId": SID, "turnId": tid})
        assert turn["status"] == "running" and turn["id"] == tid
        entry: Entry | None = None
        if not ui:
            entry = m.lease
            offered = [e for e in m.entries if e.first]
            if entry is None and offered:
                # An entry this client took, offered again by a restart or an attach: a flow that goes on
                # after a reconnect still carries it into its startTurn.
                entry = offered[0]
                note("a turn carried an entry offered again")
                m.entries.remove(entry)
                entry.first = False
            m.lease = None
        elif m.lease is not None or any(e.first for e in m.entries):
            note("another client's turn left a handed-out entry alone")
        m.running = m.turns[tid] = Turn(tid, "running", entry=entry, started=self.n)

    @precondition(lambda self: self.m.lease is not None)
    @rule()
    def remove_handed_out(self) -> None:
        """A handed-out entry is not listed: removing it is NOT_FOUND and it stays handed out."""
        assert self.m.lease is not None
        err = self.keyed_error("ui", "session.queueRemove", {"sessionId": SID, "entryId": self.m.lease.id})
        assert err.data_code == "NOT_FOUND", err

    @precondition(lambda self: self.last is not None and self.last.method in (
        "session.queuePush", "session.appendMessage", "approvals.respond", "session.endTurn"))
    @rule()
    def retry_last_changed(self) -> None:
        """The last keyed write's submissionId with another request: IDEMPOTENCY_CONFLICT, no effect."""
        last = self.last
        assert last is not None
        params = dict(last.params)
        if last.method == "session.queuePush":
            params["content"] = params["content"] + "-changed"
        elif last.method == "session.appendMessage":
            params["message"] = {**params["message"], "blocks": [{"type": "text", "text": "changed"}]}
        elif last.method == "approvals.respond":
            params["optionId"] = "deny" if params["optionId"] != "deny" else "allow_once"
        else:
            params["status"] = "error" if params["status"] != "error" else "completed"
        try:
            self.host.call(last.who, last.method, params)
        except RpcError as err:
            assert err.data_code == "IDEMPOTENCY_CONFLICT", (last.method, err)
            return
        raise AssertionError(f"{last.method} reused submissionId with another request was accepted")

    @precondition(lambda self: self.m.running is not None)
    @rule()
    def start_second_turn(self) -> None:
        """One turn at a time: another start while one runs is CONFLICT naming the running one."""
        err = self.keyed_error("agent", "session.startTurn", {"sessionId": SID, "turnId": self.fresh("t")})
        assert err.data_code == "CONFLICT" and (err.data or {}).get("runningTurnId") == self.m.running.id, err  # type: ignore[union-attr]

    @precondition(lambda self: self.m.running is not None and not self.m.running.landed)
    @rule()
    def land_prompt(self) -> None:
        turn = self.m.running
        assert turn is not None
        mid = f"p-{turn.entry.id}" if turn.entry is not None else f"u-{turn.id}"
        text = turn.entry.content if turn.entry is not None else "direct"
        message = {"id": mid, "role": "user", "blocks": [{"type": "text", "text": text}], "turnId": turn.id}
        self.keyed("agent", "session.appendMessage", {"sessionId": SID, "message": message})
        turn.landed = True
        self.m.messages.append(mid)
        self.m.last_message = self.n

    @precondition(lambda self: self.m.running is not None and self.m.running.landed)
    @rule()
    def steer(self) -> None:
        """The UI steers the running turn: a user row with meta.steering."""
        turn = self.m.running
        assert turn is not None
        mid = self.fresh("steer-")
        message = {"id": mid, "role": "user", "blocks": [{"type": "text", "text": "also this"}],
                   "turnId": turn.id, "meta": {"steering": True}}
        self.keyed("ui", "session.appendMessage", {"sessionId": SID, "message": message})
        self.m.messages.append(mid)
        self.m.last_message = self.n

    def reply_of(self, turn: Turn | None) -> Reply | None:
        return None if turn is None else self.m.replies.get(f"r-{turn.id}")

    @precondition(lambda self: self.m.running is not None and self.m.running.landed
                  and self.reply_of(self.m.running) is None)
    @rule()
    def reserve_reply(self) -> None:
        """The streaming assistant is reserved in the transcript (a steering row may follow it)."""
        turn = self.m.running
        assert turn is not None
        mid = f"r-{turn.id}"
        message = {"id": mid, "role": "assistant", "blocks": [{"type": "text", "text": "partial"}],
                   "turnId": turn.id, "meta": {"status": "streaming"}}
        self.keyed("agent", "session.appendMessage", {"sessionId": SID, "message": message})
        self.m.replies[mid] = Reply(mid, turn.id)
        self.m.messages.append(mid)
        self.m.last_message = self.n

    @precondition(lambda self: self.reply_of(self.m.running) is not None)
    @rule()
    def checkpoint(self) -> None:
        turn = self.m.running
        reply = self.reply_of(turn)
        assert turn is not None and reply is not None
        text = self.fresh("cp-")
        message = {"id": reply.id, "role": "assistant", "blocks": [{"type": "text", "text": text}],
                   "turnId": turn.id}
        out = self.keyed("agent", "session.saveInflightMessage",
                         {"sessionId": SID, "turnId": turn.id, "message": message})
        if reply.status == "streaming":
            assert out["saved"] is True, out
            reply.checkpoint = text
        else:
            assert out["saved"] is False and out.get("reason") == "already_indexed", out

    @precondition(lambda self: any(t.status != "running" for t in self.m.turns.values()))
    @rule(i=st.integers(0, 20))
    def late_checkpoint(self, i: int) -> None:
        """A checkpoint for a turn that ended (or that a restart interrupted) is CONFLICT and changes nothing."""
        ended = sorted(t.id for t in self.m.turns.values() if t.status != "running")
        tid = ended[i % len(ended)]
        message = {"id": f"late-{tid}", "role": "assistant", "blocks": [{"type": "text", "text": "late"}],
                   "turnId": tid}
        err = self.keyed_error("agent", "session.saveInflightMessage",
                               {"sessionId": SID, "turnId": tid, "message": message})
        assert err.data_code == "CONFLICT" and err.data.get("status") == self.m.turns[tid].status, (err, err.data)

    @precondition(lambda self: self.reply_of(self.m.running) is not None
                  and self.reply_of(self.m.running).status == "streaming")  # type: ignore[union-attr]
    @rule()
    def finish_reply(self) -> None:
        """The terminal assistant replaces its streaming reservation in place."""
        turn = self.m.running
        reply = self.reply_of(turn)
        assert turn is not None and reply is not None
        message = {"id": reply.id, "role": "assistant", "blocks": [{"type": "text", "text": "final"}],
                   "turnId": turn.id, "meta": {"status": "completed"}}
        self.keyed("agent", "session.appendMessage", {"sessionId": SID, "message": message})
        reply.status, reply.texts, reply.checkpoint = "completed", {"final"}, None

    @precondition(lambda self: any(r.status == "completed" for r in self.m.replies.values()))
    @rule(i=st.integers(0, 20))
    def late_partial(self, i: int) -> None:
        """A late streaming snapshot of a settled reply is a replay: it cannot overwrite the result."""
        done = sorted(r.id for r in self.m.replies.values() if r.status == "completed")
        reply = self.m.replies[done[i % len(done)]]
        message = {"id": reply.id, "role": "assistant", "blocks": [{"type": "text", "text": "stale"}],
                   "turnId": reply.turn, "meta": {"status": "streaming"}}
        out = self.keyed("agent", "session.appendMessage", {"sessionId": SID, "message": message})
        assert out.get("replayed") is True, out

    @precondition(lambda self: any(t.status == "aborted" for t in self.m.turns.values()))
    @rule(i=st.integers(0, 20))
    def late_user_row(self, i: int) -> None:
        """A new user message for a turn that ended aborted is CONFLICT: nothing lands."""
        aborted = sorted(t.id for t in self.m.turns.values() if t.status == "aborted")
        tid = aborted[i % len(aborted)]
        message = {"id": self.fresh("late-u-"), "role": "user", "blocks": [{"type": "text", "text": "late"}],
                   "turnId": tid}
        err = self.keyed_error("ui", "session.appendMessage", {"sessionId": SID, "message": message})
        assert err.data_code == "CONFLICT", err

    @precondition(lambda self: self.m.running is not None)
    @rule(short=st.booleans(), question=st.booleans())
    def request_approval(self, short: bool, question: bool) -> None:
        """The sidecar asks for a tool permission (or asks the person a question); ``short`` ones expire."""
        turn = self.m.running
        assert turn is not None
        now = int(time.time() * 1000)
        params: dict[str, Any] = {"sessionId": SID, "turnId": turn.id, "toolCallId": self.fresh("call-"),
                                  "expiresAt": now + (250 if short else 600_000)}
        if question:
            params.update(question="which one?", choices=[{"id": "x", "label": "X"}], allowFreeText=True)
            method, kind = "interactions.request", "interaction"
        else:
            params.update(tool="Bash", argsSummary="ls", risk="low")
            method, kind = "approvals.request", "approval"
        out = self.keyed("agent", method, params)["request"]
        assert out["status"] == "pending", out
        a = self.m.approvals[out["requestId"]] = Approval(out["requestId"], turn.id, "pending", kind, params)
        if short:
            time.sleep(0.4)  # past expiresAt: the host's timer writes it expired
            a.status = "expired"
        self.ask_again_for(a)

    def ask_again_for(self, a: Approval) -> None:
        """A sidecar that asks again for the same tool call gets the first request, as it stands; once the
        turn ended it may instead be told that only a running turn asks (CONFLICT): nothing new is asked."""
        method = "approvals.request" if a.kind == "approval" else "interactions.request"
        try:
            again = self.keyed("agent", method, a.params)["request"]
        except RpcError as err:
            note(f"asking again after the turn ended: {a.kind} {err.data_code}")
            assert self.m.turns[a.turn].status != "running" and err.data_code == "CONFLICT", (err, a)
            return
        assert again["requestId"] == a.id and again["status"] == a.status, (again, a)

    @precondition(lambda self: bool(self.m.approvals))
    @rule(i=st.integers(0, 7))
    def ask_again(self, i: int) -> None:
        ids = sorted(self.m.approvals)
        self.ask_again_for(self.m.approvals[ids[i % len(ids)]])

    @precondition(lambda self: any(t.status != "running" for t in self.m.turns.values()))
    @rule(i=st.integers(0, 20))
    def start_ended_turn_again(self, i: int) -> None:
        """Starting an ended turn's id again (a sidecar flow that goes on after a restart) never runs it again."""
        ended = sorted(t.id for t in self.m.turns.values() if t.status != "running")
        err = self.keyed_error("agent", "session.startTurn", {"sessionId": SID, "turnId": ended[i % len(ended)]})
        assert err.data_code == "CONFLICT", err

    @precondition(lambda self: bool(self.m.approvals))
    @rule(i=st.integers(0, 7), allow=st.booleans())
    def respond(self, i: int, allow: bool) -> None:
        """A UI answers: exactly one answer wins; a second, a late one, one after the turn ended or after a
        restart is CONFLICT with the request's status."""
        ids = sorted(self.m.approvals)
        a = self.m.approvals[ids[i % len(ids)]]
        if a.kind == "approval":
            method = "approvals.respond"
            params: dict[str, Any] = {"sessionId": SID, "requestId": a.id,
                                      "optionId": "allow_once" if allow else "deny"}
            status = "allowed" if allow else "denied"
        else:
            method = "interactions.respond"
            params = {"sessionId": SID, "requestId": a.id,
                      "answer": {"choiceIds": ["x"]} if allow else {"text": "neither"}}
            status = "answered"
        note(f"respond to {a.kind} {a.status}")
        err = self.keyed_error("agent", method, params)  # the sidecar may not answer its own request
        assert err.data_code == "PERMISSION_DENIED", err
        if a.status != "pending":
            err = self.keyed_error("ui", method, params)
            assert err.data_code == "CONFLICT" and (err.data or {}).get("status") == a.status, (err, err.data, a)
            return
        out = self.keyed("ui", method, params)["request"]
        a.status = status
        assert out["status"] == a.status, out

    @precondition(lambda self: self.m.running is not None)
    @rule(status=st.sampled_from(["completed", "aborted", "error"]))
    def end_turn(self, status: str) -> None:
        """The sidecar ends the turn (aborted is the user's Stop)."""
        turn = self.m.running
        assert turn is not None
        out = self.keyed("agent", "session.endTurn", {"sessionId": SID, "turnId": turn.id, "status": status,
                                                       "createNotification": False})
        assert out["turn"]["status"] == status
        self.end_running(status, "cancelled")

    @precondition(lambda self: self.m.running is not None)
    @rule()
    def recover_inflight(self) -> None:
        """The sidecar is gone: a UI recovers its turn. It ends aborted (SIDECAR_LOST), what it still asked
        is cancelled, its checkpoint is settled and its queue entry settles as at endTurn."""
        turn = self.m.running
        assert turn is not None
        out = self.keyed("ui", "session.recoverInflight", {"sessionId": SID, "turnId": turn.id})
        assert out["turn"]["status"] == "aborted" and out["turn"].get("errorCode") == "SIDECAR_LOST", out
        self.end_running("aborted", "cancelled")

    @precondition(lambda self: any(t.status != "running" for t in self.m.turns.values()))
    @rule(i=st.integers(0, 20))
    def recover_ended(self, i: int) -> None:
        """Recovering a turn that already ended changes nothing."""
        ended = sorted(t.id for t in self.m.turns.values() if t.status != "running")
        turn = self.m.turns[ended[i % len(ended)]]
        out = self.keyed("ui", "session.recoverInflight", {"sessionId": SID, "turnId": turn.id})
        assert out["turn"]["status"] == turn.status, out

    @precondition(lambda self: any(t.status != "running" for t in self.m.turns.values()))
    @rule(i=st.integers(0, 20), same=st.booleans())
    def end_turn_again(self, i: int, same: bool) -> None:
        """A repeated terminal update: the same status returns the settled turn, another is CONFLICT."""
        ended = sorted(t.id for t in self.m.turns.values() if t.status != "running")
        turn = self.m.turns[ended[i % len(ended)]]
        status = turn.status if same else ("error" if turn.status != "error" else "completed")
        params = {"sessionId": SID, "turnId": turn.id, "status": status, "createNotification": False}
        if same:
            out = self.keyed("agent", "session.endTurn", params)
            assert out["turn"]["status"] == turn.status and "notification" not in out
        else:
            err = self.keyed_error("agent", "session.endTurn", params)
            assert err.data_code == "CONFLICT", err

    @precondition(lambda self: self.last is not None)
    @rule()
    def retry_last(self) -> None:
        """The last keyed write again, same clientId + submissionId: the stored answer, no second effect."""
        last = self.last
        assert last is not None
        try:
            again = self.host.call(last.who, last.method, last.params)
        except RpcError as err:
            raise AssertionError(f"retried {last.method} failed: {err.data_code} {err}") from err
        assert again == last.result, (last.method, last.result, again)
        if last.method == "session.queueAttach" and self.m.held:
            # The controller lives in the answering process's memory: a retried attach after a restart
            # attaches again rather than leave its sidecar told it controls a held queue.
            self.m.held = False
            self.m.reoffer_lease()

    # ------------------------------------------------------------------ restarts
    @rule(hard=st.booleans())
    def restart(self, hard: bool) -> None:
        self.host.restart(hard=hard)
        m = self.m
        m.held = True
        if m.running is not None:
            reply = self.reply_of(m.running)
            if reply is not None and reply.status == "streaming" and reply.checkpoint is not None:
                note("a restart promoted a checkpoint over a reservation")
                reply.texts = {reply.checkpoint}  # recovery promotes the newest checkpoint in that position
            self.end_running("aborted", "interrupted")
        m.reoffer_lease()
        for reply in m.replies.values():
            if reply.status == "streaming":  # its turn ended: boot settles it in place
                reply.status = "completed" if m.turns[reply.turn].status == "completed" else "aborted"
                reply.settled_any = False

    # ------------------------------------------------------------------ invariants
    @invariant()
    def host_agrees_with_the_model(self) -> None:
        m = self.m
        self.adopt_requeued()
        state = self.queue_state()
        want = m.order()
        got = [(e["id"], e["content"], e.get("idempotencyKey"), e["position"], e.get("priority"))
               for e in state["entries"]]
        assert got == [(e.id, e.content, e.key, e.position, e.priority) for e in want], (got, want, m.lease)
        assert state["held"] is m.held

        turns = self.host.call("ui", "session.listTurns", {"sessionId": SID, "limit": 500})["turns"]
        assert {t["id"]: t["status"] for t in turns} == {t.id: t.status for t in m.turns.values()}
        running = [t for t in m.turns.values() if t.status == "running"]
        assert len(running) <= 1

        pending = [*self.host.call("ui", "approvals.pending", {"sessionId": SID})["pending"],
                   *self.host.call("ui", "interactions.pending", {"sessionId": SID})["pending"]]
        assert sorted(p["requestId"] for p in pending) == sorted(
            a.id for a in m.approvals.values() if a.status == "pending")
        for p in pending:
            assert m.turns[p["turnId"]].status == "running", "a pending approval of an ended turn"

        got_session = self.host.call("ui", "session.get", {"sessionId": SID})
        rows = got_session["messages"]
        assert [x["id"] for x in rows] == m.messages, "every acknowledged row once, in its place"
        for x in rows:
            reply = m.replies.get(x["id"])
            if reply is None:
                continue
            status = (x.get("meta") or {}).get("status")
            text = "".join(b.get("text", "") for b in x["blocks"] if b.get("type") == "text")
            allowed = {reply.status}
            if reply.settled_any:
                allowed |= {"completed" if m.turns[reply.turn].status == "completed" else "aborted"}
            assert status in allowed, (x, reply)
            assert text in reply.texts, (x, reply)
            if status == "aborted":
                assert (x.get("meta") or {}).get("interrupted") is True, x
        decisions = got_session.get("decisions", [])
        ids = [d["requestId"] for d in decisions]
        assert len(ids) == len(set(ids)), f"a decision listed twice: {ids}"
        # ``decisions`` covers the window's turns: those with a row in it and, the newest window, those
        # that started after its newest row (they asked before replying).
        shown = {t.id for t in m.turns.values() if t.landed or t.started > m.last_message}
        assert {d["requestId"]: d["status"] for d in decisions} == {
            a.id: a.status for a in m.approvals.values() if a.status != "pending" and a.turn in shown}


def _settings() -> settings:
    # Every step may restart a host process: a soak run reports its failing sequence unshrunk.
    phases = [Phase.explicit, Phase.reuse, Phase.generate] if SOAK else list(Phase)
    return settings(max_examples=60 if SOAK else 12, stateful_step_count=60 if SOAK else 35, deadline=None,
                    derandomize=not SOAK, database=None, phases=phases,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def test_turns_queue_approvals_and_restarts_match_the_model() -> None:
    run_state_machine_as_test(TurnsMachine, settings=_settings())


def run_steps(steps: list[tuple[str, dict[str, Any]]]) -> None:
    """One fixed sequence of the machine's rules, checking the invariant after each."""
    state = TurnsMachine()
    try:
        state.create()
        state.host_agrees_with_the_model()
        for name, kwargs in steps:
            getattr(state, name)(**kwargs)
            state.host_agrees_with_the_model()
    finally:
        state.teardown()


def test_a_promotion_while_a_promoted_entry_is_handed_out_keeps_click_order() -> None:
    """Seed 003 §4.6b: a promotion writes MAX(priority) + 1 inside the session, so promoted entries are
    delivered first in click order. The host took the MAX over the listed entries only: with the first
    promoted entry handed out, a second promotion got the same priority, and when a restart brought the
    first one back (its place kept) the two tied and the later click was delivered first."""
    run_steps([("push", {"key": None, "content": "a"}), ("push", {"key": None, "content": "b"}),
               ("push", {"key": None, "content": "c"}), ("prioritize", {"i": 2}), ("take", {}),
               ("prioritize", {"i": 0}), ("restart", {"hard": True}), ("attach", {}),
               ("start_turn", {"ui": False}), ("end_turn", {"status": "aborted"}), ("attach", {}),
               ("take", {}), ("start_turn", {"ui": False}), ("land_prompt", {}),
               ("end_turn", {"status": "completed"}), ("take", {})])


def test_a_handed_out_prompt_keeps_its_place_in_a_full_queue() -> None:
    """Seed 003 §4.6b: a session holds at most eight entries. An entry handed out (``queueTake``) is no
    longer listed, but until its turn runs it may be listed again: after a restart (offered again) or when
    its turn is aborted before the prompt landed (waiting again). The host let an eighth prompt be queued
    behind it, and the restart then listed nine (``QueueState.entries`` holds at most 8). Once the prompt
    landed, the entry cannot come back and the queue has room again."""
    eight = [("push", {"key": None, "content": "a"})] * 8
    run_steps([*eight, ("take", {}), ("push", {"key": None, "content": "b"}), ("restart", {"hard": True}),
               ("attach", {}), ("take", {}), ("start_turn", {}), ("push", {"key": None, "content": "b"}),
               ("end_turn", {"status": "aborted"}), ("attach", {}), ("take", {}), ("start_turn", {}),
               ("land_prompt", {}), ("push", {"key": None, "content": "b"}), ("restart", {"hard": False})])
