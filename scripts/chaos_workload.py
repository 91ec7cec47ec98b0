"""The chaos workload: one worker per session, each over its own WebSocket client.

A worker loops over a seeded mix of operations on its session — user appends
(with ``submissionId``), turns (``startTurn`` → in-flight checkpoints every
few hundred ms → final assistant append → ``endTurn`` with a notification),
queue pushes with idempotency keys and removals, renames, ``settings.set``, and
*lifecycles* of scratch sessions through the file-first methods (``session.create``
without an id → two appends → maybe ``truncateFrom`` → maybe ``fork`` → maybe
``delete``, every step with a ``submissionId``) — and records every call in
the shared :class:`History` as invoke → ok / fail / info. Worker state
(counters, pending retries) survives host restarts; the connection does not:
:meth:`Worker.run` returns when the host goes away.

After a restart :meth:`Worker.retry_pending` re-sends every indeterminate
append, queue push and lifecycle step with the *same* ``clientId`` + ``submissionId`` and
params (the retry must yield exactly one effect), and :meth:`Worker.replay_receipts`
re-sends a sample of acknowledged requests, whose stored response must come
back unchanged (receipts are DB-only state).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from runtime.client import ClientClosed, HostClient, RpcError
from scripts.chaos_history import History, Op

# Error codes that say "the effect did not happen" (no retry can change that).
DEFINITE_ERRORS: frozenset[str] = frozenset({
    "INVALID_PARAMS", "INVALID_ID", "CONFLICT", "IDEMPOTENCY_CONFLICT", "LIMIT_EXCEEDED", "NOT_FOUND",
    "SESSION_NOT_FOUND", "MESSAGE_NOT_FOUND", "PERMISSION_DENIED", "PAYLOAD_TOO_LARGE",
})
# Indeterminate errors a client retries with the same submissionId while the host lives.
RETRIABLE_ERRORS: frozenset[str] = frozenset({"ACTOR_RESTARTED", "BUSY", "TIMEOUT"})
# Operations retried with their submissionId after a restart (their outcome was unknown).
RETRIED_KINDS: frozenset[str] = frozenset({
    "append", "queue_push", "lc_create", "lc_append", "lc_truncate", "lc_fork", "lc_delete", "collab_deliver"})
COLLAB_PLUGIN = "chaos"
MAX_QUEUE = 6  # stay under the host's 8-entry cap even with indeterminate pushes
SETTINGS_NS = "chaos"


class HostGone(Exception):
    """The connection dropped (the host was killed): the worker stops."""


class Indeterminate(Exception):
    """The call's outcome is unknown (recorded as ``info``)."""


@dataclass
class WorkloadConfig:
    sessions: int = 4
    checkpoint_interval: tuple[float, float] = (0.1, 0.3)
    checkpoints_per_turn: tuple[int, int] = (2, 5)
    op_pause: tuple[float, float] = (0.0, 0.03)
    retry_retriable: bool = False
    """Actor mode: retry ACTOR_RESTARTED/BUSY/TIMEOUT with the same submissionId."""
    max_retries: int = 50
    retry_pause: float = 0.02


@dataclass
class Pending:
    f: str
    key: str
    value: dict[str, Any]
    method: str
    params: dict[str, Any]


