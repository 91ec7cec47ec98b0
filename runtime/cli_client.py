"""The CLI's client commands: ``status``, ``sessions``, ``show``, ``search``, ``follow``, ``stop``.

Finding the host (:func:`find_host`): ``host.json`` names the pid and URL;
``host.lock`` is held (``flock``) by the running host. So:

* lock held, ``host.json`` present → the host is running: ask it;
* lock held, no ``host.json`` → a host is still booting;
* lock free → no host runs; a ``host.json`` left behind is stale (the host
  was killed) and is explained in one line.

Without a running host, ``sessions``, ``show`` and ``search`` read the data
directory offline (:mod:`runtime.cli_offline`): read-only, under a *shared*
``host.lock`` so no host can start writing meanwhile; never while a host
holds it.

Errors print their stable code, their message and every field detail the
host sent; ``--json`` prints the result as JSON (``follow``: one event per
line).
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

import trio

from runtime.client import ClientClosed, RpcError, open_client, read_host_info
from runtime.datadir import DataDir

__all__ = ["HostState", "find_host", "print_rpc_error", "run_client_command", "stop_host"]

EXIT_ERROR = 1
EXIT_NO_HOST = 2


@dataclass(frozen=True, slots=True)
class HostState:
    running: bool
    booting: bool = False
    pid: int | None = None
    stale_pid: int | None = None
    problem: str | None = None


def lock_held(data_dir: DataDir) -> bool:
    """True when a host holds ``host.lock`` (the kernel drops it when the host dies)."""
    try:
        fd = os.open(data_dir.lock_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return True
        raise
    finally:
        os.close(fd)
    return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM
    return True


def find_host(data_dir: DataDir) -> HostState:
    path = data_dir.host_json_path
    pid: int | None = None
    try:
        raw = json.loads(path.read_text("utf-8"))
        pid = raw.get("pid") if isinstance(raw, dict) and isinstance(raw.get("pid"), int) else None
    except FileNotFoundError:
        raw = None
    except (OSError, ValueError):
        raw = None
    if lock_held(data_dir):
        if raw is None:
            return HostState(running=False, booting=True,
                             problem=f"a host is starting on {data_dir.root} (booting; no host.json yet)")
        return HostState(running=True, pid=pid)
    if raw is None:
        return HostState(running=False, problem=f"no host is running on {data_dir.root}")
    if pid is not None and _pid_alive(pid):
        why = f"pid {pid} is alive but does not hold {data_dir.lock_path.name} (a reused pid)"
    else:
        why = f"pid {pid} is not running (the host was killed)"
    return HostState(running=False, stale_pid=pid,
                     problem=f"{path} is stale: {why}; the next `pi-host serve` replaces it")


def print_rpc_error(exc: RpcError, out: TextIO = sys.stderr) -> None:
    """``pi-host: CODE: message`` then one line per field error."""
    print(f"pi-host: {exc.data_code}: {exc.message}", file=out)
    errors = exc.data.get("errors")
    for err in errors if isinstance(errors, list) else []:
        if isinstance(err, dict):
            print(f"  {err.get('loc', '?')}: {err.get('msg', '')} ({err.get('type', '')})", file=out)
    for key, value in exc.data.items():
        if key not in ("code", "retriable", "errors"):
            print(f"  {key}: {json.dumps(value, ensure_ascii=False)}", file=out)


def _dump(obj: Any) -> None:
    print(json.dumps(obj, indent=2, ensure_ascii=False))


# -- output of each read (the same for a host's answer and an offline read) ----------------
def print_sessions(res: dict[str, Any], args: argparse.Namespace) -> None:
    if getattr(args, "ids", False):
        for s in res["sessions"]:
            print(s["id"])
    elif args.json:
        _dump(res)
    else:
        for s in res["sessions"]:
            print(f"{s['id']}  {s['messageCount']:>6} msgs  {s.get('title') or '(untitled)'}")


def print_window(res: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        _dump(res)
        return
    print(f"# {res['session'].get('title') or res['session']['id']}  "
          f"(messages {res['messageStart']}-{res['messageEnd']} of {res['totalMessages']})")
    for m in res["messages"]:
        blocks = m.get("blocks", [])
        text = " ".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        if not text:
            text = ", ".join(b.get("type", "?") for b in blocks)
        meta = m.get("meta") or {}
        mark = " [interrupted]" if meta.get("interrupted") else ""
        if meta.get("agentName") or meta.get("parentToolCallId"):  # a subagent's row (§4.7a), not the user's
            mark += f" [subagent {meta.get('agentName') or meta.get('parentToolCallId')}]"
        if m.get("deleted"):  # tombstoned (e.g. an import's off-branch message): never shown as current
            mark += " [deleted]"
        print(f"[{m.get('seq')}] {m.get('role')}{mark}: {text}")


def print_search(res: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        _dump(res)
        return
    for r in res["results"]:
        print(f"{r['sessionId']}  {r.get('messageMatches', 0)} matches  {r.get('title') or ''}")
        for snip in r.get("snippets", []):
            print(f"    [{snip.get('seq')}] {snip.get('role')}: {snip.get('snippet')}")


def _requests(command: str, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    if command == "status":
        return "host.status", {}
    if command == "sessions":
        return "session.list", {"limit": args.limit}
    if command == "show":
        params: dict[str, Any] = {"sessionId": args.session, "messageLimit": args.limit}
        if args.before is not None:
            params["messageBefore"] = args.before
        return "session.get", params
    return "search.sessions", {"query": args.query, "limit": args.limit}


def _print(command: str, res: dict[str, Any], args: argparse.Namespace) -> None:
    if command == "status":
        _dump(res)
    elif command == "sessions":
        print_sessions(res, args)
    elif command == "show":
        print_window(res, args)
    else:
        print_search(res, args)


OFFLINE_COMMANDS = frozenset({"sessions", "show", "search"})


def run_client_command(command: str, args: argparse.Namespace, data_dir: DataDir) -> int:
    """A read command: ask the running host, or read offline when none runs."""
    state = find_host(data_dir)
    if not state.running:
        if command in OFFLINE_COMMANDS and not state.booting:
            from runtime.cli_offline import OfflineRefused, read_offline

            note = state.problem if state.stale_pid is not None else None
            try:
                res = read_offline(data_dir, command, args)
            except OfflineRefused as exc:
                print(f"pi-host: {exc}", file=sys.stderr)
                return EXIT_NO_HOST
            except RpcError as exc:
                print_rpc_error(exc)
                return EXIT_ERROR
            print(f"pi-host: no host running; read {data_dir.root} offline" + (f" ({note})" if note else ""),
                  file=sys.stderr)
            _print(command, res, args)
            return 0
        print(f"pi-host: {state.problem}", file=sys.stderr)
        return EXIT_NO_HOST
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
        print(f"pi-host: the host at {info.url} did not answer ({exc})", file=sys.stderr)
        return EXIT_NO_HOST
    _print(command, res, args)
    return 0


# -- follow -------------------------------------------------------------------------------
FOLLOW_TOPICS = ["session.message", "session.inflight", "session.queue", "session.updated", "session.deleted",
                 "turn.started", "turn.ended", "approval.requested", "approval.resolved", "interaction.requested",
                 "interaction.resolved"]


def _event_line(topic: str, cursor: int, data: dict[str, Any]) -> str:
    if topic == "session.message":
        m = data.get("message", {})
        return f"[{cursor}] {topic} #{m.get('seq')} {m.get('role')} {m.get('id')}"
    if topic == "session.inflight":
        m = data.get("message", {})
        text = " ".join(b.get("text", "") for b in m.get("blocks", []) if b.get("type") == "text")
        return f"[{cursor}] {topic} {m.get('id')}: {text[-80:]}"
    if topic in ("turn.started", "turn.ended"):
        t = data.get("turn", {})
        return f"[{cursor}] {topic} {t.get('id')} {t.get('status')}"
    if topic == "session.queue":
        return f"[{cursor}] {topic} {len(data.get('entries', []))} queued, held={data.get('held')}"
    if topic.startswith(("approval.", "interaction.")):
        r = data.get("request", {})
        what = r.get("argsSummary") or r.get("tool") or r.get("question")
        return f"[{cursor}] {topic} {r.get('requestId')} {r.get('status')}: {what}"
    return f"[{cursor}] {topic}"


def _follow(args: argparse.Namespace, data_dir: DataDir) -> int:
    """Tail a session's events until interrupted; reconnects across host restarts (pihost_client)."""
    try:
        import anyio

        from pihost_client import Event, Resync, connect
        from pihost_client import RpcError as ClientRpcError
    except ImportError:
        print("pi-host: follow needs the pihost-client package (pip install -e clients/python)", file=sys.stderr)
        return EXIT_ERROR

    async def tail() -> int:
        async with connect(data_dir=data_dir.root, client_id=f"cli-follow-{os.getpid()}", client_kind="cli") as c:
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
        return 0

    async def until_interrupted() -> int:
        """Ctrl-C / SIGTERM cancel the tail at a checkpoint (never a KeyboardInterrupt mid-frame)."""
        code = 0
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with anyio.create_task_group() as tg:
                async def run_tail() -> None:
                    nonlocal code
                    code = await tail()
                    tg.cancel_scope.cancel()

                tg.start_soon(run_tail)
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    break
        return code

    try:
        return int(anyio.run(until_interrupted, backend="trio"))
    except KeyboardInterrupt:
        return 0


# -- stop ---------------------------------------------------------------------------------
def stop_host(data_dir: DataDir, timeout: float) -> int:
    """SIGTERM the host named by ``host.json``; wait for its clean-shutdown marker."""
    state = find_host(data_dir)
    if not state.running or state.pid is None:
        print(f"pi-host: nothing to stop: {state.problem}", file=sys.stderr)
        return EXIT_NO_HOST
    pid = state.pid
    marker = data_dir.clean_shutdown_path
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        print(f"pi-host: pid {pid} is gone already", file=sys.stderr)
        return EXIT_NO_HOST
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_alive(pid) or not lock_held(data_dir):
            break
        time.sleep(0.05)
    else:
        print(f"pi-host: pid {pid} did not stop within {timeout:g} s (a second `stop` or SIGKILL ends it)",
              file=sys.stderr)
        return EXIT_ERROR
    if marker.exists():
        print(f"pi-host stopped cleanly (pid {pid})")
        return 0
    print(f"pi-host: pid {pid} ended without its clean-shutdown marker; the next start runs recovery",
          file=sys.stderr)
    return EXIT_ERROR
