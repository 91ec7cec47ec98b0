"""``pi-host``: run the host, or talk to a running one.

    pi-host serve [--data-dir D | --dev] [--port N] [--host H] [--allow-origin O ...]
    pi-host status | sessions | show SESSION | search QUERY  [--json]   (reads work offline too)
    pi-host follow SESSION [--json]      tail a session's events
    pi-host stop [--timeout S]           SIGTERM the host, wait for its clean shutdown
    pi-host open                         the browser inspector, logged in with a one-time code
    pi-host agent ... | chat [SESSION]   the reference sidecar and the terminal chat (pihost-client)
    pi-host completion bash|zsh          shell completion
    pi-host import claude-code|codex|pi|opencode|pi-host [PATH] [--dry-run] [--json]
    pi-host export SESSION [--format md|html|jsonl] [--out FILE] [--include-thinking] [--include-secrets]
    pi-host settings get [KEY] | set KEY JSON | delete KEY  [--ns NS]   (app: a field of the settings blob)
    pi-host providers | models [--provider ID]
    pi-host doctor [--repair] [--json] [--data-dir D]   (offline; exit 0 clean, 1 repairable/repaired,
                                                        2 damage it cannot repair, 3 refused: host running)

--dev (any command) uses the development root ~/.pi-desktop-dev instead of the
packaged app's ~/.pi-desktop; --data-dir and $PI_DESKTOP_DATA_DIR still win.
Without a command it prints this help. Exit codes: 0 ok, 1 an error the host
answered (its code, message and field details are printed), 2 no host, 3 the
data directory is in use, 4 actors kept crashing, 5 the data directory could
not be opened (e.g. a refused migration), 6 the port is in use, 128+N (130 for
SIGINT, 143 for SIGTERM) signal N stopped `serve` during boot, before it served
anything (no clean-shutdown marker: the next start reports an unclean stop).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import trio

from protocol.methods import PROTOCOL_VERSION
from runtime.boot import BootInterrupted
from runtime.config import DEFAULT_PORT, HostConfig
from runtime.datadir import DataDir, DataDirLocked, DataDirUnsafe
from runtime.host import VERSION, Shutdown
from runtime.kernel.supervisor import RestartIntensityExceeded
from store.errors import StoreError
from store.interchange.importers import SOURCES

log = logging.getLogger("pi_host")


def _parser() -> argparse.ArgumentParser:
    data_dir_help = "data directory (default: $PI_DESKTOP_DATA_DIR, else ~/.pi-desktop, or with --dev " \
                    "~/.pi-desktop-dev)"
    dev_help = "a development build: default to ~/.pi-desktop-dev, never the desktop app's ~/.pi-desktop"
    ap = argparse.ArgumentParser(prog="pi-host", description="pi-host: durable local store for agent sessions")
    ap.add_argument("--data-dir", help=data_dir_help)
    ap.add_argument("--dev", action="store_true", help=dev_help)
    ap.add_argument("--version", action="version", version=f"pi-host {VERSION} (protocol {PROTOCOL_VERSION})")
    # --data-dir is accepted before or after the command (`pi-host serve --data-dir D`).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", default=argparse.SUPPRESS, help=data_dir_help)
    common.add_argument("--dev", action="store_true", default=argparse.SUPPRESS, help=dev_help)
    sub = ap.add_subparsers(dest="command")
    serve = sub.add_parser("serve", help="run the host in the foreground", parents=[common])
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--allow-origin", action="append", default=[], help="browser Origin to accept")
    serve.add_argument("--idle-timeout", type=float, default=300.0, help="session actor idle passivation (s)")
    serve.add_argument("--synchronous", choices=["FULL", "NORMAL"], default=None,
                       help="force one SQLite synchronous mode (benchmarks)")
    serve.add_argument("--search-upkeep-after", type=float, default=2.0, metavar="SECONDS",
                       help="merge search index segments once the DB writer is idle this long (0 = never)")
    serve.add_argument("--native-pi-root", metavar="DIR", default=None,
                       help="list the pi sessions under DIR read-only as native-pi:<id> sessions")
    serve.add_argument("--quiet", action="store_true", help="no human log lines on stderr")
    serve.add_argument("--import-root", action="append", default=[], metavar="DIR",
                       help="a folder attachments.importFile may read (besides the session's project and scratch/)")
    serve.add_argument("--disk-warn-below", type=int, default=512 * 1024 * 1024, metavar="BYTES",
                       help="host.status warns when the data directory's disk has less free space")
    _add_client_commands(sub, common)
    imp = sub.add_parser("import", help="import another agent's sessions into the running host", parents=[common])
    imp.add_argument("source", choices=list(SOURCES))
    imp.add_argument("path", nargs="?", default=None, help="default: the tool's usual root")
    imp.add_argument("--dry-run", action="store_true", help="parse and report; write nothing")
    imp.add_argument("--json", action="store_true", help="print the whole result as JSON")
    exp = sub.add_parser("export", help="export a session (secrets and thinking left out unless asked)",
                         parents=[common])
    exp.add_argument("session")
    exp.add_argument("--format", choices=["md", "html", "jsonl"], default="md")
    exp.add_argument("--out", default=None, metavar="FILE", help="a new file (default: stdout)")
    exp.add_argument("--include-thinking", action="store_true")
    exp.add_argument("--include-secrets", action="store_true")
    _config_parsers(sub, common)
    doctor = sub.add_parser("doctor", help="check a stopped host's data directory (exit 0 clean, 1 repairable "
                            "or repaired, 2 damage it cannot repair, 3 refused)", parents=[common])
    doctor.add_argument("--repair", action="store_true", help="repair what can be repaired from the files")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    return ap


def _add_client_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """status / sessions / show / search / follow / stop / open / agent / chat / completion."""
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print the result as JSON")
    sub.add_parser("status", help="host.status of the running host", parents=[common, as_json])
    sessions = sub.add_parser("sessions", help="list sessions (offline when no host runs)", parents=[common, as_json])
    sessions.add_argument("--limit", type=int, default=200)
    sessions.add_argument("--ids", action="store_true", help=argparse.SUPPRESS)  # shell completion
    show = sub.add_parser("show", help="print a session's newest messages (offline when no host runs)",
                          parents=[common, as_json])
    show.add_argument("session")
    show.add_argument("--limit", type=int, default=20)
    show.add_argument("--before", type=int, default=None, help="page back: end the window before this position")
    search = sub.add_parser("search", help="search every session (offline when no host runs)",
                            parents=[common, as_json])
    search.add_argument("query")
    search.add_argument("--limit", type=int, default=20)
    follow = sub.add_parser("follow", help="tail a session's events (Ctrl-C stops)", parents=[common, as_json])
    follow.add_argument("session")
    stop = sub.add_parser("stop", help="stop the running host cleanly (SIGTERM, wait for clean-shutdown)",
                          parents=[common])
    stop.add_argument("--timeout", type=float, default=30.0, help="seconds to wait")
    opener = sub.add_parser("open", help="open the browser inspector with a one-time login code", parents=[common])
    opener.add_argument("--print", action="store_true", help="print the URL instead of starting a browser")
    for name, text in (("agent", "the reference agent sidecar (see `pi-host agent --help`)"),
                       ("chat", "a terminal chat (see `pi-host chat --help`)")):
        delegated = sub.add_parser(name, help=text, add_help=False, parents=[common])
        delegated.add_argument("rest", nargs=argparse.REMAINDER)
    completion = sub.add_parser("completion", help="print a shell completion script")
    completion.add_argument("shell", choices=["bash", "zsh"])


def _config_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """``settings get|set|delete``, ``providers``, ``models``."""
    cfg = sub.add_parser("settings", help="read or change settings (kv namespaces)", parents=[common])
    verbs = cfg.add_subparsers(dest="verb", required=True)
    get = verbs.add_parser("get", help="one key, or every key of the namespace", parents=[common])
    get.add_argument("key", nargs="?")
    put = verbs.add_parser("set", help="set KEY to a JSON value (a bare word is a string)", parents=[common])
    put.add_argument("key")
    put.add_argument("value")
    rm = verbs.add_parser("delete", help="remove KEY", parents=[common])
    rm.add_argument("key")
    for verb in (get, put, rm):
        verb.add_argument("--ns", default="app", help="namespace (default app: the settings blob)")
    sub.add_parser("providers", help="list providers (never their keys)", parents=[common])
    models = sub.add_parser("models", help="list the model catalog", parents=[common])
    models.add_argument("--provider", help="one provider's models")


EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE, what a shell reports for a program whose reader went away."""


