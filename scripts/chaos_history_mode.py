"""``scripts/chaos --mode history``: many methods, many connections, random faults, one history.

::

    scripts/chaos --mode history --cycles 1000 --seed 7

Several workers (``--clients``), each on its own WebSocket connection to a host subprocess
(:mod:`scripts.chaos_host`), run a seeded random mix of routed methods over their own session and
shared state — ``session.appendMessage / rename / update / deleteMessage / restoreMessage / get``,
``session.list``, ``settings.set / get``, ``secrets.set / list / get``, ``session.queuePush /
queueRemove / queueList``, ``approvals.request / respond`` inside a turn, ``collab.deliver /
list``, ``tasks.create / update / get / list``. Every mutating call carries a ``submissionId``;
an indeterminate one is retried with the same id (at once for ``ACTOR_RESTARTED`` / ``BUSY`` /
``TIMEOUT``, after the restart otherwise). A write is followed by a read of what it changed,
awaited one after the other or pipelined (both frames sent before either answer).

Each cycle runs the workload for a short random time while faults land at random: DB-writer
kills and session-actor kills (the host's chaos hook, signalled), and at the end of some cycles
a SIGKILL of the process and a restart. Then, with the workload paused, a *recovery* read takes
everything over a fresh connection plus the transcript files (the store's reader) and the
SQLite index rows (read-only), and the next cycle begins with the retries.

The whole history goes to :mod:`scripts.chaos_history_check`; the LAST line is::

    ops=N lost=L duplicated=D stale_reads=S regressions=R index_mismatch=M db_writer_kills=… actor_kills=… sigkills=…

and the exit status is non-zero on any anomaly (``unexpected`` effects included).
"""

from __future__ import annotations

import base64
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import trio

from runtime.client import ClientClosed, HostClient, RpcError, open_client
from runtime.datadir import DataDir
from scripts.chaos_history import History, Op
from scripts.chaos_history_check import RECOVERY, Findings, check
from scripts.chaos_host import kill_file
from scripts.chaos_workload import DEFINITE_ERRORS, RETRIABLE_ERRORS
from store.errors import StoreError
from store.indexing.database import open_reader
from store.transcripts.transcript import read_transcript
from tests.hostkit import REPO

Write = list[Any]
Normalize = Callable[[Any], dict[str, Any]]
SETTINGS_NS = "chaoshist"
MAX_QUEUE = 5
# Mutating ops re-sent (same params, same submissionId) after an indeterminate outcome.
RETRIED = frozenset({"create", "append", "rename", "update", "delete_msg", "restore_msg", "settings_set",
                     "secrets_set", "secrets_delete", "queue_push", "queue_remove", "task_create", "task_update",
                     "task_delete", "collab_deliver", "approval_request", "approval_respond", "attachment_put",
                     "import", "plan_create", "plan_submit", "plan_respond"})
# The workload's mix: (kind, cards in the deck).
DECK: tuple[tuple[str, int], ...] = (
    ("append", 5), ("rename", 2), ("update", 1), ("tombstone", 2), ("get", 1), ("list", 1), ("setting", 2),
    ("secret", 2), ("queue", 2), ("approval", 2), ("deliver", 1), ("task", 2), ("attachment", 1), ("import", 1),
    ("plan", 1))
MAX_SECRETS = 6  # live secret refs per worker (recovery reads each)
MAX_TASKS = 6  # live tasks per worker
PLUGIN = "chaoshist"
ABSENT_CODES = frozenset({"NOT_FOUND"})


@dataclass
class HistoryConfig:
    cycles: int = 5
    seed: int = 0
    clients: int = 3
    run_time: tuple[float, float] = (0.25, 0.75)
    """Seconds (uniform in this range) a cycle's workload runs at least, its kills landing within them."""
    min_ops: int = 0
    """Operations the clients invoke in each cycle at least: the workload runs past ``run_time`` until they
    did, so a run's size does not shrink with the machine's speed (a loaded machine did half as many)."""
    cycle_cap: float = 120.0
    """Seconds a cycle's workload may take to reach ``min_ops``; past them the run fails (RuntimeError)."""
    sigkill_rate: float = 0.35
    """Share of cycles that end with a SIGKILL of the host (the others heal in place)."""
    db_kill_rate: float = 0.45
    """Chance, per kill slot (two per cycle), of a DB-writer kill."""
    actor_kill_rate: float = 0.45
    """Chance, per kill slot (two per cycle), of a session-actor kill."""
    rotate: int = 25
    """Cycles after which a worker moves on to a fresh session (keeps reads small)."""
    retry_limit: int = 30
    workdir: Path | None = None
    keep: bool = False
    verbose: bool = True


@dataclass
class Faults:
    db_writer_kills: int = 0
    actor_kills: int = 0
    sigkills: int = 0
    refused: int = 0
    """Kills the host answered false (the actor was not running)."""

    def line(self) -> str:
        return f"db_writer_kills={self.db_writer_kills} actor_kills={self.actor_kills} sigkills={self.sigkills}"


class HostGone(Exception):
    """The connection dropped (the host was killed)."""


class Unknown(Exception):
    """The call's outcome is unknown (recorded as ``info``)."""


@dataclass
class Pending:
    f: str
    key: str
    method: str
    params: dict[str, Any]
    writes: list[Write]


