"""``pi-host doctor`` is a check: it leaves behind no ``host.lock`` that was not there (and keeps one that was)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from runtime.datadir import DataDir
from tests.doctor.doctorkit import cli
from tests.hostkit import start_host_process


def _names(root: Path) -> set[str]:
    return {str((Path(d) / n).relative_to(root)) for d, dirs, files in os.walk(root) for n in (*dirs, *files)}


def test_a_directory_that_is_not_a_data_directory_stays_empty(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    done = cli(DataDir(empty))
    assert done.returncode == 3 and "holds no pi-host data" in done.stderr, done.stderr  # refused, not "clean"
    assert _names(empty) == set()


@pytest.mark.parametrize("flags", [(), ("--json",), ("--repair",)])
def test_a_data_directory_without_a_lock_file_gets_none(data: DataDir, flags: tuple[str, ...]) -> None:
    data.lock_path.unlink()
    before = _names(data.root)
    done = cli(data, *flags)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not data.lock_path.exists()
    assert _names(data.root) == before


def test_a_lock_file_that_was_there_stays(data: DataDir) -> None:
    assert data.lock_path.is_file()  # the host that wrote the template left it
    before = _names(data.root)
    assert cli(data).returncode == 0
    assert data.lock_path.is_file() and _names(data.root) == before


def test_the_running_hosts_lock_file_stays(data: DataDir) -> None:
    data.lock_path.unlink()
    host = start_host_process(data.root)  # creates host.lock and holds it
    try:
        done = cli(data)
        assert done.returncode == 3 and "already in use by another pi-host" in done.stderr
        assert data.lock_path.is_file()
        assert cli(data).returncode == 3  # still held: the file doctor found is the one the host locks
    finally:
        host.proc.send_signal(signal.SIGTERM)
        host.proc.communicate(timeout=60)
    assert host.proc.returncode == 0
    assert data.lock_path.is_file()
    assert cli(data).returncode == 0 and data.lock_path.is_file()


def test_a_lock_taken_on_a_file_doctor_just_removed_is_taken_again_on_the_file_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race doctor's cleanup opens: a host opens host.lock, doctor unlinks it (its own file, still held)
    and lets go, the host's flock then succeeds on a file no longer at the path. That host must lock the
    file that is there, or a second host would start beside it."""
    import fcntl as real_fcntl

    from runtime import datadir as datadir_module
    from runtime.datadir import DataDirLock, DataDirLocked

    data = DataDir(tmp_path)
    calls: list[int] = []
    real_flock = real_fcntl.flock

    def flock(fd: int, op: int) -> None:
        calls.append(fd)
        if len(calls) == 1:  # doctor's unlink lands between the host's open and its flock
            data.lock_path.unlink()
        real_flock(fd, op)

    monkeypatch.setattr(datadir_module.fcntl, "flock", flock)
    first = DataDirLock(data)
    first.acquire()
    monkeypatch.setattr(datadir_module.fcntl, "flock", real_flock)
    try:
        assert data.lock_path.read_text().strip() == str(os.getpid())
        assert len(calls) == 2  # the unlinked file was let go and the one at the path locked
        with pytest.raises(DataDirLocked):
            DataDirLock(data).acquire()
    finally:
        first.release()
    again = DataDirLock(data)
    again.acquire()  # free again once released
    again.release()
