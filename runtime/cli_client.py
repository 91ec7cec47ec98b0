"""What the CLI's client commands share: finding the host, printing results and errors, and ``stop``.

Finding the host (:func:`find_host`): ``host.json`` names the pid and URL;
``host.lock`` is held (``flock``) by the running host. So:

* lock held, ``host.json`` present → the host is running: ask it;
* lock held, no ``host.json`` → a host is still booting;
* lock held, ``host.json`` naming a zombie → a host killed a moment ago
  whose threads still let go of the lock: stale, as below;
* lock free → no host runs; a ``host.json`` left behind is stale (the host
  was killed) and is explained in one line.

With a running host, ``status``, ``sessions``, ``show``, ``search`` and
``follow`` ask it (:mod:`runtime.cli_online`); without one, ``sessions``,
``show`` and ``search`` read the data directory offline
(:mod:`runtime.cli_offline`): read-only, under a *shared* ``host.lock`` so no
host can start writing meanwhile; never while a host holds it.

This module stays light (no trio, no client, no store beyond the data
directory's layout): ``pi-host sessions --ids``, which shell completion runs on
every Tab, and ``stop`` import nothing more.

Errors print their stable code, their message and every field detail the
host sent. Every read prints text for a person; ``--json`` prints the result
as JSON (``status``: the whole ``host.status`` result; ``follow``: one event
per line).
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from runtime.datadir import DataDir

if TYPE_CHECKING:  # an annotation only: the client (trio, websockets) is imported by the commands that talk
    from runtime.client import RpcError

__all__ = ["EXIT_ERROR", "EXIT_NO_HOST", "OFFLINE_COMMANDS", "SESSIONS_PAGE", "HostState", "find_host",
           "print_error", "print_result", "print_rpc_error", "stop_host"]

EXIT_ERROR = 1
SESSIONS_PAGE = 200  # `sessions --limit`'s default
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
    except (FileNotFoundError, NotADirectoryError):  # no lock file, or the data directory is a file
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


def _pid_state(pid: int) -> str:
    """``"alive"``, ``"dying"`` (killed, not yet reaped by its parent: a zombie) or ``"gone"``.

    A zombie is not alive: it will never answer, and calling it "a reused pid" sent the reader of a ``kill -9``
    the wrong way. Nor has it always let go of its lock: its main thread shows ``Z`` while its other threads are
    still being torn down, and the kernel drops ``host.lock`` only with the last of them."""
    if pid <= 0:  # 0 and -1 name a process group / every process to kill(2), never one host
        return "gone"
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return "alive" if exc.errno == errno.EPERM else "gone"
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:  # with procfs: reaped between the two looks
        return "alive" if not Path("/proc/self/stat").exists() else "gone"
    except OSError:
        return "alive"  # no procfs to ask: kill(pid, 0) is all there is
    return "dying" if stat[stat.rfind(b")") + 2:][:1] in (b"Z", b"X") else "alive"


DYING_HOST_LOCK_WAIT_S = 2.0
"""How long :func:`find_host` waits for a killed host (a zombie) to let go of ``host.lock``."""


def _wait_lock_dropped(data_dir: DataDir, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while lock_held(data_dir) and time.monotonic() < deadline:
        time.sleep(0.01)


def find_host(data_dir: DataDir) -> HostState:
    path = data_dir.host_json_path
    pid: int | None = None
    try:
        raw = json.loads(path.read_text("utf-8"))
        named = raw.get("pid") if isinstance(raw, dict) else None
        pid = named if isinstance(named, int) and not isinstance(named, bool) and named > 0 else None
    except FileNotFoundError:
        raw = None
    except (OSError, ValueError):
        raw = None
    if lock_held(data_dir):
        if raw is None:
            return HostState(running=False, booting=True,
                             problem=f"a host is starting on {data_dir.root} (booting; no host.json yet)")
        state = _pid_state(pid) if pid is not None else "alive"  # no pid: `stop` says host.json names none
        if state != "dying":  # "gone" too: a host in another pid namespace sharing the directory is not ours to see
            return HostState(running=True, pid=pid)
        # a zombie: it will never answer, and its threads let go of the lock within moments; wait for that (or
        # an offline read would meet the lock still held), then say it was killed
        _wait_lock_dropped(data_dir, DYING_HOST_LOCK_WAIT_S)
    elif raw is None:
        return HostState(running=False, problem=f"no host is running on {data_dir.root}")
    else:
        state = _pid_state(pid) if pid is not None else "gone"
    if state == "alive":
        why = f"pid {pid} is alive but does not hold {data_dir.lock_path.name} (a reused pid)"
    else:
        why = f"pid {pid} is not running (the host was killed)"
    return HostState(running=False, stale_pid=pid,
                     problem=f"{path} is stale: {why}; the next `pi-host serve` replaces it")


def print_rpc_error(exc: RpcError, out: TextIO = sys.stderr) -> None:
    """The host's error: :func:`print_error` of its stable code, message and data."""
    print_error(exc.data_code, exc.message, exc.data, out)