@dataclass
class Worker:
    """One client: its own connection per host incarnation, its own session, shared settings."""

    idx: int
    prefix: str
    rng: random.Random
    history: History
    retry_limit: int = 30
    sid: str = ""
    sessions: list[str] = field(default_factory=list)
    conn: str = ""
    plug_conn: str = ""
    incarnation: int = 0
    counters: Counter[str] = field(default_factory=Counter)
    messages: dict[str, list[str]] = field(default_factory=dict)
    """session → message ids whose append was acknowledged (delete / restore targets)."""
    queue: dict[str, str] = field(default_factory=dict)
    """idempotency key → entry id believed present in the current session's queue."""
    tasks: dict[str, str] = field(default_factory=dict)
    """task title → task id (known from an acknowledged create)."""
    secret_refs: list[str] = field(default_factory=list)
    pending: dict[tuple[str, str], Pending] = field(default_factory=dict)
    open_turn: str | None = None
    deck: list[str] = field(default_factory=list)
    imported: list[str] = field(default_factory=list)
    """Sessions made by acknowledged imports (their index is checked at each recovery)."""
    workspace: Path | None = None
    """Where plan sessions keep their project (plans write artifacts there)."""
    plan_sessions: set[str] = field(default_factory=set)
    plug: HostClient | None = None
    """This worker's plugin connection (imports are for plugins), when open."""
    peers: Callable[[], list[str]] = field(default=lambda: [])
    busy: int = 0

    @property
    def name(self) -> str:
        return f"w{self.idx}"

    @property
    def source(self) -> str:
        """The import source of the current session epoch."""
        return f"{self.sid}-imp"

    @property
    def client_id(self) -> str:
        return f"{self.prefix}-{self.name}"

    def next(self, what: str) -> int:
        self.counters[what] += 1
        return self.counters[what]

    # ------------------------------------------------------------------ recording
    def _invoke(self, f: str, key: str, writes: list[Write], reads: list[str], *, pipelined: bool = False) -> Op:
        value: dict[str, Any] = {"conn": self.conn}
        if pipelined:
            value["pipelined"] = True  # sent right behind a write, before its answer
        if writes:
            value["writes"] = writes
        if reads:
            value["reads"] = reads
        return self.history.invoke(self.name, f, key, value)

    def _finish(self, op: Op, outcome: Any, normalize: Normalize | None, pending: Pending | None) -> Any:
        """Record one attempt's outcome; return the result or raise Unknown / RpcError."""
        if isinstance(outcome, RpcError) and normalize is not None and outcome.data_code in ABSENT_CODES:
            self.history.complete(op, "ok", {"obs": normalize(None)})  # the read saw the thing absent
            return None
        if isinstance(outcome, RpcError):
            code = outcome.data_code
            info = {"code": code, "message": outcome.message[:160]}
            if code in DEFINITE_ERRORS:
                self.history.complete(op, "fail", info)
                if pending is not None:
                    self.pending.pop((pending.f, pending.key), None)
                raise outcome
            self.history.complete(op, "info", info)
            if pending is not None and pending.f in RETRIED:
                self.pending[(pending.f, pending.key)] = pending
            raise Unknown(code)
        if isinstance(outcome, BaseException):
            self.history.complete(op, "info", {"error": type(outcome).__name__})
            if pending is not None and pending.f in RETRIED:
                self.pending[(pending.f, pending.key)] = pending
            raise HostGone(str(outcome))
        self.history.complete(op, "ok", {"obs": normalize(outcome)} if normalize else _small(outcome))
        if pending is not None:
            self.pending.pop((pending.f, pending.key), None)
        return outcome

    async def write(self, c: HostClient, f: str, key: str, method: str, params: dict[str, Any],
                    writes: list[Write]) -> Any:
        """One mutating call, retried at once (same submissionId) while the host answers a retriable error."""
        pending = Pending(f, key, method, params, writes)
        for attempt in range(self.retry_limit + 1):
            op = self._invoke(f, key, writes, [])
            outcome = await self._send(c, method, params, op, pending)
            try:
                return self._finish(op, outcome, None, pending)
            except Unknown as exc:
                if str(exc) not in RETRIABLE_ERRORS or attempt == self.retry_limit:
                    raise
                await trio.sleep(0.01)
        raise AssertionError("unreachable")

    async def read(self, c: HostClient, method: str, params: dict[str, Any], normalize: Normalize) -> Any:
        n = self.next("read")
        op = self._invoke(method, f"{self.conn}/r{n}", [], [method])
        outcome = await self._send(c, method, params, op)
        try:
            return self._finish(op, outcome, normalize, None)
        except (Unknown, RpcError):
            return None

    async def write_then_read(self, c: HostClient, f: str, key: str, method: str, params: dict[str, Any],
                              writes: list[Write], read_method: str, read_params: dict[str, Any],
                              normalize: Normalize) -> Any:
        """The write, then a read of what it changed: awaited in turn, or pipelined (frame order)."""
        if self.rng.random() < 0.5:
            result = await self.write(c, f, key, method, params, writes)
            await self.read(c, read_method, read_params, normalize)
            return result
        n = self.next("read")
        pending = Pending(f, key, method, params, writes)
        wop = self._invoke(f, key, writes, [])
        rop = self._invoke(read_method, f"{self.conn}/r{n}", [], [read_method], pipelined=True)
        self.busy += 1
        try:
            outcomes: list[Any] = await c.pipelined([(method, params), (read_method, read_params)])
        except (ClientClosed, OSError) as exc:
            outcomes = [exc, exc]
        except BaseException as exc:
            self.history.complete(wop, "info", {"error": type(exc).__name__})
            self.history.complete(rop, "info", {"error": type(exc).__name__})
            if f in RETRIED:
                self.pending[(f, key)] = pending
            raise
        finally:
            self.busy -= 1
        retry = False
        try:
            result = self._finish(wop, outcomes[0], None, pending)
        except Unknown as exc:
            if str(exc) not in RETRIABLE_ERRORS:
                raise
            retry = True  # the host lives: again at once, same submissionId (after the read is recorded)
        finally:
            try:
                self._finish(rop, outcomes[1], normalize, None)
            except (Unknown, RpcError):
                pass
        if retry:
            result = await self.write(c, f, key, method, params, writes)
        return result

    async def _send(self, c: HostClient, method: str, params: dict[str, Any], op: Op,
                    pending: Pending | None = None) -> Any:
        self.busy += 1
        try:
            return await c.call(method, params)
        except (RpcError, ClientClosed, OSError) as exc:
            return exc
        except BaseException as exc:  # cancelled mid-call: the outcome is unknown
            self.history.complete(op, "info", {"error": type(exc).__name__})
            if pending is not None and pending.f in RETRIED:
                self.pending[(pending.f, pending.key)] = pending
            raise
        finally:
            self.busy -= 1

    # ------------------------------------------------------------------ the loop
    async def run(self, c: HostClient, stop: trio.Event, cycle: int, rotate: int) -> None:
        try:
            for p in sorted(self.pending.values(), key=lambda p: (p.f != "create", p.key)):
                await self.retry(c, p)
            if not self.sid or (cycle % rotate == 0 and not any(p.f == "create" for p in self.pending.values())):
                await self.create(c)
            if not self.sid:
                return
            if self.open_turn:
                await self.end_turn(c, self.open_turn)
            while not stop.is_set():
                try:
                    await self.step(c)
                except (Unknown, RpcError):
                    pass
                await trio.sleep(self.rng.uniform(0.0, 0.02))
        except HostGone:
            return

    async def retry(self, c: HostClient, p: Pending) -> None:
        conn = self.conn
        if p.f == "import":  # imports are for plugin connections
            if self.plug is None:
                return
            c, self.conn = self.plug, self.plug_conn
        try:
            result = await self.write(c, p.f, p.key, p.method, p.params, p.writes)
        except (Unknown, RpcError):
            return
        finally:
            self.conn = conn
        self._acked(p.f, p.key, p.params, result)

    def _acked(self, f: str, key: str, params: dict[str, Any], result: Any) -> None:
        if f == "create":
            self.sid = str(params["sessionId"])
            self.sessions.append(self.sid)
            self.queue.clear()
        elif f == "append":
            self.messages.setdefault(str(params["sessionId"]), []).append(key)
        elif f == "queue_push" and params["sessionId"] == self.sid:
            self.queue[key] = str(result["entry"]["id"])
        elif f == "task_create":
            self.tasks[str(params["title"])] = str(result["id"])
        elif f == "import":
            self.imported.append(str(result["sessionId"]))
        elif f == "plan_create":
            self.plan_sessions.add(str(params["sessionId"]))
            self.sessions.append(str(params["sessionId"]))

    async def create(self, c: HostClient) -> None:
        n = self.next("session")
        sid = f"{self.prefix}-{self.name}-s{n}"
        title = f"{sid} t0"
        params = {"sessionId": sid, "title": title, "submissionId": f"create-{sid}"}
        try:
            result = await self.write(c, "create", sid, "session.create", params, [["set", f"title:{sid}", title]])
        except (Unknown, RpcError):
            return
        self._acked("create", sid, params, result)

    async def step(self, c: HostClient) -> None:
        """The next card of a shuffled deck (every kind comes up within a deck's length)."""
        if not self.deck:
            self.deck = [kind for kind, n in DECK for _ in range(n)]
            self.rng.shuffle(self.deck)
        kind = self.deck.pop()
        sid = self.sid
        if kind == "append":
            await self.append(c, sid)
        elif kind == "rename":
            await self.rename(c, sid)
        elif kind == "update":
            await self.update(c, sid)
        elif kind == "tombstone":
            await self.tombstone(c, sid)
        elif kind == "get":
            await self.read(c, "session.get", {"sessionId": sid, "full": True}, _get_obs(sid))
        elif kind == "list":
            await self.read(c, "session.list", {"limit": 500}, _list_obs(self.prefix))
        elif kind == "setting":
            await self.setting(c)
        elif kind == "secret":
            await self.secret(c)
        elif kind == "queue":
            await self.queue_op(c, sid)
        elif kind == "approval":
            await self.approval(c, sid)
        elif kind == "deliver":
            await self.deliver(c, sid)
        elif kind == "task":
            await self.task(c)
        elif kind == "attachment":
            await self.attachment(c, sid)
        elif kind == "import" and self.plug is not None:
            await self.import_session(self.plug)
        elif kind == "plan":
            await self.plan(c)

    # ------------------------------------------------------------------ sessions
    async def append(self, c: HostClient, sid: str) -> None:
        n = self.next("msg")
        mid = f"{sid}.m{n}"
        params = {"sessionId": sid, "submissionId": f"app-{mid}",
                  "message": {"id": mid, "role": "user", "blocks": [{"type": "text", "text": f"history {mid}"}]}}
        result = await self.write_then_read(c, "append", mid, "session.appendMessage", params,
                                            [["add", f"msgs:{sid}", mid]], "session.get",
                                            {"sessionId": sid, "full": True}, _get_obs(sid))
        self._acked("append", mid, params, result)

    async def rename(self, c: HostClient, sid: str) -> None:
        n = self.next("title")
        title = f"{sid} t{n}"
        reader: tuple[str, dict[str, Any], Normalize] = (
            ("session.list", {"limit": 500}, _list_obs(self.prefix)) if self.rng.random() < 0.5
            else ("session.get", {"sessionId": sid, "messageLimit": 1}, _get_obs(sid, messages=False)))
        await self.write_then_read(c, "rename", f"{sid}#t{n}", "session.rename",
                                   {"sessionId": sid, "title": title, "submissionId": f"ren-{sid}-{n}"},
                                   [["set", f"title:{sid}", title]], *reader)

    async def update(self, c: HostClient, sid: str) -> None:
        n = self.next("model")
        model = f"{sid}-model{n}"
        await self.write_then_read(c, "update", f"{sid}#u{n}", "session.update",
                                   {"sessionId": sid, "modelId": model, "submissionId": f"upd-{sid}-{n}"},
                                   [["set", f"model:{sid}", model]], "session.get",
                                   {"sessionId": sid, "messageLimit": 1}, _get_obs(sid, messages=False))

    async def tombstone(self, c: HostClient, sid: str) -> None:
        known = self.messages.get(sid)
        if not known:
            return await self.append(c, sid)
        mid = self.rng.choice(known[-20:])
        deleted = self.rng.random() < 0.6
        n = self.next("tomb")
        method = "session.deleteMessage" if deleted else "session.restoreMessage"
        f = "delete_msg" if deleted else "restore_msg"
        await self.write_then_read(c, f, f"{mid}#{n}", method,
                                   {"sessionId": sid, "messageId": mid, "submissionId": f"tomb-{mid}-{n}"},
                                   [["set", f"del:{mid}", deleted, False]], "session.get",
                                   {"sessionId": sid, "full": True}, _get_obs(sid))
        return None

    # ------------------------------------------------------------------ settings, secrets
    async def setting(self, c: HostClient) -> None:
        key = self.rng.choice([f"{self.prefix}.{self.name}", f"{self.prefix}.shared"])
        n = self.next("setting")
        value = f"{self.name}-v{n}"
        await self.write_then_read(c, "settings_set", f"{self.name}#s{n}", "settings.set",
                                   {"ns": SETTINGS_NS, "key": key, "value": value,
                                    "submissionId": f"set-{self.name}-{n}"},
                                   [["set", f"setting:{key}", value]], "settings.get",
                                   {"ns": SETTINGS_NS, "key": key}, _setting_obs(key))

    async def secret(self, c: HostClient) -> None:
        n = self.next("secret")
        if len(self.secret_refs) >= MAX_SECRETS and self.rng.random() < 0.4:
            ref = self.secret_refs.pop(self.rng.randrange(len(self.secret_refs)))  # acked or unknown: gone
            await self.write_then_read(c, "secrets_delete", f"{self.name}#k{n}", "secrets.delete",
                                       {"ref": ref, "submissionId": f"sec-{self.name}-{n}"},
                                       [["remove", "secrets", ref], ["set", f"secret:{ref}", None]],
                                       "secrets.list", {}, _secrets_obs(self.prefix))
            return
        if len(self.secret_refs) >= MAX_SECRETS or (self.secret_refs and self.rng.random() < 0.5):
            ref = self.rng.choice(self.secret_refs)
        else:
            ref = f"{self.prefix}/{self.name}/{n}"
            self.secret_refs.append(ref)
        value = f"{self.name}-secret{n}"
        if self.rng.random() < 0.5:
            reader: tuple[str, dict[str, Any], Normalize] = ("secrets.list", {}, _secrets_obs(self.prefix))
        else:
            reader = ("secrets.get", {"ref": ref}, _secret_obs(ref))
        await self.write_then_read(c, "secrets_set", f"{self.name}#k{n}", "secrets.set",
                                   {"ref": ref, "value": value, "submissionId": f"sec-{self.name}-{n}"},
                                   [["add", "secrets", ref], ["set", f"secret:{ref}", value]], *reader)

    # ------------------------------------------------------------------ queue
    async def queue_op(self, c: HostClient, sid: str) -> None:
        believed = len(self.queue) + sum(1 for (f, _) in self.pending if f == "queue_push")
        if self.queue and (believed >= MAX_QUEUE or self.rng.random() < 0.4):
            key = self.rng.choice(sorted(self.queue))
            entry = self.queue.pop(key)  # acked or unknown: never counted present again
            await self.write_then_read(c, "queue_remove", key, "session.queueRemove",
                                       {"sessionId": sid, "entryId": entry, "submissionId": f"qrm-{key}"},
                                       [["remove", f"queue:{sid}", key]], "session.queueList",
                                       {"sessionId": sid}, _queue_obs(sid))
            return
        if believed >= MAX_QUEUE:
            return
        key = f"{sid}.q{self.next('queue')}"
        params = {"sessionId": sid, "principal": self.client_id, "idempotencyKey": key, "content": f"queued {key}",
                  "permissionMode": "ask", "submissionId": f"qpush-{key}"}
        result = await self.write_then_read(c, "queue_push", key, "session.queuePush", params,
                                            [["add", f"queue:{sid}", key]], "session.queueList",
                                            {"sessionId": sid}, _queue_obs(sid))
        self._acked("queue_push", key, params, result)

    # ------------------------------------------------------------------ approvals in a turn
    async def end_turn(self, c: HostClient, tid: str) -> None:
        try:
            await self.write(c, "end_turn", tid, "session.endTurn",
                             {"sessionId": tid.rsplit(".", 1)[0], "turnId": tid, "status": "completed",
                              "createNotification": False, "submissionId": f"end-{tid}"}, [])
        except (Unknown, RpcError):
            pass
        self.open_turn = None

    async def start_turn(self, c: HostClient, sid: str, counter: str) -> str | None:
        """Start a turn in ``sid`` (it becomes the open turn); None when the host refused it."""
        tid = f"{sid}.t{self.next(counter)}"
        try:
            await self.write(c, "start_turn", tid, "session.startTurn",
                             {"sessionId": sid, "turnId": tid, "submissionId": f"start-{tid}"}, [])
        except RpcError:
            return None
        self.open_turn = tid
        return tid

    async def approval(self, c: HostClient, sid: str) -> None:
        tid = await self.start_turn(c, sid, "turn")
        if tid is None:
            return
        call_id = f"{tid}.c"
        try:
            asked = await self.write_then_read(
                c, "approval_request", call_id, "approvals.request",
                {"sessionId": sid, "turnId": tid, "toolCallId": call_id, "tool": "Bash", "argsSummary": "history",
                 "risk": "low", "submissionId": f"apr-{call_id}"},
                [["set", f"asked:{call_id}", True]], "approvals.pending", {"sessionId": sid}, _pending_obs(call_id))
            # the turn's reply (a decision shows in session.get with its turn's messages)
            mid = f"{sid}.m{self.next('msg')}"
            params = {"sessionId": sid, "turnId": tid, "submissionId": f"app-{mid}",
                      "message": {"id": mid, "role": "assistant", "turnId": tid,
                                  "blocks": [{"type": "text", "text": f"reply {mid}"}]}}
            self._acked("append", mid, params, await self.write(c, "append", mid, "session.appendMessage", params,
                                                                [["add", f"msgs:{sid}", mid]]))
            option = self.rng.choice(["allow_once", "deny"])
            status = "allowed" if option == "allow_once" else "denied"
            await self.write_then_read(
                c, "approval_respond", call_id, "approvals.respond",
                {"sessionId": sid, "requestId": asked["request"]["requestId"], "optionId": option,
                 "submissionId": f"ans-{call_id}"},
                [["set", f"answer:{call_id}", status]], "session.get", {"sessionId": sid, "full": True},
                _get_obs(sid))
        except (Unknown, RpcError):
            pass
        await self.end_turn(c, tid)  # a dropped connection skips it: the next cycle ends the turn

    # ------------------------------------------------------------------ collaboration
    async def deliver(self, c: HostClient, sid: str) -> None:
        peers = self.peers()
        if not peers:
            return
        key = f"{sid}.d{self.next('deliver')}"
        target = self.rng.choice(peers)
        await self.write_then_read(
            c, "collab_deliver", key, "collab.deliver",
            {"pluginId": "chaoshist", "sourceSessionId": sid, "targetSessionId": target, "kind": "task",
             "content": f"task {key}", "idempotencyKey": key, "notifyOnCompletion": False,
             "submissionId": f"dlv-{key}"},
            [["add", f"dlv:{sid}", key]], "collab.list",
            {"sessionId": sid, "direction": "outgoing", "limit": 500}, _collab_obs(sid))

    # ------------------------------------------------------------------ tasks
    async def task(self, c: HostClient) -> None:
        n = self.next("task")
        if len(self.tasks) >= MAX_TASKS and self.rng.random() < 0.4:
            title = self.rng.choice(sorted(self.tasks))
            task_id = self.tasks.pop(title)  # acked or unknown: never counted live again
            await self.write_then_read(c, "task_delete", f"{self.name}#p{n}", "tasks.delete",
                                       {"taskId": task_id, "submissionId": f"tdl-{self.name}-{n}"},
                                       [["remove", "tasks", title], ["set", f"task:{title}", None]],
                                       "tasks.list", {}, _tasks_obs(self.prefix))
            return
        if self.tasks and (len(self.tasks) >= MAX_TASKS or self.rng.random() < 0.6):
            title = self.rng.choice(sorted(self.tasks))
            prompt = f"{title} p{n}"
            await self.write_then_read(c, "task_update", f"{self.name}#p{n}", "tasks.update",
                                       {"taskId": self.tasks[title], "prompt": prompt,
                                        "submissionId": f"tup-{self.name}-{n}"},
                                       [["set", f"task:{title}", prompt]], "tasks.get",
                                       {"taskId": self.tasks[title]}, _task_obs(title))
            return
        title = f"{self.prefix}-{self.name}-task{n}"
        prompt = f"{title} p0"
        params = {"title": title, "prompt": prompt, "submissionId": f"tcr-{title}"}
        result = await self.write_then_read(c, "task_create", title, "tasks.create", params,
                                            [["add", "tasks", title], ["set", f"task:{title}", prompt]],
                                            "tasks.list", {}, _tasks_obs(self.prefix))
        self._acked("task_create", title, params, result)

    # ------------------------------------------------------------------ plans
    async def plan(self, c: HostClient) -> None:
        """In a plan-mode session of this epoch: a turn submits a plan; the user rejects it (the session
        stays in plan mode); pending before the answer, not after."""
        if self.workspace is None:
            return
        psid = f"{self.sid}-p"
        root = self.workspace / psid
        if psid not in self.plan_sessions:
            await trio.to_thread.run_sync(lambda: root.mkdir(parents=True, exist_ok=True))
            params = {"sessionId": psid, "title": f"{psid} t0", "mode": "plan", "projectPath": str(root),
                      "submissionId": f"create-{psid}"}
            self._acked("plan_create", psid, params, await self.write(
                c, "plan_create", psid, "session.create", params, [["set", f"title:{psid}", f"{psid} t0"]]))
        tid = await self.start_turn(c, psid, "planturn")
        if tid is None:
            return
        call_id = f"{tid}.c"
        try:
            asked = await self.write_then_read(
                c, "plan_submit", call_id, "plans.submit",
                {"sessionId": psid, "turnId": tid, "toolCallId": call_id, "kind": "plan",
                 "markdown": f"# plan {call_id}\n", "workspaceRoot": str(root), "submissionId": f"pln-{call_id}"},
                [["set", f"planpending:{call_id}", True]], "plans.pending", {"sessionId": psid},
                _plan_obs(call_id))
            await self.write_then_read(
                c, "plan_respond", call_id, "plans.respond",
                {"requestId": asked["requestId"], "action": "reject", "submissionId": f"plr-{call_id}"},
                [["set", f"planpending:{call_id}", None]], "plans.pending", {"sessionId": psid}, _plan_obs(call_id))
        except (Unknown, RpcError):
            pass
        await self.end_turn(c, tid)

    # ------------------------------------------------------------------ attachments, imports
    async def attachment(self, c: HostClient, sid: str) -> None:
        """A blob (content-addressed), then a reference to it from the session: found, or NOT_FOUND."""
        n = self.next("blob")
        data = f"{self.prefix} {self.name} blob {n}".encode()
        sha = hashlib.sha256(data).hexdigest()
        await self.write_then_read(c, "attachment_put", f"{self.name}#b{n}", "attachments.put",
                                   {"name": f"b{n}.txt", "mimeType": "text/plain",
                                    "dataBase64": base64.b64encode(data).decode(),
                                    "submissionId": f"put-{self.name}-{n}"},
                                   [["set", f"blob:{sha}", True]], "attachments.ref",
                                   {"sha256": sha, "sessionId": sid, "submissionId": f"ref-{self.name}-{n}"},
                                   _blob_obs(sha))

    async def import_session(self, plug: HostClient) -> None:
        """A plugin imports a session (its external id is the element); listed by its source."""
        n = self.next("import")
        key = f"{self.prefix}-{self.name}-e{n}"
        messages = [{"id": f"{key}.m{i}", "role": "user", "blocks": [{"type": "text", "text": f"imported {i}"}]}
                    for i in range(1, 3)]
        source = self.source  # one per session epoch: the listing stays small
        params = {"sourceId": source, "externalId": key, "messages": messages, "title": key,
                  "submissionId": f"imp-{key}"}
        conn, self.conn = self.conn, self.plug_conn
        try:
            result = await self.write_then_read(plug, "import", key, "plugins.importSession", params,
                                                [["add", f"imports:{source}", key]], "plugins.listSessions",
                                                {"sourceId": source}, _imports_obs(source))
        finally:
            self.conn = conn
        self._acked("import", key, params, result)

