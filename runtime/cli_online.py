"""The CLI's reads on a running host: ``status``, ``sessions``, ``show``, ``search`` (one request each) and
``follow`` (a session's events until Ctrl-C or the session's deletion, through pihost_client, which reconnects
across host restarts).

:mod:`runtime.cli` imports this module only when a host runs (:func:`runtime.cli_client.find_host`);
without one, the reads go to :mod:`runtime.cli_offline`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

import trio

from runtime.cli_client import EXIT_ERROR, EXIT_NO_HOST, find_host, print_result, print_rpc_error
from runtime.client import ClientClosed, RpcError, open_client, read_host_info
from runtime.datadir import DataDir

__all__ = ["FOLLOW_TOPICS", "ask_host"]


def _requests(command: str, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    if command == "status":
        return "host.status", {}
    if command == "sessions":
        listing: dict[str, Any] = {"limit": args.limit}
        if args.cursor is not None:
            listing["cursor"] = args.cursor
        return "session.list", listing
    if command == "show":
        params: dict[str, Any] = {"sessionId": args.session, "messageLimit": args.limit}
        if args.before is not None:
            params["messageBefore"] = args.before
        return "session.get", params
    return "search.sessions", {"query": args.query, "limit": args.limit}


def ask_host(command: str, args: argparse.Namespace, data_dir: DataDir) -> int:
    """``status`` / ``sessions`` / ``show`` / ``search`` / ``follow`` on the running host."""
    if command == "follow":
        return _follow(args, data_dir)
    return trio.run(_ask, command, args, data_dir)


async def _ask(command: str, args: argparse.Namespace, data_dir: DataDir) -> int:
    try:
        info = read_host_info(data_dir.root)
    except OSError as exc:
        print(f"pi-host: {exc}", file=sys.stderr)
        return EXIT_NO_HOST
    method, params = _requests(command, args)
    try:
        async with open_client(info.url, info.token, client_id=f"cli-{os.getpid()}", client_kind="cli") as c:
            res = await c.call(method, params)
    except RpcError as exc:
        print_rpc_error(exc)
        return EXIT_ERROR
    except (ClientClosed, OSError) as exc:
        # killed between the look and the call: say so, as `status` would have
        state = await trio.to_thread.run_sync(find_host, data_dir)
        print(f"pi-host: {state.problem}" if not state.running and state.problem
              else f"pi-host: the host at {info.url} did not answer ({exc})", file=sys.stderr)
        return EXIT_NO_HOST
    print_result(command, res, args)
    return 0


# -- follow -------------------------------------------------------------------------------
FOLLOW_TOPICS = ["session.message", "session.inflight", "session.queue", "session.updated", "session.deleted",
                 "turn.started", "turn.ended", "approval.requested", "approval.resolved", "interaction.requested",
                 "interaction.resolved"]


def _obj(value: object) -> dict[str, Any]:
    """``value`` when it is an object; else an empty one (a payload part of another shape draws as absent)."""
    return value if isinstance(value, dict) else {}


def _preview_text(blocks: object) -> str:
    """The text blocks' text: a checkpoint read back from its file (a damaged one, an older writer's) may
    hold blocks that are not objects, or text that is not a string; those are left out."""
    if not isinstance(blocks, list):
        return ""
    return " ".join(b["text"] for b in blocks
                    if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str))


def _event_line(topic: str, cursor: int, data: object) -> str:
    """One event as a line; parts of the payload of an unexpected shape are drawn as absent, never raise."""
    data = _obj(data)
    if topic == "session.message":
        m = _obj(data.get("message"))
        return f"[{cursor}] {topic} #{m.get('seq')} {m.get('role')} {m.get('id')}"
    if topic == "session.inflight":
        m = _obj(data.get("message"))
        return f"[{cursor}] {topic} {m.get('id')}: {_preview_text(m.get('blocks'))[-80:]}"
    if topic in ("turn.started", "turn.ended"):
        t = _obj(data.get("turn"))
        return f"[{cursor}] {topic} {t.get('id')} {t.get('status')}"
    if topic == "session.queue":
        entries = data.get("entries")
        return f"[{cursor}] {topic} {len(entries) if isinstance(entries, list) else 0} queued, " \
               f"held={data.get('held')}"
    if topic.startswith(("approval.", "interaction.")):
        r = _obj(data.get("request"))
        what = r.get("argsSummary") or r.get("tool") or r.get("question")
        return f"[{cursor}] {topic} {r.get('requestId')} {r.get('status')}: {what}"
    return f"[{cursor}] {topic}"


def _follow(args: argparse.Namespace, data_dir: DataDir) -> int:
    """Tail a session's events until interrupted; reconnects across host restarts (pihost_client: one retry
    chain, capped backoff with jitter), saying so on stderr ("waiting for a host: ...", "reconnected; resumed
    at cursor N"); a restarted host cannot replay what it sent before, so that case prints a resync line.
    The session's deletion (its ``session.deleted`` event, or found gone after a resync) ends it: one line on
    stderr, exit 1 (:data:`EXIT_ERROR`, what ``show`` of a missing session exits)."""
    try:
        import anyio

        from pihost_client import Event, Resync, connect
        from pihost_client import RpcError as ClientRpcError
    except ImportError:
        print("pi-host: follow needs the pihost-client package (pip install -e clients/python)", file=sys.stderr)
        return EXIT_ERROR

    def tell(state: str) -> None:
        if state != "connected":  # the first connection is announced by "following ..."
            print(f"pi-host: {state}", file=sys.stderr, flush=True)

    def deleted() -> int:
        """The followed session is gone: no event for it will ever come (exit 1, as ``show`` of it does)."""
        print(f"pi-host: session {args.session} was deleted; nothing more to follow", file=sys.stderr, flush=True)
        return EXIT_ERROR

    async def tail() -> int:
        async with connect(data_dir=data_dir.root, client_id=f"cli-follow-{os.getpid()}", client_kind="cli",
                           on_state=tell) as c:
            try:
                await c.session.get(session_id=args.session, message_limit=1)
            except ClientRpcError as exc:
                print(f"pi-host: {exc.describe()}", file=sys.stderr)
                return EXIT_ERROR
            async with c.subscribe(FOLLOW_TOPICS, session_id=args.session) as events:
                print(f"pi-host: following {args.session} (Ctrl-C stops)", file=sys.stderr, flush=True)
                async for item in events:
                    if isinstance(item, Resync):
                        line = json.dumps({"resync": item.reason}) if args.json else f"-- resync: {item.reason}"
                    elif isinstance(item, Event):
                        shown: dict[str, Any] = {"topic": item.topic, "cursor": item.cursor, "data": item.data}
                        if item.transient:  # a preview: its cursor repeats the newest numbered one
                            shown["transient"] = True
                        line = (json.dumps(shown, ensure_ascii=False) if args.json
                                else _event_line(item.topic, item.cursor, item.data))
                    print(line, flush=True)
                    if isinstance(item, Event) and item.topic == "session.deleted":
                        return deleted()
                    if isinstance(item, Resync) and await gone(c):
                        return deleted()  # deleted while follow waited for a host: its event is not replayed
        return 0

    async def gone(c: Any) -> bool:
        try:
            await c.session.get(session_id=args.session, message_limit=1)
        except ClientRpcError as exc:
            return exc.data_code == "SESSION_NOT_FOUND"
        return False

    async def until_interrupted() -> int:
        """Ctrl-C / SIGTERM cancel the tail at a checkpoint (never a KeyboardInterrupt mid-frame) and exit
        128 + the signal's number (130, 143), as ``agent`` and a ``serve`` stopped during boot do."""
        code = 0
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with anyio.create_task_group() as tg:
                async def run_tail() -> None:
                    nonlocal code
                    code = await tail()
                    tg.cancel_scope.cancel()

                tg.start_soon(run_tail)
                async for signum in signals:
                    code = 128 + int(signum)
                    tg.cancel_scope.cancel()
                    break
        return code

    try:
        return int(anyio.run(until_interrupted, backend="trio"))
    except KeyboardInterrupt:  # Ctrl-C before the signal receiver was open
        return 128 + signal.SIGINT
