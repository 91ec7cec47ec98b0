"""``pi-host``: run the host, or talk to a running one.

    pi-host serve [--data-dir D | --dev] [--port N] [--host H] [--allow-origin O ...]
    pi-host status | sessions [--cursor C] | show SESSION | search QUERY  [--json]   (reads work offline too)
    pi-host follow SESSION [--json]      tail a session's events; says when it waits for a host (Ctrl-C: 130,
                                         the session deleted: 1)
    pi-host stop [--timeout S]           SIGTERM the host, wait for its clean shutdown
    pi-host open                         the browser inspector, logged in with a one-time code
    pi-host agent ... | chat [SESSION]   the reference sidecar and the terminal chat (pihost-client)
    pi-host completion bash|zsh          shell completion
    pi-host types --out DIR              the protocol's TypeScript types and JSON Schema, for a UI project
    pi-host import claude-code|codex|pi|opencode|pi-host [PATH] [--dry-run] [--json]
    pi-host export SESSION [--format md|html|jsonl] [--out FILE] [--include-thinking] [--include-secrets]
    pi-host settings get [KEY] | set KEY JSON | delete KEY  [--ns NS]   (app: a field of the settings blob)
    pi-host providers | models [--provider ID]  [--json]
    pi-host doctor [--repair] [--json] [--data-dir D]   (offline; exit 0 clean, 1 repairable/repaired,
                                                        2 damage it cannot repair, 3 refused: host running,
                                                        or no pi-host data there)

--dev (any command) uses the development root ~/.pi-desktop-dev instead of the
packaged app's ~/.pi-desktop; --data-dir and $PI_DESKTOP_DATA_DIR still win.
Without a command it prints this help. Exit codes: 0 ok, 1 an error the host
answered (its code, message and field details are printed) or a setting that
is not set (`settings get KEY`: NOT_SET), 2 no host, or a command line argparse
refused (usage), 3 the data directory is in use, 4 actors kept crashing, 5 the
data directory could not be opened (e.g. a refused migration), 6 the port is in
use, 128+N (130 for SIGINT, 143 for SIGTERM) signal N stopped `serve` during
boot, before it served anything (no clean-shutdown marker: the next start
reports an unclean stop); 130 Ctrl-C stopped any other command, 141 its reader
went away (`| head`).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import ipaddress
import math
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from protocol.version import PROTOCOL_VERSION
from runtime.cli_client import EXIT_NO_HOST, OFFLINE_COMMANDS, SESSIONS_PAGE, find_host, stop_host
from runtime.cli_completion import completion_script
from runtime.config import DEFAULT_PORT
from runtime.datadir import DataDir
from runtime.version import VERSION

# This module parses and dispatches; it imports only what every command needs. A command's own
# module (and with it trio, the client, the store's readers or the whole host) is imported when
# that command runs: `serve` alone imports the host (runtime.cli_serve), and `--version`,
# `status`, `sessions`, `show`, `search`, `stop`, `completion` and `types` never do
# (tests/cli/test_fast_cli.py). No module imported here or below imports this one back.


class _ImportSources:
    """``pi-host import``'s choices, read from the importers when argparse first looks at them (parsing or
    printing the ``import`` command): no other command imports the importers' parsers."""

    def _names(self) -> tuple[str, ...]:
        from store.interchange.importers import SOURCES

        return SOURCES

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._names()


def _loopback_host(value: str) -> str:
    """``serve --host``: a loopback address or ``localhost`` only. A local WebSocket daemon bound to another
    interface is reachable from the network (RELIABILITY.md §5, CVE-2018-12120); the token alone is not meant
    to stand between the host and a network."""
    if value == "localhost":
        return value
    try:
        loopback = ipaddress.ip_address(value.strip("[]")).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise argparse.ArgumentTypeError(f"{value!r} is not a loopback address: the host listens on 127.0.0.1, "
                                         "::1 or localhost only")
    return value.strip("[]")