# ---------------------------------------------------------------------------- observations


def _small(result: Any) -> Any:
    if isinstance(result, dict):
        return {k: result[k] for k in ("id", "replayed", "version") if k in result}
    return None


def _get_obs(sid: str, *, messages: bool = True) -> Normalize:
    def norm(result: Any) -> dict[str, Any]:
        session = result.get("session") or {}
        obs: dict[str, Any] = {f"title:{sid}": session.get("title"), f"model:{sid}": session.get("modelId")}
        if messages:
            ours = [m for m in result.get("messages") or () if str(m.get("id", "")).startswith(f"{sid}.m")]
            obs[f"msgs:{sid}"] = [m["id"] for m in ours]
            for m in ours:
                obs[f"del:{m['id']}"] = bool(m.get("deleted"))
        if messages:  # an answered approval shows with its turn's messages (the whole window)
            answers = {str(d.get("toolCallId")): d.get("status") for d in result.get("decisions") or ()
                       if d.get("kind") == "approval"}
            for tid in sorted({str(m["turnId"]) for m in ours if m.get("turnId")}):
                status = answers.get(f"{tid}.c")
                obs[f"answer:{tid}.c"] = status if status in ("allowed", "denied") else None
        return obs
    return norm


def _pending_obs(call_id: str) -> Normalize:
    return lambda result: {f"asked:{call_id}": True if any(
        d.get("toolCallId") == call_id for d in result.get("pending") or ()) else None}