@dataclass
class Worker:
    name: str
    sid: str
    rng: random.Random
    history: History
    config: WorkloadConfig
    client_id: str = ""
    peers: list[str] = field(default_factory=list)
    """The other workers' sessions (collaboration targets)."""
    counters: dict[str, int] = field(default_factory=dict)
    queue: dict[str, str] = field(default_factory=dict)
    """idempotency key → entry id of pushes believed present."""
    pending: dict[tuple[str, str], Pending] = field(default_factory=dict)
    """Indeterminate appends / queue pushes to retry after a restart."""
    acked: list[Pending] = field(default_factory=list)
    """A sample of acknowledged receipts (bounded) for replay checks."""
    lives: dict[str, str] = field(default_factory=dict)
    """lifecycle key → the session its ``session.create`` made."""
    failures: dict[str, int] = field(default_factory=dict)
    replays_unanswered: int = 0
    """Receipt replays the host did not answer because it was stopping (:func:`host_stopping`): not checked."""
    in_flight: int = 0
    """Calls sent and not yet answered (the actor-mode killer aims at these)."""

    def __post_init__(self) -> None:
        self.client_id = self.client_id or f"chaos-{self.name}"

    # ------------------------------------------------------------------ plumbing
    def _next(self, what: str) -> int:
        n = self.counters.get(what, 0) + 1
        self.counters[what] = n
        return n

    def token(self, what: str, n: int) -> str:
        digest = hashlib.sha256(f"{self.sid}/{what}/{n}".encode()).hexdigest()
        return "zq" + digest[:12]

    async def call(self, client: HostClient, f: str, key: str, value: dict[str, Any], method: str,
                   params: dict[str, Any]) -> Any:
        """One logical operation (retried on retriable errors in actor mode). Returns the result;
        raises :class:`Indeterminate`, :class:`HostGone` or the definite :class:`RpcError`."""
        retries = 0
        while True:
            op: Op = self.history.invoke(self.name, f, key, value)
            self.in_flight += 1
            try:
                result = await client.call(method, params)
            except RpcError as exc:
                code = exc.data_code
                if code in DEFINITE_ERRORS:
                    self.history.complete(op, "fail", {"code": code, "message": exc.message[:200]})
                    self.failures[code] = self.failures.get(code, 0) + 1
                    raise
                self.history.complete(op, "info", {"code": code, "message": exc.message[:200]})
                if self.config.retry_retriable and code in RETRIABLE_ERRORS and retries < self.config.max_retries:
                    retries += 1
                    await trio.sleep(self.config.retry_pause)
                    continue
                self._remember(f, key, value, method, params)
                raise Indeterminate(code) from None
            except (ClientClosed, OSError) as exc:
                self.history.complete(op, "info", {"error": type(exc).__name__})
                self._remember(f, key, value, method, params)
                raise HostGone(str(exc)) from None
            except BaseException as exc:  # cancelled mid-call: outcome unknown, then re-raise
                self.history.complete(op, "info", {"error": type(exc).__name__})
                self._remember(f, key, value, method, params)
                raise
            finally:
                self.in_flight -= 1
            self.history.complete(op, "ok", result)
            self.pending.pop((f, key), None)
            if "submissionId" in params and len(self.acked) < 64:
                self.acked.append(Pending(f, key, value, method, params))
            elif "submissionId" in params and self.rng.random() < 0.1:
                self.acked[self.rng.randrange(len(self.acked))] = Pending(f, key, value, method, params)
            return result

    def _remember(self, f: str, key: str, value: dict[str, Any], method: str, params: dict[str, Any]) -> None:
        if f in RETRIED_KINDS:
            self.pending[(f, key)] = Pending(f, key, value, method, params)

    # ------------------------------------------------------------------ setup
    async def create(self, client: HostClient) -> None:
        title = f"chaos {self.sid}"
        params = {"sessionId": self.sid, "title": title, "submissionId": f"create-{self.sid}"}
        try:
            await self.call(client, "create", self.sid, {"sid": self.sid, "title": title}, "session.create", params)
        except RpcError as exc:
            if exc.data_code != "CONFLICT":
                raise

    # ------------------------------------------------------------------ the loop
    async def run(self, client: HostClient, stop: trio.Event) -> None:
        """Operate until ``stop`` is set or the host goes away."""
        try:
            while not stop.is_set():
                await self.step(client, stop)
                lo, hi = self.config.op_pause
                await trio.sleep(self.rng.uniform(lo, hi))
        except HostGone:
            return

    async def step(self, client: HostClient, stop: trio.Event) -> None:
        """One seeded operation: appends, turns (checkpoints, a permission prompt and its answer),
        queue pushes/removals, settings, renames, lifecycles, collaboration deliveries and their work."""
        r = self.rng.random()
        try:
            if r < 0.42:
                await self.append_user(client)
            elif r < 0.60:
                await self.turn(client, stop)
            elif r < 0.75:
                await self.queue_op(client)
            elif r < 0.84:
                await self.set_setting(client)
            elif r < 0.88:
                await self.rename(client)
            elif r < 0.93:
                await self.lifecycle(client)
            elif r < 0.97:
                await self.collab_send(client)
            else:
                await self.collab_work(client)
        except (Indeterminate, RpcError):
            pass

    async def append_user(self, client: HostClient) -> None:
        n = self._next("user")
        mid = f"{self.sid}.u{n}"
        text = f"user {self.token('u', n)} says {n}"
        params = {"sessionId": self.sid, "submissionId": f"app-{mid}",
                  "message": {"id": mid, "role": "user", "blocks": [{"type": "text", "text": text}]}}
        await self.call(client, "append", mid, {"sid": self.sid, "role": "user", "text": text},
                        "session.appendMessage", params)

    async def turn(self, client: HostClient, stop: trio.Event) -> None:
        n = self._next("turn")
        tid = f"{self.sid}.t{n}"
        mid = f"{self.sid}.a{n}"
        await self.call(client, "start_turn", tid, {"sid": self.sid}, "session.startTurn",
                        {"sessionId": self.sid, "turnId": tid, "submissionId": f"start-{tid}",
                         "providerId": "chaos", "modelId": "chaos-1"})
        words = [f"reply {self.token('a', n)}"]
        lo, hi = self.config.checkpoints_per_turn
        for k in range(self.rng.randint(lo, hi)):
            words.append(f"w{k}")
            text = " ".join(words)
            params = {"sessionId": self.sid, "turnId": tid, "submissionId": f"cp-{mid}-{k}",
                      "message": {"id": mid, "role": "assistant", "turnId": tid,
                                  "blocks": [{"type": "text", "text": text}]}}
            await self.call(client, "checkpoint", f"{mid}#{k}",
                            {"sid": self.sid, "mid": mid, "turnId": tid, "text": text, "n": k},
                            "session.saveInflightMessage", params)
            a, b = self.config.checkpoint_interval
            await trio.sleep(self.rng.uniform(a, b))
        if self.rng.random() < 0.5:
            await self.permission(client, tid)
        final = " ".join(words + ["done"])
        status = "completed" if self.rng.random() < 0.85 else self.rng.choice(["error", "aborted"])
        params = {"sessionId": self.sid, "turnId": tid, "submissionId": f"app-{mid}",
                  "message": {"id": mid, "role": "assistant", "turnId": tid,
                              "blocks": [{"type": "text", "text": final}]}}
        await self.call(client, "append", mid, {"sid": self.sid, "role": "assistant", "text": final, "turnId": tid},
                        "session.appendMessage", params)
        end: dict[str, Any] = {"sessionId": self.sid, "turnId": tid, "status": status,
                               "submissionId": f"end-{tid}", "createNotification": True,
                               "usage": {"inputTokens": n, "outputTokens": 2 * n}}
        if status == "error":
            end["errorCode"] = "CHAOS"
        await self.call(client, "end_turn", tid, {"sid": self.sid, "status": status, "notify": True},
                        "session.endTurn", end)

    async def permission(self, client: HostClient, tid: str) -> None:
        """The turn asks for a tool permission; the worker (as the UI) answers it once."""
        call_id = f"{tid}.c"
        asked = await self.call(client, "approval_request", call_id, {"sid": self.sid, "turnId": tid},
                                "approvals.request",
                                {"sessionId": self.sid, "turnId": tid, "toolCallId": call_id, "tool": "Bash",
                                 "argsSummary": "chaos", "risk": "low", "submissionId": f"apr-{call_id}"})
        option = self.rng.choice(["allow_once", "deny"])
        rid = asked["request"]["requestId"]
        await self.call(client, "approval_respond", call_id, {"sid": self.sid, "option": option, "requestId": rid},
                        "approvals.respond", {"sessionId": self.sid, "requestId": rid, "optionId": option,
                                              "submissionId": f"ans-{call_id}"})

    async def collab_send(self, client: HostClient) -> None:
        """A delivery from this session to a peer's (an idempotency key, a submissionId, maybe a callback)."""
        if not self.peers:
            return
        n = self._next("deliver")
        key = f"{self.sid}.d{n}"
        target = self.rng.choice(self.peers)
        notify = self.rng.random() < 0.7
        params = {"pluginId": COLLAB_PLUGIN, "sourceSessionId": self.sid, "targetSessionId": target, "kind": "task",
                  "content": f"task {n} from {self.sid}", "idempotencyKey": key, "notifyOnCompletion": notify,
                  "submissionId": f"dlv-{key}"}
        await self.call(client, "collab_deliver", key, {"src": self.sid, "tgt": target, "notify": notify},
                        "collab.deliver", params)

    async def collab_work(self, client: HostClient) -> None:
        """This session's controller runs the oldest delivery waiting for it: turn → begin → settle → end."""
        try:
            waiting = await client.call("collab.list", {"sessionId": self.sid, "direction": "incoming",
                                                        "status": "queued", "limit": 20})
        except RpcError:
            return
        if not waiting["deliveries"]:
            return
        d = waiting["deliveries"][-1]
        did = d["id"]
        n = self._next("work")
        tid = f"{self.sid}.w{n}"
        await self.call(client, "start_turn", tid, {"sid": self.sid}, "session.startTurn",
                        {"sessionId": self.sid, "turnId": tid, "submissionId": f"start-{tid}"})
        # keyed per attempt: a begin the host lost (killed) is begun again by a later turn
        await self.call(client, "collab_begin", f"{did}@{tid}", {"sid": self.sid, "did": did, "turnId": tid},
                        "collab.begin", {"sessionId": self.sid, "deliveryId": did, "turnId": tid,
                                         "submissionId": f"beg-{did}@{tid}"})
        await self.call(client, "collab_settle", f"{did}@{tid}",
                        {"sid": self.sid, "did": did, "turnId": tid, "kind": d["kind"],
                         "notify": d["notifyOnCompletion"], "src": d["source"]["sessionId"]},
                        "collab.settle", {"sessionId": self.sid, "deliveryId": did, "turnId": tid,
                                          "status": "completed", "result": f"done {did}",
                                          "submissionId": f"stl-{did}@{tid}"})
        await self.call(client, "end_turn", tid, {"sid": self.sid, "status": "completed", "notify": False},
                        "session.endTurn", {"sessionId": self.sid, "turnId": tid, "status": "completed",
                                            "createNotification": False, "submissionId": f"end-{tid}"})

    async def queue_op(self, client: HostClient) -> None:
        believed = len(self.queue) + sum(1 for (f, _) in self.pending if f == "queue_push")
        if self.queue and (believed >= MAX_QUEUE or self.rng.random() < 0.35):
            key = self.rng.choice(sorted(self.queue))
            entry_id = self.queue[key]
            try:
                await self.call(client, "queue_remove", key, {"sid": self.sid, "entryId": entry_id},
                                "session.queueRemove",
                                {"sessionId": self.sid, "entryId": entry_id, "submissionId": f"qrm-{key}"})
            finally:
                self.queue.pop(key, None)  # acked, or unknown: never counted as present again
            return
        if believed >= MAX_QUEUE:
            return
        n = self._next("queue")
        key = f"{self.sid}.q{n}"
        content = f"queued {self.token('q', n)}"
        params = {"sessionId": self.sid, "principal": self.client_id, "idempotencyKey": key, "content": content,
                  "permissionMode": "ask", "submissionId": f"qpush-{key}"}
        result = await self.call(client, "queue_push", key, {"sid": self.sid, "content": content},
                                 "session.queuePush", params)
        self.queue[key] = result["entry"]["id"]

    async def set_setting(self, client: HostClient) -> None:
        n = self._next("setting")
        setting = f"{self.sid}.k"
        value = {"n": n, "token": self.token("s", n)}
        await self.call(client, "settings_set", f"{setting}#{n}", {"setting": setting, "value": value},
                        "settings.set", {"ns": SETTINGS_NS, "key": setting, "value": value,
                                         "submissionId": f"set-{setting}-{n}"})

    async def rename(self, client: HostClient) -> None:
        n = self._next("rename")
        title = f"chaos {self.sid} #{n}"
        params = {"sessionId": self.sid, "title": title, "submissionId": f"ren-{self.sid}-{n}"}
        await self.call(client, "rename", f"{self.sid}#{n}", {"sid": self.sid, "title": title},
                        "session.rename", params)

    async def lifecycle(self, client: HostClient) -> None:
        """A scratch session through the file-first methods; a step runs only after the one before
        was acknowledged (an interrupted step is retried with its key after the restart)."""
        n = self._next("life")
        key = f"{self.sid}.l{n}"
        created = await self.call(client, "lc_create", key, {"title": key}, "session.create",
                                  {"title": key, "submissionId": f"lcc-{key}"})
        sid = created["id"]
        self.lives[key] = sid
        for i in (1, 2):
            mid = f"{sid}.m{i}"
            await self.call(client, "lc_append", f"{key}/m{i}", {"life": key, "sid": sid, "mid": mid},
                            "session.appendMessage",
                            {"sessionId": sid, "submissionId": f"lca-{key}-{i}",
                             "message": {"id": mid, "role": "user", "blocks": [{"type": "text", "text": f"l{i}"}]}})
        if self.rng.random() < 0.5:
            await self.call(client, "lc_truncate", key, {"life": key, "sid": sid}, "session.truncateFrom",
                            {"sessionId": sid, "messageId": f"{sid}.m2", "submissionId": f"lct-{key}"})
        if self.rng.random() < 0.4:
            title = f"{key} fork"
            await self.call(client, "lc_fork", key, {"life": key, "title": title}, "session.fork",
                            {"sessionId": sid, "title": title, "submissionId": f"lcf-{key}"})
        if self.rng.random() < 0.6:
            await self.call(client, "lc_delete", key, {"life": key, "sid": sid}, "session.delete",
                            {"sessionId": sid, "submissionId": f"lcd-{key}"})

    # ------------------------------------------------------------------ after a restart
    async def retry_pending(self, client: HostClient) -> int:
        """Re-send every indeterminate append / queue push (same submissionId and params)."""
        done = 0
        for (f, key), p in sorted(self.pending.items()):
            try:
                result = await self.call(client, f, key, p.value, p.method, p.params)
            except (Indeterminate, RpcError):
                continue
            done += 1
            if f == "queue_push":
                self.queue[key] = result["entry"]["id"]
        return done

    async def replay_receipts(self, client: HostClient, limit: int,
                              accept: Callable[[Pending, Any, Any], bool] | None = None) -> list[str]:
        """Re-send acknowledged requests; each must return its stored response unchanged (``accept``:
        what the caller knows to answer otherwise, given the request, its first answer and the replay's
        answer or :class:`RpcError`)."""
        mismatches: list[str] = []
        sample = self.rng.sample(self.acked, min(limit, len(self.acked)))
        ok = {(op.f, op.key): op.result for op in self.history.ops if op.type == "ok" and op.process == self.name}
        for p in sample:
            want = ok.get((p.f, p.key))
            try:
                got = await client.call(p.method, p.params)
            except RpcError as exc:
                if host_stopping(exc):  # documented: reconnect and retry; nothing said about the receipt
                    self.replays_unanswered += 1
                    continue
                if accept is None or not accept(p, want, exc):
                    mismatches.append(f"{p.method} {p.key}: retry failed with {exc.data_code}")
                continue
            if not _same_response(p.method, want, got) and (accept is None or not accept(p, want, got)):
                mismatches.append(f"{p.method} {p.key}: stored response changed: {_diff(want, got)}")
        return mismatches


