"""A host subprocess for ``scripts/chaos --mode history`` that can be told to kill its own actors.

``python -m scripts.chaos_host --data-dir D`` runs the host as ``pi-host serve --port 0 --quiet``
does (``host.json`` names its URL), and adds the in-host chaos hook
(:meth:`runtime.host.RunningHost.kill_actor`) behind two signals:

* ``SIGUSR1`` – crash the DB-writer actor (the supervisor restarts it);
* ``SIGUSR2`` – crash the session actors named, one per line, in ``<data dir>/../chaos-kill``
  (written by the parent before it signals; the file is removed once read).

Each kill is answered by a line ``killed <target> <true|false>`` on stdout, so the parent counts
only kills that landed. SIGTERM / SIGINT ask for the orderly shutdown, as ``pi-host serve``.
"""

from __future__ import annotations

import argparse
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.chaos_host")
    ap.add_argument("--data-dir", type=Path, required=True)
    args = ap.parse_args(argv)
    DataDir(args.data_dir).ensure()
    trio.run(_main, args.data_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