def print_error(code: str, message: str, data: Mapping[str, Any], out: TextIO = sys.stderr) -> None:
    """``pi-host: CODE: message`` then one line per field error and per other detail."""
    print(f"pi-host: {code}: {message}", file=out)
    errors = data.get("errors")
    for err in errors if isinstance(errors, list) else []:
        if isinstance(err, dict):
            print(f"  {err.get('loc', '?')}: {err.get('msg', '')} ({err.get('type', '')})", file=out)
    for key, value in data.items():
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
        if not res["sessions"]:  # a person sees that the list is empty; stdout stays empty for a script
            print("no more sessions" if getattr(args, "cursor", None) else "no sessions", file=sys.stderr)
        if res.get("nextCursor"):  # on stderr: the listing on stdout stays one session a line
            print(f"pi-host: more sessions: {_next_page_command(args, res['nextCursor'])}", file=sys.stderr)


def _next_page_command(args: argparse.Namespace, cursor: str) -> str:
    """``pi-host [--data-dir D | --dev] sessions [--limit N] --cursor C``: the next page of what was asked, to
    paste as it is (without the data directory it would list another one's)."""
    words = ["pi-host"]
    if getattr(args, "data_dir", None):
        words += ["--data-dir", str(args.data_dir)]
    elif getattr(args, "dev", False):
        words.append("--dev")
    words.append("sessions")
    if args.limit != SESSIONS_PAGE:
        words += ["--limit", str(args.limit)]
    return shlex.join([*words, "--cursor", cursor])


def _block_text(block: Mapping[str, Any]) -> str | None:
    """One block as ``show`` prints it; None: nothing to print (thinking)."""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "thinking":
        return None
    if kind == "tool_call":
        args = json.dumps(block.get("args", {}), ensure_ascii=False, sort_keys=True)
        if len(args) > 120:
            args = args[:117] + "..."
        status = f" [{block['status']}]" if block.get("status") else ""
        return f"tool {block.get('name', '?')} {args}{status}"
    if kind == "attachment":
        return f"[{block.get('kind') or 'attachment'} {block.get('name', '')}]".replace(" ]", "]")
    return f"[{kind or '?'}]"


