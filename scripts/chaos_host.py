"""A host subprocess for ``scripts/chaos --mode history`` that can be told to kill its own actors.

``python -m scripts.chaos_host --data-dir D`` runs the host as ``pi-host serve --port 0 --quiet``
does (``host.json`` names its URL); with ``--zygote LOG`` it forks one such host per ``start``
line on stdin (imports paid once per run). It adds the in-host chaos hook
(:meth:`runtime.host.RunningHost.kill_actor`) behind two signals:

* ``SIGUSR1`` – crash the DB-writer actor (the supervisor restarts it);
* ``SIGUSR2`` – crash the session actors named, one per line, in ``<data dir>/../chaos-kill``
  (written by the parent before it signals; the file is removed once read).

Each kill is answered by a line ``killed <target> <true|false>`` on stdout, so the parent counts
only kills that landed. SIGTERM / SIGINT ask for the orderly shutdown, as ``pi-host serve``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

import trio

from runtime.config import HostConfig
from runtime.datadir import DataDir
from runtime.host import RunningHost, run_host


def kill_file(data_dir: Path) -> Path:
    """Where the parent names the session actors a SIGUSR2 kills."""
    return data_dir.parent / "chaos-kill"


async def _signals(running: RunningHost, data_dir: Path) -> None:
    with trio.open_signal_receiver(signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            if signum in (signal.SIGTERM, signal.SIGINT):
                running.shutdown.request()
                continue
            if signum == signal.SIGUSR1:
                targets = ["db-writer"]
            else:
                path = kill_file(data_dir)
                try:
                    names = path.read_text("utf-8").split()
                    path.unlink()
                except FileNotFoundError:
                    names = []
                targets = [f"session:{sid}" for sid in names]
            for target in targets:
                print(f"killed {target} {str(running.kill_actor(target)).lower()}", flush=True)


async def _main(data_dir: Path) -> None:
    config = HostConfig(data_dir=DataDir(data_dir), port=0, log_to_stderr=False)
    async with trio.open_nursery() as nursery:

        async def host(*, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
            await run_host(config, task_status=task_status)
            nursery.cancel_scope.cancel()

        running: RunningHost = await nursery.start(host)
        nursery.start_soon(_signals, running, data_dir)


def serve(data_dir: Path) -> int:
    """Run one host in this process (stdout/stderr already where they should go)."""
    DataDir(data_dir).ensure()
    trio.run(_main, data_dir)
    return 0


def zygote(data_dir: Path, log: Path) -> int:
    """Fork a host per ``start`` line on stdin, answering ``pid N``: the modules are imported once,
    so a restart after a SIGKILL costs the host's boot, not the interpreter's start. Children are
    reaped by the kernel (SIGCHLD ignored here); a child's stdout and stderr go to ``log``."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    for line in sys.stdin:
        if line.strip() != "start":
            continue
        pid = os.fork()
        if pid == 0:  # the host
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
            code = 1
            try:
                code = serve(data_dir)
            finally:
                sys.stdout.flush()
                os._exit(code)
        print(f"pid {pid}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.chaos_host")
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--zygote", type=Path, metavar="LOG", default=None,
                    help="fork a host per 'start' line on stdin (its output appended to LOG)")
    args = ap.parse_args(argv)
    data_dir = args.data_dir.resolve()
    if args.zygote is not None:
        return zygote(data_dir, args.zygote)
    return serve(data_dir)


if __name__ == "__main__":
    sys.exit(main())
