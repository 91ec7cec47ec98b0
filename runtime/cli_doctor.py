"""``pi-host doctor``: the offline check (and repair) of a stopped host's data directory.

Runs under the data directory's lock, so a running host makes it refuse (exit 3).
:mod:`runtime.doctor_cli` draws the report and the progress bar; :mod:`runtime.cli`
imports this module when ``doctor`` runs.
"""

from __future__ import annotations

import argparse
import sys
import time

from runtime.datadir import DataDir, DataDirLock, DataDirLocked
from runtime.doctor_cli import ProgressBar, render, render_json
from store.doctor.doctor import run_doctor

__all__ = ["doctor"]


def doctor(args: argparse.Namespace, data_dir: DataDir) -> int:
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
