"""``pi-host doctor``: the offline check (and repair) of a stopped host's data directory.

Runs under the data directory's lock, so a running host makes it refuse (exit 3).
A ``host.lock`` doctor had to create for that is removed again (while still held)
before the lock is let go: doctor leaves no file behind that was not there.
:mod:`runtime.doctor_cli` draws the report and the progress bar; :mod:`runtime.cli`
imports this module when ``doctor`` runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runtime.datadir import DataDir, DataDirLock, DataDirLocked
from runtime.doctor_cli import ProgressBar, render, render_json
from store.doctor.doctor import run_doctor
from store.doctor.doctor_report import DoctorReport

__all__ = ["doctor"]


def doctor(args: argparse.Namespace, data_dir: DataDir) -> int:
    if not data_dir.root.is_dir():
        print(f"pi-host doctor: {data_dir.root} is not a directory", file=sys.stderr)
        return 3
    try:
        with _locked(data_dir):
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


@contextmanager
def _locked(data_dir: DataDir) -> Iterator[None]:
    """Hold the data directory's lock; a ``host.lock`` created here is unlinked before it is released.

    Whether the file was there is decided atomically (``O_EXCL``), so a lock file a
    host created is never removed; ours is removed while we still hold it, so no
    host can be holding it then.
    """
    created = _create_if_absent(data_dir.lock_path)
    try:
        lock = DataDirLock(data_dir)
        lock.acquire()  # DataDirLocked: a host took the file meanwhile; it stays, it is the host's now
        try:
            yield
        finally:
            try:
                if created is not None:
                    _unlink_if_same(data_dir.lock_path, created)
            finally:
                lock.release()
    finally:
        if created is not None:
            os.close(created)


def _create_if_absent(path: Path) -> int | None:
    """An fd of ``path`` when this call created it; None when it already existed."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return None


def _unlink_if_same(path: Path, fd: int) -> None:
    """Remove ``path`` if it is still the file ``fd`` was opened on."""
    mine = os.fstat(fd)
    try:
        there = os.lstat(path)
    except FileNotFoundError:
        return
    if (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
        path.unlink()
