"""``pi-host chat [SESSION]`` (or ``pihost-chat``): a terminal chat on a running host.

A full-screen prompt_toolkit application on asyncio (chosen over textual:
asyncio-native like the SDK, a small dependency tree, and a plain text pane
that tmux captures exactly), driving the host with :mod:`pihost_client`: the transcript pane shows the session's newest
messages and the reply streaming from ``session.inflight`` events; the input
line queues a turn (``session.queuePush``) for the agent sidecar to run.

When the host goes away the status line says so and the client reconnects;
after a restart the subscription resynchronises and the pane reloads the
window, which then holds the reply boot promoted from its checkpoint
(marked ``[interrupted]``).

When the agent asks for permission to run a tool (``approval.requested``;
pending ones are reloaded with ``approvals.pending``), the pane shows the
prompt: answer ``/allow`` (this call), ``/always`` (a permission rule: always
allow this tool in the session's project, or in the session without one) or
``/deny``. Turns are queued with ``--permission-mode`` (default ``ask``).

A turn that ended without the reply the pane would show (aborted by a host
restart, or failed) gets a line saying so, until the next turn starts.

Commands: ``/new [title]``, ``/open SESSION``, ``/sessions``, ``/branches``,
``/search QUERY`` (every session), ``/find QUERY`` (this session), ``/allow``,
``/always``, ``/deny``, ``/help``, ``/quit``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import Any, Literal, cast

from prompt_toolkit.application import Application
from prompt_toolkit.buffer import Buffer
from prompt_toolkit.document import Document
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.layout import HSplit, Layout, Window
from prompt_toolkit.layout.controls import BufferControl, FormattedTextControl
from prompt_toolkit.widgets import TextArea

from .client import Client, ConnectionLost, Event, Resync, RpcError, connect
from .hostinfo import HostNotRunning

__all__ = ["Chat", "main", "render_message"]

WINDOW = 60
TOPICS = ["session.message", "session.inflight", "session.queue", "turn.started", "turn.ended", "session.updated",
          "approval.requested", "approval.resolved"]
PermissionMode = Literal["inherit", "ask", "accept-edits", "auto"]
HELP = ("/new [title]  /open SESSION  /sessions  /branches  /search QUERY (all sessions)  /find QUERY (this session)"
        "  /allow  /always  /deny  /quit")


def choose_option(request: dict[str, Any], answer: str) -> str:
    """The option id of a permission prompt for ``/allow``, ``/always`` or ``/deny``."""
    options = request.get("options") or []

    def first(decision: str, remembers: Sequence[str]) -> str | None:
        for remember in remembers:
            for o in options:
                if o.get("decision") == decision and o.get("remember") == remember:
                    return str(o["id"])
        return None

    if answer == "allow":
        found = first("allow", ("once", "session", "project", "global"))
    elif answer == "always":
        found = first("allow", ("project", "session", "global"))
    else:
        found = first("deny", ("once", "session", "project", "global"))
    if found is None:
        raise ValueError(f"this prompt offers no way to /{answer}")
    return found


def render_prompt(request: dict[str, Any]) -> str:
    summary = request.get("argsSummary") or request.get("tool")
    return f"permission? the agent wants to run {summary} (risk {request.get('risk')}): /allow  /always  /deny"


def _text(blocks: Sequence[dict[str, Any]]) -> str:
    parts: list[str] = []
    for b in blocks:
        kind = b.get("type")
        if kind == "text":
            parts.append(str(b.get("text", "")))
        elif kind == "tool_call":
            args = b.get("args") or {}
            arg = args.get("path", "") if isinstance(args, dict) else ""
            result = str(b.get("result", ""))
            parts.append(f"\n  [tool {b.get('name')}({arg}) {b.get('status', 'running')}: {result[:200]}]")
        elif kind == "thinking":
            continue
        else:
            parts.append(f"[{kind}]")
    return "".join(parts).strip()


def turn_notice(latest: dict[str, Any] | None) -> str | None:
    """A line for the newest turn when it ended without a reply to show: aborted (a host restart fenced it, or
    it was stopped) or failed. None for a completed or running turn."""
    if not latest or latest.get("status") not in ("aborted", "error"):
        return None
    code = latest.get("errorCode")
    why = "the host restarted while it ran" if code == "INTERRUPTED" else (code or "no reason given")
    return f"!! turn {latest.get('id')} {latest['status']} ({why}); send your message again to retry"


def render_message(m: dict[str, Any]) -> str:
    who = {"user": "you", "assistant": "assistant", "tool": "tool", "system": "system"}.get(m.get("role", ""), "?")
    meta = m.get("meta") or {}
    marks = ""
    if meta.get("interrupted"):
        marks += " [interrupted]"
    if meta.get("status") == "streaming":
        marks += " [streaming]"
    return f"{who}{marks}: {_text(m.get('blocks') or [])}"


class Chat:
    def __init__(self, client: Client, session_id: str) -> None:
        self.client = client
        self.session_id = session_id
        self.title = ""
        self.messages: list[dict[str, Any]] = []
        self.live: dict[str, dict[str, Any]] = {}
        self.prompts: dict[str, dict[str, Any]] = {}
        """Pending permission requests of this session, by requestId (oldest first)."""
        self.permission_mode: PermissionMode = "ask"
        self.notice = "type a message and press Enter; /help for commands"
        self.output = Buffer(read_only=True)
        self.input = TextArea(height=1, prompt="> ", multiline=False, accept_handler=self._accept)
        self.app: Application[None] = self._build()
        self.reload_wanted = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self.queued = 0
        self.running = False
        self.lost_turn: str | None = None
        """What :func:`turn_notice` says about the session's newest turn."""

    # -- layout ------------------------------------------------------------------
    def _build(self) -> Application[None]:
        keys = KeyBindings()

        @keys.add("c-c")
        @keys.add("c-d")
        def _quit(event: KeyPressEvent) -> None:
            event.app.exit()

        status = Window(FormattedTextControl(self._status), height=1, style="reverse")
        body = Window(BufferControl(self.output), wrap_lines=True)
        return Application(layout=Layout(HSplit([body, status, self.input]), focused_element=self.input),
                           key_bindings=keys, full_screen=True, refresh_interval=0.25)

    def _status(self) -> str:
        conn = "connected" if self.client.connected else "reconnecting..."
        turn = " | turn running" if self.running else ""
        return f" {self.title or self.session_id} [{self.session_id}] | {conn} | queued {self.queued}{turn} "

    def redraw(self) -> None:
        lines = [render_message(m) for m in self.messages]
        shown = {m.get("id") for m in self.messages}
        for mid, m in self.live.items():
            if mid not in shown:
                lines.append(render_message({**m, "meta": {"status": "streaming"}}))
        if self.lost_turn is not None and not self.running:
            lines.append(self.lost_turn)
        lines += [render_prompt(r) for r in self.prompts.values()]
        lines += ["", f"-- {self.notice}"]
        text = "\n".join(lines)
        self.output.set_document(Document(text, cursor_position=len(text)), bypass_readonly=True)
        self.app.invalidate()

    # -- host --------------------------------------------------------------------
    async def reload(self) -> None:
        page = await self.client.session.get(session_id=self.session_id, message_limit=WINDOW)
        self.title = page["session"].get("title") or ""
        self.lost_turn = turn_notice(cast(dict[str, Any] | None, page["session"].get("latestTurn")))
        self.messages = [dict(m) for m in page["messages"]]
        ids = {m["id"] for m in self.messages}
        self.live = {k: v for k, v in self.live.items() if k not in ids}
        queue = await self.client.session.queue_list(session_id=self.session_id)
        self.queued = len(queue["entries"])
        pending = await self.client.approvals.pending(session_id=self.session_id)
        self.prompts = {r["requestId"]: dict(r) for r in reversed(pending["pending"])}
        self.redraw()

    async def follow(self) -> None:
        while True:
            sid = self.session_id
            async with self.client.subscribe(TOPICS, session_id=sid) as events:
                await self.reload()
                async for item in events:
                    if sid != self.session_id:
                        break
                    await self.on_event(item)

    async def on_event(self, item: Event | Resync) -> None:
        if isinstance(item, Resync):
            self.live.clear()
            self.running = False  # a restart fenced any running turn
            self.notice = f"reconnected ({item.reason}); reloaded"
            await self.reload()
            return
        if item.topic == "session.inflight":
            message = item.data.get("message") or {}
            if isinstance(message, dict) and message.get("id"):
                self.live[str(message["id"])] = message
                self.redraw()
        elif item.topic == "approval.requested":
            request = dict(item.data["request"])
            self.prompts[str(request["requestId"])] = request
            self.redraw()
        elif item.topic == "approval.resolved":
            request = item.data["request"]
            if self.prompts.pop(str(request["requestId"]), None) is not None:
                self.notice = f"{request['tool']}: {request['status']}"
            self.redraw()
        elif item.topic == "session.queue":
            self.queued = len(item.data.get("entries") or [])
            self.redraw()
        elif item.topic in ("turn.started", "turn.ended"):
            self.running = item.topic == "turn.started"
            await self.reload()
        else:
            await self.reload()

    # -- input -------------------------------------------------------------------
    def _accept(self, buffer: Buffer) -> bool:
        text = buffer.text.strip()
        if text:
            task = asyncio.get_running_loop().create_task(self._run_input(text))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return False  # clear the line

    async def _run_input(self, text: str) -> None:
        try:
            await self.handle(text)
        except RpcError as exc:
            self.notice = exc.describe().replace("\n", "; ")
        except ConnectionLost as exc:
            self.notice = f"not connected: {exc}"
        self.redraw()

    async def handle(self, text: str) -> None:
        c = self.client
        if not text.startswith("/"):
            await c.session.queue_push(session_id=self.session_id, principal="user", content=text,
                                       permission_mode=self.permission_mode)
            self.notice = "queued; the agent will answer"
            return
        cmd, _, arg = text[1:].partition(" ")
        arg = arg.strip()
        if cmd in ("quit", "q", "exit"):
            self.app.exit()
        elif cmd == "help":
            self.notice = HELP
        elif cmd in ("allow", "always", "deny"):
            await self.answer(cmd)
        elif cmd == "new":
            created = await c.session.create(title=arg or "Chat")
            self.switch(created["id"])
        elif cmd == "open":
            await c.session.get(session_id=arg, message_limit=1)
            self.switch(arg)
        elif cmd == "sessions":
            listed = await c.session.list(limit=10)
            self.notice = "sessions: " + "  ".join(
                f"{s['id']} ({s.get('title') or 'untitled'}, {s['messageCount']})" for s in listed["sessions"])
        elif cmd == "branches":
            revs = (await c.session.list_revisions(session_id=self.session_id))["revisions"]
            self.notice = "branches: " + ("  ".join(
                f"{r['rootUserId']}#{r['revisionIndex']} ({r['messageCount']} msgs{', live' if r['isActive'] else ''})"
                for r in revs) or "none (no regenerated replies)")
        elif cmd == "search":  # every session: say which one each hit is in
            found = await c.search.sessions(query=arg, limit=5)
            self.notice = "search, all sessions: " + ("  |  ".join(
                f"{r.get('title') or 'untitled'} [{r['sessionId']}]" + "".join(
                    f" #{snip.get('seq')} {snip.get('snippet')}" for snip in r.get("snippets", [])[:2])
                for r in found["results"]) or "no match") + "  (/open SESSION to go there)"
        elif cmd == "find":  # this session only
            hits = await c.search.query(query=arg, session_id=self.session_id, limit=5)
            self.notice = "search, this session: " + ("  |  ".join(
                f"#{h['seq']} {h['snippet']}" for h in hits["results"]) or "no match")
        else:
            self.notice = f"unknown command /{cmd}; /help"

    async def answer(self, how: str) -> None:
        """Answer the oldest pending permission prompt of this session."""
        if not self.prompts:
            self.notice = "no permission prompt is pending"
            return
        request = next(iter(self.prompts.values()))
        try:
            option = choose_option(request, how)
        except ValueError as exc:
            self.notice = str(exc)
            return
        answered = await self.client.approvals.respond(session_id=self.session_id,
                                                       request_id=request["requestId"], option_id=option)
        self.prompts.pop(request["requestId"], None)
        rule = answered.get("rule")
        self.notice = f"{request['tool']}: {answered['request']['status']}" + (
            f" (rule for the {rule['scope']})" if rule else "")

    def switch(self, session_id: str) -> None:
        self.session_id = session_id
        self.messages, self.live, self.prompts = [], {}, {}
        self.reload_wanted.set()