EXIT_CODES = ("exit codes: 0 ok, 1 an error the host answered (its code, message and field details are printed) or "
              "a setting that is not set (settings get KEY: NOT_SET), 2 no host, or a usage error, 3 the data "
              "directory is in use, 4 actors kept crashing, 5 the data directory could not be opened (e.g. a refused "
              "migration), 6 the port is in use, 128+N a signal stopped `serve` during boot (130 SIGINT, 143 "
              "SIGTERM), 130 Ctrl-C stopped another command, 141 its reader went away (| head); `doctor` and "
              "`follow` say their own in their help")


def _retention_days(value: str) -> int:
    """``serve --audit-retention-days``: whole days, 1 to 36500 (seed 003 §8: 90, configurable)."""
    try:
        days = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of days") from None
    if not 1 <= days <= 36_500:
        raise argparse.ArgumentTypeError(f"{days} days is out of range (1 to 36500)")
    return days


def _port(value: str) -> int:
    """``serve --port``: 0 (a free port) to 65535; 70000 listened on 70000 - 65536, -1 was a traceback."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 0 <= port <= 65_535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (0 to 65535; 0 picks a free one)")
    return port


def _seconds(*, above_zero: bool = False) -> Callable[[str], float]:
    """A number of seconds: finite, and not below zero (above zero when ``above_zero``); a negative ``stop
    --timeout`` sent SIGTERM and then said the host "did not stop within -1 s", and ``serve`` took a NaN or
    negative idle timeout as it came."""
    def seconds(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
        if not math.isfinite(number) or number < 0 or (above_zero and number == 0):
            raise argparse.ArgumentTypeError(f"{value} is not a number of seconds " +
                                             ("above 0" if above_zero else "of 0 or more"))
        return number
    return seconds


def _byte_count(value: str) -> int:
    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of bytes") from None
    if count < 0:
        raise argparse.ArgumentTypeError(f"{count} is not a number of bytes (0 or more)")
    return count


def _path(value: str) -> str:
    """A path to write to: not empty (``--out "$DIR"`` with DIR unset wrote into the current folder)."""
    if not value:
        raise argparse.ArgumentTypeError("an empty path (an unset variable?); name a file or folder")
    return value


def _parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; ``only``: the command the line names, the one subcommand built (each costs
    ~1 ms of a command's start: every argument makes a help formatter and asks gettext for its words)."""
    data_dir_help = "data directory (default: $PI_DESKTOP_DATA_DIR, else ~/.pi-desktop, or with --dev " \
                    "~/.pi-desktop-dev)"
    dev_help = "a development build: default to ~/.pi-desktop-dev, never the desktop app's ~/.pi-desktop"
    ap = argparse.ArgumentParser(prog="pi-host", description="pi-host: durable local store for agent sessions",
                                 epilog=EXIT_CODES)
    ap.add_argument("--data-dir", help=data_dir_help)
    ap.add_argument("--dev", action="store_true", help=dev_help)
    ap.add_argument("--version", action="version", version=f"pi-host {VERSION} (protocol {PROTOCOL_VERSION})")
    # --data-dir is accepted before or after the command (`pi-host serve --data-dir D`).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", default=argparse.SUPPRESS, help=data_dir_help)
    common.add_argument("--dev", action="store_true", default=argparse.SUPPRESS, help=dev_help)
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print the result as JSON")
    sub = ap.add_subparsers(dest="command")
    for name, build in _COMMANDS:
        if only is None or name == only:
            build(sub, common, as_json)
    return ap


def _command_named(argv: list[str]) -> str | None:
    """The command ``argv`` names, as the root parser finds it (its first positional word: not an option,
    not ``--data-dir``'s value); None when that is not one of the commands, or before it the line holds what
    the root parser answers itself (``--``, an unknown option, a prefix of one): the whole parser then."""
    takes_value = False
    for word in argv:
        if takes_value:
            takes_value = False
            continue
        if word == "--":
            return None
        if word.startswith("-"):
            if word.split("=", 1)[0] not in _ROOT_OPTIONS:
                return None  # a prefix of an option, an unknown one: the root parser's own answer
            takes_value = word == "--data-dir"
            continue
        return word if word in _COMMAND_NAMES and word != "completion" else None  # completion reads them all
    return None


