"""``pi-host doctor``: the offline check (and repair) of a stopped host's data directory.

Runs under the data directory's lock, so a running host makes it refuse (exit 3).
A ``host.lock`` doctor had to create for that is removed again (while still held)
before the lock is let go: doctor leaves no file behind that was not there.
:mod:`runtime.doctor_cli` draws the report and the progress bar; :mod:`runtime.cli`
imports this module when ``doctor`` runs.
"""

from __future__ import annotations

import argparse
import sys
import time

from runtime.datadir import DataDir, DataDirLocked, held_leaving_no_file
from runtime.doctor_cli import ProgressBar, render, render_json
from store.doctor.doctor import run_doctor
from store.doctor.doctor_report import DoctorReport

__all__ = ["doctor"]


def doctor(args: argparse.Namespace, data_dir: DataDir) -> int:
    if not data_dir.root.is_dir():
        print(f"pi-host doctor: {data_dir.root} is not a directory", file=sys.stderr)
        return 3
    if not data_dir.db_path.exists() and not data_dir.sessions_dir.is_dir():
        # A folder given by mistake (a typo in --data-dir, the project instead of the data): "clean" would
        # say its data was checked. A data directory that lost its index keeps sessions/ (its transcripts).
        print(f"pi-host doctor: {data_dir.root} holds no pi-host data ({data_dir.db_path.name} and "
              f"{data_dir.sessions_dir.name}/ are missing); check --data-dir (or PI_DESKTOP_DATA_DIR)", file=sys.stderr)
        return 3
    try:
        with held_leaving_no_file(data_dir):
            report = _run(args, data_dir)
    except DataDirLocked as exc:
        print(f"pi-host doctor: refusing: {exc}; stop it first (doctor works on a stopped host's data)",
              file=sys.stderr)
        return 3
    print(render_json(report) if args.json else render(report))
    return report.exit_code


def _run(args: argparse.Namespace, data_dir: DataDir) -> DoctorReport:
    bar = ProgressBar(sys.stdout) if sys.stdout.isatty() and not args.json else None
    try:
        return run_doctor(data_dir, repair=args.repair, now_ms=time.time_ns() // 1_000_000, progress=bar)
    finally:
        if bar is not None:
            bar.clear()