async def _cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel the tasks and wait until each has finished (its cleanup included)."""
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)


async def run(args: argparse.Namespace) -> int:
    try:
        async with connect(data_dir=args.data_dir, client_id=args.client_id, client_kind="ui",
                           connect_timeout=args.connect_timeout) as client:
            sid = args.session
            if sid is None:
                created = await client.session.create(title=args.title, project_path=args.project)
                sid = created["id"]
            else:
                await client.session.get(session_id=sid, message_limit=1)
            chat = Chat(client, sid)
            chat.permission_mode = cast(PermissionMode, args.permission_mode)
            chat.redraw()

            async def follow_forever() -> None:
                while True:
                    chat.reload_wanted.clear()
                    follower = asyncio.ensure_future(chat.follow())
                    switched = asyncio.ensure_future(chat.reload_wanted.wait())
                    try:
                        done, _ = await asyncio.wait({follower, switched}, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        # both inner tasks end here, also when this task is cancelled (the chat is leaving):
                        # a follow() left running resubscribed on the closing client for ever
                        await _cancel_and_wait(follower, switched)
                    if follower in done and follower.exception() is not None:
                        chat.notice = f"event stream failed: {follower.exception()}"
                        await asyncio.sleep(0.5)

            following = asyncio.ensure_future(follow_forever())
            try:
                await chat.app.run_async()
            finally:
                await _cancel_and_wait(following)
    except (ConnectionLost, HostNotRunning) as exc:
        print(f"pi-host chat: {exc}", file=sys.stderr)
        return 2
    except RpcError as exc:
        print(f"pi-host chat: {exc.describe()}", file=sys.stderr)
        return 1
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="pi-host chat", description="chat with the agent through the host")
    ap.add_argument("session", nargs="?", help="session to resume (default: a new one)")
    ap.add_argument("--data-dir", help="data directory (default: $PI_DESKTOP_DATA_DIR or ~/.pi-desktop; "
                    "`pi-host ... --dev`: ~/.pi-desktop-dev)")
    ap.add_argument("--title", default="Chat", help="title of a new session")
    ap.add_argument("--project", default=None, help="project root of a new session (the agent's tools use it)")
    ap.add_argument("--permission-mode", choices=("ask", "accept-edits", "auto", "inherit"), default="ask",
                    help="the permission mode of the turns you queue (ask: the agent asks before a tool runs)")
    ap.add_argument("--client-id", default="pi-chat", help="stable id of this chat (scopes receipts)")
    ap.add_argument("--connect-timeout", type=float, default=30.0)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parser().parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