def _serve_command(sub: Any, common: argparse.ArgumentParser, as_json: argparse.ArgumentParser) -> None:
    serve = sub.add_parser("serve", help="run the host in the foreground", parents=[common])
    serve.add_argument("--port", type=_port, default=DEFAULT_PORT,
                       help=f"port on the loopback address (default {DEFAULT_PORT}); 0 picks a free port")
    serve.add_argument("--host", type=_loopback_host, default="127.0.0.1",
                       help="loopback address to listen on (127.0.0.1, ::1 or localhost; nothing else)")
    serve.add_argument("--allow-origin", action="append", default=[], help="browser Origin to accept")
    serve.add_argument("--idle-timeout", type=_seconds(above_zero=True), default=300.0,
                       help="session actor idle passivation (s)")
    serve.add_argument("--synchronous", choices=["FULL", "NORMAL"], default=None,
                       help="force one SQLite synchronous mode (benchmarks)")
    serve.add_argument("--search-upkeep-after", type=_seconds(), default=2.0, metavar="SECONDS",
                       help="merge search index segments once the DB writer is idle this long (0 = never)")
    serve.add_argument("--integrity-sweep", type=_seconds(), default=3600.0, metavar="SECONDS",
                       help="check the index table by table while idle, a pass every SECONDS (0 = never)")
    serve.add_argument("--integrity-sweep-after", type=_seconds(), default=5.0, metavar="SECONDS",
                       help="each step of that check waits until the DB writer has been idle this long")
    serve.add_argument("--memory-trim-interval", type=_seconds(), default=10.0, metavar="SECONDS",
                       help="give the heap's free memory back to the system every SECONDS (0 = never)")
    serve.add_argument("--native-pi-root", metavar="DIR", default=None,
                       help="list the pi sessions under DIR read-only as native-pi:<id> sessions")
    serve.add_argument("--quiet", action="store_true", help="no human log lines on stderr")
    serve.add_argument("--keep-quarantined", action="store_true",
                       help="diagnostics: keep every quarantined copy of a corrupt index (default: the newest few)")
    serve.add_argument("--count-task-steps", action="store_true",
                       help="diagnostics: count the trio thread's task steps and I/O waits (host.status.trio)")
    serve.add_argument("--import-root", action="append", default=[], metavar="DIR",
                       help="a folder attachments.importFile may read (besides the session's project and scratch/)")
    serve.add_argument("--audit-retention-days", type=_retention_days, default=90, metavar="DAYS",
                       help="boot prunes audit log rows older than DAYS (1-36500, default 90)")
    serve.add_argument("--disk-warn-below", type=_byte_count, default=512 * 1024 * 1024, metavar="BYTES",
                       help="host.status warns when the data directory's disk has less free space")


def _status_command(sub: Any, common: argparse.ArgumentParser, as_json: argparse.ArgumentParser) -> None:
    status_help = "the running host's version, uptime, actors and boot recovery report, in brief (--json: the " \
                  "whole host.status result)"
    sub.add_parser("status", help=status_help, description=status_help, parents=[common, as_json])


def _sessions_command(sub: Any, common: argparse.ArgumentParser, as_json: argparse.ArgumentParser) -> None:
    sessions = sub.add_parser("sessions", help="list sessions, newest first, a page at a time (offline when no host "
                              "runs)", parents=[common, as_json])
    sessions.add_argument("--limit", type=int, default=SESSIONS_PAGE,
                          help=f"sessions per page (1-500, default {SESSIONS_PAGE})")
    sessions.add_argument("--cursor", default=None,
                          help="the next page: the cursor a page ended with (on stderr, or nextCursor with --json)")
    sessions.add_argument("--ids", action="store_true", help=argparse.SUPPRESS)  # shell completion


def _show_command(sub: Any, common: argparse.ArgumentParser, as_json: argparse.ArgumentParser) -> None:
    show = sub.add_parser("show", help="print a session's newest messages (offline when no host runs)",
                          parents=[common, as_json])
    show.add_argument("session")
    show.add_argument("--limit", type=int, default=20, help="messages to print, the newest (1-5000, default 20)")
    show.add_argument("--before", type=int, default=None, help="page back: end the window before this position")