def _list_obs(prefix: str) -> Normalize:
    def norm(result: Any) -> dict[str, Any]:
        return {f"title:{s['id']}": s.get("title") for s in result.get("sessions") or ()
                if str(s.get("id", "")).startswith(f"{prefix}-")}
    return norm


def _setting_obs(key: str) -> Normalize:
    return lambda result: {f"setting:{key}": result.get("value")}


def _secrets_obs(prefix: str) -> Normalize:
    return lambda result: {"secrets": [s["ref"] for s in result.get("secrets") or ()
                                       if str(s.get("ref", "")).startswith(f"{prefix}/")]}


def _secret_obs(ref: str) -> Normalize:
    return lambda result: {f"secret:{ref}": None if result is None else result.get("value")}


def _queue_obs(sid: str) -> Normalize:
    return lambda result: {f"queue:{sid}": [e["idempotencyKey"] for e in result.get("entries") or ()
                                            if str(e.get("idempotencyKey") or "").startswith(f"{sid}.q")]}


def _collab_obs(sid: str) -> Normalize:
    return lambda result: {f"dlv:{sid}": [d["idempotencyKey"] for d in result.get("deliveries") or ()
                                          if str(d.get("idempotencyKey") or "").startswith(f"{sid}.d")]}


def _tasks_obs(prefix: str) -> Normalize:
    return lambda result: {"tasks": [t["title"] for t in result.get("tasks") or ()
                                     if str(t.get("title", "")).startswith(f"{prefix}-")]}


