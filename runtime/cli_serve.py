"""``pi-host serve``: run the host in the foreground until SIGINT / SIGTERM.

The only CLI module that imports the host (:mod:`runtime.host` and everything under
it); :mod:`runtime.cli` imports it when ``serve`` runs, so the client commands never
pay for it. Exit codes are :mod:`runtime.cli`'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from protocol.models import build_all as build_wire_models
from runtime.boot import BootInterrupted, refuse_before_writing
from runtime.config import HostConfig
from runtime.datadir import NOT_A_FOLDER, DataDir, DataDirLocked, DataDirUnsafe
from runtime.host import Shutdown, run_host
from runtime.kernel.supervisor import RestartIntensityExceeded
from runtime.logs import setup_logging
from runtime.process import raise_fd_limit, tune_allocator
from store.errors import StoreError

__all__ = ["serve"]

log = logging.getLogger("pi_host")


def host_config(args: argparse.Namespace, data_dir: DataDir) -> HostConfig:
    """The host's configuration from ``pi-host serve``'s arguments."""
    return HostConfig(
        data_dir=data_dir,
        freeze_boot=True,  # boot's survivors frozen once, before the read warm-up (runtime/host.py)
        host=args.host,
        port=args.port,
        allowed_origins=frozenset(args.allow_origin),
        session_idle_timeout=args.idle_timeout,
        synchronous=args.synchronous,
        search_upkeep_after=args.search_upkeep_after if args.search_upkeep_after > 0 else None,
        integrity_sweep_interval=args.integrity_sweep if args.integrity_sweep > 0 else None,
        integrity_sweep_after=max(0.0, args.integrity_sweep_after),
        memory_trim_interval=args.memory_trim_interval if args.memory_trim_interval > 0 else None,
        import_roots=tuple(os.path.abspath(r) for r in args.import_root),
        disk_warn_below_bytes=args.disk_warn_below,
        native_pi_root=Path(args.native_pi_root).resolve() if args.native_pi_root else None,
        count_task_steps=args.count_task_steps,
        keep_quarantined=args.keep_quarantined,
        audit_retention_days=args.audit_retention_days,
    )


def serve(args: argparse.Namespace, data_dir: DataDir) -> int:
    # The first line says which default root (seed §2, D599: a packaged app and a dev build run side by
    # side); a root given by --data-dir or PI_DESKTOP_DATA_DIR is named by the "listening" line.
    if args.root_source in ("packaged", "dev"):
        print(DataDir.describe(data_dir.root, args.root_source), file=sys.stderr, flush=True)
    try:
        # a start the index's migration refuses leaves the data directory as it found it (seed §7)
        refuse_before_writing(data_dir, now_ms=time.time_ns() // 1_000_000)
    except (DataDirLocked, StoreError) as exc:
        code = _serve_failure(exc, args)
        if code is None:
            raise
        return code
    except OSError:
        pass  # a directory it may not read or write: said by the steps below, as before
    try:
        data_dir.ensure()
    except DataDirUnsafe as exc:
        print(f"pi-host: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file, a folder it may not write, a read-only disk: one line, as for a busy port
        why = NOT_A_FOLDER if isinstance(exc, FileExistsError) else exc.strerror or str(exc)
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(data_dir.root) else ""
        print(data_dir.unusable(why + where), file=sys.stderr)
        return 2
    tune_allocator()  # before the log writer's thread: a thread's arena is taken at its first allocation
    logs = setup_logging(data_dir.logs_dir, stderr=not args.quiet)
    try:
        return _serve_logged(args, data_dir)
    finally:
        logs.stop()  # the writer thread writes what is still queued: the log is complete at exit


def _serve_logged(args: argparse.Namespace, data_dir: DataDir) -> int:
    build_wire_models()  # built on first use elsewhere (a CLI command uses a few); a host's requests find them built
    raise_fd_limit()
    config = host_config(args, data_dir)
    # a data directory no pi-host ran before (an earlier app's, or a copy of one) has no token yet and never had
    # a clean-shutdown marker: its first boot is an upgrade, not a recovery from a crash
    first_start = not data_dir.token_path.exists()

    signals_seen: list[int] = []

    async def main_async() -> None:
        nonlocal first_start
        # The receiver is open before the host starts and stays open through the
        # shutdown: a signal during boot stops it before its next step; once serving,
        # the first signal asks for an orderly stop, a second one hurries it.
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            run = _Run()
            async with trio.open_nursery() as outer:
                outer.start_soon(_forward_signals, signals, lambda: run, signals_seen)
                run_config, restarts = config, _Restarts()
                while True:
                    async with trio.open_nursery() as nursery:
                        running = await nursery.start(partial(run_host, run_config, shutdown=run.shutdown))
                        run.serving.set()
                        _say_listening(running, data_dir, first_start=first_start)
                        first_start = False
                    # the host stopped: for good, or to start again on a rebuilt index (RELIABILITY.md row 7)
                    if run.shutdown.restart_reason is None or signals_seen:
                        break
                    restarts.count(run.shutdown.restart_reason)
                    print("pi-host: the index database is corrupt; restarting on an index rebuilt from the "
                          "transcripts", file=sys.stderr, flush=True)
                    run_config = dataclasses.replace(config, port=running.port, rebuild_index=True)
                    run = _Run()
                outer.cancel_scope.cancel()  # stop forwarding signals too

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
    if not data_dir.clean_shutdown_path.exists():  # the marker could not be written (a full disk: see the log)
        print("pi-host stopped, but could not record a clean shutdown (see the log); the next start checks "
              "every session", file=sys.stderr)
        return 0
    print("pi-host stopped cleanly", file=sys.stderr)
    return 0


@dataclass
class _Run:
    """One run of the host in this process: its stop switch and whether it serves yet."""

    shutdown: Shutdown = field(default_factory=Shutdown)
    serving: trio.Event = field(default_factory=trio.Event)


INDEX_KEEPS_FAILING = "the index was found corrupt more than"
"""How the line of :class:`IndexKeepsFailing` starts (after ``pi-host: ``): what a supervising program looks for."""


class IndexKeepsFailing(Exception):
    """More restarts on a rebuilt index than :class:`_Restarts` allows: exit status 4, as a supervisor that
    gave up, but said as what it is."""

    def __init__(self, reason: str, limit: int, window: float) -> None:
        super().__init__(f"{INDEX_KEEPS_FAILING} {limit} times within {window:.0f} s, so the "
                         f"disk, not the index, is what fails (the last time: {reason})")


@dataclass
class _Restarts:
    """The restarts on a rebuilt index: past ``limit`` within ``window`` seconds, the index is not what fails
    (the disk is), and the process exits like a supervisor that gave up."""

    limit: int = 3
    window: float = 600.0
    times: list[float] = field(default_factory=list)

    def count(self, reason: str) -> None:
        now = time.monotonic()
        self.times = [t for t in self.times if now - t < self.window] + [now]
        if len(self.times) > self.limit:
            raise IndexKeepsFailing(reason, self.limit, self.window)


def _say_listening(running: Any, data_dir: DataDir, *, first_start: bool = False) -> None:
    print(f"pi-host listening on {running.url} (data dir {data_dir.root})", flush=True)
    recovered = recovery_line(running.boot.report, first_start=first_start)
    if recovered is not None:
        print(recovered, flush=True)
    log.info("listening", extra={"url": running.url, "dataDir": str(data_dir.root)})


def recovery_line(report: dict[str, Any], *, first_start: bool = False) -> str | None:
    """One line on what boot repaired after an unclean shutdown (None after a clean one): the log's
    ``boot finished`` record holds the whole report, a user reading the terminal sees this. ``first_start``: no
    pi-host ran on the data directory before (it had no ``host.token``), so no clean-shutdown marker could be
    there: the line says what this first boot took in, not that it recovered from a crash."""
    if report.get("cleanShutdown", True):
        return None
    database = report.get("database") or {}
    if database.get("createdFresh") and not database.get("rebuilt") and not report.get("sessionsScanned"):
        return None  # a new data directory: no previous run to recover from

    def count(n: Any, one: str, many: str) -> str | None:
        return None if not n else f"{n} {one if n == 1 else many}"

    reconcile = report.get("reconcile") or {}
    done = [part for part in (
        count(report.get("sessionsScanned"), "session scanned", "sessions scanned"),
        count(report.get("tornTails"), "torn tail cut", "torn tails cut"),
        count(report.get("indexRowsAdded"), "index row added", "index rows added"),
        count(report.get("indexRowsRemoved"), "stale index row removed", "stale index rows removed"),
        count(report.get("inflightPromoted"), "in-flight reply kept", "in-flight replies kept"),
        count(report.get("turnsAborted"), "running turn marked aborted", "running turns marked aborted"),
        count(len(report.get("damagedTranscripts") or []), "damaged transcript", "damaged transcripts"),
        count(reconcile.get("errors"), "session not repaired (see the log)", "sessions not repaired (see the log)"),
        "the database rebuilt from the transcripts" if report.get("dbRebuilt") else None,
    ) if part]
    took = f" in {report['durationMs']} ms" if isinstance(report.get("durationMs"), int) else ""
    if first_start:
        what = ", ".join(done) if done else "nothing to take in"
        return f"pi-host: first start on this data directory{took}: {what}"
    what = ", ".join(done) if done else "nothing needed repair"
    return f"pi-host: recovered from an unclean shutdown{took}: {what}"


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
        if isinstance(leaf, IndexKeepsFailing):
            log.error("shutting down: %s", leaf)
            print(f"pi-host: {leaf}; shut down", file=sys.stderr)
            return 4
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


async def _forward_signals(signals: Any, current: Callable[[], _Run], seen: list[int]) -> None:
    count = 0
    async for signum in signals:
        count += 1
        seen.append(int(signum))
        run = current()
        shutdown, serving = run.shutdown, run.serving
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