def _search_command(sub: Any, common: argparse.ArgumentParser, as_json: argparse.ArgumentParser) -> None:
    search = sub.add_parser("search", help="search every session (offline when no host runs)",
                            parents=[common, as_json])
    search.add_argument("query")
    search.add_argument("--limit", type=int, default=20, help="matching sessions to print (1-100, default 20)")


def _follow_command(sub: Any, common: argparse.ArgumentParser, as_json: argparse.ArgumentParser) -> None:
    follow = sub.add_parser("follow", help="tail a session's events (Ctrl-C stops: exit 130)",
                            parents=[common, as_json], description=FOLLOW_DESCRIPTION)
    follow.add_argument("session")


def _stop_command(sub: Any, common: argparse.ArgumentParser, as_json: argparse.ArgumentParser) -> None:
    stop = sub.add_parser("stop", help="stop the running host cleanly (SIGTERM, wait for clean-shutdown)",
                          parents=[common])
    stop.add_argument("--timeout", type=_seconds(), default=30.0, help="seconds to wait (default 30)")


def _open_command(sub: Any, common: argparse.ArgumentParser, as_json: argparse.ArgumentParser) -> None:
    opener = sub.add_parser("open", help="open the browser inspector with a one-time login code", parents=[common])
    opener.add_argument("--print", action="store_true", help="print the URL instead of starting a browser")


def _delegated_command(name: str, text: str) -> Callable[[Any, argparse.ArgumentParser, argparse.ArgumentParser],
                                                          None]:
    """``agent`` and ``chat``: their own programs parse the rest of the line (:func:`_delegated`)."""
    def build(sub: Any, common: argparse.ArgumentParser, as_json: argparse.ArgumentParser) -> None:
        delegated = sub.add_parser(name, help=text, add_help=False, parents=[common])
        delegated.add_argument("rest", nargs=argparse.REMAINDER)
    return build


def _completion_command(sub: Any, common: argparse.ArgumentParser, as_json: argparse.ArgumentParser) -> None:
    completion = sub.add_parser("completion", help="print a shell completion script")
    completion.add_argument("shell", choices=["bash", "zsh"])


def _types_command(sub: Any, common: argparse.ArgumentParser, as_json: argparse.ArgumentParser) -> None:
    types = sub.add_parser("types", help="write the TypeScript types (protocol.ts) and the JSON Schema "
                           "(schema.json) of this pi-host's protocol into DIR, for a UI project")
    types.add_argument("--out", type=_path, required=True, metavar="DIR",
                       help="created if missing; the two files are replaced")


def _import_command(sub: Any, common: argparse.ArgumentParser, as_json: argparse.ArgumentParser) -> None:
    imp = sub.add_parser("import", help="import another agent's sessions into the running host", parents=[common])
    imp.add_argument("source", choices=_ImportSources(), metavar="SOURCE", help="%(choices)s")
    imp.add_argument("path", nargs="?", default=None, help="default: the tool's usual root")
    imp.add_argument("--dry-run", action="store_true", help="parse and report; write nothing")
    imp.add_argument("--json", action="store_true", help="print the whole result as JSON")


def _export_command(sub: Any, common: argparse.ArgumentParser, as_json: argparse.ArgumentParser) -> None:
    exp = sub.add_parser("export", help="export a session (secrets and thinking left out unless asked)",
                         parents=[common])
    exp.add_argument("session")
    exp.add_argument("--format", choices=["md", "html", "jsonl"], default="md")
    exp.add_argument("--out", type=_path, default=None, metavar="FILE", help="a new file (default: stdout)")
    exp.add_argument("--include-thinking", action="store_true")
    exp.add_argument("--include-secrets", action="store_true")


def _settings_command(sub: Any, common: argparse.ArgumentParser, as_json: argparse.ArgumentParser) -> None:
    """``settings get|set|delete``."""
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
    get.add_argument("--json", action="store_true", help="print the result as JSON (it always is)")