def host_stopping(exc: RpcError) -> bool:
    """An answer that says the host is stopping, not what the request did: ``SHUTTING_DOWN``, or
    ``CORRUPT_DATA`` with ``reason: index_corrupt`` (the host starts again on a rebuilt index; protocol
    README: reconnect and retry with the same ``submissionId``)."""
    return exc.data_code == "SHUTTING_DOWN" or (exc.data_code == "CORRUPT_DATA"
                                                 and exc.data.get("reason") == "index_corrupt")


def _same_response(method: str, want: Any, got: Any) -> bool:
    if method == "session.appendMessage":
        # the first acknowledgement and its receipt name the same row
        w, g = (want or {}).get("message") or {}, (got or {}).get("message") or {}
        return (w.get("id"), w.get("seq")) == (g.get("id"), g.get("seq"))
    return bool(want == got)


def _diff(want: Any, got: Any) -> str:
    """The fields two answers differ in (both objects), else both answers (shortened)."""
    if isinstance(want, dict) and isinstance(got, dict):
        keys = sorted(k for k in want.keys() | got.keys() if want.get(k, ABSENT_KEY) != got.get(k, ABSENT_KEY))
        return ", ".join(f"{k}: {want.get(k, ABSENT_KEY)!r:.80} -> {got.get(k, ABSENT_KEY)!r:.80}" for k in keys)
    return f"{want!r:.200} -> {got!r:.200}"


ABSENT_KEY = "<absent>"


def make_workers(history: History, config: WorkloadConfig, seed: int, prefix: str) -> list[Worker]:
    master = random.Random(seed)
    workers = [Worker(f"w{i}", f"{prefix}{i}", random.Random(master.getrandbits(64)), history, config)
               for i in range(config.sessions)]
    for w in workers:
        w.peers = [o.sid for o in workers if o is not w]
    return workers


__all__ = ["DEFINITE_ERRORS", "HostGone", "Indeterminate", "Pending", "RETRIABLE_ERRORS", "Worker",
           "WorkloadConfig", "make_workers"]