def print_window(res: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        _dump(res)
        return
    messages = res["messages"]
    # one numbering: the rows' own seq (#1 is the first message; the wire's messageStart is seq - 1)
    span = (f"messages #{messages[0].get('seq')}-#{messages[-1].get('seq')} of {res['totalMessages']}" if messages
            else f"no messages (of {res['totalMessages']})")
    print(f"# {res['session'].get('title') or res['session']['id']}  ({span})")
    for m in messages:
        # a row is the transcript line as it is: one damaged (or written by hand) may hold anything there
        raw_blocks, raw_meta = m.get("blocks"), m.get("meta")
        blocks = [b for b in raw_blocks if isinstance(b, Mapping)] if isinstance(raw_blocks, list) else []
        parts = [t for t in map(_block_text, blocks) if t]
        plain = all(b.get("type") in ("text", "thinking") for b in blocks)
        text = (" " if plain else " | ").join(parts)  # tool calls and attachments set apart from the text
        meta = raw_meta if isinstance(raw_meta, Mapping) else {}
        mark = " [interrupted]" if meta.get("interrupted") else ""
        if meta.get("agentName") or meta.get("parentToolCallId"):  # a subagent's row (§4.7a), not the user's
            mark += f" [subagent {meta.get('agentName') or meta.get('parentToolCallId')}]"
        if m.get("deleted"):  # tombstoned (e.g. an import's off-branch message): never shown as current
            mark += " [deleted]"
        role = str(m.get("role"))
        if role == "tool" and m.get("toolName"):  # a tool's result row: say which tool
            role = f"tool {m['toolName']}"
        print(f"[{m.get('seq')}] {role}{mark}: {text}")


def print_search(res: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        _dump(res)
        return
    if not res["results"]:
        print(f"no sessions match {args.query!r}", file=sys.stderr)
    for r in res["results"]:
        print(f"{r['sessionId']}  {r.get('messageMatches', 0)} matches  {r.get('title') or ''}")
        for snip in r.get("snippets", []):
            print(f"    [{snip.get('seq')}] {snip.get('role')}: {snip.get('snippet')}")
    if res.get("nextCursor"):  # on stderr, as `sessions` says it: the listing on stdout stays as it is
        print(f"pi-host: {len(res['results'])} of {res.get('totalSessions')} matching sessions shown "
              "(--limit: up to 100)", file=sys.stderr)


def _duration(ms: int) -> str:
    seconds = max(0, int(ms) // 1000)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [f"{days}d"] * bool(days) + [f"{hours}h"] * bool(hours) + [f"{minutes}m"] * bool(minutes)
    return " ".join([*parts, f"{seconds}s"] if not parts or seconds else parts)


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def print_status(res: dict[str, Any], args: argparse.Namespace) -> None:
    """``status``: a few lines for a person (``--json``: the whole ``host.status`` result, unchanged)."""
    if args.json:
        _dump(res)
        return
    actors, writer, boot = res.get("actors") or {}, res.get("dbWriter") or {}, res.get("boot") or {}
    print(f"pi-host {res.get('version')}  up {_duration(res.get('uptimeMs', 0))}  boot {res.get('bootId')}")
    print(f"actors: {actors.get('total', 0)} ({actors.get('sessions', 0)} sessions), "
          f"{actors.get('restarts', 0)} restarts; DB writer queue {writer.get('queueDepth', 0)} "
          f"(peak {writer.get('peakDepth', 0)}), {writer.get('batches', 0)} batches")
    gateway, index = res.get("gateway"), res.get("index")
    if gateway is not None or index is not None:
        conns = gateway.get("connections", 0) if gateway is not None else 0
        parts = [f"gateway: {conns} connection{'' if conns == 1 else 's'}"] if gateway is not None else []
        if index is not None:
            parts.append(f"index {index.get('lagOps', 0)} ops behind")
        print("; ".join(parts))
    disk = res.get("disk")
    line = f"data dir: {_size(res.get('dataDirBytes', 0))}"
    if disk is not None:
        line += f"; disk {_size(disk.get('freeBytes', 0))} free" + (" (LOW)" if disk.get("warning") else "")
    print(line)
    database = boot.get("database") or {}
    if database.get("createdFresh") and not database.get("rebuilt") and not boot.get("sessionsScanned"):
        stop = "first start (a new data directory)"  # no previous run: nothing was recovered (as serve says)
    else:
        stop = "last stop " + ("clean" if boot.get("cleanShutdown") else "unclean (recovered)")
    print(f"boot: {stop}, {boot.get('sessionsScanned', 0)} sessions scanned in "
          f"{boot.get('durationMs', 0)} ms, {boot.get('inflightPromoted', 0)} in-flight promoted, "
          f"{boot.get('turnsAborted', 0)} turns aborted" + ("; index rebuilt" if boot.get("dbRebuilt") else ""))


def print_result(command: str, res: dict[str, Any], args: argparse.Namespace) -> None:
    """A read's result, the same for a host's answer and an offline read."""
    if command == "status":
        print_status(res, args)
    elif command == "sessions":
        print_sessions(res, args)
    elif command == "show":
        print_window(res, args)
    else:
        print_search(res, args)


OFFLINE_COMMANDS = frozenset({"sessions", "show", "search"})
"""The reads that work without a host (:mod:`runtime.cli_offline`)."""


# -- stop ---------------------------------------------------------------------------------
def stop_host(data_dir: DataDir, timeout: float) -> int:
    """SIGTERM the host named by ``host.json``; wait for its clean-shutdown marker."""
    state = find_host(data_dir)
    if not state.running:
        print(f"pi-host: nothing to stop: {state.problem}", file=sys.stderr)
        return EXIT_NO_HOST
    if state.pid is None:  # never kill(0 or -1, ...): those signal a process group or every process
        print(f"pi-host: cannot stop the host on {data_dir.root}: {data_dir.host_json_path} names no process id",
              file=sys.stderr)
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
        if _pid_state(pid) != "alive" or not lock_held(data_dir):
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