def _providers_command(sub: Any, common: argparse.ArgumentParser, as_json: argparse.ArgumentParser) -> None:
    providers = sub.add_parser("providers", help="list providers (never their keys)", parents=[common])
    providers.add_argument("--json", action="store_true", help="print the result as JSON")  # README: every read


def _models_command(sub: Any, common: argparse.ArgumentParser, as_json: argparse.ArgumentParser) -> None:
    models = sub.add_parser("models", help="list the model catalog", parents=[common])
    models.add_argument("--provider", help="one provider's models")
    models.add_argument("--json", action="store_true", help="print the result as JSON")


def _doctor_command(sub: Any, common: argparse.ArgumentParser, as_json: argparse.ArgumentParser) -> None:
    doctor_help = ("check a stopped host's data directory (exit 0 clean, 1 repairable or repaired, 2 damage it "
                   "cannot repair, 3 refused)")
    doctor = sub.add_parser("doctor", help=doctor_help, description=doctor_help, parents=[common])
    doctor.add_argument("--repair", action="store_true", help="repair what can be repaired from the files")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")


_COMMANDS: tuple[tuple[str, Callable[[Any, argparse.ArgumentParser, argparse.ArgumentParser], None]], ...] = (
    ("serve", _serve_command),
    ("status", _status_command),
    ("sessions", _sessions_command),
    ("show", _show_command),
    ("search", _search_command),
    ("follow", _follow_command),
    ("stop", _stop_command),
    ("open", _open_command),
    ("agent", _delegated_command("agent", "the reference agent sidecar (see `pi-host agent --help`)")),
    ("chat", _delegated_command("chat", "a terminal chat (see `pi-host chat --help`)")),
    ("completion", _completion_command),
    ("types", _types_command),
    ("import", _import_command),
    ("export", _export_command),
    ("settings", _settings_command),
    ("providers", _providers_command),
    ("models", _models_command),
    ("doctor", _doctor_command),
)
"""Every command, in the order ``pi-host --help`` lists them."""

_COMMAND_NAMES = frozenset(name for name, _ in _COMMANDS)
_ROOT_OPTIONS = frozenset({"-h", "--help", "--data-dir", "--dev", "--version"})


FOLLOW_DESCRIPTION = (
    "Print a session's events as they happen (--json: one JSON object per line), until Ctrl-C or SIGTERM, which "
    "exit 130 / 143 (128 + the signal). If the host goes away (stopped, killed, restarting) follow says so in one "
    "line on stderr (\"pi-host: waiting for ...\") and waits for it: a host that comes back on the data "
    "directory is followed again from the last event printed (\"reconnected; resumed at cursor N\"), or, if it "
    "restarted and cannot replay what it sent before, after a \"-- resync\" line. When the session is deleted "
    "(its session.deleted event, or found gone after a resync) follow says so in one line on stderr and exits 1, "
    "as for an unknown session; any other error the host answers exits 1 too; no host at the start exits 2.")

EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE, what a shell reports for a program whose reader went away."""


EXIT_INTERRUPTED = 130
"""128 + SIGINT: Ctrl-C, as a shell reports it (``serve`` and ``follow`` handle their signals themselves)."""


def main(argv: list[str] | None = None) -> int:
    """Run one command; a reader that goes away (``pi-host sessions | head``) ends it quietly, and so does
    Ctrl-C (a command waiting for a hung host, or still importing its modules): exit 130, no traceback."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # a block-buffered pipe fails here, not at interpreter exit
        return code
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BaseExceptionGroup as group:  # trio.run raises Ctrl-C out of a nursery wrapped in a group
        if group.split(KeyboardInterrupt)[1] is not None:
            raise
        return EXIT_INTERRUPTED


