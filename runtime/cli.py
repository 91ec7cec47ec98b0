"""``pi-host``: run the host, or talk to a running one.

    pi-host serve [--data-dir D] [--port N] [--host H] [--allow-origin O ...]
    pi-host status | sessions | show SESSION [--limit N] | search QUERY [--data-dir D]
    pi-host import claude-code|codex|pi|opencode|pi-host [PATH] [--dry-run] [--json]
    pi-host export SESSION [--format md|html|jsonl] [--out FILE] [--include-thinking] [--include-secrets]
    pi-host settings get [KEY] | set KEY JSON | delete KEY  [--ns NS]   (app: a field of the settings blob)
    pi-host providers | models [--provider ID]
    pi-host doctor [--repair] [--json] [--data-dir D]   (offline; exit 0 clean, 1 repairable/repaired,
                                                        2 damage it cannot repair, 3 refused: host running)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import trio

from runtime.config import DEFAULT_PORT, HostConfig
from runtime.datadir import DataDir, DataDirLocked, DataDirUnsafe
from store.importers import SOURCES

log = logging.getLogger("pi_host")


def _parser() -> argparse.ArgumentParser:
    data_dir_help = "data directory (default: $PI_DESKTOP_DATA_DIR or ~/.pi-desktop)"
    ap = argparse.ArgumentParser(prog="pi-host", description="pi-host: durable local store for agent sessions")
    ap.add_argument("--data-dir", help=data_dir_help)
    # --data-dir is accepted before or after the command (`pi-host serve --data-dir D`).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", default=argparse.SUPPRESS, help=data_dir_help)
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
    sub.add_parser("status", help="host.status of the running host", parents=[common])
    sub.add_parser("sessions", help="list sessions", parents=[common])
    show = sub.add_parser("show", help="print a session's newest messages", parents=[common])
    show.add_argument("session")
    show.add_argument("--limit", type=int, default=20)
    search = sub.add_parser("search", help="search every session", parents=[common])
    search.add_argument("query")
    search.add_argument("--limit", type=int, default=20)
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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    data_dir = DataDir.resolve(args.data_dir, os.environ)
    command = args.command or "serve"
    if command == "serve":
        if not hasattr(args, "port"):
            args = _parser().parse_args([*(argv or sys.argv[1:]), "serve"])
        return _serve(args, data_dir)
    if command == "doctor":
        return _doctor(args, data_dir)
    if command == "import":
        from runtime.import_cli import resolve_root

        args.root = resolve_root(args.source, args.path)
    if command == "export" and args.out is not None:
        args.out = os.path.abspath(args.out)
    return trio.run(_client_command, command, args, data_dir)


def _doctor(args: argparse.Namespace, data_dir: DataDir) -> int:
    """Offline check (and repair) under the data directory's lock: a running host makes it refuse."""
    import time

    from runtime.datadir import DataDirLock
    from runtime.doctor_cli import ProgressBar, render, render_json
    from store.doctor import run_doctor

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
    from runtime.kernel.supervisor import RestartIntensityExceeded
    from runtime.logs import setup_logging
    from runtime.process import raise_fd_limit, tune_allocator

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

    async def main_async() -> None:
        # The receiver is open before the host starts and stays open through the
        # shutdown: the first signal asks for an orderly stop, a second one hurries it.
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def host(*, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
                    await run_host(config, task_status=task_status)
                    nursery.cancel_scope.cancel()  # the host stopped: stop forwarding signals too

                running = await nursery.start(host)
                print(f"pi-host listening on {running.url} (data dir {data_dir.root})", flush=True)
                log.info("listening", extra={"url": running.url, "dataDir": str(data_dir.root)})
                nursery.start_soon(_forward_signals, signals, running.shutdown)

    try:
        trio.run(main_async)
    except DataDirLocked as exc:
        print(f"pi-host: {exc}", file=sys.stderr)
        return 3
    except DataDirUnsafe as exc:
        print(f"pi-host: {exc}", file=sys.stderr)
        return 2
    except RestartIntensityExceeded as exc:
        log.error("restart intensity exceeded; shutting down", extra={"error": str(exc)})
        print(f"pi-host: actors kept crashing, shut down: {exc}", file=sys.stderr)
        return 4
    except BaseExceptionGroup as group:
        locked = group.subgroup(DataDirLocked)
        if locked is not None:
            print(f"pi-host: {locked.exceptions[0]}", file=sys.stderr)
            return 3
        unsafe = group.subgroup(DataDirUnsafe)
        if unsafe is not None:
            print(f"pi-host: {unsafe.exceptions[0]}", file=sys.stderr)
            return 2
        if group.subgroup(RestartIntensityExceeded) is not None:
            print("pi-host: actors kept crashing, shut down", file=sys.stderr)
            return 4
        raise
    print("pi-host stopped cleanly", file=sys.stderr)
    return 0


async def _forward_signals(signals: Any, shutdown: Any) -> None:
    count = 0
    async for signum in signals:
        count += 1
        if count == 1:
            log.info("shutting down", extra={"signal": int(signum)})
            print("pi-host: shutting down (a second signal skips the waits)", file=sys.stderr, flush=True)
            shutdown.request()
        else:
            log.info("shutting down now", extra={"signal": int(signum)})
            shutdown.hurry()


async def _client_command(command: str, args: argparse.Namespace, data_dir: DataDir) -> int:
    from runtime.client import RpcError, open_client, read_host_info

    try:
        info = read_host_info(data_dir.root)
    except (OSError, ValueError) as exc:
        print(f"pi-host: no running host found in {data_dir.root} ({exc})", file=sys.stderr)
        return 2
    try:
        async with open_client(info.url, info.token, client_id=f"cli-{os.getpid()}", client_kind="cli") as c:
            if command == "status":
                _print(await c.call("host.status", {}))
            elif command == "sessions":
                res = await c.call("session.list", {"limit": 200})
                for s in res["sessions"]:
                    title = s.get("title") or "(untitled)"
                    print(f"{s['id']}  {s['messageCount']:>6} msgs  {title}")
            elif command == "show":
                res = await c.call("session.get", {"sessionId": args.session, "messageLimit": args.limit})
                print(f"# {res['session'].get('title') or res['session']['id']}  "
                      f"(messages {res['messageStart']}-{res['messageEnd']} of {res['totalMessages']})")
                for m in res["messages"]:
                    text = " ".join(b.get("text", "") for b in m.get("blocks", []) if b.get("type") == "text")
                    if not text:
                        text = ", ".join(b.get("type", "?") for b in m.get("blocks", []))
                    print(f"[{m.get('seq')}] {m.get('role')}: {text}")
            elif command == "import":
                from runtime.import_cli import run_import

                return await run_import(c, args.source, args.root, dry_run=args.dry_run, as_json=args.json,
                                        out=sys.stdout)
            elif command == "export":
                from runtime.export_cli import run_export

                return await run_export(c, args.session, fmt=args.format, out_file=args.out,
                                        include_thinking=args.include_thinking,
                                        include_secrets=args.include_secrets, out=sys.stdout)
            elif command == "search":
                res = await c.call("search.sessions", {"query": args.query, "limit": args.limit})
                for r in res["results"]:
                    print(f"{r['sessionId']}  {r.get('messageMatches', 0)} matches  {r.get('title') or ''}")
                    for snip in r.get("snippets", []):
                        print(f"    [{snip.get('seq')}] {snip.get('role')}: {snip.get('snippet')}")
            elif command in ("settings", "providers", "models"):
                await _config_command(c, command, args)
    except RpcError as exc:
        print(f"pi-host: {exc}", file=sys.stderr)
        return 1
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
