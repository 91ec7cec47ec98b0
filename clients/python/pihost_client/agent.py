"""The reference agent sidecar: ``pi-host agent`` (or ``pihost-agent``).

It connects as ``clientKind: "agent"``, becomes the queue controller of the
sessions that get queued turns, and runs each turn the queue hands it:

1. ``session.queueTake`` → ``session.startTurn`` (with a run environment
   snapshot: model, tool schemas; credential *references* only);
2. the user's prompt is appended (message id derived from the queue entry,
   so a retry never duplicates it); an entry that admits a collaboration
   delivery (``sessionMessageId``) is begun instead (``collab.begin``: the
   host writes its input row with its ``sessionMessage`` provenance and binds
   the delivery to the turn, whose end settles it);
3. the model's reply streams into ``session.saveInflightMessage`` checkpoints
   (every ``--checkpoint-every`` seconds; UIs see ``session.inflight``);
4. tool calls (``read_file``, ``list_dir`` under the session's project root)
   are run and recorded as ``tool_call`` blocks with their results. Before a
   tool runs, the sidecar asks for permission through the host
   (``approvals.request``) and waits for ``approval.resolved``: a UI answers
   (``pi-host chat``: ``/allow``, ``/always``, ``/deny``), or a permission
   rule the user stored ("always allow in this project") answers at once. A
   denied call is recorded with ``status: "denied"`` and the model is told.
   Whether to ask follows the turn's permission mode (the queue entry's, else
   the session's; ``auto`` and ``accept-edits`` let these read-only tools
   run without asking; ``ask`` and ``inherit`` ask). ``--approve auto`` never
   asks: for unattended demos and tests;
5. the final assistant message is appended and ``session.endTurn`` records
   the usage.

The model: ``--model fake`` (the default) streams canned replies; otherwise
each turn runs against the session's provider from the host's provider store
(endpoint from ``providers.get``, key from ``secrets.get``; see
:mod:`.agent_providers`), or a fixed ``--base-url`` endpoint.

When the host restarts mid-turn, the client reconnects; the host has fenced
the turn and promoted its checkpoint, so the next checkpoint or append is
refused (``CONFLICT``) and the sidecar drops that turn and goes on with the
queue. Every mutating call carries a submission id, so a call retried after
a lost connection takes effect once.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.abc
import anyio.to_thread

from ._generated import RunEnvironmentSnapshot, Usage
from .agent_model import FakeModel, Finished, Model, ModelError, OpenAIModel, TextDelta, ToolRequest, Turn
from .agent_providers import ProviderStore, Resolved
from .agent_tools import TOOL_SCHEMAS, ToolError, check_tool, run_tool
from .client import Client, ConnectionLost, Event, Resync, RpcError, connect
from .hostinfo import default_data_dir

__all__ = ["Sidecar", "main"]

log = logging.getLogger("pihost_agent")
MAX_TOOL_ROUNDS = 4
SCAN_SESSIONS = 200
TURN_PREFIX = "t_"
"""This sidecar names the turn of queue entry ``<id>`` ``t_<id>`` (its prompt ``u_<id>``)."""
QUEUE_ENTRY_PREFIX = "q_"


def _utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


@dataclass
class Sidecar:
    client: Client
    model: Model | None
    """A fixed model (``--model fake``, or ``--base-url``); None: each turn's comes from ``providers``."""
    controller_id: str
    checkpoint_every: float = 0.25
    sessions: set[str] = field(default_factory=set)
    """Sessions this sidecar controls (re-attached after every reconnect)."""
    busy: set[str] = field(default_factory=set)
    running: set[str] = field(default_factory=set)
    """Turns this process is running now."""
    again: set[str] = field(default_factory=set)
    """Sessions woken while their drain task was running: it looks once more before it ends."""
    turns_done: int = 0
    providers: ProviderStore | None = None
    approve: str = "ask"
    """``ask``: follow the turn's permission mode (ask through the host unless it is auto/accept-edits);
    ``auto``: run the read-only tools without asking (unattended demos and tests)."""
    protected: tuple[str, ...] = ()
    """Directories the file tools refuse wherever the project root is (the host's data directory; any
    pi-host data directory is refused anyway, by its marker files)."""

    # -- queue control -----------------------------------------------------------
    async def attach(self, sid: str) -> dict[str, Any]:
        state = await self.client.session.queue_attach(session_id=sid, controller_id=self.controller_id)
        self.sessions.add(sid)
        return dict(state)

    async def scan(self, tg: anyio.abc.TaskGroup) -> None:
        """Re-attach known sessions and pick up work in the newest ones: prompts that wait, and sessions
        the host still names this controller id for. Those an earlier run under this id controlled (a
        restart within the host's grace, when the host does not count that run as gone): the attach
        offers again what it took and never started, and a queue turn it left running is recovered
        (``session.recoverInflight``), so the queue goes on. The turns of a sidecar the host counts as
        gone are the host's to recover; a turn another live sidecar runs is never touched."""
        recent = await self.client.session.list(limit=SCAN_SESSIONS)
        candidates = set(self.sessions)
        left: dict[str, str] = {}  # session -> a queue turn an earlier run under this id left running
        for s in recent["sessions"]:
            if s["id"] in self.sessions:
                continue
            queue = await self.client.session.queue_list(session_id=s["id"])
            ours = queue.get("controllerId") == self.controller_id
            if queue["entries"] or ours:
                candidates.add(s["id"])
            latest: Mapping[str, Any] = s.get("latestTurn") or {}
            tid = str(latest.get("id"))
            if ours and latest.get("status") == "running" and tid.startswith(TURN_PREFIX + QUEUE_ENTRY_PREFIX) \
                    and tid not in self.running:
                left[s["id"]] = tid
        for sid in candidates:
            try:
                state = await self.attach(sid)
            except RpcError as exc:
                if exc.data_code == "SESSION_NOT_FOUND":
                    self.sessions.discard(sid)
                    continue
                raise
            if sid in left:
                await self._recover(sid, left[sid])
            if state["entries"] or sid in left:
                self.wake(tg, sid)

    async def _recover(self, sid: str, turn_id: str) -> None:
        try:
            got = await self.client.session.recover_inflight(session_id=sid, turn_id=turn_id)
        except RpcError as exc:
            log.warning("session %s: turn %s an earlier run left running not recovered: %s", sid, turn_id,
                        exc.describe())
            return
        log.info("session %s: recovered turn %s an earlier run left running (%s)", sid, turn_id, got["action"])

    def wake(self, tg: anyio.abc.TaskGroup, sid: str) -> None:
        if sid in self.busy:
            self.again.add(sid)
            return
        self.busy.add(sid)
        tg.start_soon(self._drain, sid)

    async def _drain(self, sid: str) -> None:
        try:
            while True:
                self.again.discard(sid)
                taken = await self.client.session.queue_take(session_id=sid, controller_id=self.controller_id)
                entry = taken.get("entry")
                if entry is None:
                    if sid in self.again:
                        continue
                    return
                await self.run_turn(sid, dict(entry))
        except ConnectionLost:
            return  # the scan after the reconnect picks the session up again
        except RpcError as exc:
            log.warning("session %s: %s", sid, exc.describe())
        finally:
            self.busy.discard(sid)

    async def on_event(self, tg: anyio.abc.TaskGroup, item: Event | Resync) -> None:
        if isinstance(item, Resync):
            await self.scan(tg)
            return
        if item.topic != "session.queue":
            return
        sid = str(item.data.get("sessionId") or item.session_id or "")
        if not sid or not item.data.get("entries"):
            return
        controller = item.data.get("controllerId")
        if sid not in self.sessions or controller is None:
            # once per session and process (an attach offers again what an earlier run of this
            # sidecar took and never started), or the queue is held (its controller is gone)
            await self.attach(sid)
        elif controller != self.controller_id:
            return  # another live sidecar attached since: taking it back would make the two alternate
        self.wake(tg, sid)

    async def run(self) -> None:
        async with anyio.create_task_group() as tg, \
                self.client.subscribe(["session.queue"]) as events:
            await self.scan(tg)
            async for item in events:
                try:
                    await self.on_event(tg, item)
                except ConnectionLost:
                    continue  # the subscription resyncs after the reconnect
                except RpcError as exc:
                    log.warning("event %s: %s", getattr(item, "topic", "resync"), exc.describe())

    # -- one turn ------------------------------------------------------------------
    async def run_turn(self, sid: str, entry: dict[str, Any]) -> None:
        turn_id = f"{TURN_PREFIX}{entry['id']}"
        self.running.add(turn_id)
        try:
            await self._run_turn(sid, entry, turn_id)
        finally:
            self.running.discard(turn_id)

    async def _run_turn(self, sid: str, entry: dict[str, Any], turn_id: str) -> None:
        c = self.client
        summary = (await c.session.get(session_id=sid, message_limit=1))["session"]
        root = summary.get("projectPath")
        mode = permission_mode(entry, summary, self.approve)
        unavailable: ModelError | None = None
        try:
            resolved = await self._model_for(summary)
        except ModelError as exc:  # the turn still starts and ends, as failed, so the user sees why
            unavailable = exc
            resolved = Resolved(FakeModel(), None, {})
        model = resolved.model
        try:
            environment: dict[str, Any] = {
                "version": 1, "model": {"id": model.name}, "toolSchemas": list(TOOL_SCHEMAS),
                "executionBindings": {"projectPath": root},
                "permissionPolicy": {"tools": "read-only", "mode": mode}, **resolved.environment}
            await c.session.start_turn(session_id=sid, turn_id=turn_id, model_id=model.name,
                                       provider_id=resolved.provider_id,
                                       environment=cast(RunEnvironmentSnapshot, environment))
            delivery = entry.get("sessionMessageId")
            if delivery is not None:  # a collaboration delivery: the host writes its input row, with provenance
                await c.collab.begin(session_id=sid, delivery_id=str(delivery), turn_id=turn_id)
            else:
                await c.session.append_message(session_id=sid, message={
                    "id": f"u_{entry['id']}", "role": "user", "turnId": turn_id, "createdAt": _utc(),
                    "blocks": [{"type": "text", "text": entry["content"]}]})
            if unavailable is not None:
                raise unavailable
            history = await self._history(sid)
            usage = await self._converse(sid, turn_id, root, history, mode, model)
            await c.session.end_turn(session_id=sid, turn_id=turn_id, status="completed", usage=usage,
                                     create_notification=False)
            self.turns_done += 1
        except RpcError as exc:
            if exc.data_code == "CONFLICT":
                log.info("turn %s of %s ended elsewhere (a host restart or a recovery); dropped (%s)", turn_id, sid,
                         exc.message)
                return
            await self._fail(sid, turn_id, exc.data_code)
            raise
        except ModelError as exc:
            log.warning("turn %s: model failed: %s", turn_id, exc)
            await self._fail(sid, turn_id, "MODEL_ERROR")

    async def _fail(self, sid: str, turn_id: str, code: str) -> None:
        try:
            await self.client.session.end_turn(session_id=sid, turn_id=turn_id, status="error", error_code=code)
        except RpcError:
            pass

    async def _history(self, sid: str) -> list[dict[str, Any]]:
        ctx = await self.client.session.context(session_id=sid)
        out: list[dict[str, Any]] = []
        for m in ctx["messages"]:
            text = " ".join(str(b.get("text", "")) for b in m["blocks"] if b.get("type") == "text").strip()
            if text and m["role"] in ("user", "assistant", "system"):
                out.append({"role": m["role"], "content": text})
        return out

    async def _model_for(self, session: Mapping[str, Any]) -> Resolved:
        if self.model is not None:
            return Resolved(self.model, None, {})
        if self.providers is None:
            raise ModelError("the sidecar has neither a model nor a provider store")
        return await self.providers.resolve(session)

    async def _converse(self, sid: str, turn_id: str, root: str | None,
                        history: list[dict[str, Any]], mode: str, model: Model) -> Usage:
        turn = Turn(messages=list(history), tools=TOOL_SCHEMAS)
        tokens_in = tokens_out = 0
        for round_no in range(MAX_TOOL_ROUNDS + 1):
            reply_id = f"a_{turn_id}_{round_no}"
            text, requests, finished = await self._stream(sid, turn_id, reply_id, turn, model)
            tokens_in += finished.input_tokens
            tokens_out += finished.output_tokens
            if not requests or round_no == MAX_TOOL_ROUNDS:
                await self.client.session.append_message(session_id=sid, message={
                    "id": reply_id, "role": "assistant", "turnId": turn_id, "createdAt": _utc(),
                    "blocks": [{"type": "text", "text": text}],
                    "meta": {"model": model.name, "usage": {"inputTokens": finished.input_tokens,
                                                                  "outputTokens": finished.output_tokens}}})
                break
            blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
            for req in requests:
                refused: str | None = None
                try:  # refused paths (the host's data directory, credential files) are never even asked for
                    await anyio.to_thread.run_sync(check_tool, req.name, req.args, root, self.protected)
                except ToolError as exc:
                    refused = str(exc)
                allowed, decision = (False, "refused") if refused else await self._permit(sid, turn_id, mode, req)
                started = time.monotonic()
                if refused is not None:
                    result, status = refused, "error"
                elif not allowed:
                    result, status = f"the user did not allow {req.name} ({decision})", "denied"
                else:
                    try:
                        result = await anyio.to_thread.run_sync(run_tool, req.name, req.args, root, self.protected)
                        status = "ok"
                    except ToolError as exc:
                        result, status = str(exc), "error"
                blocks.append({"type": "tool_call", "callId": req.call_id, "name": req.name, "args": req.args,
                               "status": status, "result": result, "completedAt": _utc(),
                               "durationMs": int((time.monotonic() - started) * 1000)})
                turn.messages.append({"role": "assistant", "content": None, "tool_calls": [{
                    "id": req.call_id, "type": "function",
                    "function": {"name": req.name, "arguments": _json(req.args)}}]})
                turn.messages.append({"role": "tool", "tool_call_id": req.call_id, "content": result})
            await self.client.session.append_message(session_id=sid, message={
                "id": reply_id, "role": "assistant", "turnId": turn_id, "createdAt": _utc(), "blocks": blocks})
        return {"inputTokens": tokens_in, "outputTokens": tokens_out}

    async def _permit(self, sid: str, turn_id: str, mode: str, req: ToolRequest) -> tuple[bool, str]:
        """May this tool call run? Asks through the host in ``ask`` mode and waits for the answer.

        Subscribes to ``approval.resolved`` before asking, so the answer cannot be missed. A
        request a rule answers comes back resolved at once. When the subscription resyncs
        (events were missed), asking again for the same ``toolCallId`` returns the request as it
        is now; after a host restart the turn is fenced and that call is ``CONFLICT`` (the turn
        is dropped, like any fenced turn).
        """
        if mode != "ask":
            return True, mode

        async def ask() -> dict[str, Any]:
            asked = await self.client.approvals.request(
                session_id=sid, turn_id=turn_id, tool_call_id=f"{turn_id}.{req.call_id}"[:200], tool=req.name,
                args_summary=tool_summary(req), risk="low")
            return dict(asked["request"])

        async with self.client.subscribe(["approval.resolved"], session_id=sid) as events:
            request = await ask()
            if request["status"] == "pending":
                log.info("turn %s: waiting for permission to run %s (request %s)", turn_id, req.name,
                         request["requestId"])
            while request["status"] == "pending":
                item = await events.next()
                if isinstance(item, Resync):
                    request = await ask()
                elif item.data.get("request", {}).get("requestId") == request["requestId"]:
                    request = dict(item.data["request"])
        return request["status"] == "allowed", str(request["status"])

    async def _stream(self, sid: str, turn_id: str, reply_id: str, turn: Turn,
                      model: Model) -> tuple[str, list[ToolRequest], Finished]:
        parts: list[str] = []
        requests: list[ToolRequest] = []
        finished = Finished(0, 0)
        last = time.monotonic()
        saved = 0
        async for chunk in model.stream(turn):
            if isinstance(chunk, TextDelta):
                parts.append(chunk.text)
            elif isinstance(chunk, ToolRequest):
                requests.append(chunk)
            else:
                finished = chunk
            now = time.monotonic()
            if parts and len(parts) != saved and now - last >= self.checkpoint_every:
                await self.client.session.save_inflight_message(session_id=sid, turn_id=turn_id, message={
                    "id": reply_id, "role": "assistant", "turnId": turn_id,
                    "blocks": [{"type": "text", "text": "".join(parts)}]})
                saved, last = len(parts), now
        return "".join(parts), requests, finished