def _main(argv: list[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    delegated = _delegated(raw)
    if delegated is not None:
        return delegated
    parser = _parser(_command_named(raw))
    args, extra = parser.parse_known_args(raw)
    if args.command == "import" and args.path is None and len(extra) == 1 and not extra[0].startswith("-"):
        # `import SOURCE --dry-run PATH`: argparse gives SOURCE's optional PATH its empty match before the
        # option and then calls PATH unrecognized; an option between them is the same command
        args.path, extra = extra[0], []
    if extra:
        _parser().error(f"unrecognized arguments: {' '.join(extra)}")  # the root's usage names every command
    if args.command is None:
        parser.print_help()
        return 2
    data_dir, args.root_source = DataDir.locate(args.data_dir, os.environ, dev=args.dev)
    try:
        if args.command not in ("completion", "types"):  # the two that use no data directory
            str(data_dir.root).encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8, kept by the file system encoding's surrogateescape
        shown = os.fsencode(data_dir.root).decode("utf-8", "backslashreplace")
        print(f"pi-host: the data directory {shown} is not a UTF-8 path, which SQLite cannot open: rename it, or "
              "pick another with --data-dir", file=sys.stderr)
        return EXIT_NO_HOST  # serve's exit for a data directory it cannot use (runtime.cli_serve)
    return _run(parser, args.command, args, data_dir)


def import_serve() -> Callable[[argparse.Namespace, DataDir], int]:
    """``serve``'s entry point, importing the host with the cyclic garbage collector paused.

    Importing the host makes some 150,000 objects (classes, functions, modules) that live as long as the
    process; the collector would walk them over and over while they are made (about a tenth of the import's
    CPU) and free nothing. ``serve`` collects and freezes what boot left once boot is done
    (:func:`runtime.process.freeze_boot_objects`)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        from runtime.cli_serve import serve
    finally:
        if enabled:
            gc.enable()
    return serve


def _run(parser: argparse.ArgumentParser, command: str, args: argparse.Namespace, data_dir: DataDir) -> int:
    """Import the command's module and run it (each import below is one command's, made when it runs)."""
    if command == "serve":
        return import_serve()(args, data_dir)
    if command == "doctor":
        from runtime.cli_doctor import doctor

        return doctor(args, data_dir)
    if command == "completion":
        print(completion_script(parser, args.shell), end="")
        return 0
    if command == "types":
        from runtime.cli_types import types_command

        return types_command(args.out)
    if command == "stop":
        return stop_host(data_dir, args.timeout)
    if command == "open":
        from runtime.cli_open import open_inspector

        return open_inspector(data_dir, print_only=bool(args.print))
    if command in ("import", "export", "settings", "providers", "models"):
        from runtime.cli_config import run_host_command

        return run_host_command(command, args, data_dir)
    return _read(command, args, data_dir)


def _read(command: str, args: argparse.Namespace, data_dir: DataDir) -> int:
    """``status`` / ``sessions`` / ``show`` / ``search`` / ``follow``: ask the running host, or read offline."""
    state = find_host(data_dir)
    if state.running:
        from runtime.cli_online import ask_host

        return ask_host(command, args, data_dir)
    if command in OFFLINE_COMMANDS and not state.booting:
        from runtime.cli_offline import read_offline_command

        return read_offline_command(command, args, data_dir, state)
    print(f"pi-host: {state.problem}", file=sys.stderr)
    return EXIT_NO_HOST


def _delegated(raw: list[str]) -> int | None:
    """``pi-host [--data-dir D | --dev] agent|chat ...`` runs the pihost-client program with the rest.

    ``--dev`` becomes ``--data-dir`` of the development root (the client knows only ``--data-dir``), after the
    command too, as for every other command (``agent --dev``: a lone ``--dev`` is never an option's value,
    argparse refuses a value that looks like an option; after ``--`` it is left alone).
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
    name, rest = raw[i], raw[i + 1:]
    end = rest.index("--") if "--" in rest else len(rest)
    if "--dev" in rest[:end]:
        dev, rest = True, [arg for arg in rest[:end] if arg != "--dev"] + rest[end:]
    if dev and not global_args:
        global_args = ["--data-dir", str(DataDir.resolve(None, os.environ, dev=True).root)]
    try:
        module = importlib.import_module(f"pihost_client.{name}")
    except ImportError:
        print(f"pi-host: `{name}` needs the pihost-client package: pip install -e 'clients/python[chat]'",
              file=sys.stderr)
        return 1
    code: int = module.main([*global_args, *rest])
    return code


if __name__ == "__main__":
    sys.exit(main())