def main(argv: list[str] | None = None) -> int:
    """Run one command; a reader that goes away (``pi-host sessions | head``) ends it quietly."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # a block-buffered pipe fails here, not at interpreter exit
        return code
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _main(argv: list[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    delegated = _delegated(raw)
    if delegated is not None:
        return delegated
    parser = _parser()
    args = parser.parse_args(raw)
    if args.command is None:
        parser.print_help()
        return 2
    data_dir, args.root_source = DataDir.locate(args.data_dir, os.environ, dev=args.dev)
    command = args.command
    if command == "serve":
        return _serve(args, data_dir)
    if command == "doctor":
        return _doctor(args, data_dir)
    if command == "completion":
        from runtime.cli_completion import completion_script

        print(completion_script(parser, args.shell), end="")
        return 0
    if command == "stop":
        from runtime.cli_client import stop_host

        return stop_host(data_dir, args.timeout)
    if command == "open":
        from runtime.cli_open import open_inspector

        return open_inspector(data_dir, print_only=bool(args.print))
    if command in ("import", "export"):
        from runtime.import_cli import resolve_root

        if command == "import":
            args.root = resolve_root(args.source, args.path)
        if command == "export" and args.out is not None:
            args.out = os.path.abspath(args.out)
        return trio.run(_config_client, command, args, data_dir)
    if command in ("settings", "providers", "models"):
        return trio.run(_config_client, command, args, data_dir)
    from runtime.cli_client import run_client_command

    code: int = run_client_command(command, args, data_dir)
    return code


def _delegated(raw: list[str]) -> int | None:
    """``pi-host [--data-dir D | --dev] agent|chat ...`` runs the pihost-client program with the rest.

    ``--dev`` becomes ``--data-dir`` of the development root (the client knows only ``--data-dir``).
    """
    global_args: list[str] = []
    dev = False
    i = 0
    while i < len(raw) and (raw[i].startswith("--data-dir") or raw[i] == "--dev"):
        if raw[i] == "--dev":
            dev, i = True, i + 1
            continue
        step = 1 if "=" in raw[i] else 2
        global_args += raw[i:i + step]
        i += step
    if i >= len(raw) or raw[i] not in ("agent", "chat"):
        return None
    if dev and not global_args:
        global_args = ["--data-dir", str(DataDir.resolve(None, os.environ, dev=True).root)]
    name, rest = raw[i], raw[i + 1:]
    try:
        module = importlib.import_module(f"pihost_client.{name}")
    except ImportError:
        print(f"pi-host: `{name}` needs the pihost-client package: pip install -e 'clients/python[chat]'",
              file=sys.stderr)
        return 1
    code: int = module.main([*global_args, *rest])
    return code


def _doctor(args: argparse.Namespace, data_dir: DataDir) -> int:
    """Offline check (and repair) under the data directory's lock: a running host makes it refuse."""
    import time

    from runtime.datadir import DataDirLock
    from runtime.doctor_cli import ProgressBar, render, render_json
    from store.doctor.doctor import run_doctor

    if not data_dir.root.is_dir():
        print(f"pi-host doctor: {data_dir.root} is not a directory", file=sys.stderr)
        return 3
    lock = DataDirLock(data_dir)
    try:
        lock.acquire()
    except DataDirLocked as exc:
        print(f"pi-host doctor: refusing: {exc}; stop it first (doctor works on a stopped host's data)",
              file=sys.stderr)
        return 3
    try:
        bar = ProgressBar(sys.stdout) if sys.stdout.isatty() and not args.json else None
        try:
            report = run_doctor(data_dir, repair=args.repair, now_ms=time.time_ns() // 1_000_000, progress=bar)
        finally:
            if bar is not None:
                bar.clear()
    finally:
        lock.release()
    print(render_json(report) if args.json else render(report))
    return report.exit_code


def _serve(args: argparse.Namespace, data_dir: DataDir) -> int:
    from runtime.host import run_host
    from runtime.logs import setup_logging
    from runtime.process import raise_fd_limit, tune_allocator

    # The first line says which default root (seed §2, D599: a packaged app and a dev build run side by
    # side); a root given by --data-dir or PI_DESKTOP_DATA_DIR is named by the "listening" line.
    if args.root_source in ("packaged", "dev"):
        print(DataDir.describe(data_dir.root, args.root_source), file=sys.stderr, flush=True)
    try:
        data_dir.ensure()
    except DataDirUnsafe as exc:
        print(f"pi-host: {exc}", file=sys.stderr)
        return 2
    setup_logging(data_dir.logs_dir, stderr=not args.quiet)
    tune_allocator()
    raise_fd_limit()
    config = HostConfig(
        data_dir=data_dir,
        host=args.host,
        port=args.port,
        allowed_origins=frozenset(args.allow_origin),
        session_idle_timeout=args.idle_timeout,
        synchronous=args.synchronous,
        search_upkeep_after=args.search_upkeep_after if args.search_upkeep_after > 0 else None,
        import_roots=tuple(os.path.abspath(r) for r in args.import_root),
        disk_warn_below_bytes=args.disk_warn_below,
        native_pi_root=Path(args.native_pi_root).resolve() if args.native_pi_root else None,
    )

    signals_seen: list[int] = []

    async def main_async() -> None:
        # The receiver is open before the host starts and stays open through the
        # shutdown: a signal during boot stops it before its next step; once serving,
        # the first signal asks for an orderly stop, a second one hurries it.
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            shutdown = Shutdown()
            serving = trio.Event()
            async with trio.open_nursery() as nursery:

                async def host(*, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
                    await run_host(config, task_status=task_status, shutdown=shutdown)
                    nursery.cancel_scope.cancel()  # the host stopped: stop forwarding signals too

                nursery.start_soon(_forward_signals, signals, shutdown, serving, signals_seen)
                running = await nursery.start(host)
                serving.set()
                print(f"pi-host listening on {running.url} (data dir {data_dir.root})", flush=True)
                log.info("listening", extra={"url": running.url, "dataDir": str(data_dir.root)})

    try:
        trio.run(main_async)
    except BaseExceptionGroup as group:
        interrupted, _rest = group.split(BootInterrupted)
        if interrupted is None or not signals_seen:
            code = _serve_failure(group, args)
            if code is None:
                raise
            return code
        step = _leaves(interrupted)[0]
        name = signal.Signals(signals_seen[0]).name
        log.warning("stopping during boot: %s (%s); nothing was served", step, name)
        print(f"pi-host: stopping during boot ({name}): {step}; nothing was served", file=sys.stderr)
        return 128 + signals_seen[0]
    except RestartIntensityExceeded as exc:
        log.error("restart intensity exceeded; shutting down", extra={"error": str(exc)})
        print(f"pi-host: actors kept crashing, shut down: {exc}", file=sys.stderr)
        return 4
    except (DataDirLocked, DataDirUnsafe, StoreError, OSError) as exc:
        code = _serve_failure(exc, args)
        if code is None:
            raise
        return code
    print("pi-host stopped cleanly", file=sys.stderr)
    return 0


def _serve_failure(exc: BaseException, args: argparse.Namespace) -> int | None:
    """One line for the ways a start fails that a user can fix; None: a bug (traceback)."""
    leaves = _leaves(exc)
    for leaf in leaves:
        if isinstance(leaf, DataDirLocked):
            print(f"pi-host: {leaf}", file=sys.stderr)
            return 3
    for leaf in leaves:
        if isinstance(leaf, DataDirUnsafe):
            print(f"pi-host: {leaf}", file=sys.stderr)
            return 2
    for leaf in leaves:
        if isinstance(leaf, RestartIntensityExceeded):
            print("pi-host: actors kept crashing, shut down", file=sys.stderr)
            return 4
    for leaf in leaves:
        if isinstance(leaf, StoreError):
            print(f"pi-host: cannot open the data directory: {leaf.code}: {leaf.message}", file=sys.stderr)
            return 5
    for leaf in leaves:
        if isinstance(leaf, OSError) and leaf.errno == errno.EADDRINUSE:
            print(f"pi-host: port {args.port} on {args.host} is already in use; stop what listens there "
                  f"or pick another port (--port 0 picks a free one)", file=sys.stderr)
            return 6
    return None


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


async def _forward_signals(signals: Any, shutdown: Shutdown, serving: trio.Event, seen: list[int]) -> None:
    count = 0
    async for signum in signals:
        count += 1
        seen.append(int(signum))
        if not serving.is_set():  # boot stops before its next step; run_host raises BootInterrupted
            log.info("stop asked for before the host serves", extra={"signal": int(signum)})
            shutdown.request()
        elif count == 1:
            log.info("shutting down", extra={"signal": int(signum)})
            print("pi-host: shutting down (a second signal skips the waits)", file=sys.stderr, flush=True)
            shutdown.request()
        else:
            log.info("shutting down now", extra={"signal": int(signum)})
            shutdown.hurry()


async def _config_client(command: str, args: argparse.Namespace, data_dir: DataDir) -> int:
    """``settings`` / ``providers`` / ``models`` / ``import`` / ``export`` on the running host."""
    from runtime.cli_client import find_host, print_rpc_error
    from runtime.client import ClientClosed, RpcError, open_client, read_host_info

    state = find_host(data_dir)
    if not state.running:
        print(f"pi-host: {state.problem}", file=sys.stderr)
        return 2
    try:
        info = read_host_info(data_dir.root)
        async with open_client(info.url, info.token, client_id=f"cli-{os.getpid()}", client_kind="cli") as c:
            if command == "import":
                from runtime.import_cli import run_import

                code: int = await run_import(c, args.source, args.root, dry_run=args.dry_run, as_json=args.json,
                                             out=sys.stdout)
                return code
            if command == "export":
                from runtime.export_cli import run_export

                code = await run_export(c, args.session, fmt=args.format, out_file=args.out,
                                        include_thinking=args.include_thinking,
                                        include_secrets=args.include_secrets, out=sys.stdout)
                return code
            await _config_command(c, command, args)
    except RpcError as exc:
        print_rpc_error(exc)
        return 1
    except (ClientClosed, OSError) as exc:
        print(f"pi-host: the host did not answer ({exc})", file=sys.stderr)
        return 2
    return 0


def _json_arg(text: str) -> Any:
    """A JSON value; anything that is not JSON is taken as a string (``set language en``)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


async def _config_command(c: Any, command: str, args: argparse.Namespace) -> None:
    if command == "settings":
        if args.verb == "get" and args.key is None:
            _print((await c.call("settings.getAll", {"ns": args.ns}))["values"])
        elif args.verb == "get":
            _print((await c.call("settings.get", {"ns": args.ns, "key": args.key})).get("value"))
        elif args.verb == "set":
            res = await c.call("settings.set", {"ns": args.ns, "key": args.key, "value": _json_arg(args.value)})
            _print(res.get("value"))
        else:
            res = await c.call("settings.delete", {"ns": args.ns, "key": args.key})
            print("deleted" if res["deleted"] else "not set")
    elif command == "providers":
        for p in (await c.call("providers.list", {}))["providers"]:
            key = "key set" if p["hasApiKey"] else "no key"
            owner = f"  (plugin {p['ownerPluginId']})" if p.get("ownerPluginId") else ""
            state = "" if p["enabled"] else "  disabled"
            print(f"{p['id']}  {p['name']}  {p.get('baseUrl') or '-'}  {key}{state}{owner}")
    else:
        params = {"providerId": args.provider} if args.provider else {}
        for mdl in (await c.call("models.list", params))["models"]:
            flags = " deprecated" if mdl["deprecated"] else ""
            print(f"{mdl['providerId']}/{mdl['modelId']}  {mdl['displayName']}  [{mdl['source']}]{flags}")


def _print(obj: Any) -> None:
    print(json.dumps(obj, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    sys.exit(main())