def permission_mode(entry: Mapping[str, Any], session: Mapping[str, Any], approve: str) -> str:
    """``ask`` or what lets the tools run without asking: the queue entry's mode, else the session's."""
    if approve == "auto":
        return "auto"
    for mode in (entry.get("permissionMode"), session.get("permissionMode")):
        if mode in ("ask", "accept-edits", "auto"):
            return str(mode)
    return "ask"


def tool_summary(req: ToolRequest) -> str:
    """What the prompt shows: the tool and its path (never more than a line)."""
    path = req.args.get("path") if isinstance(req.args, dict) else None
    return f"{req.name} {path}" if isinstance(path, str) else req.name


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def build_model(args: argparse.Namespace) -> Model | None:
    """A fixed model, or None: each turn's model comes from the host's provider store."""
    if args.model == "fake" or (args.model is None and not args.provider and not args.base_url):
        return FakeModel(delay=args.fake_delay, words=args.fake_words)
    if args.base_url:
        if not args.model:
            raise SystemExit("pi-host agent: --base-url needs --model (the model id to ask for)")
        key = os.environ.get(args.api_key_env) if args.api_key_env else None
        return OpenAIModel(args.model, base_url=args.base_url, api_key=key)
    return None


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="pi-host agent", description="the reference agent sidecar")
    ap.add_argument("--data-dir", help="data directory (default: $PI_DESKTOP_DATA_DIR or ~/.pi-desktop; "
                    "`pi-host ... --dev`: ~/.pi-desktop-dev)")
    ap.add_argument("--model", default=None,
                    help="'fake' (canned replies, no network; the default without --provider/--base-url) or a "
                         "model id (used when a session names none)")
    ap.add_argument("--provider", default=None,
                    help="provider id in the host's provider store, used when a session names none (endpoint "
                         "and API key come from the store: providers.get, secrets.get)")
    ap.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8080/v1 (bypasses the "
                                       "provider store; the key comes from --api-key-env)")
    ap.add_argument("--api-key-env", default="OPENAI_API_KEY", help="with --base-url: the variable holding the key")
    ap.add_argument("--controller-id", default=None, help="stable id of this sidecar (default: agent-<host>)")
    ap.add_argument("--session", action="append", default=[], help="also control this session from the start")
    ap.add_argument("--checkpoint-every", type=float, default=0.25, metavar="SECONDS")
    ap.add_argument("--fake-delay", type=float, default=0.05, metavar="SECONDS", help="fake model: per word")
    ap.add_argument("--fake-words", type=int, default=24, help="fake model: words after the echo")
    ap.add_argument("--approve", choices=("ask", "auto"), default="ask",
                    help="ask: before a tool runs, ask through the host (approvals.request) unless the turn's "
                         "permission mode is auto/accept-edits; auto: never ask (unattended demos and tests)")
    return ap


async def run(args: argparse.Namespace) -> None:
    controller = args.controller_id or f"agent-{os.uname().nodename}"
    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()

    def tell(state: str) -> None:
        print(f"pi-host agent: {state}", file=sys.stderr, flush=True)

    async with connect(data_dir=data_dir, client_id=controller, client_kind="agent", connect_timeout=60,
                       wait_for_host=True, on_state=tell) as client:
        model = build_model(args)
        store = ProviderStore(client, args.provider, args.model) if model is None else None
        sidecar = Sidecar(client, model, controller, checkpoint_every=args.checkpoint_every,
                          sessions=set(args.session), providers=store, approve=args.approve,
                          protected=(str(data_dir),))
        source = (f"model {model.name}" if model is not None else
                  f"the host's provider store (default provider {args.provider or 'none'})")
        print(f"pi-host agent: {controller} connected ({source}); waiting for queued turns", flush=True)
        await sidecar.run()


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="pi-host agent: %(message)s", stream=sys.stderr)
    try:
        anyio.run(run, args)
    except KeyboardInterrupt:
        return 130
    except ConnectionLost as exc:
        print(f"pi-host agent: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