def _task_obs(title: str) -> Normalize:
    return lambda result: {f"task:{title}": None if result is None else result.get("prompt")}


def _plan_obs(call_id: str) -> Normalize:
    return lambda result: {f"planpending:{call_id}": True if any(
        p.get("toolCallId") == call_id for p in result.get("pending") or ()) else None}


def _blob_obs(sha: str) -> Normalize:
    return lambda result: {f"blob:{sha}": None if result is None else True}


def _imports_obs(source: str) -> Normalize:
    return lambda result: {f"imports:{source}": [str((s.get("origin") or {}).get("externalId"))
                                                 for s in result.get("sessions") or ()]}


# ---------------------------------------------------------------------------- the host process


@dataclass
class ForkedHost:
    """A host forked by the zygote (not our child: the zygote's kernel-reaped one)."""

    pid: int
    url: str
    token: str

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def _wait_gone(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() > deadline:
                raise RuntimeError(f"host {self.pid} did not exit within {timeout}s")
            time.sleep(0.005)

    def kill9(self) -> None:
        _signal(self, signal.SIGKILL)
        self._wait_gone(30)

    def terminate(self, timeout: float = 30) -> None:
        _signal(self, signal.SIGTERM)
        self._wait_gone(timeout)


class Zygote:
    """``python -m scripts.chaos_host --zygote``: imports once, forks a host per :meth:`start`."""

    def __init__(self, data_dir: Path, log: Path) -> None:
        self.data_dir = data_dir
        self.log = log
        env = dict(os.environ)
        env.pop("RT_CRASHPOINT", None)
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "scripts.chaos_host", "--data-dir", str(data_dir), "--zygote", str(log)],
                cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)

    def start(self, timeout: float = 60) -> ForkedHost:
        host_json = self.data_dir / "host.json"
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(b"start\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().decode()
        if not line.startswith("pid "):
            raise RuntimeError(f"the zygote answered {line!r}: {self.log.read_text(errors='replace')[-3000:]}")
        pid = int(line.split()[1])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                info = orjson.loads(host_json.read_bytes())
                if info.get("pid") == pid:
                    token = (self.data_dir / "host.token").read_text().strip()
                    return ForkedHost(pid, str(info["url"]), token)
            except (FileNotFoundError, orjson.JSONDecodeError):
                pass
            if not ForkedHost(pid, "", "").alive():
                raise RuntimeError(f"host {pid} exited during boot: {self.log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.01)
        raise RuntimeError("host did not write host.json in time")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _signal(host: ForkedHost, signum: int) -> None:
    try:
        os.kill(host.pid, signum)
    except ProcessLookupError:
        pass  # it died a moment ago (the cycle's SIGKILL)


def index_views(data_dir: Path, sids: Sequence[str]) -> dict[str, dict[str, list[str]]]:
    """Per session: the transcript's message ids (the store's reader) and the index rows (SQLite, read-only)."""
    out: dict[str, dict[str, list[str]]] = {}
    dd = DataDir(data_dir)
    conn = open_reader(dd.db_path) if dd.db_path.exists() else None
    try:
        if conn is not None:
            conn.execute("BEGIN")
        for sid in sids:
            path = dd.sessions_dir / f"{sid}.jsonl"
            try:
                transcript = [m.id for m in read_transcript(path).messages] if path.exists() else []
            except (StoreError, OSError) as exc:
                transcript = [f"<unreadable: {exc}>"]
            view = {"transcript": transcript}
            if conn is not None:
                view["db"] = [str(r[0]) for r in conn.execute(
                    "SELECT id FROM messages WHERE session_id = ? ORDER BY seq", (sid,))]
            out[sid] = view
        if conn is not None:
            conn.execute("COMMIT")
    finally:
        if conn is not None:
            conn.close()
    return out


# ---------------------------------------------------------------------------- the run


class HistoryRun:
    def __init__(self, cfg: HistoryConfig, workdir: Path, out: Callable[[str], None] = print) -> None:
        self.cfg = cfg
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.host_log = workdir / "host.log"
        self.out = out
        self.rng = random.Random(cfg.seed)
        self.history = History()
        self.prefix = f"hm{cfg.seed % 100000}"
        self.faults = Faults()
        self.zygote: Zygote | None = None
        self.kill_times: list[float] = []
        master = random.Random(self.rng.getrandbits(64))
        self.workers = [Worker(i, self.prefix, random.Random(master.getrandbits(64)), self.history,
                               retry_limit=cfg.retry_limit, workspace=workdir / "projects")
                        for i in range(cfg.clients)]
        for w in self.workers:
            w.peers = (lambda me: lambda: [o.sid for o in self.workers if o is not me and o.sid])(w)

    def log(self, text: str) -> None:
        if self.cfg.verbose:
            self.out(text)

    async def start(self) -> ForkedHost:
        assert self.zygote is not None
        zygote = self.zygote
        return await trio.to_thread.run_sync(zygote.start)

    async def drive(self, w: Worker, host: ForkedHost, stop: trio.Event, cycle: int) -> None:
        w.incarnation += 1
        w.conn = f"{w.name}.{w.incarnation}"
        w.plug_conn = f"{w.name}p.{w.incarnation}"
        try:
            async with open_client(host.url, host.token, client_id=w.client_id, client_kind="ui") as c, \
                    open_client(host.url, host.token, client_id=f"{w.client_id}-plugin", client_kind="plugin",
                                plugin_id=PLUGIN) as plug:
                w.plug = plug
                try:
                    await w.run(c, stop, cycle, self.cfg.rotate)
                finally:
                    w.plug = None
        except (ClientClosed, OSError, HostGone) as exc:
            self.log(f"  {w.name}: connection ended ({type(exc).__name__})")
        except BaseExceptionGroup as group:  # trio-websocket wraps a dropped connection
            rest = group.split((ClientClosed, OSError, HostGone))[1]
            if rest is not None:
                raise
            self.log(f"  {w.name}: connection ended")

    async def faulter(self, host: ForkedHost, until: float) -> None:
        """Kill the DB writer and busy sessions' actors at random moments of the cycle."""
        slots = sorted(self.rng.uniform(0.05, max(0.06, until - trio.current_time())) for _ in range(4))
        start = trio.current_time()
        plan = [("db" if i % 2 == 0 else "actor", t) for i, t in enumerate(slots)]
        self.rng.shuffle(plan)
        plan.sort(key=lambda p: p[1])
        for kind, at in plan:
            rate = self.cfg.db_kill_rate if kind == "db" else self.cfg.actor_kill_rate
            if self.rng.random() >= rate:
                continue
            await trio.sleep_until(start + at)
            if not host.alive():
                return
            now = time.monotonic()
            self.kill_times = [t for t in self.kill_times if now - t < 10.0]
            if kind == "db":
                if len(self.kill_times) >= 10:  # stay well under the supervisor's restart intensity
                    continue
                self.kill_times.append(now)
                _signal(host, signal.SIGUSR1)
            else:
                busy = [w.sid for w in self.workers if w.sid and w.busy] or [w.sid for w in self.workers if w.sid]
                if not busy:
                    continue
                targets = sorted(set(self.rng.sample(busy, min(len(busy), self.rng.randint(1, 2)))))
                path = kill_file(self.data_dir)
                path.write_text("\n".join(targets) + "\n", "utf-8")
                _signal(host, signal.SIGUSR2)
            await trio.sleep(0.02)

    async def recovery(self, host: ForkedHost, cycle: int, after: str) -> None:
        """With the workload paused: everything, read over a fresh connection, plus the files and the index."""
        active = sorted({w.sid for w in self.workers if w.sid})
        # every session after a restart (boot reconciles them all); the live ones otherwise
        recent = {s for w in self.workers for s in w.imported[-5:]}
        sids = sorted({s for w in self.workers for s in w.sessions} | recent) if after != "in-place" else sorted(
            set(active) | recent)
        op = self.history.invoke("checker", RECOVERY, f"r{cycle}", {"conn": f"checker.{cycle}", "after": after})
        obs: dict[str, Any] = {}
        gets: dict[str, list[str]] = {}
        try:
            async with open_client(host.url, host.token, client_id=f"{self.prefix}-checker", client_kind="ui") as c:
                for sid in active:
                    got = await c.call("session.get", {"sessionId": sid, "full": True})
                    obs.update(_get_obs(sid)(got))
                    gets[sid] = [str(m["id"]) for m in got.get("messages") or ()]
                    obs.update(_queue_obs(sid)(await c.call("session.queueList", {"sessionId": sid})))
                    obs.update(_collab_obs(sid)(await c.call("collab.list", {"sessionId": sid,
                                                                             "direction": "outgoing",
                                                                             "limit": 500})))
                for sid in sorted((set(sids) if after == "in-place" else recent) - set(active)):
                    # the index of a session read through session.get covers its acknowledged appends
                    got = await c.call("session.get", {"sessionId": sid, "full": True})
                    gets[sid] = [str(m["id"]) for m in got.get("messages") or ()]
                obs.update(_list_obs(self.prefix)(await c.call("session.list", {"limit": 500})))
                keys = sorted({f"{self.prefix}.shared"} | {f"{self.prefix}.{w.name}" for w in self.workers})
                for key in keys:
                    obs.update(_setting_obs(key)(await c.call("settings.get", {"ns": SETTINGS_NS, "key": key})))
                obs.update(_secrets_obs(self.prefix)(await c.call("secrets.list", {})))
                for ref in sorted({r for w in self.workers for r in w.secret_refs}):
                    try:
                        obs.update(_secret_obs(ref)(await c.call("secrets.get", {"ref": ref})))
                    except RpcError as exc:
                        if exc.data_code not in ("NOT_FOUND", "SECRET_NOT_FOUND"):
                            raise
                        obs[f"secret:{ref}"] = None
                obs.update(_tasks_obs(self.prefix)(await c.call("tasks.list", {})))
                async with open_client(host.url, host.token, client_id=f"{self.prefix}-checker-plugin",
                                       client_kind="plugin", plugin_id=PLUGIN) as plug:
                    for source in sorted({w.source for w in self.workers if w.sid}):
                        obs.update(_imports_obs(source)(await plug.call("plugins.listSessions",
                                                                         {"sourceId": source})))
                for w in self.workers:
                    for title, task_id in sorted(w.tasks.items()):
                        try:
                            obs.update(_task_obs(title)(await c.call("tasks.get", {"taskId": task_id})))
                        except RpcError as exc:
                            if exc.data_code not in ABSENT_CODES:
                                raise
                            obs.update(_task_obs(title)(None))
                views = await trio.to_thread.run_sync(index_views, self.data_dir, sids)
        except BaseException as exc:
            self.history.complete(op, "info", {"error": f"{type(exc).__name__}: {exc}"[:300]})
            raise
        for sid, ids in gets.items():
            views.setdefault(sid, {})["get"] = ids
        self.history.complete(op, "ok", {"obs": obs, "index": views})

    async def cycle(self, host: ForkedHost, cycle: int) -> ForkedHost:
        self.history.cycle = cycle
        t0 = time.monotonic()
        duration = self.rng.uniform(*self.cfg.run_time)
        sigkill = self.rng.random() < self.cfg.sigkill_rate
        stop = trio.Event()
        until = trio.current_time() + duration

        first = len(self.history.ops)

        async def stopper(workers: trio.CancelScope) -> None:
            await trio.sleep_until(until)
            await self._reach_min_ops(first, cycle, until - duration + self.cfg.cycle_cap)
            if sigkill:
                await trio.to_thread.run_sync(host.kill9)
                self.faults.sigkills += 1
                workers.cancel()
            else:
                stop.set()  # each worker finishes its step; a step still stuck after the grace is cancelled
                await trio.sleep(20)
                workers.cancel()

        async with trio.open_nursery() as outer:
            outer.start_soon(self.faulter, host, until)
            async with trio.open_nursery() as workers:
                for w in self.workers:
                    workers.start_soon(self.drive, w, host, stop, cycle)
                outer.start_soon(stopper, workers.cancel_scope)
            outer.cancel_scope.cancel()
        self._count_kills()
        t_work = time.monotonic()
        if sigkill:
            host = await self.start()
        elif not host.alive():
            raise RuntimeError(f"the host died by itself in cycle {cycle} "
                               f"see {self.host_log}")
        t_boot = time.monotonic()
        await self.recovery(host, cycle, "sigkill" if sigkill else "in-place")
        self.log(f"cycle {cycle}: {duration:.2f}s {'sigkill' if sigkill else 'healed in place'} "
                 f"(wall {t_work - t0:.1f}s + boot {t_boot - t_work:.1f}s + check {time.monotonic() - t_boot:.1f}s) "
                 f"ops={len(self.history.ops)} {self.faults.line()}")
        return host

    async def _reach_min_ops(self, first: int, cycle: int, deadline: float) -> None:
        """Wait until the clients invoked ``min_ops`` operations since ``first`` (the history's length when
        the cycle began); past ``deadline`` (trio time) the run fails loudly: the workload is stuck."""
        seen, done = first, 0
        while True:
            ops = self.history.ops
            done += sum(1 for op in ops[seen:] if op.type == "invoke" and op.f != RECOVERY)
            seen = len(ops)
            if done >= self.cfg.min_ops:
                return
            if trio.current_time() >= deadline:
                raise RuntimeError(f"cycle {cycle}: the clients invoked {done} operations in "
                                   f"{self.cfg.cycle_cap:g}s, fewer than min_ops={self.cfg.min_ops}; "
                                   f"see {self.host_log}")
            await trio.sleep(0.01)  # a poll of the history, not a pause of the workload

    def _count_kills(self) -> None:
        try:
            lines = self.host_log.read_text("utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return
        landed = Counter(line.split()[1].split(":")[0] for line in lines
                         if line.startswith("killed ") and line.endswith(" true"))
        self.faults.db_writer_kills = landed["db-writer"]
        self.faults.actor_kills = landed["session"]
        self.faults.refused = sum(1 for line in lines if line.startswith("killed ") and line.endswith(" false"))

    async def run(self) -> tuple[Findings, Faults]:
        t0 = time.monotonic()
        self.out(f"chaos mode=history seed={self.cfg.seed} cycles={self.cfg.cycles} clients={self.cfg.clients} "
                 f"dir={self.workdir}")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.zygote = Zygote(self.data_dir, self.host_log)
        try:
            await self._run()
        finally:
            zygote, self.zygote = self.zygote, None
            await trio.to_thread.run_sync(zygote.close)
        findings = await trio.to_thread.run_sync(check, self.history.ops)
        acked = Counter(op.f for op in self.history.ops if op.type == "ok")
        self.out(f"seed={self.cfg.seed} mode=history wall={time.monotonic() - t0:.1f}s "
                 f"unexpected={len(findings.unexpected)} refusedKills={self.faults.refused} "
                 f"infoOps={sum(1 for op in self.history.ops if op.type == 'info')} "
                 f"failOps={sum(1 for op in self.history.ops if op.type == 'fail')}")
        self.out("acknowledged: " + " ".join(f"{f}={n}" for f, n in sorted(acked.items())))
        for label, items in (("stale_reads", findings.stale_reads), ("regressions", findings.regressions),
                             ("lost", findings.lost)):
            if items:
                self.out(f"{label} by register kind and read: " + " ".join(
                    f"{k}={n}" for k, n in sorted(_breakdown(items).items())))
        for line in findings.details():
            self.out(line)
        return findings, self.faults

    async def _run(self) -> None:
        host = await self.start()
        try:
            for cycle in range(1, self.cfg.cycles + 1):
                host = await self.cycle(host, cycle)
            self.log("final: clean shutdown, restart, recovery read")
            await trio.to_thread.run_sync(host.terminate)
            host = await self.start()
            await self.recovery(host, self.cfg.cycles + 1, "clean-restart")
        finally:
            await trio.to_thread.run_sync(host.kill9)
            self.history.dump(self.workdir / "history.jsonl")


def _breakdown(items: Sequence[str]) -> Counter[str]:
    """``kind/method[/pipelined]`` counts of findings (``setting/settings.get/pipelined=12``)."""
    out: Counter[str] = Counter()
    for text in items:
        kind = text.split(":", 1)[0].split("#", 1)[0]
        words = text.split(": ", 1)[1].split() if ": " in text else []
        method = words[0] if words else "?"
        out[f"{kind}/{method}" + ("/pipelined" if "(pipelined)" in text else "")] += 1
    return out


def run_history(cfg: HistoryConfig, out: Callable[[str], None] = print) -> tuple[Findings, Faults]:
    """Run one history-mode configuration (blocking; its own trio loop). The last line printed is the figure line."""
    made = cfg.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="chaos-history-")) if made else Path(cfg.workdir)  # type: ignore[arg-type]
    workdir.mkdir(parents=True, exist_ok=True)
    findings, faults = trio.run(HistoryRun(cfg, workdir, out).run)
    if findings.anomalies == 0 and made and not cfg.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    elif findings.anomalies:
        out(f"work directory kept for inspection: {workdir} (history.jsonl, host.log); seed={cfg.seed}")
    out(f"{findings.line()} {faults.line()}")
    return findings, faults


__all__ = ["Faults", "HistoryConfig", "HistoryRun", "Worker", "index_views", "run_history", "ForkedHost", "Zygote"]
